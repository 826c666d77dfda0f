#include "agent/detectors/slow_collective_detector.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "agent/detectors/evidence.h"
#include "agent/detectors/sliding_window.h"

namespace lifeline::agent {

using namespace detail;
using trace::Op;

void SlowCollectiveDetector::Reset(int world) {
  world_ = std::max(world, 0);
  stats_.clear();
}

void SlowCollectiveDetector::Observe(const Timeline& t, const TimelineChange& c) {
  if (c.rank < 0 || c.rank >= world_ || !c.exited_by_all) return;
  const uint32_t comm = c.event->comm;
  const CollectiveRecord& rec = *c.record;
  uint64_t last_begin = 0, last_end = 0;
  Sample sample;
  sample.seq = c.event->seq;
  sample.step = rec.step;
  sample.posted_delay.assign(static_cast<size_t>(world_), kNaN);
  for (int m : t.Members(comm)) {
    if (!t.rank(m).alive) continue;
    last_begin = std::max(last_begin, rec.begin_ns[m]);
    last_end = std::max(last_end, rec.end_ns[m]);
    if (rec.posted_ns[m] != 0) sample.posted_delay[m] = SecondsBetween(rec.begin_ns[m], rec.posted_ns[m]);
  }
  sample.duration = SecondsBetween(last_begin, last_end);
  OpStats& st = stats_[{comm, rec.op}];
  if (st.baseline.size() < std::max<uint32_t>(config_.baseline_window, 1)) {
    st.baseline.push_back(sample.duration);
  } else {
    PushToWindow(&st.recent, std::move(sample), config_.recent_window);
    st.dirty = true;
  }
}

void SlowCollectiveDetector::Check(const Timeline& t, uint32_t comm, Op op, OpStats* st, uint64_t now,
                                   std::vector<Anomaly>* out) {
  const SlowCollectiveConfig& c = config_;
  if (st->recent.size() < std::max<uint32_t>(c.recent_window, 1)) return;
  if (st->reported && now - std::min(now, st->reported_ns) < Nanos(c.cooldown_seconds)) return;
  const double base = Median(st->baseline);
  std::vector<double> durations;
  for (const Sample& s : st->recent) durations.push_back(s.duration);
  const double recent = Median(durations);
  if (!(recent > c.factor * base && recent - base > c.min_excess_seconds)) return;

  // Each rank's median posted delay over the recent window, against its peers'.
  std::vector<std::pair<int, double>> delays;
  for (int r = 0; r < world_; ++r) {
    std::vector<double> v;
    for (const Sample& s : st->recent)
      if (!std::isnan(s.posted_delay[r])) v.push_back(s.posted_delay[r]);
    if (!v.empty() && 2 * v.size() >= st->recent.size()) delays.push_back({r, Median(v)});
  }
  std::vector<int> culprits;
  nlohmann::json culprit_delays = nlohmann::json::object();
  double peers_for_message = kNaN;
  if (delays.size() >= 2) {
    double top = -1, second = -1;
    for (const auto& [r, d] : delays) {
      if (d > top) {
        second = top;
        top = d;
      } else if (d > second) {
        second = d;
      }
    }
    for (const auto& [r, d] : delays) {
      std::vector<double> peers;
      for (const auto& [p, dp] : delays)
        if (p != r) peers.push_back(dp);
      const double peer_median = Median(peers);
      const double z = (d - peer_median) / RobustSigma(peers, peer_median);
      const bool clear_max = d == top && top - second > c.min_excess_seconds;
      if (d - peer_median > c.min_excess_seconds && (z > 3 || clear_max)) {
        culprits.push_back(r);
        culprit_delays[std::to_string(t.GlobalRank(r))] = d;
      }
    }
    std::vector<double> others;
    for (const auto& [r, d] : delays)
      if (!std::binary_search(culprits.begin(), culprits.end(), r)) others.push_back(d);
    peers_for_message = Median(others);
  }
  culprits = GlobalRanks(t, culprits);  // from here on, as the job names them

  const std::string name = std::string(trace::OpName(op)) + " on comm " + std::to_string(comm);
  Anomaly a;
  a.kind = "slow_collective";
  a.ranks = culprits;
  a.step = KnownStep(st->recent.back().step);
  a.seq = st->recent.back().seq;
  a.comm = comm;
  a.op = trace::OpName(op);
  a.evidence["baseline_median_seconds"] = base;
  a.evidence["recent_median_seconds"] = recent;
  a.evidence["factor"] = base > 0 ? Number(recent / base) : nlohmann::json(nullptr);
  a.evidence["factor_threshold"] = c.factor;
  a.evidence["baseline_window"] = st->baseline.size();
  a.evidence["recent_window"] = st->recent.size();
  a.evidence["posted_delay_median_seconds"] = culprit_delays;
  a.evidence["peers_posted_delay_median_seconds"] = Number(peers_for_message);
  std::string what = name + " slowed to " + Duration(recent) + " (median of the last " +
                     std::to_string(st->recent.size()) + ", baseline " + Duration(base) +
                     (base > 0 ? ", x" + Fmt("%.1f", recent / base) : std::string()) + ")";
  if (culprits.empty()) {
    what += ": no rank stands out, the whole communicator is slow";
  } else {
    std::string each;
    for (int r : culprits)
      each += (each.empty() ? "" : ", ") + Duration(culprit_delays[std::to_string(r)].get<double>());
    what += ": " + Ranks(culprits) + " post" + (culprits.size() == 1 ? "s " : " ") + (culprits.size() == 1 ? "its" : "their") +
            " part " + each + " after entering (peers " + Duration(peers_for_message) + ")";
  }
  a.message = what + StepSuffix(st->recent.back().step);
  a.detected_ns = now;
  out->push_back(std::move(a));
  st->reported = true;
  st->reported_ns = now;
}

void SlowCollectiveDetector::Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) {
  for (auto& [key, st] : stats_) {
    if (!st.dirty) continue;
    st.dirty = false;
    Check(timeline, key.first, key.second, &st, now_ns, out);
  }
}

}  // namespace lifeline::agent
