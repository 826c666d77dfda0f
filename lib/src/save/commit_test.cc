// Commit and visibility: a checkpoint is used only once every rank's index is there; a failed or
// unfinished save never hides or damages the previous checkpoint; retention keeps the newest
// complete ones and clears out partial leftovers; WaitForCommit tells the two apart. The first
// part drives whole Checkpointers on real files (moved here from tests/integration); the second
// calls commit.h directly, in memory (MemEnv), crashes included.
#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/commit.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {
namespace commit_test {

std::vector<GlobalTensor> Tensors(uint64_t salt) {
  return {MakeTensor("w", DType::kF32, {64, 100}, salt), MakeTensor("b", DType::kBF16, {100}, salt),
          MakeTensor("count", DType::kI64, {}, salt)};
}

class CommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    dir_ = tmp_.Sub("ckpt");
  }

  CheckpointerOptions Options(uint32_t rank = 0, uint32_t world = 1, Env* env = nullptr) const {
    CheckpointerOptions o = test::SmallCheckpointerOptions(dir_, "commit-test", 4096);
    o.rank = rank;
    o.world_size = world;
    o.env = env;
    o.save_memory_budget = 64 << 10;
    return o;
  }

  std::unique_ptr<Checkpointer> Open(uint32_t rank = 0, uint32_t world = 1, Env* env = nullptr) {
    auto c = Checkpointer::Open(Options(rank, world, env));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Saves step `step` (contents under salt == step) with `world` ranks cutting dim 0 (sequentially).
  void SaveStep(uint64_t step, uint32_t world, std::vector<uint32_t> which = {}, uint32_t keep_last = 0) {
    CheckpointerOptions o = Options();
    o.keep_last = keep_last;
    if (which.empty()) which = RankRange(0, world);
    std::vector<Status> st = SaveSomeRanks(o, Tensors(step), DimLayout(world, 0), step, step, which, false);
    ASSERT_TRUE(AllOk(st)) << Describe(st);
  }

  // The newest complete step must be `step`, and both Load(nullopt) and Load(step) give its bytes.
  void ExpectLatestLoads(uint64_t step) {
    auto c = Open();
    ASSERT_TRUE(c);
    auto latest = c->LatestStep();
    ASSERT_TRUE(latest.ok()) << latest.status().ToString();
    EXPECT_EQ(*latest, std::optional<uint64_t>(step));
    std::string diff;
    auto got = LoadWholeAndCompare(c.get(), std::nullopt, Tensors(step), &diff);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, step);
    EXPECT_EQ(diff, "");
    got = LoadWholeAndCompare(c.get(), step, Tensors(step), &diff);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(diff, "");
  }

  std::vector<std::string> StepDirs() {
    std::vector<std::string> out;
    for (const std::string& n : ListDir(dir_))
      if (ParseStepDirName(n)) out.push_back(n);
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string StepDir(uint64_t step) const { return dir_ + "/" + StepDirName(step); }
  std::string Hash() const { return RunHash("commit-test"); }

  TempDir tmp_;
  std::string dir_;
};

