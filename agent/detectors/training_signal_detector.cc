#include "agent/detectors/training_signal_detector.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "agent/detectors/evidence.h"
#include "agent/detectors/sliding_window.h"

namespace lifeline::agent {

using namespace detail;
using trace::EventType;
using trace::kNoStep;

namespace {

// Bounds on what waits for a verdict: a rank that reports many steps ahead of a silent peer
// must not grow the agent without end (the oldest are judged with what they have).
constexpr size_t kMaxFindings = 4096;
constexpr size_t kMaxComparisons = 4096;
constexpr size_t kMaxEvidenceValues = 16;

// A number for the evidence: JSON has no NaN or infinity, so those are spelled.
nlohmann::json Value(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

std::string Spell(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+inf" : "-inf";
  return Fmt("%.6g", x);
}

// Bit for bit, but every NaN alike (its payload is no disagreement).
uint64_t Bits(double x) {
  if (std::isnan(x)) x = std::numeric_limits<double>::quiet_NaN();
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

std::string Hex(uint64_t bits) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(bits));
  return buf;
}

// The median of `v` and its MAD, in place.
std::pair<double, double> MedianAndMad(std::vector<double>* v) {
  const double m = Median(*v);
  for (double& x : *v) x = std::fabs(x - m);
  return {m, Median(*v)};
}

}  // namespace

TrainingSignalDetector::TrainingSignalDetector(const TrainingSignalConfig& config)
    : config_(config),
      watched_(config.watched.begin(), config.watched.end()),
      replicated_(config.replicated.begin(), config.replicated.end()) {}

void TrainingSignalDetector::Reset(int world) {
  // The series outlive a launch of the same world (their steps going back rewinds them); another
  // world's ranks hold other shards, batches and values.
  if (std::max(world, 0) != world_) series_.assign(static_cast<size_t>(std::max(world, 0)), {});
  for (auto& by_scalar : series_)
    for (auto& [scalar, series] : by_scalar) series.relaunched = true;
  world_ = std::max(world, 0);
  names_.assign(static_cast<size_t>(world_), {});
  max_step_.assign(static_cast<size_t>(world_), kNoStep);
  findings_.clear();
  comparisons_.clear();
  non_finite_named_.clear();
  non_finite_raised_ = false;
  disagreeing_.clear();
}

int TrainingSignalDetector::GroupOf(int global) const {
  return config_.replica_group_size == 0 ? 0 : global / static_cast<int>(config_.replica_group_size);
}

void TrainingSignalDetector::Observe(const Timeline& t, const TimelineChange& c) {
  if (c.rank < 0 || c.rank >= world_) return;
  const trace::Event& e = *c.event;
  if (e.type == EventType::kScalarName) {
    Result<std::string> name = trace::DecodeScalarName(e);
    if (name.ok() && e.comm >= trace::kFirstUserScalar && e.comm < trace::kMaxScalars) names_[c.rank][e.comm] = *name;
    return;
  }
  if (e.type != EventType::kScalar) return;
  ++values_;
  std::string scalar;
  if (e.comm == trace::kLossScalar) {
    scalar = "loss";
  } else if (e.comm == trace::kGradNormScalar) {
    scalar = "grad_norm";
  } else {
    const auto it = names_[c.rank].find(e.comm);
    if (it == names_[c.rank].end()) {
      ++unnamed_;
      return;
    }
    scalar = it->second;
  }
  if (e.step == kNoStep) return;  // a value of no step cannot be lined up with the others
  ObserveValue(t, c.rank, scalar, e.step, trace::ScalarValue(e));
}

void TrainingSignalDetector::ObserveValue(const Timeline& t, int rank, const std::string& scalar, uint64_t step,
                                          double value) {
  uint64_t& latest = max_step_[rank];
  if (latest == kNoStep || step > latest) latest = step;

  if (replicated_.count(scalar) != 0) {
    if (comparisons_.size() >= kMaxComparisons) comparisons_.erase(comparisons_.begin());
    Comparison& cmp = comparisons_[{scalar, GroupOf(t.GlobalRank(rank)), step}];
    cmp.bits[rank] = Bits(value);
    cmp.values[rank] = value;
  }
  if (watched_.count(scalar) == 0) return;

  Series& s = series_[rank][scalar];
  // A rollback within the process, or a relaunch redoing steps (from its first value on: values of
  // one step reported twice in a launch, as gradient accumulation may, are no rewind).
  if (s.last_step != kNoStep && (step < s.last_step || (s.relaunched && step == s.last_step))) Rewind(&s, step);
  s.relaunched = false;
  if (s.first_step == kNoStep) s.first_step = step;
  s.last_step = step;
  auto add = [this](Finding f) {
    if (findings_.size() >= kMaxFindings) findings_.erase(findings_.begin());
    findings_.push_back(std::move(f));
  };

  if (!std::isfinite(value)) {
    s.run_steps.clear();
    s.run_values.clear();
    s.run_z.clear();
    ++s.non_finite_run;
    const uint32_t needed = scalar == "loss" ? 1 : std::max<uint32_t>(config_.non_finite_in_a_row, 1);
    if (s.non_finite_run >= needed && !non_finite_raised_ && non_finite_named_.insert({rank, scalar}).second) {
      Finding f{Finding::kNonFinite, rank, scalar, step, step, 0, nlohmann::json::object()};
      f.evidence = {{"scalar", scalar}, {"value", Value(value)}, {"in_a_row", s.non_finite_run}};
      add(std::move(f));
    }
    return;
  }
  s.non_finite_run = 0;

  const TrainingSignalConfig& c = config_;
  if (s.seen >= c.warmup_steps && s.window.size() >= 3) {
    std::vector<double> v(s.window.begin(), s.window.end());
    const auto [median, mad] = MedianAndMad(&v);
    const double spread = std::max({1.4826 * mad, c.spread_floor * std::fabs(median), std::numeric_limits<double>::min()});
    const double z = (value - median) / spread;
    const bool high = z >= c.spike_threshold && value - median >= c.spike_min_rise * std::fabs(median);
    if (high) {
      s.run_steps.push_back(step);
      s.run_values.push_back(value);
      s.run_z.push_back(z);
      if (!s.in_episode && (s.run_steps.size() >= c.spike_confirm || z >= c.spike_single_threshold)) {
        s.in_episode = true;
        Finding f{Finding::kSpike, rank, scalar, s.run_steps.front(), step, 0, nlohmann::json::object()};
        nlohmann::json values = nlohmann::json::array(), steps = nlohmann::json::array(), zs = nlohmann::json::array();
        for (size_t i = 0; i < s.run_steps.size() && i < kMaxEvidenceValues; ++i) {
          steps.push_back(s.run_steps[i]);
          values.push_back(Value(s.run_values[i]));
          zs.push_back(Number(s.run_z[i]));
        }
        f.evidence = {{"scalar", scalar},      {"steps", steps},   {"values", values},
                      {"z", zs},               {"median", median}, {"mad", mad},
                      {"spread", spread},      {"window", s.window.size()},
                      {"max_z", *std::max_element(s.run_z.begin(), s.run_z.end())}};
        add(std::move(f));
      }
    } else {
      s.run_steps.clear();
      s.run_values.clear();
      s.run_z.clear();
      s.in_episode = false;
    }
  }
  PushToWindow(&s.window, value, std::max<uint32_t>(c.window, 3));
  PushToWindow(&s.window_steps, step, std::max<uint32_t>(c.window, 3));
  ++s.seen;
}

void TrainingSignalDetector::Rewind(Series* s, uint64_t step) {
  while (!s->window_steps.empty() && s->window_steps.back() >= step) {
    s->window_steps.pop_back();
    s->window.pop_back();
  }
  // Values seen of the steps before `step`: at most one a step since the first.
  const uint64_t before = s->first_step == kNoStep || step <= s->first_step ? 0 : step - s->first_step;
  s->seen = std::min(s->seen, before);
  if (s->seen == 0) s->first_step = kNoStep;
  s->non_finite_run = 0;
  s->in_episode = false;
  s->run_steps.clear();
  s->run_values.clear();
  s->run_z.clear();
}

bool TrainingSignalDetector::Settled(const Timeline& t, uint64_t step, uint64_t seen_ns, uint64_t now_ns) const {
  if (seen_ns != 0 && now_ns >= seen_ns + Nanos(config_.hold_seconds)) return true;
  for (int r = 0; r < std::min(world_, t.world()); ++r) {
    if (!t.rank(r).alive || max_step_[r] == kNoStep) continue;
    if (max_step_[r] <= step) return false;
  }
  return true;
}

void TrainingSignalDetector::Poll(const Timeline& t, uint64_t now_ns, std::vector<Anomaly>* out) {
  if (findings_.empty() && comparisons_.empty()) return;
  std::vector<Finding> non_finite, spikes;
  for (auto it = findings_.begin(); it != findings_.end();) {
    if (it->seen_ns == 0) it->seen_ns = now_ns;
    if (!Settled(t, it->settle_step, it->seen_ns, now_ns)) {
      ++it;
      continue;
    }
    (it->kind == Finding::kNonFinite ? non_finite : spikes).push_back(std::move(*it));
    it = findings_.erase(it);
  }
  if (!non_finite.empty()) JudgeNonFinite(t, std::move(non_finite), now_ns, out);
  if (!spikes.empty()) JudgeSpikes(t, spikes, now_ns, out);
  for (auto it = comparisons_.begin(); it != comparisons_.end();) {
    if (it->second.seen_ns == 0) it->second.seen_ns = now_ns;
    if (!Settled(t, std::get<2>(it->first), it->second.seen_ns, now_ns)) {
      ++it;
      continue;
    }
    if (GroupIsLocal(t, std::get<1>(it->first))) {
      JudgeComparison(t, it->first, it->second, now_ns, out);
    } else if (exports_.size() < kMaxComparisons) {  // the group spans nodes: the round's leader judges it
      ValueReport v;
      v.scalar = std::get<0>(it->first);
      v.group = std::get<1>(it->first);
      v.step = std::get<2>(it->first);
      for (const auto& [rank, b] : it->second.bits) v.bits.emplace_back(t.GlobalRank(rank), b);
      exports_.push_back(std::move(v));
    }
    it = comparisons_.erase(it);
  }
}

void TrainingSignalDetector::JudgeNonFinite(const Timeline& t, std::vector<Finding> found, uint64_t now_ns,
                                            std::vector<Anomaly>* out) {
  if (non_finite_raised_) return;  // the launch's first is out: these are its consequences
  non_finite_raised_ = true;
  std::stable_sort(found.begin(), found.end(), [](const Finding& a, const Finding& b) { return a.step < b.step; });
  const uint64_t first = found.front().step;
  // A rank's own value (the loss) before one the all-reduce made every rank's (the gradient norm).
  bool own = false;
  for (const Finding& f : found)
    if (f.step == first && replicated_.count(f.scalar) == 0) own = true;
  std::set<int> culprits;
  std::map<std::string, std::set<int>> by_scalar;  // at the first step
  nlohmann::json values = nlohmann::json::array(), after = nlohmann::json::array();
  for (const Finding& f : found) {
    const int global = t.GlobalRank(f.rank);
    nlohmann::json item = f.evidence;
    item["rank"] = global;
    item["step"] = f.step;
    if (f.step != first) {
      if (after.size() < kMaxEvidenceValues) after.push_back(std::move(item));
      continue;
    }
    values.push_back(std::move(item));
    by_scalar[f.scalar].insert(global);
    if (!own || replicated_.count(f.scalar) == 0) culprits.insert(global);
  }
  Anomaly a;
  a.kind = "non_finite";
  a.ranks.assign(culprits.begin(), culprits.end());
  a.step = first;
  a.detected_ns = now_ns;
  a.evidence = {{"values", values}, {"later", after}, {"rank_own_value", own}};
  std::string clauses;
  for (const auto& [scalar, ranks] : by_scalar) {
    std::string what;
    for (const Finding& f : found)
      if (f.step == first && f.scalar == scalar) what = f.evidence["value"].get<std::string>();
    clauses += (clauses.empty() ? "" : "; ") + scalar + " is " + (what == "nan" ? "NaN" : what) + " on " +
               Ranks(std::vector<int>(ranks.begin(), ranks.end()));
  }
  a.message = "non-finite training signal" + StepSuffix(first) + ": " + clauses;
  if (!own && culprits.size() > 1)
    a.message += " (a value every rank shares after the all-reduce: the rank whose gradients went bad is not told)";
  out->push_back(std::move(a));
}

void TrainingSignalDetector::JudgeSpikes(const Timeline& t, const std::vector<Finding>& found, uint64_t now_ns,
                                         std::vector<Anomaly>* out) {
  std::map<std::pair<std::string, uint64_t>, std::vector<const Finding*>> groups;
  for (const Finding& f : found) groups[{f.scalar, f.step}].push_back(&f);
  for (const auto& [key, members] : groups) {
    Anomaly a;
    a.kind = "spike";
    a.step = key.second;
    a.detected_ns = now_ns;
    // A rank once, with its highest score (a series that rolled back may spike at a step again).
    auto score = [](const Finding* f) { return f->evidence["max_z"].get<double>(); };
    std::map<int, const Finding*> by_rank;
    for (const Finding* f : members) {
      const Finding*& kept = by_rank[t.GlobalRank(f->rank)];
      if (kept == nullptr || score(f) > score(kept)) kept = f;
    }
    const Finding* worst = members.front();
    nlohmann::json per_rank = nlohmann::json::object();
    for (const auto& [global, f] : by_rank) {
      a.ranks.push_back(global);
      per_rank[std::to_string(global)] = f->evidence;
      if (score(f) > score(worst)) worst = f;
    }
    a.evidence = worst->evidence;
    a.evidence["rank"] = t.GlobalRank(worst->rank);
    a.evidence["per_rank"] = std::move(per_rank);
    const nlohmann::json& e = worst->evidence;
    const size_t run = e["steps"].size();
    a.message = key.first + " spike" + StepSuffix(key.second) + " on " + Ranks(a.ranks) + ": " +
                Spell(e["values"][0].is_number() ? e["values"][0].get<double>() : kNaN) + " against a median of " +
                Spell(e["median"].get<double>()) + " over the last " + std::to_string(e["window"].get<size_t>()) +
                " values (robust z " + Fmt("%.1f", e["max_z"].get<double>()) + ", " + std::to_string(run) +
                (run == 1 ? " value" : " values in a row") + ")";
    out->push_back(std::move(a));
  }
}

void TrainingSignalDetector::JudgeComparison(const Timeline& t, const ComparisonKey& key, const Comparison& c,
                                             uint64_t now_ns, std::vector<Anomaly>* out) {
  const auto& [scalar, group, step] = key;
  std::map<int, uint64_t> bits;
  for (const auto& [rank, b] : c.bits) bits[t.GlobalRank(rank)] = b;
  if (std::optional<Anomaly> a = JudgeDisagreement(scalar, group, step, bits, config_.replica_group_size, now_ns,
                                                    &disagreeing_))
    out->push_back(std::move(*a));
}

bool TrainingSignalDetector::GroupIsLocal(const Timeline& t, int group) const {
  if (job_world_ <= 0) return true;
  const int size = config_.replica_group_size == 0 ? job_world_ : static_cast<int>(config_.replica_group_size);
  const int64_t first = static_cast<int64_t>(group) * size;
  const int64_t last = std::min<int64_t>(first + size, job_world_) - 1;
  return first >= t.GlobalRank(0) && last <= t.GlobalRank(world_ - 1);
}

std::vector<ValueReport> TrainingSignalDetector::TakeValueReports() {
  std::vector<ValueReport> out = std::move(exports_);
  exports_.clear();
  return out;
}

std::optional<Anomaly> JudgeDisagreement(const std::string& scalar, int group, uint64_t step,
                                         const std::map<int, uint64_t>& bits, uint32_t replica_group_size,
                                         uint64_t now_ns, std::set<std::pair<std::string, int>>* disagreeing) {
  if (bits.size() < 2) return std::nullopt;
  std::map<uint64_t, int> counts;
  for (const auto& [rank, b] : bits) ++counts[b];
  const std::pair<std::string, int> episode{scalar, group};
  if (counts.size() == 1) {
    disagreeing->erase(episode);
    return std::nullopt;
  }
  if (!disagreeing->insert(episode).second) return std::nullopt;
  const auto top = std::max_element(counts.begin(), counts.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
  const bool majority = 2 * static_cast<size_t>(top->second) > bits.size();
  auto value = [](uint64_t b) {
    double v;
    std::memcpy(&v, &b, sizeof(v));
    return v;
  };
  Anomaly a;
  a.kind = "disagreement";
  a.step = step;
  a.detected_ns = now_ns;
  nlohmann::json values = nlohmann::json::object(), hex = nlohmann::json::object();
  std::vector<int> agreeing;
  std::string differing;
  for (const auto& [global, b] : bits) {
    values[std::to_string(global)] = Value(value(b));
    hex[std::to_string(global)] = Hex(b);
    if (majority && b == top->first) {
      agreeing.push_back(global);
    } else {
      a.ranks.push_back(global);
      differing += (differing.empty() ? "" : ", ") + std::to_string(global) + ": " + Fmt("%.17g", value(b));
    }
  }
  const double majority_value = majority ? value(top->first) : kNaN;
  a.evidence = {{"scalar", scalar},
                {"group", group},
                {"replica_group_size", replica_group_size},
                {"values", values},
                {"bits", hex},
                {"majority", majority ? Value(majority_value) : nlohmann::json(nullptr)},
                {"ranks_compared", bits.size()}};
  if (majority) {
    a.message = scalar + " differs across the replicas of group " + std::to_string(group) + StepSuffix(step) + ": " +
                Ranks(a.ranks) + " (" + differing + ") against " + Fmt("%.17g", majority_value) + " on " +
                Ranks(agreeing) + "; the value is identical by construction";
  } else {
    a.message = scalar + " differs across the replicas of group " + std::to_string(group) + StepSuffix(step) + " (" +
                differing + ") with no majority to tell the odd one out; the value is identical by construction";
  }
  return a;
}

}  // namespace lifeline::agent
