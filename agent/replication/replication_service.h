// The agent's side of snapshot replication: a receiver that places the snapshots a peer node sends
// into this node's memory tier, and a background sender that streams this node's newest snapshots
// to the peers the round assigns (ReplicaPeers: a ring by default, so a node's replicas are never
// on itself), and keeps the job's record of what is replicated in the checkpoint directory
// (lifeline/internal/replication_record.h, read by `lifeline ls`). Nothing here blocks the agent's
// loop: it reads stats().
//
// Thread safety: every public method may be called from any thread.
#ifndef LIFELINE_AGENT_REPLICATION_REPLICATION_SERVICE_H_
#define LIFELINE_AGENT_REPLICATION_REPLICATION_SERVICE_H_

#include <condition_variable>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lib/net/replica_stream.h"
#include "agent/replication/replicator.h"
#include "lifeline/internal/replication_record.h"
#include "lifeline/status.h"

namespace lifeline::replication {

struct ReplicationSettings {
  uint64_t bandwidth_bytes_per_second = 500'000'000;  // the sender's budget (0: unlimited)
  uint32_t keep_last = 2;                             // complete steps a tier keeps with replicas
  double poll_seconds = 0.5;                          // how often the tier is looked at
  // What this node's memory tiers may take, its own snapshots and the replicas it receives
  // together; a replica that would go beyond is refused (0: half of the tiers' file system).
  uint64_t memory_budget_bytes = 0;
  // For fault drills only: every stream sent carries one flipped bit, which its receiver must
  // catch (LIFELINE_DRILL_DAMAGE_REPLICAS=1 in the agent's environment).
  bool damage_in_transit = false;
};

struct ReplicaPeer {
  std::string id;  // its node id (for the record and the logs)
  std::string host;
  uint16_t port = 0;
};

// Where this node's snapshots go in the current round.
struct ReplicationTarget {
  std::string checkpoint_dir;  // the job's (its memory tier is found from it)
  std::string node;            // this node's id
  uint32_t world_size = 0;
  uint32_t first_rank = 0;     // this node's global ranks
  uint32_t ranks = 0;
  std::vector<ReplicaPeer> peers;  // empty: none (a single node, or no peer takes replicas)
  // While checkpoint_dir is empty (no --checkpoint-dir, and no rank had reported one when the
  // round formed), asked at every pass: the directory the ranks report once they open it.
  std::function<std::string()> find_checkpoint_dir;
};

struct ReplicationStats {
  std::optional<uint64_t> replicated_step;  // newest step of this node's ranks on every peer
  std::optional<uint64_t> newest_step;      // newest step all of this node's ranks published
  double lag_seconds = 0;                   // how long newest_step has waited to be replicated
  uint64_t bytes_sent = 0;
  uint64_t failures = 0;
  std::string last_error;
  uint64_t bytes_received = 0;  // placed here from the peer
  uint64_t refused = 0;         // streams refused or broken off here
  uint64_t over_budget = 0;     // of those, replicas that did not fit the memory budget
  uint64_t memory_budget_bytes = 0;
};

class ReplicationService {
 public:
  // Starts the receiver (a free port, every address) and the sender's thread, idle until SetTarget.
  static Result<std::unique_ptr<ReplicationService>> Start(ReplicationSettings settings);
  ~ReplicationService();
  ReplicationService(const ReplicationService&) = delete;
  ReplicationService& operator=(const ReplicationService&) = delete;

  uint16_t port() const { return receiver_->port(); }
  // The round changed: replicate to this target from now on (what was sent before counts for the
  // same peer only).
  void SetTarget(ReplicationTarget target);
  ReplicationStats stats() const;

  // The job ended well: stops sending, withdraws this node's record from the checkpoint
  // directory, and frees the tier's steps up to the newest one sound on disk (the replicas this
  // node holds of other nodes' ranks, which no rank of its own withdraws). Returns the steps freed.
  std::vector<uint64_t> Finish();

 private:
  ReplicationService(ReplicationSettings settings, std::unique_ptr<ReplicaReceiver> receiver);
  void SendLoop();

  const ReplicationSettings settings_;
  std::unique_ptr<ReplicaReceiver> receiver_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                  // GUARDED_BY(mu_)
  ReplicationTarget target_;               // GUARDED_BY(mu_)
  uint64_t target_generation_ = 0;         // GUARDED_BY(mu_)
  std::string checkpoint_dir_;             // GUARDED_BY(mu_): for the receiver's placer
  ReplicationRecord record_;               // GUARDED_BY(mu_): the last one written
  ReplicationStats stats_;                 // GUARDED_BY(mu_)
  std::thread sender_;
};

}  // namespace lifeline::replication

#endif  // LIFELINE_AGENT_REPLICATION_REPLICATION_SERVICE_H_
