// One suite for every IoQueue engine: io_uring (skipped where the kernel forbids it) and the
// thread pool.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/env/aligned_buffer.h"
#include "lib/src/env/io_queue_internal.h"
#include "lifeline/env.h"
#include "lifeline/log.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace internal {
// Test hooks of io_queue_uring.cc. SetFixedBufferPieceBytesForTesting: registrations made while it
// is non-zero cut regions into pieces of that many bytes instead of 1 GiB, so the splitting is
// exercised without gigabytes of memory. FixedBufferSqesForTesting: how many SQEs an io_uring
// queue has prepared with a fixed-buffer opcode (0 for other engines).
void SetFixedBufferPieceBytesForTesting(size_t bytes);
uint64_t FixedBufferSqesForTesting(const IoQueue& queue);
}  // namespace internal

namespace io_queue_test {

using test::TempDir;

// Restores an environment variable when the test ends.
class ScopedEnvVar {
 public:
  ScopedEnvVar(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    ::setenv(name, value, 1);
  }
  ~ScopedEnvVar() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// Page-aligned memory from mmap: anonymous, or a file in /dev/shm mapped MAP_SHARED as the
// memory tier's staging arena is. Null data() when the mapping could not be made.
class Mapping {
 public:
  static Mapping Anonymous(size_t size) {
    Mapping m;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) m.Adopt(p, size);
    return m;
  }
  static Mapping SharedMemory(size_t size) {
    Mapping m;
    char name[] = "/dev/shm/lifeline-ioq-XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd < 0) return m;
    m.shm_path_ = name;
    if (::ftruncate(fd, static_cast<off_t>(size)) == 0) {
      void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) m.Adopt(p, size);
    }
    ::close(fd);
    return m;
  }
  Mapping(Mapping&& other) noexcept { *this = std::move(other); }
  Mapping& operator=(Mapping&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(shm_path_, other.shm_path_);
    return *this;
  }
  ~Mapping() {
    if (data_ != nullptr) ::munmap(data_, size_);
    if (!shm_path_.empty()) ::unlink(shm_path_.c_str());
  }
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Mapping() = default;
  void Adopt(void* p, size_t size) {
    data_ = static_cast<char*>(p);
    size_ = size;
  }
  char* data_ = nullptr;
  size_t size_ = 0;
  std::string shm_path_;
};

// Cuts registered regions into small pieces for the duration of a test.
class ScopedFixedBufferPieceBytes {
 public:
  explicit ScopedFixedBufferPieceBytes(size_t bytes) { internal::SetFixedBufferPieceBytesForTesting(bytes); }
  ~ScopedFixedBufferPieceBytes() { internal::SetFixedBufferPieceBytesForTesting(0); }
};

class IoQueueTest : public ::testing::TestWithParam<std::string> {
 protected:
  Result<std::unique_ptr<IoQueue>> MakeQueue(unsigned depth, unsigned threads = 4) {
    IoQueueOptions options;
    options.depth = depth;
    options.threads = threads;
    if (GetParam() == "io_uring") return internal::NewUringIoQueue(options);
    return NewThreadPoolIoQueue(options);
  }

  std::unique_ptr<IoQueue> QueueOrSkip(unsigned depth) {
    Result<std::unique_ptr<IoQueue>> q = MakeQueue(depth);
    if (!q.ok()) {
      EXPECT_TRUE(q.status().IsNotSupported()) << q.status().ToString();
      return nullptr;
    }
    EXPECT_EQ(GetParam(), q.value()->engine());
    EXPECT_EQ(depth, q.value()->depth());
    return std::move(q).value();
  }

  Env* env_ = Env::Default();
  TempDir dir_;
};

// A write of `length` bytes from `buffer` to `file` at `offset` (or a read of them into `buffer`),
// its completion tagged `tag`; no registered buffer. IoRequest's fields in declaration order, which
// the public ABI keeps.
IoRequest WriteAt(WritableFile* file, uint64_t offset, void* buffer, size_t length, uint64_t tag) {
  return IoRequest{IoRequest::Kind::kWrite, file, nullptr, offset, buffer, length, tag};
}

