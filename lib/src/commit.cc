#include "lib/src/commit.h"

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "formats/index_codec.h"
#include "lib/src/checkpoint_layout.h"
#include "lib/src/checkpoint_reader.h"
#include "lib/src/step_scan.h"
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
  return RemoveDirRecursively(env, dir);
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
  LL_RETURN_IF_ERROR(env->SyncDir(root));
  LL_ASSIGN_OR_RETURN(StepState state, ScanStep(env, step_dir, step));
  if (state.info.complete)
    return Status::AlreadyExists(step_dir, "step " + std::to_string(step) + " is already committed");
  Status s = env->RemoveFile(JoinPath(step_dir, IndexFileName(run_hash, rank, world_size)));
  if (!s.ok() && !s.IsNotFound()) return s;
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
  // The last index was the commit point: the step is visible now. The manifest only spares readers
  // the merge, so failing to write it must not fail the save (a retry would find the step
  // committed and get AlreadyExists).
  Result<format::CheckpointIndex> manifest = MergeRankIndexes(env, step_dir, std::string(run_hash), world_size, step);
  if (!manifest.ok()) return manifest.status().Annotate(where + " cannot be committed");
  Result<std::string> bytes = format::EncodeIndex(*manifest);
  Status written = bytes.ok() ? WriteFileAtomically(env, JoinPath(step_dir, ManifestFileName(run_hash, world_size)), *bytes)
                              : bytes.status();
  if (!written.ok())
    Log(LogLevel::kWarning, where + " committed, but its manifest was not written (readers merge the rank indexes "
                                    "instead): " + written.ToString());
  if (retention) {
    Status gc = CollectGarbageIn(env, root, keep_last);
    if (!gc.ok()) Log(LogLevel::kWarning, "garbage collection after " + where + ": " + gc.ToString());
  }
  return true;
}

std::vector<bool> RetentionPlan(const std::vector<CheckpointInfo>& all, uint32_t keep_last) {
  std::vector<bool> remove(all.size(), false);
  std::optional<uint64_t> newest_complete;
  uint32_t kept = 0;
  for (size_t i = 0; i < all.size(); ++i) {  // newest first
    const CheckpointInfo& info = all[i];
    if (info.complete) {
      if (!newest_complete) newest_complete = info.step;
      if (keep_last == 0 || kept < keep_last) {
        ++kept;
      } else {
        remove[i] = true;
      }
    } else if (newest_complete && info.step < *newest_complete) {
      remove[i] = true;
    }
  }
  return remove;
}

Status CollectGarbageIn(Env* env, const std::string& root, uint32_t keep_last) {
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(env, root));
  const std::vector<bool> remove = RetentionPlan(all, keep_last);
  for (size_t i = 0; i < all.size(); ++i) {
    const CheckpointInfo& info = all[i];
    if (!remove[i] && !info.complete) continue;  // a partial step newer than every complete one
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

Status WaitForCommitIn(Env* env, const std::string& root, uint64_t step, double timeout_seconds) {
  const std::string step_dir = JoinPath(root, StepDirName(step));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    std::string problem = "no such step";
    if (env->IsDirectory(step_dir)) {
      LL_ASSIGN_OR_RETURN(StepState state, ScanStep(env, step_dir, step));
      if (state.info.complete) return Status::OK();
      problem = state.info.problem;
    } else {
      // Retention removes a step only once newer ones are complete; waiting longer cannot help.
      LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(env, root));
      for (const CheckpointInfo& info : all)
        if (info.complete && info.step > step)
          return Status::Unavailable(step_dir, "removed by retention: step " + std::to_string(info.step) +
                                                   " is complete and newer");
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Aborted(step_dir, "not committed after " + std::to_string(timeout_seconds) + " s: " + problem);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

}  // namespace lifeline
