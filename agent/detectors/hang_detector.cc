#include "agent/detectors/hang_detector.h"

#include <algorithm>
#include <string>

#include "agent/detectors/evidence.h"

namespace lifeline::agent {

using namespace detail;
using trace::EventType;
using trace::kNoStep;

void HangDetector::Reset(int world) {
  world_ = std::max(world, 0);
  collective_history_.clear();
  step_history_ = History{};
  reported_through_.clear();
  step_reported_begin_ns_.assign(static_cast<size_t>(world_), 0);
}

size_t HangDetector::HistoryCapacity() const {
  return static_cast<size_t>(std::max<uint32_t>(config_.window, 1)) * std::max(world_, 1);
}

void HangDetector::History::Push(uint64_t v, size_t capacity) {
  bool longest_left = false;
  values.push_back(v);
  while (values.size() > std::max<size_t>(capacity, 1)) {
    longest_left = longest_left || values.front() == longest;
    values.pop_front();
  }
  if (longest_left) {
    longest = *std::max_element(values.begin(), values.end());
  } else {
    longest = std::max(longest, v);
  }
}

uint64_t HangDetector::Timeout(const History* history) const {
  const double longest = history != nullptr ? Seconds(history->longest) : 0;
  const double t = std::min(std::max(config_.multiplier * longest, config_.floor_seconds), config_.cap_seconds);
  return Nanos(t);
}

std::string HangDetector::TimeoutReason(uint64_t timeout, const History* history) const {
  const double t = Seconds(timeout);
  const std::string times = Fmt("%g", config_.multiplier) + "x the longest recent one";
  const bool seen = history != nullptr && !history->values.empty();
  if (t <= config_.floor_seconds)
    return " (hang timeout " + Duration(t) + ": the floor, --hang-timeout, which no shorter timeout goes below; " +
           (seen ? times + " is " + Duration(config_.multiplier * Seconds(history->longest)) : "none finished yet") + ")";
  if (t >= config_.cap_seconds) return " (hang timeout " + Duration(t) + ": the cap, hang.cap_seconds)";
  return " (hang timeout " + Duration(t) + ": " + times + ")";
}

void HangDetector::Observe(const Timeline&, const TimelineChange& c) {
  if (c.rank < 0 || c.rank >= world_) return;
  const trace::Event& e = *c.event;
  if (e.type == EventType::kStepEnd && c.step_closed_ns)
    step_history_.Push(*c.step_closed_ns, HistoryCapacity());
  // A late End of a collective a later End already closed was not waited for: no history.
  if (e.type == EventType::kCollectiveEnd && c.collective_closed && !c.closed_early &&
      e.time_ns >= c.collective_closed->begin_ns)
    collective_history_[{e.comm, c.collective_closed->op}].Push(e.time_ns - c.collective_closed->begin_ns,
                                                                HistoryCapacity());
}

void HangDetector::CheckCollectives(const Timeline& t, uint64_t now, std::vector<Anomaly>* out, bool* any_open) {
  const int world = std::min(world_, t.world());
  // comm -> seq -> the live ranks inside it.
  std::map<uint32_t, std::map<uint64_t, std::vector<int>>> inside;
  for (int rank = 0; rank < world; ++rank) {
    if (!t.rank(rank).alive) continue;
    for (const auto& [comm, seqs] : t.rank(rank).open)
      for (const auto& [seq, open] : seqs) inside[comm][seq].push_back(rank);
  }
  *any_open = !inside.empty();
  for (const auto& [comm, seqs] : inside) {
    const uint64_t through = reported_through_.count(comm) ? reported_through_[comm] : 0;
    for (const auto& [seq, in] : seqs) {
      if (seq <= through) continue;
      auto open_of = [&t, comm = comm, seq = seq](int rank) -> const OpenCollective& {
        return t.rank(rank).open.at(comm).at(seq);
      };
      const OpenCollective* first = nullptr;
      for (int rank : in) {
        const OpenCollective& o = open_of(rank);
        if (first == nullptr || o.begin_ns < first->begin_ns) first = &o;
      }
      const auto history = collective_history_.find({comm, first->op});
      const History* h = history == collective_history_.end() ? nullptr : &history->second;
      const uint64_t timeout = Timeout(h);
      const uint64_t waited = now > first->begin_ns ? now - first->begin_ns : 0;
      if (waited <= timeout) continue;

      std::vector<int> live_members;
      std::vector<int> exited;
      for (int m : t.Members(comm)) (t.rank(m).alive ? live_members : exited).push_back(m);
      std::vector<int> never_joined;
      for (int m : live_members) {
        const auto& last_begun = t.rank(m).last_begun;
        auto it = last_begun.find(comm);
        if (it == last_begun.end() || it->second < seq) never_joined.push_back(m);
      }
      std::vector<int> not_posted;
      for (int rank : in)
        if (!open_of(rank).posted) not_posted.push_back(rank);
      // From here on the ranks are named as the job knows them.
      const std::vector<int> in_global = GlobalRanks(t, in);
      never_joined = GlobalRanks(t, never_joined);
      not_posted = GlobalRanks(t, not_posted);
      exited = GlobalRanks(t, exited);

      std::vector<int> culprits;
      std::vector<int> waiting;
      std::string what;
      const std::string name =
          std::string(trace::OpName(first->op)) + " #" + std::to_string(seq) + " (comm " + std::to_string(comm) + ")";
      if (!never_joined.empty()) {
        culprits = never_joined;
        waiting = in_global;
        what = Ranks(culprits) + " never joined " + name + StepSuffix(first->step) + "; " + Ranks(waiting) +
               " waited " + Duration(Seconds(waited));
      } else if (!not_posted.empty() && not_posted.size() < in_global.size()) {
        culprits = not_posted;
        for (int rank : in_global)
          if (!std::binary_search(culprits.begin(), culprits.end(), rank)) waiting.push_back(rank);
        what = Ranks(culprits) + " never posted " + (culprits.size() == 1 ? "its" : "their") + " part of " + name +
               StepSuffix(first->step) + "; " + Ranks(waiting) + " waited " + Duration(Seconds(waited));
      } else {
        culprits = in_global;
        waiting = in_global;
        what = Ranks(culprits) + " stuck in " + name + StepSuffix(first->step) + " for " + Duration(Seconds(waited)) +
               " (every member joined it; no rank stands out)";
      }
      if (!exited.empty()) what += "; exited: " + RankList(exited);
      what += TimeoutReason(timeout, h);

      Anomaly a;
      a.kind = "hang";
      a.ranks = culprits;
      a.step = KnownStep(first->step);
      a.seq = seq;
      a.comm = comm;
      a.op = trace::OpName(first->op);
      a.evidence["timeout_seconds"] = Seconds(timeout);
      a.evidence["waited_seconds"] = Seconds(waited);
      a.evidence["waiting_ranks"] = waiting;
      a.evidence["history_size"] = h == nullptr ? 0 : h->values.size();
      // Which rule named the culprits: in a multi-node job the agent leaves "all_joined" (no rank
      // of this node stands out) to the job-wide view, where the rank holding it up may show.
      a.evidence["verdict"] = !never_joined.empty() ? "never_joined" : culprits == in_global ? "all_joined" : "never_posted";
      if (!exited.empty()) a.evidence["exited_ranks"] = exited;
      a.message = what;
      a.detected_ns = now;
      out->push_back(std::move(a));
      // Every seq open on this comm now belongs to this stall.
      reported_through_[comm] = seqs.rbegin()->first;
      break;
    }
  }
}

void HangDetector::CheckSteps(const Timeline& t, uint64_t now, std::vector<Anomaly>* out) {
  const int world = std::min(world_, t.world());
  const uint64_t timeout = Timeout(&step_history_);
  uint64_t waited = 0;
  bool stalled = false;
  std::vector<int> participants;
  for (int rank = 0; rank < world; ++rank) {
    const RankTimeline& r = t.rank(rank);
    if (!r.alive || r.finished || r.step == kNoStep) continue;
    participants.push_back(rank);
    if (!r.step_open || r.step_begin_ns == step_reported_begin_ns_[rank] || now <= r.step_begin_ns) continue;
    waited = std::max(waited, now - r.step_begin_ns);
    if (now - r.step_begin_ns > timeout) stalled = true;
  }
  if (!stalled) return;

  uint64_t lowest = kNoStep;
  for (int rank : participants) lowest = std::min(lowest, t.rank(rank).step);
  auto silence_of = [&t, now](int rank) {
    return now > t.rank(rank).last_event_ns ? now - t.rank(rank).last_event_ns : 0;
  };
  std::vector<int> culprits;
  std::vector<int> others;
  std::string what;
  uint64_t longest_silence = 0;
  for (int rank : participants) longest_silence = std::max(longest_silence, silence_of(rank));
  bool all_same = true;
  for (int rank : participants) all_same = all_same && t.rank(rank).step == lowest;
  for (int rank : participants) {
    // At one step, the culprits are those silent about as long as the most silent one.
    const bool culprit = all_same ? 2 * silence_of(rank) >= longest_silence : t.rank(rank).step == lowest;
    (culprit ? culprits : others).push_back(rank);
  }
  culprits = GlobalRanks(t, culprits);
  others = GlobalRanks(t, others);
  if (!all_same) {
    what = Ranks(culprits) + " stuck at step " + std::to_string(lowest) + " for " + Duration(Seconds(waited)) +
           " with no collective open; " + Ranks(others) + " went on";
  } else {
    what = Ranks(culprits) + " silent for " + Duration(Seconds(longest_silence)) + " in step " + std::to_string(lowest) +
           " (open " + Duration(Seconds(waited)) + ", no collective open)" +
           (others.empty() ? "" : "; " + Ranks(others) + " still report");
  }
  what += TimeoutReason(timeout, &step_history_);
  for (int rank = 0; rank < world; ++rank)
    if (t.rank(rank).step_open) step_reported_begin_ns_[rank] = t.rank(rank).step_begin_ns;

  Anomaly a;
  a.kind = "hang";
  a.ranks = culprits;
  a.step = KnownStep(lowest);
  a.evidence["timeout_seconds"] = Seconds(timeout);
  a.evidence["waited_seconds"] = Seconds(waited);
  a.evidence["waiting_ranks"] = others;
  a.evidence["history_size"] = step_history_.values.size();
  a.evidence["silent_seconds"] = Seconds(longest_silence);
  a.message = what;
  a.detected_ns = now;
  out->push_back(std::move(a));
}

void HangDetector::Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) {
  bool any_open = false;
  CheckCollectives(timeline, now_ns, out, &any_open);
  // A step with a collective open somewhere is the collective's business.
  if (!any_open) CheckSteps(timeline, now_ns, out);
}

}  // namespace lifeline::agent