IoRequest ReadAt(RandomAccessFile* file, uint64_t offset, void* buffer, size_t length, uint64_t tag) {
  return IoRequest{IoRequest::Kind::kRead, nullptr, file, offset, buffer, length, tag};
}

// Writes `out` to a new O_DIRECT file in blocks of `block` bytes, then reads it back into `in`
// (last block first), with every request naming its region as buffer_index.
void WriteAndReadBack(IoQueue* queue, Env* env, const std::string& path, char* out, int out_index, char* in,
                      int in_index, size_t size, size_t block) {
  FileOptions direct;
  direct.direct_io = true;
  Result<std::unique_ptr<WritableFile>> writer = env->NewWritableFile(path, direct);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  std::vector<IoCompletion> done;
  for (size_t at = 0; at < size; at += block) {
    IoRequest r = WriteAt(writer->get(), at, out + at, std::min(block, size - at), at);
    r.buffer_index = out_index;
    if (queue->in_flight() == queue->depth()) {
      ASSERT_TRUE(queue->Reap(1, &done).ok());
    }
    ASSERT_TRUE(queue->Submit(r).ok());
  }
  ASSERT_TRUE(queue->Reap(queue->in_flight(), &done).ok());
  ASSERT_EQ((size + block - 1) / block, done.size());
  for (const IoCompletion& c : done) ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  ASSERT_TRUE((*writer)->Sync().ok());
  ASSERT_TRUE((*writer)->Close().ok());
  ASSERT_EQ(size, env->GetFileSize(path).value_or(0));

  Result<std::unique_ptr<RandomAccessFile>> reader = env->NewRandomAccessFile(path, direct);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::memset(in, 0, size);
  done.clear();
  for (size_t end = size; end > 0;) {
    const size_t at = (end - 1) / block * block;
    IoRequest r = ReadAt(reader->get(), at, in + at, end - at, at);
    r.buffer_index = in_index;
    if (queue->in_flight() == queue->depth()) {
      ASSERT_TRUE(queue->Reap(1, &done).ok());
    }
    ASSERT_TRUE(queue->Submit(r).ok());
    end = at;
  }
  ASSERT_TRUE(queue->Reap(queue->in_flight(), &done).ok());
  ASSERT_EQ((size + block - 1) / block, done.size());
  for (const IoCompletion& c : done) ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  ASSERT_EQ(0, std::memcmp(out, in, size)) << "the data read back through " << queue->engine() << " differs";
}

#define QUEUE_OR_SKIP(var, depth)                                         \
  std::unique_ptr<IoQueue> var = QueueOrSkip(depth);                      \
  if (var == nullptr) GTEST_SKIP() << "io_uring is not available here"

TEST_P(IoQueueTest, SixtyFourConcurrentDirectWritesThenReads) {
  QUEUE_OR_SKIP(queue, 64);
  constexpr size_t kBlock = 64 * 1024;
  constexpr unsigned kCount = 64;
  const std::string path = JoinPath(dir_.path(), "data");
  FileOptions direct;
  direct.direct_io = true;
  Result<std::unique_ptr<WritableFile>> writer = env_->NewWritableFile(path, direct);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();

  AlignedBuffer out(kBlock * kCount);
  test::FillPattern(out.data(), kBlock * kCount, 1);
  for (unsigned i = 0; i < kCount; ++i) {
    ASSERT_TRUE(queue->Submit(WriteAt(writer->get(), i * kBlock, out.data() + i * kBlock, kBlock, 1000 + i)).ok());
  }
  EXPECT_EQ(kCount, queue->in_flight());
  std::vector<IoCompletion> done;
  ASSERT_TRUE(queue->Reap(kCount, &done).ok());
  ASSERT_EQ(kCount, done.size());
  std::vector<bool> seen(kCount, false);
  for (const IoCompletion& c : done) {
    EXPECT_TRUE(c.status.ok()) << c.status.ToString();
    ASSERT_GE(c.tag, 1000u);
    ASSERT_LT(c.tag, 1000u + kCount);
    EXPECT_FALSE(seen[c.tag - 1000]);
    seen[c.tag - 1000] = true;
  }
  EXPECT_EQ(0u, queue->in_flight());
  ASSERT_TRUE((*writer)->Sync().ok());
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ(kBlock * kCount, env_->GetFileSize(path).value_or(0));

  Result<std::unique_ptr<RandomAccessFile>> reader = env_->NewRandomAccessFile(path, direct);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  AlignedBuffer in(kBlock * kCount);
  std::memset(in.data(), 0, kBlock * kCount);
  // Read back in reverse order, reaping as we go, to exercise partial reaps.
  done.clear();
  for (unsigned i = kCount; i-- > 0;) {
    ASSERT_TRUE(queue->Submit(ReadAt(reader->get(), i * kBlock, in.data() + i * kBlock, kBlock, i)).ok());
    if (i % 16 == 0) {
      ASSERT_TRUE(queue->Reap(1, &done).ok());
    }
  }
  ASSERT_TRUE(queue->Reap(kCount, &done).ok());
  ASSERT_EQ(kCount, done.size());
  for (const IoCompletion& c : done) EXPECT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(0, std::memcmp(out.data(), in.data(), kBlock * kCount));
}

