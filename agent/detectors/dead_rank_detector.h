// "dead": a rank that ended on a signal or with a non-zero exit status while the agent was not
// stopping it. One anomaly per death, naming the signal (or exit code) and the last step the rank
// began. An exit with status 0 is not an anomaly by itself (a rank may finish first); expected
// exits never are. But when a rank left with status 0 while peers were alive, and a peer then
// fails in a collective (its evidence shows one) in a way a peer's failure can cause (echo.h,
// MayBeEcho), the rank that left early is the
// culprit: the anomaly names it (evidence "early_exit", and "echo" the failure that followed).
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

#include <cstdint>
#include <optional>
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
  struct EarlyExit {
    int rank;                     // local index
    std::optional<uint64_t> step;  // the last step it began
  };
  std::vector<bool> reported_;  // per rank: its death was reported
  std::vector<EarlyExit> early_exits_;  // ranks that left with status 0 while peers were alive
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_DEAD_RANK_DETECTOR_H_
