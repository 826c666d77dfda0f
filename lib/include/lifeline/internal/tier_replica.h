// Part of the declared internal interface (lifeline/internal/): for Lifeline's own binaries, not users.
// What an agent needs to replicate memory-tier snapshots between nodes (agent/replication/): the
// rank snapshots a node's tier holds, and the placing of a peer's snapshot into this node's tier
// through the commit protocol, so that a step whose ranks are spread over nodes becomes complete
// (and loadable from memory) wherever all of them have arrived.
#ifndef LIFELINE_INTERNAL_TIER_REPLICA_H_
#define LIFELINE_INTERNAL_TIER_REPLICA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

// One rank's published snapshot of one step in a memory tier.
struct TierSnapshot {
  uint64_t step = 0;
  std::string run_hash;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  std::string step_dir;    // its step directory
  std::string index_name;  // file names in it
  std::string data_name;
};

// Where a receiving agent lets replicas arrive before they are placed: a private directory on the
// memory tiers' file system (/dev/shm, or $LIFELINE_MEMORY_TIER_DIR), so that placing is a rename.
Result<std::string> ReplicaIncomingDir();

// This node's memory tier of `checkpoint_dir`, created when missing (a node that never ran a rank
// of the job, such as a replacement, receives replicas all the same). NotFound when the directory
// has no identity yet (no rank ever opened it).
Result<std::string> MemoryTierRootOf(const std::string& checkpoint_dir);

// The memory the memory tiers of this user take on this node (every file under
// <file system>/lifeline-<uid>, a file linked twice counted once), and the size of their file
// system: what a replication budget is measured against.
Result<uint64_t> MemoryTierBytesInUse();
Result<uint64_t> MemoryTierFileSystemBytes();

// The snapshot whose index is named `index_name` in the step directory named `step_dir_name`
// under `root`; nullopt when the names are not a tier's ("step-<20 digits>", "H.rRRRRRR-of-WWWWWW.index").
std::optional<TierSnapshot> ParseTierSnapshot(const std::string& root, const std::string& step_dir_name,
                                              const std::string& index_name);

// Every rank snapshot published under the tier `root` (its index is there), newest step first,
// then by rank. Step directories that cannot be listed are passed over.
Result<std::vector<TierSnapshot>> ListTierSnapshots(Env* env, const std::string& root);

// Places a peer's snapshot in the tier `root`: `data_file` (already on root's file system) becomes
// its data file, by rename, and `encoded_index` is published as its index by the commit protocol,
// so the step commits when this completes its set of ranks (the tier's retention keeps
// `keep_last`). AlreadyExists when the step is already committed there (nothing to add).
Status PlaceTierReplica(Env* env, const std::string& root, const TierSnapshot& snapshot, const std::string& data_file,
                        std::string_view encoded_index, uint32_t keep_last);

}  // namespace lifeline

#endif  // LIFELINE_INTERNAL_TIER_REPLICA_H_