TEST_P(IoQueueTest, ReadPastEndIsShortReadNamingFileAndOffset) {
  QUEUE_OR_SKIP(queue, 4);
  const std::string path = JoinPath(dir_.path(), "small");
  ASSERT_TRUE(WriteFileAtomically(env_, path, std::string(100, 'x')).ok());
  Result<std::unique_ptr<RandomAccessFile>> reader = env_->NewRandomAccessFile(path, FileOptions{});
  ASSERT_TRUE(reader.ok());
  std::vector<char> buffer(4096);
  IoRequest r = ReadAt(reader->get(), 0, buffer.data(), 200, 7);  // straddles the end: 100 bytes come, then EOF
  ASSERT_TRUE(queue->Submit(r).ok());
  r.offset = 4096;  // wholly past the end
  r.length = 10;
  r.tag = 8;
  ASSERT_TRUE(queue->Submit(r).ok());
  std::vector<IoCompletion> done;
  ASSERT_TRUE(queue->Reap(2, &done).ok());
  ASSERT_EQ(2u, done.size());
  for (const IoCompletion& c : done) {
    EXPECT_TRUE(c.status.IsCorruption()) << c.status.ToString();
    EXPECT_NE(std::string::npos, c.status.message().find(path)) << c.status.ToString();
    EXPECT_NE(std::string::npos, c.status.message().find("short read")) << c.status.ToString();
    EXPECT_NE(std::string::npos, c.status.message().find(c.tag == 7 ? "offset 0" : "offset 4096"))
        << c.status.ToString();
  }
  // The 100 bytes that were there did arrive.
  EXPECT_EQ(std::string(100, 'x'), std::string(buffer.data(), 100));
}

TEST_P(IoQueueTest, OperatingSystemErrorNamesFileAndOffset) {
  QUEUE_OR_SKIP(queue, 2);
  // A directory opens read-only but pread on it fails with EISDIR.
  Result<std::unique_ptr<RandomAccessFile>> reader = env_->NewRandomAccessFile(dir_.path(), FileOptions{});
  ASSERT_TRUE(reader.ok());
  char buffer[16];
  ASSERT_TRUE(queue->Submit(ReadAt(reader->get(), 512, buffer, sizeof(buffer), 0)).ok());
  std::vector<IoCompletion> done;
  ASSERT_TRUE(queue->Reap(1, &done).ok());
  ASSERT_EQ(1u, done.size());
  EXPECT_EQ(StatusCode::kIOError, done[0].status.code()) << done[0].status.ToString();
  EXPECT_NE(std::string::npos, done[0].status.message().find(dir_.path() + " at offset 512"))
      << done[0].status.ToString();
}

