// Reading and writing the layout of Hugging Face's safetensors files, and of the
// model.safetensors.index.json that lists the files of a sharded export.
//
// A safetensors file is:
//   8 bytes   N, little-endian u64: the length of the header
//   N bytes   the header: a UTF-8 JSON object (trailing spaces allowed, so data can start aligned)
//   the rest  the data buffer; every tensor is a byte range of it, row-major, little-endian
// The header maps each tensor name to {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
// where [b, e) is relative to the start of the data buffer; an optional "__metadata__" key holds
// an object of string values.
//
// Parsing treats its input as hostile: every structure, count, offset and product is checked
// before use; the JSON is parsed as a stream (no document tree, nesting capped at the schema's
// depth), so a header costs memory proportional to what it describes. Errors name the file and,
// where there is one, the tensor and the offsets involved. Codes:
//   Corruption        the bytes are not a valid safetensors file (or index)
//   NotSupported      valid per the published format, but outside what Lifeline represents: a
//                     published dtype with no Lifeline DType (U16, U32, U64, C64, F4, F6_*,
//                     F8_E8M0, F8_*FNUZ), or a tensor name that is empty, longer than
//                     kMaxNameBytes or holds a NUL byte
//   InvalidArgument   a writer function was given something it must not write
//   ResourceExhausted memory ran out while parsing (no exception leaves these functions)
//
// What we accept beyond the reference reader: holes between tensors and a data buffer longer than
// the last tensor (the reference reader insists on a gap-free buffer that ends exactly at the
// last tensor). What we refuse that it might accept: duplicate JSON keys, keys other than
// dtype/shape/data_offsets in an entry. Writers here always produce files the reference reader
// accepts (given the data buffer is written exactly as laid out).
//
// formats does no I/O of its own: lib/src/convert/safetensors_file.h reads a file's header through
// the Env and hands its bytes to the decoders here.
//
// Thread safety: pure functions.
#ifndef LIFELINE_FORMATS_SAFETENSORS_H_
#define LIFELINE_FORMATS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/model.h"
#include "lifeline/dtype.h"
#include "lifeline/status.h"

namespace lifeline::format {

// The reference implementation's limit on N (100,000,000 bytes, decimal: MAX_HEADER_SIZE in
// safetensors/src/tensor.rs).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// Bytes of the length field that starts every file.
inline constexpr uint64_t kSafetensorsLengthBytes = 8;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty for a 0-d tensor (one element)
  uint64_t begin = 0;          // byte range [begin, end) relative to the start of the data buffer
  uint64_t end = 0;

  bool operator==(const SafetensorsEntry&) const = default;
};

struct SafetensorsHeader {
  // Sorted by (begin, end); entries with equal offsets keep their order in the header.
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"; empty when absent
  uint64_t data_offset = 0;  // absolute file offset of the data buffer: 8 + N
  uint64_t data_bytes = 0;   // length of the data buffer: file size - 8 - N
};

// The twelve safetensors dtype names that have a Lifeline DType: F64 F32 F16 BF16 F8_E4M3
// F8_E5M2 I64 I32 I16 I8 U8 BOOL. nullopt for any other string (case-sensitive, as published).
std::optional<DType> ParseSafetensorsDType(std::string_view name);
// Inverse of ParseSafetensorsDType; "" for a value that is not a DType.
std::string_view SafetensorsDTypeName(DType dtype);

// Checks the first 8 bytes of a file of `file_size` bytes and returns N, the header length.
// Corruption (naming `file`) when `first_bytes` is shorter than 8 bytes (the file is too short),
// N > kMaxSafetensorsHeaderBytes, or 8 + N > file_size. For readers that fetch bytes themselves
// (e.g. through an Env: lib's ReadSafetensorsHeader).
Result<uint64_t> DecodeSafetensorsHeaderLength(std::string_view first_bytes, uint64_t file_size,
                                               std::string_view file);

// Parses and validates the N header bytes of a file whose data buffer is `data_bytes` long.
// On success every tensor has a supported dtype, a shape of at most kMaxRank extents each in
// [0, INT64_MAX] whose element count fits in int64, end - begin == elements * DTypeSize(dtype),
// begin <= end <= data_bytes, no two tensors of non-zero length share a byte, and tensor names
// are unique (1..kMaxNameBytes bytes, no NUL). data_offset is set to 8 + header_json.size().
// Fails with Corruption for invalid JSON, JSON that is not an object, a duplicate key at any level,
// "__metadata__" not an object of strings, an entry that is not an object with exactly the keys
// dtype (string), shape (array of integers) and data_offsets (array of two integers), an unknown
// dtype, a shape whose byte count overflows, offsets outside the buffer, reversed or overlapping,
// or a byte length that does not match shape and dtype ("dtype/size mismatch"); NotSupported as
// described at the top of this file. Messages name `file_for_errors` and the tensor.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view header_json, uint64_t data_bytes,
                                                 std::string_view file_for_errors);

