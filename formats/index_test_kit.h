// What the index codec's tests (index_*_test.cc, manifest_parts_test.cc) build their inputs from:
// valid rank indexes and manifests made the way a saver makes them, and access to the encoded
// bytes at the offsets formats/SPEC.md gives, to damage them on purpose. Test support only:
// header-only, included by those tests.
#ifndef LIFELINE_FORMATS_INDEX_TEST_KIT_H_
#define LIFELINE_FORMATS_INDEX_TEST_KIT_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "formats/checksum.h"
#include "formats/index_codec.h"

namespace lifeline::format {

// ---- building valid indexes ----

inline int64_t Volume(const std::vector<int64_t>& shape) {
  int64_t v = 1;
  for (int64_t e : shape) v *= e;
  return v;
}

inline Region BoxRegion(std::vector<int64_t> offsets, std::vector<int64_t> shape) {
  Region r;
  r.flat_end = Volume(shape);
  r.offsets = std::move(offsets);
  r.shape = std::move(shape);
  return r;
}

inline Region FlatRegion(std::vector<int64_t> tensor_shape, int64_t begin, int64_t end) {
  Region r;
  r.offsets.assign(tensor_shape.size(), 0);
  r.shape = std::move(tensor_shape);
  r.flat_begin = begin;
  r.flat_end = end;
  return r;
}

// Builds a consistent rank index (or manifest) the way a saver would: one data file, fragments'
// chunks packed after a 4096-byte header, objects after the fragments.
class IndexBuilder {
 public:
  IndexBuilder(uint32_t rank, uint32_t world_size, uint64_t chunk_bytes = 64) {
    index_.kind = IndexKind::kRankIndex;
    index_.step = 1200;
    index_.rank = rank;
    index_.world_size = world_size;
    index_.run_id = "job-7:restart-0";
    index_.chunk_bytes = chunk_bytes;
    index_.created_unix_ns = 1700000000123456789ull + rank;
    index_.metadata_json = R"({"epoch": 3, "lr": 0.001})";
    char name[64];
    std::snprintf(name, sizeof(name), "0123456789abcdef.r%06u-of-%06u.data", rank, world_size);
    index_.files.push_back(FileInfo{name, rank, 4096});
  }

  uint32_t Tensor(std::string name, DType dtype, std::vector<int64_t> shape) {
    index_.tensors.push_back(TensorInfo{std::move(name), dtype, std::move(shape)});
    return static_cast<uint32_t>(index_.tensors.size() - 1);
  }

  // Appends a fragment with its chunks; compressed codecs store 3/4 of each chunk's raw length.
  IndexBuilder& Fragment(uint32_t tensor, Region region, Codec codec = Codec::kNone) {
    FragmentInfo fr;
    fr.tensor = tensor;
    fr.file = 0;
    fr.offset = index_.files[0].size;
    fr.codec = codec;
    fr.first_chunk = index_.chunks.size();
    const uint64_t raw = static_cast<uint64_t>(region.num_elements()) * DTypeSize(index_.tensors[tensor].dtype);
    fr.region = std::move(region);
    for (uint64_t pos = 0; pos < raw; pos += index_.chunk_bytes) {
      const uint64_t len = std::min(index_.chunk_bytes, raw - pos);
      const uint64_t stored = codec == Codec::kNone ? len : (len * 3 + 3) / 4;
      index_.chunks.push_back(ChunkInfo{stored, 0x9e3779b97f4a7c15ull * (index_.chunks.size() + 1)});
      index_.files[0].size += stored;
      ++fr.num_chunks;
    }
    index_.fragments.push_back(std::move(fr));
    return *this;
  }

  IndexBuilder& Object(std::string name, uint64_t length) {
    index_.objects.push_back(
        ObjectInfo{std::move(name), index_.rank, 0, index_.files[0].size, length, 0x1234567890abcdefull + length});
    index_.files[0].size += length;
    return *this;
  }

  CheckpointIndex& index() { return index_; }

 private:
  CheckpointIndex index_;
};

// A small rank index touching every kind of record.
inline CheckpointIndex SmallIndex() {
  IndexBuilder b(2, 4);
  const uint32_t w = b.Tensor("layers.3.w", DType::kBF16, {8, 6});
  const uint32_t m = b.Tensor("optim.m", DType::kF32, {10, 3});
  b.Fragment(w, BoxRegion({4, 0}, {4, 6}));      // tensor-parallel row block
  b.Fragment(m, FlatRegion({10, 3}, 7, 21));     // ZeRO flat range
  b.Object("rng", 24).Object("loader", 9);
  return b.index();
}

inline std::string MustEncode(const CheckpointIndex& index) {
  Result<std::string> bytes = EncodeIndex(index);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::string();
}

inline void ExpectRoundTrip(const CheckpointIndex& index) {
  const std::string bytes = MustEncode(index);
  Result<CheckpointIndex> decoded = DecodeIndex(bytes, "rt.index");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(*decoded == index);
}

// ---- reading and patching encoded bytes at the offsets SPEC.md gives ----

inline uint64_t GetU64(const std::string& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
inline uint32_t GetU32(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
inline void PutU64(std::string* b, size_t at, uint64_t v) { std::memcpy(b->data() + at, &v, 8); }
inline void PutU32(std::string* b, size_t at, uint32_t v) { std::memcpy(b->data() + at, &v, 4); }

inline constexpr size_t kHeaderLengthAt = 12;
inline constexpr size_t kCountsAt = 64;
inline constexpr size_t kSectionBytesAt = 112;
enum SectionId { kFiles = 0, kTensors, kFragments, kChunks, kObjects, kDims, kStrings };

inline size_t SectionStart(const std::string& b, SectionId s) {
  size_t pos = GetU32(b, kHeaderLengthAt);
  for (int i = 0; i < s; ++i) pos += GetU64(b, kSectionBytesAt + 8 * i);
  return pos;
}

// Recomputes the header checksum and the whole-file checksum after a deliberate edit, so that the
// decoder's structural and semantic checks are what rejects it.
inline void Reseal(std::string* b) {
  const uint32_t hl = GetU32(*b, kHeaderLengthAt);
  PutU64(b, hl - 8, Checksum64(b->data(), hl - 8));
  const size_t body_end = b->size() - 16;
  PutU64(b, body_end, Checksum64(b->data(), body_end));
}

}  // namespace lifeline::format

#endif  // LIFELINE_FORMATS_INDEX_TEST_KIT_H_
