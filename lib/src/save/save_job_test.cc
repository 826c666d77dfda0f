// One save in flight, seen through what its tickets report: a tensor is released as soon as its
// own pieces are copied, the pipeline may write a block as soon as it is whole, the first error
// wins and wakes every waiter, and the phases follow the save from copy to commit. The test plays
// the copy engine and the persist pipeline by hand.
#include "lib/src/save/save_job.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

namespace lifeline::internal {
namespace save_job_test {

// Two tensors in an 8 KiB image of 4 KiB blocks: tensor 0 is pieces 0 and 1 (block 0), tensor 1
// is piece 2 (block 1).
std::shared_ptr<SaveJob> TwoTensorJob() {
  auto job = std::make_shared<SaveJob>(7, nullptr, "/ckpt");
  job->block_bytes = 4096;
  job->layout.bytes = 8192;
  job->bytes_total = 8192;
  const uint64_t offsets[] = {0, 2048, 4096}, lengths[] = {2048, 2048, 4096};
  const uint32_t tensors[] = {0, 0, 1};
  for (int i = 0; i < 3; ++i) {
    CopyPiece p;
    p.image_offset = offsets[i];
    p.length = lengths[i];
    p.request_tensor = tensors[i];
    p.target = static_cast<uint64_t>(i);
    job->pieces.push_back(p);
    job->index.chunks.emplace_back();
  }
  job->InitCounters(2);
  return job;
}

TEST(SaveJobTest, ATensorIsReleasedWhenItsOwnPiecesAreCopied) {
  auto job = TwoTensorJob();
  EXPECT_FALSE(job->TensorCopied(0));
  ASSERT_EQ(0u, job->ClaimPiece());
  job->PieceDone(0, 11);
  EXPECT_FALSE(job->TensorCopied(0)) << "half of tensor 0 is still being read";
  ASSERT_EQ(1u, job->ClaimPiece());
  job->PieceDone(1, 22);
  EXPECT_TRUE(job->TensorCopied(0));
  EXPECT_TRUE(job->WaitTensor(0).ok());  // returns at once
  EXPECT_FALSE(job->TensorCopied(1));
  EXPECT_EQ(SavePhase::kCopying, job->Progress().phase);
  EXPECT_EQ(4096u, job->Progress().bytes_copied);
  EXPECT_EQ(StatusCode::kInvalidArgument, job->WaitTensor(2).code()) << "no tensor #2 in the request";

  ASSERT_EQ(2u, job->ClaimPiece());
  EXPECT_FALSE(job->ClaimPiece().has_value());
  job->PieceDone(2, 33);
  EXPECT_TRUE(job->WaitSnapshot().ok());
  EXPECT_EQ(SavePhase::kPersisting, job->Progress().phase);
  EXPECT_EQ(11u, job->index.chunks[0].checksum);  // each piece's checksum lands in its chunk
  EXPECT_EQ(33u, job->index.chunks[2].checksum);
}

TEST(SaveJobTest, ThePipelineMayWriteABlockAsSoonAsItIsWhole) {
  auto job = TwoTensorJob();
  std::atomic<bool> first_block{false}, all{false};
  std::thread pipeline([&] {
    first_block = job->WaitCopiedThrough(4096);
    all = job->WaitCopiedThrough(8192);
  });
  job->ClaimPiece();
  job->PieceDone(2, 0);  // block 1 first: block 0 is not whole yet
  job->ClaimPiece();
  job->PieceDone(0, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(first_block.load()) << "block 0 reported whole with half of it uncopied";
  job->ClaimPiece();
  job->PieceDone(1, 0);
  pipeline.join();
  EXPECT_TRUE(first_block.load());
  EXPECT_TRUE(all.load());
}

TEST(SaveJobTest, TheFirstErrorWinsAndWakesEveryWaiter) {
  auto job = TwoTensorJob();
  std::atomic<bool> pipeline_gave_up{false};
  std::thread pipeline([&] { pipeline_gave_up = !job->WaitCopiedThrough(8192); });
  job->Fail(Status::IOError("/ckpt/step-7/x.data", "No space left on device"));
  job->Fail(Status::Aborted("later", "second error"));
  pipeline.join();
  EXPECT_TRUE(pipeline_gave_up.load());
  EXPECT_TRUE(job->cancelled());
  // The copy threads finish the pieces they claimed (cancelled: no checksum), then the snapshot ends.
  while (auto i = job->ClaimPiece()) job->PieceDone(*i, 0);
  Status s = job->WaitSnapshot();
  EXPECT_EQ(StatusCode::kIOError, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.ToString().find("/ckpt/step-7/x.data"));
  EXPECT_EQ(StatusCode::kIOError, job->WaitPersisted().code());
  EXPECT_TRUE(job->finished());
  EXPECT_EQ(SavePhase::kFailed, job->Progress().phase);
  EXPECT_EQ(0u, job->Progress().bytes_copied) << "cancelled pieces are not counted as copied";
}

TEST(SaveJobTest, ASkippedSaveFinishesAtOnceWithItsReason) {
  auto job = TwoTensorJob();
  job->FinishWithoutCopy(Status::Unavailable("step 7", "skipped: step 6 is still being persisted"),
                         SavePhase::kSkipped);
  EXPECT_TRUE(job->finished());
  EXPECT_TRUE(job->TensorCopied(0));
  EXPECT_TRUE(job->TensorCopied(1));
  EXPECT_TRUE(job->WaitSnapshot().IsUnavailable());
  EXPECT_TRUE(job->WaitPersisted().IsUnavailable());
  EXPECT_EQ(SavePhase::kSkipped, job->Progress().phase);
}

TEST(SaveJobTest, PhasesFollowTheSaveToItsCommit) {
  auto job = TwoTensorJob();
  while (auto i = job->ClaimPiece()) job->PieceDone(*i, 1);
  ASSERT_TRUE(job->WaitSnapshot().ok());
  EXPECT_FALSE(job->finished());
  job->MarkPersisted(12288, /*committed=*/true);
  EXPECT_TRUE(job->WaitPersisted().ok());
  EXPECT_TRUE(job->WaitCommitted(0).ok()) << "this rank's index completed the step: no need to look";
  const SaveProgress p = job->Progress();
  EXPECT_EQ(SavePhase::kCommitted, p.phase);
  EXPECT_EQ(7u, p.step);
  EXPECT_EQ(8192u, p.bytes_copied);
  EXPECT_EQ(12288u, p.bytes_stored);
  EXPECT_LE(p.snapshot_seconds, p.persist_seconds);
}

}  // namespace save_job_test
}  // namespace lifeline::internal
