// The rank's data file: its layout (header, fragments' raw bytes, objects), the index describing
// it, and the stream that writes it (copy + checksum into aligned blocks, O_DIRECT writes many in
// flight through the I/O pump, fdatasync), producing the rank index to publish.
#ifndef LIFELINE_SRC_SAVE_RANK_DATA_H_
#define LIFELINE_SRC_SAVE_RANK_DATA_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "formats/model.h"
#include "lib/src/save/save_plan.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

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
// The same for a save of the same plan, fragment layout and chunk size as an earlier one, whose
// `chunks` (lengths; checksums zero) it copies, leaving `tensors` and `fragments` empty: they are
// the earlier index's, which SaveJob::CompleteIndex copies in off the caller's thread (with many
// tensors, copying them is most of a save's planning).
format::CheckpointIndex RawImageIndexOfReusedPlan(const std::vector<format::ChunkInfo>& chunks,
                                                  const std::vector<std::pair<std::string, std::string>>& objects,
                                                  const std::string& metadata_json, const ImageLayout& layout,
                                                  const RankWriteOptions& options);

}  // namespace lifeline

#endif  // LIFELINE_SRC_SAVE_RANK_DATA_H_
