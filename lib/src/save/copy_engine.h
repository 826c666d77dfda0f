// The threads that copy snapshots into the staging arena. Jobs are served in the order they were
// submitted; every thread works on the oldest job until all its pieces are claimed. A piece is
// copied in cache-sized steps and hashed right after each step, while it is still in cache, so the
// checksum costs no second pass over memory.
//
// Thread safety: Submit may be called from any thread.
#ifndef LIFELINE_SRC_COPY_ENGINE_H_
#define LIFELINE_SRC_COPY_ENGINE_H_

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lib/src/save/save_job.h"
#include "lifeline/internal/copy_kernel.h"  // CopyAndHash

namespace lifeline {

class CopyEngine {
 public:
  // The threads run `nice_levels` below their creator's priority (see thread_priority.h).
  CopyEngine(unsigned threads, int nice_levels);
  // Finishes every submitted job first.
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  void Submit(std::shared_ptr<internal::SaveJob> job);
  unsigned threads() const { return static_cast<unsigned>(threads_.size()); }

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable work_;
  std::deque<std::shared_ptr<internal::SaveJob>> jobs_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                                // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_COPY_ENGINE_H_
