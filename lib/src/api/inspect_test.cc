// lifeline/inspect.h: what `lifeline inspect`, `ls` and `gc` show and do, run in memory.
#include "lifeline/inspect.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace inspect_test {

constexpr const char* kRunId = "inspect-test";

RetentionOptions Keep(uint32_t keep_last, bool verify) {
  RetentionOptions o;
  o.keep_last = keep_last;
  o.verify = verify;
  return o;
}

class InspectTest : public ::testing::Test {
 protected:
  // Saves `steps` as rank `rank` of `world`; with world > 1 and one rank saving, the steps stay partial.
  void SaveSteps(const std::vector<uint64_t>& steps, SaveCodec codec = SaveCodec::kNone, uint32_t rank = 0,
                 uint32_t world = 1, const std::string& run_id = kRunId) {
    CheckpointerOptions o;
    o.directory = "/ckpt";
    o.env = env_.get();
    o.run_id = run_id;
    o.rank = rank;
    o.world_size = world;
    o.chunk_bytes = 1024;
    o.write_block_bytes = 4096;
    o.staging_budget_bytes = 1 << 20;
    o.direct_io = false;
    o.codec = codec;
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    for (uint64_t step : steps) {
      SaveRequest r;
      r.tensors.push_back(TensorShard::Whole("w", DType::kF32, {64, 64}, w_.data()));
      r.tensors.push_back(TensorShard::Whole("n", DType::kI64, {8}, n_.data()));
      r.objects.emplace_back("rng", std::string(32, 'r'));
      r.metadata_json = R"({"model":"m"})";
      ASSERT_TRUE((*c)->Save(step, r).WaitPersisted().ok());
    }
  }
  // Flips a byte inside the first chunk of step `step`'s data file (rank 0 of 1).
  void DamageData(uint64_t step) {
    auto all = ScanCheckpointDirectory("/ckpt", env_.get());
    ASSERT_TRUE(all.ok());
    for (const CheckpointInfo& info : *all) {
      if (info.step != step) continue;
      const std::string data = JoinPath(info.directory, DataFileName(RunHash(kRunId), 0, 1));
      auto bytes = ReadFileToString(env_.get(), data, 1 << 20);
      ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
      (*bytes)[4096 + 100] ^= 0x40;
      ASSERT_TRUE(WriteFileAtomically(env_.get(), data, *bytes).ok());
    }
  }
  std::vector<uint64_t> Steps() {
    auto all = ScanCheckpointDirectory("/ckpt", env_.get());
    EXPECT_TRUE(all.ok());
    std::vector<uint64_t> out;
    for (const CheckpointInfo& c : *all) out.push_back(c.step);
    return out;
  }

  std::unique_ptr<MemEnv> env_ = NewMemEnv();
  std::vector<float> w_ = std::vector<float>(64 * 64, 0.25f);  // compresses well
  std::vector<int64_t> n_ = std::vector<int64_t>(8, 7);
};

TEST_F(InspectTest, DescribeShowsTensorsFragmentsObjectsFilesAndMetadata) {
  SaveSteps({4, 9}, SaveCodec::kZstd);
  auto d = DescribeCheckpoint("/ckpt", std::nullopt, env_.get());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->step, 9u);  // the newest complete one
  EXPECT_EQ(d->world_size, 1u);
  EXPECT_EQ(d->chunk_bytes, 1024u);
  EXPECT_EQ(d->metadata_json, R"({"model":"m"})");
  EXPECT_NE(d->run_id.find(kRunId), std::string::npos) << d->run_id;
  ASSERT_EQ(d->tensors.size(), 2u);
  const TensorDescription* w = nullptr;
  for (const TensorDescription& t : d->tensors)
    if (t.name == "w") w = &t;
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::kF32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(w->fragments, 1u);
  EXPECT_EQ(w->bytes, 64u * 64 * 4);
  EXPECT_LT(w->stored_bytes, w->bytes);  // zstd over constant floats
  EXPECT_EQ(d->tensor_bytes(), 64u * 64 * 4 + 8 * 8);
  EXPECT_LT(d->stored_bytes(), d->tensor_bytes());
  ASSERT_EQ(d->fragments.size(), 2u);
  for (const FragmentDescription& f : d->fragments) {
    EXPECT_EQ(f.codec, "zstd");
    EXPECT_EQ(f.file, DataFileName(RunHash(kRunId), 0, 1));
    if (f.tensor == "w") {
      EXPECT_EQ(f.chunks, 16u);  // 16 KiB in 1 KiB chunks
      EXPECT_EQ(f.region_offsets, (std::vector<int64_t>{0, 0}));
      EXPECT_EQ(f.region_shape, (std::vector<int64_t>{64, 64}));
      EXPECT_EQ(f.flat_end - f.flat_begin, 64 * 64);
      EXPECT_EQ(f.stored_length, w->stored_bytes);
    }
  }
  ASSERT_EQ(d->objects.size(), 1u);
  EXPECT_EQ(d->objects[0].name, "rng");
  EXPECT_EQ(d->objects[0].length, 32u);
  ASSERT_EQ(d->files.size(), 1u);
  EXPECT_GT(d->files[0].size, d->stored_bytes());

  auto older = DescribeCheckpoint("/ckpt", 4, env_.get());
  ASSERT_TRUE(older.ok()) << older.status().ToString();
  EXPECT_EQ(older->step, 4u);
  EXPECT_EQ(DescribeCheckpoint("/ckpt", 5, env_.get()).status().code(), StatusCode::kNotFound);
}

