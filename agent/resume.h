// The step a launch resumes from, fixed by the agent before the ranks start so that every rank of
// the launch loads the same one (LIFELINE_RESUME_STEP), whatever each finds in its own memory tier.
#ifndef LIFELINE_AGENT_RESUME_H_
#define LIFELINE_AGENT_RESUME_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/rollback.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline::agent {

struct ResumePoint {
  std::optional<uint64_t> step;  // nullopt: no complete checkpoint, a fresh start
  std::string location;          // "memory" or "disk" (where the newest copy is); "" with no step
  std::string EnvValue() const { return step ? std::to_string(*step) : "none"; }
};

// The newest step of `checkpoint_dir` that is complete and sound as far as its metadata tells
// (every rank's index present, the pieces covering every tensor), on disk or in this node's
// memory tier (where every rank's snapshot must be present). Damaged and invalid steps are passed
// over. NotFound-free: a directory that does not exist yet means a fresh start.
Result<ResumePoint> FindResumePoint(Env* env, const std::string& checkpoint_dir);

// Every step of `checkpoint_dir` a launch could resume from (complete and sound, as FindResumePoint
// judges them), on disk and in this node's memory tier: what a rollback chooses from
// (ChooseRollbackPoint). Empty for a directory that does not exist yet.
Result<std::vector<ResumableStep>> ListResumableSteps(Env* env, const std::string& checkpoint_dir);

// A rollback's clearing: removes the steps of `checkpoint_dir` (unless `disk` is false: another
// node of the job clears the shared directory) and of this node's memory tier newer than `step`
// (all with nullopt). Returns the steps removed, newest first, each once.
Result<std::vector<uint64_t>> RemoveStepsAfterRollback(Env* env, const std::string& checkpoint_dir,
                                                       std::optional<uint64_t> step, bool disk = true);

// Where one node could resume from: its view of the shared checkpoint directory and of its own
// memory tier. The agents of a multi-node job resume from a step every node has (rendezvous.h).
struct ResumeOffer {
  std::string directory;               // the checkpoint directory this node knows; "" when none
  std::optional<uint64_t> disk_step;   // newest sound step on (shared) storage
  std::vector<uint64_t> disk_steps;    // the newest two sound steps there, newest first (a rollback
                                       // resumes below a bound: rendezvous.cc, ChooseResume)
  std::vector<uint64_t> memory_steps;  // sound steps in this node's memory tier, newest first
  // The newest step this node's tier holds some ranks of but not all (newer than any sound one):
  // a step whose other ranks were on a node now lost, unreplicated. Only for saying why it is not
  // the resume step.
  std::optional<uint64_t> memory_incomplete_step;
};
Result<ResumeOffer> FindResumeOffer(Env* env, const std::string& checkpoint_dir);

// Where rank processes tell the agent which directory they checkpoint to: a file in the agent's
// run directory, written by the library at Checkpointer::Open (first writer wins). Empty when
// nothing was reported.
std::string ReportedCheckpointDir(const std::string& run_dir);

// 16 random hex digits: with the job id and the restart count, the launch id (LIFELINE_LAUNCH_ID).
std::string NewLaunchNonce();

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_RESUME_H_
