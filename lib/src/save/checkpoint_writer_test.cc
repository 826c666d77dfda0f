// The checkpoint writer: a step written by every rank through it commits and loads back; one
// rank's index alone does not commit; a step already committed refuses a new writer; pieces that
// overlap are marked invalid, not committed; a failed write takes back its unpublished data file
// but never a published one, and no index promises a data file that was removed; an index
// already encoded is republished byte for byte.
#include "lib/src/save/checkpoint_writer.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace checkpoint_writer_test {

constexpr uint64_t kStep = 3;

class CheckpointWriterTest : public ::testing::Test {
 protected:
  StepTarget Target(uint32_t rank, uint32_t world, const std::string& root = "/ckpt") const {
    return StepTarget{{root, RunHash("writer-test"), rank, world}, kStep};
  }

  RankWriteOptions Options(uint32_t rank, uint32_t world) const {
    RankWriteOptions o = test::SmallRankWriteOptions("writer-test", kStep);
    o.rank = rank;
    o.world_size = world;
    return o;
  }

  // Rank `rank` of `world` holds elements [begin, end) of the 64 floats of "w".
  RankSavePlan Plan(int64_t begin, int64_t end) {
    SaveRequest r;
    r.tensors.push_back(TensorShard::Flat("w", DType::kF32, {64}, begin, end, w_.data() + begin));
    Result<RankSavePlan> plan = PlanRankSave(r, 1 << 20);
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    return plan.ok() ? *plan : RankSavePlan{};
  }

  // Writes rank `rank`'s piece [begin, end) and publishes it; returns whether it committed.
  Result<bool> WriteRank(uint32_t rank, uint32_t world, int64_t begin, int64_t end) {
    LL_ASSIGN_OR_RETURN(CheckpointWriter writer, CheckpointWriter::Begin(env_.get(), Target(rank, world)));
    LL_ASSIGN_OR_RETURN(format::CheckpointIndex index,
                        writer.WriteData(Plan(begin, end), {}, "{}", Options(rank, world)));
    LL_ASSIGN_OR_RETURN(PublishedIndex published, writer.Publish(index, CommitOptions{}));
    EXPECT_TRUE(env_->FileExists(writer.index_path()));
    return published.committed;
  }

  std::vector<float> Load() {
    std::vector<float> out(64, -1.0f);
    auto r = CheckpointReader::Open(env_.get(), "/ckpt", kStep);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return {};
    Status loaded = (*r)->Load({TensorShard::Whole("w", DType::kF32, {64}, out.data())}).status();
    EXPECT_TRUE(loaded.ok()) << loaded.ToString();
    return out;
  }

  void SetUp() override {
    for (int i = 0; i < 64; ++i) w_.push_back(static_cast<float>(i) * 0.5f);
  }

  std::unique_ptr<MemEnv> env_ = NewMemEnv();
  std::vector<float> w_;
};

TEST_F(CheckpointWriterTest, EveryRanksPieceCommitsTheStepOnceAndItLoadsBack) {
  Result<bool> first = WriteRank(0, 2, 0, 32);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(*first) << "one rank of two cannot commit";
  EXPECT_FALSE(CheckpointReader::Open(env_.get(), "/ckpt", kStep).ok());
  Result<bool> last = WriteRank(1, 2, 32, 64);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_TRUE(*last) << "the last rank's index completes the set";
  EXPECT_TRUE(env_->FileExists(JoinPath("/ckpt/" + StepDirName(kStep), ManifestFileName(RunHash("writer-test"), 2))));
  EXPECT_EQ(w_, Load());

  Result<CheckpointWriter> again = CheckpointWriter::Begin(env_.get(), Target(0, 2));
  EXPECT_TRUE(again.status().IsAlreadyExists()) << again.status().ToString();
}

TEST_F(CheckpointWriterTest, OverlappingPiecesAreMarkedInvalidNotCommitted) {
  ASSERT_TRUE(WriteRank(0, 2, 0, 40).ok());
  Result<bool> last = WriteRank(1, 2, 32, 64);
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(StatusCode::kFailedPrecondition, last.status().code()) << last.status().ToString();
  EXPECT_NE(std::string::npos, last.status().ToString().find("step 3")) << last.status().ToString();
  EXPECT_TRUE(env_->FileExists(JoinPath("/ckpt/" + StepDirName(kStep), InvalidMarkerFileName(RunHash("writer-test"), 2))));
  EXPECT_FALSE(CheckpointReader::Open(env_.get(), "/ckpt", kStep).ok());
}