TEST_F(CommitTest, MissingRankIndexHidesTheStepUntilTheLastRankSaves) {
  SaveStep(1, 3);
  SaveStep(2, 3, {0, 1});  // rank 2 has not finished
  ExpectLatestLoads(1);

  auto c = Open(2, 3);
  ASSERT_TRUE(c);
  std::string diff;
  auto partial = LoadWholeAndCompare(c.get(), 2, Tensors(2), &diff);
  ASSERT_FALSE(partial.ok());
  EXPECT_TRUE(partial.status().IsNotFound()) << partial.status().ToString();
  EXPECT_NE(partial.status().message().find("missing rank 2"), std::string::npos) << partial.status().ToString();
  EXPECT_NE(partial.status().message().find(StepDirName(2)), std::string::npos) << partial.status().ToString();

  auto list = c->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 2u);
  EXPECT_FALSE((*list)[0].complete);
  EXPECT_EQ((*list)[0].world_size, 3u);
  EXPECT_EQ((*list)[0].ranks_present, 2u);
  EXPECT_NE((*list)[0].problem.find("missing rank 2"), std::string::npos) << (*list)[0].problem;
  EXPECT_EQ((*list)[1].step, 1u);
  EXPECT_TRUE((*list)[1].complete);
  EXPECT_EQ((*list)[1].ranks_present, 3u);
  EXPECT_TRUE((*list)[1].problem.empty());
  EXPECT_GT((*list)[1].bytes, 0u);

  Status wait = c->WaitForCommit(2, 0.05);
  EXPECT_FALSE(wait.ok());
  EXPECT_NE(wait.message().find("missing rank 2"), std::string::npos) << wait.ToString();
  EXPECT_FALSE(c->WaitForCommit(7, 0.02).ok()) << "a step nobody saved cannot be committed";

  // The last rank arrives, while another rank waits for the commit.
  std::atomic<bool> waited_ok{false};
  std::thread waiter([&] {
    auto w = Open(0, 3);
    waited_ok = w && w->WaitForCommit(2, 30).ok();
  });
  SaveStep(2, 3, {2});
  waiter.join();
  EXPECT_TRUE(waited_ok);
  EXPECT_TRUE(c->WaitForCommit(2, 0).ok());
  ExpectLatestLoads(2);
  auto list2 = c->List();
  ASSERT_TRUE(list2.ok());
  EXPECT_TRUE((*list2)[0].complete);

  // Once committed, a step is never written again, by this job or a restarted one.
  auto again = Open(0, 3);
  RankState none;
  Status s = again->Save(2, RequestOf(none, 0, 2)).WaitPersisted();
  EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
  again.reset();  // this launch ends (and its rank 0 lets go of the directory)
  CheckpointerOptions other = Options(1, 2);
  other.run_id = "commit-test-restarted";
  auto restarted = Checkpointer::Open(other);
  ASSERT_TRUE(restarted.ok());
  s = (*restarted)->Save(2, RequestOf(none, 1, 2)).WaitPersisted();
  EXPECT_TRUE(s.IsAlreadyExists()) << s.ToString();
  ExpectLatestLoads(2);
}

TEST_F(CommitTest, DeletingOneRankIndexMakesACommittedStepIncomplete) {
  SaveStep(1, 2);
  SaveStep(2, 2);
  ExpectLatestLoads(2);
  // The manifest stays; the missing index still decides.
  ASSERT_EQ(::unlink((StepDir(2) + "/" + IndexFileName(Hash(), 1, 2)).c_str()), 0);
  ExpectLatestLoads(1);
  auto c = Open();
  std::string diff;
  auto r = LoadWholeAndCompare(c.get(), 2, Tensors(2), &diff);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("missing rank 1"), std::string::npos) << r.status().ToString();
}

TEST_F(CommitTest, LoadWithoutCheckpointIsNotFound) {
  auto c = Open();
  auto latest = c->LatestStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->has_value());
  std::string diff;
  auto r = LoadWholeAndCompare(c.get(), std::nullopt, Tensors(1), &diff);
  EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
  r = LoadWholeAndCompare(c.get(), 5, Tensors(1), &diff);
  EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
  SaveStep(3, 2, {1});  // only partial steps
  r = LoadWholeAndCompare(c.get(), std::nullopt, Tensors(3), &diff);
  EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
}

