// Crash consistency by simulation: the machine stops after every possible number of mutating file
// system operations of a save (and of the retention that follows it), loses whatever was not
// durable, and reboots. Whatever the crash point, the newest complete checkpoint is the previous
// one or the new one (the new one from the moment it was committed on), it loads byte-exact and
// verifies; a partial checkpoint is never used, and the next save cleans up after the crash.
#include <gtest/gtest.h>

#include "lib/src/load/checkpoint_reader.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {
namespace crash_test {

constexpr char kRoot[] = "/ckpt";
constexpr uint32_t kWorld = 3;

std::vector<GlobalTensor> Tensors(uint64_t salt) {
  return {MakeTensor("w", DType::kF32, {24, 40}, salt), MakeTensor("b", DType::kBF16, {40}, salt),
          MakeTensor("count", DType::kI64, {}, salt), MakeTensor("mask", DType::kBool, {9, 5}, salt)};
}

CheckpointerOptions Options(Env* env, uint32_t keep_last) {
  CheckpointerOptions o;
  o.directory = kRoot;
  o.env = env;
  o.run_id = "crash-test";
  o.chunk_bytes = 1024;
  o.write_block_bytes = 4096;  // several data writes per rank: crash points between them
  o.save_memory_budget = 16 << 10;
  o.keep_last = keep_last;
  return o;
}

// Step s holds the tensors under salt s, cut along dim 0 over kWorld ranks.
std::vector<Status> SaveStep(MemEnv* env, uint64_t step, uint32_t keep_last, bool threads) {
  return SaveAllRanks(Options(env, keep_last), Tensors(step), DimLayout(kWorld, 0), step, step, threads);
}

std::unique_ptr<MemEnv> EnvWithStep1() {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  std::vector<Status> st = SaveStep(env.get(), 1, 0, false);
  EXPECT_TRUE(AllOk(st)) << Describe(st);
  return env;
}

// After the reboot: which step is the newest complete one (0: none), checking that it loads
// byte-exact (as a whole and resharded) and verifies.
uint64_t CheckAfterCrash(MemEnv* env, const std::string& where) {
  SCOPED_TRACE(where);
  auto c = Checkpointer::Open(Options(env, 0));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return 0;
  auto latest = (*c)->LatestStep();
  EXPECT_TRUE(latest.ok()) << latest.status().ToString();
  if (!latest.ok() || !latest->has_value()) return 0;
  const uint64_t step = **latest;

  std::string diff;
  auto loaded = LoadWholeAndCompare(c->get(), std::nullopt, Tensors(step), &diff);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  if (loaded.ok()) {
    EXPECT_EQ(*loaded, step) << "Load(nullopt) did not load the newest complete step";
    EXPECT_EQ(diff, "");
  }
  // Into another layout too: reads every chunk through another plan.
  std::vector<GlobalTensor> expected = Tensors(step);
  std::vector<RankState> ranks = BuildRanks(expected, DimLayout(2, 1), false);
  for (uint32_t r = 0; r < 2; ++r) {
    LoadRequest req;
    req.tensors = ranks[r].shards;
    auto res = (*c)->Load(step, req);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    if (!res.ok()) continue;
    for (size_t k = 0; k < ranks[r].buffers.size(); ++k)
      EXPECT_EQ(CompareRegion(expected[ranks[r].where[k].first], ranks[r].where[k].second, ranks[r].buffers[k]), "");
  }
  auto reader = CheckpointReader::Open(env, kRoot, step);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (reader.ok()) {
    Status v = (*reader)->Verify(nullptr);
    EXPECT_TRUE(v.ok()) << v.ToString();
  }
  // Any other step that claims to be complete is complete and correct too; partial ones refuse.
  auto list = (*c)->List();
  EXPECT_TRUE(list.ok());
  if (list.ok()) {
    for (const CheckpointInfo& info : *list) {
      if (info.step == step) continue;
      auto other = LoadWholeAndCompare(c->get(), info.step, Tensors(info.step), &diff);
      if (info.complete) {
        EXPECT_TRUE(other.ok()) << "step " << info.step << ": " << other.status().ToString();
        if (other.ok()) {
          EXPECT_EQ(diff, "") << "step " << info.step;
        }
      } else {
        EXPECT_TRUE(other.status().IsNotFound()) << "partial step " << info.step << ": " << other.status().ToString();
      }
    }
  }
  return step;
}

// The job restarts after the crash and saves step 3 with keep_last 1: it succeeds, and afterwards
// only step 3 is left.
void CheckRecovery(MemEnv* env) {
  std::vector<Status> st = SaveStep(env, 3, 1, false);
  ASSERT_TRUE(AllOk(st)) << Describe(st);
  auto c = Checkpointer::Open(Options(env, 0));
  ASSERT_TRUE(c.ok());
  auto list = (*c)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 3u);
  EXPECT_TRUE((*list)[0].complete);
  std::string diff;
  auto loaded = LoadWholeAndCompare(c->get(), std::nullopt, Tensors(3), &diff);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(diff, "");
}