TEST_P(IoQueueTest, SubmitBeyondDepthIsResourceExhausted) {
  QUEUE_OR_SKIP(queue, 4);
  const std::string path = JoinPath(dir_.path(), "f");
  Result<std::unique_ptr<WritableFile>> writer = env_->NewWritableFile(path, FileOptions{});
  ASSERT_TRUE(writer.ok());
  char data[8] = "abcdefg";
  IoRequest r;
  r.writer = writer->get();
  r.buffer = data;
  r.length = sizeof(data);
  for (int i = 0; i < 4; ++i) {
    r.offset = i * sizeof(data);
    ASSERT_TRUE(queue->Submit(r).ok());
  }
  Status s = queue->Submit(r);
  EXPECT_EQ(StatusCode::kResourceExhausted, s.code()) << s.ToString();
  EXPECT_EQ(4u, queue->in_flight());
  // min_completions is bounded by what is in flight.
  std::vector<IoCompletion> done;
  ASSERT_TRUE(queue->Reap(100, &done).ok());
  EXPECT_EQ(4u, done.size());
  EXPECT_TRUE(queue->Submit(r).ok());
  ASSERT_TRUE(queue->Reap(1, &done).ok());
  EXPECT_EQ(5u, done.size());
  // Nothing in flight: Reap returns at once.
  ASSERT_TRUE(queue->Reap(1, &done).ok());
  EXPECT_EQ(5u, done.size());
}

TEST_P(IoQueueTest, RequestWithoutFileIsInvalid) {
  QUEUE_OR_SKIP(queue, 2);
  IoRequest r;
  EXPECT_EQ(StatusCode::kInvalidArgument, queue->Submit(r).code());
  EXPECT_EQ(0u, queue->in_flight());
}

TEST_P(IoQueueTest, DestroyingTheQueueFinishesSubmittedWrites) {
  const std::string path = JoinPath(dir_.path(), "late");
  Result<std::unique_ptr<WritableFile>> writer = env_->NewWritableFile(path, FileOptions{});
  ASSERT_TRUE(writer.ok());
  std::string data(1 << 20, '\0');
  test::FillPattern(data.data(), data.size(), 3);
  {
    QUEUE_OR_SKIP(queue, 16);
    for (unsigned i = 0; i < 16; ++i) {
      IoRequest r;
      r.writer = writer->get();
      r.offset = i * (data.size() / 16);
      r.buffer = data.data() + r.offset;
      r.length = data.size() / 16;
      ASSERT_TRUE(queue->Submit(r).ok());
    }
  }
  Result<std::string> back = ReadFileToString(env_, path, 1 << 21);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == data);
}

TEST_P(IoQueueTest, FilesWithoutDescriptorWork) {
  QUEUE_OR_SKIP(queue, 8);
  std::unique_ptr<MemEnv> mem = NewMemEnv();
  Result<std::unique_ptr<WritableFile>> writer = mem->NewWritableFile("/m", FileOptions{});
  ASSERT_TRUE(writer.ok());
  ASSERT_LT((*writer)->fd(), 0);
  const std::string data = "hello, memory";
  IoRequest r;
  r.writer = writer->get();
  r.buffer = const_cast<char*>(data.data());
  r.length = data.size();
  r.offset = 5;
  ASSERT_TRUE(queue->Submit(r).ok());
  std::vector<IoCompletion> done;
  ASSERT_TRUE(queue->Reap(1, &done).ok());
  ASSERT_EQ(1u, done.size());
  EXPECT_TRUE(done[0].status.ok());
  Result<std::string> back = ReadFileToString(mem.get(), "/m", 100);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::string(5, '\0') + data, *back);
}

TEST_P(IoQueueTest, ZeroLengthRequestCompletes) {
  QUEUE_OR_SKIP(queue, 2);
  Result<std::unique_ptr<WritableFile>> writer = env_->NewWritableFile(JoinPath(dir_.path(), "z"), FileOptions{});
  ASSERT_TRUE(writer.ok());
  IoRequest r;
  r.writer = writer->get();
  r.tag = 42;
  ASSERT_TRUE(queue->Submit(r).ok());
  std::vector<IoCompletion> done;
  ASSERT_TRUE(queue->Reap(1, &done).ok());
  ASSERT_EQ(1u, done.size());
  EXPECT_EQ(42u, done[0].tag);
  EXPECT_TRUE(done[0].status.ok());
}

