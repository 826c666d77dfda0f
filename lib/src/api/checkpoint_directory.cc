// The read-only directory functions of lifeline/checkpoint.h, over the library's scanner, the
// commit rules and the memory tier's naming.
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/commit.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/store/step_scan.h"
#include "lib/src/tier/memory_tier.h"
#include "lifeline/checkpoint.h"

namespace lifeline {
namespace {
}  // namespace

Result<std::vector<CheckpointInfo>> ScanCheckpointDirectory(const std::string& root, Env* env) {
  return ScanCheckpoints(Env::OrDefault(env), root);
}

Status CheckCheckpointMetadata(const CheckpointInfo& info, Env* env) { return CheckStepMetadata(Env::OrDefault(env), info); }

Result<std::string> FindMemoryTierOf(const std::string& dir, Env* env) { return FindMemoryTierRoot(Env::OrDefault(env), dir); }

Result<std::vector<CheckpointInfo>> ScanMemoryTierOf(const std::string& dir, Env* env) {
  LL_ASSIGN_OR_RETURN(std::string root, FindMemoryTierRoot(Env::OrDefault(env), dir));
  return ListTierSteps(Env::OrDefault(env), dir, root);
}

Status MarkStepSuspect(const std::string& root, uint64_t step, const std::string& json, Env* env) {
  env = Env::OrDefault(env);
  if (json.size() > kMaxSuspectMarkerBytes)
    return Status::InvalidArgument("suspect marker of step " + std::to_string(step), "larger than 64 KiB");
  const std::string dir = JoinPath(root, StepDirName(step));
  Status made = env->CreateDir(dir);
  if (!made.ok() && !env->IsDirectory(dir)) return made;
  return WriteFileAtomically(env, JoinPath(dir, kSuspectMarkerName), json);
}

Result<VerifyResult> VerifyCheckpoint(const std::string& root, std::optional<uint64_t> step, Env* env) {
  LL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(Env::OrDefault(env), root, step));
  VerifyReport report;
  VerifyResult result;
  result.status = reader->Verify(&report);
  result.step = reader->step();
  result.directory = reader->step_dir();
  result.indexes_checked = report.indexes_checked;
  result.chunks_checked = report.chunks_checked;
  result.objects_checked = report.objects_checked;
  result.bytes_checked = report.bytes_checked;
  if (Result<StepState> state = ScanStep(Env::OrDefault(env), reader->step_dir(), reader->step()); state.ok()) {
    result.suspect = state->info.suspect;
    result.suspect_reason = state->info.suspect_reason;
  }
  return result;
}

}  // namespace lifeline
