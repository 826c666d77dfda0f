// The thread-pool IoQueue: workers call ReadAt/WriteAt on the request's file object, so it works
// for any Env's files (and goes through their fault injection or crash accounting).
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "lifeline/env.h"

namespace lifeline {
namespace {

Status ExecuteRequest(const IoRequest& r) {
  if (r.kind == IoRequest::Kind::kWrite) return r.writer->WriteAt(r.offset, r.buffer, r.length);
  return r.reader->ReadAt(r.offset, r.buffer, r.length);
}

class ThreadPoolIoQueue final : public IoQueue {
 public:
  explicit ThreadPoolIoQueue(const IoQueueOptions& options)
      : depth_(std::max(1u, options.depth)), pending_(depth_) {
    done_.reserve(depth_);
    const unsigned workers = std::clamp(options.threads, 1u, depth_);
    workers_.reserve(workers);
    for (unsigned i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  // Requests already submitted are carried out before the workers stop: their buffers belong to
  // the caller, who may free them as soon as the queue is gone.
  ~ThreadPoolIoQueue() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  Status Submit(const IoRequest& request) override {
    if (in_flight_ >= depth_) {
      return Status::ResourceExhausted("io queue", "all " + std::to_string(depth_) + " slots are in flight");
    }
    if (request.kind == IoRequest::Kind::kWrite ? request.writer == nullptr : request.reader == nullptr) {
      return Status::InvalidArgument("io queue", "request without a file");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_[(pending_head_ + pending_count_) % depth_] = request;
      ++pending_count_;
    }
    ++in_flight_;
    work_cv_.notify_one();
    return Status::OK();
  }

  Status Reap(size_t min_completions, std::vector<IoCompletion>* out) override {
    const size_t target = std::min(min_completions, in_flight_);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return done_.size() >= target; });
    for (IoCompletion& c : done_) out->push_back(std::move(c));
    in_flight_ -= done_.size();
    done_.clear();
    return Status::OK();
  }

  size_t in_flight() const override { return in_flight_; }
  unsigned depth() const override { return depth_; }
  const char* engine() const override { return "threads"; }

 private:
  void WorkerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stopping_ || pending_count_ > 0; });
      if (pending_count_ == 0) return;  // stopping, and nothing left to do
      const IoRequest request = pending_[pending_head_];
      pending_head_ = (pending_head_ + 1) % depth_;
      --pending_count_;
      lock.unlock();
      Status status = ExecuteRequest(request);
      lock.lock();
      done_.push_back(IoCompletion{request.tag, std::move(status)});
      done_cv_.notify_one();
    }
  }

  const unsigned depth_;
  size_t in_flight_ = 0;  // submitted and not yet reaped; touched only by the owning thread

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<IoRequest> pending_;  // ring of depth_ slots, preallocated
  size_t pending_head_ = 0;
  size_t pending_count_ = 0;
  std::vector<IoCompletion> done_;  // capacity depth_, so pushing never allocates
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoQueue> NewThreadPoolIoQueue(const IoQueueOptions& options) {
  return std::make_unique<ThreadPoolIoQueue>(options);
}

}  // namespace lifeline
