// Replication of a node's memory-tier snapshots to a peer node's tier (issue "a memory tier that
// survives losing a node"). The sending side, Replicator, finds the newest step every rank of this
// node has published in its tier and streams each rank's index and data to the peer's agent
// (replica_stream.h); the receiving side, TierPlacer, places each arriving snapshot in the peer's
// own tier through the commit protocol (lifeline/internal/tier_replica.h). A step whose ranks are
// split over nodes thus becomes complete, and loadable from memory, on every node that received
// the missing ranks: with two nodes in a ring, on both.
//
// Thread safety: a Replicator is used by one thread; a TierPlacer may run on several at once.
#ifndef LIFELINE_AGENT_REPLICATION_REPLICATOR_H_
#define LIFELINE_AGENT_REPLICATION_REPLICATOR_H_

#include <cstdint>
#include <optional>
#include <string>

#include "agent/replication/replica_stream.h"
#include "lifeline/status.h"

namespace lifeline::replication {

struct ReplicatorOptions {
  std::string tier_root;    // this node's memory tier of the job's checkpoint directory
  uint32_t first_rank = 0;  // this node's global ranks: first_rank .. first_rank + ranks - 1
  uint32_t ranks = 1;
  ReplicaSendOptions peer;  // the peer's receiver, bandwidth budget
};

struct ReplicationPass {
  std::optional<uint64_t> newest;  // the newest step all of this node's ranks published
  std::optional<uint64_t> step;    // the step sent, if any
  uint64_t bytes = 0;
  double seconds = 0;
};

class Replicator {
 public:
  explicit Replicator(ReplicatorOptions options) : o_(std::move(options)) {}

  // Sends the newest step that every rank of this node has published and that was not sent yet;
  // a step with nothing new is a pass with no step. A newer step published meanwhile cancels the
  // stream in flight (Aborted; the next pass sends the newer one).
  Result<ReplicationPass> RunOnce();

  // The newest step sent whole.
  std::optional<uint64_t> replicated_step() const { return sent_; }

 private:
  ReplicatorOptions o_;
  std::optional<uint64_t> sent_;
};

// Sends every rank snapshot of `step` in the tier `tier_root` to `peer` (a node that lacks the step:
// a replacement, after a node was lost). NotFound when the tier holds no rank of it.
Result<ReplicationPass> SendStep(const std::string& tier_root, uint64_t step, const ReplicaSendOptions& peer);

// Whether every rank of one attempt at `step` is in the tier `tier_root`.
bool TierHoldsStep(const std::string& tier_root, uint64_t step);

// The placer of a receiver whose streams are tier snapshots (directory: the step's, files: one
// rank's index and data): places them in the tier `tier_root`, keeping `keep_last` complete steps.
ReplicaReceiver::Placer TierPlacer(std::string tier_root, uint32_t keep_last);

}  // namespace lifeline::replication

#endif  // LIFELINE_AGENT_REPLICATION_REPLICATOR_H_
