// Checkpointer, in memory (MemEnv): options refused with the reason, a committed step never
// overwritten, a busy arena skipping a save rather than stalling when asked, a damaged newest
// checkpoint skipped with the reason reported, and retention; with the memory tier, a save that
// supersedes one still waiting for a store that is away rather than block. The multi-rank,
// real-file and failure behaviour is covered by tests/integration and commit_test.cc.
#include <limits.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tests/integration/whole_state.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace checkpointer_test {

class CheckpointerTest : public ::testing::Test {
 protected:
  CheckpointerOptions Options() const {
    return test::InMemoryCheckpointerOptions(env_.get(), "checkpointer-test", 1024);
  }

  SaveRequest Request(std::vector<float>* w) {
    SaveRequest r;
    r.tensors.push_back(TensorShard::Whole("w", DType::kF32, {static_cast<int64_t>(w->size())}, w->data()));
    return r;
  }

  std::unique_ptr<MemEnv> env_ = NewMemEnv();
};

TEST_F(CheckpointerTest, InconsistentOptionsAreRefusedWithTheReason) {
  auto expect_refused = [&](CheckpointerOptions o, const std::string& reason) {
    auto c = Checkpointer::Open(o);
    ASSERT_FALSE(c.ok()) << reason;
    EXPECT_EQ(StatusCode::kInvalidArgument, c.status().code()) << c.status().ToString();
    EXPECT_NE(std::string::npos, c.status().ToString().find(reason)) << c.status().ToString();
  };
  CheckpointerOptions o = Options();
  o.directory = "";
  expect_refused(o, "directory");
  o = Options();
  o.rank = 2;
  o.world_size = 2;
  expect_refused(o, "rank 2");
  o = Options();
  o.chunk_bytes = 1001;
  expect_refused(o, "chunk_bytes");
  o = Options();
  o.write_block_bytes = 1000;
  expect_refused(o, "write_block_bytes");
  o = Options();
  o.staging_slots = 0;
  expect_refused(o, "staging_slots");
}

TEST_F(CheckpointerTest, ACommittedStepIsNeverOverwritten) {
  auto c = Checkpointer::Open(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> first(500, 1.0f), second(500, 2.0f);
  ASSERT_TRUE((*c)->Save(1, Request(&first)).WaitPersisted().ok());
  Status again = (*c)->Save(1, Request(&second)).WaitPersisted();
  EXPECT_TRUE(again.IsAlreadyExists()) << again.ToString();
  std::vector<float> back(500);
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("w", DType::kF32, {500}, back.data()));
  auto loaded = (*c)->Load(1, load);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(first, back);
}

