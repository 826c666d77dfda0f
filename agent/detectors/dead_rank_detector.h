// "dead": a rank that ended on a signal or with a non-zero exit status while the agent was not
// stopping it. One anomaly per death, naming the signal (or exit code) and the last step the rank
// began. An exit with status 0 is not an anomaly (a rank may finish early); expected exits never
// are.
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
