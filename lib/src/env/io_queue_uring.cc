// The io_uring IoQueue, and the engine choice behind Env::Default()->NewIoQueue().
//
// Each request owns one preallocated slot for its whole life (submit to reap); the slot index is
// the SQE's user_data, so steady-state operation allocates nothing. A request is one SQE at a
// time: short transfers, -EAGAIN and transfers above kMaxSqeBytes are continued by re-preparing
// the slot's SQE for the remainder.
//
// Registered (fixed) buffers: each region is registered as pieces of at most kFixedPieceBytes,
// and an SQE whose buffer lies in a registered region uses the fixed opcode on the piece that
// holds it. A transfer that crosses a piece boundary is cut there and continued in the next piece,
// like a short transfer, so every byte of a registered region goes out without per-request pinning.
#include <liburing.h>
#include <sys/resource.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lib/src/env/io_queue_internal.h"
#include "lifeline/env.h"
#include "lifeline/log.h"

namespace lifeline {
namespace internal {
namespace {

// The kernel caps one read/write at about 2 GiB; larger requests continue in pieces that keep
// O_DIRECT alignment.
constexpr size_t kMaxSqeBytes = size_t{1} << 30;
constexpr unsigned kMaxDepth = 32768;  // IORING_MAX_ENTRIES
constexpr unsigned kPeekBatch = 64;
// The kernel refuses a registered buffer (one iovec) larger than 1 GiB.
constexpr size_t kFixedPieceBytes = size_t{1} << 30;

std::atomic<int> uring_refused_for_testing{0};
std::atomic<size_t> fixed_piece_bytes_for_testing{0};

std::string DescribeRegistrationFailure(int err, size_t bytes, size_t pieces) {
  std::string text = std::strerror(err);
  text += " (" + std::to_string(bytes) + " bytes in " + std::to_string(pieces) + " pieces";
  rlimit limit;
  if (err == ENOMEM && ::getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    text += "; RLIMIT_MEMLOCK allows " + std::to_string(limit.rlim_cur / 1024) + " KiB";
  }
  return text + ")";
}

unsigned RoundUpPow2(unsigned v) {
  unsigned p = 1;
  while (p < v) p <<= 1;
  return p;
}

class UringIoQueue final : public IoQueue {
 public:
  explicit UringIoQueue(unsigned depth) : depth_(depth), slots_(depth) {
    free_.reserve(depth_);
    for (unsigned i = depth_; i-- > 0;) free_.push_back(i);
    ready_.reserve(depth_);
    // Deferring io_uring_submit lets a burst of Submits share one system call. It is done only
    // while the device still holds at least a batch of requests, so deferral never starves it
    // even when the caller goes quiet until its next Submit or Reap.
    batch_ = std::clamp(depth_ / 4, 1u, 16u);
  }

  Status Init() {
    // One SQ entry per slot: a slot has at most one SQE queued, so the SQ never fills up. The
    // default CQ (twice the SQ) holds every completion that can be outstanding.
    const int refused = uring_refused_for_testing.load();
    const int rc = refused != 0 ? -refused : io_uring_queue_init(RoundUpPow2(depth_), &ring_, 0);
    if (rc < 0) return Status::NotSupported("io_uring_queue_init", std::strerror(-rc));
    ring_ready_ = true;
    return Status::OK();
  }

  ~UringIoQueue() override {
    if (!ring_ready_) return;
    // The kernel may still be writing into caller buffers: finish everything before the ring goes.
    while (kernel_in_flight_ > 0 || io_uring_sq_ready(&ring_) > 0) {
      if (!WaitAndProcess().ok()) break;
    }
    io_uring_queue_exit(&ring_);
  }

