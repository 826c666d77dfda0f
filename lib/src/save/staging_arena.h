// The host staging arena: page-aligned memory where snapshots are copied before they are
// persisted. It is made of a fixed number of slots, each holding one snapshot and kept (grown only
// when a larger snapshot arrives) for the next one, so steady-state checkpoints allocate nothing.
// A slot is anonymous memory, or a file in shared memory (the memory tier) whose pages outlive the
// process that filled them.
#ifndef LIFELINE_SRC_STAGING_ARENA_H_
#define LIFELINE_SRC_STAGING_ARENA_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lifeline/internal/shared_memory.h"
#include "lifeline/status.h"

namespace lifeline {

// Page-aligned memory, anonymous or backed by a shared-memory file. Not thread-safe.
class StagingSlot {
 public:
  // `shm_path` empty: anonymous memory. Otherwise a file created 0600 at that path.
  explicit StagingSlot(std::string shm_path) : shm_path_(std::move(shm_path)) {}
  ~StagingSlot();
  StagingSlot(const StagingSlot&) = delete;
  StagingSlot& operator=(const StagingSlot&) = delete;

  // Makes capacity() >= bytes (rounded up to 2 MiB), discarding the contents when it grows. Shared
  // memory is reserved up front (fallocate), so a full /dev/shm is ResourceExhausted here rather
  // than a SIGBUS in a copy thread later.
  Status Reserve(uint64_t bytes);
  // Faults every page of the slot in now (writing zeros to pages not yet present), so the first
  // snapshot copied into it runs at memory speed. On a virtual machine the first touch of fresh
  // memory can cost more than a second per GiB.
  void Prefault();
  // Unmaps and, for a shared-memory slot, unlinks the file.
  void Release(bool unlink_file);

  uint8_t* data() const { return region_.data(); }
  uint64_t capacity() const { return region_.size(); }
  const std::string& shm_path() const { return shm_path_; }

 private:
  std::string shm_path_;
  OwnedFd fd_;
  MappedRegion region_;
};

// A fixed set of slots shared by the saves of one Checkpointer. Safe for concurrent use.
class StagingArena {
 public:
  // `shm_paths`: one path per slot for shared-memory slots, or empty for anonymous ones.
  StagingArena(unsigned slots, uint64_t budget_bytes, std::vector<std::string> shm_paths);
  ~StagingArena();

  // The largest snapshot a slot may hold: budget / slots, page-aligned.
  uint64_t slot_limit() const { return slot_limit_; }

  // A free slot, preferring the one whose snapshot is oldest (so the newest stays in the memory
  // tier), or nullopt when every slot is busy and `wait` is false. With `wait`, blocks until one
  // is released.
  std::optional<unsigned> Acquire(bool wait);
  void Release(unsigned slot);
  // The step whose snapshot slot `i` holds (set when it was acquired for it), if any.
  void SetStep(unsigned slot, uint64_t step);
  std::optional<uint64_t> StepOf(unsigned slot) const;
  // The oldest step still being persisted from a slot (to explain a skipped save).
  std::optional<uint64_t> OldestBusyStep() const;

  // Grows slot `i` (held by the caller) to at least `bytes`; see StagingSlot::Reserve.
  Status Reserve(unsigned i, uint64_t bytes);
  // Grows every slot to at least `bytes` and faults its pages in, waiting for busy slots to be
  // released. Leaves the slots' order and steps as they were.
  Status Prepare(uint64_t bytes);
  // Only the holder of an acquired slot touches its memory.
  uint8_t* data(unsigned i) const { return slots_[i]->data(); }
  uint64_t capacity(unsigned i) const { return slots_[i]->capacity(); }
  const std::string& shm_path(unsigned i) const { return slots_[i]->shm_path(); }
  // Unmaps every slot, unlinking shared-memory files when asked. Call with no slot held.
  void ReleaseAll(bool unlink_files);
  unsigned num_slots() const { return static_cast<unsigned>(slots_.size()); }

  // For registering the slots with an I/O queue: {data, capacity} of every allocated slot, and a
  // number that changes whenever that list may have changed.
  std::vector<std::pair<void*, size_t>> Regions() const;
  uint64_t generation() const;

 private:
  const uint64_t slot_limit_;
  std::vector<std::unique_ptr<StagingSlot>> slots_;
  mutable std::mutex mu_;
  std::condition_variable released_;
  std::vector<bool> busy_;                     // GUARDED_BY(mu_)
  std::vector<std::optional<uint64_t>> step_;  // GUARDED_BY(mu_)
  std::vector<uint64_t> last_use_;             // GUARDED_BY(mu_): acquisition order
  uint64_t uses_ = 0;                          // GUARDED_BY(mu_)
  uint64_t generation_ = 0;                    // GUARDED_BY(mu_): bumped when a slot moves
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_STAGING_ARENA_H_
