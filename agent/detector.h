// Detectors: each reads the job's Timeline (agent/timeline.h) and reports anomalies. A detector is
// a small class with no I/O and no clock of its own: the agent applies each event to the timeline,
// hands the detectors the resulting change, and polls them with the current CLOCK_MONOTONIC time,
// so tests drive them with recorded or synthetic streams. A detector keeps only state of its own
// (baselines, windows, what it has reported); what the ranks did it reads from the timeline.
//
// Thread safety: none; one thread (the agent's poll loop) drives each instance and its timeline.
#ifndef LIFELINE_AGENT_DETECTOR_H_
#define LIFELINE_AGENT_DETECTOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/config.h"
#include "agent/timeline.h"
#include "lifeline/trace.h"

namespace lifeline::agent {

struct Anomaly {
  std::string kind;               // "dead", "hang", "straggler", "slow_collective", "checkpoint",
                                  // "non_finite", "spike", "disagreement" (training signals),
                                  // "sdc_suspect" (replicas' snapshot digests differ)
  // The culprits, ascending, by global rank in the job (Timeline::GlobalRank), as are the ranks in
  // `message` and `evidence`; the timeline and the detectors' own state are by local index.
  std::vector<int> ranks;
  std::optional<uint64_t> step;   // the step concerned, when known
  std::optional<uint64_t> seq;    // the collective's sequence number, when known
  std::optional<uint32_t> comm;
  std::string op;                 // the collective's op name (trace::OpName), empty when none
  nlohmann::json evidence = nlohmann::json::object();  // the numbers the verdict rests on (seconds)
  std::string message;            // one line for a person: "rank 2 never joined allreduce #184 ..."
  uint64_t detected_ns = 0;       // CLOCK_MONOTONIC when detected (set by the detector: its `now`)
};

class Detector {
 public:
  virtual ~Detector() = default;
  virtual const char* kind() const = 0;
  // A new launch of `world` ranks (the timeline is reset with it): forget the previous one.
  virtual void Reset(int world) = 0;
  // `change` was just applied to `timeline` (an event, in the order its rank recorded them; ranks
  // interleave arbitrarily). Ignored changes (rank -1) are not passed on.
  virtual void Observe(const Timeline& timeline, const TimelineChange& change) {}
  // `rank`'s process ended (waitpid status), already marked exited in `timeline`. `expected`: the
  // agent is stopping the ranks itself.
  virtual void RankExited(const Timeline& timeline, int rank, int wait_status, bool expected, uint64_t now_ns,
                          std::vector<Anomaly>* out) {}
  // Time-based checks; called every poll interval after the events seen so far were applied.
  virtual void Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) {}
};

// One of each kind, configured from `config` and Reset for config.nproc ranks: dead, hang,
// straggler, slow_collective, checkpoint, training signals (agent/detectors/).
std::vector<std::unique_ptr<Detector>> MakeDetectors(const AgentConfig& config);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTOR_H_
