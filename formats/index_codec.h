// Encoding and decoding of rank indexes and manifests (formats/SPEC.md, "Index file").
//
// Decoding treats its input as hostile: every length, count, offset and name is bounds-checked
// before use, and any violation is a Corruption status naming the file (`source`) and the byte
// offset or record involved. A decoder never crashes, never allocates more than a small multiple
// of the input's size, and never returns a file name that could leave the checkpoint directory.
//
// One file per job: index_validate.cc (ValidateIndex, ValidateCoverage, the name checks),
// index_encode.cc, index_decode.cc, manifest_parts.cc (ManifestPartReader) and index_merge.cc
// (BuildManifest); index_layout.h and index_decoder.h are their shared internals.
//
// Thread safety: pure functions.
#ifndef LIFELINE_FORMATS_INDEX_CODEC_H_
#define LIFELINE_FORMATS_INDEX_CODEC_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/geometry.h"
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

// Serialises an index (rank index or manifest). InvalidArgument if ValidateIndex fails. A manifest
// whose fragments are grouped by tensor in increasing order gets a directory (SPEC §5.5).
Result<std::string> EncodeIndex(const CheckpointIndex& index);

// Parses and validates. `source` (usually the file path) is used in error messages.
Result<CheckpointIndex> DecodeIndex(std::string_view bytes, std::string_view source);

// Builds the manifest of a checkpoint from its rank indexes (one per rank 0..world_size-1, any
// order): tensors merged by name (dtype and shape must agree, else InvalidArgument naming the
// tensor and both ranks), files, fragments, chunks and objects concatenated with their references
// renumbered, then fragments grouped by tensor (rank order within one) with their chunks, so that
// the encoded manifest gets a directory (SPEC §5.5); metadata taken from rank 0. Fails when the indexes disagree on step, run_id,
// world_size or chunk_bytes, when a rank is missing or repeated, or when ValidateCoverage fails.
Result<CheckpointIndex> BuildManifest(std::vector<CheckpointIndex> rank_indexes);

// The rule that makes a complete checkpoint loadable: the fragments of every tensor cover it
// exactly, every element stored once (no hole, no overlap). Applied to every manifest, whether
// merged from rank indexes or read from a manifest file. `untrusted` selects Corruption or
// InvalidArgument. The message names the tensor, the ranks involved and, for two ranks that
// stored the same elements, the likely cause (data-parallel copies not marked as replicas).
// Cost: O(F log F) over the F fragments, never all pairs.
// `only`, when given, limits the check to those tensors (a manifest read in parts).
Status ValidateCoverage(const CheckpointIndex& manifest, std::string_view source, bool untrusted,
                        const std::vector<uint32_t>* only = nullptr);

// Reads a manifest in parts (formats/SPEC.md §5.5): the header and the directory, then files,
// tensors, objects and names (the "head"), then, on request, the fragments and chunks of chosen
// tensors and nothing else. Every byte used is first checked: the header and the directory by
// their own checksums, everything else block by block against the directory's checksums. What is
// read is validated as DecodeIndex validates a whole file (ValidateIndex; coverage for each tensor
// whose fragments were added). Errors are Corruption naming `source` and the byte offset, block or
// record; NotSupported for a newer format version.
//
// Thread safety: one thread at a time.
class ManifestPartReader {
 public:
  // Reads `length` bytes at `offset` of the file into `out`.
  using ReadAt = std::function<Status(uint64_t offset, uint64_t length, char* out)>;

  // Reads the header, the directory and the head. Returns null when the file is a manifest without
  // a directory (written before it existed, or with fragments not grouped by tensor): decode the
  // whole file with DecodeIndex then.
  static Result<std::unique_ptr<ManifestPartReader>> Open(ReadAt read, uint64_t file_size, std::string_view source);
  ~ManifestPartReader();

  // The manifest without fragments and chunks.
  const CheckpointIndex& head() const;

  // A tensor (index into head().tensors) and the box of it a load fills; no box: all of it.
  struct TensorBox {
    uint32_t tensor;
    std::optional<Box> box;
  };

  // Appends to `into` (a copy of head() with fragments added only by this reader) the fragments of
  // the wanted tensors whose boxes meet the wanted boxes: the fragments are read box run by box
  // run (the fragments of a tensor that share a box, e.g. the DP parts of one TP shard), and a run
  // is read once however often it is asked for. Their chunks are renumbered to follow those
  // already in `into`.
  Status AddFragments(const std::vector<TensorBox>& wanted, CheckpointIndex* into);
  // The same for whole tensors.
  Status AddTensors(const std::vector<uint32_t>& tensors, CheckpointIndex* into);
  // Every fragment not read yet.
  Status AddAllFragments(CheckpointIndex* into);

  // Bytes of the file read so far.
  uint64_t bytes_read() const;

 private:
  struct State;
  explicit ManifestPartReader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace lifeline::format

#endif  // LIFELINE_FORMATS_INDEX_CODEC_H_
