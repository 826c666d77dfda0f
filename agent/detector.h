// Detectors: each watches the ranks' trace events (and their exits) and reports anomalies. A
// detector is a small class with no I/O and no clock of its own: the agent feeds it events and
// the current CLOCK_MONOTONIC time, so tests drive it with recorded or synthetic streams.
#ifndef LIFELINE_AGENT_DETECTOR_H_
#define LIFELINE_AGENT_DETECTOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/config.h"
#include "lifeline/trace.h"

namespace lifeline::agent {

struct Anomaly {
  std::string kind;               // "dead", "hang", "straggler", "slow_collective", "checkpoint"
  std::vector<int> ranks;         // the culprits, ascending
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
  // A new launch of `world` ranks: forget everything about the previous one.
  virtual void Reset(int world) = 0;
  // An event from `rank`, in the order that rank recorded them (ranks interleave arbitrarily).
  virtual void Observe(int rank, const trace::Event& event) {}
  // `rank`'s process ended (waitpid status). `expected`: the agent is stopping the ranks itself.
  virtual void RankExited(int rank, int wait_status, bool expected, uint64_t now_ns, std::vector<Anomaly>* out) {}
  // Time-based checks; called every poll interval after the events seen so far were observed.
  virtual void Poll(uint64_t now_ns, std::vector<Anomaly>* out) {}
};

// One of each kind, configured from `config`.
std::vector<std::unique_ptr<Detector>> MakeDetectors(const AgentConfig& config);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTOR_H_
