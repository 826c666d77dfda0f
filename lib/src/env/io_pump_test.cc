// IoPump over the fault-injecting Env: every buffer comes back, the first failure is kept and
// stops submission, a broken queue is not waited on.
#include "lifeline/internal/io_pump.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lifeline/env.h"

namespace lifeline {
namespace io_pump_test {

constexpr size_t kBlock = 1024;

class IoPumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(mem_->CreateDir("/d").ok());
    Result<std::unique_ptr<WritableFile>> f = env_.NewWritableFile("/d/data", FileOptions{});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    file_ = std::move(f).value();
    Result<std::unique_ptr<IoQueue>> q = env_.NewIoQueue(IoQueueOptions{/*depth=*/3, /*threads=*/2});
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    queue_ = std::move(q).value();
  }

  // Writes `blocks` blocks, block i filled with the letter 'a' + i % 26, from `buffers` free
  // buffers, as a save streams: a buffer is reused only once the pump has handed it back.
  // Returns the pump's final status; counts what was submitted and what came back.
  Status WriteBlocks(int blocks, size_t buffers, int* submitted, int* completed) {
    std::vector<std::string> memory(buffers, std::string(kBlock, '\0'));
    std::vector<size_t> free;
    for (size_t i = 0; i < buffers; ++i) free.push_back(i);
    IoPump pump(queue_.get(), [&](const IoCompletion& c) {
      ++*completed;
      free.push_back(static_cast<size_t>(c.tag));
    });
    for (int i = 0; i < blocks && pump.status().ok(); ++i) {
      while (free.empty() && pump.WaitSome().ok()) {
      }
      if (!pump.status().ok()) break;
      EXPECT_LE(queue_->in_flight(), queue_->depth());
      const size_t b = free.back();
      free.pop_back();
      memory[b].assign(kBlock, static_cast<char>('a' + i % 26));
      IoRequest r;
      r.writer = file_.get();
      r.offset = static_cast<uint64_t>(i) * kBlock;
      r.buffer = memory[b].data();
      r.length = kBlock;
      r.tag = b;
      if (pump.Submit(r).ok()) {
        ++*submitted;
      } else {
        free.push_back(b);  // refused: never handed to the queue
      }
    }
    Status s = pump.Drain();
    EXPECT_EQ(0u, pump.pending());
    EXPECT_EQ(buffers, free.size()) << "a buffer was not handed back before it could be freed";
    return s;
  }

  std::unique_ptr<MemEnv> mem_ = NewMemEnv();
  FaultInjectionEnv env_{mem_.get()};
  std::unique_ptr<WritableFile> file_;
  std::unique_ptr<IoQueue> queue_;
};

TEST_F(IoPumpTest, WritesEveryBlockInPlaceKeepingTheQueueWithinItsDepth) {
  int submitted = 0, completed = 0;
  // More buffers than the queue's depth: Submit itself must wait for room.
  ASSERT_TRUE(WriteBlocks(40, 5, &submitted, &completed).ok());
  EXPECT_EQ(40, submitted);
  EXPECT_EQ(40, completed);
  Result<std::string> bytes = ReadFileToString(&env_, "/d/data", 1 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  ASSERT_EQ(40 * kBlock, bytes->size());
  for (int i = 0; i < 40; ++i)
    EXPECT_EQ(std::string(kBlock, static_cast<char>('a' + i % 26)), bytes->substr(i * kBlock, kBlock)) << "block " << i;
}

TEST_F(IoPumpTest, AFailedWriteStopsSubmissionNamesTheFileAndStillReturnsEveryBuffer) {
  env_.FailWritesAfterBytes(5 * kBlock);
  int submitted = 0, completed = 0;
  Status s = WriteBlocks(40, 4, &submitted, &completed);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(StatusCode::kResourceExhausted, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("/d/data")) << s.ToString();
  EXPECT_EQ(submitted, completed);  // every transfer started was waited for
  EXPECT_LT(submitted, 40);         // and nothing more was started once one had failed
}

TEST_F(IoPumpTest, TheCallersFailureStopsSubmissionAndTheFirstFailureWins) {
  std::string block(kBlock, 'x');
  int completed = 0;
  IoPump pump(queue_.get(), [&](const IoCompletion&) { ++completed; });
  IoRequest r;
  r.writer = file_.get();
  r.buffer = block.data();
  r.length = kBlock;
  ASSERT_TRUE(pump.Submit(r).ok());
  pump.Fail(Status::Corruption("/d/data", "checksum mismatch at offset 0"));
  pump.Fail(Status::Aborted("/d/data", "a later failure"));
  r.offset = kBlock;
  Status refused = pump.Submit(r);
  EXPECT_EQ(StatusCode::kCorruption, refused.code()) << refused.ToString();
  EXPECT_EQ(StatusCode::kCorruption, pump.Drain().code());
  EXPECT_EQ(1, completed);
  EXPECT_EQ(kBlock, env_.GetFileSize("/d/data").value_or(0));  // the refused write never ran
}

// A queue that accepts requests and then fails as a whole, as an io_uring whose ring broke.
class BrokenQueue final : public IoQueue {
 public:
  Status Submit(const IoRequest&) override {
    ++in_flight_;
    return Status::OK();
  }
  Status Reap(size_t, std::vector<IoCompletion>*) override {
    ++reaps_;
    return Status::IOError("io_uring_enter", "ring broken");
  }
  size_t in_flight() const override { return in_flight_; }
  unsigned depth() const override { return 2; }
  const char* engine() const override { return "broken"; }
  int reaps() const { return reaps_; }

 private:
  size_t in_flight_ = 0;
  int reaps_ = 0;
};

TEST(IoPumpBrokenQueue, IsNotWaitedOnForeverAndSaysItMustBeDiscarded) {
  BrokenQueue queue;
  char byte = 0;
  IoRequest r;
  r.buffer = &byte;
  r.length = 1;
  {
    IoPump pump(&queue);
    ASSERT_TRUE(pump.Submit(r).ok());
    ASSERT_TRUE(pump.Submit(r).ok());
    Status full = pump.Submit(r);  // waits for room: the reap fails
    EXPECT_EQ(StatusCode::kIOError, full.code()) << full.ToString();
    EXPECT_TRUE(pump.broken());
    EXPECT_EQ(0u, pump.pending());
    EXPECT_EQ(StatusCode::kIOError, pump.Drain().code());
  }  // the destructor's drain returns too
  EXPECT_EQ(1, queue.reaps());
}

}  // namespace io_pump_test
}  // namespace lifeline