TEST_F(CommitTest, RetentionKeepsTheNewestCompleteAndRemovesOlderPartials) {
  SaveStep(1, 2, {}, 2);
  SaveStep(2, 2, {}, 2);
  SaveStep(3, 2, {0}, 2);  // partial
  EXPECT_EQ(StepDirs(), (std::vector<std::string>{StepDirName(1), StepDirName(2), StepDirName(3)}));
  SaveStep(4, 2, {}, 2);
  // 4 and 2 are the newest complete; 1 is beyond keep_last, partial 3 is older than 4.
  EXPECT_EQ(StepDirs(), (std::vector<std::string>{StepDirName(2), StepDirName(4)}));
  SaveStep(6, 2, {1}, 2);  // a newer save in progress is left alone
  SaveStep(5, 2, {}, 2);
  EXPECT_EQ(StepDirs(), (std::vector<std::string>{StepDirName(4), StepDirName(5), StepDirName(6)}));
  ExpectLatestLoads(5);
  auto c = Open();
  std::string diff;
  auto r = LoadWholeAndCompare(c.get(), 4, Tensors(4), &diff);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(diff, "");
  // CollectGarbage on demand keeps the same set (keep_last of this Checkpointer is 0: keep all).
  ASSERT_TRUE(c->CollectGarbage().ok());
  EXPECT_EQ(StepDirs(), (std::vector<std::string>{StepDirName(4), StepDirName(5), StepDirName(6)}));
  // Finishing step 6 with keep_last = 1 leaves only it.
  SaveStep(6, 2, {0}, 1);
  EXPECT_EQ(StepDirs(), (std::vector<std::string>{StepDirName(6)}));
  ExpectLatestLoads(6);
}

TEST_F(CommitTest, RestartWithAnotherWorldSizeReplacesAnUnfinishedAttempt) {
  SaveStep(1, 2);
  SaveStep(2, 4, {0, 2, 3});  // the 4-rank job died before rank 1 finished step 2
  // The job restarts with 3 ranks (another run id) and saves step 2 again.
  CheckpointerOptions o = Options();
  o.run_id = "commit-test-restart-1";
  std::vector<Status> st = SaveAllRanks(o, Tensors(2), DimLayout(3, 1), 2, 2, true);
  ASSERT_TRUE(AllOk(st)) << Describe(st);
  ExpectLatestLoads(2);
  auto c = Open();
  auto list = c->List();
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE((*list)[0].complete);
  EXPECT_EQ((*list)[0].world_size, 3u);
  // The dead attempt's files are gone (garbage of a kept step); the new attempt's all remain.
  for (const std::string& name : ListDir(StepDir(2))) {
    EXPECT_EQ(name.find(Hash()), std::string::npos) << "leftover of the dead attempt: " << name;
    EXPECT_EQ(name.find(".tmp-"), std::string::npos) << "temporary file left: " << name;
  }
  auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->manifest().world_size, 3u);
  EXPECT_TRUE((*reader)->Verify(nullptr).ok());
}

TEST_F(CommitTest, ConcurrentRanksSavingManySteps) {
  // Four ranks as threads, six steps, retention on: every completing rank runs GC while others are
  // already writing the next step.
  constexpr uint32_t kWorld = 4;
  std::vector<std::thread> ranks;
  std::vector<Status> status(kWorld);
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      CheckpointerOptions o = Options(r, kWorld);
      o.keep_last = 2;
      auto c = Checkpointer::Open(o);
      if (!c.ok()) {
        status[r] = c.status();
        return;
      }
      for (uint64_t step = 1; step <= 6 && status[r].ok(); ++step) {
        std::vector<RankState> rs = BuildRanks(Tensors(step), BoxFlatLayout(2, 2, 0), true);
        status[r] = (*c)->Save(step * 10, RequestOf(rs[r], r, step)).WaitPersisted();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_TRUE(AllOk(status)) << Describe(status);
  auto c = Open();
  std::string diff;
  auto r = LoadWholeAndCompare(c.get(), std::nullopt, Tensors(6), &diff);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 60u);
  EXPECT_EQ(diff, "");
  auto list = c->List();
  ASSERT_TRUE(list.ok());
  size_t complete = 0;
  for (const CheckpointInfo& i : *list) complete += i.complete;
  EXPECT_LE(complete, 3u);  // keep_last 2, plus at most one raced by a concurrent GC
  EXPECT_GE(complete, 2u);
}

