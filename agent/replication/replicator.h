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
#include <vector>

#include "lib/net/replica_stream.h"
#include "lifeline/status.h"

namespace lifeline::replication {

struct ReplicatorOptions {
  std::string tier_root;    // this node's memory tier of the job's checkpoint directory
  uint32_t first_rank = 0;  // this node's global ranks: first_rank .. first_rank + ranks - 1
  uint32_t ranks = 1;
  // The peers' receivers, each with the bandwidth budget: a step is sent to one after the other.
  std::vector<ReplicaSendOptions> peers;
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

  // Sends the newest step that every rank of this node has published to each peer that does not
  // have it yet; with nothing new, a pass with no step. A newer step published meanwhile cancels
  // the stream in flight (Aborted; the next pass sends the newer one). A peer that fails does not
  // keep the step from the others: the first error is returned after every peer was tried.
  Result<ReplicationPass> RunOnce();

  // The newest step every peer holds whole (each was sent it, or a newer one).
  std::optional<uint64_t> replicated_step() const;

 private:
  ReplicatorOptions o_;
  std::vector<std::optional<uint64_t>> sent_;  // per peer
};

// Where node `node` of `nodes` (group-rank order) sends its snapshots. group_size 0: a ring, the
// next node (one copy). group_size k >= 2: the nodes form groups of k consecutive ones and each
// sends to every other member of its group (k - 1 copies: a group survives losing k - 1 of its
// nodes); a remainder of one node joins the last group, a larger one is a group of its own. Never
// the node itself; empty with one node.
std::vector<uint32_t> ReplicaPeers(uint32_t node, uint32_t nodes, uint32_t group_size);

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