// A data file removed between its write and its index (a gc of partial steps forced on a live
// job) is never promised by an index: the publish fails naming the file, and nothing is visible.
TEST_F(CheckpointWriterTest, ADataFileRemovedBeforeItsIndexIsPublishedFailsThePublish) {
  ASSERT_TRUE(WriteRank(0, 2, 0, 32).ok());
  Result<CheckpointWriter> writer = CheckpointWriter::Begin(env_.get(), Target(1, 2));
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  Result<format::CheckpointIndex> index = writer->WriteData(Plan(32, 64), {}, "{}", Options(1, 2));
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  ASSERT_TRUE(env_->RemoveFile(writer->data_path()).ok());
  Result<PublishedIndex> published = writer->Publish(*index, CommitOptions{});
  ASSERT_FALSE(published.ok());
  EXPECT_NE(std::string::npos, published.status().ToString().find(writer->data_path())) << published.status().ToString();
  EXPECT_NE(std::string::npos, published.status().ToString().find("was removed before its rank index was published"));
  EXPECT_FALSE(env_->FileExists(writer->index_path()));
  EXPECT_FALSE(CheckpointReader::Open(env_.get(), "/ckpt", kStep).ok());
}

TEST_F(CheckpointWriterTest, AFailedWriteTakesBackItsUnpublishedDataFileOnly) {
  Result<CheckpointWriter> writer = CheckpointWriter::Begin(env_.get(), Target(0, 2));
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  SaveRequest r;
  r.tensors.push_back(TensorShard::Flat("w", DType::kF32, {64}, 0, 32, nullptr));
  Result<RankSavePlan> plan = PlanRankSave(r, 1 << 20, /*require_data=*/false);
  ASSERT_TRUE(plan.ok());
  Result<format::CheckpointIndex> index =
      writer->WriteData(*plan, {}, "", Options(0, 2), [](const PlannedFragment&, uint64_t, uint64_t, uint8_t*) {
        return Status::IOError("source.h5", "read failed");
      });
  ASSERT_FALSE(index.ok());
  EXPECT_NE(std::string::npos, index.status().ToString().find("source.h5")) << index.status().ToString();
  ASSERT_TRUE(env_->FileExists(writer->data_path())) << "the partial data file is left to the caller";
  writer->DiscardUnpublished();
  EXPECT_FALSE(env_->FileExists(writer->data_path()));

  // Once published, the data file belongs to the commit protocol: cleaning up keeps it.
  Result<CheckpointWriter> retry = CheckpointWriter::Begin(env_.get(), Target(0, 2));
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  Result<format::CheckpointIndex> written = retry->WriteData(Plan(0, 32), {}, "", Options(0, 2));
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  ASSERT_TRUE(retry->Publish(*written, CommitOptions{}).ok());
  retry->DiscardUnpublished();
  EXPECT_TRUE(env_->FileExists(retry->data_path()));
}

TEST_F(CheckpointWriterTest, ARetryOfTheSameAttemptWithdrawsItsEarlierIndex) {
  ASSERT_TRUE(WriteRank(0, 2, 0, 32).ok());
  Result<CheckpointWriter> retry = CheckpointWriter::Begin(env_.get(), Target(0, 2));
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  EXPECT_FALSE(env_->FileExists(retry->index_path())) << "a retried save must not look finished";
}

TEST_F(CheckpointWriterTest, AnEncodedIndexIsRepublishedUnchangedUnderAnotherRoot) {
  Result<CheckpointWriter> writer = CheckpointWriter::Begin(env_.get(), Target(0, 1));
  ASSERT_TRUE(writer.ok());
  Result<format::CheckpointIndex> index = writer->WriteData(Plan(0, 64), {}, "", Options(0, 1));
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  Result<PublishedIndex> published = writer->Publish(*index, CommitOptions{});
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  EXPECT_TRUE(published->committed);

  // What the drainer does: the same data file bytes and the same index bytes, in a second root.
  Result<CheckpointWriter> copy = CheckpointWriter::Begin(env_.get(), Target(0, 1, "/drain"));
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ("/drain/" + StepDirName(kStep), copy->step_dir());
  Result<std::string> data = ReadFileToString(env_.get(), writer->data_path(), 1 << 20);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ASSERT_TRUE(WriteFileAtomically(env_.get(), copy->data_path(), *data).ok());
  Result<bool> committed = copy->PublishEncoded(published->encoded_index, CommitOptions{true, 1});
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  EXPECT_TRUE(*committed);
  Result<std::string> republished = ReadFileToString(env_.get(), copy->index_path(), 1 << 20);
  ASSERT_TRUE(republished.ok());
  EXPECT_EQ(published->encoded_index, *republished);
}

}  // namespace checkpoint_writer_test
}  // namespace lifeline