TEST_F(CommitTest, ATensorMissingFromTheNewestStepIsAnErrorNotAFallback) {
  // Step 1 holds "w", "b" and "count"; step 2 (the model changed) only "w". Asking for "b" from the
  // newest checkpoint must not quietly resume from step 1.
  SaveStep(1, 1);
  CheckpointerOptions o = Options();
  std::vector<GlobalTensor> only_w = {Tensors(2)[0]};
  ASSERT_TRUE(AllOk(SaveAllRanks(o, only_w, WholeLayout(), 2, 2, false)));
  auto c = Open();
  std::string diff;
  auto r = LoadWholeAndCompare(c.get(), std::nullopt, Tensors(2), &diff);
  ASSERT_FALSE(r.ok()) << "loaded step " << *r << " instead of reporting the missing tensor";
  EXPECT_TRUE(r.status().IsNotInCheckpoint()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("'b'"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(StepDirName(2)), std::string::npos) << r.status().ToString();
  auto w = LoadWholeAndCompare(c.get(), std::nullopt, only_w, &diff);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(*w, 2u);
  EXPECT_EQ(diff, "");
}

TEST_F(CommitTest, ReadersNeverFailWhileRetentionRemovesOldSteps) {
  // An evaluator process polls for the newest checkpoint while training saves with keep_last 1:
  // step directories vanish under its feet, which must never make it fail or see a partial step.
  SaveStep(1, 1, {}, 1);
  std::atomic<bool> done{false};
  std::atomic<int> loads{0};
  std::string failure;
  std::thread reader([&] {
    auto c = Open();
    std::string diff;
    while (!done && failure.empty()) {
      auto latest = c->LatestStep();
      if (!latest.ok()) {
        failure = "LatestStep: " + latest.status().ToString();
        break;
      }
      auto list = c->List();
      if (!list.ok()) {
        failure = "List: " + list.status().ToString();
        break;
      }
      auto r = c->Load(std::nullopt, LoadRequest{});
      if (!r.ok()) {
        failure = "Load: " + r.status().ToString();
        break;
      }
      ++loads;
    }
  });
  for (uint64_t step = 2; step <= 40 && failure.empty(); ++step) SaveStep(step, 1, {}, 1);
  done = true;
  reader.join();
  EXPECT_EQ(failure, "");
  EXPECT_GT(loads.load(), 0);
  ExpectLatestLoads(40);
}

// ---- failed saves ------------------------------------------------------------------------

class FailedSaveTest : public CommitTest {
 protected:
  void SetUp() override {
    CommitTest::SetUp();
    SaveStep(1, 1);
    faulty_ = std::make_unique<FaultInjectionEnv>(Env::Default());
  }

  // Saves step 2 as a single rank through the faulty Env; returns the status.
  Status SaveStep2(uint32_t rank = 0, uint32_t world = 1) {
    CheckpointerOptions o = Options(rank, world, faulty_.get());
    auto c = Checkpointer::Open(o);
    if (!c.ok()) return c.status();
    std::vector<RankState> rs = BuildRanks(Tensors(2), DimLayout(world, 0), true);
    return (*c)->Save(2, RequestOf(rs[rank], rank, 2)).WaitPersisted();
  }

  // After a failed save: step 1 is still the newest, step 2 is listed as not complete, no temporary
  // file is left behind.
  void ExpectStep2Invisible() {
    ExpectLatestLoads(1);
    auto c = Open();
    auto list = c->List();
    ASSERT_TRUE(list.ok());
    for (const CheckpointInfo& i : *list)
      if (i.step == 2) {
        EXPECT_FALSE(i.complete);
      }
    for (const std::string& name : ListDir(StepDir(2)))
      EXPECT_EQ(name.find(".tmp-"), std::string::npos) << "temporary file left: " << name;
  }

  // Clearing the fault, the same save succeeds (a retried save of the same step and run).
  void ExpectRetrySucceeds() {
    faulty_ = std::make_unique<FaultInjectionEnv>(Env::Default());
    Status s = SaveStep2();
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectLatestLoads(2);
    auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
    ASSERT_TRUE(reader.ok());
    EXPECT_TRUE((*reader)->Verify(nullptr).ok());
  }

  std::unique_ptr<FaultInjectionEnv> faulty_;
};

TEST_F(FailedSaveTest, DiskFullWhileWritingData) {
  faulty_->FailWritesAfterBytes(10000);
  Status s = SaveStep2();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find(StepDir(2) + "/" + DataFileName(Hash(), 0, 1)), std::string::npos) << s.ToString();
  ExpectStep2Invisible();
  ExpectRetrySucceeds();
}

