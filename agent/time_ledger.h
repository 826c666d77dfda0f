// Time lost, accounted: what a job's wall time went to, as one agent sees it. Productive time is
// the time its ranks spent stepping, less the steps they had to compute again after a restart;
// the effective training time ratio (ETTR) is productive time over wall time since the first
// launch. Each restart's cost is split into the phases an operator can act on:
//   detection  the fault (a rank's death, a hung rank's last event) to the restart decision
//   stop       stopping the ranks (SIGTERM, the grace, SIGKILL)
//   backoff    the wait before the relaunch
//   relaunch   the relaunch to the ranks' load beginning: joining the round, the interpreters'
//              start and imports, the process groups
//   load       the checkpoint load (as the ranks report it with their ProcessStart)
//   redo       the steps computed again: from the step resumed at to the step the fault
//              interrupted (the recovery point), at the launch's mean step time, and the
//              interrupted step's part
// A rank that reports no load has its load counted in relaunch.
//
// Pure: the times come in (CLOCK_MONOTONIC in the agent, the virtual clock in lifeline-sim).
// Thread safety: none; the Supervisor that owns it is driven by one thread.
#ifndef LIFELINE_AGENT_TIME_LEDGER_H_
#define LIFELINE_AGENT_TIME_LEDGER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lifeline/trace.h"

namespace lifeline::agent {

// What one restart cost, once the relaunched ranks all began a step.
struct RestartCost {
  std::string cause;       // the anomaly's kind; "elsewhere" when another node restarted the job
  std::string node;        // the culprit's node ("" when unknown)
  std::vector<int> ranks;  // the culprits (global ranks)
  double detection_seconds = 0;
  double stop_seconds = 0;
  double backoff_seconds = 0;
  double relaunch_seconds = 0;
  double load_seconds = 0;
  double redo_seconds = 0;
  uint64_t interrupted_step = trace::kNoStep;  // the newest step begun before the fault
  uint64_t resumed_step = trace::kNoStep;      // the first step begun after the relaunch
  uint64_t steps_redone = 0;
  double total_seconds() const {
    return detection_seconds + stop_seconds + backoff_seconds + relaunch_seconds + load_seconds + redo_seconds;
  }
  // The events log's "time_lost" record.
  nlohmann::json ToJson() const;
};

// The phases, in the order above, as the metrics label them.
inline constexpr const char* kLostPhases[] = {"detection", "stop", "backoff", "relaunch", "load", "redo"};

class TimeLedger {
 public:
  // A launch of `world` local ranks started at `now_ns` (the first one starts the wall clock).
  void Launched(int world, uint64_t now_ns);
  // Trace events of local rank `rank` (Supervisor::Observe hands each one over).
  void Observe(int rank, const trace::Event& event);
  // The launch failed: `decided_ns` the restart was decided for `cause` on culprits `ranks` of
  // node `node`; the fault itself happened at `fault_ns` (<= decided_ns).
  void Fault(const std::string& cause, const std::vector<int>& ranks, const std::string& node, uint64_t fault_ns,
             uint64_t decided_ns);
  // The ranks were stopped at `now_ns`; the relaunch waits `backoff_seconds` first.
  void Stopped(uint64_t now_ns, double backoff_seconds);
  // The restart's cost once every rank of the relaunch began a step (asked at each poll); nullopt
  // before, or with no restart pending. Returned once.
  std::optional<RestartCost> Settle();

  bool started() const { return first_launch_ns_ != 0; }
  double wall_seconds(uint64_t now_ns) const;
  double productive_seconds() const;
  // productive / wall (1 before any wall time passed).
  double ettr(uint64_t now_ns) const;
  // Totals of the settled restarts.
  const std::vector<RestartCost>& restarts() const { return settled_; }
  double lost_seconds(const std::string& phase) const;
  uint64_t steps_redone() const;

 private:
  struct Pending {
    RestartCost cost;
    uint64_t fault_ns = 0, decided_ns = 0, stopped_ns = 0;
    double step_price_seconds = 0;        // the failed launch's mean step time
    double interrupted_part_seconds = 0;  // the interrupted step's begin to the fault
    bool stopped = false;
    bool relaunched = false;
  };
  double LaunchSpanSeconds() const;

  uint64_t first_launch_ns_ = 0;
  uint64_t launched_ns_ = 0;
  int world_ = 0;
  // The current launch: its stepping span, its steps, and its ranks' first steps and loads.
  uint64_t first_begin_ns_ = 0, last_end_ns_ = 0;
  bool span_frozen_ = false;  // the launch failed: its span ended at the fault
  uint64_t max_step_ = trace::kNoStep;
  uint64_t max_step_begin_ns_ = 0;
  uint64_t steps_ended_ = 0;  // by local rank 0 (every rank steps alike)
  std::vector<bool> began_;
  int began_count_ = 0;
  uint64_t first_step_ = trace::kNoStep;
  uint64_t earliest_load_start_ns_ = 0, latest_load_end_ns_ = 0;
  uint64_t earliest_begin_ns_ = 0;
  double closed_span_seconds_ = 0;  // the stepping spans of the launches before this one
  double redo_seconds_ = 0;
  std::optional<Pending> pending_;
  std::vector<RestartCost> settled_;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_TIME_LEDGER_H_
