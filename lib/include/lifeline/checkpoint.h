// Saving and loading sharded training state in Lifeline's universal format.
//
// Each rank describes the pieces of tensors it holds (TensorShard) and calls Save. Save returns a
// ticket at once: background threads copy the state into a host staging arena (computing the
// checksums in the same pass), then persist it with direct I/O. The training loop only has to wait
// for the copy, and only before it mutates the state:
//
//   lifeline::CheckpointerOptions opt;
//   opt.directory = "/ckpt/run7"; opt.rank = rank; opt.world_size = world;
//   auto ckpt = lifeline::Checkpointer::Open(opt);
//   lifeline::SaveRequest req;
//   req.tensors.push_back(lifeline::TensorShard::Box("w", DType::kBF16, {8192, 8192}, {4096, 0},
//                                                    {4096, 8192}, ptr));
//   lifeline::SaveTicket t = (*ckpt)->Save(step, req);
//   forward_backward();                      // reads the state while it is being copied
//   LL_RETURN_IF_ERROR(t.WaitSnapshot());    // before the optimizer writes it
//   optimizer_step();
//
// The checkpoint becomes visible, atomically, once every rank's index is durable. Any later job,
// with any world size and any sharding, loads it by describing the pieces it wants: the planner
// intersects them with what is stored and reads only the bytes needed, verifying every checksum.
//
// Thread safety: a Checkpointer is used by one thread at a time (external synchronisation); its
// background threads are its own. A SaveTicket may be used from any thread. Different
// Checkpointers, in one process or many, may save the same step concurrently: that is how ranks
// cooperate, through the file system alone.
#ifndef LIFELINE_CHECKPOINT_H_
#define LIFELINE_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lifeline/export.h"
#include "lifeline/dtype.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

// A piece of a global tensor held in this process's memory, packed row-major.
//
// Where it lies: the row-major element range [flat_begin, flat_end) of the box
// (offsets, shape) of the global tensor. The factories cover the usual cases:
//   Whole     the entire tensor
//   Box       an N-d block (tensor parallelism)
//   Flat      a range of the whole tensor flattened (ZeRO / FSDP flat parameters)
//   BoxFlat   a range of a block flattened (ZeRO over a tensor-parallel piece)
// Replica(i, n) marks it as copy i of n identical copies held by n ranks (data parallelism):
// it is written once, by a writer every rank computes alone.
struct LIFELINE_EXPORT TensorShard {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;  // box origin
  std::vector<int64_t> shape;    // box extent
  int64_t flat_begin = 0;
  int64_t flat_end = 0;          // exclusive
  uint32_t replica_index = 0;
  uint32_t replica_count = 1;
  // (flat_end - flat_begin) elements. Save reads it until the ticket's snapshot is complete (or,
  // per tensor, until TensorCopied); the caller keeps it alive and unchanged until then.
  void* data = nullptr;
  // Where `data` lives: host memory (-1, the default) or the memory of CUDA device `device`. A
  // device shard is snapshotted by the device's copy engine into pinned host staging, on a stream
  // of the library's, after the work queued so far on `stream` (the producer's cudaStream_t;
  // nullptr: the legacy default stream); SaveTicket::FenceOn orders the training stream after that
  // copy without blocking the CPU. Loads copy host to device. NotSupported in a build without CUDA.
  int device = -1;
  void* stream = nullptr;

  static TensorShard Whole(std::string name, DType dtype, std::vector<int64_t> shape, void* data);
  static TensorShard Box(std::string name, DType dtype, std::vector<int64_t> global_shape,
                         std::vector<int64_t> offsets, std::vector<int64_t> shape, void* data);
  static TensorShard Flat(std::string name, DType dtype, std::vector<int64_t> global_shape,
                          int64_t flat_begin, int64_t flat_end, void* data);
  static TensorShard BoxFlat(std::string name, DType dtype, std::vector<int64_t> global_shape,
                             std::vector<int64_t> offsets, std::vector<int64_t> shape,
                             int64_t flat_begin, int64_t flat_end, void* data);
  TensorShard& Replica(uint32_t index, uint32_t count) {
    replica_index = index;
    replica_count = count;
    return *this;
  }
  // Marks `data` as memory of CUDA device `device_index`, produced by work on `producer_stream`.
  TensorShard& OnDevice(int device_index, void* producer_stream = nullptr) {
    device = device_index;
    stream = producer_stream;
    return *this;
  }

