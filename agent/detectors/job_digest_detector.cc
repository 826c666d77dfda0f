#include "agent/detectors/job_digest_detector.h"

#include <algorithm>

#include "agent/detectors/evidence.h"
#include "agent/detectors/replica_digest_detector.h"

namespace lifeline::agent {

using namespace detail;

namespace {

constexpr size_t kStepsRemembered = 8;       // (step, rank) folds taken: a repeat of these is ignored
constexpr size_t kMaxGroups = 1 << 16;       // waiting at once: beyond, the oldest is judged as it is
constexpr size_t kMaxGroupsInEvidence = 16;

}  // namespace

void JobDigestDetector::AddFold(const std::string& node, const DigestFold& fold, uint64_t now_ns) {
  if (!seen_.insert({fold.step, fold.rank}).second) return;  // sent again (a summary that stands alone)
  ++folds_;
  node_of_[fold.rank] = node;
  // Only the newest steps' folds are remembered as taken.
  if (seen_steps_.insert(fold.step).second && seen_steps_.size() > kStepsRemembered) {
    seen_steps_.erase(seen_steps_.begin());
    seen_.erase(seen_.begin(), seen_.lower_bound({*seen_steps_.begin(), INT32_MIN}));
  }
  const GroupKey key{fold.step, fold.keyset};
  if (groups_.size() >= kMaxGroups && !groups_.count(key)) {
    auto oldest = groups_.begin();
    Judge(oldest->first.first, std::move(oldest->second));
    groups_.erase(oldest);
  }
  Group& g = groups_[key];
  if (g.folds.empty()) {
    g.first_ns = now_ns;
    g.expect = fold.expect;
  }
  g.expect = std::min(g.expect, fold.expect);
  g.folds[fold.rank] = fold;
}

void JobDigestDetector::AddDetail(const DigestDetail& detail) {
  const auto v = verdicts_.find(detail.step);
  if (v == verdicts_.end() || !v->second.asked.count(detail.rank)) return;  // not asked (or answered late)
  details_[{detail.step, detail.rank}] = detail;
}

void JobDigestDetector::Judge(uint64_t step, Group g) {
  StepVerdict& v = verdicts_[step];
  if (g.folds.size() < 2) return;  // no other replica reported: nothing to compare it with
  ++v.groups;
  ++compared_;
  std::map<uint64_t, int> counts;
  for (const auto& [rank, f] : g.folds) {
    ++counts[f.digest];
    v.compared.insert(rank);
  }
  if (counts.size() == 1) return;
  const auto top = std::max_element(counts.begin(), counts.end(),
                                    [](const auto& a, const auto& b) { return a.second < b.second; });
  Odd odd;
  odd.majority = 2 * static_cast<size_t>(top->second) > g.folds.size();
  odd.keyset = g.folds.begin()->second.keyset;
  odd.shards = g.folds.begin()->second.shards;
  for (const auto& [rank, f] : g.folds) {
    odd.folds[rank] = f.digest;
    if (!odd.majority || f.digest != top->first) odd.named.push_back(rank);
    else if (odd.reference < 0) odd.reference = rank;
  }
  v.odd.push_back(std::move(odd));
}

void JobDigestDetector::Poll(uint64_t now_ns, std::vector<Anomaly>* out, std::vector<DigestQuery>* queries) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    const Group& g = it->second;
    if (g.folds.size() < g.expect && now_ns < g.first_ns + Nanos(hold_seconds_)) {
      ++it;
      continue;
    }
    Judge(it->first.first, std::move(it->second));
    it = groups_.erase(it);
  }
  for (auto it = verdicts_.begin(); it != verdicts_.end();) {
    const uint64_t step = it->first;
    StepVerdict& v = it->second;
    const auto open = groups_.lower_bound({step, 0});
    if (open != groups_.end() && open->first.first == step) {  // a group of the step still waiting
      ++it;
      continue;
    }
    if (v.odd.empty()) {
      it = verdicts_.erase(it);
      continue;
    }
    if (v.asked_ns == 0) {  // ask for the named ranks' digests shard by shard, and a reference's
      for (const Odd& o : v.odd) {
        v.asked.insert(o.named.begin(), o.named.end());
        if (o.reference >= 0) v.asked.insert(o.reference);
      }
      v.asked_ns = now_ns;
      queries->push_back({step, std::vector<int>(v.asked.begin(), v.asked.end())});
      ++it;
      continue;
    }
    const bool all_in = std::all_of(v.asked.begin(), v.asked.end(), [&](int r) { return details_.count({step, r}) > 0; });
    if (!all_in && now_ns < v.asked_ns + Nanos(detail_seconds_)) {
      ++it;
      continue;
    }
    Raise(step, v, now_ns, out);
    details_.erase(details_.lower_bound({step, INT32_MIN}), details_.lower_bound({step + 1, INT32_MIN}));
    it = verdicts_.erase(it);
  }
}

