// Saving and loading sharded training state in Lifeline's universal format.
//
// Each rank describes the pieces of tensors it holds (TensorShard) and calls Save; the checkpoint
// becomes visible, atomically, once every rank's index is durable. Any later job, with any world
// size and any sharding, loads it by describing the pieces it wants: the planner intersects them
// with what is stored and reads only the bytes needed, verifying every chunk's checksum.
//
//   lifeline::CheckpointerOptions opt;
//   opt.directory = "/ckpt/run7"; opt.rank = rank; opt.world_size = world;
//   auto ckpt = lifeline::Checkpointer::Open(opt);
//   lifeline::SaveRequest req;
//   req.tensors.push_back(lifeline::TensorShard::Box("w", DType::kBF16, {8192, 8192}, {4096, 0},
//                                                    {4096, 8192}, ptr));
//   LL_RETURN_IF_ERROR((*ckpt)->Save(step, req));
//
// Thread safety: a Checkpointer is used by one thread at a time (external synchronisation).
// Different Checkpointers, in one process or many, may save the same step concurrently: that is
// how ranks cooperate, through the file system alone.
#ifndef LIFELINE_CHECKPOINT_H_
#define LIFELINE_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
struct TensorShard {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;  // box origin
  std::vector<int64_t> shape;    // box extent
  int64_t flat_begin = 0;
  int64_t flat_end = 0;          // exclusive
  uint32_t replica_index = 0;
  uint32_t replica_count = 1;
  void* data = nullptr;          // (flat_end - flat_begin) elements; only read by Save

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

  int64_t num_elements() const { return flat_end - flat_begin; }
  uint64_t num_bytes() const { return static_cast<uint64_t>(num_elements()) * DTypeSize(dtype); }
};

struct SaveRequest {
  std::vector<TensorShard> tensors;
  // Per-rank opaque values (RNG state, data-loader position), kept per saving rank.
  std::vector<std::pair<std::string, std::string>> objects;
  // The job's global metadata (JSON text). Rank 0's is the one kept.
  std::string metadata_json;
};

struct LoadRequest {
  // Where to put what: each target's data is filled with its region of the stored tensor.
  // Replica fields are ignored. A target not fully covered by the checkpoint fails the load.
  std::vector<TensorShard> tensors;
  // Whose per-rank objects to return: by default this Checkpointer's rank.
  std::optional<uint32_t> objects_of_rank;
};

struct LoadResult {
  uint64_t step = 0;
  uint32_t saved_world_size = 0;
  std::vector<std::pair<std::string, std::string>> objects;  // of LoadRequest::objects_of_rank
  std::string metadata_json;
  uint64_t bytes_read = 0;      // from storage, including alignment slack
  uint64_t bytes_scattered = 0; // into the targets
};

struct CheckpointInfo {
  uint64_t step = 0;
  bool complete = false;       // every rank's index is present and valid
  uint32_t world_size = 0;     // of the newest attempt found
  uint32_t ranks_present = 0;  // rank indexes found
  uint64_t bytes = 0;          // on disk
  uint64_t created_unix_ns = 0;
  std::string directory;       // path of the step directory
  std::string problem;         // why it is not complete, when it is not
};

struct CheckpointerOptions {
  std::string directory;         // the checkpoint root; created if missing
  uint32_t rank = 0;
  uint32_t world_size = 1;
  Env* env = nullptr;            // nullptr: Env::Default()

  // Identifies this job launch; all ranks must use the same value. Empty: derived from the
  // environment (LIFELINE_JOB and LIFELINE_RESTART, or TORCHELASTIC_RUN_ID and
  // TORCHELASTIC_RESTART_COUNT), else "default".
  std::string run_id;

  uint32_t keep_last = 0;                     // complete checkpoints kept; 0 keeps all
  uint64_t chunk_bytes = 4ull << 20;          // checksum granularity; multiple of 8
  uint64_t write_block_bytes = 8ull << 20;    // unit of a direct write; multiple of 4096
  uint64_t save_memory_budget = 64ull << 20;  // staging for writes in flight
  uint64_t load_memory_budget = 256ull << 20; // staging for reads in flight
  unsigned queue_depth = 16;                  // I/O requests in flight
  bool direct_io = true;                      // O_DIRECT for data files
  // A replicated fragment larger than this is split into replica_count equal parts, each written
  // by one replica; smaller ones are written whole by one replica chosen by hashing.
  uint64_t replica_split_bytes = 1ull << 20;
};

class Checkpointer {
 public:
  static Result<std::unique_ptr<Checkpointer>> Open(CheckpointerOptions options);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Writes this rank's share of step `step` and publishes its index; the rank whose index
  // completes the set writes the manifest and applies retention. Returns when this rank's data
  // and index are durable. AlreadyExists when the step is already committed. On failure nothing
  // visible changes: earlier checkpoints are untouched and this one stays invisible.
  Status Save(uint64_t step, const SaveRequest& request);

  // Waits until step `step` is committed (every rank's index present), polling the file system.
  Status WaitForCommit(uint64_t step, double timeout_seconds);

  // Loads step `step`, or the newest complete checkpoint when empty, into the request's targets.
  // NotFound when there is no complete checkpoint (partial ones are never used).
  Result<LoadResult> Load(std::optional<uint64_t> step, const LoadRequest& request);

  // Every step directory under the root, newest first, complete or not.
  Result<std::vector<CheckpointInfo>> List();
  // The newest complete step, or nullopt when there is none.
  Result<std::optional<uint64_t>> LatestStep();
  // Removes partial checkpoints older than the newest complete one and, when keep_last > 0,
  // complete ones beyond the newest keep_last.
  Status CollectGarbage();

  const CheckpointerOptions& options() const { return options_; }

 private:
  explicit Checkpointer(CheckpointerOptions options);
  CheckpointerOptions options_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lifeline

#endif  // LIFELINE_CHECKPOINT_H_
