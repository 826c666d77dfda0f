// A thread that runs one function on each submitted item, in submission order: the shape of the
// persist pipeline and of the drainer.
//
// Thread safety: Submit, Flush and Pending may be called from any thread.
#ifndef LIFELINE_SRC_SERIAL_WORKER_H_
#define LIFELINE_SRC_SERIAL_WORKER_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "lib/src/env/thread_priority.h"
#include "lifeline/status.h"

namespace lifeline {

template <typename Item>
class SerialWorker {
 public:
  // `work`'s failures are kept for Flush, except Unavailable (work deliberately not done).
  // The thread runs `nice_levels` below its creator's priority (see thread_priority.h).
  explicit SerialWorker(std::function<Status(Item&)> work, int nice_levels = 0) : work_(std::move(work)) {
    thread_ = std::thread([this, nice_levels] {
      LowerCallingThreadPriority(nice_levels);
      Run();
    });
  }
  // Runs everything submitted, then stops.
  ~SerialWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  void Submit(Item item) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      items_.push_back(std::move(item));
      ++submitted_;
    }
    cv_.notify_all();
  }

  // Waits until every item submitted so far is done; the first failure not yet reported.
  Status Flush() {
    std::unique_lock<std::mutex> lock(mu_);
    const size_t target = submitted_;
    cv_.wait(lock, [&] { return done_ >= target; });
    Status s = std::move(unreported_);
    unreported_ = Status::OK();
    return s;
  }

  // Items waiting behind the current one, or the worker is being stopped: for work that may give
  // way to what comes next.
  bool Pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_ || !items_.empty();
  }

 private:
  void Run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
        if (items_.empty()) return;
        item = std::move(items_.front());
        items_.pop_front();
      }
      Status s = work_(item);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!s.ok() && !s.IsUnavailable() && unreported_.ok()) unreported_ = s;
        ++done_;
      }
      cv_.notify_all();
    }
  }

  const std::function<Status(Item&)> work_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;          // GUARDED_BY(mu_)
  size_t submitted_ = 0, done_ = 0;  // GUARDED_BY(mu_)
  Status unreported_;               // GUARDED_BY(mu_)
  bool stopping_ = false;           // GUARDED_BY(mu_)
  std::thread thread_;              // last: started once everything above exists
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_SERIAL_WORKER_H_