void JobDigestDetector::Raise(uint64_t step, StepVerdict& v, uint64_t now_ns, std::vector<Anomaly>* out) {
  std::set<int> named;
  std::set<int> missing;
  bool every_majority = true;
  std::map<uint64_t, ShardDifference> differences;  // by key
  uint64_t shards = 0;
  nlohmann::json groups = nlohmann::json::array();
  for (const Odd& o : v.odd) {
    named.insert(o.named.begin(), o.named.end());
    every_majority = every_majority && o.majority;
    shards += o.shards;
    if (groups.size() < kMaxGroupsInEvidence) {
      nlohmann::json folds = nlohmann::json::object();
      for (int r : o.named) folds[std::to_string(r)] = DigestHex(o.folds.at(r));
      if (o.reference >= 0) folds[std::to_string(o.reference)] = DigestHex(o.folds.at(o.reference));
      groups.push_back({{"keyset", DigestHex(o.keyset)}, {"replicas", o.folds.size()}, {"shards", o.shards},
                        {"ranks", o.named}, {"reference", o.reference >= 0 ? nlohmann::json(o.reference) : nlohmann::json(nullptr)},
                        {"folds", folds}});
    }
    // Shard by shard, from the details asked: against the reference's (a majority), else among
    // the named ranks' own copies.
    std::vector<int> with = o.named;
    if (o.reference >= 0) with.insert(with.begin(), o.reference);
    std::map<uint64_t, std::map<int, const ShardDigestEntry*>> by_key;
    for (int r : with) {
      const auto d = details_.find({step, r});
      if (d == details_.end()) {
        missing.insert(r);
        continue;
      }
      for (const ShardDigestEntry& e : d->second.shards) by_key[e.key][r] = &e;
    }
    if (o.reference >= 0 && missing.count(o.reference)) continue;  // nothing to tell the majority's by
    for (const auto& [key, copies] : by_key) {
      const ShardDigestEntry* ref = o.reference >= 0 && copies.count(o.reference) ? copies.at(o.reference) : nullptr;
      const ShardDigestEntry& any = *copies.begin()->second;
      ShardDifference x;
      x.tensor = any.name.empty() ? "shard key " + DigestHex(key) : PrintableName(any.name);
      x.key = key;
      x.replicas = any.replicas;
      x.bytes = any.bytes;
      x.tensor_offset = any.tensor_offset;
      for (const auto& [r, e] : copies) x.digests[r] = e->digest;
      if (ref != nullptr) {
        x.majority = ref->digest;
        for (const auto& [r, e] : copies)
          if (e->digest != ref->digest) x.ranks.push_back(r);
      } else {
        const uint64_t first = any.digest;
        if (std::all_of(copies.begin(), copies.end(), [&](const auto& kv) { return kv.second->digest == first; })) continue;
        for (const auto& [r, e] : copies) x.ranks.push_back(r);
      }
      if (x.ranks.empty()) continue;
      auto [it, fresh] = differences.try_emplace(key, std::move(x));
      if (!fresh) {  // the same shard in two groups (cannot be, keysets differ), merged
        it->second.digests.insert(x.digests.begin(), x.digests.end());
        it->second.ranks.insert(it->second.ranks.end(), x.ranks.begin(), x.ranks.end());
      }
    }
  }
  std::vector<ShardDifference> list;
  for (auto& [key, x] : differences) list.push_back(std::move(x));
  Anomaly a = SdcSuspectAnomaly(step, list, shards, v.compared, now_ns, every_majority);
  a.ranks.assign(named.begin(), named.end());  // the folds named them, with or without their details
  nlohmann::json nodes = nlohmann::json::object();
  for (int r : named) nodes[std::to_string(r)] = node_of_.count(r) ? node_of_.at(r) : "";
  a.evidence["compared_by"] = "leader";
  a.evidence["nodes"] = nodes;
  a.evidence["groups"] = groups;
  a.evidence["groups_compared"] = v.groups;
  if (!missing.empty()) {
    std::set<std::string> from;
    for (int r : missing) from.insert(node_of_.count(r) ? node_of_.at(r) : "?");
    std::string list_nodes;
    for (const std::string& n : from) list_nodes += (list_nodes.empty() ? "" : ", ") + n;
    a.evidence["details_missing"] = std::vector<int>(missing.begin(), missing.end());
    a.message += " (which tensors is not known: the shard digests of " + Ranks(std::vector<int>(missing.begin(), missing.end())) +
                 " did not come from node " + list_nodes + " within " + Duration(detail_seconds_) + ")";
  }
  out->push_back(std::move(a));
}

}  // namespace lifeline::agent