// A 3 MiB region in 256 KiB pieces, moved in 192 KiB requests: most requests cross a piece
// boundary, which the io_uring queue cuts there, so every byte still goes through a fixed buffer.
constexpr size_t kFixedRegionBytes = 3 << 20;
constexpr size_t kFixedPieceBytes = 256 << 10;
constexpr size_t kFixedBlockBytes = 192 << 10;
constexpr size_t kFixedRequests = kFixedRegionBytes / kFixedBlockBytes;

// Registers out and in (one mapping cut in two halves) and round-trips `out` through a file.
// Returns the registration's status; the data must come back either way.
Status RoundTripThroughRegisteredHalves(IoQueue* queue, Env* env, const std::string& path, const Mapping& memory) {
  ScopedFixedBufferPieceBytes pieces(kFixedPieceBytes);
  char* out = memory.data();
  char* in = memory.data() + kFixedRegionBytes;
  test::FillPattern(out, kFixedRegionBytes, 11);
  const Status registered = queue->RegisterBuffers({{out, kFixedRegionBytes}, {in, kFixedRegionBytes}});
  WriteAndReadBack(queue, env, path, out, 0, in, 1, kFixedRegionBytes, kFixedBlockBytes);
  const uint64_t fixed = internal::FixedBufferSqesForTesting(*queue);
  if (registered.ok()) {
    // At least one SQE per request, and more because requests crossing a piece are cut.
    EXPECT_GT(fixed, 2 * kFixedRequests);
  } else {
    EXPECT_EQ(0u, fixed);
  }
  return registered;
}

TEST_P(IoQueueTest, DirectTransfersThroughRegisteredAnonymousMemory) {
  QUEUE_OR_SKIP(queue, 8);
  Mapping memory = Mapping::Anonymous(2 * kFixedRegionBytes);
  ASSERT_NE(nullptr, memory.data());
  const Status registered = RoundTripThroughRegisteredHalves(queue.get(), env_, JoinPath(dir_.path(), "anon"), memory);
  if (GetParam() == "threads") {
    EXPECT_TRUE(registered.IsNotSupported()) << registered.ToString();
  } else if (!registered.ok()) {
    // Only a locked-memory limit may refuse plain anonymous memory (CI without CAP_IPC_LOCK).
    EXPECT_TRUE(registered.IsNotSupported()) << registered.ToString();
    EXPECT_NE(std::string::npos, registered.message().find(std::strerror(ENOMEM))) << registered.ToString();
    std::cout << "[   INFO   ] anonymous fixed buffers refused: " << registered.ToString() << std::endl;
  }
}

TEST_P(IoQueueTest, DirectTransfersThroughRegisteredSharedMemoryFile) {
  QUEUE_OR_SKIP(queue, 8);
  Mapping memory = Mapping::SharedMemory(2 * kFixedRegionBytes);
  if (memory.data() == nullptr) GTEST_SKIP() << "no /dev/shm here";
  const Status registered = RoundTripThroughRegisteredHalves(queue.get(), env_, JoinPath(dir_.path(), "shm"), memory);
  if (GetParam() == "threads") {
    EXPECT_TRUE(registered.IsNotSupported()) << registered.ToString();
  } else {
    // Some kernels refuse to pin file-backed memory for io_uring; the transfers worked regardless.
    EXPECT_TRUE(registered.ok() || registered.IsNotSupported()) << registered.ToString();
    std::cout << "[   INFO   ] /dev/shm fixed buffers: "
              << (registered.ok() ? std::string("registered") : "refused, " + registered.ToString()) << std::endl;
  }
}

