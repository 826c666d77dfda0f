// Multi-level checkpointing: copies each committed checkpoint, rank by rank, from the checkpoint
// directory to a second directory (typically a shared file system) in the background, and commits
// it there by the same protocol, with its own retention. A step is drained only once it is
// committed in the first directory; one that is still not committed when a newer step is waiting
// is skipped (the newer one supersedes it).
//
// Thread safety: Enqueue and Flush may be called from any thread.
#ifndef LIFELINE_SRC_DRAINER_H_
#define LIFELINE_SRC_DRAINER_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "lib/src/save/checkpoint_writer.h"
#include "lib/src/env/serial_worker.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

struct DrainConfig {
  std::string source_root;
  RankWriterConfig writer;  // writer.root: the directory drained into
  uint64_t buffer_bytes = 8ull << 20;  // per copy lane: 1 lane, or 8 (parts in flight) into an object store
  double commit_timeout_seconds = 1800;  // how long to wait for the other ranks to commit a step
  int nice_levels = 0;                   // the drain thread's priority below its creator's
};

class Drainer {
 public:
  Drainer(Env* env, DrainConfig config);
  // Drains what is queued and committed; skips steps still waiting for other ranks.
  ~Drainer() = default;
  Drainer(const Drainer&) = delete;
  Drainer& operator=(const Drainer&) = delete;

  // Queues this rank's files of `step` (the data file and `encoded_index`, its rank index).
  void Enqueue(uint64_t step, std::string encoded_index) { worker_.Submit(Item{step, std::move(encoded_index)}); }
  // Waits until everything queued so far is drained or skipped; the first error since the last Flush.
  Status Flush() { return worker_.Flush(); }
  // Steps drained by this rank so far (for tests and metrics).
  uint64_t drained() const { return drained_.load(); }

 private:
  struct Item {
    uint64_t step = 0;
    std::string index;
  };
  Status Drain(const Item& item);
  // Copies `from` to `to`, which must hold exactly `size` bytes (the size its index records).
  Status CopyFile(const std::string& from, const std::string& to, uint64_t size);

  Env* const env_;
  const DrainConfig config_;
  std::atomic<uint64_t> drained_{0};
  SerialWorker<Item> worker_;  // last: its thread uses the above
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_DRAINER_H_
