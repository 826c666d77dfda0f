// "slow_collective": an op on a communicator slowing down against its own baseline. A collective's
// duration runs from the last CollectiveBegin over its members to the median member's CollectiveEnd:
// the time it took once everyone had joined, as most members saw it. A straggler's late arrival is
// not counted, nor what it costs its peers after it: they waited asleep, and on a host with fewer
// cores than ranks the last of them to be woken leaves milliseconds after the others (that is the
// straggler detector's finding, not a slow communicator; a slow link delays every member). The first
// baseline_window durations of each (comm, op) form its baseline; when the median of the last
// recent_window exceeds factor x the baseline median, and the baseline median by more than
// min_excess_seconds, it fires. Culprits are the ranks whose contribution leaves late
// (CollectivePosted - CollectiveBegin, median over the recent window) compared with their peers;
// with none standing out, no rank is named and the whole communicator is reported slow.
//
// It also fires on a rank alone: one whose median posted delay exceeds its peers' by more than
// (factor - 1) x the baseline median (and min_excess_seconds, by many robust sigmas or as the one
// clear maximum) holds every collective back by the factor, even when the duration above hides it.
// That is a slow link on one rank of many: among a thousand ranks the last member enters tens of ms
// after a typical one, so a typical rank posting its part late holds the collective back past that
// entry by much less than it holds its part. Such an anomaly names that rank, with evidence
// "trigger": "rank" (else "communicator").
// Cooldown per (comm, op); an alarm naming ranks still follows one that named none within it.
//
// Thread safety: none (see agent/detector.h).
#ifndef LIFELINE_AGENT_DETECTORS_SLOW_COLLECTIVE_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_SLOW_COLLECTIVE_DETECTOR_H_

#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "agent/detector.h"

namespace lifeline::agent {

class SlowCollectiveDetector : public Detector {
 public:
  explicit SlowCollectiveDetector(const SlowCollectiveConfig& config) : config_(config) {}
  const char* kind() const override { return "slow_collective"; }
  void Reset(int world) override;
  void Observe(const Timeline& timeline, const TimelineChange& change) override;
  void Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) override;

 private:
  struct Sample {
    uint64_t seq = 0;
    uint64_t step = trace::kNoStep;
    double duration = 0;
    std::vector<double> posted_delay;  // per rank; NaN without a CollectivePosted
  };
  struct OpStats {
    std::vector<double> baseline;
    std::deque<Sample> recent;
    bool dirty = false;
    bool reported = false;
    uint64_t reported_ns = 0;
    bool reported_ranks = false;  // the last alarm named ranks
  };
  void Check(const Timeline& t, uint32_t comm, trace::Op op, OpStats* st, uint64_t now, std::vector<Anomaly>* out);

  SlowCollectiveConfig config_;
  int world_ = 0;
  std::map<std::pair<uint32_t, trace::Op>, OpStats> stats_;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_SLOW_COLLECTIVE_DETECTOR_H_
