#include "agent/detectors/job_signal_detector.h"

#include <algorithm>

#include "agent/detectors/evidence.h"
#include "agent/detectors/training_signal_detector.h"

namespace lifeline::agent {

namespace {

constexpr size_t kMaxPendingValues = 1 << 16;  // beyond, the oldest is judged with what it has
constexpr size_t kJudgedValuesKept = 1 << 16;

}  // namespace

size_t JobSignalDetector::GroupSize(int group) const {
  if (config_.replica_group_size == 0) return static_cast<size_t>(std::max(world_, 0));
  const int64_t first = static_cast<int64_t>(group) * config_.replica_group_size;
  return static_cast<size_t>(std::clamp<int64_t>(world_ - first, 0, config_.replica_group_size));
}

void JobSignalDetector::Add(const ValueReport& v, uint64_t now_ns) {
  const Key key{v.scalar, v.group, v.step};
  if (judged_.count(key)) return;  // sent again after its verdict (a summary that stands alone)
  if (pending_.size() >= kMaxPendingValues && !pending_.count(key)) pending_.erase(pending_.begin());
  Pending& p = pending_[key];
  if (p.bits.empty()) p.first_ns = now_ns;
  for (const auto& [rank, bits] : v.bits) p.bits[rank] = bits;
}

void JobSignalDetector::Poll(uint64_t now_ns, std::vector<Anomaly>* out) {
  // In (scalar, group, step) order: a group's episodes follow its steps.
  for (auto it = pending_.begin(); it != pending_.end();) {
    const auto& [scalar, group, step] = it->first;
    const Pending& p = it->second;
    if (p.bits.size() < GroupSize(group) && now_ns < p.first_ns + detail::Nanos(hold_seconds_)) {
      ++it;
      continue;
    }
    ++compared_;
    if (std::optional<Anomaly> a =
            JudgeDisagreement(scalar, group, step, p.bits, config_.replica_group_size, now_ns, &disagreeing_)) {
      a->evidence["compared_by"] = "leader";
      out->push_back(std::move(*a));
    }
    if (judged_.size() >= kJudgedValuesKept) judged_.erase(judged_.begin());
    judged_.insert(it->first);
    it = pending_.erase(it);
  }
}

}  // namespace lifeline::agent
