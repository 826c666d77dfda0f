#include "agent/replication/replicator.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/internal/tier_replica.h"

namespace lifeline::replication {
namespace {

// The newest step in `snapshots` (newest first) for which every rank of [first, first + n) of one
// attempt is there: those snapshots, by rank.
std::vector<TierSnapshot> NewestWhole(const std::vector<TierSnapshot>& snapshots, uint32_t first, uint32_t n) {
  std::map<std::pair<uint64_t, std::string>, std::vector<TierSnapshot>> by_attempt;
  for (const TierSnapshot& s : snapshots)
    if (s.rank >= first && s.rank < first + n) by_attempt[{s.step, s.run_hash}].push_back(s);
  for (auto it = by_attempt.rbegin(); it != by_attempt.rend(); ++it)
    if (it->second.size() == n) return it->second;
  return {};
}

}  // namespace

namespace {

// Streams `snapshots` (one step) to `send`'s receiver, rank by rank.
Result<ReplicationPass> SendSnapshots(const std::vector<TierSnapshot>& snapshots, const ReplicaSendOptions& send) {
  ReplicationPass pass;
  const auto start = std::chrono::steady_clock::now();
  for (const TierSnapshot& s : snapshots) {
    // Data first, index last, as a rank publishes: the index is what makes it count.
    const std::string dir = s.step_dir.substr(s.step_dir.rfind('/') + 1);
    LL_ASSIGN_OR_RETURN(ReplicaTransfer t,
                        SendReplica(send, dir,
                                    {{s.data_name, JoinPath(s.step_dir, s.data_name)},
                                     {s.index_name, JoinPath(s.step_dir, s.index_name)}}));
    pass.bytes += t.bytes;
  }
  pass.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!snapshots.empty()) pass.step = snapshots[0].step;
  return pass;
}

}  // namespace

Result<ReplicationPass> SendStep(const std::string& tier_root, uint64_t step, const ReplicaSendOptions& peer) {
  LL_ASSIGN_OR_RETURN(std::vector<TierSnapshot> all, ListTierSnapshots(Env::Default(), tier_root));
  std::vector<TierSnapshot> of_step;
  for (const TierSnapshot& s : all)
    if (s.step == step) of_step.push_back(s);
  if (of_step.empty()) return Status::NotFound(tier_root, "no snapshot of step " + std::to_string(step));
  return SendSnapshots(of_step, peer);
}

bool TierHoldsStep(const std::string& tier_root, uint64_t step) {
  Result<std::vector<TierSnapshot>> all = ListTierSnapshots(Env::Default(), tier_root);
  if (!all.ok()) return false;
  std::map<std::string, std::pair<uint32_t, uint32_t>> attempts;  // run hash -> (ranks here, world)
  for (const TierSnapshot& s : *all)
    if (s.step == step) attempts[s.run_hash] = {attempts[s.run_hash].first + 1, s.world_size};
  for (const auto& [hash, n] : attempts)
    if (n.first == n.second) return true;
  return false;
}

