// The leader's view of a multi-node job (agent/rendezvous.h): every node's progress summary
// (agent/progress.h) replayed into one Timeline of the whole job, judged by the detectors a node
// runs on its own ranks for stragglers and slow collectives, and by the job-wide hang check
// (agent/detectors/job_hang_detector.h). Its anomalies name global ranks and are marked
// "job_wide"; a node's own straggler, slow-collective and "every member joined" hang verdicts are
// left to it in a multi-node job, so one fault raises one alarm, named as the job knows it.
//
// A summary carries each rank's newest ended collectives with their times (seconds before the
// summary, plus the time it spent in etcd), so the replayed begin, post and end times are the
// ranks' own, to within the nodes' clock agreement; each is replayed once.
//
// Thread safety: none; the agent's loop.
#ifndef LIFELINE_AGENT_JOB_VIEW_H_
#define LIFELINE_AGENT_JOB_VIEW_H_

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "agent/config.h"
#include "agent/detector.h"
#include "agent/detectors/job_hang_detector.h"
#include "agent/progress.h"
#include "agent/timeline.h"

namespace lifeline::agent {

class JobView {
 public:
  explicit JobView(const AgentConfig& config);

  // A new round of `world` ranks.
  void Reset(int world);

  // Every node's newest summary, read at `now_ns`.
  void Update(const std::vector<RankProgress>& ranks, uint64_t now_ns, std::vector<Anomaly>* out);

  const Timeline& timeline() const { return timeline_; }

 private:
  Timeline timeline_;
  std::vector<std::unique_ptr<Detector>> detectors_;
  JobHangDetector hang_;
  std::map<std::pair<uint32_t, int>, uint64_t> replayed_;  // (comm, rank) -> the newest seq replayed
};

// Whether a node's own verdict is left to the job-wide view in a multi-node job.
bool LeftToJobView(const Anomaly& local);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_JOB_VIEW_H_
