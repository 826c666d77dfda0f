#include "agent/detectors/slow_collective_detector.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "agent/detectors/evidence.h"
#include "agent/detectors/sliding_window.h"

namespace lifeline::agent {

using namespace detail;
using trace::Op;

void SlowCollectiveDetector::Reset(int world) {
  world_ = std::max(world, 0);
  stats_.clear();
  last_end_.clear();
}

void SlowCollectiveDetector::Observe(const Timeline& t, const TimelineChange& c) {
  if (c.rank < 0 || c.rank >= world_ || !c.exited_by_all) return;
  const uint32_t comm = c.event->comm;
  const CollectiveRecord& rec = *c.record;
  uint64_t last_begin = 0;
  Sample sample;
  sample.seq = c.event->seq;
  sample.step = rec.step;
  sample.posted_delay.assign(static_cast<size_t>(world_), kNaN);
  const std::vector<int> members = t.Members(comm);
  for (int m : members) {
    if (!t.rank(m).alive) continue;
    last_begin = std::max(last_begin, rec.begin_ns[m]);
    if (rec.posted_ns[m] != 0) sample.posted_delay[m] = SecondsBetween(rec.begin_ns[m], rec.posted_ns[m]);
  }
  // From the last entry to the median member's exit. Not to the last exit: the members that waited
  // for a late rank were asleep and must be woken and scheduled again, and on a host with fewer
  // cores than ranks (the late rank already computing its next step on one of them) the last of
  // them leaves milliseconds after the rest. That delay is the late rank's doing, which the
  // straggler detector reports; a communicator is slow when most of its members see it slow.
  std::vector<double> exits;
  exits.reserve(members.size());
  for (int m : members)
    if (t.rank(m).alive) exits.push_back(SecondsBetween(last_begin, rec.end_ns[m]));
  if (exits.empty()) return;
  sample.duration = Median(std::move(exits));
  // Once every part is in: from the last post to the median member's exit (NaN when a member
  // posts no part: its contribution's time is unknown).
  sample.transfer = kNaN;
  uint64_t last_post = 0;
  bool all_posted = true;
  for (int m : members) {
    if (!t.rank(m).alive) continue;
    all_posted = all_posted && rec.posted_ns[m] != 0;
    last_post = std::max(last_post, rec.posted_ns[m]);
  }
  if (all_posted && last_post != 0) {
    std::vector<double> after_post;
    for (int m : members)
      if (t.rank(m).alive) after_post.push_back(rec.end_ns[m] >= last_post ? SecondsBetween(last_post, rec.end_ns[m]) : 0.0);
    sample.transfer = Median(std::move(after_post));
  }
  // Each member's own time since its previous collective on this communicator ended (that one
  // judged here too, so consecutive): its compute, its host's doing, never the link's.
  std::vector<std::pair<uint64_t, uint64_t>>& last = last_end_[comm];
  last.resize(static_cast<size_t>(world_), {0, 0});
  std::vector<double> work;
  for (int m : members) {
    if (!t.rank(m).alive || rec.end_ns[m] == 0) continue;
    const auto [prev_seq, prev_end] = last[m];
    if (prev_seq + 1 == sample.seq && prev_end != 0 && rec.begin_ns[m] >= prev_end)
      work.push_back(SecondsBetween(prev_end, rec.begin_ns[m]));
    last[m] = {sample.seq, rec.end_ns[m]};
  }
  sample.work = Median(std::move(work));
  OpStats& st = stats_[{comm, rec.op}];
  if (st.baseline.size() < std::max<uint32_t>(config_.baseline_window, 1)) {
    st.baseline.push_back(sample.duration);
    if (!std::isnan(sample.work)) st.baseline_work.push_back(sample.work);
  } else {
    PushToWindow(&st.recent, std::move(sample), config_.recent_window);
    st.dirty = true;
  }
}

namespace {

// A rank is named when its median posted delay exceeds its peers' by this many robust sigmas (or
// it is the one clear maximum). When the rank alone is the reason to fire (the communicator's own
// median has not slowed), a stricter bar: over a thousand ranks, 3 sigmas is passed by chance.
constexpr double kCulpritZ = 3;
constexpr double kLoneCulpritZ = 6;

struct RankDelay {
  int rank = 0;
  double delay = 0;       // its median posted delay over the recent window
  double excess = 0;      // above its peers' median
  double z = 0;           // in its peers' robust sigmas
  bool clear_max = false; // the largest delay, by more than min_excess_seconds over the next
};

}  // namespace

void SlowCollectiveDetector::Check(const Timeline& t, uint32_t comm, Op op, OpStats* st, uint64_t now,
                                   std::vector<Anomaly>* out) {
  const SlowCollectiveConfig& c = config_;
  if (st->recent.size() < std::max<uint32_t>(c.recent_window, 1)) return;
  // One fault, one alarm: within the cooldown nothing fires again, except a first alarm naming a
  // rank after one that named none (a communicator seen slow as a whole, amid host contention say,
  // then the link at fault): that is news, and it must not wait out the cooldown of the vaguer one.
  const bool cooling = st->reported && now - std::min(now, st->reported_ns) < Nanos(c.cooldown_seconds);
  if (cooling && st->reported_ranks) return;
  const double base = Median(st->baseline);
  std::vector<double> durations;
  for (const Sample& s : st->recent) durations.push_back(s.duration);
  const double recent = Median(durations);
  const bool comm_slow = recent > c.factor * base && recent - base > c.min_excess_seconds;

  // Each rank's median posted delay over the recent window, against its peers'. A rank that holds
  // its part back delays everyone's end by as much, but the communicator's duration (from its last
  // member's entry) hides it whenever that rank entered early: among a thousand ranks the last
  // entry is usually tens of ms after a typical one. So the ranks are judged on their own too.
  std::vector<std::pair<int, double>> delays;
  std::vector<double> window;
  for (int r = 0; r < world_; ++r) {
    window.clear();
    for (const Sample& s : st->recent)
      if (!std::isnan(s.posted_delay[r])) window.push_back(s.posted_delay[r]);
    if (!window.empty() && 2 * window.size() >= st->recent.size()) delays.push_back({r, Median(window)});
  }
  std::vector<RankDelay> outliers;
  if (delays.size() >= 2) {
    std::vector<double> sorted;
    sorted.reserve(delays.size());
    for (const auto& [r, d] : delays) sorted.push_back(d);
    std::sort(sorted.begin(), sorted.end());
    const double top = sorted.back(), second = sorted[sorted.size() - 2];
    // Without one rank the median moves by at most one place: only ranks this far above the place
    // below the middle can stand out, and only they are compared with their peers one by one (a
    // thousand ranks make a quadratic pass too slow for the leader's every read).
    const size_t middle = (sorted.size() - 1) / 2;
    const double floor = sorted[middle > 0 ? middle - 1 : 0];
    std::vector<double> peers;
    for (const auto& [r, d] : delays) {
      if (!(d - floor > c.min_excess_seconds)) continue;
      peers.clear();
      for (const auto& [p, dp] : delays)
        if (p != r) peers.push_back(dp);
      const double peer_median = Median(peers);
      RankDelay x;
      x.rank = r;
      x.delay = d;
      x.excess = d - peer_median;
      x.z = x.excess / RobustSigma(peers, peer_median);
      x.clear_max = d == top && top - second > c.min_excess_seconds;
      if (x.excess > c.min_excess_seconds && (x.z > kCulpritZ || x.clear_max)) outliers.push_back(x);
    }
  }
  // A rank that alone holds every collective back by (factor - 1) x the collective's own cost
  // slows it by the factor, as the communicator's own check would have it had that rank entered
  // last. The cost: the baseline, or when less what the collective takes once every part is in
  // (the last post to the median exit; the baseline may have formed while the rank was late
  // already: see the header).
  std::vector<double> transfers;
  for (const Sample& s : st->recent)
    if (!std::isnan(s.transfer)) transfers.push_back(s.transfer);
  const double own_cost = 2 * transfers.size() >= st->recent.size() ? std::min(base, Median(transfers)) : base;
  std::vector<RankDelay> culprit_delays;
  for (const RankDelay& x : outliers)
    if (comm_slow || (x.excess > (c.factor - 1) * own_cost && (x.z > kLoneCulpritZ || x.clear_max)))
      culprit_delays.push_back(x);
  if (!comm_slow && culprit_delays.empty()) return;
  if (cooling && culprit_delays.empty()) return;

  std::vector<int> culprits;
  for (const RankDelay& x : culprit_delays) culprits.push_back(x.rank);
  double peers_for_message = kNaN;
  if (delays.size() >= 2) {
    std::vector<double> others;
    for (const auto& [r, d] : delays)
      if (!std::binary_search(culprits.begin(), culprits.end(), r)) others.push_back(d);
    peers_for_message = Median(others);
  }
  culprits = GlobalRanks(t, culprits);  // from here on, as the job names them
  nlohmann::json delay_json = nlohmann::json::object();
  double worst = 0;
  for (size_t i = 0; i < culprits.size(); ++i) {
    delay_json[std::to_string(culprits[i])] = culprit_delays[i].delay;
    worst = std::max(worst, culprit_delays[i].excess);
  }

  // The ranks' own work between collectives against its baseline: slowed as much as the
  // collectives (kHostBusyShare of their growth), a communicator slow as a whole is the host's.
  std::vector<double> recent_work;
  for (const Sample& s : st->recent)
    if (!std::isnan(s.work)) recent_work.push_back(s.work);
  const double work_base = Median(st->baseline_work);
  const double work_recent = 2 * recent_work.size() >= st->recent.size() ? Median(recent_work) : kNaN;
  const bool host_busy = comm_slow && culprits.empty() && !std::isnan(work_base) && !std::isnan(work_recent) &&
                         work_recent - work_base >= kHostBusyShare * (recent - base);

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
  a.evidence["posted_delay_median_seconds"] = delay_json;
  a.evidence["peers_posted_delay_median_seconds"] = Number(peers_for_message);
  // "communicator": its median duration slowed past the factor; "rank": it did not (the late
  // ranks entered early enough to hide it), but the named ranks hold their part back that long.
  a.evidence["trigger"] = comm_slow ? "communicator" : "rank";
  if (!std::isnan(work_base) && !std::isnan(work_recent)) {
    a.evidence["work_baseline_median_seconds"] = work_base;
    a.evidence["work_recent_median_seconds"] = work_recent;
  }
  if (host_busy) a.evidence["host_busy"] = true;
  std::string what;
  if (comm_slow) {
    what = name + " slowed to " + Duration(recent) + " (median of the last " + std::to_string(st->recent.size()) +
           ", baseline " + Duration(base) + (base > 0 ? ", x" + Fmt("%.1f", recent / base) : std::string()) + ")";
  } else {
    // Against the collective's own cost, as the rank was judged.
    const double cost = own_cost;
    const double held = cost + worst;
    a.evidence["held_back_factor"] = cost > 0 ? Number(held / cost) : nlohmann::json(nullptr);
    a.evidence["own_cost_seconds"] = cost;
    what = name + " held back to " + Duration(held) + " by late parts (" +
           (cost < base ? "without them " + Duration(cost) + ", baseline " + Duration(base) : "baseline " + Duration(base)) +
           (cost > 0 ? ", x" + Fmt("%.1f", held / cost) : std::string()) + "; from the last entry " +
           Duration(recent) + ", median of the last " + std::to_string(st->recent.size()) + ")";
  }
  if (host_busy) {
    what += ": no rank stands out, and the ranks' own work between collectives slowed as much (" +
            Duration(work_base) + " to " + Duration(work_recent) + "): the host is busy, not the communicator";
  } else if (culprits.empty()) {
    what += ": no rank stands out, the whole communicator is slow";
  } else {
    std::string each;
    for (const RankDelay& x : culprit_delays) each += (each.empty() ? "" : ", ") + Duration(x.delay);
    what += ": " + Ranks(culprits) + " post" + (culprits.size() == 1 ? "s " : " ") + (culprits.size() == 1 ? "its" : "their") +
            " part " + each + " after entering (peers " + Duration(peers_for_message) + ")";
  }
  a.message = what + StepSuffix(st->recent.back().step);
  a.detected_ns = now;
  out->push_back(std::move(a));
  st->reported = true;
  st->reported_ns = now;
  st->reported_ranks = !culprits.empty();
}

void SlowCollectiveDetector::Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) {
  for (auto& [key, st] : stats_) {
    if (!st.dirty) continue;
    st.dirty = false;
    Check(timeline, key.first, key.second, &st, now_ns, out);
  }
}

}  // namespace lifeline::agent
