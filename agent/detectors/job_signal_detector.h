// "disagreement" across the nodes of a multi-node job: the round's leader compares the values of a
// replicated training signal (identical by construction across a replica group: the global gradient
// norm after its all-reduce) when the group spans nodes, so that a rank whose value differs is named
// even when its node holds no other member of its group (DDP of one rank a node; a node of 8 ranks
// whose group is the whole job still compares its 8, but the leader compares all of them, once).
//
// Each node sends the settled values of such groups with its progress summary (ValueReport,
// formats/SPEC.md §17 version 3; TrainingSignalDetector::TakeValueReports). The leader judges a
// (scalar, group, step) once every rank of the group reported it, or `hold_seconds` after its first
// value came (a rank that died, a node lost), with the same rule and evidence as a node's verdict
// (JudgeDisagreement): the ranks whose bits differ from the majority's, one report per episode.
//
// Thread safety: none (the Supervisor's loop).
#ifndef LIFELINE_AGENT_DETECTORS_JOB_SIGNAL_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_JOB_SIGNAL_DETECTOR_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "agent/config.h"
#include "agent/detector.h"
#include "agent/progress.h"

namespace lifeline::agent {

class JobSignalDetector {
 public:
  // `world`: the job's ranks.
  JobSignalDetector(const TrainingSignalConfig& config, int world, double hold_seconds = 5)
      : config_(config), world_(world), hold_seconds_(hold_seconds) {}

  void Add(const ValueReport& values, uint64_t now_ns);
  void Poll(uint64_t now_ns, std::vector<Anomaly>* out);

  uint64_t compared() const { return compared_; }

 private:
  using Key = std::tuple<std::string, int, uint64_t>;  // scalar, group, step
  struct Pending {
    std::map<int, uint64_t> bits;  // by global rank
    uint64_t first_ns = 0;
  };
  size_t GroupSize(int group) const;

  const TrainingSignalConfig config_;
  const int world_;
  const double hold_seconds_;
  std::map<Key, Pending> pending_;
  std::set<std::pair<std::string, int>> disagreeing_;
  std::set<Key> judged_;  // the newest judged keys: values sent again are not judged twice
  uint64_t compared_ = 0;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_JOB_SIGNAL_DETECTOR_H_
