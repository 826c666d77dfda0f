#include "agent/replication/replication_service.h"

#include <chrono>

#include "lifeline/checkpoint.h"
#include "lifeline/internal/replication_record.h"
#include "lifeline/internal/tier_replica.h"

namespace lifeline::replication {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kNone = ~uint64_t{0};

ReplicationService::ReplicationService(ReplicationSettings settings, std::unique_ptr<ReplicaReceiver> receiver)
    : settings_(settings), receiver_(std::move(receiver)) {}

Result<std::unique_ptr<ReplicationService>> ReplicationService::Start(ReplicationSettings settings) {
  LL_ASSIGN_OR_RETURN(std::string incoming, ReplicaIncomingDir());
  std::unique_ptr<ReplicationService> s(new ReplicationService(settings, nullptr));
  ReplicationService* self = s.get();
  // Replicas go into this node's tier of the job's checkpoint directory, created if this node
  // never had one (a replacement node); before the first round there is nowhere to put them.
  auto place = [self](const std::string& dir, const std::vector<std::pair<std::string, std::string>>& received) {
    std::string checkpoint_dir;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      checkpoint_dir = self->checkpoint_dir_;
    }
    if (checkpoint_dir.empty())
      return Status::Unavailable("replica " + dir, "this node does not know the job's checkpoint directory yet");
    Result<std::string> tier = MemoryTierRootOf(checkpoint_dir);
    if (!tier.ok()) return tier.status();
    return TierPlacer(*tier, self->settings_.keep_last)(dir, received);
  };
  uint64_t budget = settings.memory_budget_bytes;
  if (budget == 0) {
    LL_ASSIGN_OR_RETURN(uint64_t fs, MemoryTierFileSystemBytes());
    budget = fs / 2;
  }
  s->stats_.memory_budget_bytes = budget;
  auto admit = [self, budget](const std::string& dir, const std::string& name, uint64_t bytes) {
    Result<uint64_t> used = MemoryTierBytesInUse();
    if (!used.ok()) return used.status();
    if (*used + bytes <= budget) return Status::OK();
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      ++self->stats_.over_budget;
    }
    return Status::ResourceExhausted("replica " + dir + "/" + name,
                                     "needs " + std::to_string(bytes) + " bytes; this node's memory tiers hold " +
                                         std::to_string(*used) + " of their " + std::to_string(budget) +
                                         "-byte budget (replication.memory_budget_mb)");
  };
  LL_ASSIGN_OR_RETURN(s->receiver_, ReplicaReceiver::Start(incoming, 0, place, admit));
  s->sender_ = std::thread([self] { self->SendLoop(); });
  return s;
}

ReplicationService::~ReplicationService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (sender_.joinable()) sender_.join();
  receiver_.reset();  // its threads may still be placing: they use mu_, which outlives them
}

std::vector<uint64_t> ReplicationService::Finish() {
  std::string dir;
  ReplicationRecord record;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    dir = checkpoint_dir_;
    record = record_;
  }
  cv_.notify_all();
  if (sender_.joinable()) sender_.join();
  std::vector<uint64_t> freed;
  if (dir.empty()) return freed;
  Env* env = Env::Default();
  if (record.ranks > 0) RemoveReplicationRecord(env, dir, record).IgnoreError();
  Result<std::string> tier = FindMemoryTierOf(dir);
  Result<std::vector<CheckpointInfo>> disk = ScanCheckpointDirectory(dir);
  if (!tier.ok() || !disk.ok()) return freed;
  std::optional<uint64_t> newest_durable;
  for (const CheckpointInfo& c : *disk) {
    if (c.complete && CheckCheckpointMetadata(c).ok()) {
      newest_durable = c.step;  // newest first
      break;
    }
  }
  if (!newest_durable) return freed;
  // A step up to the newest sound one on disk is there, or superseded by it; a newer one may
  // have no other copy and stays.
  for (const CheckpointInfo& c : ScanCheckpointDirectory(*tier).value_or(std::vector<CheckpointInfo>{})) {
    if (c.step > *newest_durable) continue;
    if (env->RemoveTree(c.directory).ok()) freed.push_back(c.step);
  }
  return freed;
}

void ReplicationService::SetTarget(ReplicationTarget target) {
  std::lock_guard<std::mutex> lock(mu_);
  checkpoint_dir_ = target.checkpoint_dir;
  target_ = std::move(target);
  ++target_generation_;
  cv_.notify_all();
}

ReplicationStats ReplicationService::stats() const {
  ReplicationStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
  }
  const ReplicaReceiver::Counters c = receiver_->counters();
  s.bytes_received = c.bytes;
  s.refused = c.refused;
  return s;
}

