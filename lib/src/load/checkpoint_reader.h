// Reading checkpoints: discovering step directories, deciding which are complete, opening one,
// loading any layout out of it, verifying every checksum. Used by Checkpointer::Load and the CLI.
//
// Thread safety: a CheckpointReader is immutable after Open except for its I/O calls, which
// require external synchronisation (one thread at a time).
#ifndef LIFELINE_SRC_CHECKPOINT_READER_H_
#define LIFELINE_SRC_CHECKPOINT_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/index_codec.h"
#include "formats/model.h"
#include "lib/src/store/step_scan.h"  // ScanCheckpoints, for the reader's callers
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

struct ReaderOptions {
  // Bytes of read staging during Load/Verify, including the buffer compressed chunks are decoded
  // into (one chunk's raw size; twice that with byte grouping). Reads in flight take at most 32 MiB
  // of it (huge pages where the kernel gives them), whatever the budget, plus one read's worth
  // being checked while the next goes out. Chunks adjacent in a file are read together, up to
  // 8 MiB a read.
  uint64_t memory_budget = 256ull << 20;
  unsigned queue_depth = 16;
  bool direct_io = true;
  // Read the manifest in parts (formats/SPEC.md §5.5): files, tensors and objects at Open, and at
  // each Load only the fragments of its tensors, so that a rank of a large job reads a small part
  // of the manifest. manifest() then holds the fragments of the tensors loaded so far; Verify
  // reads the rest. Manifests written without a directory are read whole.
  bool manifest_in_parts = false;
};

struct LoadStats {
  uint64_t bytes_read = 0;       // from storage, including alignment slack (each block once per read)
  uint64_t bytes_scattered = 0;  // into targets
  uint64_t chunks_read = 0;
};

struct VerifyReport {
  uint64_t indexes_checked = 0;  // rank indexes, plus the manifest when there is one
  uint64_t chunks_checked = 0;
  uint64_t objects_checked = 0;
  uint64_t bytes_checked = 0;
};

class CheckpointReader {
 public:
  // Opens step `step` under `root`, or the newest complete one. NotFound when the step does not
  // exist or is not complete (the message says what is missing), Corruption when its indexes are
  // damaged.
  static Result<std::unique_ptr<CheckpointReader>> Open(Env* env, const std::string& root,
                                                        std::optional<uint64_t> step,
                                                        const ReaderOptions& options = {});
  ~CheckpointReader();

  uint64_t step() const { return manifest_.step; }
  const std::string& step_dir() const { return step_dir_; }
  // The merged description of the whole checkpoint (all ranks); with manifest_in_parts, only the
  // fragments and chunks of the tensors loaded so far.
  const format::CheckpointIndex& manifest() const { return manifest_; }
  // Bytes of the manifest read so far when it is read in parts; 0 otherwise.
  uint64_t manifest_bytes_read() const;

  // Fills every target with its region of the stored tensors, reading only the chunks that
  // intersect a target and verifying each chunk's checksum before using it. Fails with NotFound
  // naming the tensor when a target's tensor is absent, InvalidArgument when its dtype or global
  // shape differs from the stored one, Corruption when part of a target is covered by no stored
  // fragment, a checksum fails, or a compressed chunk does not decode to its raw length (naming
  // tensor, file and offset). Chunks are checksummed as stored, then decoded; a raw chunk that
  // lands whole in one contiguous stretch of a target is copied and checksummed in one pass, so
  // after a failure the targets' contents are unspecified.
  // Small objects stored next to the chunks read (up to 1 MiB each) are read and checksummed with
  // them, and the next ReadObject of each returns them without reading again.
  Result<LoadStats> Load(const std::vector<TensorShard>& targets);

  // Checks every byte of the checkpoint: decodes every rank index and the manifest (when there is
  // one) and requires the manifest to equal the merge of the rank indexes; checks each data file's
  // size against its index, its whole 4096-byte header and its zero padding; reads every chunk and
  // object, checks its checksum and decodes every compressed chunk. The first problem is returned
  // as Corruption naming the file (and, for a chunk or object, the tensor or object and the byte
  // offset). Unlike Open, it does not accept a damaged manifest beside intact rank indexes.
  Status Verify(VerifyReport* report);

  // The bytes of one per-rank object, checksum-verified.
  Result<std::string> ReadObject(const format::ObjectInfo& object);

 private:
  CheckpointReader(Env* env, std::string step_dir, format::CheckpointIndex manifest, ReaderOptions options);
  // With the manifest read in parts, adds the fragments that meet `wanted` (all when null) not read
  // yet. A damaged part makes the reader fall back to the merge of the rank indexes, as Open does
  // for a damaged manifest.
  Status FetchFragments(const std::vector<format::ManifestPartReader::TensorBox>* wanted);

  Env* env_;
  std::string step_dir_;
  format::CheckpointIndex manifest_;
  ReaderOptions options_;
  std::unique_ptr<format::ManifestPartReader> parts_;
  // Objects the last Load read along with its chunks, checksum-verified, by index into
  // manifest_.objects; ReadObject hands each out once.
  std::unordered_map<uint64_t, std::string> prefetched_objects_;
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_CHECKPOINT_READER_H_