TEST_F(CheckpointerTest, ADamagedNewestCheckpointIsSkippedAndSaidSo) {
  auto c = Checkpointer::Open(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> w1(500, 1.0f), w2(500, 2.0f);
  ASSERT_TRUE((*c)->Save(1, Request(&w1)).WaitPersisted().ok());
  ASSERT_TRUE((*c)->Save(2, Request(&w2)).WaitPersisted().ok());
  const std::string data = JoinPath(JoinPath("/ckpt", StepDirName(2)), DataFileName(RunHash("checkpointer-test"), 0, 1));
  Result<std::string> bytes = ReadFileToString(env_.get(), data, 1 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  (*bytes)[kDataHeaderBytes + 10] ^= 0x20;
  ASSERT_TRUE(WriteFileAtomically(env_.get(), data, *bytes).ok());

  std::vector<float> back(500);
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("w", DType::kF32, {500}, back.data()));
  auto loaded = (*c)->Load(std::nullopt, load);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(1u, loaded->step);
  EXPECT_EQ(w1, back);
  ASSERT_EQ(1u, loaded->skipped.size()) << "a fallback must be reported, not only logged";
  // Asked for by number, the damaged step is an error, not a silent fallback.
  EXPECT_TRUE((*c)->Load(2, load).status().IsCorruption());
}

// lifeline-agent pins the step a launch resumes from for the directory it resolved
// (LIFELINE_RESUME_DIR, absolute). A rank naming the same directory relatively, before any rank
// has created it, is under that pin: were it not, ranks racing to create the directory would
// disagree on the step (one pinned, one free) and a job's first launch could deadlock.
TEST(CheckpointerResumePin, AppliesToTheSameDirectoryNamedRelativelyBeforeItExists) {
  test::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  char cwd[PATH_MAX];
  ASSERT_NE(nullptr, ::getcwd(cwd, sizeof(cwd)));
  ASSERT_EQ(0, ::chdir(dir.path().c_str()));
  {
    test::ScopedEnv pinned_dir("LIFELINE_RESUME_DIR", (dir.path() + "/ckpt/job").c_str());
    test::ScopedEnv pinned_step("LIFELINE_RESUME_STEP", "none");
    CheckpointerOptions o = test::SmallCheckpointerOptions("ckpt/job", "resume-pin-test", 1024);
    o.direct_io = false;
    o.memory_tier = false;
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<float> back(4);
    LoadRequest load;
    load.tensors.push_back(TensorShard::Whole("w", DType::kF32, {4}, back.data()));
    Status fresh = (*c)->Load(std::nullopt, load).status();
    EXPECT_TRUE(fresh.IsNotFound()) << fresh.ToString();
    EXPECT_NE(std::string::npos, fresh.ToString().find("resume step \"none\"")) << fresh.ToString();
  }
  ASSERT_EQ(0, ::chdir(cwd));
}

TEST(LoadFailureRule, DamageFallsBackAMismatchNeverDoesTheMachinesTroubleStops) {
  EXPECT_EQ(LoadFailure::kMismatch, ClassifyLoadFailure(StatusCode::kNotInCheckpoint));
  for (StatusCode damage : {StatusCode::kCorruption, StatusCode::kNotFound, StatusCode::kFailedPrecondition})
    EXPECT_EQ(LoadFailure::kDamage, ClassifyLoadFailure(damage)) << StatusCodeName(damage);
  for (StatusCode other : {StatusCode::kIOError, StatusCode::kResourceExhausted, StatusCode::kInvalidArgument,
                           StatusCode::kAborted, StatusCode::kUnavailable})
    EXPECT_EQ(LoadFailure::kOther, ClassifyLoadFailure(other)) << StatusCodeName(other);
}

// Save plans the chunks of its tensors once and reuses that plan while the next saves hold the
// same tensors (as a training loop's do): what each save writes is still its own. The same
// tensors with new values and new objects; then the same geometry at another address, a changed
// shape and a renamed tensor (each planned anew); every step loads back exactly as it was saved.
TEST_F(CheckpointerTest, ReusedPlansSaveEachStepsOwnValuesAddressesShapesAndObjects) {
  CheckpointerOptions o = Options();
  o.chunk_bytes = 64;  // many chunks per tensor
  auto c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> a(300), b(300), small(120);
  auto fill = [](std::vector<float>* v, float base) {
    for (size_t i = 0; i < v->size(); ++i) (*v)[i] = base + static_cast<float>(i);
  };
  struct Saved {
    std::string name;
    std::vector<float> values;
    std::string object;
  };
  std::vector<Saved> saved;
  auto save = [&](uint64_t step, const std::string& name, std::vector<float>* w, float base) {
    fill(w, base);
    SaveRequest r;
    r.tensors.push_back(TensorShard::Whole(name, DType::kF32, {static_cast<int64_t>(w->size())}, w->data()));
    r.objects = {{"step", std::string(step, 'x')}};  // a different length every time
    ASSERT_TRUE((*c)->Save(step, r).WaitPersisted().ok()) << step;
    saved.push_back({name, *w, r.objects[0].second});
  };
  save(1, "w", &a, 0);
  save(2, "w", &a, 1000);     // the same tensor: the plan is reused
  save(3, "w", &b, 2000);     // another address
  save(4, "w", &small, 3000); // another shape
  save(5, "v", &small, 4000); // another name
  save(6, "v", &small, 5000);
  for (uint64_t step = 1; step <= saved.size(); ++step) {
    const Saved& want = saved[step - 1];
    std::vector<float> back(want.values.size(), -1.0f);
    LoadRequest load;
    load.tensors.push_back(TensorShard::Whole(want.name, DType::kF32, {static_cast<int64_t>(back.size())}, back.data()));
    auto loaded = (*c)->Load(step, load);
    ASSERT_TRUE(loaded.ok()) << step << ": " << loaded.status().ToString();
    EXPECT_EQ(want.values, back) << "step " << step;
    ASSERT_EQ(1u, loaded->objects.size()) << step;
    EXPECT_EQ(want.object, loaded->objects[0].second) << "step " << step;
  }
}

TEST_F(CheckpointerTest, RetentionKeepsTheNewestCheckpoints) {
  CheckpointerOptions o = Options();
  o.keep_last = 2;
  auto c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> w(100, 1.0f);
  for (uint64_t step = 1; step <= 4; ++step) ASSERT_TRUE((*c)->Save(step, Request(&w)).WaitPersisted().ok());
  ASSERT_TRUE((*c)->Flush().ok());
  auto list = (*c)->List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  std::vector<uint64_t> steps;
  for (const CheckpointInfo& i : *list) steps.push_back(i.step);
  EXPECT_EQ(std::vector<uint64_t>({4, 3}), steps);
  auto latest = (*c)->LatestStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(4u, latest->value_or(0));
}

TEST_F(CheckpointerTest, NoCheckpointYetIsNotFound) {
  auto c = Checkpointer::Open(Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> back(10);
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("w", DType::kF32, {10}, back.data()));
  EXPECT_TRUE((*c)->Load(std::nullopt, load).status().IsNotFound());
  auto latest = (*c)->LatestStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->has_value());
}

