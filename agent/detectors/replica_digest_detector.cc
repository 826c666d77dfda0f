#include "agent/detectors/replica_digest_detector.h"

#include <algorithm>
#include <cstdio>
#include <climits>
#include <set>

#include <xxhash.h>

#include "agent/detectors/evidence.h"

namespace lifeline::agent {

using namespace detail;
using trace::EventType;

namespace {

// The other cause of replicas that differ: a script that updates its state before a lazy snapshot
// of it is complete writes a torn copy, unlike the other replicas' torn copies.
constexpr const char* kTornHint = "a script must not update its state before the snapshot is taken: "
                                  "lifeline.guard_optimizer, or wait_snapshot() before the update";

// Bounds on what waits: ranks reporting many shards while a replica stays silent must not grow the
// agent without end (the oldest are judged with what they have).
constexpr size_t kMaxPending = 1 << 16;
constexpr size_t kMaxNames = 1 << 16;
constexpr size_t kMaxTensorsInEvidence = 16;

}  // namespace

std::string DigestHex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string PrintableName(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

void ReplicaDigestDetector::Reset(int world) {
  world_ = std::max(world, 0);
  parts_.assign(static_cast<size_t>(world_), {});
  // Names are the shards' (a key hashes the name): they stay true across launches.
  comparisons_.clear();
  snapshots_.clear();
  kept_steps_.clear();
  verdicts_.clear();
  waiting_.clear();
  unseen_.clear();
  complete_.clear();
  deadlines_.clear();
}

void ReplicaDigestDetector::Observe(const Timeline& t, const TimelineChange& c) {
  if (c.rank < 0 || c.rank >= world_) return;
  const trace::Event& e = *c.event;
  if (e.type == EventType::kReplicaName) {
    Result<trace::ReplicaNamePart> part = trace::DecodeReplicaNamePart(e);
    if (!part.ok()) return;
    auto& pending = parts_[c.rank];
    if (pending.size() >= kMaxNames) pending.erase(pending.begin());
    std::vector<std::string>& got = pending[part->key];
    if (got.size() != part->parts) got.assign(part->parts, std::string());
    got[part->part] = std::move(part->bytes);
    std::string name;
    for (const std::string& p : got) {
      if (p.empty()) return;  // parts still missing
      name += p;
    }
    if (names_.size() >= kMaxNames && !names_.count(part->key)) names_.erase(names_.begin());
    names_[part->key] = std::move(name);
    pending.erase(part->key);
    return;
  }
  if (e.type != EventType::kReplicaDigest || e.step == trace::kNoStep || e.comm < 2) return;
  ++digests_;
  if (folding_) {
    Keep(c.rank, e);
    return;
  }
  if (comparisons_.size() >= kMaxPending && !comparisons_.count({e.step, e.seq}))
    JudgeAndErase(t, comparisons_.begin());
  const auto [it, created] = comparisons_.try_emplace(StepKey{e.step, e.seq});
  Comparison& cmp = it->second;
  if (created) {
    cmp.id = ++next_id_;
    unseen_.push_back(it->first);
    ++waiting_[e.step];
  }
  cmp.replica_count = e.comm;
  cmp.bytes = e.bytes;
  cmp.tensor_offset = e.duration_ns;
  const size_t before = cmp.digests.size();
  cmp.digests[c.rank] = e.aux;
  if (cmp.digests.size() != before && cmp.digests.size() >= cmp.replica_count) complete_.push_back(it->first);
}

void ReplicaDigestDetector::JudgeAndErase(const Timeline& t, std::map<StepKey, Comparison>::iterator it) {
  const auto w = waiting_.find(it->first.first);
  if (w != waiting_.end() && --w->second == 0) waiting_.erase(w);
  Judge(t, it->first.first, it->first.second, std::move(it->second));
  comparisons_.erase(it);
}

void ReplicaDigestDetector::Judge(const Timeline& t, uint64_t step, uint64_t key, Comparison c) {
  StepVerdict& v = verdicts_[step];
  if (c.digests.size() < 2) return;  // nothing to compare it with here
  ++v.shards;
  ++compared_;
  const uint64_t first = c.digests.begin()->second;
  const bool same = std::all_of(c.digests.begin(), c.digests.end(), [&](const auto& kv) { return kv.second == first; });
  if (!same) v.differences.push_back({key, std::move(c)});
}

void ReplicaDigestDetector::Poll(const Timeline& t, uint64_t now_ns, std::vector<Anomaly>* out) {
  if (comparisons_.empty() && verdicts_.empty()) return;
  for (const StepKey& key : unseen_) {
    const auto it = comparisons_.find(key);
    if (it == comparisons_.end() || it->second.seen_ns != 0) continue;
    it->second.seen_ns = now_ns;
    deadlines_.push_back({now_ns + Nanos(hold_seconds_), key, it->second.id});
  }
  unseen_.clear();
  // What may be judged now: every replica in, or the hold over; in (step, key) order.
  std::vector<StepKey> due = std::move(complete_);
  complete_.clear();
  while (!deadlines_.empty() && deadlines_.front().at_ns <= now_ns) {
    const Deadline& d = deadlines_.front();
    const auto it = comparisons_.find(d.key);
    if (it != comparisons_.end() && it->second.id == d.id) due.push_back(d.key);
    deadlines_.pop_front();
  }
  std::sort(due.begin(), due.end());
  due.erase(std::unique(due.begin(), due.end()), due.end());
  for (const StepKey& key : due) {
    const auto it = comparisons_.find(key);
    if (it == comparisons_.end()) continue;
    const Comparison& c = it->second;
    const bool all_in = c.digests.size() >= c.replica_count;
    if (!all_in && (c.seen_ns == 0 || now_ns < c.seen_ns + Nanos(hold_seconds_))) continue;
    JudgeAndErase(t, it);
  }
  for (auto it = verdicts_.begin(); it != verdicts_.end();) {
    if (waiting_.count(it->first)) {  // a shard of the step still waiting
      ++it;
      continue;
    }
    if (!it->second.differences.empty()) Raise(t, it->first, it->second, now_ns, out);
    it = verdicts_.erase(it);
  }
}

void ReplicaDigestDetector::Keep(int rank, const trace::Event& e) {
  if (snapshots_.size() >= kMaxPending && !snapshots_.count({e.step, rank})) return;  // a flood: folds stay off
  const auto [at, created] = snapshots_.try_emplace({e.step, rank});
  RankSnapshot& s = at->second;
  if (s.folded) return;  // a late digest of a snapshot folded already: the fold stands
  ShardDigestEntry& entry = s.shards[e.seq];
  entry.key = e.seq;
  entry.digest = e.aux;
  entry.replicas = e.comm;
  entry.bytes = e.bytes;
  entry.tensor_offset = e.duration_ns;
  s.newest_ns = std::max(s.newest_ns, e.time_ns);
  uint64_t& newest = kept_steps_[e.step];
  newest = std::max(newest, e.time_ns);
  if (!created) return;
  // The snapshots of the last kKeptSeconds stay for the leader's questions (at most kKeptSnapshots
  // steps of them; the newest always).
  while (kept_steps_.size() > 1 &&
         (kept_steps_.size() > kKeptSnapshots || kept_steps_.begin()->second + Nanos(kKeptSeconds) < e.time_ns))
    kept_steps_.erase(kept_steps_.begin());
  snapshots_.erase(snapshots_.begin(), snapshots_.lower_bound({kept_steps_.begin()->first, INT32_MIN}));
}

std::vector<DigestFold> ReplicaDigestDetector::TakeFolds(const Timeline& t, uint64_t now_ns) {
  std::vector<DigestFold> out;
  std::map<int, uint64_t> newest_step;  // by local rank
  for (const auto& [key, s] : snapshots_) newest_step[key.second] = std::max(newest_step[key.second], key.first);
  for (auto& [key, s] : snapshots_) {
    if (s.folded || s.shards.empty()) continue;
    const bool later = newest_step[key.second] > key.first;
    if (!later && now_ns < s.newest_ns + Nanos(kFoldQuietSeconds)) continue;
    s.folded = true;
    // Two hashes of the shards in key order: which they are, and the copy's bytes.
    std::vector<uint64_t> which, bytes;
    DigestFold f;
    f.rank = t.GlobalRank(key.second);
    f.step = key.first;
    f.expect = UINT32_MAX;
    for (const auto& [k, e] : s.shards) {
      which.insert(which.end(), {k, e.replicas, e.bytes, e.tensor_offset});
      bytes.insert(bytes.end(), {k, e.digest});
      f.expect = std::min(f.expect, e.replicas);
    }
    f.keyset = XXH3_64bits(which.data(), which.size() * sizeof(uint64_t));
    f.digest = XXH3_64bits(bytes.data(), bytes.size() * sizeof(uint64_t));
    f.shards = static_cast<uint32_t>(std::min<size_t>(s.shards.size(), UINT32_MAX));
    out.push_back(f);
  }
  return out;
}

std::optional<DigestDetail> ReplicaDigestDetector::Detail(const Timeline& t, int global, uint64_t step) const {
  const int rank = global - t.GlobalRank(0);
  const auto it = snapshots_.find({step, rank});
  if (rank < 0 || rank >= world_ || it == snapshots_.end()) return std::nullopt;
  DigestDetail d;
  d.rank = global;
  d.step = step;
  for (const auto& [k, e] : it->second.shards) {
    d.shards.push_back(e);
    const auto name = names_.find(k);
    if (name != names_.end()) d.shards.back().name = name->second;
  }
  return d;
}

std::string ReplicaDigestDetector::NameOf(uint64_t key) const {
  const auto it = names_.find(key);
  return it != names_.end() ? PrintableName(it->second) : "shard key " + DigestHex(key);
}

void ReplicaDigestDetector::Raise(const Timeline& t, uint64_t step, const StepVerdict& v, uint64_t now_ns,
                                  std::vector<Anomaly>* out) {
  std::set<int> compared;  // global ranks
  std::vector<ShardDifference> differences;
  for (const Difference& d : v.differences) {
    const Comparison& c = d.comparison;
    std::map<uint64_t, int> counts;
    for (const auto& [rank, digest] : c.digests) ++counts[digest];
    const auto top = std::max_element(counts.begin(), counts.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
    const bool majority = 2 * static_cast<size_t>(top->second) > c.digests.size();
    ShardDifference x;
    x.tensor = NameOf(d.key);
    x.key = d.key;
    x.replicas = c.replica_count;
    x.bytes = c.bytes;
    x.tensor_offset = c.tensor_offset;
    if (majority) x.majority = top->first;
    for (const auto& [rank, digest] : c.digests) {
      const int global = t.GlobalRank(rank);
      compared.insert(global);
      x.digests[global] = digest;
      if (!majority || digest != top->first) x.ranks.push_back(global);
    }
    differences.push_back(std::move(x));
  }
  out->push_back(SdcSuspectAnomaly(step, differences, v.shards, compared, now_ns));
}

Anomaly SdcSuspectAnomaly(uint64_t step, const std::vector<ShardDifference>& differences, uint64_t shards_compared,
                          const std::set<int>& ranks_compared, uint64_t now_ns, std::optional<bool> majority) {
  std::set<int> named;
  bool every_majority = true;
  nlohmann::json tensors = nlohmann::json::array();
  for (const ShardDifference& x : differences) {
    every_majority = every_majority && x.majority.has_value();
    named.insert(x.ranks.begin(), x.ranks.end());
    nlohmann::json digests = nlohmann::json::object();
    for (const auto& [rank, digest] : x.digests) digests[std::to_string(rank)] = DigestHex(digest);
    const bool in_tensor = x.tensor_offset != trace::kNoOffset;
    const uint64_t begin = in_tensor ? x.tensor_offset : 0;
    if (tensors.size() < kMaxTensorsInEvidence)
      tensors.push_back({{"tensor", x.tensor},
                         {"key", DigestHex(x.key)},
                         {"byte_range", {begin, begin + x.bytes}},
                         {"range_of", in_tensor ? "tensor" : "shard"},
                         {"replicas", x.replicas},
                         {"digests", digests},
                         {"majority", x.majority ? nlohmann::json(DigestHex(*x.majority)) : nlohmann::json(nullptr)},
                         {"ranks", x.ranks}});
  }
  if (majority) every_majority = *majority;
  Anomaly a;
  a.kind = "sdc_suspect";
  a.ranks.assign(named.begin(), named.end());
  a.step = step;
  a.detected_ns = now_ns;
  a.evidence = {{"tensors", tensors},
                {"tensors_differing", differences.size()},
                {"shards_compared", shards_compared},
                {"ranks_compared", std::vector<int>(ranks_compared.begin(), ranks_compared.end())},
                {"majority", every_majority}};
  const size_t more = differences.empty() ? 0 : differences.size() - 1;
  const std::string what = differences.empty() ? std::string("its replicated shards")
                           : "'" + differences.front().tensor + "'" +
                                 (more ? " and " + std::to_string(more) + " more tensor" + (more > 1 ? "s" : "") : "");
  if (every_majority) {
    a.message = "replicas differ" + StepSuffix(step) + ": " + Ranks(a.ranks) + (a.ranks.size() == 1 ? " holds" : " hold") +
                " a copy of " + what + " unlike the other replicas' (silent data corruption suspected, or state "
                "changed while its snapshot was taken: " + kTornHint + "); the step is marked suspect and never "
                "resumed from";
  } else {
    a.message = "replicas differ" + StepSuffix(step) + " in " + what + " with no majority to tell the odd one out (" +
                Ranks(a.ranks) + "); silent data corruption suspected on one of them (or state changed while its "
                "snapshot was taken: " + kTornHint + "); the step is marked suspect and never resumed from";
  }
  return a;
}

}  // namespace lifeline::agent
