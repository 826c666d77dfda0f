// What one step directory holds: which save attempts, whether one of them is complete, and the
// manifest of a complete one (read from the manifest file, or merged from the rank indexes).
#ifndef LIFELINE_SRC_STEP_SCAN_H_
#define LIFELINE_SRC_STEP_SCAN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/index_codec.h"
#include "formats/model.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"

namespace lifeline {

struct StepState {
  CheckpointInfo info;                 // complete, world size, ranks present, bytes, problem
  std::string run_hash;                // of the complete attempt, or of the most advanced partial one
  bool has_manifest = false;           // the complete attempt's manifest file exists
  std::vector<std::string> children;   // names in the step directory
};

// Classifies a step directory from its listing: complete iff some attempt (run hash H, world size
// W) has all W rank index files. Deep validation happens in ReadManifest.
Result<StepState> ScanStep(Env* env, const std::string& step_dir, uint64_t step);

// The merged description of a complete step: its manifest file when present and consistent,
// otherwise the rank indexes decoded and merged (BuildManifest). Corruption names the bad file.
Result<format::CheckpointIndex> ReadManifest(Env* env, const StepState& state);

// A complete step's manifest read in parts (formats/SPEC.md §5.5): `head` is the manifest without
// fragments, `parts` fetches the fragments of the tensors a load needs. Null `parts` when the step
// has no manifest file, or one without a directory, or one that failed to open (damaged, or a
// newer version): use ReadManifest then, which decides between the manifest and the rank indexes.
struct ManifestParts {
  std::unique_ptr<format::ManifestPartReader> parts;
  format::CheckpointIndex head;
};
Result<ManifestParts> OpenManifestParts(Env* env, const StepState& state);

// Reads and merges the W rank indexes of attempt (run_hash, world_size).
Result<format::CheckpointIndex> MergeRankIndexes(Env* env, const std::string& step_dir, const std::string& run_hash,
                                                 uint32_t world_size, uint64_t step);

// What a directory listing and the rank indexes say about every step directory under a root,
// newest step first. Complete steps carry their run hash and world size.
Result<std::vector<CheckpointInfo>> ScanCheckpoints(Env* env, const std::string& root);

}  // namespace lifeline

#endif  // LIFELINE_SRC_STEP_SCAN_H_