  int64_t num_elements() const { return flat_end - flat_begin; }
  uint64_t num_bytes() const { return static_cast<uint64_t>(num_elements()) * DTypeSize(dtype); }
};

struct LIFELINE_EXPORT SaveRequest {
  std::vector<TensorShard> tensors;
  // Per-rank opaque values (RNG state, data-loader position), kept per saving rank. Names are
  // unique, 1 to 4096 bytes; names starting "rank<digits>/" are reserved (InvalidArgument).
  std::vector<std::pair<std::string, std::string>> objects;
  // The job's global metadata (JSON text). Rank 0's is the one kept.
  std::string metadata_json;
};

struct LIFELINE_EXPORT LoadRequest {
  // Where to put what: each target's data is filled with its region of the stored tensor.
  // Replica fields are ignored. A target not fully covered by the checkpoint fails the load.
  std::vector<TensorShard> tensors;
  // Whose per-rank objects to return: those saved by this rank of the saving job (by default this
  // Checkpointer's rank), under their saved names, whatever world size the checkpoint was saved
  // or converted to. A rank that saved none, or that the saving job never had (rank 6 of a 4-rank
  // save), gets no objects and no error: the caller decides whether that is a problem.
  std::optional<uint32_t> objects_of_rank;
};

// A checkpoint a load passed over (damaged, or unusable in the memory tier) before the one it loaded.
struct LIFELINE_EXPORT SkippedCheckpoint {
  uint64_t step = 0;
  std::string location;  // "memory" (the memory tier) or "disk"
  std::string reason;    // the error, naming the file, tensor or rank
};

// What a failed attempt to load one checkpoint means for a load that was not asked for a step by
// number: the one fallback rule, used by Checkpointer::Load and by the Python package's job-wide
// agreement (which passes the codes its ranks reported).
enum class LoadFailure {
  // NotInCheckpoint: the caller asked for a tensor the checkpoint lacks. Stop: an older step that
  // has it would silently resume the past.
  kMismatch,
  // Corruption (bytes that fail a check), NotFound (the step went meanwhile: retention) or
  // FailedPrecondition (a file Lifeline refuses to open, a link or FIFO planted in the step): try
  // the next older complete checkpoint, and report the one passed over.
  kDamage,
  // Anything else (the machine's trouble: IOError, ResourceExhausted, ...): stop on this storage;
  // only another medium (the disk after the memory tier) may be tried.
  kOther,
};
LIFELINE_EXPORT LoadFailure ClassifyLoadFailure(StatusCode code);

struct LIFELINE_EXPORT LoadResult {
  uint64_t step = 0;
  // Newer checkpoints that could not be loaded, newest first: a load that falls back says so here
  // (and to lifeline-agent, as a checkpoint anomaly), never only in a log line.
  std::vector<SkippedCheckpoint> skipped;
  uint32_t saved_world_size = 0;
  std::vector<std::pair<std::string, std::string>> objects;  // of LoadRequest::objects_of_rank
  std::string metadata_json;
  uint64_t bytes_read = 0;      // from storage, including alignment slack
  uint64_t bytes_scattered = 0; // into the targets
  bool from_memory_tier = false;
};

struct LIFELINE_EXPORT CheckpointInfo {
  uint64_t step = 0;
  bool complete = false;       // every rank's index is present (and, where checked, valid)
  // Every rank's index is present but the pieces cannot form a loadable checkpoint (overlaps or
  // holes; `problem` says which tensor and ranks): never loaded, removed by garbage collection.
  bool invalid = false;
  uint32_t world_size = 0;     // of the newest attempt found
  uint32_t ranks_present = 0;  // rank indexes found
  uint64_t bytes = 0;          // on disk
  uint64_t created_unix_ns = 0;
  std::string directory;       // path of the step directory
  std::string problem;         // why it is not complete, when it is not
  // Complete, but marked suspect (formats/SPEC.md §2, `suspect.json`: lifeline-agent found the
  // data-parallel replicas' copies differing at this step's snapshot): Load(latest), the agent's
  // resume choice and retention's count of loadable steps pass it over; Load(step) still reads it.
  bool suspect = false;
  std::string suspect_reason;  // the marker's message
};

