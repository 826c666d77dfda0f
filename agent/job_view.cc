#include "agent/job_view.h"

#include <algorithm>
#include <string>

#include "agent/detectors/slow_collective_detector.h"
#include "agent/detectors/straggler_detector.h"

namespace lifeline::agent {
namespace {

uint64_t Before(uint64_t now_ns, double seconds_ago) {
  const double ns = seconds_ago * 1e9;
  return ns >= static_cast<double>(now_ns) ? 1 : now_ns - static_cast<uint64_t>(ns);
}

}  // namespace

JobView::JobView(const AgentConfig& config)
    // A node that stopped publishing is given its lease (and the watcher's 2 s) to be named lost.
    : hang_(config.hang.floor_seconds, config.rendezvous.lease_seconds + 2) {
  detectors_.push_back(std::make_unique<StragglerDetector>(config.straggler));
  detectors_.push_back(std::make_unique<SlowCollectiveDetector>(config.slow_collective));
}

void JobView::Reset(int world) {
  timeline_.Reset(world);
  for (auto& d : detectors_) d->Reset(world);
  hang_.Reset();
  replayed_.clear();
}

void JobView::Update(const std::vector<RankProgress>& ranks, uint64_t now_ns, std::vector<Anomaly>* out) {
  const size_t first = out->size();
  for (const RankProgress& p : ranks) {
    if (p.rank < 0 || p.rank >= timeline_.world()) continue;  // not of this round
    for (const CollectiveSample& s : p.recent) {
      uint64_t& done = replayed_[{s.comm, p.rank}];
      if (s.seq <= done) continue;
      done = s.seq;
      trace::Event e;
      e.seq = s.seq;
      e.comm = s.comm;
      e.op = static_cast<trace::Op>(s.op);
      e.step = p.step < 0 ? trace::kNoStep : static_cast<uint64_t>(p.step);
      auto apply = [&](trace::EventType type, double ago) {
        e.type = type;
        e.time_ns = Before(now_ns, ago);
        const TimelineChange change = timeline_.Apply(p.rank, e);
        if (change.rank < 0) return;
        for (auto& d : detectors_) d->Observe(timeline_, change);
      };
      apply(trace::EventType::kCollectiveBegin, s.begin_ago);
      if (s.posted_ago >= 0) apply(trace::EventType::kCollectivePosted, s.posted_ago);
      apply(trace::EventType::kCollectiveEnd, s.end_ago);
    }
    if (!p.alive && timeline_.rank(p.rank).alive) timeline_.RankExited(p.rank);
  }
  for (auto& d : detectors_) d->Poll(timeline_, now_ns, out);
  for (size_t k = first; k < out->size(); ++k) {
    (*out)[k].evidence["job_wide"] = true;
    (*out)[k].message += " [job-wide view]";
  }
  hang_.Poll(ranks, now_ns, out);
}

bool LeftToJobView(const Anomaly& local) {
  if (local.kind == "straggler" || local.kind == "slow_collective") return true;
  return local.kind == "hang" && local.evidence.value("verdict", "") == "all_joined";
}

}  // namespace lifeline::agent
