// Encoding and decoding of rank indexes and manifests (formats/SPEC.md, "Index file").
//
// Decoding treats its input as hostile: every length, count, offset and name is bounds-checked
// before use, and any violation is a Corruption status naming the file (`source`) and the byte
// offset or record involved. A decoder never crashes, never allocates more than a small multiple
// of the input's size, and never returns a file name that could leave the checkpoint directory.
//
// Thread safety: pure functions.
#ifndef LIFELINE_FORMATS_INDEX_CODEC_H_
#define LIFELINE_FORMATS_INDEX_CODEC_H_

#include <string>
#include <string_view>
#include <vector>

#include "formats/model.h"
#include "lifeline/status.h"

namespace lifeline::format {

// True when `name` is a single, harmless path component: 1..kMaxFileNameBytes bytes from
// [A-Za-z0-9._-], not "." or "..", not starting with '.'.
bool IsSafeFileName(std::string_view name);

// A name from an untrusted file, fit for an error message: quoted, control bytes, quotes and
// backslashes escaped as \xNN, cut after 120 bytes (with the full length said).
std::string QuoteUntrusted(std::string_view name);

// Semantic checks shared by encoder and decoder: references in range (tensor, file, chunk), every
// region valid for its tensor, chunk counts consistent with chunk_bytes and the raw size, file
// names safe, tensor names unique and non-empty, dtypes valid, sizes without overflow, stored
// extents inside their file's size. `untrusted` selects Corruption (decoded input) or
// InvalidArgument (caller's input) as the error code. Messages name `source`.
Status ValidateIndex(const CheckpointIndex& index, std::string_view source, bool untrusted);

// Serialises an index (rank index or manifest). InvalidArgument if ValidateIndex fails.
Result<std::string> EncodeIndex(const CheckpointIndex& index);

// Parses and validates. `source` (usually the file path) is used in error messages.
Result<CheckpointIndex> DecodeIndex(std::string_view bytes, std::string_view source);

// Builds the manifest of a checkpoint from its rank indexes (one per rank 0..world_size-1, any
// order): tensors merged by name (dtype and shape must agree, else InvalidArgument naming the
// tensor and both ranks), files, fragments, chunks and objects concatenated with their references
// renumbered, metadata taken from rank 0. Fails when the indexes disagree on step, run_id,
// world_size or chunk_bytes, when a rank is missing or repeated, or when ValidateCoverage fails.
Result<CheckpointIndex> BuildManifest(std::vector<CheckpointIndex> rank_indexes);

// The rule that makes a complete checkpoint loadable: the fragments of every tensor cover it
// exactly, every element stored once (no hole, no overlap). Applied to every manifest, whether
// merged from rank indexes or read from a manifest file. `untrusted` selects Corruption or
// InvalidArgument. The message names the tensor, the ranks involved and, for two ranks that
// stored the same elements, the likely cause (data-parallel copies not marked as replicas).
// Cost: O(F log F) over the F fragments, never all pairs.
Status ValidateCoverage(const CheckpointIndex& manifest, std::string_view source, bool untrusted);

}  // namespace lifeline::format

#endif  // LIFELINE_FORMATS_INDEX_CODEC_H_
