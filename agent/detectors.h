// The five detectors of lifeline-agent. Each is fed the ranks' trace events and exits (see
// Detector in agent/detector.h) and decides from them alone; none reads a clock or does I/O.
//
// Thread safety: none of these classes is thread-safe; one thread (the agent's poll loop) drives
// each instance. Reset(world) must be called before the first event of a launch (MakeDetectors
// does it for config.nproc); events from ranks outside [0, world) are ignored.
//
// Communicators: comm 0 is the world, so every rank takes part in each of its collectives. Any
// other comm's members are the ranks seen beginning a collective on it.
#ifndef LIFELINE_AGENT_DETECTORS_H_
#define LIFELINE_AGENT_DETECTORS_H_

#include <memory>
#include <vector>

#include "agent/config.h"
#include "agent/detector.h"

namespace lifeline::agent {

// "dead": a rank that ended on a signal or with a non-zero exit status while the agent was not
// stopping it. One anomaly per death, naming the signal (or exit code) and the last step the rank
// began. An exit with status 0 is not an anomaly (a rank may finish early); expected exits never
// are.
class DeadRankDetector : public Detector {
 public:
  DeadRankDetector();
  ~DeadRankDetector() override;
  const char* kind() const override { return "dead"; }
  void Reset(int world) override;
  void Observe(int rank, const trace::Event& event) override;
  void RankExited(int rank, int wait_status, bool expected, uint64_t now_ns, std::vector<Anomaly>* out) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// "hang": a collective or a step open longer than an adaptive timeout, clamp(multiplier x the
// longest recent completed duration of the same (comm, op), or of steps, floor, cap); with no
// history the timeout is the floor, so a slow first collective (communicator setup) is waited for.
// Culprits, by preference: the live members of the comm that never began the stalled collective;
// else, when all began it, those that have not posted their part (if that singles some out) or
// else all that have not ended it; for a step stalled with no collective open anywhere, the ranks
// at the lowest step, or when all are at one step the ones silent (no event) longest. Exited ranks
// are neither waiters nor culprits. Each stall is reported once; once a comm progresses past it,
// a new stall may be reported again.
//
// A rank's End of seq S on a comm also closes its older open seqs there (their End was lost, e.g.
// to a full ring): collectives on one communicator complete in order.
class HangDetector : public Detector {
 public:
  explicit HangDetector(const HangConfig& config);
  ~HangDetector() override;
  const char* kind() const override { return "hang"; }
  void Reset(int world) override;
  void Observe(int rank, const trace::Event& event) override;
  void RankExited(int rank, int wait_status, bool expected, uint64_t now_ns, std::vector<Anomaly>* out) override;
  void Poll(uint64_t now_ns, std::vector<Anomaly>* out) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// "straggler": a rank that is consistently late into collectives, or consistently slower in
// compute (StepBegin to its first CollectiveBegin of the step) than its peers. Each collective,
// once all live members began it, gives every rank a lateness (its begin minus the median begin);
// each step gives every rank a compute time. Over the last `window` entries, a rank is an outlier
// in an entry when it exceeds the entry's median by more than min_lateness_seconds and by more
// than mad_threshold robust z (1.4826 x MAD, MAD floored at 0.1 ms so identical timings do not
// divide by zero); it is a straggler when it is an outlier in at least min_fraction of a full
// window. With only two ranks there is no spread to measure: a rank is then an outlier when it
// trails its one peer by more than min_lateness_seconds (the same sign in min_fraction of the
// window). Reported ranks wait cooldown_seconds before being reported again.
class StragglerDetector : public Detector {
 public:
  explicit StragglerDetector(const StragglerConfig& config);
  ~StragglerDetector() override;
  const char* kind() const override { return "straggler"; }
  void Reset(int world) override;
  void Observe(int rank, const trace::Event& event) override;
  void RankExited(int rank, int wait_status, bool expected, uint64_t now_ns, std::vector<Anomaly>* out) override;
  void Poll(uint64_t now_ns, std::vector<Anomaly>* out) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// "slow_collective": an op on a communicator slowing down against its own baseline. A collective's
// duration is the last CollectiveEnd minus the last CollectiveBegin over its members (the time it
// took once everyone had joined: a straggler's late arrival is not counted). The first
// baseline_window durations of each (comm, op) form its baseline; when the median of the last
// recent_window exceeds factor x the baseline median, and the baseline median by more than
// min_excess_seconds, it fires. Culprits are the ranks whose contribution leaves late
// (CollectivePosted - CollectiveBegin, median over the recent window) compared with their peers;
// with none standing out, no rank is named and the whole communicator is reported slow.
// Cooldown per (comm, op).
class SlowCollectiveDetector : public Detector {
 public:
  explicit SlowCollectiveDetector(const SlowCollectiveConfig& config);
  ~SlowCollectiveDetector() override;
  const char* kind() const override { return "slow_collective"; }
  void Reset(int world) override;
  void Observe(int rank, const trace::Event& event) override;
  void RankExited(int rank, int wait_status, bool expected, uint64_t now_ns, std::vector<Anomaly>* out) override;
  void Poll(uint64_t now_ns, std::vector<Anomaly>* out) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// "checkpoint": a failed checkpoint (kCheckpointFailed, always reported; ranks failing the same
// step in one poll share one anomaly), and persist lag: a rank whose last lag_count saves each
// took longer from Save (kCheckpointBegin) to durable (kCheckpointPersisted) than lag_factor x the
// interval since the save before, so persistence cannot keep up with the checkpoint cadence. A
// save still not persisted that long after it began counts as lagging too. A save that persisted
// without a recorded begin (a streamed save) is placed at its Persisted time minus its duration.
// Lag reports have a per-rank cooldown.
class CheckpointDetector : public Detector {
 public:
  explicit CheckpointDetector(const CheckpointConfig& config);
  ~CheckpointDetector() override;
  const char* kind() const override { return "checkpoint"; }
  void Reset(int world) override;
  void Observe(int rank, const trace::Event& event) override;
  void RankExited(int rank, int wait_status, bool expected, uint64_t now_ns, std::vector<Anomaly>* out) override;
  void Poll(uint64_t now_ns, std::vector<Anomaly>* out) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_H_
