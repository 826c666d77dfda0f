#include "lib/src/save/commit.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "formats/index_codec.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/store/step_scan.h"
#include "lifeline/log.h"

namespace lifeline {
namespace {

// Removes a step directory so that it stops being visible first: one rank index goes before
// anything else, so a crash half-way leaves a partial step, never a complete one with holes.
Status RemoveStep(Env* env, const StepState& state) {
  const std::string& dir = state.info.directory;
  if (state.info.complete) {
    Status s = env->RemoveFile(JoinPath(dir, IndexFileName(state.run_hash, 0, state.info.world_size)));
    if (!s.ok() && !s.IsNotFound()) return s;
    LL_RETURN_IF_ERROR(env->SyncDir(dir));
  }
  // Uploads a dead writer left in it (an object store's) would otherwise be kept, and billed, forever.
  Result<size_t> aborted = env->AbortIncompleteWrites(dir);
  if (!aborted.ok()) Log(LogLevel::kWarning, "removing " + dir + ": " + aborted.status().ToString());
  return env->RemoveTree(dir);
}

// The files of other save attempts in `step_dir` when it holds a rank index of another attempt and
// no file of attempt `run_hash`; empty otherwise.
std::vector<std::string> OtherAttemptFiles(Env* env, const std::string& step_dir, const std::string& run_hash) {
  Result<std::vector<std::string>> children = env->GetChildren(step_dir);
  if (!children.ok()) return {};
  std::vector<std::string> others;
  bool foreign_index = false;
  for (const std::string& name : *children) {
    if (name.rfind(run_hash, 0) == 0) return {};
    if (ParseIndexFileName(name)) foreign_index = true;
    if (name.size() > 17 && name[16] == '.') others.push_back(name);
  }
  return foreign_index ? others : std::vector<std::string>{};
}

std::string ParentDir(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;
  const size_t slash = path.rfind('/', end - 1);
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

// A directory entry survives a crash only once its parent is synced; without that a whole
// checkpoint root could vanish with the machine.
Status CreateDirDurably(Env* env, const std::string& dir) {
  if (IsObjectStorePath(dir)) return env->CreateDir(dir);  // prefixes exist while objects do
  std::vector<std::string> created;  // deepest first
  for (std::string p = dir; !p.empty() && p != "/" && p != "." && !env->IsDirectory(p); p = ParentDir(p))
    created.push_back(p);
  LL_RETURN_IF_ERROR(env->CreateDir(dir));
  for (auto it = created.rbegin(); it != created.rend(); ++it) LL_RETURN_IF_ERROR(env->SyncDir(ParentDir(*it)));
  return Status::OK();
}

Result<std::string> PrepareStepDir(Env* env, const std::string& root, uint64_t step, std::string_view run_hash,
                                   uint32_t rank, uint32_t world_size) {
  const std::string step_dir = JoinPath(root, StepDirName(step));
  LL_RETURN_IF_ERROR(env->CreateDir(step_dir));
  // Files written through a link would land wherever it points.
  if (env->GetEntryType(step_dir).value_or(EntryType::kDirectory) == EntryType::kSymlink)
    return SymlinkRefused(step_dir).Annotate("step " + std::to_string(step) + " cannot be saved");
  LL_RETURN_IF_ERROR(env->SyncDir(root));
  LL_ASSIGN_OR_RETURN(StepState state, ScanStep(env, step_dir, step));
  if (state.info.complete)
    return Status::AlreadyExists(step_dir, "step " + std::to_string(step) + " is already committed");
  Status s = env->RemoveFile(JoinPath(step_dir, IndexFileName(run_hash, rank, world_size)));
  if (!s.ok() && !s.IsNotFound()) return s;
  // A partial attempt of an ended launch at this step can never complete: its space is ours now.
  for (const std::string& name : OtherAttemptFiles(env, step_dir, std::string(run_hash))) {
    Status removed = env->RemoveFile(JoinPath(step_dir, name));
    if (!removed.ok() && !removed.IsNotFound()) return removed;
  }
  return step_dir;
}

Result<bool> PublishRankIndex(Env* env, const std::string& root, uint64_t step, std::string_view run_hash,
                              uint32_t rank, uint32_t world_size, std::string_view encoded_index,
                              bool retention, uint32_t keep_last) {
  const std::string step_dir = JoinPath(root, StepDirName(step));
  LL_RETURN_IF_ERROR(WriteFileAtomically(env, JoinPath(step_dir, IndexFileName(run_hash, rank, world_size)), encoded_index));
  LL_ASSIGN_OR_RETURN(StepState state, ScanStep(env, step_dir, step));
  if (!state.info.complete || state.run_hash != run_hash || state.info.world_size != world_size) return false;
  const std::string where = "step " + std::to_string(step) + " in " + root;
  // The last index completes the set; the merge decides whether it is a checkpoint at all. Every
  // rank that waits for the commit sees the verdict: the manifest, or the invalid marker.
  Result<format::CheckpointIndex> manifest = MergeRankIndexes(env, step_dir, std::string(run_hash), world_size, step);
  // A data file gone from the listing was removed while the step was being saved (a gc of partial
  // steps run against a live job): such a step must never be published as loadable.
  if (manifest.ok()) {
    const std::set<std::string> present(state.children.begin(), state.children.end());
    for (const format::FileInfo& f : manifest->files) {
      if (present.count(f.name)) continue;
      manifest = Status::Corruption(JoinPath(step_dir, f.name),
                                    "data file of rank " + std::to_string(f.rank) +
                                        " is missing: it was removed while the step was being saved (was "
                                        "`lifeline gc --partial --force` run against this job?)");
      break;
    }
  }
  if (!manifest.ok()) {
    if (!manifest.status().IsCorruption()) return manifest.status().Annotate(where + " cannot be committed");
    const std::string reason = std::string(manifest.status().message());
    Status marked = WriteFileAtomically(env, JoinPath(step_dir, InvalidMarkerFileName(run_hash, world_size)), reason,
                                        /*replace=*/false);
    if (!marked.ok() && !marked.IsAlreadyExists())
      Log(LogLevel::kWarning, where + ": cannot mark the step invalid: " + marked.ToString());
    return Status::FailedPrecondition(where, "cannot be committed, every rank's index is present but " + reason);
  }
  Result<std::string> bytes = format::EncodeIndex(*manifest);
  Status written = bytes.ok() ? WriteFileAtomically(env, JoinPath(step_dir, ManifestFileName(run_hash, world_size)), *bytes)
                              : bytes.status();
  // Readers merge the rank indexes of an unsealed step themselves, so a failed manifest write
  // must not fail the save (a retry would find the step committed and get AlreadyExists).
  if (!written.ok())
    Log(LogLevel::kWarning, where + " committed, but its manifest was not written (readers merge the rank indexes "
                                    "instead): " + written.ToString());
  if (retention) {
    Status gc = CollectGarbageIn(env, root, SaverRetention(env, keep_last, run_hash));
    if (!gc.ok()) Log(LogLevel::kWarning, "garbage collection after " + where + ": " + gc.ToString());
  }
  return true;
}

Status CheckStepMetadata(Env* env, const CheckpointInfo& info) {
  LL_ASSIGN_OR_RETURN(StepState state, ScanStep(env, info.directory, info.step));
  // A suspect step's metadata is sound, but it is no step to resume from or to count as kept.
  if (info.suspect || state.info.suspect)
    return Status::FailedPrecondition(info.directory, "marked suspect: " +
                                                          (info.suspect ? info.suspect_reason : state.info.suspect_reason));
  return ReadManifest(env, state).status();
}

std::vector<bool> RetentionPlan(std::vector<CheckpointInfo>& all, const RetentionPolicy& policy) {
  std::vector<bool> remove(all.size(), false);
  std::optional<uint64_t> newest_loadable;
  uint32_t kept = 0;
  for (size_t i = 0; i < all.size(); ++i) {  // newest first
    CheckpointInfo& info = all[i];
    if (info.invalid) {
      remove[i] = true;
      continue;
    }
    const bool older_than_loadable = newest_loadable.has_value() && info.step < *newest_loadable;
    if (info.complete) {
      if (newest_loadable && (policy.keep_last == 0 || kept >= policy.keep_last)) {
        // keep_last 0 keeps every complete step older than the newest loadable one, unchecked.
        remove[i] = policy.keep_last != 0;
        continue;
      }
      Status s = policy.loadable ? policy.loadable(info) : Status::OK();
      if (s.ok()) {
        ++kept;
        if (!newest_loadable) newest_loadable = info.step;
        continue;
      }
      info.complete = false;
      info.problem = "cannot be loaded: " + s.ToString();
      // Never counted; kept until keep_last loadable steps are newer (it may hold what a person
      // can still recover, and its damage may be only a manifest the rank indexes replace).
      remove[i] = policy.keep_last != 0 && kept >= policy.keep_last;
      continue;
    }
    // Partial: useless once something newer loads; a newer one may still be being written.
    remove[i] = older_than_loadable || (policy.stale && policy.stale(info));
  }
  return remove;
}

RetentionPolicy SaverRetention(Env* env, uint32_t keep_last, std::string_view run_hash) {
  RetentionPolicy policy;
  policy.keep_last = keep_last;
  policy.loadable = [env](const CheckpointInfo& info) { return CheckStepMetadata(env, info); };
  // A partial step holding rank indexes of other launches and no file of this one belongs to a
  // launch that has ended: it can never complete, and after a full disk it holds the space the
  // next save needs. (An empty step directory may be a save of this launch just starting.)
  policy.stale = [env, hash = std::string(run_hash)](const CheckpointInfo& info) {
    return !OtherAttemptFiles(env, info.directory, hash).empty();
  };
  return policy;
}

Status CollectGarbageIn(Env* env, const std::string& root, const RetentionPolicy& policy) {
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(env, root));
  const std::vector<bool> remove = RetentionPlan(all, policy);
  for (size_t i = 0; i < all.size(); ++i) {
    const CheckpointInfo& info = all[i];
    if (!remove[i] && !info.complete) continue;  // a partial step newer than every loadable one
    Result<StepState> scanned = ScanStep(env, info.directory, info.step);
    if (scanned.status().IsNotFound() && !env->FileExists(info.directory)) continue;  // another rank's GC
    LL_ASSIGN_OR_RETURN(StepState state, std::move(scanned));
    if (remove[i]) {
      LL_RETURN_IF_ERROR(RemoveStep(env, state));
      continue;
    }
    // A kept complete step: leftovers of other attempts at it are never read again.
    char world[16];
    std::snprintf(world, sizeof(world), "of-%06u.", info.world_size);
    for (const std::string& name : state.children) {
      const bool ours = name.rfind(state.run_hash + ".", 0) == 0 && name.find(world) != std::string::npos;
      if (!ours && (ParseIndexFileName(name) || (name.size() > 17 && name[16] == '.'))) {
        Status s = env->RemoveFile(JoinPath(info.directory, name));
        if (!s.ok() && !s.IsNotFound()) return s;
      }
    }
  }
  return env->SyncDir(root);
}

Status RemoveStepsAfterIn(Env* env, const std::string& root, std::optional<uint64_t> step,
                          std::vector<uint64_t>* removed) {
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(env, root));
  for (const CheckpointInfo& info : all) {  // newest first
    if (step && info.step <= *step) break;
    Result<StepState> scanned = ScanStep(env, info.directory, info.step);
    if (scanned.status().IsNotFound() && !env->FileExists(info.directory)) continue;
    LL_ASSIGN_OR_RETURN(StepState state, std::move(scanned));
    LL_RETURN_IF_ERROR(RemoveStep(env, state));
    if (removed != nullptr) removed->push_back(info.step);
  }
  return env->SyncDir(root);
}

Status WaitForCommitIn(Env* env, const std::string& root, uint64_t step, double timeout_seconds) {
  const std::string step_dir = JoinPath(root, StepDirName(step));
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_seconds);
  std::optional<Clock::time_point> unsealed_since;
  // Each look at an object store is a HEAD and two LISTs per rank: polled gently, at most 5 a second.
  const bool remote = IsObjectStorePath(root);
  auto pause = std::chrono::milliseconds(remote ? 20 : 1);
  const auto longest_pause = std::chrono::milliseconds(remote ? 200 : 100);
  for (;;) {
    std::string problem = "no such step";
    if (env->IsDirectory(step_dir)) {
      LL_ASSIGN_OR_RETURN(StepState state, ScanStep(env, step_dir, step));
      if (state.info.invalid) return Status::FailedPrecondition(step_dir, state.info.problem);
      if (state.has_manifest) return Status::OK();
      problem = state.info.problem;
      if (state.info.complete) {
        // Every index is present but the committing rank has not sealed the step yet: give it a
        // moment, then decide alone (the merge is deterministic, so every rank reaches one verdict).
        if (!unsealed_since) unsealed_since = Clock::now();
        if (Clock::now() - *unsealed_since >= std::chrono::seconds(2) || Clock::now() >= deadline) {
          Result<format::CheckpointIndex> merged =
              MergeRankIndexes(env, step_dir, state.run_hash, state.info.world_size, step);
          if (merged.ok()) return Status::OK();
          if (!merged.status().IsCorruption()) return merged.status();
          return Status::FailedPrecondition(step_dir, "cannot be committed, every rank's index is present but " +
                                                          std::string(merged.status().message()));
        }
        problem = "every rank's index is present, the step is being sealed";
      }
    } else {
      // Retention removes a step only once newer ones are complete; waiting longer cannot help.
      LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(env, root));
      for (const CheckpointInfo& info : all)
        if (info.complete && info.step > step)
          return Status::Unavailable(step_dir, "removed by retention: step " + std::to_string(info.step) +
                                                   " is complete and newer");
    }
    if (Clock::now() >= deadline)
      return Status::Aborted(step_dir, "not committed after " + std::to_string(timeout_seconds) + " s: " + problem);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, longest_pause);
  }
}

}  // namespace lifeline
