#include "agent/rollback.h"

#include <algorithm>

namespace lifeline::agent {

std::string FormatStepRanges(const std::vector<StepRange>& ranges) {
  std::string out;
  for (const StepRange& r : ranges) {
    if (!out.empty()) out += ",";
    out += std::to_string(r.first);
    if (r.last != r.first) out += "-" + std::to_string(r.last);
  }
  return out;
}

RollbackPoint ChooseRollbackPoint(const std::vector<ResumableStep>& listing, uint64_t anomaly_step) {
  RollbackPoint point;
  std::vector<uint64_t> after;
  for (const ResumableStep& s : listing) {
    if (s.step >= anomaly_step) {
      after.push_back(s.step);
      continue;
    }
    const bool newer = !point.step || s.step > *point.step;
    if (newer || (s.step == *point.step && s.location == "memory")) {
      point.step = s.step;
      point.location = s.location;
    }
  }
  std::sort(after.begin(), after.end(), std::greater<>());
  after.erase(std::unique(after.begin(), after.end()), after.end());
  point.passed_over = after;
  const std::string at = "step " + std::to_string(anomaly_step);
  if (point.step) {
    point.why = "the newest complete checkpoint before " + at + " (its update applied, the fault's not yet)";
  } else {
    point.why = "no complete checkpoint before " + at + ": the ranks start from scratch";
  }
  if (!after.empty()) {
    std::string list;
    for (uint64_t s : after) list += (list.empty() ? "" : ", ") + std::to_string(s);
    point.why += "; passed over step" + std::string(after.size() > 1 ? "s " : " ") + list +
                 ", saved at or after the fault, which may hold its damage";
  }
  return point;
}

std::optional<uint64_t> AnomalyLastStep(const Anomaly& a) {
  std::optional<uint64_t> last = a.step;
  const auto steps = a.evidence.find("steps");
  if (steps != a.evidence.end() && steps->is_array())
    for (const nlohmann::json& s : *steps)
      if (s.is_number_unsigned() && (!last || s.get<uint64_t>() > *last)) last = s.get<uint64_t>();
  return last;
}

uint64_t RollbackDecision::steps_rolled_back() const {
  const uint64_t from = point.step ? *point.step + 1 : 0;
  return reached_step >= from ? reached_step - from + 1 : 0;
}

nlohmann::json RollbackDecision::Record(const Anomaly& anomaly) const {
  nlohmann::json line = {{"action", give_up.empty() ? "rollback" : "rollback_give_up"},
                         {"anomaly", anomaly.kind},
                         {"ranks", anomaly.ranks},
                         {"anomaly_step", anomaly_step},
                         {"reached_step", reached_step},
                         {"checkpoint", point.step ? nlohmann::json(*point.step) : nlohmann::json(nullptr)},
                         {"location", point.location},
                         {"why", point.why},
                         {"passed_over", point.passed_over},
                         {"steps_rolled_back", steps_rolled_back()},
                         {"repeat", repeat},
                         {"message", anomaly.message}};
  // The evidence with the decision (an sdc_suspect's tensors, byte ranges and digests; a spike's
  // values), so that one line says what was seen and what was done.
  if (!anomaly.evidence.is_null()) line["evidence"] = anomaly.evidence;
  if (!nodes.empty()) line["nodes"] = nodes;
  if (sdc_on_node > 0) line["sdc_on_node"] = sdc_on_node;
  if (!node_out.empty()) line["node_out"] = node_out;
  line["skipped"] = skipped ? nlohmann::json(FormatStepRanges({*skipped})) : nlohmann::json(nullptr);
  line["skip_steps"] = FormatStepRanges(skip);
  if (!give_up.empty()) line["reason"] = give_up;
  return line;
}

RollbackDecision RollbackLedger::Decide(const Anomaly& anomaly, uint64_t reached_step,
                                        const std::vector<ResumableStep>& listing) {
  RollbackDecision d;
  d.anomaly_step = anomaly.step.value_or(0);
  d.reached_step = std::max(reached_step, AnomalyLastStep(anomaly).value_or(0));
  const bool sdc = anomaly.kind == "sdc_suspect";
  d.point = ChooseRollbackPoint(listing, d.anomaly_step);
  if (!sdc && d.point.step && d.anomaly_step <= *d.point.step + 1 &&
      to_checkpoint_.count(static_cast<int64_t>(*d.point.step)) != 0) {
    // The fault came back at the first step after a relaunch from this checkpoint: the checkpoint
    // holds the damage (an update or optimizer state gone bad in the step it saved shows only in
    // the next step's values), and replaying it, or skipping data after it, cannot help. The
    // checkpoint before it is the rollback's, its data not skipped.
    const uint64_t damaged = *d.point.step;
    d.point = ChooseRollbackPoint(listing, damaged);
    d.point.why += "; step " + std::to_string(damaged) + " is passed over too: the fault came back at the first step "
                   "after resuming from it, so it holds the damage";
  }
  const int64_t key = d.point.step ? static_cast<int64_t>(*d.point.step) : -1;
  d.repeat = to_checkpoint_[key];
  const std::string where = d.point.step ? "step " + std::to_string(*d.point.step) : std::string("scratch");
  if (d.repeat >= config_.max_per_checkpoint) {
    d.give_up = anomaly.kind + " at step " + std::to_string(d.anomaly_step) + " again after " +
                std::to_string(d.repeat) + " rollback" + (d.repeat > 1 ? "s" : "") + " to " + where +
                (sdc ? ": the replicas diverge again from the same state (nondeterminism in the script, or "
                       "corruption on more than one machine), a relaunch cannot help"
                     : ": the data or the model is at fault deterministically, a relaunch cannot help");
    if (sdc) {
      // Its data was never skipped: nothing to say about skipping.
    } else if (config_.skip_data == RollbackConfig::SkipData::kNever) {
      d.give_up += " (rollback.skip_data: on_repeat would skip the steps' data)";
    } else {
      d.give_up += " (the relaunches were told to skip steps " + FormatStepRanges(SkipAfter(d.point.step)) +
                   ": does the script skip them? lifeline.skip_steps(), docs/reliability.md)";
    }
    d.skip = SkipAfter(d.point.step);
    return d;
  }
  // A corrupted replica is the machine's fault: the steps' data is sound, and trained again.
  const bool skip = !sdc && (config_.skip_data == RollbackConfig::SkipData::kAlways ||
                             (config_.skip_data == RollbackConfig::SkipData::kOnRepeat && d.repeat > 0));
  if (skip) {
    // Every step rolled back, from the one after the checkpoint to the newest the ranks reached:
    // the batch at fault is not always the one whose value shows it (a bad update from an
    // ordinary-looking batch shows in the next loss; bad data runs on past the first value judged,
    // and a relaunch's detectors warm up again before they judge), and these are the steps whose
    // training is thrown away anyway: a checkpoint interval and the detection's latency.
    const uint64_t first = d.point.step ? *d.point.step + 1 : 0;
    const uint64_t last = std::max(first, d.reached_step);
    d.skipped = StepRange{first, last};
    if (std::find(skip_.begin(), skip_.end(), *d.skipped) == skip_.end()) skip_.push_back(*d.skipped);
  }
  d.skip = SkipAfter(d.point.step);
  ++to_checkpoint_[key];
  ++rollbacks_;
  return d;
}

void RollbackLedger::Adopt(const std::vector<StepRange>& ranges) {
  for (const StepRange& r : ranges) {
    if (r.last < r.first) continue;
    if (std::find(skip_.begin(), skip_.end(), r) == skip_.end()) skip_.push_back(r);
  }
}

std::vector<StepRange> RollbackLedger::SkipAfter(std::optional<uint64_t> resume_step) const {
  std::vector<StepRange> out;
  for (const StepRange& r : skip_) {
    if (resume_step && r.last <= *resume_step) continue;  // already behind the resumed state
    StepRange clipped = r;
    if (resume_step) clipped.first = std::max(r.first, *resume_step + 1);
    out.push_back(clipped);
  }
  std::sort(out.begin(), out.end(), [](const StepRange& a, const StepRange& b) { return a.first < b.first; });
  // Merge overlaps: the ranks read a plain list.
  std::vector<StepRange> merged;
  for (const StepRange& r : out) {
    if (!merged.empty() && r.first <= merged.back().last + 1) {
      merged.back().last = std::max(merged.back().last, r.last);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

}  // namespace lifeline::agent