  Status Submit(const IoRequest& request) override {
    if (in_flight_ >= depth_) {
      return Status::ResourceExhausted("io queue", "all " + std::to_string(depth_) + " slots are in flight");
    }
    const bool write = request.kind == IoRequest::Kind::kWrite;
    if (write ? request.writer == nullptr : request.reader == nullptr) {
      return Status::InvalidArgument("io queue", "request without a file");
    }
    const unsigned index = free_.back();
    free_.pop_back();
    ++in_flight_;
    Slot& slot = slots_[index];
    slot.request = request;
    slot.done = 0;
    slot.status = Status::OK();
    slot.fd = write ? request.writer->fd() : request.reader->fd();
    if (slot.fd < 0 || request.length == 0) {
      // Not an OS file (or nothing to do): the file object itself does the work, synchronously.
      if (request.length > 0) {
        slot.status = write ? request.writer->WriteAt(request.offset, request.buffer, request.length)
                            : request.reader->ReadAt(request.offset, request.buffer, request.length);
      }
      ready_.push_back(index);
      return Status::OK();
    }
    PrepareSqe(index);
    // CQEs not yet looked at are requests the device has finished with.
    const size_t device_busy = kernel_in_flight_ - std::min<size_t>(kernel_in_flight_, io_uring_cq_ready(&ring_));
    if (device_busy < batch_ || io_uring_sq_ready(&ring_) >= batch_) {
      // The request is accepted either way; a submission the kernel refuses now is retried, and
      // its error reported, by the next Reap.
      Flush().IgnoreError();
    }
    return Status::OK();
  }

  Status Reap(size_t min_completions, std::vector<IoCompletion>* out) override {
    const size_t target = std::min(min_completions, in_flight_);
    LL_RETURN_IF_ERROR(ProcessAvailable());
    while (ready_.size() < target) LL_RETURN_IF_ERROR(WaitAndProcess());
    // Re-queued remainders must not sit in the SQ until the next call.
    if (io_uring_sq_ready(&ring_) > 0) LL_RETURN_IF_ERROR(Flush());
    for (unsigned index : ready_) {
      Slot& slot = slots_[index];
      out->push_back(IoCompletion{slot.request.tag, std::move(slot.status)});
      slot.status = Status::OK();
      free_.push_back(index);
    }
    in_flight_ -= ready_.size();
    ready_.clear();
    return Status::OK();
  }

  size_t in_flight() const override { return in_flight_; }
  unsigned depth() const override { return depth_; }
  const char* engine() const override { return "io_uring"; }

  Status RegisterBuffers(const std::vector<std::pair<void*, size_t>>& regions) override {
    // A re-queued remainder would otherwise name a piece of the old registration.
    if (in_flight_ > 0) {
      return Status::FailedPrecondition(
          "io queue", "cannot register buffers with " + std::to_string(in_flight_) + " requests in flight");
    }
    for (size_t i = 0; i < regions.size(); ++i) {
      const auto& [base, length] = regions[i];
      if (base == nullptr || length == 0) {
        return Status::InvalidArgument("io queue", "registered buffer #" + std::to_string(i) + " is empty");
      }
      // Pieces then start aligned, so cutting an O_DIRECT transfer at a piece boundary keeps it aligned.
      if (reinterpret_cast<uintptr_t>(base) % kDirectIoAlignment != 0) {
        return Status::InvalidArgument("io queue", "registered buffer #" + std::to_string(i) + " is not aligned to " +
                                                       std::to_string(kDirectIoAlignment) + " bytes");
      }
    }
    LL_RETURN_IF_ERROR(UnregisterBuffers());
    if (regions.empty()) return Status::OK();

    const size_t override_bytes = fixed_piece_bytes_for_testing.load();
    const size_t piece_bytes = override_bytes != 0 ? override_bytes : kFixedPieceBytes;
    std::vector<RegisteredRegion> registered;
    registered.reserve(regions.size());
    std::vector<iovec> pieces;
    size_t total = 0;
    for (const auto& [base, length] : regions) {
      registered.push_back(RegisteredRegion{reinterpret_cast<uintptr_t>(base), length, pieces.size()});
      for (size_t at = 0; at < length; at += piece_bytes) {
        pieces.push_back(iovec{static_cast<char*>(base) + at, std::min(piece_bytes, length - at)});
      }
      total += length;
    }
    int rc;
    do {
      rc = io_uring_register_buffers(&ring_, pieces.data(), static_cast<unsigned>(pieces.size()));
    } while (rc == -EINTR);
    if (rc < 0) {
      return Status::NotSupported("io_uring_register_buffers", DescribeRegistrationFailure(-rc, total, pieces.size()));
    }
    regions_ = std::move(registered);
    piece_bytes_ = piece_bytes;
    return Status::OK();
  }

  uint64_t fixed_sqes() const { return fixed_sqes_; }

 private:
  struct RegisteredRegion {
    uintptr_t base;
    size_t length;
    size_t first_piece;  // kernel buffer index of the region's first piece
  };

  struct Slot {
    IoRequest request;
    int fd = -1;
    size_t done = 0;  // bytes transferred so far
    Status status;
  };

