#include "agent/time_ledger.h"

#include <algorithm>

namespace lifeline::agent {
namespace {

double Seconds(uint64_t later, uint64_t earlier) { return later > earlier ? (later - earlier) / 1e9 : 0.0; }

}  // namespace

nlohmann::json RestartCost::ToJson() const {
  nlohmann::json j = {{"action", "time_lost"},
                      {"cause", cause},
                      {"ranks", ranks},
                      {"seconds", total_seconds()},
                      {"detection_seconds", detection_seconds},
                      {"stop_seconds", stop_seconds},
                      {"backoff_seconds", backoff_seconds},
                      {"relaunch_seconds", relaunch_seconds},
                      {"load_seconds", load_seconds},
                      {"redo_seconds", redo_seconds},
                      {"steps_redone", steps_redone}};
  if (!node.empty()) j["node"] = node;
  j["interrupted_step"] = interrupted_step == trace::kNoStep ? nlohmann::json(nullptr) : nlohmann::json(interrupted_step);
  j["resumed_step"] = resumed_step == trace::kNoStep ? nlohmann::json(nullptr) : nlohmann::json(resumed_step);
  return j;
}

double TimeLedger::LaunchSpanSeconds() const {
  return first_begin_ns_ == 0 ? 0.0 : Seconds(last_end_ns_, first_begin_ns_);
}

void TimeLedger::Launched(int world, uint64_t now_ns) {
  if (first_launch_ns_ == 0) first_launch_ns_ = now_ns;
  closed_span_seconds_ += LaunchSpanSeconds();
  launched_ns_ = now_ns;
  world_ = world;
  first_begin_ns_ = last_end_ns_ = 0;
  span_frozen_ = false;
  max_step_ = trace::kNoStep;
  max_step_begin_ns_ = 0;
  steps_ended_ = 0;
  began_.assign(static_cast<size_t>(std::max(world, 0)), false);
  began_count_ = 0;
  first_step_ = trace::kNoStep;
  earliest_load_start_ns_ = latest_load_end_ns_ = earliest_begin_ns_ = 0;
}

void TimeLedger::Observe(int rank, const trace::Event& e) {
  if (rank < 0 || rank >= world_) return;
  switch (e.type) {
    case trace::EventType::kStepBegin: {
      if (span_frozen_) break;
      if (first_begin_ns_ == 0 || e.time_ns < first_begin_ns_) first_begin_ns_ = e.time_ns;
      if (max_step_ == trace::kNoStep || e.step > max_step_) {
        max_step_ = e.step;
        max_step_begin_ns_ = e.time_ns;
      }
      if (!began_[static_cast<size_t>(rank)]) {
        began_[static_cast<size_t>(rank)] = true;
        ++began_count_;
        if (first_step_ == trace::kNoStep || e.step < first_step_) first_step_ = e.step;
        if (earliest_begin_ns_ == 0 || e.time_ns < earliest_begin_ns_) earliest_begin_ns_ = e.time_ns;
      }
      break;
    }
    case trace::EventType::kStepEnd:
      if (!span_frozen_) last_end_ns_ = std::max(last_end_ns_, e.time_ns);
      if (rank == 0) ++steps_ended_;
      break;
    case trace::EventType::kProcessStart:
      if (e.duration_ns > 0 && e.duration_ns <= e.time_ns) {
        const uint64_t start = e.time_ns - e.duration_ns;
        if (earliest_load_start_ns_ == 0 || start < earliest_load_start_ns_) earliest_load_start_ns_ = start;
        latest_load_end_ns_ = std::max(latest_load_end_ns_, e.time_ns);
      }
      break;
    default:
      break;
  }
}

void TimeLedger::Fault(const std::string& cause, const std::vector<int>& ranks, const std::string& node,
                       uint64_t fault_ns, uint64_t decided_ns) {
  // A fault during another restart's relaunch (before its ranks all stepped): that restart's cost
  // runs on under the first cause; the relaunch it paid for was lost with it.
  if (pending_) return;
  Pending p;
  p.cost.cause = cause;
  p.cost.ranks = ranks;
  p.cost.node = node;
  p.decided_ns = std::max(decided_ns, launched_ns_);
  p.fault_ns = std::min(std::max(fault_ns, launched_ns_), p.decided_ns);
  p.cost.detection_seconds = Seconds(p.decided_ns, p.fault_ns);
  p.cost.interrupted_step = max_step_;
  // Steps this launch completed that the relaunch computes again are priced at its mean step
  // time; the interrupted step's part is known to the nanosecond.
  p.step_price_seconds = steps_ended_ > 0 ? LaunchSpanSeconds() / static_cast<double>(steps_ended_) : 0.0;
  if (max_step_begin_ns_ != 0) p.interrupted_part_seconds = Seconds(p.fault_ns, max_step_begin_ns_);
  // The stepping span ends at the fault (the interrupted step's part counts as stepped, and as
  // redone): what the ranks did after it was not training.
  if (first_begin_ns_ != 0) last_end_ns_ = std::max(last_end_ns_, p.fault_ns);
  span_frozen_ = true;
  pending_ = p;
}

void TimeLedger::Stopped(uint64_t now_ns, double backoff_seconds) {
  if (!pending_ || pending_->stopped) return;
  pending_->stopped = true;
  pending_->stopped_ns = std::max(now_ns, pending_->decided_ns);
  pending_->cost.stop_seconds = Seconds(pending_->stopped_ns, pending_->decided_ns);
  pending_->cost.backoff_seconds = backoff_seconds;
}

std::optional<RestartCost> TimeLedger::Settle() {
  if (!pending_ || world_ <= 0 || began_count_ < world_ || launched_ns_ <= pending_->decided_ns) return std::nullopt;
  Pending p = std::move(*pending_);
  pending_.reset();
  RestartCost c = std::move(p.cost);
  if (!p.stopped) {  // stopped without being told (another node's round): all of it was stopping
    p.stopped_ns = launched_ns_;
    c.stop_seconds = Seconds(launched_ns_, p.decided_ns);
  }
  // The relaunch began when the back-off ended; the ranks' load began where they say it did.
  const uint64_t relaunch_ns = std::min(launched_ns_, p.stopped_ns + static_cast<uint64_t>(c.backoff_seconds * 1e9));
  if (earliest_load_start_ns_ != 0 && latest_load_end_ns_ >= earliest_load_start_ns_) {
    c.relaunch_seconds = Seconds(earliest_load_start_ns_, relaunch_ns);
    c.load_seconds = Seconds(latest_load_end_ns_, earliest_load_start_ns_);
    c.relaunch_seconds += Seconds(earliest_begin_ns_, latest_load_end_ns_);  // process groups after the load
  } else {
    c.relaunch_seconds = Seconds(earliest_begin_ns_, relaunch_ns);
  }
  c.resumed_step = first_step_;
  if (c.interrupted_step != trace::kNoStep && first_step_ != trace::kNoStep && c.interrupted_step >= first_step_) {
    c.steps_redone = c.interrupted_step - first_step_;
    c.redo_seconds = static_cast<double>(c.steps_redone) * p.step_price_seconds + p.interrupted_part_seconds;
  } else {
    c.redo_seconds = p.interrupted_part_seconds;
  }
  redo_seconds_ += c.redo_seconds;
  settled_.push_back(c);
  return c;
}

double TimeLedger::wall_seconds(uint64_t now_ns) const { return first_launch_ns_ == 0 ? 0.0 : Seconds(now_ns, first_launch_ns_); }

double TimeLedger::productive_seconds() const {
  return std::max(0.0, closed_span_seconds_ + LaunchSpanSeconds() - redo_seconds_);
}

double TimeLedger::ettr(uint64_t now_ns) const {
  const double wall = wall_seconds(now_ns);
  return wall <= 0 ? 1.0 : std::min(1.0, productive_seconds() / wall);
}

double TimeLedger::lost_seconds(const std::string& phase) const {
  double total = 0;
  for (const RestartCost& c : settled_) {
    if (phase == "detection") total += c.detection_seconds;
    if (phase == "stop") total += c.stop_seconds;
    if (phase == "backoff") total += c.backoff_seconds;
    if (phase == "relaunch") total += c.relaunch_seconds;
    if (phase == "load") total += c.load_seconds;
    if (phase == "redo") total += c.redo_seconds;
  }
  return total;
}

uint64_t TimeLedger::steps_redone() const {
  uint64_t n = 0;
  for (const RestartCost& c : settled_) n += c.steps_redone;
  return n;
}

}  // namespace lifeline::agent