TEST_F(FailedSaveTest, DiskFullWhileWritingTheIndex) {
  faulty_->RestrictToPathsContaining(".index");
  faulty_->FailWritesAfterBytes(0);
  Status s = SaveStep2();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(IndexFileName(Hash(), 0, 1)), std::string::npos) << s.ToString();
  ExpectStep2Invisible();
  ExpectRetrySucceeds();
}

TEST_F(FailedSaveTest, DataSyncFailure) {
  faulty_->RestrictToPathsContaining(".data");
  faulty_->FailSyncs(true);
  Status s = SaveStep2();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
  EXPECT_NE(s.message().find(DataFileName(Hash(), 0, 1)), std::string::npos) << s.ToString();
  ExpectStep2Invisible();
  ExpectRetrySucceeds();
}

TEST_F(FailedSaveTest, IndexSyncFailure) {
  faulty_->RestrictToPathsContaining(".index");
  faulty_->FailSyncs(true);
  Status s = SaveStep2();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(IndexFileName(Hash(), 0, 1)), std::string::npos) << s.ToString();
  ExpectStep2Invisible();
  ExpectRetrySucceeds();
}

TEST_F(FailedSaveTest, IndexRenameFailure) {
  faulty_->FailRenames(true);
  Status s = SaveStep2();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(IndexFileName(Hash(), 0, 1)), std::string::npos) << s.ToString();
  ExpectStep2Invisible();
  ExpectRetrySucceeds();
}

TEST_F(FailedSaveTest, OneFailingRankKeepsTheStepInvisibleUntilItsRetry) {
  // Rank 0 of 2 succeeds, rank 1 hits a full disk.
  EXPECT_TRUE(SaveStep2(0, 2).ok());
  faulty_->FailWritesAfterBytes(5000);
  Status s = SaveStep2(1, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.ToString();
  ExpectStep2Invisible();
  faulty_ = std::make_unique<FaultInjectionEnv>(Env::Default());
  Status retry = SaveStep2(1, 2);
  ASSERT_TRUE(retry.ok()) << retry.ToString();
  ExpectLatestLoads(2);
}

TEST_F(FailedSaveTest, ManifestFailureAfterTheLastIndexStillCommits) {
  // The last index is the commit point; the manifest only saves readers from merging indexes. A
  // save whose step became visible must not report failure (the caller would retry and get
  // AlreadyExists).
  faulty_->RestrictToPathsContaining(".manifest");
  faulty_->FailRenames(true);
  Status s = SaveStep2();
  EXPECT_TRUE(s.ok()) << s.ToString();
  ExpectLatestLoads(2);
  auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->Verify(nullptr).ok());
}

}  // namespace commit_test
}  // namespace lifeline::testing

// ---- commit.h directly, over MemEnv ----------------------------------------------------------

