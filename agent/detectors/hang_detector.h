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
// Open collectives and steps come from the timeline (where a rank's End of seq S also closes its
// older open seqs on that comm); the detector keeps the duration history and what it reported.
//
// Thread safety: none (see agent/detector.h).
#ifndef LIFELINE_AGENT_DETECTORS_HANG_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_HANG_DETECTOR_H_

#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "agent/detector.h"

namespace lifeline::agent {

class HangDetector : public Detector {
 public:
  explicit HangDetector(const HangConfig& config) : config_(config) {}
  const char* kind() const override { return "hang"; }
  void Reset(int world) override;
  void Observe(const Timeline& timeline, const TimelineChange& change) override;
  void Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) override;

 private:
  // Per-rank durations: the window of `window` operations holds world x window of them.
  size_t HistoryCapacity() const;
  // The durations seen, newest last, and their longest: the timeout is asked for at every poll of
  // every open collective, the window (world x window durations) changes at most once per event.
  struct History {
    std::deque<uint64_t> values;
    uint64_t longest = 0;  // of `values`
    void Push(uint64_t v, size_t capacity);
  };
  uint64_t Timeout(const History* history) const;
  // Why the timeout was what it was, for the person who waited that long: " (hang timeout 60 s:
  // the floor, --hang-timeout; ...)".
  std::string TimeoutReason(uint64_t timeout, const History* history) const;
  void CheckCollectives(const Timeline& t, uint64_t now, std::vector<Anomaly>* out, bool* any_open);
  void CheckSteps(const Timeline& t, uint64_t now, std::vector<Anomaly>* out);

  HangConfig config_;
  int world_ = 0;
  std::map<std::pair<uint32_t, trace::Op>, History> collective_history_;
  History step_history_;
  std::map<uint32_t, uint64_t> reported_through_;  // per comm: open seqs up to this were reported
  std::vector<uint64_t> step_reported_begin_ns_;   // per rank: the open step already reported
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_HANG_DETECTOR_H_
