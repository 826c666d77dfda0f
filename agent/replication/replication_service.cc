#include "agent/replication/replication_service.h"

#include <chrono>

#include "lifeline/checkpoint.h"
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
    if (checkpoint_dir.empty()) return Status::Unavailable("replica " + dir, "this node has not joined a round yet");
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

void ReplicationService::SendLoop() {
  std::unique_ptr<Replicator> replicator;
  uint64_t generation = 0;
  uint64_t pending = kNone;  // the newest step not yet replicated, and since when
  Clock::time_point pending_since;
  for (;;) {
    ReplicationTarget t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::duration<double>(settings_.poll_seconds), [&] { return stopping_; });
      if (stopping_) return;
      if (generation != target_generation_) {  // a new round: maybe another peer
        generation = target_generation_;
        replicator.reset();
      }
      t = target_;
    }
    if (t.peer_host.empty() || t.peer_port == 0 || t.ranks == 0 || t.checkpoint_dir.empty()) continue;
    Result<std::string> tier = FindMemoryTierOf(t.checkpoint_dir);
    if (!tier.ok()) continue;  // no rank of this node has opened it yet
    if (replicator == nullptr) {
      ReplicatorOptions o;
      o.tier_root = *tier;
      o.first_rank = t.first_rank;
      o.ranks = t.ranks;
      o.peer.host = t.peer_host;
      o.peer.port = t.peer_port;
      o.peer.bandwidth_bytes_per_second = settings_.bandwidth_bytes_per_second;
      o.peer.cancelled = [this] {
        std::lock_guard<std::mutex> lock(mu_);
        return stopping_;
      };
      replicator = std::make_unique<Replicator>(std::move(o));
    }
    Result<ReplicationPass> pass = replicator->RunOnce();
    std::lock_guard<std::mutex> lock(mu_);
    if (!pass.ok()) {
      if (pass.status().code() != StatusCode::kAborted) {
        ++stats_.failures;
        stats_.last_error = pass.status().ToString();
      }
      continue;
    }
    stats_.bytes_sent += pass->bytes;
    if (pass->newest) stats_.newest_step = pass->newest;
    stats_.replicated_step = replicator->replicated_step();
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
