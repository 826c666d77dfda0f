// "non_finite", "spike" and "disagreement": faults that stop nothing, found in the training signals
// the ranks report per step (trace::kScalar: the loss, the global gradient norm, scalars of the
// script's own; formats/SPEC.md §15).
//
// - non_finite: a watched scalar (config.watched) is NaN or infinite on a rank. The loss counts at
//   once; another scalar (the gradient norm) after non_finite_in_a_row such values in a row on the
//   rank, so that a loss scaler's skipped steps can be tolerated. One per launch: the earliest
//   step with such values names the ranks whose own value went bad first (the loss, a rank's own,
//   before a norm that the all-reduce spread to every rank); the values after it are its
//   consequences (the NaN spreads through the all-reduce and the update).
// - spike: a watched scalar of one rank jumps up against its own recent past. Per (rank, scalar),
//   the baseline is the median of the last `window` values and the spread 1.4826 x their MAD
//   (at least spread_floor x |median|); a value's score is z = (x - median) / spread. A value is
//   high when z >= spike_threshold and it is spike_min_rise x |median| above the median; a spike
//   is spike_confirm high values in a row, or one with z >= spike_single_threshold. The median of
//   a window follows a learning-rate schedule's trends (a linear trend scores about 1.3 whatever
//   its slope) and a value that falls is never a spike; a level the schedule raises for good is
//   absorbed within half a window. No verdict before warmup_steps values of the series. A
//   series outlives a launch (a restart, a rollback: the same world's ranks): when its step goes
//   back to s, the values of steps s and later are forgotten and those before s kept, warm-up
//   included, so a relaunch from a checkpoint judges the steps it replays against the run that
//   led to the checkpoint (a poisoned batch replayed right after a rollback is a spike again,
//   and skip_data: on_repeat can act on it). One report per episode: the series is judged again
//   once a value scores below spike_threshold.
// - disagreement: scalars identical by construction (config.replicated: the global gradient norm
//   after its all-reduce; the loss where it is all-reduced) are compared bit for bit across the
//   ranks of each replica group (config.replica_group_size) for every step; the ranks whose value
//   differs from the majority's are named (all of them when there is no majority, as with two
//   ranks). NaNs compare equal to each other. One report per episode of a (scalar, group): it is
//   judged again after a step on which the group agreed.
//
// Values are grouped by step across ranks: a step is judged once every live rank that reports
// signals has reported a later step, or hold_seconds after its first finding or value was seen
// (a rank may report a device value a step late). Ranks are compared within this agent's node:
// the local members of a group. In a multi-node job (set_job_world) a group that spans nodes is
// not judged here: its settled values go to the round's leader (TakeValueReports, in the progress
// summary), whose JobSignalDetector compares every node's (agent/detectors/job_signal_detector.h). Scalar names come with kScalarName events; a value of an id never
// named is not judged.
//
// Thread safety: none (see agent/detector.h).
#ifndef LIFELINE_AGENT_DETECTORS_TRAINING_SIGNAL_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_TRAINING_SIGNAL_DETECTOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "agent/detector.h"
#include "agent/progress.h"

namespace lifeline::agent {

class TrainingSignalDetector : public Detector {
 public:
  explicit TrainingSignalDetector(const TrainingSignalConfig& config);
  const char* kind() const override { return "training_signal"; }
  void Reset(int world) override;
  void Observe(const Timeline& timeline, const TimelineChange& change) override;
  void Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) override;

  // The job's world in a multi-node launch (0: a single node's, every group is local).
  void set_job_world(int world) { job_world_ = std::max(world, 0); }
  // The values of groups that span nodes, settled since the last call, for the leader.
  std::vector<ValueReport> TakeValueReports();

  // Values received and values not judged (their scalar never named), for tests and the log.
  uint64_t values() const { return values_; }
  uint64_t unnamed_values() const { return unnamed_; }