// With the memory tier and an object store (here a gate holding every data write of a disk, with
// supersede_waiting_saves as an s3:// directory has it), training does not wait for a store that
// is away: step 1's write is held, step 2 waits behind it, and step 3 takes step 2's slot at once.
// Step 2's ticket says it was superseded and nothing of it is published; the tier holds steps 1 and
// 3; once the store is back, steps 1 and 3 are persisted and the newest loads.
TEST(CheckpointerMemoryTierTest, ASaveSupersedesOneStillWaitingForTheStoreRatherThanBlock) {
  testing::TempDir dir;
  testing::GatedEnv store(Env::Default());
  CheckpointerOptions o = testing::BaseOptions(dir.Sub("ckpt"));
  o.env = &store;
  o.memory_tier = true;
  o.memory_tier_directory = dir.Sub("tier");
  o.staging_slots = 2;
  o.supersede_waiting_saves = true;  // as for an object store (a disk keeps its back-pressure)
  Result<std::unique_ptr<Checkpointer>> ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  testing::WholeState state(1);
  SaveTicket first = (*ckpt)->Save(1, state.Request());
  ASSERT_TRUE(first.WaitSnapshot().ok());
  // Step 1 is being persisted (its write held at the gate), not only queued: under load the persist
  // thread may not have taken it yet when step 3 comes, and step 1 would be the one superseded.
  ASSERT_TRUE(store.WaitUntilHeld());
  state.ScribbleAll();
  SaveTicket second = (*ckpt)->Save(2, state.Request());
  ASSERT_TRUE(second.WaitSnapshot().ok());
  state.ScribbleAll();
  std::vector<testing::GlobalTensor> third_state = state.tensors;
  for (size_t i = 0; i < third_state.size(); ++i) third_state[i].bytes = state.live[i];
  SaveTicket third = (*ckpt)->Save(3, state.Request());  // returns with the store still away
  ASSERT_TRUE(third.WaitSnapshot().ok()) << third.Progress().status.ToString();
  const Status superseded = second.WaitPersisted();
  EXPECT_EQ(StatusCode::kAborted, superseded.code()) << superseded.ToString();
  EXPECT_NE(std::string::npos, superseded.ToString().find("superseded by step 3")) << superseded.ToString();
  EXPECT_NE(std::string::npos, superseded.ToString().find("step 1 was still being persisted")) << superseded.ToString();
  EXPECT_EQ(SavePhase::kFailed, second.Progress().phase);
  // Published to the tier by the copy thread just after the snapshot completed.
  for (int i = 0; i < 2000 && !third.Progress().memory_tier; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Result<std::vector<CheckpointInfo>> tier = (*ckpt)->ListMemoryTier();
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  std::vector<uint64_t> in_tier;
  for (const CheckpointInfo& c : *tier)
    if (c.complete) in_tier.push_back(c.step);
  EXPECT_EQ((std::vector<uint64_t>{3, 1}), in_tier);

  store.Open();  // the store is back
  EXPECT_TRUE(first.WaitPersisted().ok()) << first.Progress().status.ToString();
  EXPECT_TRUE(third.WaitPersisted().ok()) << third.Progress().status.ToString();
  Result<std::vector<CheckpointInfo>> durable = ScanCheckpointDirectory(o.directory);
  ASSERT_TRUE(durable.ok()) << durable.status().ToString();
  std::vector<uint64_t> steps;
  for (const CheckpointInfo& c : *durable) steps.push_back(c.step);
  EXPECT_EQ((std::vector<uint64_t>{3, 1}), steps) << "step 2 left something behind";
  ckpt->reset();
  CheckpointerOptions reader = o;
  reader.env = nullptr;
  reader.run_id = "reader";
  reader.memory_tier = false;
  Result<std::unique_ptr<Checkpointer>> again = Checkpointer::Open(reader);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  uint64_t loaded = 0;
  EXPECT_EQ("", testing::LoadAndCompare(again->get(), std::nullopt, third_state, &loaded));
  EXPECT_EQ(3u, loaded);
}

}  // namespace checkpointer_test
}  // namespace lifeline
