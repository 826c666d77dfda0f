// Part of the declared internal interface (lifeline/internal/): for Lifeline's own binaries, not users.
// IoPump: the library's one submit/reap loop over an IoQueue (lifeline/env.h). Its saves and loads
// drive their queues with it; `lifeline bench` measures the disk's limits with the same loop, so
// that the limit and the library's figures come from one engine.
#ifndef LIFELINE_INTERNAL_IO_PUMP_H_
#define LIFELINE_INTERNAL_IO_PUMP_H_

#include <cstddef>
#include <functional>
#include <vector>

#include "lifeline/env.h"

namespace lifeline {

// Keeps one IoQueue busy for one thread. The queue does each transfer whole (short transfers
// re-queued, EAGAIN retried; io_uring or its thread-pool fallback, as Env::NewIoQueue chose); the
// pump waits for room before a submit, hands every completion to the caller, keeps the first
// failure, and drains before the caller's buffers may be freed.
//
// Failures: after the first one (a transfer's, the queue's, or the caller's own through Fail) the
// pump submits nothing more and its calls return that failure; transfers already in flight still
// complete and still reach on_complete, so the caller gets its buffers back. A queue whose Reap
// fails is unusable: the pump stops waiting on it (broken()), and its owner must destroy it (the
// destructor waits for the kernel) before any buffer it was given is freed.
//
// Declare the pump after the buffers it transfers and after its queue, so that it is destroyed
// first: its destructor drains.
//
// Not thread-safe: one thread uses a pump, and its queue, at a time.
class IoPump {
 public:
  // Called for every completed transfer, failed or not, on the thread inside the pump's call, after
  // a failure is recorded in status(). It must not call back into the pump.
  using OnComplete = std::function<void(const IoCompletion&)>;

  explicit IoPump(IoQueue* queue, OnComplete on_complete = nullptr);
  ~IoPump();
  IoPump(const IoPump&) = delete;
  IoPump& operator=(const IoPump&) = delete;

  // Starts `request`, first waiting for completions while the queue is full. Returns status():
  // not OK means nothing was submitted.
  Status Submit(const IoRequest& request);
  // Waits for at least one completion if any transfer is pending. Returns status().
  Status WaitSome();
  // Waits for every pending transfer, failed or not. Returns status().
  Status Drain();
  // Records a failure of the caller's own (a checksum mismatch in what was read, a cancelled save):
  // nothing more is submitted. The first failure wins.
  void Fail(const Status& failure);

  const Status& status() const { return first_error_; }
  // Transfers still to be handed to on_complete; 0 once the queue is broken.
  size_t pending() const { return broken_ ? 0 : queue_->in_flight(); }
  bool has_room() const { return queue_->in_flight() < queue_->depth(); }
  // The queue failed as a whole; it must be destroyed, not used again.
  bool broken() const { return broken_; }

 private:
  void Reap(size_t min_completions);

  IoQueue* queue_;
  OnComplete on_complete_;
  std::vector<IoCompletion> completions_;
  Status first_error_;
  bool broken_ = false;
};

}  // namespace lifeline

#endif  // LIFELINE_INTERNAL_IO_PUMP_H_
