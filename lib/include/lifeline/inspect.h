// Inspecting and tidying checkpoint directories without a Checkpointer: what `lifeline inspect`,
// `lifeline ls` and `lifeline gc` show and do, for any tool that wants the same.
//
//   auto listing = lifeline::ListCheckpoints("/ckpt");          // disk and memory tier
//   auto desc = lifeline::DescribeCheckpoint("/ckpt", std::nullopt);  // newest complete step
//   lifeline::RetentionOptions keep;
//   keep.keep_last = 2;
//   auto plan = lifeline::PlanRetention("/ckpt", keep);     // what `lifeline gc --keep 2` removes
//
// Every function takes an Env (nullptr: Env::Routing(), local or s3://); none writes anything except
// ApplyRetention. Errors name the directory, step or file involved.
//
// Thread safety: the functions share no state; the values they return are plain data.
#ifndef LIFELINE_INSPECT_H_
#define LIFELINE_INSPECT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/dtype.h"
#include "lifeline/env.h"
#include "lifeline/export.h"
#include "lifeline/status.h"

namespace lifeline {

// ---- one checkpoint's contents -------------------------------------------------------------------

struct LIFELINE_EXPORT TensorDescription {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // global shape
  uint64_t fragments = 0;      // stored pieces, over all ranks
  uint64_t bytes = 0;          // raw bytes of those pieces (replicas stored once)
  uint64_t stored_bytes = 0;   // after the codec
};

// Where one stored piece of a tensor lies.
struct LIFELINE_EXPORT FragmentDescription {
  std::string tensor;           // "?" when the index names a tensor out of range
  std::string file;             // "?" likewise
  uint64_t offset = 0;          // byte offset of its first chunk in the file
  uint64_t stored_length = 0;   // bytes of its chunks as stored
  uint64_t chunks = 0;
  std::string codec;            // "none", "zstd" or "zstd-bytegroup"
  std::vector<int64_t> region_offsets;  // box origin in the global tensor
  std::vector<int64_t> region_shape;    // box extent
  int64_t flat_begin = 0;       // row-major element range [flat_begin, flat_end) inside the box
  int64_t flat_end = 0;
};

struct LIFELINE_EXPORT ObjectDescription {
  std::string name;
  uint32_t rank = 0;
  uint64_t length = 0;
};

struct LIFELINE_EXPORT FileDescription {
  std::string name;
  uint32_t rank = 0;  // the rank that wrote it
  uint64_t size = 0;
};

struct LIFELINE_EXPORT CheckpointDescription {
  uint64_t step = 0;
  std::string directory;  // the step directory
  std::string run_id;
  uint32_t world_size = 0;
  uint64_t chunk_bytes = 0;
  uint64_t created_unix_ns = 0;
  std::string metadata_json;  // the saver's metadata, empty when none
  uint64_t chunks = 0;
  std::vector<TensorDescription> tensors;      // in the manifest's order
  std::vector<FragmentDescription> fragments;  // every one, in the manifest's order
  std::vector<ObjectDescription> objects;
  std::vector<FileDescription> files;