TEST_P(IoQueueTest, BufferIndexWithoutRegistrationIsAnOrdinaryTransfer) {
  QUEUE_OR_SKIP(queue, 4);
  Mapping memory = Mapping::Anonymous(2 * kFixedRegionBytes);
  ASSERT_NE(nullptr, memory.data());
  char* out = memory.data();
  char* in = memory.data() + kFixedRegionBytes;
  test::FillPattern(out, kFixedRegionBytes, 5);
  WriteAndReadBack(queue.get(), env_, JoinPath(dir_.path(), "plain"), out, 0, in, 3, kFixedRegionBytes,
                   kFixedBlockBytes);
  EXPECT_EQ(0u, internal::FixedBufferSqesForTesting(*queue));
}

TEST_P(IoQueueTest, RegistrationCanBeReplacedAndDropped) {
  QUEUE_OR_SKIP(queue, 4);
  if (GetParam() == "threads") {
    EXPECT_TRUE(queue->RegisterBuffers({}).IsNotSupported());
    return;
  }
  Mapping memory = Mapping::Anonymous(2 * kFixedRegionBytes);
  ASSERT_NE(nullptr, memory.data());
  // Nothing registered yet: an empty list is a no-op.
  EXPECT_TRUE(queue->RegisterBuffers({}).ok());
  const Status first = queue->RegisterBuffers({{memory.data(), kFixedRegionBytes}});
  if (first.IsNotSupported()) GTEST_SKIP() << first.ToString();
  ASSERT_TRUE(first.ok()) << first.ToString();
  // Replacing: the old region's index now names the other half.
  ASSERT_TRUE(queue->RegisterBuffers({{memory.data() + kFixedRegionBytes, kFixedRegionBytes}}).ok());
  test::FillPattern(memory.data(), kFixedRegionBytes, 9);
  // `out` is no longer registered, `in` is region 0: only the read uses fixed buffers.
  WriteAndReadBack(queue.get(), env_, JoinPath(dir_.path(), "replaced"), memory.data(), 0,
                   memory.data() + kFixedRegionBytes, 0, kFixedRegionBytes, kFixedRegionBytes);
  const uint64_t fixed = internal::FixedBufferSqesForTesting(*queue);
  EXPECT_GE(fixed, 1u);
  ASSERT_TRUE(queue->RegisterBuffers({}).ok());
  WriteAndReadBack(queue.get(), env_, JoinPath(dir_.path(), "dropped"), memory.data(), 0,
                   memory.data() + kFixedRegionBytes, 0, kFixedRegionBytes, kFixedRegionBytes);
  EXPECT_EQ(fixed, internal::FixedBufferSqesForTesting(*queue));
}

TEST_P(IoQueueTest, RegistrationRefusesBadRegionsAndRequestsInFlight) {
  QUEUE_OR_SKIP(queue, 4);
  Mapping memory = Mapping::Anonymous(1 << 20);
  ASSERT_NE(nullptr, memory.data());
  if (GetParam() == "threads") {
    // The thread pool registers nothing, so it has nothing to validate.
    EXPECT_TRUE(queue->RegisterBuffers({{memory.data() + 512, 4096}}).IsNotSupported());
    return;
  }
  Status s = queue->RegisterBuffers({{memory.data() + 512, 4096}});
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code()) << s.ToString();
  s = queue->RegisterBuffers({{memory.data(), 4096}, {memory.data() + 8192, 0}});
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("#1")) << s.ToString();

  Result<std::unique_ptr<WritableFile>> writer = env_->NewWritableFile(JoinPath(dir_.path(), "busy"), FileOptions{});
  ASSERT_TRUE(writer.ok());
  IoRequest r;
  r.writer = writer->get();
  r.buffer = memory.data();
  r.length = 4096;
  ASSERT_TRUE(queue->Submit(r).ok());
  s = queue->RegisterBuffers({{memory.data(), 1 << 20}});
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  std::vector<IoCompletion> done;
  ASSERT_TRUE(queue->Reap(1, &done).ok());
  ASSERT_EQ(1u, done.size());
  EXPECT_TRUE(done[0].status.ok());
}

INSTANTIATE_TEST_SUITE_P(Engines, IoQueueTest, ::testing::Values("io_uring", "threads"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "io_uring" ? std::string("Uring") : std::string("Threads");
                         });