// Assigns contiguous byte ranges, in the given order and starting at 0, to entries whose name,
// dtype and shape are set (any begin/end given is overwritten). InvalidArgument, naming the
// tensor, for an invalid dtype, a negative extent, more than kMaxRank extents, or a byte count
// that overflows.
Result<std::vector<SafetensorsEntry>> LayOutSafetensors(std::vector<SafetensorsEntry> entries);

// The bytes that precede the data buffer: the 8-byte length, then the compact JSON header with
// "__metadata__" first (omitted when `metadata` is empty) and the tensors in the given order,
// each as {"dtype", "shape", "data_offsets"}, padded with spaces so that the data buffer starts at
// a multiple of 8. The file is valid when the data buffer that follows is exactly
// entries.back().end bytes long (0 without entries).
// InvalidArgument (naming the tensor) unless the entries are laid out gap-free in order (the first
// begins at 0, each begins where the previous ended, as LayOutSafetensors does), every entry
// passes the checks of ParseSafetensorsHeader, names are unique, non-empty, not "__metadata__",
// at most kMaxNameBytes and valid UTF-8 without NUL, metadata keys and values are valid UTF-8,
// and the header fits in kMaxSafetensorsHeaderBytes. Deterministic: equal inputs, equal bytes.
Result<std::string> BuildSafetensorsPrefix(const std::vector<SafetensorsEntry>& entries,
                                           const std::map<std::string, std::string>& metadata);

// Splits tensors of the given byte sizes, kept in order, into shards of at most
// `max_shard_bytes`, greedily: a tensor goes into the current shard unless that would push it
// past the limit, in which case it starts a new shard. A tensor larger than the limit gets a shard
// of its own. max_shard_bytes == 0 means no limit (one shard). Returns the tensor indexes of each
// shard; at least one shard, which is empty when there are no tensors.
std::vector<std::vector<size_t>> PlanSafetensorsShards(const std::vector<uint64_t>& tensor_bytes,
                                                       uint64_t max_shard_bytes);

// The file name of shard `i` (0-based) of `n`, as transformers names them: "model.safetensors"
// when n == 1, else "model-00001-of-00003.safetensors" (1-based, at least 5 digits).
// REQUIRES: i < n.
std::string SafetensorsShardName(size_t i, size_t n);

inline constexpr std::string_view kSafetensorsIndexFileName = "model.safetensors.index.json";

// True when `name` can name a shard next to its index: 1..kMaxFileNameBytes bytes, not "." or
// "..", no '/', '\\' or NUL (so neither absolute nor a path that leaves the directory).
bool IsSafeSafetensorsFileName(std::string_view name);

// The content of model.safetensors.index.json:
//   {"metadata": {"total_size": <number>, <metadata...>}, "weight_map": {"<tensor>": "<file>"...}}
// indented by 2 spaces, weight_map in the given order, metadata keys in map order after
// total_size. InvalidArgument for a duplicate, empty or over-long tensor name, an unsafe file
// name, a metadata key "total_size", or a string that is not valid UTF-8.
Result<std::string> BuildSafetensorsIndex(uint64_t total_size,
                                          const std::vector<std::pair<std::string, std::string>>& weight_map,
                                          const std::map<std::string, std::string>& metadata);

struct SafetensorsIndex {
  uint64_t total_size = 0;  // metadata.total_size; 0 when the index does not give it
  std::map<std::string, std::string> metadata;  // other string-valued metadata entries
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> file, in file order
  std::vector<std::string> files;  // distinct files of weight_map, in first-appearance order
};

// Parses an index. Unknown top-level keys and metadata entries that are not strings (e.g.
// transformers' "total_parameters") are skipped. Corruption (naming `file_for_errors` and the
// tensor) for invalid JSON, a missing or non-object "weight_map", a weight_map value that is not
// a string or not IsSafeSafetensorsFileName, a duplicate key at any level of the schema, a
// total_size that is not a non-negative integer, or "metadata" that is not an object;
// NotSupported for an empty, over-long or NUL-holding tensor name.
Result<SafetensorsIndex> ParseSafetensorsIndex(std::string_view json, std::string_view file_for_errors);

}  // namespace lifeline::format

#endif  // LIFELINE_FORMATS_SAFETENSORS_H_