// Reading checkpoint directories without a Checkpointer, for tools and the agent (`env` nullptr:
// Env::Routing(): a local path or an s3:// prefix). Nothing here writes.
//
// Every step directory under `root` (a checkpoint directory or a memory-tier root), newest first,
// complete or not.
LIFELINE_EXPORT Result<std::vector<CheckpointInfo>> ScanCheckpointDirectory(const std::string& root, Env* env = nullptr);
// OK when the complete step `info` is loadable as far as its metadata tells: every rank index (or
// the manifest) decodes and the pieces cover each tensor exactly once. Else the reason, naming the
// file, tensor or ranks. Data is not read (`lifeline verify` does that).
LIFELINE_EXPORT Status CheckCheckpointMetadata(const CheckpointInfo& info, Env* env = nullptr);
// Marks step `step` under `root` suspect: writes `json` (a JSON object, at most 64 KiB; SPEC §2)
// as the step directory's `suspect.json`, atomically, creating the step directory when the save has
// not yet. Used by lifeline-agent; a suspect step is never resumed from.
LIFELINE_EXPORT Status MarkStepSuspect(const std::string& root, uint64_t step, const std::string& json,
                                       Env* env = nullptr);
// The memory-tier root holding this node's snapshots of checkpoint directory `dir`; NotFound when
// it has none.
LIFELINE_EXPORT Result<std::string> FindMemoryTierOf(const std::string& dir, Env* env = nullptr);
// The step directories of that memory tier which still belong to `dir`, newest first: a snapshot
// whose disk copy was made and then deleted from `dir` (by a user or retention) is left out, so
// deleted steps never come back from memory. NotFound when `dir` has no tier on this node.
LIFELINE_EXPORT Result<std::vector<CheckpointInfo>> ScanMemoryTierOf(const std::string& dir, Env* env = nullptr);

// What VerifyCheckpoint checked, and `status`: OK, or the first damage found (naming the file,
// tensor, rank or offset).
struct LIFELINE_EXPORT VerifyResult {
  uint64_t step = 0;
  std::string directory;         // the step directory
  uint64_t indexes_checked = 0;  // rank indexes, plus the manifest when there is one
  uint64_t chunks_checked = 0;
  uint64_t objects_checked = 0;
  uint64_t bytes_checked = 0;    // with headers and padding
  // The step is marked suspect (CheckpointInfo::suspect): its bytes may be intact and still hold a
  // replica's silent corruption. `lifeline verify` fails on it.
  bool suspect = false;
  std::string suspect_reason;
  Status status;
};
// Checks every byte of step `step` under `root` (the newest complete one when empty): rank indexes
// and manifest agree, data file sizes, headers and padding, every chunk and object against its
// checksum, compressed chunks decode. An error when the step cannot be opened at all (NotFound,
// Corruption of its indexes); else the result, with the damage in `status`.
LIFELINE_EXPORT Result<VerifyResult> VerifyCheckpoint(const std::string& root, std::optional<uint64_t> step, Env* env = nullptr);

// How data files are encoded on disk. The memory tier always holds raw bytes.
enum class SaveCodec {
  kNone,
  kZstd,           // zstd per chunk
  kZstdByteGroup,  // bytes of each element grouped by significance, then zstd (floating point)
};

// The codec's name as the CLI, the Python options and `lifeline inspect` write it: "none", "zstd"
// or "zstd-bytegroup".
LIFELINE_EXPORT const char* SaveCodecName(SaveCodec codec);

// The codec named `name`: one of those names ("" is "none"; "zstd_bytegroup" and "bytegroup" are
// accepted too). InvalidArgument naming `name` and the choices otherwise.
LIFELINE_EXPORT Result<SaveCodec> ParseSaveCodec(std::string_view name);

// The chunk size a save uses when CheckpointerOptions::chunk_bytes is 0: 256 KiB for raw data (a
// load into another layout reads whole chunks, so small ones keep it near the bytes it needs, at no
// cost to full loads), 4 MiB with a codec (zstd on 256 KiB chunks stores about 15% more).
LIFELINE_EXPORT uint64_t DefaultChunkBytes(SaveCodec codec);

