// Lazy asynchronous saves: what is persisted is the state at Save time even when the caller
// mutates it right after WaitSnapshot; back-pressure when the previous save is still persisting;
// codecs; the multi-level drain; the io_uring-refused fallback. (The memory tier's tests are
// beside it, in lib/src/tier/memory_tier_test.cc.)
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "lib/src/env/io_queue_internal.h"
#include "lifeline/checkpoint.h"
#include "tests/integration/test_util.h"
#include "tests/integration/whole_state.h"

namespace lifeline::testing {
namespace async_save_test {

// ---- consistency --------------------------------------------------------------------------

struct Variant {
  const char* name;
  void (*apply)(CheckpointerOptions*);
};

class ConsistencyTest : public ::testing::TestWithParam<Variant> {};

TEST_P(ConsistencyTest, MutatingRightAfterWaitSnapshotNeverLeaksIntoTheCheckpoint) {
  TempDir dir;
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.memory_tier_directory = dir.Sub("tier");
  GetParam().apply(&o);
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  WholeState state(1);
  std::vector<std::vector<GlobalTensor>> saved;
  std::vector<SaveTicket> tickets;
  for (uint64_t step = 1; step <= 4; ++step) {
    // The state at Save time is what each step must hold.
    std::vector<GlobalTensor> at_save = state.tensors;
    for (size_t i = 0; i < at_save.size(); ++i) at_save[i].bytes = state.live[i];
    saved.push_back(std::move(at_save));
    SaveTicket t = (*ckpt)->Save(step, state.Request());
    ASSERT_TRUE(t.WaitSnapshot().ok()) << t.Progress().status.ToString();
    state.ScribbleAll();  // the optimizer step, while the save is still being persisted
    tickets.push_back(t);
  }
  for (const SaveTicket& t : tickets) ASSERT_TRUE(t.WaitPersisted().ok()) << t.Progress().status.ToString();
  ASSERT_TRUE(tickets.back().WaitCommitted(30).ok());
  for (uint64_t step = 1; step <= 4; ++step)
    EXPECT_EQ(LoadAndCompare(ckpt->get(), step, saved[step - 1]), "") << "step " << step;
  const SaveProgress p = tickets.back().Progress();
  EXPECT_EQ(p.phase, SavePhase::kCommitted);
  EXPECT_EQ(p.bytes_copied, p.bytes_total);
  EXPECT_GT(p.bytes_stored, 0u);
  EXPECT_EQ(p.staged, std::string(GetParam().name) != "streamed");
  EXPECT_EQ(p.memory_tier, std::string(GetParam().name) == "memory_tier");
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ConsistencyTest,
    ::testing::Values(
        Variant{"staged", [](CheckpointerOptions*) {}},
        Variant{"one_slot", [](CheckpointerOptions* o) { o->staging_slots = 1; }},
        Variant{"four_copy_threads", [](CheckpointerOptions* o) { o->copy_threads = 4; }},
        Variant{"memory_tier", [](CheckpointerOptions* o) { o->memory_tier = true; }},
        Variant{"zstd", [](CheckpointerOptions* o) { o->codec = SaveCodec::kZstd; }},
        Variant{"zstd_bytegroup", [](CheckpointerOptions* o) { o->codec = SaveCodec::kZstdByteGroup; }},
        Variant{"streamed", [](CheckpointerOptions* o) { o->staging_budget_bytes = 1 << 20; }},
        Variant{"buffered_io", [](CheckpointerOptions* o) { o->direct_io = false; }},
        Variant{"unregistered", [](CheckpointerOptions* o) { o->register_buffers = false; }}),
    [](const ::testing::TestParamInfo<Variant>& info) { return std::string(info.param.name); });

TEST(AsyncSaveTest, PerTensorReadinessLetsEachTensorBeUpdatedAsSoonAsItIsCopied) {
  TempDir dir;
  auto ckpt = Checkpointer::Open(BaseOptions(dir.Sub("ckpt")));
  ASSERT_TRUE(ckpt.ok());
  WholeState state(7);
  const std::vector<GlobalTensor> at_save = state.tensors;
  SaveRequest req = state.Request();
  SaveTicket t = (*ckpt)->Save(1, req);
  // Update tensors in reverse order, each as soon as its own copy is done.
  for (size_t i = req.tensors.size(); i-- > 0;) {
    ASSERT_TRUE(t.WaitTensor(i).ok());
    EXPECT_TRUE(t.TensorCopied(i));
    state.Scribble(i);
  }
  EXPECT_EQ(t.WaitTensor(req.tensors.size()).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(t.WaitPersisted().ok()) << t.Progress().status.ToString();
  EXPECT_EQ(LoadAndCompare(ckpt->get(), 1, at_save), "");
}

TEST(AsyncSaveTest, ErrorsAreReportedByTheTicket) {
  TempDir dir;
  auto ckpt = Checkpointer::Open(BaseOptions(dir.Sub("ckpt")));
  ASSERT_TRUE(ckpt.ok());
  WholeState state(3);
  SaveRequest bad = state.Request();
  bad.tensors[0].data = nullptr;
  SaveTicket t = (*ckpt)->Save(1, bad);
  EXPECT_EQ(t.WaitSnapshot().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Progress().phase, SavePhase::kFailed);
  EXPECT_NE(t.Progress().status.message().find(state.tensors[0].name), std::string::npos);

  ASSERT_TRUE((*ckpt)->Save(2, state.Request()).WaitPersisted().ok());
  SaveTicket again = (*ckpt)->Save(2, state.Request());
  EXPECT_TRUE(again.WaitPersisted().IsAlreadyExists()) << again.Progress().status.ToString();
  EXPECT_TRUE(again.WaitSnapshot().IsAlreadyExists());
  EXPECT_TRUE(SaveTicket().WaitSnapshot().code() == StatusCode::kFailedPrecondition);
  // The failure is also what Flush reports; the earlier checkpoint is intact.
  EXPECT_FALSE((*ckpt)->Flush().ok());
  EXPECT_EQ(LoadAndCompare(ckpt->get(), std::nullopt, state.tensors), "");
}

TEST(AsyncSaveTest, DestroyingTheCheckpointerFinishesItsSaves) {
  TempDir dir;
  WholeState state(11);
  {
    auto ckpt = Checkpointer::Open(BaseOptions(dir.Sub("ckpt")));
    ASSERT_TRUE(ckpt.ok());
    SaveTicket t = (*ckpt)->Save(9, state.Request());
    ASSERT_TRUE(t.WaitSnapshot().ok());
  }  // no WaitPersisted
  auto reopened = Checkpointer::Open(BaseOptions(dir.Sub("ckpt")));
  ASSERT_TRUE(reopened.ok());
  uint64_t step = 0;
  EXPECT_EQ(LoadAndCompare(reopened->get(), std::nullopt, state.tensors, &step), "");
  EXPECT_EQ(step, 9u);
}

TEST(AsyncSaveTest, PreparedStagingIsUsedBySavesAndRefusesWhatWouldNotFit) {
  TempDir dir;
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.staging_slots = 2;
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok());
  WholeState state(5);
  ASSERT_TRUE((*ckpt)->PrepareStaging(state.Request()).ok());
  // Saves into the prepared slots hold the state at Save time, mutated right after the snapshot.
  for (uint64_t step = 1; step <= 3; ++step) {
    const std::vector<GlobalTensor> at_save = [&] {
      std::vector<GlobalTensor> ts = state.tensors;
      for (size_t i = 0; i < ts.size(); ++i) ts[i].bytes = state.live[i];
      return ts;
    }();
    SaveTicket t = (*ckpt)->Save(step, state.Request());
    ASSERT_TRUE(t.WaitSnapshot().ok()) << t.Progress().status.ToString();
    state.ScribbleAll();
    ASSERT_TRUE(t.WaitPersisted().ok()) << t.Progress().status.ToString();
    EXPECT_EQ(LoadAndCompare(ckpt->get(), step, at_save), "") << "step " << step;
    // Preparing again while nothing is in flight is harmless.
    ASSERT_TRUE((*ckpt)->PrepareStaging(state.Request()).ok());
  }

  // A state larger than one slot would be streamed: preparing it says so and names the limit.
  CheckpointerOptions small = BaseOptions(dir.Sub("small"));
  small.staging_budget_bytes = 2 << 20;
  small.staging_slots = 2;
  auto tight = Checkpointer::Open(small);
  ASSERT_TRUE(tight.ok());
  Status s = (*tight)->PrepareStaging(state.Request());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("staging slot"), std::string::npos) << s.ToString();
  // ...and the save itself still works, streamed.
  ASSERT_TRUE((*tight)->Save(1, state.Request()).WaitPersisted().ok());
  std::vector<GlobalTensor> now = state.tensors;
  for (size_t i = 0; i < now.size(); ++i) now[i].bytes = state.live[i];
  EXPECT_EQ(LoadAndCompare(tight->get(), 1, now), "");

