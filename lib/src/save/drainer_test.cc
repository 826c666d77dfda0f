// The drainer (multi-level checkpointing): a committed step is copied to the second directory and
// committed there, loadable and durable; a step the other ranks never commit is skipped, not
// copied; the second directory keeps its own number of checkpoints; a data file that disagrees
// with its index is refused.
#include "lib/src/save/drainer.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lifeline/checkpoint.h"

namespace lifeline {
namespace drainer_test {

constexpr char kRunId[] = "drainer-test";

class DrainerTest : public ::testing::Test {
 protected:
  // Saves `values` as tensor "w" at `step` into /src as rank `rank` of `world`.
  void Save(uint64_t step, std::vector<float> values, uint32_t rank = 0, uint32_t world = 1) {
    CheckpointerOptions o;
    o.directory = "/src";
    o.env = env_.get();
    o.rank = rank;
    o.world_size = world;
    o.run_id = kRunId;
    o.chunk_bytes = 4096;
    o.write_block_bytes = 4096;
    o.staging_budget_bytes = 1 << 20;
    o.direct_io = false;
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    values_ = std::move(values);
    SaveRequest req;
    const int64_t n = static_cast<int64_t>(values_.size());
    req.tensors.push_back(TensorShard::Flat("w", DType::kF32, {n * world}, n * rank, n * (rank + 1), values_.data()));
    Status s = (*ckpt)->Save(step, req).WaitPersisted();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // This rank's index of `step` in /src, as the persist pipeline hands it to the drainer.
  std::string IndexOf(uint64_t step, uint32_t rank = 0, uint32_t world = 1) {
    const std::string path = JoinPath(JoinPath("/src", StepDirName(step)), IndexFileName(RunHash(kRunId), rank, world));
    Result<std::string> index = ReadFileToString(env_.get(), path, 1 << 20);
    EXPECT_TRUE(index.ok()) << index.status().ToString();
    return index.value_or("");
  }

  DrainConfig Config(uint32_t world = 1) const {
    DrainConfig c;
    c.source_root = "/src";
    c.writer.root = "/dst";
    c.writer.run_hash = RunHash(kRunId);
    c.writer.world_size = world;
    c.writer.direct_io = false;
    c.buffer_bytes = 4096;  // several reads per data file
    c.commit_timeout_seconds = 0.2;
    return c;
  }

  std::vector<float> LoadFromTarget(uint64_t step) {
    auto reader = CheckpointReader::Open(env_.get(), "/dst", step);
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    if (!reader.ok()) return {};
    EXPECT_TRUE((*reader)->Verify(nullptr).ok());
    std::vector<float> out(values_.size(), -1.0f);
    auto loaded = (*reader)->Load({TensorShard::Whole("w", DType::kF32, {static_cast<int64_t>(out.size())}, out.data())});
    EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
    return out;
  }

  std::unique_ptr<MemEnv> env_ = NewMemEnv();
  std::vector<float> values_;
};

TEST_F(DrainerTest, ACommittedStepIsCopiedCommittedAndDurableInTheSecondDirectory) {
  std::vector<float> v(5000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + 0.25f;
  Save(3, v);
  {
    Drainer drainer(env_.get(), Config());
    drainer.Enqueue(3, IndexOf(3));
    Status s = drainer.Flush();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(1u, drainer.drained());
  }
  env_->SimulateCrash();  // a drained step is durable there
  EXPECT_EQ(v, LoadFromTarget(3));
}

TEST_F(DrainerTest, DrainingTheSameStepTwiceIsHarmless) {
  Save(1, std::vector<float>(100, 1.0f));
  Drainer drainer(env_.get(), Config());
  drainer.Enqueue(1, IndexOf(1));
  drainer.Enqueue(1, IndexOf(1));  // a retried save
  EXPECT_TRUE(drainer.Flush().ok());
  EXPECT_EQ(std::vector<float>(100, 1.0f), LoadFromTarget(1));
}

TEST_F(DrainerTest, AStepTheOtherRanksNeverCommitIsSkippedNotCopied) {
  Save(5, std::vector<float>(100, 2.0f), /*rank=*/0, /*world=*/2);  // rank 1 never saves
  Drainer drainer(env_.get(), Config(/*world=*/2));
  drainer.Enqueue(5, IndexOf(5, 0, 2));
  // A skip is deliberate, not an error to report to the next save.
  Status s = drainer.Flush();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(0u, drainer.drained());
  EXPECT_FALSE(env_->FileExists(JoinPath("/dst", StepDirName(5))));
}

TEST_F(DrainerTest, TheSecondDirectoryKeepsItsOwnNumberOfCheckpoints) {
  DrainConfig c = Config();
  c.writer.keep_last = 1;
  Drainer drainer(env_.get(), c);
  for (uint64_t step = 1; step <= 3; ++step) {
    Save(step, std::vector<float>(64, static_cast<float>(step)));
    drainer.Enqueue(step, IndexOf(step));
    ASSERT_TRUE(drainer.Flush().ok());
  }
  auto steps = ScanCheckpoints(env_.get(), "/dst");
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  ASSERT_EQ(1u, steps->size());
  EXPECT_EQ(3u, (*steps)[0].step);
  EXPECT_EQ(std::vector<float>(64, 3.0f), LoadFromTarget(3));
  // The first directory keeps everything (its own retention is keep_last 0).
  EXPECT_EQ(3u, ScanCheckpoints(env_.get(), "/src").value_or(std::vector<CheckpointInfo>{}).size());
}

TEST_F(DrainerTest, ADataFileThatDisagreesWithItsIndexIsRefusedNamingIt) {
  Save(2, std::vector<float>(100, 3.0f));
  const std::string data = JoinPath(JoinPath("/src", StepDirName(2)), DataFileName(RunHash(kRunId), 0, 1));
  ASSERT_TRUE(WriteFileAtomically(env_.get(), data, std::string(4096, '\0')).ok());  // cut short
  Drainer drainer(env_.get(), Config());
  drainer.Enqueue(2, IndexOf(2));
  Status s = drainer.Flush();
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(std::string::npos, s.ToString().find(data)) << s.ToString();
  EXPECT_EQ(0u, drainer.drained());
  EXPECT_FALSE(CheckpointReader::Open(env_.get(), "/dst", 2).ok()) << "a refused copy must not commit";
}

}  // namespace drainer_test
}  // namespace lifeline