  uint64_t tensor_bytes() const;  // sum of the tensors' bytes
  uint64_t stored_bytes() const;  // sum of the tensors' stored_bytes
};

// A shape or coordinates as `lifeline inspect` and the library's messages write them: "[2, 3]".
LIFELINE_EXPORT std::string ShapeText(const std::vector<int64_t>& shape);

// Opens step `step` under `root` (the newest complete one when empty) and describes it from its
// metadata; no tensor data is read. NotFound when the step does not exist or is not complete,
// Corruption when its indexes are damaged (as Checkpointer::Load would fail).
LIFELINE_EXPORT Result<CheckpointDescription> DescribeCheckpoint(const std::string& root,
                                                                 std::optional<uint64_t> step,
                                                                 Env* env = nullptr);

// ---- listing -------------------------------------------------------------------------------------

enum class CheckpointState {
  kComplete,  // loadable as far as its metadata tells
  kPartial,   // some rank indexes missing (a save in progress, or one that died)
  kInvalid,   // every index present but never loadable (they disagree)
  kDamaged,   // every index present, but the metadata does not decode or does not cover the tensors
  kSuspect,   // complete, but marked suspect: its data-parallel replicas differed (never resumed from)
};

// The state of a scanned step. A damaged step is one whose `problem` starts "damaged" or
// "cannot be loaded" (as ListCheckpoints and the retention plan mark them).
LIFELINE_EXPORT CheckpointState CheckpointStateOf(const CheckpointInfo& info);
// "complete", "partial", "invalid", "damaged" or "suspect".
LIFELINE_EXPORT const char* CheckpointStateName(CheckpointState state);

struct LIFELINE_EXPORT ListedCheckpoint {
  CheckpointInfo info;
  bool in_memory_tier = false;  // in this node's memory tier rather than on disk
  uint32_t replicated_ranks = 0;  // ranks of this step held in peers' memory, by the agents' records (DIR/.replicas)
};

struct LIFELINE_EXPORT CheckpointListing {
  // Newest step first; for one step, the disk copy before the memory-tier one.
  std::vector<ListedCheckpoint> checkpoints;
  std::string memory_tier;  // the memory tier's root, empty when `dir` has none on this node
};

// Every step directory of `dir` and of its memory tier. A complete step whose metadata fails
// CheckCheckpointMetadata is listed not complete, its problem "damaged: <why>". Data checksums
// are not read (VerifyCheckpoint does). An unreadable memory tier is left out; an unreadable
// `dir` is an error. Every row's replicated_ranks counts the ranks of its step (of its world size)
// that the agents' records in `dir` say some peer node holds in memory; records that cannot be
// read count nothing.
LIFELINE_EXPORT Result<CheckpointListing> ListCheckpoints(const std::string& dir, Env* env = nullptr);

// ---- retention -----------------------------------------------------------------------------------

struct LIFELINE_EXPORT RetentionOptions {
  // Complete, loadable steps kept (the newest ones); 0 keeps every complete step.
  uint32_t keep_last = 0;
  // A step counts as loadable only when VerifyCheckpoint finds no damage (every checksum read),
  // so damage in a newer step never costs the older good one; false: CheckCheckpointMetadata only.
  bool verify = true;
  // Also remove partial steps newer than the newest loadable one (otherwise kept: a save may still
  // be writing them). ApplyRetention refuses it (FailedPrecondition naming the launch) while a job
  // holds the directory's save lock, that is while one is saving there, unless even_while_saving.
  bool remove_partial = false;
  bool even_while_saving = false;
  // Set to the run id of a launch that is saving into `root` (CheckpointerOptions::run_id): partial
  // steps newer than the newest loadable one that hold rank indexes of other launches and no file
  // of this one are removed too (they can never complete): what that launch's own retention does
  // after each save. Empty: no such rule.
  std::string saving_run_id;
};

struct LIFELINE_EXPORT RetentionDecision {
  // As scanned; a complete step found not loadable is marked not complete, the reason its problem.
  CheckpointInfo info;
  bool remove = false;
};

// What ApplyRetention would remove under `root`, newest step first; touches nothing. Removed:
// invalid steps; complete steps, loadable or not, beyond the newest keep_last loadable ones;
// partial steps older than the newest loadable one (and newer ones with remove_partial). The
// newest loadable step is never removed.
LIFELINE_EXPORT Result<std::vector<RetentionDecision>> PlanRetention(const std::string& root,
                                                                     const RetentionOptions& options,
                                                                     Env* env = nullptr);

// Removes what PlanRetention chooses (through Env::RemoveTree), each step made invisible first
// (one rank index before anything else), so an interrupted removal leaves a partial step, never
// a damaged complete one. A kept complete step also loses the files of other save attempts.
LIFELINE_EXPORT Status ApplyRetention(const std::string& root, const RetentionOptions& options, Env* env = nullptr);

// Removes every step of `root` (a checkpoint directory or a memory-tier root) newer than `step`
// (every step with nullopt), complete or partial, each made invisible first as ApplyRetention
// removes one. A rollback's (lifeline-agent): those steps may hold the damage it rolls back from,
// and the relaunched ranks save their step numbers again. Returns the steps removed, newest first.
// REQUIRES: no launch saving into `root` (its ranks stopped).
LIFELINE_EXPORT Result<std::vector<uint64_t>> RemoveStepsAfter(const std::string& root, std::optional<uint64_t> step,
                                                               Env* env = nullptr);

// The launch saving into checkpoint directory `dir` now, as its save lock (<dir>/lifeline.lock,
// held by rank 0 of the launch from its first save until it closes or dies) names it: "launch
// 'ID' (pid P on host H, since T)". nullopt when no job is saving there.
LIFELINE_EXPORT Result<std::optional<std::string>> DescribeSavingLaunch(const std::string& dir, Env* env = nullptr);

// What a launcher checks before it starts a job of id `job` saving into `dir`: OK when no launch
// is saving there, or when the one saving there is of that job (its processes' LIFELINE_JOB, as
// lifeline-agent sets it: another node's ranks of the same job). FailedPrecondition naming the
// directory and the other launch otherwise, the refusal that job's first save would meet. Other
// errors are those of reading the save lock.
LIFELINE_EXPORT Status CheckNoOtherJobSaving(const std::string& dir, const std::string& job, Env* env = nullptr);

// ---- this node's memory tiers --------------------------------------------------------------------

// One memory-tier root of this user on this node (under $LIFELINE_MEMORY_TIER_DIR or /dev/shm,
// lifeline-<uid>/): the snapshots kept in memory for one checkpoint directory.
struct LIFELINE_EXPORT MemoryTierRootInfo {
  std::string root;
  std::string checkpoint_dir;  // the directory it belongs to, as its owner file says ("" unknown)
  // "current": the directory exists with the identity the root was made for; "gone": it does
  // not exist on this node; "re-created": it exists with another identity (deleted and made
  // again); "unknown": the owner file is missing or unreadable.
  std::string state;
  bool in_use = false;     // a process of this node maps its staging slots (a job is running)
  uint64_t steps = 0;      // step directories held
  uint64_t offered = 0;    // of those, still offered for loads (not deleted from the disk)
  uint64_t bytes = 0;      // memory held, each file counted once (steps link the slots' pages)
};

// Every memory-tier root of this user on this node.
LIFELINE_EXPORT Result<std::vector<MemoryTierRootInfo>> ListMemoryTierRoots();

struct LIFELINE_EXPORT MemoryTierGcResult {
  std::vector<MemoryTierRootInfo> removed_roots;  // as they were before removal
  uint64_t steps_removed = 0;                     // from roots that stay
  uint64_t bytes_freed = 0;
};

// Frees memory-tier roots nobody can load from: roots whose directory is gone or re-created, or
// whose owner is unknown; in current roots, snapshots deleted from the disk, and the root itself
// once nothing offered is left. With `all`, also the snapshots still offered (a crashed job's
// resume point: its relaunch then reads the disk). Roots in use are never touched. `dry_run`:
// reports what would go.
LIFELINE_EXPORT Result<MemoryTierGcResult> CollectMemoryTierRoots(bool all, bool dry_run);

}  // namespace lifeline

#endif  // LIFELINE_INSPECT_H_
