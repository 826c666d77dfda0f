#include "agent/detector.h"

#include "agent/detectors/checkpoint_detector.h"
#include "agent/detectors/dead_rank_detector.h"
#include "agent/detectors/hang_detector.h"
#include "agent/detectors/replica_digest_detector.h"
#include "agent/detectors/slow_collective_detector.h"
#include "agent/detectors/straggler_detector.h"
#include "agent/detectors/training_signal_detector.h"

namespace lifeline::agent {

std::vector<std::unique_ptr<Detector>> MakeDetectors(const AgentConfig& config) {
  std::vector<std::unique_ptr<Detector>> out;
  out.push_back(std::make_unique<DeadRankDetector>());
  out.push_back(std::make_unique<HangDetector>(config.hang));
  out.push_back(std::make_unique<StragglerDetector>(config.straggler));
  out.push_back(std::make_unique<SlowCollectiveDetector>(config.slow_collective));
  out.push_back(std::make_unique<CheckpointDetector>(config.checkpoint));
  out.push_back(std::make_unique<TrainingSignalDetector>(config.training_signals));
  out.push_back(std::make_unique<ReplicaDigestDetector>());
  for (auto& d : out) d->Reset(static_cast<int>(config.nproc));
  return out;
}

}  // namespace lifeline::agent