Result<ReplicationPass> Replicator::RunOnce() {
  Env* env = Env::Default();
  sent_.resize(o_.peers.size());
  LL_ASSIGN_OR_RETURN(std::vector<TierSnapshot> all, ListTierSnapshots(env, o_.tier_root));
  const std::vector<TierSnapshot> mine = NewestWhole(all, o_.first_rank, o_.ranks);
  ReplicationPass pass;
  if (!mine.empty()) pass.newest = mine[0].step;
  if (mine.empty()) return pass;
  const uint64_t step = mine[0].step;
  Status first_error;
  for (size_t p = 0; p < o_.peers.size(); ++p) {
    if (sent_[p] && *sent_[p] >= step) continue;
    // A newer step of this node's ranks supersedes this one: looked for at most every 100 ms.
    ReplicaSendOptions send = o_.peers[p];
    auto checked = std::chrono::steady_clock::now();
    send.cancelled = [&]() {
      if (o_.peers[p].cancelled && o_.peers[p].cancelled()) return true;
      if (std::chrono::steady_clock::now() - checked < std::chrono::milliseconds(100)) return false;
      checked = std::chrono::steady_clock::now();
      Result<std::vector<TierSnapshot>> now = ListTierSnapshots(env, o_.tier_root);
      if (!now.ok()) return false;
      const std::vector<TierSnapshot> newest = NewestWhole(*now, o_.first_rank, o_.ranks);
      return !newest.empty() && newest[0].step > step;
    };
    Result<ReplicationPass> sent = SendSnapshots(mine, send);
    if (!sent.ok()) {
      // Superseded, or stopping: no use trying the other peers with this step.
      if (sent.status().code() == StatusCode::kAborted) return sent.status();
      if (first_error.ok()) first_error = sent.status();
      continue;
    }
    sent_[p] = step;
    pass.step = step;
    pass.bytes += sent->bytes;
    pass.seconds += sent->seconds;
  }
  if (!first_error.ok()) return first_error;
  return pass;
}

std::optional<uint64_t> Replicator::replicated_step() const {
  if (sent_.empty() || sent_.size() < o_.peers.size()) return std::nullopt;
  std::optional<uint64_t> oldest;
  for (const std::optional<uint64_t>& s : sent_) {
    if (!s) return std::nullopt;
    oldest = oldest ? std::min(*oldest, *s) : *s;
  }
  return oldest;
}

std::vector<uint32_t> ReplicaPeers(uint32_t node, uint32_t nodes, uint32_t group_size) {
  std::vector<uint32_t> peers;
  if (nodes < 2 || node >= nodes) return peers;
  if (group_size < 2) {
    peers.push_back((node + 1) % nodes);
    return peers;
  }
  // Groups [g*k, g*k + k); the last full group takes a lone remainder.
  uint32_t begin = node / group_size * group_size;
  uint32_t end = std::min(nodes, begin + group_size);
  if (nodes - end == 1) end = nodes;
  if (end - begin == 1 && begin >= group_size) begin -= group_size;  // the lone node itself
  for (uint32_t n = begin; n < end; ++n)
    if (n != node) peers.push_back(n);
  return peers;
}

ReplicaReceiver::Placer TierPlacer(std::string tier_root, uint32_t keep_last) {
  return [tier_root = std::move(tier_root), keep_last](
             const std::string& dir, const std::vector<std::pair<std::string, std::string>>& received) -> Status {
    const std::pair<std::string, std::string>* index = nullptr;
    const std::pair<std::string, std::string>* data = nullptr;
    for (const auto& f : received) {
      if (f.first.size() > 6 && f.first.compare(f.first.size() - 6, 6, ".index") == 0) index = &f;
      if (f.first.size() > 5 && f.first.compare(f.first.size() - 5, 5, ".data") == 0) data = &f;
    }
    if (received.size() != 2 || index == nullptr || data == nullptr)
      return Status::Corruption("replica " + dir, "expected one rank's index and data file");
    Env* env = Env::Default();
    // The names say whose snapshot it is; the data file's must agree with the index's.
    const std::optional<TierSnapshot> parsed = ParseTierSnapshot(tier_root, dir, index->first);
    if (!parsed) return Status::Corruption("replica " + dir + "/" + index->first, "not a rank snapshot of a memory tier");
    const TierSnapshot& s = *parsed;
    if (data->first != s.data_name)
      return Status::Corruption("replica " + dir, "data file '" + data->first + "' does not match index '" + index->first + "'");
    LL_ASSIGN_OR_RETURN(std::string encoded, ReadFileToString(env, index->second, 1ull << 30));
    Status placed = PlaceTierReplica(env, tier_root, s, data->second, encoded, keep_last);
    return placed.IsAlreadyExists() ? Status::OK() : placed;
  };
}

}  // namespace lifeline::replication
