// "straggler": a rank that is consistently late into collectives, or consistently slower in
// compute (StepBegin to its first CollectiveBegin of the step) than its peers. Each collective,
// once all live members began it, gives every rank a lateness (its begin minus the median begin);
// each step gives every rank a compute time. Over the last `window` entries, a rank is an outlier
// in an entry when it exceeds the entry's median by more than min_lateness_seconds and by more
// than mad_threshold robust z (1.4826 x MAD, MAD floored at 0.1 ms so identical timings do not
// divide by zero); it is a straggler when it is an outlier in at least min_fraction of a full
// window. With only two ranks there is no spread to measure: a rank is then an outlier when it
// trails its one peer by more than min_lateness_seconds (the same sign in min_fraction of the
// window). Reported ranks wait cooldown_seconds before being reported again.
//
// Thread safety: none (see agent/detector.h).
#ifndef LIFELINE_AGENT_DETECTORS_STRAGGLER_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_STRAGGLER_DETECTOR_H_

#include <deque>
#include <map>
#include <vector>

#include "agent/detector.h"

namespace lifeline::agent {

class StragglerDetector : public Detector {
 public:
  // One collective (lateness) or one step (compute): a value per rank, NaN where it has none.
  struct Entry {
    uint32_t comm = 0;
    uint64_t seq = 0;
    uint64_t step = trace::kNoStep;
    trace::Op op = trace::Op::kOther;
    std::vector<double> value;  // begin offsets (seconds) or compute times
    // Of the values present (not NaN), computed once when the entry is pushed, so that judging
    // every rank against an entry is O(1) rather than a median over all ranks per rank.
    size_t present = 0;
    double sum = 0;     // (with two values, each one's reference is the other: sum - own)
    double centre = 0;  // median
    double sigma = 0;   // RobustSigma around the median
  };

  explicit StragglerDetector(const StragglerConfig& config) : config_(config) {}
  const char* kind() const override { return "straggler"; }
  void Reset(int world) override;
  void Observe(const Timeline& timeline, const TimelineChange& change) override;
  void Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) override;

 private:
  void Push(std::deque<Entry>* window, Entry e);

  StragglerConfig config_;
  int world_ = 0;
  std::vector<bool> reported_;         // per rank, with the time of its last report
  std::vector<uint64_t> reported_ns_;
  std::map<uint64_t, std::vector<double>> pending_compute_;  // per step: compute times so far
  std::map<uint32_t, std::deque<Entry>> lateness_;          // per comm
  std::deque<Entry> compute_;
  bool dirty_ = false;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_STRAGGLER_DETECTOR_H_