TEST_F(InspectTest, ListNamesCompleteAndPartialStepsNewestFirst) {
  SaveSteps({2});
  SaveSteps({6}, SaveCodec::kNone, /*rank=*/0, /*world=*/2);  // rank 1 never saves
  auto listing = ListCheckpoints("/ckpt", env_.get());
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  EXPECT_TRUE(listing->memory_tier.empty());
  ASSERT_EQ(listing->checkpoints.size(), 2u);
  EXPECT_EQ(listing->checkpoints[0].info.step, 6u);
  EXPECT_EQ(CheckpointStateOf(listing->checkpoints[0].info), CheckpointState::kPartial);
  EXPECT_EQ(listing->checkpoints[0].info.ranks_present, 1u);
  EXPECT_EQ(listing->checkpoints[1].info.step, 2u);
  EXPECT_EQ(CheckpointStateOf(listing->checkpoints[1].info), CheckpointState::kComplete);
  EXPECT_FALSE(listing->checkpoints[1].in_memory_tier);
  EXPECT_STREQ(CheckpointStateName(CheckpointState::kDamaged), "damaged");
  EXPECT_FALSE(ListCheckpoints("/no-such-dir", env_.get()).ok());
}

TEST_F(InspectTest, RetentionCountsOnlyStepsThatVerify) {
  SaveSteps({3, 5, 7});
  DamageData(7);
  // Verified: 7 is damaged and does not count, so keep_last 1 keeps 5 and removes 3.
  auto plan = PlanRetention("/ckpt", Keep(1, /*verify=*/true), env_.get());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[0].info.step, 7u);
  EXPECT_EQ(CheckpointStateOf((*plan)[0].info), CheckpointState::kDamaged) << (*plan)[0].info.problem;
  EXPECT_EQ((*plan)[1].info.step, 5u);
  EXPECT_FALSE((*plan)[1].remove);
  EXPECT_EQ((*plan)[2].info.step, 3u);
  EXPECT_TRUE((*plan)[2].remove);
  // Metadata only: 7 looks loadable, so it is the one kept.
  auto quick = PlanRetention("/ckpt", Keep(1, /*verify=*/false), env_.get());
  ASSERT_TRUE(quick.ok()) << quick.status().ToString();
  EXPECT_FALSE((*quick)[0].remove);
  EXPECT_TRUE((*quick)[1].remove);
  EXPECT_TRUE((*quick)[2].remove);
  EXPECT_EQ(Steps(), (std::vector<uint64_t>{7, 5, 3}));  // planning touches nothing

  ASSERT_TRUE(ApplyRetention("/ckpt", Keep(1, /*verify=*/true), env_.get()).ok());
  auto after = Steps();
  EXPECT_EQ(std::count(after.begin(), after.end(), 5u), 1);
  EXPECT_EQ(std::count(after.begin(), after.end(), 3u), 0);
}

TEST_F(InspectTest, RetentionOfASavingLaunchRemovesPartialStepsOfEndedLaunchesOnly) {
  SaveSteps({2});
  SaveSteps({6}, SaveCodec::kNone, /*rank=*/0, /*world=*/2, "ended-launch");  // can never complete
  SaveSteps({8}, SaveCodec::kNone, /*rank=*/0, /*world=*/2);  // this launch's save, still in progress
  auto kept = PlanRetention("/ckpt", Keep(1, /*verify=*/false), env_.get());
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  ASSERT_EQ(kept->size(), 3u);
  for (const RetentionDecision& d : *kept) EXPECT_FALSE(d.remove) << d.info.step;

  RetentionOptions saving;
  saving.keep_last = 1;
  saving.verify = false;
  saving.saving_run_id = kRunId;
  auto plan = PlanRetention("/ckpt", saving, env_.get());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_EQ((*plan)[0].info.step, 8u);
  EXPECT_FALSE((*plan)[0].remove);
  EXPECT_EQ((*plan)[1].info.step, 6u);
  EXPECT_TRUE((*plan)[1].remove);
  EXPECT_FALSE((*plan)[2].remove);

  ASSERT_TRUE(ApplyRetention("/ckpt", saving, env_.get()).ok());
  EXPECT_EQ(Steps(), (std::vector<uint64_t>{8, 2}));
}

// What lifeline-agent checks before it launches: a directory saved into by another job is refused,
// naming that launch; one saved into by the agent's own job (another node's ranks) is not.
TEST(CheckNoOtherJobSavingTest, RefusesAnotherJobOnlyWhileItHoldsTheLock) {
  test::TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  EXPECT_TRUE(CheckNoOtherJobSaving(dir.path(), "job-b").ok());  // nobody saving
  {
    auto lock = Env::Default()->LockFile(dir.Sub("lifeline.lock"));
    ASSERT_TRUE(lock.ok()) << lock.status().ToString();
    ASSERT_TRUE((*lock)->SetHolder("run_id=launch-a\njob=job-a\nhost=elsewhere\npid=1\n").ok());
    EXPECT_TRUE(CheckNoOtherJobSaving(dir.path(), "job-a").ok());
    Status other = CheckNoOtherJobSaving(dir.path(), "job-b");
    EXPECT_EQ(other.code(), StatusCode::kFailedPrecondition) << other.ToString();
    EXPECT_NE(other.ToString().find(dir.path()), std::string::npos) << other.ToString();
    EXPECT_NE(other.ToString().find("launch 'launch-a'"), std::string::npos) << other.ToString();
  }
  EXPECT_TRUE(CheckNoOtherJobSaving(dir.path(), "job-b").ok());  // the lock went with its holder
}

}  // namespace inspect_test
}  // namespace lifeline
