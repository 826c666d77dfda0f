#include "agent/detectors/job_hang_detector.h"

#include <algorithm>
#include <string>

#include "agent/detectors/evidence.h"
#include "lifeline/trace.h"

namespace lifeline::agent {

using namespace detail;

void JobHangDetector::Poll(const std::vector<RankProgress>& ranks, uint64_t now_ns, std::vector<Anomaly>* out) {
  // The communicators anyone reported, and their members; a communicator with a dead member is
  // the dead-rank detector's (its collectives wait for a rank that will not come).
  std::map<uint32_t, std::vector<const RankProgress*>> members;
  std::set<uint32_t> has_dead;
  // Ranks read before and missing now: their node's summary is no longer read (its lease ran out,
  // so node_lost names it). They are still members: stand-ins that began nothing, as stale as
  // their last summary has grown, so that the rest, all in the collective, is not "every member
  // joined" but held for the missing ranks' lease like any summary that stopped coming.
  std::set<int> present;
  for (const RankProgress& p : ranks) {
    present.insert(p.rank);
    Seen& s = seen_[p.rank];
    s.read_ns = now_ns;
    s.age_seconds = p.summary_age_seconds;
    s.comms.clear();
    for (const auto& [comm, c] : p.comms) s.comms.push_back(comm);
  }
  std::vector<RankProgress> missing;
  for (const auto& [rank, s] : seen_) {
    if (present.count(rank)) continue;
    RankProgress m;
    m.rank = rank;
    m.summary_age_seconds = s.age_seconds + Seconds(now_ns - std::min(now_ns, s.read_ns));
    for (uint32_t comm : s.comms) m.comms[comm] = CommProgress{};
    missing.push_back(std::move(m));
  }
  // Ranks of the round never read at all (their node went before its first summary arrived) are
  // members of the world too, as stale as the round is old.
  if (round_began_ns_ == 0) round_began_ns_ = now_ns;
  for (int rank = 0; rank < world_; ++rank) {
    if (present.count(rank) || seen_.count(rank)) continue;
    RankProgress m;
    m.rank = rank;
    m.summary_age_seconds = Seconds(now_ns - round_began_ns_);
    m.comms[0] = CommProgress{};
    missing.push_back(std::move(m));
  }
  auto add = [&](const RankProgress& p) {
    if (!p.alive) {
      has_dead.insert(0);
      for (const auto& [comm, c] : p.comms) has_dead.insert(comm);
      return;
    }
    members[0].push_back(&p);
    for (const auto& [comm, c] : p.comms)
      if (comm != 0) members[comm].push_back(&p);
  };
  for (const RankProgress& p : ranks) add(p);
  for (const RankProgress& p : missing) add(p);
  for (auto& [comm, list] : members) {
    if (has_dead.count(comm)) continue;
    uint64_t front = 0;
    for (const RankProgress* p : list) {
      const auto c = p->comms.find(comm);
      if (c != p->comms.end()) front = std::max(front, c->second.begun);
    }
    if (front == 0) continue;
    Front& f = fronts_[comm];
    if (front != f.seq) f = Front{front, now_ns, false};
    if (f.reported) continue;

    std::vector<int> in, never_joined, not_posted, posted;
    int op = 0;
    double open_seconds = 0;  // the longest any member has been in it, by the summaries' clocks
    for (const RankProgress* p : list) {
      const auto c = p->comms.find(comm);
      const bool began = c != p->comms.end() && c->second.begun >= front;
      if (!began) {
        never_joined.push_back(p->rank);
        continue;
      }
      if (c->second.open != static_cast<int64_t>(front)) continue;  // began and ended it
      in.push_back(p->rank);
      op = c->second.op;
      open_seconds = std::max(open_seconds, c->second.open_seconds);
      (c->second.posted ? posted : not_posted).push_back(p->rank);
    }
    if (in.empty()) continue;  // nobody waits in it (it ended, or the summaries lag)
    // How long it has stood: by the ranks' own clocks when the summaries say, else since this
    // detector first saw it.
    const double waited = std::max(open_seconds, Seconds(now_ns - f.since_ns));
    if (waited * 1e9 <= static_cast<double>(timeout_ns_)) continue;
    for (std::vector<int>* v : {&in, &never_joined, &not_posted, &posted}) std::sort(v->begin(), v->end());
    const std::string name = std::string(trace::OpName(static_cast<trace::Op>(op))) + " #" + std::to_string(front) +
                             " (comm " + std::to_string(comm) + ")";
    Anomaly a;
    a.kind = "hang";
    std::vector<int> waiting;
    if (!never_joined.empty()) {
      a.ranks = never_joined;
      waiting = in;
      a.message = Ranks(a.ranks) + " never joined " + name + "; " + Ranks(waiting) + " waited " + Duration(waited);
      a.evidence["verdict"] = "never_joined";
    } else if (!not_posted.empty() && !posted.empty()) {
      a.ranks = not_posted;
      waiting = posted;
      a.message = Ranks(a.ranks) + " never posted " + (a.ranks.size() == 1 ? "its" : "their") + " part of " + name +
                  "; " + Ranks(waiting) + " waited " + Duration(waited);
      a.evidence["verdict"] = "never_posted";
    } else {
      a.ranks = in;
      waiting = in;
      a.message = Ranks(a.ranks) + " stuck in " + name + " for " + Duration(waited) +
                  " (every member of the job joined it; no rank stands out)";
      a.evidence["verdict"] = "all_joined";
    }
    // Culprits whose node stopped publishing: likely lost, for its lease to tell (see the header).
    bool all_stale = !a.ranks.empty();
    for (int rank : a.ranks) {
      const auto p = std::find_if(list.begin(), list.end(), [rank](const RankProgress* x) { return x->rank == rank; });
      // A rank missing from the read is stale however fresh its last summary was.
      const bool stale = p != list.end() && ((*p)->summary_age_seconds > kStaleSummarySeconds || !present.count(rank));
      all_stale = all_stale && stale && (*p)->summary_age_seconds < stale_hold_seconds_;
    }
    if (all_stale) continue;
    // Any member whose node stopped publishing may be the reason the others wait (it left the
    // collective on its side, then its machine went): its lease decides before the waiting ranks
    // are blamed.
    const bool member_stale = std::any_of(list.begin(), list.end(), [&](const RankProgress* p) {
      const bool stale = p->summary_age_seconds > kStaleSummarySeconds || !present.count(p->rank);
      return stale && p->summary_age_seconds < stale_hold_seconds_;
    });
    if (member_stale) continue;
    a.message += " [job-wide view]";
    a.seq = front;
    a.comm = comm;
    a.op = trace::OpName(static_cast<trace::Op>(op));
    a.evidence["job_wide"] = true;
    a.evidence["timeout_seconds"] = Seconds(timeout_ns_);
    a.evidence["waited_seconds"] = waited;
    a.evidence["waiting_ranks"] = waiting;
    a.detected_ns = now_ns;
    out->push_back(std::move(a));
    f.reported = true;
  }
}

}  // namespace lifeline::agent