 private:
  // One rank's values of one watched scalar.
  struct Series {
    std::deque<double> window;
    std::deque<uint64_t> window_steps;  // the step of each value in `window`
    uint64_t first_step = trace::kNoStep;  // of the series' first value
    uint64_t seen = 0;              // finite values of the series' steps so far
    uint64_t last_step = trace::kNoStep;
    bool relaunched = false;        // no value yet in this launch (its first may redo last_step)
    uint32_t non_finite_run = 0;    // non-finite values in a row
    bool in_episode = false;        // a spike was reported; until a value scores low again
    // The run of high values so far: steps, values and scores.
    std::vector<uint64_t> run_steps;
    std::vector<double> run_values, run_z;
  };
  // A verdict on one rank's value, waiting for its step to be judged across ranks.
  struct Finding {
    enum Kind { kNonFinite, kSpike } kind;
    int rank = 0;                   // local
    std::string scalar;
    uint64_t step = 0;              // the step named (a spike: its first high value)
    uint64_t settle_step = 0;       // the step whose values complete it
    uint64_t seen_ns = 0;           // the first poll that saw it (0: none yet)
    nlohmann::json evidence;
  };
  // One step of one replicated scalar in one group: the ranks' values, as bits.
  struct Comparison {
    std::map<int, uint64_t> bits;   // by local rank
    std::map<int, double> values;
    uint64_t seen_ns = 0;
  };
  using ComparisonKey = std::tuple<std::string, int, uint64_t>;  // scalar, group, step

  void ObserveValue(const Timeline& timeline, int rank, const std::string& scalar, uint64_t step, double value);
  // The series' step went back to `step`: what it saw of `step` and later is forgotten.
  static void Rewind(Series* s, uint64_t step);
  // Whether every live rank reporting signals has reported a step after `step`, or `seen_ns` is
  // hold_seconds old.
  bool Settled(const Timeline& timeline, uint64_t step, uint64_t seen_ns, uint64_t now_ns) const;
  void JudgeNonFinite(const Timeline& timeline, std::vector<Finding> found, uint64_t now_ns, std::vector<Anomaly>* out);
  void JudgeSpikes(const Timeline& timeline, const std::vector<Finding>& found, uint64_t now_ns,
                   std::vector<Anomaly>* out);
  void JudgeComparison(const Timeline& timeline, const ComparisonKey& key, const Comparison& c, uint64_t now_ns,
                       std::vector<Anomaly>* out);
  int GroupOf(int global) const;
  bool GroupIsLocal(const Timeline& timeline, int group) const;

  const TrainingSignalConfig config_;
  const std::set<std::string> watched_, replicated_;
  int world_ = 0;
  std::vector<std::map<uint32_t, std::string>> names_;  // per local rank: scalar id -> name
  std::vector<std::map<std::string, Series>> series_;   // per local rank, watched scalars
  std::vector<uint64_t> max_step_;                      // per local rank: the latest step reported (kNoStep: none)
  std::vector<Finding> findings_;
  std::map<ComparisonKey, Comparison> comparisons_;
  std::set<std::pair<int, std::string>> non_finite_named_;  // (local rank, scalar) already in a verdict
  bool non_finite_raised_ = false;                          // this launch's non_finite anomaly is out
  std::set<std::pair<std::string, int>> disagreeing_;       // (scalar, group) in an episode
  uint64_t values_ = 0;
  uint64_t unnamed_ = 0;
  int job_world_ = 0;
  std::vector<ValueReport> exports_;
};

// The disagreement verdict on a replicated scalar's values at a step (by global rank, as bits):
// the ranks whose value differs from the majority's (every one without a majority), or nothing when
// they agree. One report per episode of a (scalar, group): `disagreeing` holds those in one, and an
// agreeing step ends it.
std::optional<Anomaly> JudgeDisagreement(const std::string& scalar, int group, uint64_t step,
                                         const std::map<int, uint64_t>& bits, uint32_t replica_group_size,
                                         uint64_t now_ns, std::set<std::pair<std::string, int>>* disagreeing);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_TRAINING_SIGNAL_DETECTOR_H_