namespace {

bool SamePeers(const ReplicationTarget& a, const ReplicationTarget& b) {
  if (a.peers.size() != b.peers.size() || a.first_rank != b.first_rank || a.world_size != b.world_size) return false;
  for (size_t i = 0; i < a.peers.size(); ++i)
    if (a.peers[i].id != b.peers[i].id || a.peers[i].host != b.peers[i].host || a.peers[i].port != b.peers[i].port)
      return false;
  return true;
}

}  // namespace

void ReplicationService::SendLoop() {
  std::unique_ptr<Replicator> replicator;
  ReplicationTarget current;
  uint64_t generation = 0;
  uint64_t pending = kNone;  // the newest step not yet replicated, and since when
  Clock::time_point pending_since;
  ReplicationRecord record;  // what `lifeline ls` reads: the steps on every peer, newest first
  for (;;) {
    ReplicationTarget t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::duration<double>(settings_.poll_seconds), [&] { return stopping_; });
      if (stopping_) return;
      t = target_;
      if (generation != target_generation_) {  // a new round: maybe other peers, other ranks
        generation = target_generation_;
        if (!SamePeers(t, current)) {
          replicator.reset();
          record.steps.clear();
        }
        current = t;
      }
    }
    if (t.checkpoint_dir.empty() && t.find_checkpoint_dir) {
      t.checkpoint_dir = t.find_checkpoint_dir();
      if (!t.checkpoint_dir.empty()) {  // the receiver places replicas from now on too
        std::lock_guard<std::mutex> lock(mu_);
        if (generation == target_generation_) target_.checkpoint_dir = checkpoint_dir_ = t.checkpoint_dir;
      }
    }
    if (t.peers.empty() || t.ranks == 0 || t.checkpoint_dir.empty()) continue;
    if (replicator == nullptr) {
      Result<std::string> tier = FindMemoryTierOf(t.checkpoint_dir);
      if (!tier.ok()) continue;  // no rank of this node has opened it yet
      ReplicatorOptions o;
      o.tier_root = *tier;
      o.first_rank = t.first_rank;
      o.ranks = t.ranks;
      for (const ReplicaPeer& peer : t.peers) {
        ReplicaSendOptions send;
        send.host = peer.host;
        send.port = peer.port;
        send.bandwidth_bytes_per_second = settings_.bandwidth_bytes_per_second;
        send.damage_first_chunk = settings_.damage_in_transit;
        send.cancelled = [this] {
          std::lock_guard<std::mutex> lock(mu_);
          return stopping_;
        };
        o.peers.push_back(std::move(send));
      }
      replicator = std::make_unique<Replicator>(std::move(o));
    }
    Result<ReplicationPass> pass = replicator->RunOnce();
    const std::optional<uint64_t> replicated = replicator->replicated_step();
    if (replicated && (record.steps.empty() || *replicated > record.steps.front())) {
      // Outside the lock: the checkpoint directory may be on slow shared storage.
      record.world_size = t.world_size;
      record.first_rank = t.first_rank;
      record.ranks = t.ranks;
      record.node = t.node;
      record.peers.clear();
      for (const ReplicaPeer& peer : t.peers) record.peers.push_back(peer.id);
      record.steps.insert(record.steps.begin(), *replicated);
      if (record.steps.size() > settings_.keep_last) record.steps.resize(settings_.keep_last);
      record.updated_unix_ms = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count());
      Status written = t.world_size > 0 ? WriteReplicationRecord(Env::Default(), t.checkpoint_dir, record) : Status::OK();
      std::lock_guard<std::mutex> lock(mu_);
      if (written.ok()) {
        record_ = record;
      } else {
        ++stats_.failures;
        stats_.last_error = written.Annotate("recording the replicated step").ToString();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.replicated_step = replicated;
    if (!pass.ok()) {
      if (pass.status().code() != StatusCode::kAborted) {
        ++stats_.failures;
        stats_.last_error = pass.status().ToString();
      }
      continue;
    }
    stats_.bytes_sent += pass->bytes;
    if (pass->newest) stats_.newest_step = pass->newest;
    const bool behind = stats_.newest_step && (!stats_.replicated_step || *stats_.newest_step > *stats_.replicated_step);
    if (!behind) {
      pending = kNone;
      stats_.lag_seconds = 0;
    } else {
      if (pending != *stats_.newest_step) {
        pending = *stats_.newest_step;
        pending_since = Clock::now();
      }
      stats_.lag_seconds = std::chrono::duration<double>(Clock::now() - pending_since).count();
    }
  }
}

}  // namespace lifeline::replication
