#include "agent/detectors/checkpoint_detector.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "agent/detectors/evidence.h"
#include "lifeline/status.h"

namespace lifeline::agent {

using namespace detail;
using trace::EventType;
using trace::kNoStep;

void CheckpointDetector::Reset(int world) {
  world_ = std::max(world, 0);
  reported_.assign(static_cast<size_t>(world_), false);
  reported_ns_.assign(static_cast<size_t>(world_), 0);
  failures_.clear();
  fallbacks_.clear();
  superseded_.clear();
  behind_.assign(static_cast<size_t>(world_), false);
}

void CheckpointDetector::Observe(const Timeline&, const TimelineChange& c) {
  if (c.rank < 0 || c.rank >= world_) return;
  const trace::Event& e = *c.event;
  if (e.type == EventType::kCheckpointFallback) fallbacks_.push_back({c.rank, e.step, e.bytes, e.aux == 1});
  if (e.type == EventType::kCheckpointPersisted) behind_[c.rank] = false;
  if (e.type != EventType::kCheckpointFailed) return;
  if (e.aux != static_cast<uint64_t>(StatusCode::kAborted)) {
    failures_.push_back({c.rank, e.step, e.aux});
  } else if (!behind_[c.rank]) {
    behind_[c.rank] = true;
    superseded_.push_back({c.rank, e.step, e.aux});
  }
}

void CheckpointDetector::ReportBehind(const Timeline& t, uint64_t now, std::vector<Anomaly>* out) {
  if (superseded_.empty()) return;
  std::vector<int> ranks;
  std::vector<uint64_t> steps;
  for (const Failure& f : superseded_) {
    ranks.push_back(f.rank);
    if (f.step != kNoStep) steps.push_back(f.step);
  }
  superseded_.clear();
  ranks = GlobalRanks(t, ranks);
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  Anomaly a;
  a.kind = "checkpoint";
  a.ranks = ranks;
  a.step = steps.empty() ? std::nullopt : KnownStep(steps.back());
  a.detected_ns = now;
  a.evidence["superseded_steps"] = steps;
  a.evidence["status"] = StatusCodeName(StatusCode::kAborted);
  a.evidence["status_code"] = static_cast<uint64_t>(StatusCode::kAborted);
  std::string list;
  for (uint64_t step : steps) list += (list.empty() ? "" : ", ") + std::to_string(step);
  a.message = "the durable copy is behind on " + Ranks(ranks) + ": the save" + (steps.size() == 1 ? " of step " : "s of steps ") +
              list + " gave way to newer snapshots before the store took " + (steps.size() == 1 ? "it" : "them") +
              " (it is slow or unreachable); training goes on, and the memory tier holds the newer steps";
  out->push_back(std::move(a));
}

void CheckpointDetector::ReportFailures(const Timeline& t, uint64_t now, std::vector<Anomaly>* out) {
  // A load that passed over a damaged checkpoint: one anomaly per skipped step, naming the ranks.
  std::map<std::pair<uint64_t, bool>, std::vector<const Fallback*>> skipped;
  for (const Fallback& f : fallbacks_) skipped[{f.skipped_step, f.memory}].push_back(&f);
  for (const auto& [key, list] : skipped) {
    Anomaly a;
    a.kind = "checkpoint";
    a.step = KnownStep(key.first);
    a.detected_ns = now;
    for (const Fallback* f : list) a.ranks.push_back(t.GlobalRank(f->rank));
    std::sort(a.ranks.begin(), a.ranks.end());
    a.ranks.erase(std::unique(a.ranks.begin(), a.ranks.end()), a.ranks.end());
    const uint64_t loaded = list.front()->loaded_step;
    a.evidence["fallback"] = true;
    a.evidence["skipped_step"] = key.first;
    a.evidence["loaded_step"] = loaded;
    a.evidence["location"] = key.second ? "memory" : "disk";
    a.message = std::string("the checkpoint of step ") + std::to_string(key.first) + (key.second ? " in memory" : " on disk") +
                " could not be loaded by " + Ranks(a.ranks) + ", which loaded step " + std::to_string(loaded) + " instead";
    out->push_back(std::move(a));
  }
  fallbacks_.clear();
  std::map<uint64_t, std::vector<Failure>> by_step;
  for (const Failure& f : failures_) by_step[f.step].push_back(f);
  failures_.clear();
  for (auto& [step, list] : by_step) {
    std::sort(list.begin(), list.end(), [](const Failure& a, const Failure& b) { return a.rank < b.rank; });
    Anomaly a;
    a.kind = "checkpoint";
    a.step = KnownStep(step);
    a.detected_ns = now;
    nlohmann::json codes = nlohmann::json::object();
    for (const Failure& f : list) {
      const int global = t.GlobalRank(f.rank);
      if (a.ranks.empty() || a.ranks.back() != global) a.ranks.push_back(global);
      codes[std::to_string(global)] = f.code;
    }
    const uint64_t code = list.front().code;
    const char* code_name = StatusCodeName(static_cast<StatusCode>(code));
    a.evidence["status_code"] = code;
    a.evidence["status"] = code_name;
    a.evidence["status_codes"] = codes;
    a.message = "checkpoint" + (step == kNoStep ? std::string() : " of step " + std::to_string(step)) +
                " failed on " + Ranks(a.ranks) + ": " + code_name + " (code " + std::to_string(code) + ")";
    out->push_back(std::move(a));
  }
}

void CheckpointDetector::CheckLag(const Timeline& t, uint64_t now, std::vector<Anomaly>* out) {
  const size_t need = std::max<uint32_t>(config_.lag_count, 1);
  std::vector<int> lagging;
  nlohmann::json per_rank = nlohmann::json::object();
  nlohmann::json first;
  uint64_t newest_step = kNoStep;
  std::string detail;
  for (int rank = 0; rank < std::min(world_, t.world()); ++rank) {
    const RankTimeline& r = t.rank(rank);
    if (!r.alive) continue;
    if (reported_[rank] && now - std::min(now, reported_ns_[rank]) < Nanos(config_.cooldown_seconds)) continue;
    std::vector<const CheckpointSave*> run;  // newest first
    size_t pending = 0;
    for (auto it = r.saves.rbegin(); it != r.saves.rend() && run.size() < need; ++it) {
      if (it->interval_ns == 0) break;  // the first save seen: no cadence to compare with
      const double limit = std::max(config_.lag_factor * Seconds(it->interval_ns),
                                    Seconds(it->interval_ns) + config_.lag_min_seconds);
      const uint64_t end = it->persisted_ns != 0 ? it->persisted_ns : now;
      const bool late = SecondsBetween(it->begin_ns, end) > limit;
      if (late) {
        run.push_back(&*it);
        if (it->persisted_ns == 0) ++pending;
        continue;
      }
      // The newest save, still within its time, decides nothing yet.
      if (it->persisted_ns == 0 && run.empty() && it == r.saves.rbegin()) continue;
      break;
    }
    if (run.size() < need) continue;
    std::reverse(run.begin(), run.end());
    std::vector<double> persist, intervals;
    for (const CheckpointSave* s : run) {
      persist.push_back(SecondsBetween(s->begin_ns, s->persisted_ns != 0 ? s->persisted_ns : now));
      intervals.push_back(Seconds(s->interval_ns));
    }
    nlohmann::json e;
    e["persist_seconds"] = persist;
    e["interval_seconds"] = Median(intervals);
    e["lag_factor"] = config_.lag_factor;
    e["lag_min_seconds"] = config_.lag_min_seconds;
    e["unpersisted"] = pending;
    if (lagging.empty()) {
      first = e;
      newest_step = run.back()->step;
      std::string list;
      for (size_t i = 0; i < run.size(); ++i)
        list += (list.empty() ? "" : ", ") + Duration(persist[i]) + (run[i]->persisted_ns == 0 ? "+" : "");
      detail = "the last " + std::to_string(run.size()) + " saves took " + list + " to persist" +
               (pending ? " (+: not yet persisted)" : "") + " with " + Duration(Median(intervals)) +
               " between saves";
    }
    per_rank[std::to_string(t.GlobalRank(rank))] = std::move(e);
    lagging.push_back(rank);
    reported_[rank] = true;
    reported_ns_[rank] = now;
  }
  if (lagging.empty()) return;
  lagging = GlobalRanks(t, lagging);
  Anomaly a;
  a.kind = "checkpoint";
  a.ranks = lagging;
  a.step = KnownStep(newest_step);
  a.evidence = first;
  a.evidence["per_rank"] = per_rank;
  a.message = "checkpoint persistence cannot keep up on " + Ranks(lagging) + ": " +
              (lagging.size() == 1 ? "" : "on rank " + std::to_string(lagging.front()) + ", ") + detail +
              (newest_step == kNoStep ? "" : " (newest: step " + std::to_string(newest_step) + ")");
  a.detected_ns = now;
  out->push_back(std::move(a));
}

void CheckpointDetector::Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) {
  ReportFailures(timeline, now_ns, out);
  ReportBehind(timeline, now_ns, out);
  CheckLag(timeline, now_ns, out);
}

}  // namespace lifeline::agent
