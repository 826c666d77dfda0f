// The plan of a save: which fragments this rank writes (replicas deduplicated, column blocks).
#ifndef LIFELINE_SRC_SAVE_SAVE_PLAN_H_
#define LIFELINE_SRC_SAVE_SAVE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "formats/model.h"
#include "lifeline/checkpoint.h"
#include "lifeline/status.h"

namespace lifeline {

// A piece this rank writes: `region` of tensor `tensor`, whose packed bytes start at `source`, or,
// for a column block (below), are runs of `run_bytes`, one every `source_stride` bytes from it.
struct PlannedFragment {
  uint32_t tensor = 0;    // index into RankSavePlan::tensors
  format::Region region;
  const uint8_t* source = nullptr;
  uint32_t request_index = 0;  // the SaveRequest tensor it comes from
  uint64_t source_stride = 0;  // 0: packed at `source`
  uint64_t run_bytes = 0;

  bool strided() const { return source_stride != 0; }
};

// Copies bytes [offset, offset + n) of the packed bytes made of runs of `run` bytes, one every
// `stride` bytes from `source`, to `dst`.
void GatherRuns(const uint8_t* source, uint64_t stride, uint64_t run, uint64_t offset, uint64_t n, uint8_t* dst);

// Copies bytes [offset, offset + n) of a fragment's packed bytes to `dst` (gathering the runs of a
// column block). REQUIRES: pf.source is set.
void CopyFragmentBytes(const PlannedFragment& pf, uint64_t offset, uint64_t n, uint8_t* dst);

struct RankSavePlan {
  std::vector<format::TensorInfo> tensors;  // every tensor the rank declared, once each
  std::vector<PlannedFragment> fragments;   // in request order
};

// The key of a replicated shard (formats/SPEC.md §7): XXH3-64 of the tensor name, a 0x00 byte, then
// as little-endian i64 each offset, each extent, flat_begin and flat_end of its region. Every
// replica of the shard computes the same key.
uint64_t ReplicaHash(const std::string& name, const format::Region& region);

// Validates the request (names, dtypes, regions, replica fields, consistent declarations of a
// tensor held in several pieces) and decides what this rank writes. With `require_data` false, a
// shard may have no data (a plan for bytes that WriteRankData will fetch through a FragmentReader);
// its fragments' `source` is then null. Replica rule (SPEC.md,
// "Replicas"): a replicated piece larger than `replica_split_bytes` is split into replica_count
// near-equal element ranges, replica i writing range i; a smaller one is written whole by replica
// XXH3-64(name || region) mod replica_count. Deterministic: every replica reaches the same answer.
//
// Column blocks (`column_blocks`, CheckpointerOptions::column_blocks). A host shard of a tensor
// split along its last dimension (tensor parallelism over columns) is stored as blocks of whole
// columns, each a fragment of its own (formats/SPEC.md §4: any box is a region), not row by row. A later load split along columns at another degree
// then reads the blocks it overlaps instead of every stored row: each cut between two loading ranks
// reads at most one block twice. Blocks are at least 256 bytes wide per row (16 at most per shard,
// so the copy stays a stream of whole cache lines), only for shards of 64 KiB or more; a flat range
// that starts or ends inside a row (a ZeRO piece of a 2-d box) keeps those partial rows packed.
Result<RankSavePlan> PlanRankSave(const SaveRequest& request, uint64_t replica_split_bytes,
                                  bool require_data = true, bool column_blocks = false);

}  // namespace lifeline

#endif  // LIFELINE_SRC_SAVE_SAVE_PLAN_H_
