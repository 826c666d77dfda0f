// Digests of replicated shards, so the agent can tell whether data-parallel replicas, which must
// be bit-identical, still are (formats/SPEC.md §7 "Replica digests", §15 replica_digest).
//
// A replicated shard is written once (save_plan.h): split into `replica_count` parts, or whole by
// one replica. Every replica digests its own copy of all of it at every staged snapshot: the
// shard's packed bytes cut at those parts' boundaries and every chunk_bytes from each part's
// start (the chunks its writer checksums), each unit hashed with XXH3-64, and the units' hashes
// hashed again, in order, as little-endian u64s. The units of the part this rank writes are its
// chunks, whose checksums the copy engine computes anyway; the others are read by the copy threads
// from the caller's memory before the snapshot completes, and hashed only (a `verify` piece: no
// copy, nothing written).
#ifndef LIFELINE_SRC_SAVE_REPLICA_DIGEST_H_
#define LIFELINE_SRC_SAVE_REPLICA_DIGEST_H_

#include <atomic>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/model.h"
#include "lib/src/save/save_job.h"
#include "lib/src/save/save_plan.h"
#include "lifeline/checkpoint.h"

namespace lifeline::internal {

// Where a unit's hash comes from: chunk `index` of the job's index (this rank's own part), or
// the job's verify hash `index`.
struct ReplicaDigestUnit {
  bool own_chunk = false;
  uint64_t index = 0;
};

struct ReplicaShardDigest {
  uint64_t key = 0;            // ReplicaHash(name, region): the same on every replica
  std::string name;            // the tensor's
  uint32_t replica_count = 0;
  uint64_t bytes = 0;          // the shard's raw bytes
  uint64_t tensor_offset = 0;  // their byte offset in the tensor's row-major bytes; ~0 for a box
  std::vector<ReplicaDigestUnit> units;  // in the shard's byte order
};

struct ReplicaDigestPlan {
  std::vector<ReplicaShardDigest> shards;
  // Hash-only pieces (CopyPiece::verify), target = their verify hash index, in order.
  std::vector<CopyPiece> verify_pieces;
  // Whether the shards' names have reached the agent (said once per plan, i.e. per process for a
  // training loop that saves the same tensors; again after a ring refused them).
  mutable std::atomic<bool> names_sent{false};
};

// The digests a staged save of `plan` (planned from `request`, its chunks laid out in
// `fragments`: the job index's fragments) computes: every host shard with replica_count > 1 and
// some elements. Device shards are left out (their other replicas' parts are not in host memory).
std::shared_ptr<ReplicaDigestPlan> PlanReplicaDigests(const SaveRequest& request, const RankSavePlan& plan,
                                     const std::vector<format::FragmentInfo>& fragments, uint64_t chunk_bytes,
                                     uint64_t replica_split_bytes);

// The digest of `shard` from the job's chunk checksums and verify hashes.
uint64_t ShardDigest(const ReplicaShardDigest& shard, const std::vector<format::ChunkInfo>& chunks,
                     const std::vector<uint64_t>& verify_hashes);

}  // namespace lifeline::internal

#endif  // LIFELINE_SRC_SAVE_REPLICA_DIGEST_H_
