// The rollback policy (config: policy.non_finite / policy.spike: rollback, and RollbackConfig): on a
// non-finite value or a spike first seen at step S, the ranks are stopped and relaunched from the
// newest complete checkpoint taken before S. A checkpoint saved at S or later may hold the damage
// (the update of step S is applied before its save), so it is passed over, and removed before the
// relaunch: the relaunched ranks save those step numbers again, and a later restart must never
// resume from them.
//
// Everything here is a pure function of what it is given (the checkpoint listing, the anomaly, the
// rollbacks decided before): the Supervisor decides with it, its tests and lifeline-sim run the
// same code. Reading and removing checkpoints is the agent's (agent/resume.h).
//
// Thread safety: none; RollbackLedger is owned by one Supervisor.
#ifndef LIFELINE_AGENT_ROLLBACK_H_
#define LIFELINE_AGENT_ROLLBACK_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/config.h"
#include "agent/detector.h"

namespace lifeline::agent {

// A step the job could resume from: complete and sound (agent/resume.h, ListResumableSteps).
struct ResumableStep {
  uint64_t step = 0;
  std::string location;  // "memory" (this node's memory tier) or "disk"
};

// Steps first..last, both included.
struct StepRange {
  uint64_t first = 0;
  uint64_t last = 0;
  bool operator==(const StepRange& o) const { return first == o.first && last == o.last; }
};

// "41-47,60" (a range of one step is its number): LIFELINE_SKIP_STEPS as the ranks read it
// (lifeline.skip_steps()). Ranges are written as given.
std::string FormatStepRanges(const std::vector<StepRange>& ranges);

// Where a rollback from an anomaly at `anomaly_step` resumes.
struct RollbackPoint {
  std::optional<uint64_t> step;  // nullopt: no checkpoint before the anomaly, the ranks start from scratch
  std::string location;          // "memory" or "disk" ("" with no step)
  // Complete checkpoints at or after the anomaly's step, newest first: they may hold the damage.
  std::vector<uint64_t> passed_over;
  std::string why;  // the choice in words, for the events log
};

// The newest step of `listing` (any order; a step may appear once per location) before
// `anomaly_step`, from the memory tier when the tier holds it (as FindResumePoint prefers it).
RollbackPoint ChooseRollbackPoint(const std::vector<ResumableStep>& listing, uint64_t anomaly_step);

// The last step an anomaly names: a spike's last high value (evidence "steps"), else its step.
// nullopt when it names none.
std::optional<uint64_t> AnomalyLastStep(const Anomaly& anomaly);

// One rollback decided (RollbackLedger::Decide).
struct RollbackDecision {
  std::string give_up;  // why not to relaunch; "" to roll back
  RollbackPoint point;
  uint64_t anomaly_step = 0;
  uint64_t reached_step = 0;    // the newest step a rank had begun when the ranks were stopped
  uint32_t repeat = 0;          // rollbacks to this checkpoint before this one
  // The data this rollback skips (rollback.skip_data): every step rolled back, the one after the
  // checkpoint to `reached_step`.
  std::optional<StepRange> skipped;
  std::vector<StepRange> skip;       // every range the relaunch skips: this one's and earlier ones' still ahead
  // Steps trained again: from the one after the checkpoint to `reached_step`.
  uint64_t steps_rolled_back() const;
  // The events-log line ("action": "rollback" or "rollback_give_up") with the evidence.
  nlohmann::json Record(const Anomaly& anomaly) const;
};

// The rollbacks of one job: how many went to each checkpoint, and the steps whose data the job
// skips from now on.
class RollbackLedger {
 public:
  explicit RollbackLedger(const RollbackConfig& config) : config_(config) {}

  // A rollback for `anomaly` (non_finite or spike, with a step) after the ranks reached
  // `reached_step`, over the resumable steps `listing`: where to resume and what to skip, or why
  // to give up (`max_per_checkpoint` rollbacks to the chosen checkpoint already, the fault back
  // each time). A decision to roll back is recorded: the next decision counts it.
  RollbackDecision Decide(const Anomaly& anomaly, uint64_t reached_step, const std::vector<ResumableStep>& listing);

  // The ranges a launch resuming from `resume_step` (nullopt: from scratch) skips: those decided so
  // far that end after it, clipped to start after it.
  std::vector<StepRange> SkipAfter(std::optional<uint64_t> resume_step) const;

  uint64_t rollbacks() const { return rollbacks_; }

 private:
  const RollbackConfig config_;
  // Rollbacks decided per checkpoint (-1: from scratch).
  std::map<int64_t, uint32_t> to_checkpoint_;
  std::vector<StepRange> skip_;  // in the order decided
  uint64_t rollbacks_ = 0;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_ROLLBACK_H_