// Crashes the save of step 2 after every number of mutating operations it takes.
void CrashAtEveryPoint(uint32_t keep_last, bool threads) {
  int64_t total = 0;
  {
    std::unique_ptr<MemEnv> env = EnvWithStep1();
    const int64_t before = env->mutating_operations();
    std::vector<Status> st = SaveStep(env.get(), 2, keep_last, threads);
    ASSERT_TRUE(AllOk(st)) << Describe(st);
    total = env->mutating_operations() - before;
    ASSERT_GT(total, 10);
    EXPECT_EQ(CheckAfterCrash(env.get(), "no crash"), 2u);
  }
  int64_t first_committed = -1;
  for (int64_t k = 0; k <= total; ++k) {
    const std::string where = "crash after " + std::to_string(k) + " of " + std::to_string(total) + " operations";
    std::unique_ptr<MemEnv> env = EnvWithStep1();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    env->CrashAfterOperations(k);
    std::vector<Status> st = SaveStep(env.get(), 2, keep_last, threads);
    env->SimulateCrash();
    const uint64_t latest = CheckAfterCrash(env.get(), where);
    ASSERT_TRUE(latest == 1 || latest == 2) << where << ": newest complete step is " << latest;
    if (AllOk(st)) {
      EXPECT_EQ(latest, 2u) << where << ": every rank's save succeeded but the step is not there";
    }
    // One operation commits: before it the old step is the newest, from it on the new one.
    if (latest == 2 && first_committed < 0) first_committed = k;
    if (first_committed >= 0 && !threads) {
      EXPECT_EQ(latest, 2u) << where << ": step 2 was committed at " << first_committed << " operations";
    }
    if (keep_last == 1 && k % 7 == 0) CheckRecovery(env.get());
    if (::testing::Test::HasFailure()) return;  // one crash point's story is enough to read
  }
  EXPECT_GE(first_committed, 0);
}

TEST(CrashTest, EveryCrashPointOfASaveLeavesAConsistentCheckpoint) { CrashAtEveryPoint(0, false); }

TEST(CrashTest, EveryCrashPointOfASaveAndItsRetentionLeavesAConsistentCheckpoint) { CrashAtEveryPoint(1, false); }

TEST(CrashTest, EveryCrashPointWithConcurrentRanks) { CrashAtEveryPoint(1, true); }

TEST(CrashTest, CrashDuringTheFirstSaveLeavesNothingOrIt) {
  int64_t total = 0;
  {
    std::unique_ptr<MemEnv> env = NewMemEnv();
    ASSERT_TRUE(AllOk(SaveStep(env.get(), 1, 0, false)));
    total = env->mutating_operations();
  }
  for (int64_t k = 0; k <= total; ++k) {
    std::unique_ptr<MemEnv> env = NewMemEnv();
    env->CrashAfterOperations(k);
    std::vector<Status> st = SaveStep(env.get(), 1, 0, false);
    env->SimulateCrash();
    const uint64_t latest = CheckAfterCrash(env.get(), "first save, crash after " + std::to_string(k));
    EXPECT_TRUE(latest == 0 || latest == 1);
    if (AllOk(st)) {
      EXPECT_EQ(latest, 1u);
    }
    if (latest == 0) {
      auto c = Checkpointer::Open(Options(env.get(), 0));
      ASSERT_TRUE(c.ok());
      std::string diff;
      auto r = LoadWholeAndCompare(c->get(), std::nullopt, Tensors(1), &diff);
      EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
    }
    if (HasFailure()) return;
  }
}

TEST(CrashTest, CrashDuringExplicitGarbageCollection) {
  // Complete steps 1, 2, 4 and partial 3, then CollectGarbage with keep_last 1 crashes at every point: the newest
  // step always survives intact; older ones are either intact or invisible.
  auto build = [] {
    std::unique_ptr<MemEnv> env = NewMemEnv();
    for (uint64_t s : {1, 2, 4}) EXPECT_TRUE(AllOk(SaveStep(env.get(), s, 0, false)));
    // A partial step older than the newest complete one: garbage too.
    std::vector<Status> st = SaveSomeRanks(Options(env.get(), 0), Tensors(3), DimLayout(kWorld, 0), 3, 3, {0}, false);
    EXPECT_TRUE(AllOk(st)) << Describe(st);
    return env;
  };
  int64_t total = 0;
  {
    std::unique_ptr<MemEnv> env = build();
    auto c = Checkpointer::Open(Options(env.get(), 1));
    ASSERT_TRUE(c.ok());
    const int64_t before = env->mutating_operations();
    ASSERT_TRUE((*c)->CollectGarbage().ok());
    total = env->mutating_operations() - before;
    auto list = (*c)->List();
    ASSERT_TRUE(list.ok());
    ASSERT_EQ(list->size(), 1u);
  }
  for (int64_t k = 0; k <= total; ++k) {
    std::unique_ptr<MemEnv> env = build();
    auto c = Checkpointer::Open(Options(env.get(), 1));
    ASSERT_TRUE(c.ok());
    env->CrashAfterOperations(k);
    (*c)->CollectGarbage().IgnoreError();
    env->SimulateCrash();
    EXPECT_EQ(CheckAfterCrash(env.get(), "GC, crash after " + std::to_string(k)), 4u);
    if (HasFailure()) return;
  }
}

}  // namespace crash_test
}  // namespace lifeline::testing
