// The persist pipeline: one thread per Checkpointer that takes saves in the order they were
// started and makes each durable: prepare the step directory, write the data file (straight from
// the staging slot with direct I/O as blocks finish copying, or encoded chunk by chunk when a codec
// is on, or streamed from the caller's memory when the snapshot was too large to stage), sync,
// publish the rank index, and commit when this rank completes the set.
//
// Thread safety: Submit and Flush may be called from any thread.
#ifndef LIFELINE_SRC_PERSIST_PIPELINE_H_
#define LIFELINE_SRC_PERSIST_PIPELINE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "lib/src/save_job.h"
#include "lib/src/staging_arena.h"
#include "lifeline/env.h"

namespace lifeline {

struct PersistConfig {
  std::string root;
  std::string run_hash;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t keep_last = 0;
  unsigned queue_depth = 16;
  bool direct_io = true;
  bool register_buffers = true;
};

class PersistPipeline {
 public:
  // `arena` may be null (nothing is staged). `after_persist` runs on the pipeline's thread after a
  // job is persisted (e.g. to queue its drain).
  PersistPipeline(Env* env, PersistConfig config, StagingArena* arena,
                  std::function<void(internal::SaveJob&)> after_persist);
  // Persists everything submitted, then stops.
  ~PersistPipeline();
  PersistPipeline(const PersistPipeline&) = delete;
  PersistPipeline& operator=(const PersistPipeline&) = delete;

  void Submit(std::shared_ptr<internal::SaveJob> job);
  // Waits until every job submitted so far is finished; the first error among those not yet
  // reported by an earlier Flush.
  Status Flush();

 private:
  void Run();
  void Persist(internal::SaveJob& job);
  Result<uint64_t> WriteImage(internal::SaveJob& job, const std::string& step_dir);
  void RenewRegistration();

  Env* const env_;
  const PersistConfig config_;
  StagingArena* const arena_;
  const std::function<void(internal::SaveJob&)> after_persist_;

  std::unique_ptr<IoQueue> queue_;  // only the pipeline thread uses it
  std::vector<std::pair<void*, size_t>> registered_;
  uint64_t registered_generation_ = ~0ull;
  bool registration_refused_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<internal::SaveJob>> jobs_;  // GUARDED_BY(mu_)
  size_t submitted_ = 0, finished_ = 0;                  // GUARDED_BY(mu_)
  Status unreported_;                                    // GUARDED_BY(mu_)
  bool stopping_ = false;                                // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_PERSIST_PIPELINE_H_
