// The commit protocol of formats/SPEC.md, shared by every root a rank writes to: the checkpoint
// directory, the memory tier and the drain directory. A step is visible once all W rank indexes of
// one attempt exist; the rank whose index completes the set writes the manifest and applies
// retention. Each function is safe to run concurrently from many ranks on one root.
#ifndef LIFELINE_SRC_COMMIT_H_
#define LIFELINE_SRC_COMMIT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

// Creates `dir` and its missing parents durably (each new entry's parent is synced).
Status CreateDirDurably(Env* env, const std::string& dir);

// Makes root/step-N exist durably for a save of attempt `run_hash` by `rank`: AlreadyExists when
// the step is already committed; removes this rank's index of an earlier try of the same attempt,
// so a retried save is never mistaken for a finished one. Returns the step directory.
Result<std::string> PrepareStepDir(Env* env, const std::string& root, uint64_t step, std::string_view run_hash,
                                   uint32_t rank, uint32_t world_size);

// Publishes `encoded_index` as this rank's index (atomically, durably). When that completes the
// attempt, validates the merge of every rank's index (format::ValidateCoverage: each tensor
// covered exactly once) and writes the manifest, which seals the commit, or, when the pieces cannot
// form a loadable checkpoint, an invalid marker with the reason, returning that reason as
// FailedPrecondition naming the step, tensor and ranks. With `retention`, collects garbage with
// `keep_last` afterwards. Returns whether this call committed the step. Failures after the commit
// point (the manifest write, retention) are logged, not returned: the step is visible either way.
Result<bool> PublishRankIndex(Env* env, const std::string& root, uint64_t step, std::string_view run_hash,
                              uint32_t rank, uint32_t world_size, std::string_view encoded_index,
                              bool retention, uint32_t keep_last);

// Whether a complete step can be loaded as far as its metadata tells: its manifest (or the merge
// of its rank indexes) decodes and covers every tensor exactly. Data is not read.
Status CheckStepMetadata(Env* env, const CheckpointInfo& info);

struct RetentionPolicy {
  // Complete, loadable steps kept (the newest ones); 0 keeps every complete step.
  uint32_t keep_last = 0;
  // Whether a complete step is loadable; asked newest first, only as far as needed to find the
  // newest keep_last loadable steps (or the newest one when keep_last is 0). A step it refuses
  // never counts toward keep_last; its entry is marked not complete, with the reason as problem.
  // Null accepts every complete step.
  std::function<Status(const CheckpointInfo&)> loadable;
  // Partial steps newer than the newest loadable one are kept (a save may still be writing them)
  // unless this says they are stale (they belong to a launch that has ended). Null: none is.
  std::function<bool(const CheckpointInfo&)> stale;
};

// Which entries of `all` (ScanCheckpoints' list, newest first) retention removes: steps marked
// invalid; complete steps, loadable or not, beyond the newest keep_last loadable ones; partial
// steps older than the newest loadable one; stale partial steps. Only loadable steps count, so the
// newest loadable step is never removed. Touches nothing but `all`: `lifeline gc --dry-run` shows the plan with it.
std::vector<bool> RetentionPlan(std::vector<CheckpointInfo>& all, const RetentionPolicy& policy);

// Retention under `root` (the plan above); a kept complete step loses the files of other attempts.
// A step is removed invisibility first (one rank index before anything else). The default policy of
// a saving rank: keep_last, loadable by CheckStepMetadata, partial steps of other launches stale.
Status CollectGarbageIn(Env* env, const std::string& root, const RetentionPolicy& policy);
RetentionPolicy SaverRetention(Env* env, uint32_t keep_last, std::string_view run_hash);

// Removes every step directory under `root` newer than `step` (all of them with nullopt), complete
// or partial, each made invisible first as retention removes it; `removed` gets their steps, newest
// first. A rollback's: no launch may be saving into `root` meanwhile.
Status RemoveStepsAfterIn(Env* env, const std::string& root, std::optional<uint64_t> step,
                          std::vector<uint64_t>* removed);

// Polls until step `step` under `root` is committed; Aborted naming what is missing after the timeout.
Status WaitForCommitIn(Env* env, const std::string& root, uint64_t step, double timeout_seconds);

}  // namespace lifeline

#endif  // LIFELINE_SRC_COMMIT_H_
