// The in-memory model of a checkpoint's metadata: what a rank index and the manifest describe.
// formats/SPEC.md gives the byte layout; formats/index_codec.h (index_encode.cc, index_decode.cc)
// converts between the two.
//
// One notion of "where a piece of a tensor lies" serves saves, loads and the planner: a Region is
// a row-major element range [flat_begin, flat_end) of an N-d box of the global tensor. A plain
// N-d box is the whole range of its box; a ZeRO/FSDP flat shard is a range of the box that spans
// the whole tensor; a flat shard of a tensor-parallel piece is a range of that piece's box.
#ifndef LIFELINE_FORMATS_MODEL_H_
#define LIFELINE_FORMATS_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lifeline/dtype.h"

namespace lifeline::format {

// Limits every decoder enforces on untrusted input (and every encoder on its input).
inline constexpr uint32_t kMaxRank = 32;                 // dimensions of a tensor
inline constexpr uint32_t kMaxNameBytes = 4096;          // tensor and object names
inline constexpr uint32_t kMaxFileNameBytes = 255;       // one path component
inline constexpr uint64_t kMaxIndexBytes = 1ull << 34;   // 16 GiB: an index or manifest file
inline constexpr uint32_t kMaxWorldSize = 1u << 20;

struct Region {
  std::vector<int64_t> offsets;  // box origin in the global tensor, one per dimension
  std::vector<int64_t> shape;    // box extent, one per dimension
  int64_t flat_begin = 0;        // row-major element range inside the box
  int64_t flat_end = 0;          // exclusive; == product(shape) for a whole box

  int64_t num_elements() const { return flat_end - flat_begin; }
  bool operator==(const Region&) const = default;
};

// A 0-d tensor (scalar) has an empty shape and one element: its only Region is
// {offsets={}, shape={}, flat_begin=0, flat_end=1}.

enum class Codec : uint8_t {
  kNone = 0,
  kZstd = 1,           // zstd of the raw bytes
  kZstdByteGroup = 2,  // bytes of each element grouped by significance, then zstd
};

struct TensorInfo {
  std::string name;             // UTF-8, 1..kMaxNameBytes bytes, unique in a checkpoint
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;   // global shape; every extent >= 0

  bool operator==(const TensorInfo&) const = default;
};

// The bytes of one data file this index refers to. Name: one path component, validated by
// IsSafeFileName; never a path.
struct FileInfo {
  std::string name;
  uint32_t rank = 0;   // the rank that wrote it
  uint64_t size = 0;   // bytes, after the alignment padding was dropped

  bool operator==(const FileInfo&) const = default;
};

// One checksummed unit of stored bytes. Chunk k of a fragment holds the raw bytes
// [k * chunk_bytes, min((k + 1) * chunk_bytes, raw length)) of the fragment's row-major data,
// encoded by the fragment's codec into `stored_length` bytes; chunks follow each other in the file.
struct ChunkInfo {
  uint64_t stored_length = 0;
  uint64_t checksum = 0;  // XXH3-64 (seed 0) of the stored bytes

  bool operator==(const ChunkInfo&) const = default;
};

struct FragmentInfo {
  uint32_t tensor = 0;    // index into CheckpointIndex::tensors
  Region region;          // where its elements lie in the tensor
  uint32_t file = 0;      // index into CheckpointIndex::files
  uint64_t offset = 0;    // byte offset of its first chunk in the file
  Codec codec = Codec::kNone;
  uint64_t first_chunk = 0;  // index into CheckpointIndex::chunks
  uint64_t num_chunks = 0;   // == ceil(raw bytes / chunk_bytes), at least 1 unless raw bytes == 0

  bool operator==(const FragmentInfo&) const = default;
};

// A per-rank opaque byte string (RNG state, data-loader position...), stored in a data file.
struct ObjectInfo {
  std::string name;
  uint32_t rank = 0;    // the rank that saved it
  uint32_t file = 0;    // index into CheckpointIndex::files
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes

  bool operator==(const ObjectInfo&) const = default;
};

enum class IndexKind : uint8_t {
  kRankIndex = 1,  // written by one rank: its files, the fragments and objects it wrote
  kManifest = 2,   // the union of all rank indexes of one checkpoint, written once at commit
};

inline constexpr uint32_t kManifestRank = 0xFFFFFFFFu;

struct CheckpointIndex {
  IndexKind kind = IndexKind::kRankIndex;
  uint64_t step = 0;
  uint32_t rank = 0;          // kManifestRank for a manifest
  uint32_t world_size = 1;    // ranks that took part in the save
  std::string run_id;         // identifies one save attempt; all rank indexes of a checkpoint share it
  uint64_t chunk_bytes = 0;   // raw bytes per chunk; a positive multiple of 8
  uint64_t created_unix_ns = 0;
  std::vector<FileInfo> files;
  std::vector<TensorInfo> tensors;     // every tensor the fragments refer to
  std::vector<FragmentInfo> fragments;
  std::vector<ChunkInfo> chunks;
  std::vector<ObjectInfo> objects;
  std::string metadata_json;  // the user's global metadata (rank 0's); may be empty

  bool operator==(const CheckpointIndex&) const = default;
};

}  // namespace lifeline::format

#endif  // LIFELINE_FORMATS_MODEL_H_
