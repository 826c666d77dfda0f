// The write side of a save: which fragments this rank writes (replicas deduplicated), and the
// pipeline that streams them into the rank's data file (copy + checksum into aligned blocks,
// O_DIRECT writes many in flight, fdatasync), producing the rank index to publish.
#ifndef LIFELINE_SRC_SAVER_H_
#define LIFELINE_SRC_SAVER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/model.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
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
  format::Codec codec = format::Codec::kNone;
  int codec_level = 1;
};

// Writes the data file `step_dir/<data file name>` and returns the rank index describing it (not
// yet published). On failure the partial data file is left for garbage collection; nothing visible
// changes.
// With a codec, each chunk is encoded on the way (stored lengths and checksums of the stored bytes
// go in the index). `objects` are the per-rank objects, written raw after the fragments.
//
// `reader`, when set, supplies the raw bytes of fragments whose `source` is null: it is called in
// file order with consecutive ranges of at most chunk_bytes of one fragment's raw bytes (byte
// offsets into the fragment) and must fill `dst` with exactly n bytes or fail; its error fails the
// write. This is how the `lifeline` tool streams a conversion without holding the model in memory.
using FragmentReader =
    std::function<Status(const PlannedFragment& fragment, uint64_t raw_offset, uint64_t n, uint8_t* dst)>;
Result<format::CheckpointIndex> WriteRankData(Env* env, const std::string& step_dir, const RankSavePlan& plan,
                                              const std::vector<std::pair<std::string, std::string>>& objects,
                                              const std::string& metadata_json, const RankWriteOptions& options,
                                              const FragmentReader& reader = nullptr);

// The data-file image of a staged snapshot: the 4096-byte header, then every fragment's raw bytes
// in plan order, then the objects. Offsets are those of the data file when no codec is used.
struct ImageLayout {
  uint64_t bytes = 0;                     // header + data, before padding
  std::vector<uint64_t> fragment_offset;  // per plan fragment
  std::vector<uint64_t> object_offset;    // per object
};
ImageLayout LayoutImage(const RankSavePlan& plan, const std::vector<std::pair<std::string, std::string>>& objects);
// The objects' part of LayoutImage, after fragments ending at layout->bytes.
void LayoutObjects(const std::vector<std::pair<std::string, std::string>>& objects, ImageLayout* layout);

// The rank index of a staged snapshot written raw (codec none) at the offsets of `layout`, with
// chunk lengths set and checksums zero (the copy fills them in).
format::CheckpointIndex RawImageIndex(const RankSavePlan& plan, const std::vector<std::pair<std::string, std::string>>& objects,
                                      const std::string& metadata_json, const ImageLayout& layout,
                                      const RankWriteOptions& options);
// The same, with the fragments' part (fragments and chunks) taken from an earlier RawImageIndex of
// the same plan, fragment layout and chunk size.
format::CheckpointIndex RawImageIndex(const RankSavePlan& plan, const std::vector<format::FragmentInfo>& fragments,
                                      const std::vector<format::ChunkInfo>& chunks,
                                      const std::vector<std::pair<std::string, std::string>>& objects,
                                      const std::string& metadata_json, const ImageLayout& layout,
                                      const RankWriteOptions& options);

}  // namespace lifeline

#endif  // LIFELINE_SRC_SAVER_H_
