#include "agent/resume.h"

#include <cstdio>
#include <random>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/trace.h"

namespace lifeline::agent {
namespace {

// The newest sound complete step under `root`, or nullopt.
Result<std::optional<uint64_t>> NewestSound(Env* env, const std::string& root) {
  if (!env->IsDirectory(root)) return std::optional<uint64_t>();
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpointDirectory(root, env));
  for (const CheckpointInfo& info : all)
    if (info.complete && CheckCheckpointMetadata(info, env).ok()) return std::optional<uint64_t>(info.step);
  return std::optional<uint64_t>();
}

}  // namespace

Result<ResumePoint> FindResumePoint(Env* env, const std::string& checkpoint_dir) {
  ResumePoint point;
  LL_ASSIGN_OR_RETURN(std::optional<uint64_t> disk, NewestSound(env, checkpoint_dir));
  std::optional<uint64_t> memory;
  if (Result<std::string> tier = FindMemoryTierOf(checkpoint_dir, env); tier.ok()) {
    Result<std::optional<uint64_t>> found = NewestSound(env, *tier);
    if (found.ok()) memory = *found;
  }
  if (memory && (!disk || *memory > *disk)) {
    point.step = memory;
    point.location = "memory";
  } else if (disk) {
    point.step = disk;
    point.location = "disk";
  }
  return point;
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