namespace lifeline {
namespace commit_test {

CheckpointInfo Info(uint64_t step, bool complete, bool invalid = false) {
  CheckpointInfo i;
  i.step = step;
  i.complete = complete;
  i.invalid = invalid;
  i.directory = "/ckpt/" + StepDirName(step);
  return i;
}

// Steps 6 (partial, being written), 5, 4 (partial), 3 (complete, unloadable), 2, 1, and 0
// (invalid), newest first as ScanCheckpoints lists them.
std::vector<CheckpointInfo> History() {
  return {Info(6, false), Info(5, true), Info(4, false), Info(3, true), Info(2, true), Info(1, true),
          Info(0, true, /*invalid=*/true)};
}

RetentionPolicy Policy(uint32_t keep_last) {
  RetentionPolicy p;
  p.keep_last = keep_last;
  p.loadable = [](const CheckpointInfo& i) {
    return i.step == 3 ? Status::Corruption("step 3", "manifest damaged") : Status::OK();
  };
  return p;
}

TEST(CommitRetentionPlanTest, KeepsTheNewestLoadableStepsAndNeverCountsAnUnloadableOne) {
  std::vector<CheckpointInfo> all = History();
  const std::vector<bool> remove = RetentionPlan(all, Policy(2));
  // 6: newer than every loadable step, may still be written; 5, 2: the two newest loadable;
  // 4: partial and older than a loadable step; 3: unloadable, kept until two loadable steps are
  // newer, which they are not; 1: beyond keep_last; 0: invalid.
  EXPECT_EQ(std::vector<bool>({false, false, true, false, false, true, true}), remove);
  EXPECT_FALSE(all[3].complete) << "an unloadable step is reported as not complete";
  EXPECT_NE(std::string::npos, all[3].problem.find("manifest damaged")) << all[3].problem;
}

TEST(CommitRetentionPlanTest, KeepLastZeroKeepsEveryCompleteStep) {
  std::vector<CheckpointInfo> all = History();
  const std::vector<bool> remove = RetentionPlan(all, Policy(0));
  EXPECT_EQ(std::vector<bool>({false, false, true, false, false, false, true}), remove);
}

TEST(CommitRetentionPlanTest, StalePartialStepsOfEndedLaunchesGoEvenWhenNewest) {
  std::vector<CheckpointInfo> all = History();
  RetentionPolicy p = Policy(2);
  p.stale = [](const CheckpointInfo& i) { return i.step == 6; };
  EXPECT_TRUE(RetentionPlan(all, p)[0]);
}

Status SaveRank(Env* env, uint32_t rank, uint32_t world, uint64_t step, std::vector<float>* data) {
  const CheckpointerOptions options = test::InMemoryCheckpointerOptions(env, "commit-unit-test", 4096, rank, world);
  LL_ASSIGN_OR_RETURN(std::unique_ptr<Checkpointer> ckpt, Checkpointer::Open(options));
  SaveRequest req;
  req.tensors.push_back(TensorShard::Flat("w", DType::kF32, {8}, rank * 4, rank * 4 + 4, data->data()));
  return ckpt->Save(step, req).WaitPersisted();
}

TEST(CommitMemEnvTest, AStepCommitsWithItsLastRankIndexAndSurvivesACrash) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  ASSERT_TRUE(SaveRank(env.get(), 0, 2, 7, &a).ok());
  Status waiting = WaitForCommitIn(env.get(), "/ckpt", 7, 0.05);
  EXPECT_EQ(StatusCode::kAborted, waiting.code()) << waiting.ToString();
  EXPECT_NE(std::string::npos, waiting.ToString().find("7")) << "names the step: " << waiting.ToString();

  ASSERT_TRUE(SaveRank(env.get(), 1, 2, 7, &b).ok());
  EXPECT_TRUE(WaitForCommitIn(env.get(), "/ckpt", 7, 1).ok());
  // Committed means durable: a power cut right after the save changes nothing.
  env->SimulateCrash();
  Status after = WaitForCommitIn(env.get(), "/ckpt", 7, 1);
  EXPECT_TRUE(after.ok()) << after.ToString();
  auto reader = CheckpointReader::Open(env.get(), "/ckpt", 7);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->Verify(nullptr).ok());

  // A committed step is never written again, by any attempt.
  Result<std::string> again = PrepareStepDir(env.get(), "/ckpt", 7, RunHash("another-launch"), 0, 2);
  EXPECT_TRUE(again.status().IsAlreadyExists()) << again.status().ToString();
}

TEST(CommitMemEnvTest, CreateDirDurablySurvivesACrashThatAPlainCreateDoesNot) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ASSERT_TRUE(CreateDirDurably(env.get(), "/a/b/c").ok());
  ASSERT_TRUE(env->CreateDir("/a/b/c/plain").ok());
  env->SimulateCrash();
  EXPECT_TRUE(env->FileExists("/a/b/c"));
  EXPECT_FALSE(env->FileExists("/a/b/c/plain")) << "the crash model lost nothing it should have";
}

}  // namespace commit_test
}  // namespace lifeline
