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
// The bar for a rank alone is (factor - 1) x the collective's own cost, taken as the smaller of the
// baseline median and what the collective takes once every part is in (from the last member's post
// to the median member's exit, median over the recent window): a baseline formed while the rank was
// already late (the leader's job-wide view sees a job's collectives only from its first summaries
// on; issue 50: a link 20 ms slow from step 97 made the baseline of collectives 91 to 140, and went
// unnamed) does not hide it. So a slow link is named once its lateness at least doubles the
// collective (factor 2), and is at least min_excess_seconds: with an allreduce of 0.4 ms, from 5 ms
// late on; with one of 28 ms (a 2-core host saturated by other work), from 28 ms late.
//
// A busy host is not a slow communicator: CPUs taken by other processes slow the ranks' own work
// between their collectives (from a member's end of the previous collective on the communicator to
// its begin of the next) as much as the collectives, where a slow link or fabric slows the
// collectives alone. When the communicator slowed naming no rank, and the members' work between
// collectives (median over members, then over the window, against its own baseline) grew by at
// least kHostBusyShare of the collective's growth, the anomaly says so: evidence "host_busy": true
// and the work's medians; the Supervisor logs it as not paged (TakeHostNoise, agent/host_cpu.h).
// A communicator with no gap between its collectives (back-to-back buckets) has no such evidence,
// and is judged on its durations as before.
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
    double work = 0;      // the members' median time from the previous collective's end; NaN: unknown
    double transfer = 0;  // from the last member's post to the median member's exit; NaN: unknown
  };
  struct OpStats {
    std::vector<double> baseline;
    std::vector<double> baseline_work;  // the baseline samples' `work` (finite ones)
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
  // Per communicator, per rank: the seq and end time of its newest collective judged here.
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> last_end_;
};

// The share of a communicator's slowdown that the ranks' own work between its collectives must
// have slowed as well for the slowdown to be the host's (above).
inline constexpr double kHostBusyShare = 0.5;

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_SLOW_COLLECTIVE_DETECTOR_H_