  // A malformed request is refused with the tensor's name, before any memory is touched.
  SaveRequest bad = state.Request();
  bad.tensors[1].shape[0] += 1;  // a box past the end of its global tensor
  Status b = (*ckpt)->PrepareStaging(bad);
  EXPECT_EQ(b.code(), StatusCode::kInvalidArgument) << b.ToString();
  EXPECT_NE(b.message().find(state.tensors[1].name), std::string::npos) << b.ToString();
}

// ---- back-pressure ------------------------------------------------------------------------

// One staging slot, and a disk that holds every data write until the test opens the gate.
class BackPressureTest : public ::testing::Test {
 protected:
  // A failed assertion must not leave the Checkpointer's destructor waiting at a closed gate.
  ~BackPressureTest() override { env_.Open(); }
  Checkpointer* OpenWith(BusyPolicy policy) {
    CheckpointerOptions o = BaseOptions(dir_.Sub("ckpt"));
    o.env = &env_;
    o.staging_slots = 1;
    o.busy_policy = policy;
    auto ckpt = Checkpointer::Open(o);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    if (ckpt.ok()) ckpt_ = std::move(*ckpt);
    return ckpt_.get();
  }
  TempDir dir_;
  GatedEnv env_{Env::Default()};
  std::unique_ptr<Checkpointer> ckpt_;  // destroyed first, after the gate is open
};

TEST_F(BackPressureTest, SkipPolicyRefusesASaveWhileEverySlotIsPersistingAndSaysWhy) {
  GatedEnv& env = env_;
  Checkpointer* ckpt = OpenWith(BusyPolicy::kSkip);
  ASSERT_NE(ckpt, nullptr);
  WholeState state(5);
  SaveTicket first = ckpt->Save(10, state.Request());
  ASSERT_TRUE(first.WaitSnapshot().ok());  // copied; its write is held at the gate
  SaveTicket second = ckpt->Save(20, state.Request());
  const Status skipped = second.WaitSnapshot();
  EXPECT_TRUE(skipped.IsUnavailable()) << skipped.ToString();
  EXPECT_NE(skipped.message().find("step 10"), std::string::npos) << skipped.ToString();
  EXPECT_EQ(second.Progress().phase, SavePhase::kSkipped);
  EXPECT_TRUE(second.WaitPersisted().IsUnavailable());
  env.Open();
  ASSERT_TRUE(first.WaitPersisted().ok());
  // The slot is free again: the next save is taken.
  ASSERT_TRUE(ckpt->Save(30, state.Request()).WaitPersisted().ok());
  auto list = ckpt->List();
  ASSERT_TRUE(list.ok());
  std::vector<uint64_t> steps;
  for (const CheckpointInfo& c : *list) steps.push_back(c.step);
  EXPECT_EQ(steps, (std::vector<uint64_t>{30, 10}));
  EXPECT_TRUE(ckpt->Flush().ok()) << "a skipped save is not a failure";
}

TEST_F(BackPressureTest, WaitPolicyBlocksSaveUntilASlotIsFreeAndLosesNothing) {
  GatedEnv& env = env_;
  Checkpointer* ckpt = OpenWith(BusyPolicy::kWait);
  ASSERT_NE(ckpt, nullptr);
  WholeState state(6);
  const std::vector<GlobalTensor> first_state = state.tensors;
  SaveTicket first = ckpt->Save(1, state.Request());
  ASSERT_TRUE(first.WaitSnapshot().ok());
  state.ScribbleAll();
  std::vector<GlobalTensor> second_state = state.tensors;
  for (size_t i = 0; i < second_state.size(); ++i) second_state[i].bytes = state.live[i];

  std::atomic<bool> returned{false};
  SaveTicket second;
  std::thread saver([&] {
    second = ckpt->Save(2, state.Request());
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(returned.load()) << "Save returned while its only slot was still being persisted";
  env.Open();
  saver.join();
  ASSERT_TRUE(second.WaitPersisted().ok()) << second.Progress().status.ToString();
  EXPECT_GE(second.Progress().stall_seconds, 0.1) << "the wait is the caller's stall";
  EXPECT_EQ(LoadAndCompare(ckpt, 1, first_state), "");
  EXPECT_EQ(LoadAndCompare(ckpt, 2, second_state), "");
}

// ---- a job of several ranks: multi-level, retention -----------------------------------------

// A job of several ranks cutting StateTensors along dim 0, each rank with its own Checkpointer, as
// the processes of a training job hold them.
class RankedJobTest : public ::testing::Test {
 protected:
  // Opens a Checkpointer on `options` for every rank of `world` cutting StateTensors(salt).
  void OpenRanks(CheckpointerOptions options, uint32_t world, uint64_t salt) {
    tensors_ = StateTensors(salt);
    layout_ = DimLayout(world, 0);
    ranks_ = BuildRanks(tensors_, layout_, /*fill_from_global=*/true);
    options.world_size = layout_.world_size;
    for (uint32_t r = 0; r < layout_.world_size; ++r) {
      options.rank = r;
      auto c = Checkpointer::Open(options);
      ASSERT_TRUE(c.ok());
      ckpts_.push_back(std::move(*c));
    }
  }

  // Starts rank `rank`'s save of `step`.
  SaveTicket SaveRank(uint32_t rank, uint64_t step) {
    return ckpts_[rank]->Save(step, RequestOf(ranks_[rank], rank, 4));
  }

  TempDir dir_;
  std::vector<GlobalTensor> tensors_;
  Layout layout_;
  std::vector<RankState> ranks_;
  std::vector<std::unique_ptr<Checkpointer>> ckpts_;  // closed before dir_ is removed
};

class DrainTest : public RankedJobTest {};

TEST_F(DrainTest, CommittedCheckpointsAreCopiedToTheSecondDirectoryWithItsOwnRetention) {
  CheckpointerOptions o = BaseOptions(dir_.Sub("fast"));
  o.keep_last = 1;
  o.drain_directory = dir_.Sub("shared");
  o.drain_keep_last = 2;
  ASSERT_NO_FATAL_FAILURE(OpenRanks(o, 3, 4));
  for (uint64_t step = 1; step <= 3; ++step) {
    std::vector<SaveTicket> ts;
    for (uint32_t r = 0; r < layout_.world_size; ++r) ts.push_back(SaveRank(r, step));
    for (const SaveTicket& t : ts) ASSERT_TRUE(t.WaitCommitted(30).ok());
    // Drained before the next commit's retention removes it from the first directory.
    for (auto& c : ckpts_) ASSERT_TRUE(c->Flush().ok());
  }
  auto shared = Checkpointer::Open(BaseOptions(dir_.Sub("shared")));
  ASSERT_TRUE(shared.ok());
  auto list = (*shared)->List();
  ASSERT_TRUE(list.ok());
  std::vector<uint64_t> steps;
  for (const CheckpointInfo& c : *list) {
    EXPECT_TRUE(c.complete) << c.problem;
    steps.push_back(c.step);
  }
  EXPECT_EQ(steps, (std::vector<uint64_t>{3, 2}));
  for (uint64_t step : {2, 3}) EXPECT_EQ(LoadAndCompare(shared->get(), step, tensors_), "") << "step " << step;
  auto fast = ckpts_[0]->List();
  ASSERT_TRUE(fast.ok());
  EXPECT_EQ(fast->size(), 1u) << "the first directory keeps its own retention";
}

class RetentionTest : public RankedJobTest {};

TEST_F(RetentionTest, WaitingOnAStepThatRetentionRemovedAnswersAtOnce) {
  CheckpointerOptions o = BaseOptions(dir_.Sub("ckpt"));
  o.keep_last = 1;
  ASSERT_NO_FATAL_FAILURE(OpenRanks(o, 2, 6));
  std::vector<SaveTicket> first;
  for (uint32_t r = 0; r < layout_.world_size; ++r) {  // one after the other: rank 0 never sees step 1 complete
    first.push_back(SaveRank(r, 1));
    ASSERT_TRUE(first.back().WaitPersisted().ok());
  }
  std::vector<SaveTicket> second;
  for (uint32_t r = 0; r < layout_.world_size; ++r) second.push_back(SaveRank(r, 2));
  for (const SaveTicket& t : second) ASSERT_TRUE(t.WaitCommitted(30).ok());
  for (auto& c : ckpts_) ASSERT_TRUE(c->Flush().ok());  // retention of step 1 has run
  // Step 1 was committed and then removed: a rank that never saw it complete learns why instead
  // of waiting out its timeout.
  for (const SaveTicket& t : first) {
    Status s = t.WaitCommitted(60);
    EXPECT_TRUE(s.ok() || s.IsUnavailable()) << s.ToString();
    if (!s.ok()) {
      EXPECT_NE(s.message().find("removed by retention"), std::string::npos) << s.ToString();
    }
  }
  auto list = ckpts_[0]->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 2u);
}

// ---- io_uring refused ---------------------------------------------------------------------

class UringRefusedTest : public ::testing::Test {
 protected:
  void SetUp() override { internal::SetUringUnavailableForTesting(EPERM); }
  void TearDown() override { internal::SetUringUnavailableForTesting(0); }
};

TEST_F(UringRefusedTest, SavesAndLoadsThroughTheThreadPoolFallback) {
  TempDir dir;
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.memory_tier = true;
  o.memory_tier_directory = dir.Sub("tier");
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok());
  WholeState state(8);
  const std::vector<GlobalTensor> at_save = state.tensors;
  SaveTicket t = (*ckpt)->Save(1, state.Request());
  ASSERT_TRUE(t.WaitSnapshot().ok());
  state.ScribbleAll();
  ASSERT_TRUE(t.WaitPersisted().ok()) << t.Progress().status.ToString();
  EXPECT_EQ(LoadAndCompare(ckpt->get(), 1, at_save), "");
}

TEST_F(UringRefusedTest, ReshardsAcrossWorldSizesWithACodec) {
  TempDir dir;
  const std::vector<GlobalTensor> tensors = StateTensors(9);
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.codec = SaveCodec::kZstdByteGroup;
  ASSERT_TRUE(AllOk(SaveAllRanks(o, tensors, TpDpLayout(2, 2), 1, 9, /*threads=*/true)));
  o.world_size = 1;
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok());
  EXPECT_EQ(LoadAndCompare(ckpt->get(), 1, tensors), "");
}

