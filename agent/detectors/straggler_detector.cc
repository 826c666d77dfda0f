#include "agent/detectors/straggler_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "agent/detectors/evidence.h"
#include "agent/detectors/sliding_window.h"

namespace lifeline::agent {

using namespace detail;
using trace::EventType;
using trace::kNoStep;

namespace {

// Steps waiting for their last rank's compute time; beyond this the oldest is dropped.
constexpr size_t kMaxPendingSteps = 512;

using Entry = StragglerDetector::Entry;

// One rank over a window of entries.
struct Verdict {
  size_t judged = 0;    // entries in which the rank and at least one peer have a value
  size_t outliers = 0;
  std::vector<double> own_excess, peer_excess, own_value, peer_value, z;
  double fraction() const { return judged == 0 ? 0 : static_cast<double>(outliers) / judged; }
};

// `rank` judged over `entries`; with `peers`, also the peers' values for the evidence (only for
// the ranks reported: gathering them for every rank would cost ranks x ranks per entry).
Verdict Judge(const std::deque<Entry>& entries, int rank, const StragglerConfig& c, bool peers) {
  Verdict v;
  for (const Entry& e : entries) {
    if (rank >= static_cast<int>(e.value.size()) || std::isnan(e.value[rank])) continue;
    if (e.present < 2) continue;
    ++v.judged;
    const double x = e.value[rank];
    double excess;
    double z = kNaN;
    bool outlier;
    double centre;
    if (e.present == 2) {
      // No spread to measure: the peer is the reference.
      centre = e.sum - x;
      excess = x - centre;
      outlier = excess > c.min_lateness_seconds;
    } else {
      centre = e.centre;
      excess = x - centre;
      z = excess / e.sigma;
      outlier = excess > c.min_lateness_seconds && z > c.mad_threshold;
    }
    if (outlier) ++v.outliers;
    v.own_excess.push_back(excess);
    v.own_value.push_back(x);
    if (std::isfinite(z)) v.z.push_back(z);
    if (!peers) continue;
    for (size_t p = 0; p < e.value.size(); ++p) {
      if (static_cast<int>(p) == rank || std::isnan(e.value[p])) continue;
      v.peer_excess.push_back(e.value[p] - centre);
      v.peer_value.push_back(e.value[p]);
    }
  }
  return v;
}

}  // namespace

void StragglerDetector::Reset(int world) {
  world_ = std::max(world, 0);
  reported_.assign(static_cast<size_t>(world_), false);
  reported_ns_.assign(static_cast<size_t>(world_), 0);
  pending_compute_.clear();
  lateness_.clear();
  compute_.clear();
  dirty_ = false;
}

void StragglerDetector::Push(std::deque<Entry>* window, Entry e) {
  std::vector<double> all;
  all.reserve(e.value.size());
  for (double x : e.value)
    if (!std::isnan(x)) all.push_back(x);
  e.present = all.size();
  e.sum = 0;
  for (double x : all) e.sum += x;
  if (all.size() > 2) {
    e.centre = Median(all);
    e.sigma = RobustSigma(all, e.centre);
  }
  PushToWindow(window, std::move(e), config_.window);
  dirty_ = true;
}

void StragglerDetector::Observe(const Timeline& t, const TimelineChange& c) {
  if (c.rank < 0 || c.rank >= world_ || c.event->type != EventType::kCollectiveBegin) return;
  const trace::Event& e = *c.event;
  if (c.entered_by_all) {
    const CollectiveRecord& rec = *c.record;
    std::vector<int> live;
    for (int m : t.Members(e.comm))
      if (t.rank(m).alive) live.push_back(m);
    if (live.size() >= 2) {
      uint64_t first = std::numeric_limits<uint64_t>::max();
      for (int m : live) first = std::min(first, rec.begin_ns[m]);
      Entry entry{e.comm, e.seq, rec.step, rec.op, std::vector<double>(static_cast<size_t>(world_), kNaN)};
      for (int m : live) entry.value[m] = Seconds(rec.begin_ns[m] - first);
      Push(&lateness_[e.comm], std::move(entry));
    }
  }
  if (c.first_collective_of_step) {
    const RankTimeline& r = t.rank(c.rank);
    std::vector<double>& times = pending_compute_[r.step];
    if (times.empty()) times.assign(static_cast<size_t>(world_), kNaN);
    times[c.rank] = Seconds(e.time_ns - r.step_begin_ns);
    size_t have = 0, alive = 0;
    for (int m = 0; m < world_; ++m) {
      if (!t.rank(m).alive) continue;
      ++alive;
      if (!std::isnan(times[m])) ++have;
    }
    if (have == alive) {
      if (have >= 2) Push(&compute_, Entry{e.comm, e.seq, r.step, e.op, times});
      pending_compute_.erase(r.step);
    }
    while (pending_compute_.size() > kMaxPendingSteps) pending_compute_.erase(pending_compute_.begin());
  }
}

void StragglerDetector::Poll(const Timeline& t, uint64_t now_ns, std::vector<Anomaly>* out) {
  if (!dirty_) return;
  dirty_ = false;
  const StragglerConfig& c = config_;
  const size_t window = std::max<uint32_t>(c.window, 1);

  struct Finding {
    int rank;
    Verdict late, comp;
    const Entry* latest;  // the newest entry of the comm judged for lateness
    double score;
  };
  std::vector<Finding> found;
  for (int rank = 0; rank < std::min(world_, t.world()); ++rank) {
    if (!t.rank(rank).alive) continue;
    if (reported_[rank] && now_ns - std::min(now_ns, reported_ns_[rank]) < Nanos(c.cooldown_seconds)) continue;
    Verdict late;
    const Entry* latest = nullptr;
    for (const auto& [comm, entries] : lateness_) {
      Verdict v = Judge(entries, rank, c, /*peers=*/false);
      if (v.judged < window) continue;
      if (latest == nullptr || v.fraction() > late.fraction()) {
        late = std::move(v);
        latest = &entries.back();
      }
    }
    Verdict comp = Judge(compute_, rank, c, /*peers=*/false);
    const bool by_late = late.judged >= window && late.fraction() >= c.min_fraction;
    const bool by_comp = comp.judged >= window && comp.fraction() >= c.min_fraction;
    if (!by_late && !by_comp) continue;
    if (latest == nullptr && !compute_.empty()) latest = &compute_.back();
    found.push_back({rank, std::move(late), std::move(comp), latest, 0});
    Finding& f = found.back();
    f.score = std::max(by_late ? f.late.fraction() : 0.0, by_comp ? f.comp.fraction() : 0.0);
  }
  if (found.empty()) return;

  Anomaly a;
  a.kind = "straggler";
  a.detected_ns = now_ns;
  const Finding* worst = &found[0];
  for (const Finding& f : found)
    if (f.score > worst->score) worst = &f;
  nlohmann::json per_rank = nlohmann::json::object();
  std::vector<std::string> clauses;
  std::string op_name;
  if (worst->latest != nullptr) {
    op_name = trace::OpName(worst->latest->op);
    a.step = KnownStep(worst->latest->step);
    a.seq = worst->latest->seq;
    a.comm = worst->latest->comm;
    a.op = op_name;
  }
  for (Finding& f : found) {
    // The evidence: the same verdicts, with the peers' values this time.
    for (const auto& [comm, entries] : lateness_)
      if (f.latest == &entries.back()) f.late = Judge(entries, f.rank, c, /*peers=*/true);
    f.comp = Judge(compute_, f.rank, c, /*peers=*/true);
    const int global = t.GlobalRank(f.rank);
    a.ranks.push_back(global);
    reported_[f.rank] = true;
    reported_ns_[f.rank] = now_ns;
    const bool by_comp = f.comp.judged >= window && f.comp.fraction() >= c.min_fraction &&
                         f.comp.fraction() >= (f.late.judged >= window ? f.late.fraction() : 0.0);
    const Verdict& basis = by_comp ? f.comp : f.late;
    nlohmann::json e;
    e["lateness_median_seconds"] = Number(Median(f.late.own_excess));
    e["peers_lateness_median_seconds"] = Number(Median(f.late.peer_excess));
    e["compute_median_seconds"] = Number(Median(f.comp.own_value));
    e["peers_compute_median_seconds"] = Number(Median(f.comp.peer_value));
    e["z"] = Number(Median(basis.z));
    e["window"] = window;
    e["fraction"] = basis.fraction();
    e["basis"] = by_comp ? "compute" : "lateness";
    std::string clause = "rank " + std::to_string(global) + " is " +
                         Duration(Median(f.late.own_excess)) + " late into " +
                         (op_name.empty() ? std::string("collectives") : op_name) + " (peers " +
                         Duration(Median(f.late.peer_excess)) + ")";
    if (!f.comp.own_value.empty())
      clause += ", computes " + Duration(Median(f.comp.own_value)) + " per step (peers " +
                Duration(Median(f.comp.peer_value)) + ")";
    clause += ", an outlier in " + std::to_string(basis.outliers) + " of the last " + std::to_string(basis.judged) +
              (by_comp ? " steps" : " collectives");
    clauses.push_back(clause);
    if (&f == worst) a.evidence = e;
    per_rank[std::to_string(global)] = std::move(e);
  }
  a.evidence["per_rank"] = std::move(per_rank);
  a.message = "straggler" + StepSuffix(a.step.value_or(kNoStep)) + ": ";
  for (size_t i = 0; i < clauses.size(); ++i) a.message += (i ? "; " : "") + clauses[i];
  out->push_back(std::move(a));
}

}  // namespace lifeline::agent
