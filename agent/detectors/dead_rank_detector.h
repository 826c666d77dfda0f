// "dead": a rank that ended on a signal or with a non-zero exit status while the agent was not
// stopping it. One anomaly per death, naming the signal (or exit code) and the last step the rank
// began. An exit with status 0 is not an anomaly (a rank may finish early); expected exits never
// are.
//
// Evidence "in_collective": the oldest collective the rank had begun and not ended when it died
// ({comm, seq, op, posted}), or false when it had ended every one it began; "collective_in_step":
// whether it had begun a collective since its last StepBegin. Absent when the rank never recorded
// a collective (the second also when it never began a step). agent/detectors/echo.h reads them to
// tell a failure of the rank's own from the echo of a peer's.
//
// Thread safety: none (see agent/detector.h).
#ifndef LIFELINE_AGENT_DETECTORS_DEAD_RANK_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_DEAD_RANK_DETECTOR_H_

#include <vector>

#include "agent/detector.h"

namespace lifeline::agent {

class DeadRankDetector : public Detector {
 public:
  const char* kind() const override { return "dead"; }
  void Reset(int world) override;
  void RankExited(const Timeline& timeline, int rank, int wait_status, bool expected, uint64_t now_ns,
                  std::vector<Anomaly>* out) override;

 private:
  std::vector<bool> reported_;  // per rank: its death was reported
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_DEAD_RANK_DETECTOR_H_
