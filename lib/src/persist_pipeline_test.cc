// The persist pipeline: a save handed to it becomes a committed, loadable step; saves are
// persisted in the order they were started; a failed write is reported naming the file, leaves no
// data file behind to fill the disk, and leaves the step invisible; a save already finished
// (skipped) is not written. Jobs here are streamed (no staging slot), as a save too large for the
// arena is.
#include "lib/src/persist_pipeline.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/checkpoint_layout.h"
#include "lib/src/checkpoint_reader.h"
#include "lib/src/commit.h"
#include "lib/src/saver.h"
#include "lifeline/checkpoint.h"

namespace lifeline {
namespace {

constexpr char kRunId[] = "persist-pipeline-test";

class PersistPipelineTest : public ::testing::Test {
 protected:
  // The root exists durably before any save, as Checkpointer::Open makes it.
  void SetUp() override { ASSERT_TRUE(CreateDirDurably(mem_.get(), "/ckpt").ok()); }

  PersistConfig Config() const {
    PersistConfig c;
    c.writer.root = "/ckpt";
    c.writer.run_hash = RunHash(kRunId);
    c.writer.direct_io = false;
    c.register_buffers = false;
    return c;
  }

  // A streamed save of `values` as tensor "w" at `step`.
  std::shared_ptr<internal::SaveJob> Job(Env* env, uint64_t step, std::vector<float>* values) {
    auto job = std::make_shared<internal::SaveJob>(step, env, "/ckpt");
    SaveRequest req;
    req.tensors.push_back(TensorShard::Whole("w", DType::kF32, {static_cast<int64_t>(values->size())}, values->data()));
    Result<RankSavePlan> plan = PlanRankSave(req, 1 << 20);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    job->plan = std::move(plan).value();
    job->objects.emplace_back("rng", "rng-at-" + std::to_string(step));
    job->write_options.step = step;
    job->write_options.run_id = kRunId;
    job->write_options.run_hash = RunHash(kRunId);
    job->write_options.chunk_bytes = 1024;
    job->write_options.write_block_bytes = 4096;
    job->write_options.direct_io = false;
    job->bytes_total = values->size() * sizeof(float);
    job->InitCounters(1, /*streamed=*/true);
    return job;
  }

  std::vector<float> Load(Env* env, uint64_t step, size_t n) {
    auto reader = CheckpointReader::Open(env, "/ckpt", step);
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    if (!reader.ok()) return {};
    std::vector<float> out(n, -1.0f);
    auto loaded = (*reader)->Load({TensorShard::Whole("w", DType::kF32, {static_cast<int64_t>(n)}, out.data())});
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    return out;
  }

  std::unique_ptr<MemEnv> mem_ = NewMemEnv();
};

TEST_F(PersistPipelineTest, SavesAreCommittedInOrderAndLoadable) {
  std::vector<float> a(3000, 1.5f), b(3000, 2.5f);
  std::vector<uint64_t> order;
  PersistPipeline pipeline(mem_.get(), Config(), nullptr, [&](internal::SaveJob& job) { order.push_back(job.step); });
  auto job1 = Job(mem_.get(), 1, &a), job2 = Job(mem_.get(), 2, &b);
  pipeline.Submit(job1);
  pipeline.Submit(job2);
  ASSERT_TRUE(pipeline.Flush().ok());
  EXPECT_TRUE(job1->WaitPersisted().ok());
  EXPECT_TRUE(job2->WaitCommitted(0).ok());
  EXPECT_EQ(std::vector<uint64_t>({1, 2}), order);
  EXPECT_EQ(SavePhase::kCommitted, job2->Progress().phase);
  EXPECT_FALSE(job2->disk_index.empty()) << "the drainer needs the index as persisted";
  EXPECT_GE(job2->Progress().bytes_stored, 3000u * sizeof(float));
  mem_->SimulateCrash();  // persisted means durable
  EXPECT_EQ(a, Load(mem_.get(), 1, a.size()));
  EXPECT_EQ(b, Load(mem_.get(), 2, b.size()));
}

TEST_F(PersistPipelineTest, AFullDiskFailsTheSaveNamingTheFileAndTakesItsBytesAway) {
  FaultInjectionEnv faulty(mem_.get());
  std::vector<float> a(3000, 1.0f);
  PersistPipeline pipeline(&faulty, Config(), nullptr, nullptr);
  faulty.FailWritesAfterBytes(8192);
  auto job = Job(&faulty, 1, &a);
  pipeline.Submit(job);
  Status flushed = pipeline.Flush();
  EXPECT_EQ(StatusCode::kResourceExhausted, flushed.code()) << flushed.ToString();
  Status s = job->WaitPersisted();
  EXPECT_EQ(StatusCode::kResourceExhausted, s.code()) << s.ToString();
  const std::string data = JoinPath(JoinPath("/ckpt", StepDirName(1)), DataFileName(RunHash(kRunId), 0, 1));
  EXPECT_NE(std::string::npos, s.ToString().find(data)) << s.ToString();
  EXPECT_NE(std::string::npos, s.ToString().find("step 1")) << s.ToString();
  EXPECT_FALSE(mem_->FileExists(data)) << "a failed save left its data file to fill the disk";
  EXPECT_FALSE(CheckpointReader::Open(mem_.get(), "/ckpt", 1).ok());
  EXPECT_TRUE(pipeline.Flush().ok()) << "an error is reported once";

  // The disk has room again: the retry commits.
  faulty.FailWritesAfterBytes(-1);
  auto retry = Job(&faulty, 1, &a);
  pipeline.Submit(retry);
  ASSERT_TRUE(pipeline.Flush().ok());
  EXPECT_EQ(a, Load(mem_.get(), 1, a.size()));
}

TEST_F(PersistPipelineTest, ASaveFinishedBeforeItsTurnIsNotWritten) {
  std::vector<float> a(100, 1.0f);
  PersistPipeline pipeline(mem_.get(), Config(), nullptr, nullptr);
  auto job = Job(mem_.get(), 3, &a);
  job->FinishWithoutCopy(Status::Unavailable("step 3", "skipped"), SavePhase::kSkipped);
  pipeline.Submit(job);
  EXPECT_TRUE(pipeline.Flush().ok()) << "a skipped save is not an error";
  EXPECT_FALSE(mem_->FileExists(JoinPath("/ckpt", StepDirName(3))));
}

}  // namespace
}  // namespace lifeline
