// The byte layout of rank index and manifest files (formats/SPEC.md, "Index file"): sizes and
// offsets of the header, the records and the manifest directory, and little-endian access to them.
// Internal to the index codec (index_encode.cc, index_decode.cc, manifest_parts.cc); callers use
// formats/index_codec.h.
#ifndef LIFELINE_FORMATS_INDEX_LAYOUT_H_
#define LIFELINE_FORMATS_INDEX_LAYOUT_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lifeline::format::internal {

inline constexpr char kMagic[8] = {'L', 'L', 'I', 'N', 'D', 'E', 'X', '\0'};
inline constexpr char kEndMagic[8] = {'L', 'L', 'I', 'N', 'D', 'E', 'N', 'D'};
inline constexpr uint32_t kFormatVersion = 1;

// The first 16 bytes (magic, version, header length) and "the header checksum is the header's
// last 8 bytes" are fixed for every version, so a reader can authenticate a header it cannot parse
// and then say that its version is too new.
inline constexpr size_t kHeaderPrefixBytes = 16;
inline constexpr size_t kHeaderBytes = 208;  // version 1
inline constexpr size_t kMaxHeaderBytes = 4096;
inline constexpr size_t kTrailerBytes = 16;

inline constexpr size_t kFileRecordBytes = 24;
inline constexpr size_t kTensorRecordBytes = 24;
inline constexpr size_t kFragmentRecordBytes = 64;
inline constexpr size_t kChunkRecordBytes = 16;
inline constexpr size_t kObjectRecordBytes = 48;
inline constexpr size_t kDimBytes = 8;

// Header field offsets.
inline constexpr size_t kOffVersion = 8;
inline constexpr size_t kOffHeaderLength = 12;
inline constexpr size_t kOffKind = 16;
inline constexpr size_t kOffRank = 20;
inline constexpr size_t kOffWorldSize = 24;
inline constexpr size_t kOffStep = 32;
inline constexpr size_t kOffChunkBytes = 40;
inline constexpr size_t kOffCreated = 48;
inline constexpr size_t kOffFileLength = 56;
inline constexpr size_t kOffCounts = 64;    // 6 x u64: files, tensors, fragments, chunks, objects, dims
inline constexpr size_t kOffSections = 112; // 7 x u64: byte lengths of the 7 sections
inline constexpr size_t kOffRunIdOffset = 168;
inline constexpr size_t kOffRunIdLength = 176;
inline constexpr size_t kOffMetadataOffset = 184;
inline constexpr size_t kOffMetadataLength = 192;
// The header checksum is always the header's last 8 bytes: at 200 in a 208-byte header.

// The manifest directory (§5.5): header fields appended after version 1's, so that a reader that
// does not know them skips them.
inline constexpr size_t kOffDirectoryOffset = 200;
inline constexpr size_t kOffDirectoryLength = 208;
inline constexpr size_t kOffDirectoryChecksum = 216;
inline constexpr size_t kOffBlockBytes = 224;
inline constexpr size_t kManifestHeaderBytes = 240;
inline constexpr uint64_t kDirectoryFixedBytes = 16;  // tables offset, number of runs
inline constexpr uint64_t kBlockBytes = 4 << 10;
inline constexpr uint64_t kMinBlockBytes = 4096;
inline constexpr uint64_t kMaxBlockBytes = 16 << 20;

enum Section { kFiles = 0, kTensors, kFragments, kChunks, kObjects, kDims, kStrings, kNumSections };
inline constexpr const char* kSectionNames[kNumSections] = {"files",   "tensors", "fragments", "chunks",
                                                            "objects", "dims",    "strings"};
inline constexpr size_t kRecordBytes[kNumSections] = {kFileRecordBytes,  kTensorRecordBytes, kFragmentRecordBytes,
                                                      kChunkRecordBytes, kObjectRecordBytes, kDimBytes, 1};

// ---- little-endian access ----

template <typename T>
T FromLittle(T v) {
  if constexpr (std::endian::native == std::endian::big) {
    if constexpr (sizeof(T) == 8) return static_cast<T>(__builtin_bswap64(static_cast<uint64_t>(v)));
    if constexpr (sizeof(T) == 4) return static_cast<T>(__builtin_bswap32(static_cast<uint32_t>(v)));
    if constexpr (sizeof(T) == 2) return static_cast<T>(__builtin_bswap16(static_cast<uint16_t>(v)));
  }
  return v;
}

template <typename T>
void Put(char* p, T v) {
  v = FromLittle(v);
  std::memcpy(p, &v, sizeof(T));
}

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return FromLittle(v);
}

// The name errors give an index read from nowhere in particular.
inline std::string SourceName(std::string_view source) {
  return source.empty() ? std::string("index") : std::string(source);
}

}  // namespace lifeline::format::internal

#endif  // LIFELINE_FORMATS_INDEX_LAYOUT_H_
