#include "agent/job_view.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "agent/detectors/slow_collective_detector.h"
#include "agent/detectors/straggler_detector.h"

namespace lifeline::agent {
namespace {

// The time `seconds_ago` before now_ns. An age below zero (a node's clock offset subtracted from a
// fresh sample) or not a number is now: converting a negative double to an integer is undefined.
uint64_t Before(uint64_t now_ns, double seconds_ago) {
  const double ns = seconds_ago * 1e9;
  if (!(ns > 0)) return now_ns;
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
  hang_.Reset(world);
  replayed_.clear();
  measured_offsets_.clear();  // the nodes of a new round are numbered afresh
  reference_ends_.clear();
  unmeasured_updates_.clear();
  clock_reference_ = -1;
}

std::map<int, double> EstimateClockOffsets(const std::vector<RankProgress>& ranks, int* reference_out) {
  // The end of a collective is one instant for all its members (the last contribution arrives and
  // every member completes within the network's latency), so on a sound clock every member's
  // end_ago of the same (comm, seq) agrees. The reference is the node whose summary is its own
  // (read with no transit: the leader's), else the lowest node.
  int reference = -1;
  for (const RankProgress& p : ranks)
    if (p.summary_age_seconds == 0 && (reference < 0 || p.node < reference)) reference = p.node;
  if (reference < 0)
    for (const RankProgress& p : ranks) reference = reference < 0 ? p.node : std::min(reference, p.node);
  std::map<std::pair<uint32_t, uint64_t>, std::vector<double>> ref_ends;
  for (const RankProgress& p : ranks)
    if (p.node == reference)
      for (const CollectiveSample& s : p.recent) ref_ends[{s.comm, s.seq}].push_back(s.end_ago);
  std::map<int, std::vector<double>> diffs;
  for (const RankProgress& p : ranks) {
    if (p.node == reference) continue;
    for (const CollectiveSample& s : p.recent) {
      auto it = ref_ends.find({s.comm, s.seq});
      if (it == ref_ends.end()) continue;
      std::vector<double> ends = it->second;
      std::nth_element(ends.begin(), ends.begin() + ends.size() / 2, ends.end());
      diffs[p.node].push_back(s.end_ago - ends[ends.size() / 2]);
    }
  }
  std::map<int, double> offsets;
  for (auto& [node, d] : diffs) {
    if (d.size() < 3) continue;  // too few shared collectives to tell
    std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
    offsets[node] = d[d.size() / 2];
  }
  *reference_out = reference;
  return offsets;
}

void JobView::Update(const std::vector<RankProgress>& raw, uint64_t now_ns, std::vector<Anomaly>* out) {
  const size_t first = out->size();
  // The summaries' ages rest on the nodes' wall clocks: a node whose clock is off shows every
  // time of its ranks shifted by as much (a false straggler "2.0 s late", a false silence). The
  // shared collectives measure the shift; it is taken out before anything is judged.
  std::vector<RankProgress> ranks = raw;
  int reference = -1;
  const std::map<int, double> measured = EstimateClockOffsets(ranks, &reference);
  if (reference != clock_reference_) {  // measures against another node
    measured_offsets_.clear();
    reference_ends_.clear();
  }
  clock_reference_ = reference;
  for (const auto& [node, d] : measured) measured_offsets_[node] = d;
  // A node this read shares too few collectives with the reference's: measured against the
  // reference's ends of the reads before, as EstimateClockOffsets measures within one read.
  const double now_s = static_cast<double>(now_ns) * 1e-9;
  std::map<int, std::vector<double>> earlier;
  for (const RankProgress& p : ranks) {
    if (p.node == reference || measured.count(p.node)) continue;
    for (const CollectiveSample& s : p.recent) {
      const auto it = reference_ends_.find({s.comm, s.seq});
      if (it != reference_ends_.end()) earlier[p.node].push_back(s.end_ago - (now_s - it->second));
    }
  }
  for (auto& [node, d] : earlier) {
    if (d.size() < 3) continue;
    std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
    measured_offsets_[node] = d[d.size() / 2];
  }
  std::map<uint32_t, uint64_t> newest;
  for (const RankProgress& p : ranks)
    if (p.node == reference)
      for (const CollectiveSample& s : p.recent) {
        reference_ends_[{s.comm, s.seq}] = now_s - s.end_ago;
        newest[s.comm] = std::max(newest[s.comm], s.seq);
      }
  // Kept: a few reads' worth per communicator.
  for (auto it = reference_ends_.begin(); it != reference_ends_.end();) {
    const auto n = newest.find(it->first.first);
    const bool old = n == newest.end() ? false : it->first.second + 4 * kSamplesPerComm < n->second;
    it = old ? reference_ends_.erase(it) : std::next(it);
  }
  clock_offsets_.clear();
  for (const auto& [node, d] : measured_offsets_)
    if (std::abs(d) >= kMinClockOffsetSeconds) clock_offsets_[node] = d;
  for (RankProgress& p : ranks) {
    auto it = clock_offsets_.find(p.node);
    if (it == clock_offsets_.end()) continue;
    const double d = it->second;
    p.silent_seconds = std::max(0.0, p.silent_seconds - d);
    p.summary_age_seconds = std::max(0.0, p.summary_age_seconds - d);
    for (auto& [comm, c] : p.comms)
      if (c.open >= 0) c.open_seconds = std::max(0.0, c.open_seconds - d);
    for (CollectiveSample& s : p.recent) {
      s.begin_ago -= d;
      s.end_ago -= d;
      if (s.posted_ago >= 0) s.posted_ago -= d;
    }
  }
  // A node not measured yet is not replayed for a few Updates: its first summaries may share no
  // collective with the reference's (read at another moment of a fast job), and replayed uncorrected
  // a skewed clock reads as a straggler at once. One that never shares any (other communicators) is
  // replayed as it is after kUnmeasuredUpdates.
  constexpr int kUnmeasuredUpdates = 5;
  std::set<int> unmeasured;  // once per node, however many ranks it runs
  for (const RankProgress& p : ranks)
    if (p.node != reference && !measured_offsets_.count(p.node) && !p.recent.empty()) unmeasured.insert(p.node);
  std::set<int> held;
  for (int node : unmeasured)
    if (++unmeasured_updates_[node] <= kUnmeasuredUpdates) held.insert(node);
  for (const RankProgress& p : ranks) {
    if (p.rank < 0 || p.rank >= timeline_.world()) continue;  // not of this round
    if (held.count(p.node)) continue;
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