// What Save does when every staging slot still holds a checkpoint that is being persisted.
enum class BusyPolicy {
  // Block inside Save until the oldest one is persisted (counted as stall). With the memory tier
  // on and an object-store directory (s3://; CheckpointerOptions::supersede_waiting_saves), Save
  // first takes the slot of the oldest snapshot
  // whose persist has not begun: that save's ticket fails Aborted ("superseded by step N"), its
  // step is never published and leaves the tier, and training does not wait for a slow or
  // unreachable store; the tier holds the newest steps while the durable copy falls behind. It
  // waits only when every busy slot is still being copied or persisted. A disk directory keeps the
  // back-pressure: every save is persisted.
  kWait,
  kSkip,  // return at once with a ticket whose status is Unavailable, naming the busy step
};

struct LIFELINE_EXPORT CheckpointerOptions {
  std::string directory;         // the checkpoint root; created if missing
  uint32_t rank = 0;
  uint32_t world_size = 1;
  Env* env = nullptr;            // nullptr: Env::Routing() (a local path or s3://bucket/prefix)

  // Identifies this launch of the job: the same on every rank, new for every launch (a relaunch
  // after a failure included), so that a step can never be completed by ranks of two launches.
  // Empty: taken from the environment (LIFELINE_LAUNCH_ID from lifeline-agent; LIFELINE_JOB and
  // LIFELINE_RESTART; TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT unless the id is "none").
  // With none there and world_size 1, a random id; with world_size > 1, Save fails with
  // FailedPrecondition saying how to set one (loads work without).
  std::string run_id;

  // The step Load(latest) resumes from, fixed for the launch so that every rank loads the same one:
  // a step number, or "none" for a fresh start (Load(latest) is then NotFound). Empty: taken from
  // LIFELINE_RESUME_STEP, which lifeline-agent sets at every launch, when LIFELINE_RESUME_DIR (the
  // directory the agent computed it from) is unset or names `directory`; else no pin. The pin
  // holds until this Checkpointer saves a step; Load(step) is never affected.
  std::string resume_step;

  uint32_t keep_last = 0;                     // complete checkpoints kept; 0 keeps all
  // Checksum granularity, a multiple of 8; also the finest read of a load into another layout.
  // 0: 256 KiB when stored raw, 4 MiB with a codec (compressing small chunks costs ratio).
  uint64_t chunk_bytes = 0;
  uint64_t write_block_bytes = 8ull << 20;    // unit of a direct write; multiple of 4096
  uint64_t save_memory_budget = 64ull << 20;  // staging for writes in flight
  uint64_t load_memory_budget = 256ull << 20; // staging for reads in flight
  unsigned queue_depth = 16;                  // I/O requests in flight
  bool direct_io = true;                      // O_DIRECT for data files
  // A replicated fragment larger than this is split into replica_count equal parts, each written
  // by one replica; smaller ones are written whole by one replica chosen by hashing.
  uint64_t replica_split_bytes = 1ull << 20;
  // Store host shards split along their tensor's last dimension (tensor parallelism over columns)
  // as blocks of whole columns (up to 16 per shard, at least 256 bytes of a row each, for shards of
  // 64 KiB or more), so that a later load at another tensor-parallel degree reads the blocks it
  // needs rather than every stored row (TP2 x DP2 -> TP3 of `lifeline bench`: 1.47x -> 1.1x the
  // bytes it needs). The snapshot copies a shard's blocks in one pass over its rows, so they cost it
  // about what a straight copy does; the price is more fragments in the index (a block is one).
  // false: every shard stored as one fragment, row by row (what saves before this option did).
  bool column_blocks = true;
  // Data-parallel replicas must be bit-identical. Every staged snapshot digests each replicated
  // host shard on every replica (the parts other replicas write are read and hashed by the copy
  // threads, before the snapshot completes, never copied) and reports one 64-bit digest per shard
  // to lifeline-agent, which names a rank whose copy differs from the majority's (sdc_suspect)
  // and marks the step suspect. kAuto: when an agent listens (LIFELINE_AGENT); kOn: always (the
  // digests are then in SaveTicket::ReplicaDigests); kOff: never.
  enum class ReplicaDigests { kAuto, kOn, kOff };
  ReplicaDigests replica_digests = ReplicaDigests::kAuto;

