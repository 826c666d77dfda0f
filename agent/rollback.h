// The rollback policy (config: policy.non_finite / policy.spike / policy.sdc_suspect: rollback, and
// RollbackConfig): on a non-finite value or a spike first seen at step S, or replicas found to
// differ at the snapshot of step S, the ranks are stopped and relaunched from the newest complete
// checkpoint taken before S that is not suspect. A checkpoint saved at S or later may hold the damage
// (the update of step S is applied before its save), so it is passed over, and removed before the
// relaunch: the relaunched ranks save those step numbers again, and a later restart must never
// resume from them.
//
// A checkpoint after which the fault comes back at once (the first step after a relaunch from it)
// holds the damage itself: an update or optimizer state gone bad in the step it saved shows only
// in the next step's values. The next rollback passes over it too, without skipping data.
//
// Replicas found to differ (sdc_suspect) are a fault of a machine, not of the data: their rollback
// never skips data, and a repeat on one node takes the node out (RollbackConfig::sdc_per_node).
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
  // The nodes (by name) of the anomaly's ranks, when known: the evidence says where it happened.
  std::vector<std::string> nodes;
  // An sdc_suspect on a node that had rollback.sdc_per_node of them (this one counted): the node
  // to leave out of the job ("" otherwise). A multi-node job excludes it (the rendezvous's
  // bad-node rule); a single-node job gives up (`give_up` says so).
  std::string node_out;
  uint32_t sdc_on_node = 0;  // sdc_suspects counted on the anomaly's node, this one included (0: not one)
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

  // Ranges another agent of the job decided (a multi-node round carries them): skipped from now
  // on as this ledger's own, so that every node tells its ranks the same LIFELINE_SKIP_STEPS.
  void Adopt(const std::vector<StepRange>& ranges);
  // Every range decided or adopted, in that order.
  const std::vector<StepRange>& skips() const { return skip_; }

  // One more sdc_suspect naming ranks of `node` (by name): how many there were on it so far, this
  // one included. Kept for the ledger's life (every launch of the agent), with no window: a
  // machine that corrupts once an hour is as bad as one that does it twice in a minute.
  uint32_t CountSdc(const std::string& node) { return ++sdc_by_node_[node]; }

  uint64_t rollbacks() const { return rollbacks_; }

 private:
  const RollbackConfig config_;
  // Rollbacks decided per checkpoint (-1: from scratch).
  std::map<int64_t, uint32_t> to_checkpoint_;
  std::vector<StepRange> skip_;  // in the order decided
  std::map<std::string, uint32_t> sdc_by_node_;
  uint64_t rollbacks_ = 0;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_ROLLBACK_H_
