#include "agent/resume.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/inspect.h"
#include "lifeline/trace.h"

namespace lifeline::agent {
namespace {

// Every step directory under `root`, newest first; none when it does not exist yet.
Result<std::vector<CheckpointInfo>> ScanSteps(Env* env, const std::string& root) {
  if (!env->IsDirectory(root)) return std::vector<CheckpointInfo>{};
  return ScanCheckpointDirectory(root, env);
}

// The sound complete steps of `all` (newest first); at most `most` of them.
std::vector<uint64_t> SoundSteps(Env* env, const std::vector<CheckpointInfo>& all, size_t most) {
  std::vector<uint64_t> out;
  for (const CheckpointInfo& info : all) {
    if (out.size() >= most) break;
    if (info.complete && CheckCheckpointMetadata(info, env).ok()) out.push_back(info.step);
  }
  return out;
}

// The newest sound complete step under `root`, or nullopt.
Result<std::optional<uint64_t>> NewestSound(Env* env, const std::string& root) {
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanSteps(env, root));
  const std::vector<uint64_t> steps = SoundSteps(env, all, 1);
  return steps.empty() ? std::optional<uint64_t>() : std::optional<uint64_t>(steps[0]);
}

}  // namespace

Result<ResumePoint> FindResumePoint(Env* env, const std::string& checkpoint_dir) {
  ResumePoint point;
  LL_ASSIGN_OR_RETURN(std::optional<uint64_t> disk, NewestSound(env, checkpoint_dir));
  std::optional<uint64_t> memory;
  if (Result<std::vector<CheckpointInfo>> tier = ScanMemoryTierOf(checkpoint_dir, env); tier.ok()) {
    const std::vector<uint64_t> steps = SoundSteps(env, *tier, 1);
    if (!steps.empty()) memory = steps[0];
  }
  // The ranks load a step from memory whenever the tier holds it, also when the disk has it too.
  if (memory && (!disk || *memory >= *disk)) {
    point.step = memory;
    point.location = "memory";
  } else if (disk) {
    point.step = disk;
    point.location = "disk";
  }
  return point;
}

Result<std::vector<ResumableStep>> ListResumableSteps(Env* env, const std::string& checkpoint_dir) {
  std::vector<ResumableStep> out;
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> disk, ScanSteps(env, checkpoint_dir));
  for (uint64_t step : SoundSteps(env, disk, disk.size())) out.push_back({step, "disk"});
  if (Result<std::vector<CheckpointInfo>> tier = ScanMemoryTierOf(checkpoint_dir, env); tier.ok())
    for (uint64_t step : SoundSteps(env, *tier, tier->size())) out.push_back({step, "memory"});
  return out;
}

Result<std::vector<uint64_t>> RemoveStepsAfterRollback(Env* env, const std::string& checkpoint_dir,
                                                       std::optional<uint64_t> step, bool disk) {
  std::vector<uint64_t> removed;
  if (disk && env->IsDirectory(checkpoint_dir)) {
    LL_ASSIGN_OR_RETURN(removed, RemoveStepsAfter(checkpoint_dir, step, env));
  }
  // The memory tier's copies too: a later restart prefers the tier, and the relaunch saves these
  // step numbers into it again.
  if (Result<std::string> tier = FindMemoryTierOf(checkpoint_dir, env); tier.ok()) {
    LL_ASSIGN_OR_RETURN(std::vector<uint64_t> in_tier, RemoveStepsAfter(*tier, step, env));
    removed.insert(removed.end(), in_tier.begin(), in_tier.end());
  }
  std::sort(removed.begin(), removed.end(), std::greater<>());
  removed.erase(std::unique(removed.begin(), removed.end()), removed.end());
  return removed;
}

Result<ResumeOffer> FindResumeOffer(Env* env, const std::string& checkpoint_dir) {
  ResumeOffer offer;
  offer.directory = checkpoint_dir;
  {
    LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanSteps(env, checkpoint_dir));
    // The newest two: a rollback's round resumes below a bound, and the deciding node has removed
    // the steps from the bound on before the others offer theirs; the second covers a save that
    // committed in between. Each costs a check of its metadata (every rank's index), at every join.
    offer.disk_steps = SoundSteps(env, all, 2);
    if (!offer.disk_steps.empty()) offer.disk_step = offer.disk_steps[0];
  }
  if (Result<std::vector<CheckpointInfo>> tier = ScanMemoryTierOf(checkpoint_dir, env); tier.ok()) {
    const std::vector<CheckpointInfo>& all = *tier;
    // A tier holds a few steps; more would only make the rendezvous entries longer.
    offer.memory_steps = SoundSteps(env, all, 16);
    for (const CheckpointInfo& info : all) {
      if (!offer.memory_steps.empty() && info.step <= offer.memory_steps[0]) break;  // newest first
      if (!info.complete && info.ranks_present > 0) {
        offer.memory_incomplete_step = info.step;
        break;
      }
    }
  }
  return offer;
}

std::string ReportedCheckpointDir(const std::string& run_dir) {
  Result<std::string> dir = ReadFileToString(Env::Default(), JoinPath(run_dir, trace::kCheckpointDirFile), 64 << 10);
  return dir.ok() ? *dir : std::string();
}

std::string NewLaunchNonce() {
  std::random_device device;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%08x%08x", static_cast<unsigned>(device()), static_cast<unsigned>(device()));
  return buf;
}

}  // namespace lifeline::agent