// ---- codecs -------------------------------------------------------------------------------

class CodecTest : public ::testing::TestWithParam<SaveCodec> {};

TEST_P(CodecTest, RoundTripsOddSizesAcrossLayoutsAndVerifies) {
  TempDir dir;
  std::vector<GlobalTensor> tensors = StateTensors(12);
  tensors.push_back(MakeTensor("one.bf16", DType::kBF16, {1}, 12));
  tensors.push_back(MakeTensor("three.f16", DType::kF16, {3}, 12));
  tensors.push_back(MakeTensor("odd.i8", DType::kI8, {4097}, 12));
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.codec = GetParam();
  o.chunk_bytes = 4104;  // chunk edges fall mid-row
  ASSERT_TRUE(AllOk(SaveAllRanks(o, tensors, FlatLayout(3), 1, 12, /*threads=*/false)));
  for (const Layout& load : {WholeLayout(), DimLayout(2, 0), BoxFlatLayout(2, 2, 0)}) {
    std::vector<RankState> targets = BuildRanks(tensors, load, /*fill_from_global=*/false);
    for (uint32_t r = 0; r < load.world_size; ++r) {
      CheckpointerOptions lo = o;
      lo.rank = r;
      lo.world_size = load.world_size;
      auto ckpt = Checkpointer::Open(lo);
      ASSERT_TRUE(ckpt.ok());
      LoadRequest req;
      req.tensors = targets[r].shards;
      auto res = (*ckpt)->Load(1, req);
      ASSERT_TRUE(res.ok()) << load.name << " rank " << r << ": " << res.status().ToString();
      for (size_t k = 0; k < targets[r].buffers.size(); ++k) {
        const auto& [ti, region] = targets[r].where[k];
        EXPECT_EQ(CompareRegion(tensors[ti], region, targets[r].buffers[k]), "") << load.name << " rank " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, CodecTest, ::testing::Values(SaveCodec::kZstd, SaveCodec::kZstdByteGroup),
                         [](const ::testing::TestParamInfo<SaveCodec>& info) {
                           return std::string(info.param == SaveCodec::kZstd ? "zstd" : "zstd_bytegroup");
                         });

TEST(CodecTest, CompressibleStateTakesLessSpaceAndSaysSo) {
  TempDir dir;
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.codec = SaveCodec::kZstdByteGroup;
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok());
  std::vector<float> w(1 << 20);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 1000) * 0.001f;  // few distinct values
  SaveRequest req;
  req.tensors.push_back(TensorShard::Whole("w", DType::kF32, {static_cast<int64_t>(w.size())}, w.data()));
  SaveTicket t = (*ckpt)->Save(1, req);
  ASSERT_TRUE(t.WaitPersisted().ok()) << t.Progress().status.ToString();
  const SaveProgress p = t.Progress();
  EXPECT_EQ(p.bytes_total, w.size() * sizeof(float));
  EXPECT_LT(p.bytes_stored * 2, p.bytes_total) << "stored " << p.bytes_stored << " of " << p.bytes_total;
}

}  // namespace async_save_test
}  // namespace lifeline::testing
