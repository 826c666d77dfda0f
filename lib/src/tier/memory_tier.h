// The memory tier: snapshots kept in shared memory on this node, laid out exactly like a checkpoint
// directory (step-N/ with data files, rank indexes and a manifest), so the ordinary reader loads
// from it and verifies every checksum. Data files are hard links to the staging slots' shared-memory
// files, so publishing a snapshot copies nothing.
//
//   <root>/slots/H.rRRRRRR-of-WWWWWW.slotK   the staging slots of rank R of attempt H
//   <root>/step-N/...                        published snapshots (commit protocol of SPEC.md)
//
// Retention: each rank keeps at most one snapshot per staging slot; reusing a slot withdraws the
// snapshot it held (index first). When a newer step completes, older complete steps beyond the
// number of slots, and older partial ones, are removed. Slot files of other attempts (a process
// that was killed) are unlinked when a new attempt opens the tier; their pages live on, through the
// step directories' links, until retention removes those steps.
//
// The root lives on the real file system (Env::Default()): it is this node's memory, whatever Env
// the checkpoint directory uses. It is created 0700 and refused if another user owns it.
//
// Thread safety: safe for concurrent use; different ranks (processes) share a root.
#ifndef LIFELINE_SRC_MEMORY_TIER_H_
#define LIFELINE_SRC_MEMORY_TIER_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

class MemoryTier {
 public:
  // `root` empty: DefaultMemoryTierRoot(checkpoint_dir, dir_id), where dir_id is
  // CheckpointDirectoryId(checkpoint_dir); the root records which directory it belongs to, and
  // roots left behind by an earlier directory of the same path (deleted and created again) are
  // removed.
  static Result<std::unique_ptr<MemoryTier>> Open(std::string root, const std::string& checkpoint_dir,
                                                  const std::string& dir_id, std::string run_hash, uint32_t rank, uint32_t world_size,
                                                  unsigned slots);
  // The tier of a Checkpointer on `checkpoint_dir` (through `env`): Open, with the directory's
  // identity created first when `root` is empty. Null, after one logged warning, when the identity
  // does not exist and cannot be created (a read-only directory): such a directory can have no
  // snapshots in memory, and loads from it read the disk. Corruption of an existing identity and
  // the errors of Open are returned.
  static Result<std::unique_ptr<MemoryTier>> OpenFor(Env* env, std::string root, const std::string& checkpoint_dir,
                                                     std::string run_hash, uint32_t rank, uint32_t world_size,
                                                     unsigned slots);

  // The tier at `root` as it is, for loads: nothing is created or removed, and it has no slots.
  static std::unique_ptr<MemoryTier> Existing(std::string root, uint32_t rank, uint32_t world_size);

  const std::string& root() const { return root_; }
  Env* env() const { return env_; }
  // The shared-memory file behind staging slot k of this rank.
  std::string SlotPath(unsigned k) const;

  // Removes this rank's snapshot of `step` (its index first, then its data link).
  Status Withdraw(uint64_t step);
  // Removes what earlier launches (other run hashes) left of `step`: a launch that was killed never
  // withdrew its snapshots. For a step durable on disk, when this rank closes.
  Status WithdrawEarlierLaunches(uint64_t step);
  // Publishes slot k as this rank's snapshot of `step`, described by `encoded_index`; the rank that
  // completes the step writes its manifest and applies the tier's retention.
  Status Publish(uint64_t step, unsigned slot, std::string_view encoded_index);
  // Unlinks this rank's slot files (their memory is freed once no step links to them).
  void RemoveSlotFiles();
  // Records that this rank's snapshot of `step` is on disk too (its disk index is published), so
  // that once the step is deleted from the disk the tier no longer offers it (ListTierSteps).
  Status MarkOnDisk(uint64_t step);
  // Removes the snapshots ListTierSteps leaves out (deleted from `checkpoint_dir` after their disk
  // copy was made), so that a new save of their step can take their place. OpenFor calls it.
  void PruneStepsDeletedFrom(Env* env, const std::string& checkpoint_dir);
  // Removes a default root (not one the caller named) when nothing is left in it (no step, no
  // slot of any rank): an orderly end leaves no folder behind. Best effort.
  void RemoveRootIfEmpty();

  Result<std::vector<CheckpointInfo>> List() const;

 private:
  MemoryTier(std::string root, bool default_root, std::string run_hash, uint32_t rank, uint32_t world_size,
             unsigned slots);
  Status RemoveStaleSlots();

  Env* const env_;
  const std::string root_;
  const bool default_root_;
  const std::string run_hash_;
  const uint32_t rank_;
  const uint32_t world_size_;
  const unsigned slots_;
  // One publication or withdrawal at a time in this process: the retention a publication applies
  // removes a partial step older than the newest loadable one, which a step being published by
  // another copy thread at that moment is (it lost step 1 from the tier when steps 1 and 2
  // completed their copies together).
  std::mutex publish_mu_;
};

// The steps of memory-tier `root` that still belong to `checkpoint_dir` (read through `env`), newest
// first, as ScanCheckpoints lists them. A snapshot that was also written to the disk (MarkOnDisk)
// but whose step directory is gone from `checkpoint_dir` was deleted there, by a user or by
// retention, and is left out: deleted steps never come back from memory. One never written to the
// disk (the process died first) stays: that is what the tier is for.
Result<std::vector<CheckpointInfo>> ListTierSteps(Env* env, const std::string& checkpoint_dir, const std::string& root);

// Whether a tier step directory holds a rank's MarkOnDisk record.
bool TierStepWasOnDisk(const std::vector<std::string>& step_dir_children);

// The identity of a checkpoint directory: the 32 hex digits in <dir>/lifeline.id. With `create`,
// the first caller writes a random one (atomically; concurrent ranks all end up with the winner's).
// NotFound when the file is absent and !create; Corruption naming the file when it is malformed.
// The memory tier is keyed by it, so a directory deleted and created again under the same path
// never sees the old directory's snapshots.
Result<std::string> CheckpointDirectoryId(Env* env, const std::string& checkpoint_dir, bool create);

// The environment variable that moves the memory tier off /dev/shm for this process: an absolute
// directory (created when missing). Several agents on one machine given different ones behave as
// separate nodes, each with a memory tier of its own.
inline constexpr char kMemoryTierDirVariable[] = "LIFELINE_MEMORY_TIER_DIR";

// Where memory tiers live for this process: $LIFELINE_MEMORY_TIER_DIR when set, else /dev/shm.
// InvalidArgument naming the variable when it is not an absolute path.
Result<std::string> MemoryTierFileSystem();

// The default root for a checkpoint directory of identity `dir_id`:
// <MemoryTierFileSystem()>/lifeline-<uid>/<16 hex of XXH3-64 of (real path, NUL, dir_id)>.
Result<std::string> DefaultMemoryTierRoot(const std::string& checkpoint_dir, std::string_view dir_id);

// <MemoryTierFileSystem()>/lifeline-<uid>, created (the user's part private) when missing.
Result<std::string> MemoryTierUserDir();

// The default root of `checkpoint_dir` (identity `dir_id`), created private with its owner file,
// and the roots of an earlier directory at the same path removed.
Result<std::string> CreateDefaultMemoryTierRoot(const std::string& checkpoint_dir, const std::string& dir_id);

// The memory tier of `checkpoint_dir` on this node if there is one (for tools): its root, or
// NotFound when the directory has no identity yet or nothing in memory.
Result<std::string> FindMemoryTierRoot(Env* env, const std::string& checkpoint_dir);

}  // namespace lifeline

#endif  // LIFELINE_SRC_MEMORY_TIER_H_