  const std::string& PathOf(const Slot& slot) const {
    return slot.request.kind == IoRequest::Kind::kWrite ? slot.request.writer->path() : slot.request.reader->path();
  }

  void PrepareSqe(unsigned index) {
    Slot& slot = slots_[index];
    const IoRequest& r = slot.request;
    char* buffer = static_cast<char*>(r.buffer) + slot.done;
    size_t length = std::min(r.length - slot.done, kMaxSqeBytes);
    const uint64_t offset = r.offset + slot.done;
    const int piece = FixedPiece(r.buffer_index, buffer, &length);
    const bool write = r.kind == IoRequest::Kind::kWrite;
    // Never null: the SQ has an entry per slot (see Init).
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (piece >= 0) {
      ++fixed_sqes_;
      if (write) {
        io_uring_prep_write_fixed(sqe, slot.fd, buffer, static_cast<unsigned>(length), offset, piece);
      } else {
        io_uring_prep_read_fixed(sqe, slot.fd, buffer, static_cast<unsigned>(length), offset, piece);
      }
    } else if (write) {
      io_uring_prep_write(sqe, slot.fd, buffer, static_cast<unsigned>(length), offset);
    } else {
      io_uring_prep_read(sqe, slot.fd, buffer, static_cast<unsigned>(length), offset);
    }
    io_uring_sqe_set_data64(sqe, index);
  }

  // The kernel buffer index of the registered piece holding `buffer`, with *length cut so the
  // transfer ends inside that piece; -1 when `buffer` is not in registered region #buffer_index
  // (nothing registered, or the caller's index is stale), which makes it an ordinary transfer.
  int FixedPiece(int buffer_index, const char* buffer, size_t* length) const {
    if (buffer_index < 0 || static_cast<size_t>(buffer_index) >= regions_.size()) return -1;
    const RegisteredRegion& region = regions_[static_cast<size_t>(buffer_index)];
    const uintptr_t address = reinterpret_cast<uintptr_t>(buffer);
    if (address < region.base || address - region.base >= region.length) return -1;
    const size_t at = address - region.base;
    const size_t piece = at / piece_bytes_;
    const size_t piece_end = std::min((piece + 1) * piece_bytes_, region.length);
    *length = std::min(*length, piece_end - at);
    return static_cast<int>(region.first_piece + piece);
  }

  Status UnregisterBuffers() {
    if (regions_.empty()) return Status::OK();
    regions_.clear();
    int rc;
    do {
      rc = io_uring_unregister_buffers(&ring_);
    } while (rc == -EINTR);
    return rc < 0 ? Status::FromErrno(-rc, "io_uring_unregister_buffers") : Status::OK();
  }

  Status Flush() {
    for (;;) {
      const int rc = io_uring_submit(&ring_);
      if (rc >= 0) {
        kernel_in_flight_ += static_cast<size_t>(rc);
        return Status::OK();
      }
      if (rc == -EINTR) continue;
      // EAGAIN/EBUSY: the kernel is short of resources until completions are reaped; the SQEs
      // stay queued and go out with the next submit_and_wait.
      if (rc == -EAGAIN || rc == -EBUSY) return Status::OK();
      return Status::FromErrno(-rc, "io_uring_submit");
    }
  }

  // Submits what is queued and blocks for at least one completion, then handles all available.
  Status WaitAndProcess() {
    const int rc = io_uring_submit_and_wait(&ring_, 1);
    if (rc >= 0) {
      kernel_in_flight_ += static_cast<size_t>(rc);
    } else if (rc == -EAGAIN || rc == -EBUSY) {
      // Nothing went out for lack of kernel resources; wait for what is out already to free some.
      io_uring_cqe* cqe;
      if (kernel_in_flight_ > 0) io_uring_wait_cqe(&ring_, &cqe);
    } else if (rc != -EINTR) {
      return Status::FromErrno(-rc, "io_uring_submit_and_wait");
    }
    return ProcessAvailable();
  }

  Status ProcessAvailable() {
    io_uring_cqe* cqes[kPeekBatch];
    for (;;) {
      const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, kPeekBatch);
      if (n == 0) return Status::OK();
      for (unsigned i = 0; i < n; ++i) Complete(static_cast<unsigned>(io_uring_cqe_get_data64(cqes[i])), cqes[i]->res);
      io_uring_cq_advance(&ring_, n);
      kernel_in_flight_ -= n;
      if (n < kPeekBatch) return Status::OK();
    }
  }