TEST(IoEngineSelection, EnvironmentForcesThreads) {
  ScopedEnvVar var("LIFELINE_IO_ENGINE", "threads");
  Result<std::unique_ptr<IoQueue>> q = Env::Default()->NewIoQueue(IoQueueOptions{});
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_STREQ("threads", (*q)->engine());
}

TEST(IoEngineSelection, EnvironmentForcesUringOrFails) {
  ScopedEnvVar var("LIFELINE_IO_ENGINE", "uring");
  Result<std::unique_ptr<IoQueue>> q = Env::Default()->NewIoQueue(IoQueueOptions{});
  if (q.ok()) {
    EXPECT_STREQ("io_uring", (*q)->engine());
  } else {
    EXPECT_TRUE(q.status().IsNotSupported()) << q.status().ToString();
  }
}

TEST(IoEngineSelection, UnknownEngineIsRejected) {
  ScopedEnvVar var("LIFELINE_IO_ENGINE", "carrier-pigeon");
  Result<std::unique_ptr<IoQueue>> q = Env::Default()->NewIoQueue(IoQueueOptions{});
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(StatusCode::kInvalidArgument, q.status().code());
  EXPECT_NE(std::string::npos, q.status().message().find("carrier-pigeon"));
}

TEST(IoEngineSelection, DefaultIsUringWhenTheKernelAllowsIt) {
  ::unsetenv("LIFELINE_IO_ENGINE");
  Result<std::unique_ptr<IoQueue>> q = Env::Default()->NewIoQueue(IoQueueOptions{});
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  const bool uring_works = internal::NewUringIoQueue(IoQueueOptions{}).ok();
  EXPECT_STREQ(uring_works ? "io_uring" : "threads", (*q)->engine());
}

TEST(IoEngineSelection, FallsBackToThreadsWithOneWarningWhenUringIsForbidden) {
  ::unsetenv("LIFELINE_IO_ENGINE");
  std::vector<std::string> warnings;
  SetLogSink([&](LogLevel level, std::string_view message) {
    if (level == LogLevel::kWarning) warnings.emplace_back(message);
  });
  internal::SetUringUnavailableForTesting(EPERM);
  Result<std::unique_ptr<IoQueue>> first = Env::Default()->NewIoQueue(IoQueueOptions{});
  Result<std::unique_ptr<IoQueue>> second = Env::Default()->NewIoQueue(IoQueueOptions{});
  Result<std::unique_ptr<IoQueue>> forced = [] {
    ScopedEnvVar var("LIFELINE_IO_ENGINE", "uring");
    return Env::Default()->NewIoQueue(IoQueueOptions{});
  }();
  internal::SetUringUnavailableForTesting(0);
  SetLogSink(nullptr);

  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_STREQ("threads", (*first)->engine());
  EXPECT_STREQ("threads", (*second)->engine());
  ASSERT_EQ(1u, warnings.size());  // once per process, not once per queue
  EXPECT_NE(std::string::npos, warnings[0].find("io_uring is unavailable")) << warnings[0];
  EXPECT_NE(std::string::npos, warnings[0].find(std::strerror(EPERM))) << warnings[0];
  // Asking for io_uring explicitly is an error, not a silent fallback.
  ASSERT_FALSE(forced.ok());
  EXPECT_TRUE(forced.status().IsNotSupported()) << forced.status().ToString();
}

TEST(IoEngineSelection, NonPosixEnvsUseThreads) {
  std::unique_ptr<MemEnv> mem = NewMemEnv();
  Result<std::unique_ptr<IoQueue>> q = mem->NewIoQueue(IoQueueOptions{});
  ASSERT_TRUE(q.ok());
  EXPECT_STREQ("threads", (*q)->engine());
  FaultInjectionEnv fault(Env::Default());
  q = fault.NewIoQueue(IoQueueOptions{});
  ASSERT_TRUE(q.ok());
  EXPECT_STREQ("threads", (*q)->engine());
}

}  // namespace io_queue_test
}  // namespace lifeline
