// The persist pipeline: one thread per Checkpointer that takes saves in the order they were
// started and makes each durable: prepare the step directory, write the data file (straight from
// the staging slot with direct I/O as blocks finish copying, or encoded chunk by chunk when a codec
// is on, or streamed from the caller's memory when the snapshot was too large to stage), sync,
// publish the rank index, and commit when this rank completes the set.
//
// Thread safety: Submit and Flush may be called from any thread.
#ifndef LIFELINE_SRC_PERSIST_PIPELINE_H_
#define LIFELINE_SRC_PERSIST_PIPELINE_H_

#include <functional>
#include <memory>
#include <string>

#include "lib/src/save/save_job.h"
#include "lib/src/env/serial_worker.h"
#include "lib/src/save/staging_arena.h"
#include "lib/src/save/checkpoint_writer.h"
#include "lifeline/env.h"

namespace lifeline {

struct PersistConfig {
  RankWriterConfig writer;
  unsigned queue_depth = 16;
  bool register_buffers = true;
  int nice_levels = 0;  // the pipeline thread's priority below its creator's
};

class PersistPipeline {
 public:
  // `arena` may be null (nothing is staged). `after_persist` runs on the pipeline's thread after a
  // job is persisted (e.g. to queue its drain).
  PersistPipeline(Env* env, PersistConfig config, StagingArena* arena,
                  std::function<void(internal::SaveJob&)> after_persist);
  // Persists everything submitted, then stops.
  ~PersistPipeline() = default;
  PersistPipeline(const PersistPipeline&) = delete;
  PersistPipeline& operator=(const PersistPipeline&) = delete;

  void Submit(std::shared_ptr<internal::SaveJob> job) { worker_.Submit(std::move(job)); }
  // Waits until every job submitted so far is finished; the first error among those not yet
  // reported by an earlier Flush (skipped saves are not errors).
  Status Flush() { return worker_.Flush(); }

 private:
  void Persist(internal::SaveJob& job);
  // Writes the staged image to `path` (the writer's data file) straight from the slot, block by
  // block as the copy finishes each; returns the padded file size.
  Result<uint64_t> WriteImage(internal::SaveJob& job, const std::string& path);
  void RenewRegistration();

  Env* const env_;
  const PersistConfig config_;
  StagingArena* const arena_;
  const std::function<void(internal::SaveJob&)> after_persist_;

  std::unique_ptr<IoQueue> queue_;  // only the pipeline thread uses it
  std::vector<std::pair<void*, size_t>> registered_;
  uint64_t registered_generation_ = ~0ull;
  bool registration_refused_ = false;

  SerialWorker<std::shared_ptr<internal::SaveJob>> worker_;  // last: its thread uses the above
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_PERSIST_PIPELINE_H_
