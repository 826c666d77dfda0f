// The write side of a save: which fragments this rank writes (replicas deduplicated), and the
// pipeline that streams them into the rank's data file (copy + checksum into aligned blocks,
// O_DIRECT writes many in flight, fdatasync), producing the rank index to publish.
#ifndef LIFELINE_SRC_SAVER_H_
#define LIFELINE_SRC_SAVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "formats/model.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

// A piece this rank writes: `region` of tensor `tensor`, whose packed bytes start at `source`.
struct PlannedFragment {
  uint32_t tensor = 0;
  format::Region region;
  const uint8_t* source = nullptr;
};

struct RankSavePlan {
  std::vector<format::TensorInfo> tensors;  // every tensor the rank declared, once each
  std::vector<PlannedFragment> fragments;   // in request order
};

// Validates the request (names, dtypes, regions, replica fields, consistent declarations of a
// tensor held in several pieces) and decides what this rank writes. Replica rule (SPEC.md,
// "Replicas"): a replicated piece larger than `replica_split_bytes` is split into replica_count
// near-equal element ranges, replica i writing range i; a smaller one is written whole by replica
// XXH3-64(name || region) mod replica_count. Deterministic: every replica reaches the same answer.
Result<RankSavePlan> PlanRankSave(const SaveRequest& request, uint64_t replica_split_bytes);

struct RankWriteOptions {
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string run_id;
  std::string run_hash;
  uint64_t chunk_bytes = 4ull << 20;
  uint64_t write_block_bytes = 8ull << 20;
  uint64_t memory_budget = 64ull << 20;
  unsigned queue_depth = 16;
  bool direct_io = true;
};

// Writes the data file `step_dir/<data file name>` and returns the rank index describing it (not
// yet published). On failure the partial data file is left for garbage collection; nothing visible
// changes.
Result<format::CheckpointIndex> WriteRankData(Env* env, const std::string& step_dir, const RankSavePlan& plan,
                                              const SaveRequest& request, const RankWriteOptions& options);

}  // namespace lifeline

#endif  // LIFELINE_SRC_SAVER_H_
