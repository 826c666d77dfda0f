// The commit protocol of formats/SPEC.md, shared by every root a rank writes to: the checkpoint
// directory, the memory tier and the drain directory. A step is visible once all W rank indexes of
// one attempt exist; the rank whose index completes the set writes the manifest and applies
// retention. Each function is safe to run concurrently from many ranks on one root.
#ifndef LIFELINE_SRC_COMMIT_H_
#define LIFELINE_SRC_COMMIT_H_

#include <cstdint>
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
// attempt, writes the manifest and, if `retention` is set, collects garbage with `keep_last`.
// Returns whether this call committed the step. Failures after the commit point (manifest,
// retention) are logged, not returned: the step is visible either way.
Result<bool> PublishRankIndex(Env* env, const std::string& root, uint64_t step, std::string_view run_hash,
                              uint32_t rank, uint32_t world_size, std::string_view encoded_index,
                              bool retention, uint32_t keep_last);

// Which entries of `all` (ScanCheckpoints' list, newest first) retention removes: partial steps
// older than the newest complete one and, when keep_last > 0, complete ones beyond the newest
// keep_last. Pure: `lifeline gc --dry-run` shows it without touching anything.
std::vector<bool> RetentionPlan(const std::vector<CheckpointInfo>& all, uint32_t keep_last);

// Retention under `root` (the plan above): removes partial steps older than the newest complete one and, when
// keep_last > 0, complete ones beyond the newest keep_last; a kept step loses the files of other
// attempts. A step is removed invisibility first (one rank index before anything else).
Status CollectGarbageIn(Env* env, const std::string& root, uint32_t keep_last);

// Polls until step `step` under `root` is committed; Aborted naming what is missing after the timeout.
Status WaitForCommitIn(Env* env, const std::string& root, uint64_t step, double timeout_seconds);

}  // namespace lifeline

#endif  // LIFELINE_SRC_COMMIT_H_