  // ---- lazy snapshots: the host staging arena ----
  // Host memory for snapshots. The arena is divided into `staging_slots` slots, each sized to the
  // snapshot it holds and kept for the next one (no allocation per checkpoint in steady state). A
  // snapshot larger than budget / staging_slots is not staged: it is streamed to disk through
  // `save_memory_budget` of buffers, and its snapshot completes only when its data is on disk.
  uint64_t staging_budget_bytes = 32ull << 30;
  // Snapshots that may exist at once: 2 lets step N+1 be copied while step N is being persisted.
  unsigned staging_slots = 2;
  BusyPolicy busy_policy = BusyPolicy::kWait;
  // With the memory tier and BusyPolicy::kWait: whether a save that finds every slot busy takes the
  // slot of the oldest snapshot still waiting to be persisted rather than wait (see kWait).
  // nullopt: for an object-store directory (s3://), whose requests retry for up to a minute each
  // while it is away, and not for a disk, whose back-pressure keeps every save.
  std::optional<bool> supersede_waiting_saves;
  unsigned copy_threads = 2;  // threads copying state into the arena
  // The copy, persist and drain threads run this many nice levels below the thread that opened the
  // Checkpointer (capped at 19), so the training loop gets the CPU first when cores are scarce;
  // 0 leaves them at its priority.
  int background_nice = 10;

  // ---- the memory tier ----
  // Back the slots with named shared memory under `memory_tier_directory`, so that a restarted
  // process on this node loads the newest snapshot from memory even when its disk copy never
  // finished. Load prefers the memory tier when its newest complete step is at least as new as the
  // disk's. Needs every rank of the saved step in this node's tier: a single-node job's, or one
  // that lifeline-agent's replication completed with the other nodes' ranks.
  bool memory_tier = false;
  // Empty: /dev/shm/lifeline-<uid>/<hash of the checkpoint directory's real path and identity>,
  // or $LIFELINE_MEMORY_TIER_DIR/lifeline-<uid>/<hash> when that variable is set (an absolute path;
  // agents on one machine given different ones act as separate nodes).
  // The identity is a random id kept in <directory>/lifeline.id (written by the first rank), so a
  // directory that is deleted and created again never loads the old directory's snapshots. A
  // directory where it cannot be created (read-only) gets no memory tier, with one warning: loads
  // from it read the disk.
  std::string memory_tier_directory;
  // On orderly destruction, remove this rank's snapshots from the memory tier once they are durable
  // on disk (false keeps them, e.g. for a process that is about to be restarted on purpose).
  bool memory_tier_cleanup_on_close = true;
  // A Checkpointer that only loads (DCP's StorageReader, an evaluation job reading a training job's
  // directory): Save fails with FailedPrecondition; Open creates nothing (not the directory, its
  // identity, nor a memory tier) and claims nothing a saver of the directory owns (its tier's slot
  // files), and loads read this node's memory tier of the directory when there is one, whatever
  // `memory_tier` says.
  bool load_only = false;

  // ---- persistence ----
  SaveCodec codec = SaveCodec::kNone;  // per checkpoint; see formats/SPEC.md §12
  int codec_level = 1;                 // zstd level
  bool register_buffers = true;              // io_uring fixed buffers for the arena, when allowed

  // ---- multi-level: drain committed checkpoints to a second directory ----
  // Empty: off. Otherwise each committed checkpoint is copied in the background, rank by rank, into
  // this directory (typically a shared file system), committed there by the same protocol, and
  // kept there by its own retention.
  std::string drain_directory;
  uint32_t drain_keep_last = 0;  // 0 keeps all
};

enum class SavePhase {
  kCopying,     // the state is being copied into the staging arena (or streamed to disk)
  kPersisting,  // copied; the caller may mutate the state; being written to disk
  kPersisted,   // this rank's data and index are durable
  kCommitted,   // every rank's index is present: the checkpoint is visible (as far as known)
  kFailed,      // status() says why; nothing visible changed
  kSkipped,     // not taken (BusyPolicy::kSkip); status() is Unavailable and names the busy step
};

