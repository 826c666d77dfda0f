// "checkpoint": a failed checkpoint (kCheckpointFailed, always reported; ranks failing the same
// step in one poll share one anomaly), a load that fell back past a damaged checkpoint
// (kCheckpointFallback, one anomaly per skipped step), and persist lag: a rank whose last
// lag_count saves each took longer from Save (kCheckpointBegin) to durable (kCheckpointPersisted)
// than lag_factor x the interval since the save before, and than that interval + lag_min_seconds,
// so persistence cannot keep up with the checkpoint cadence (saves milliseconds behind a cadence of
// milliseconds are queued, not at risk). A save still not persisted that long after it began counts
// as lagging too.
// A save that failed Aborted was superseded: with the memory tier, a newer snapshot took the staging
// slot of one still waiting for the store, because the store was slow or unreachable. That is the
// durable copy falling behind the memory tier, said once per rank and episode (ranks and steps of
// one poll share the anomaly): a rank is reported again only after one of its saves was persisted.
// The saves are the timeline's (a streamed save, persisted without a recorded begin, is placed at
// its Persisted time minus its duration). Lag reports have a per-rank cooldown.
//
// Thread safety: none (see agent/detector.h).
#ifndef LIFELINE_AGENT_DETECTORS_CHECKPOINT_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_CHECKPOINT_DETECTOR_H_

#include <vector>

#include "agent/detector.h"

namespace lifeline::agent {

class CheckpointDetector : public Detector {
 public:
  explicit CheckpointDetector(const CheckpointConfig& config) : config_(config) {}
  const char* kind() const override { return "checkpoint"; }
  void Reset(int world) override;
  void Observe(const Timeline& timeline, const TimelineChange& change) override;
  void Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) override;

 private:
  struct Failure {
    int rank;
    uint64_t step;
    uint64_t code;
  };
  struct Fallback {
    int rank;
    uint64_t skipped_step;
    uint64_t loaded_step;
    bool memory;
  };
  void ReportFailures(const Timeline& t, uint64_t now, std::vector<Anomaly>* out);
  void ReportBehind(const Timeline& t, uint64_t now, std::vector<Anomaly>* out);
  void CheckLag(const Timeline& t, uint64_t now, std::vector<Anomaly>* out);

  CheckpointConfig config_;
  int world_ = 0;
  std::vector<bool> reported_;  // per rank, with the time of its last lag report
  std::vector<uint64_t> reported_ns_;
  std::vector<Failure> failures_;    // not yet reported
  std::vector<Fallback> fallbacks_;  // not yet reported
  std::vector<Failure> superseded_;  // not yet reported: the first of each rank's episode
  std::vector<bool> behind_;         // per rank: a save superseded, none persisted since
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_CHECKPOINT_DETECTOR_H_