  void Complete(unsigned index, int res) {
    Slot& slot = slots_[index];
    const IoRequest& r = slot.request;
    const bool write = r.kind == IoRequest::Kind::kWrite;
    if (res == -EAGAIN || res == -EINTR) {
      PrepareSqe(index);
      return;
    }
    if (res < 0) {
      slot.status = Status::FromErrno(-res, PathOf(slot) + AtOffset(r.offset + slot.done));
    } else if (res == 0) {
      slot.status = write ? Status::IOError(PathOf(slot) + AtOffset(r.offset + slot.done), "write made no progress")
                          : Status::Corruption(PathOf(slot) + AtOffset(r.offset),
                                               "short read: wanted " + std::to_string(r.length) +
                                                   " bytes, the file ends after " + std::to_string(slot.done));
    } else {
      slot.done += static_cast<size_t>(res);
      if (slot.done < r.length) {
        PrepareSqe(index);
        return;
      }
    }
    ready_.push_back(index);
  }

  const unsigned depth_;
  unsigned batch_ = 1;
  io_uring ring_;
  bool ring_ready_ = false;
  std::vector<Slot> slots_;
  std::vector<unsigned> free_;   // slot indices not in use
  std::vector<unsigned> ready_;  // completed slot indices awaiting Reap
  size_t in_flight_ = 0;         // slots in use
  size_t kernel_in_flight_ = 0;  // SQEs submitted whose CQE has not been seen
  std::vector<RegisteredRegion> regions_;  // indexed by IoRequest::buffer_index; empty: none
  size_t piece_bytes_ = kFixedPieceBytes;
  uint64_t fixed_sqes_ = 0;  // SQEs prepared with a fixed-buffer opcode (for tests)
};

enum class Engine { kAuto, kThreads, kUring };

Result<Engine> EngineFromEnvironment() {
  const char* value = std::getenv("LIFELINE_IO_ENGINE");
  if (value == nullptr || value[0] == '\0' || std::strcmp(value, "auto") == 0) return Engine::kAuto;
  if (std::strcmp(value, "threads") == 0) return Engine::kThreads;
  if (std::strcmp(value, "uring") == 0 || std::strcmp(value, "io_uring") == 0) return Engine::kUring;
  return Status::InvalidArgument("LIFELINE_IO_ENGINE",
                                 std::string("unknown engine '") + value + "' (expected auto, threads or uring)");
}

}  // namespace

void SetUringUnavailableForTesting(int err) { uring_refused_for_testing.store(err); }

void SetFixedBufferPieceBytesForTesting(size_t bytes) {
  const size_t aligned = (bytes + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
  fixed_piece_bytes_for_testing.store(std::min(aligned, kFixedPieceBytes));
}

uint64_t FixedBufferSqesForTesting(const IoQueue& queue) {
  const auto* uring = dynamic_cast<const UringIoQueue*>(&queue);
  return uring != nullptr ? uring->fixed_sqes() : 0;
}

Result<std::unique_ptr<IoQueue>> NewUringIoQueue(const IoQueueOptions& options) {
  const unsigned depth = std::max(1u, options.depth);
  if (depth > kMaxDepth) {
    return Status::InvalidArgument("io queue", "depth " + std::to_string(depth) + " exceeds " +
                                                   std::to_string(kMaxDepth));
  }
  auto queue = std::make_unique<UringIoQueue>(depth);
  LL_RETURN_IF_ERROR(queue->Init());
  return std::unique_ptr<IoQueue>(std::move(queue));
}

Result<std::unique_ptr<IoQueue>> NewPosixIoQueue(const IoQueueOptions& options) {
  LL_ASSIGN_OR_RETURN(Engine engine, EngineFromEnvironment());
  if (engine == Engine::kThreads) return NewThreadPoolIoQueue(options);
  Result<std::unique_ptr<IoQueue>> uring = NewUringIoQueue(options);
  if (uring.ok() || engine == Engine::kUring || !uring.status().IsNotSupported()) return uring;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    Log(LogLevel::kWarning, "io_uring is unavailable (" + uring.status().ToString() +
                                "); asynchronous I/O falls back to a thread pool, which is slower");
  }
  return NewThreadPoolIoQueue(options);
}

}  // namespace internal
}  // namespace lifeline