LIFELINE_EXPORT const char* SavePhaseName(SavePhase phase);

// What a save has done so far; a consistent copy, taken without blocking.
// Where the caller's time in one save went (SaveProgress::stall_breakdown): the parts of Save(),
// in order, and the waits for the snapshot. Their sum is stall_seconds.
struct LIFELINE_EXPORT SaveStallBreakdown {
  double plan_seconds = 0;    // checking the request; planning its fragments, layout, index and copy pieces
  double slot_seconds = 0;    // waiting for a free staging slot (saves coming faster than the disk takes them)
  double stage_seconds = 0;   // preparing the slot: its size, the memory tier's older step leaving it
  double submit_seconds = 0;  // handing the save to the copy and persist threads
  double wait_seconds = 0;    // WaitSnapshot and WaitTensor
};

struct LIFELINE_EXPORT SaveProgress {
  uint64_t step = 0;
  SavePhase phase = SavePhase::kCopying;
  Status status;                    // the first error, or OK
  uint64_t bytes_total = 0;         // raw bytes this rank writes (fragments and objects)
  uint64_t bytes_copied = 0;        // of bytes_total, copied into the arena so far
  uint64_t bytes_stored = 0;        // bytes of the data file on disk (after the codec), once persisted
  double stall_seconds = 0;         // time callers spent blocked in Save and WaitSnapshot/WaitTensor
  SaveStallBreakdown stall_breakdown;  // stall_seconds, part by part
  double snapshot_seconds = 0;      // from Save to the end of the copy
  double persist_seconds = 0;       // from Save to this rank's index being durable
  bool staged = true;               // false: too large for the arena, streamed straight to disk
  bool memory_tier = false;         // published to the memory tier
  // With the memory tier on, why this save is not in it ("" when it is, or is still being
  // copied): shared memory too small for its staging slot (a container's 64 MB /dev/shm), a
  // snapshot larger than a slot, a failed publication. A restart then reads the disk.
  std::string memory_tier_note;
};

namespace internal {
class SaveJob;
}

// A handle on one Save. Copyable; all copies refer to the same save. Safe for concurrent use.
// Destroying tickets never cancels a save: the Checkpointer finishes it (or its destructor waits).
class LIFELINE_EXPORT SaveTicket {
 public:
  SaveTicket() = default;  // refers to no save: every wait returns FailedPrecondition
  explicit SaveTicket(std::shared_ptr<internal::SaveJob> job) : job_(std::move(job)) {}

  uint64_t step() const;

  // Blocks until this rank's state has been copied; afterwards the caller may mutate it and the
  // checkpoint still holds the values at the time of Save. Returns the save's error if it failed
  // or was skipped (the state is then no longer read either).
  Status WaitSnapshot() const;
  // Per tensor: request.tensors[i] has been copied (or needs no copy on this rank), so it may be
  // mutated before the whole snapshot is done. Out-of-range i is InvalidArgument.
  Status WaitTensor(size_t i) const;
  bool TensorCopied(size_t i) const;

  // Device shards (TensorShard::device >= 0): makes `stream` (a cudaStream_t; nullptr is the
  // legacy default stream) wait on the GPU until this save's device-to-host copies have finished,
  // and returns at once: kernels queued on `stream` afterwards (the optimizer step) may overwrite
  // the device tensors, and the checkpoint still holds their values at Save. Host shards of the
  // same save still need WaitSnapshot/WaitTensor. OK with nothing to do when the save has no
  // device shard; the save's error when it failed before its copies were queued.
  Status FenceOn(void* stream) const;

  // Blocks until this rank's data and index are durable (or the save failed).
  Status WaitPersisted() const;
  // Blocks until every rank's index is present (the checkpoint is visible), polling the file
  // system; Aborted naming the missing ranks after `timeout_seconds`.
  Status WaitCommitted(double timeout_seconds) const;

  // Non-blocking.
  SaveProgress Progress() const;
  bool valid() const { return job_ != nullptr; }

