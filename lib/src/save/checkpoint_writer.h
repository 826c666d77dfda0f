// The one write sequence of a rank's part of a checkpoint step (formats/SPEC.md, "Commit"): plan
// the step directory, write the data file, publish the rank index, commit when it completes the
// set, and on failure take back the data file that was never published. The persist pipeline,
// the drainer and conversion all write through it, into whichever root they target.
//
// Thread safety: a CheckpointWriter is used by one thread; writers of different ranks (or
// processes) may run concurrently on one root, as the commit protocol allows.
#ifndef LIFELINE_SRC_CHECKPOINT_WRITER_H_
#define LIFELINE_SRC_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/model.h"
#include "lib/src/save/rank_data.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

// Whose files a writer writes: those of rank `rank` of world `world_size`, attempt `run_hash`,
// under `root`.
struct RankFiles {
  std::string root;
  std::string run_hash;
  uint32_t rank = 0;
  uint32_t world_size = 1;
};

// The files of one step: what one CheckpointWriter owns.
struct StepTarget : RankFiles {
  uint64_t step = 0;
};

// How one rank writes its files of every step: keeping the newest `keep_last` loadable steps under
// the root (0: all), with O_DIRECT when `direct_io`. The persist pipeline and the drainer each hold
// one.
struct RankWriterConfig : RankFiles {
  uint32_t keep_last = 0;
  bool direct_io = true;

  StepTarget AtStep(uint64_t step) const { return StepTarget{{*this}, step}; }
};

// What publishing does after the rank index is in place.
struct CommitOptions {
  // Collect garbage under the root (keep_last) when this rank commits the step.
  bool retention = false;
  uint32_t keep_last = 0;
};

struct PublishedIndex {
  std::string encoded_index;  // the bytes published as this rank's index
  bool committed = false;     // whether this rank's index completed the step (and wrote its manifest)
};

class CheckpointWriter {
 public:
  // Plan: makes root/step-S exist durably for this rank's files (PrepareStepDir, commit.h).
  // AlreadyExists when the step is already committed; removes this rank's index of an earlier try
  // of the same attempt, and the files of an ended launch's partial attempt. Errors unannotated.
  static Result<CheckpointWriter> Begin(Env* env, StepTarget target);

  const StepTarget& target() const { return target_; }
  const std::string& step_dir() const { return step_dir_; }
  // The data file and rank index this writer owns (checkpoint_layout.h names).
  std::string data_path() const;
  std::string index_path() const;

  // Write: streams `plan` (fragments from their `source`, else through `reader`) and `objects` into
  // data_path() and returns the rank index describing it, not yet published (WriteRankData,
  // rank_data.h). A caller that writes the data file's bytes itself (a staged image, a drain copy)
  // writes them to data_path() instead.
  Result<format::CheckpointIndex> WriteData(const RankSavePlan& plan,
                                            const std::vector<std::pair<std::string, std::string>>& objects,
                                            const std::string& metadata_json, const RankWriteOptions& options,
                                            const FragmentReader& reader = nullptr) const;

  // Publish and commit: encodes `index` and publishes it as this rank's index; when that completes
  // the attempt, validates coverage and writes the manifest or the invalid marker
  // (PublishRankIndex, commit.h, whose errors it returns unannotated).
  Result<PublishedIndex> Publish(const format::CheckpointIndex& index, const CommitOptions& commit) const;
  // The same for an index already encoded (a drain republishes the source's bytes). Returns
  // whether this call committed the step.
  Result<bool> PublishEncoded(std::string_view encoded_index, const CommitOptions& commit) const;

  // Clean up on failure: removes this rank's data file unless its index was published (a failed
  // save must not keep its bytes; a published one is decided by the commit protocol and
  // retention). Best effort: a removal that fails leaves the file to garbage collection.
  void DiscardUnpublished() const;

 private:
  CheckpointWriter(Env* env, StepTarget target, std::string step_dir)
      : env_(env), target_(std::move(target)), step_dir_(std::move(step_dir)) {}

  Env* env_;
  StepTarget target_;
  std::string step_dir_;
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_CHECKPOINT_WRITER_H_