  // This rank's digests of its replicated shards (CheckpointerOptions::replica_digests), once the
  // snapshot is complete (WaitSnapshot returned OK); empty before, for a save that computed none
  // (no replicated host shard, digests off, a snapshot streamed rather than staged), or failed.
  struct ReplicaDigest {
    std::string tensor;
    uint64_t key = 0;            // the shard's key, the same on every replica (formats/SPEC.md §7)
    uint32_t replica_count = 0;
    uint64_t bytes = 0;
    uint64_t digest = 0;
  };
  std::vector<ReplicaDigest> ReplicaDigests() const;

 private:
  std::shared_ptr<internal::SaveJob> job_;
};

// True when this liblifeline has the CUDA copy engine (built with the toolkit); device shards
// then need a visible CUDA device at run time.
LIFELINE_EXPORT bool CudaCopyEngineBuilt();

class LIFELINE_EXPORT Checkpointer {
 public:
  static Result<std::unique_ptr<Checkpointer>> Open(CheckpointerOptions options);
  // Waits for every save still in progress to be persisted (and drained), then, unless
  // memory_tier_cleanup_on_close is false, removes this rank's memory-tier snapshots that are
  // durable on disk.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Starts saving this rank's share of step `step` and returns at once (or, under
  // BusyPolicy::kWait, once a staging slot is free). The state is copied in the background; see
  // SaveTicket for what to wait for. Afterwards this rank's data and index are persisted and
  // published; the rank whose index completes the set writes the manifest and applies retention.
  // Errors (an invalid request, AlreadyExists when the step is committed, I/O failures) are
  // reported by the ticket. On failure nothing visible changes: earlier checkpoints are untouched
  // and this one stays invisible. Saves are persisted in the order they were started.
  SaveTicket Save(uint64_t step, const SaveRequest& request);

  // Sizes every staging slot for snapshots of `request` and faults its memory in now, blocking,
  // so that the first checkpoints of a run cost what later ones do (fresh memory's first touch is
  // slow: 1.3 s per GiB on this project's VM). Call it once at start-up with a request shaped like
  // the ones Save will get (its tensors' contents are not read). FailedPrecondition when such a
  // snapshot exceeds a slot and would be streamed instead.
  Status PrepareStaging(const SaveRequest& request);

  // Waits until step `step` is committed (every rank's index present), polling the file system.
  Status WaitForCommit(uint64_t step, double timeout_seconds);

  // Loads step `step`, or the newest complete checkpoint when empty, into the request's targets:
  // from the memory tier when it holds a complete checkpoint at least as new as the disk's newest
  // (checksums verified; damage falls back to disk), else from disk. NotFound when there is no
  // complete checkpoint (partial ones are never used). Device targets (TensorShard::device >= 0)
  // are filled through a host buffer of their size, then copied to their device before Load
  // returns.
  Result<LoadResult> Load(std::optional<uint64_t> step, const LoadRequest& request);

  // Every step directory under the root, newest first, complete or not.
  Result<std::vector<CheckpointInfo>> List();
  // The same for the memory tier (empty when it is off).
  Result<std::vector<CheckpointInfo>> ListMemoryTier();
  // The newest complete step, or nullopt when there is none.
  Result<std::optional<uint64_t>> LatestStep();
  // Removes partial checkpoints older than the newest complete one and, when keep_last > 0,
  // complete ones beyond the newest keep_last.
  Status CollectGarbage();

  // Waits until every save started so far is persisted (and drained); the first error among them.
  Status Flush();

  const CheckpointerOptions& options() const { return options_; }
  // Leaves this rank's memory-tier snapshots in place at destruction, as a crash would, whatever
  // memory_tier_cleanup_on_close says: for a process ending on an error, whose relaunch should
  // resume from memory. (The Python bindings call it when a Checkpointer is destroyed without an
  // orderly close.)
  void KeepMemoryTierOnClose() { options_.memory_tier_cleanup_on_close = false; }
  // Where the memory tier lives ("" when off).
  const std::string& memory_tier_directory() const;

 private:
  explicit Checkpointer(CheckpointerOptions options);
  Result<LoadResult> LoadHost(std::optional<uint64_t> step, const LoadRequest& request);
  CheckpointerOptions options_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lifeline

#endif  // LIFELINE_CHECKPOINT_H_
