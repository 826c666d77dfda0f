// Part of the declared internal interface (lifeline/internal/): for Lifeline's own binaries, not users.
// The agents' record, kept in the (shared) checkpoint directory, of which memory-tier snapshots are
// held in peer nodes' memory: an agent writes one record for its node's ranks as replication
// proceeds, and `lifeline ls DIR`, on any node, reads them all to say which steps are replicated.
//
// On disk: DIR/.replicas/ranks-<first>-<last>-of-<world>.json (decimal, no leading zeros; <last>
// is first_rank + ranks - 1), one JSON object of at most 64 KiB:
//   {"format": "lifeline-replication-1", "world_size": 4, "first_rank": 2, "ranks": 2,
//    "node": "<etcd node id>", "peers": ["<node id>", ...], "steps": [150, 100],
//    "updated_unix_ms": 1700000000000}
// Unknown fields are ignored. A record is only a statement of what its writer last saw: a reader
// trusts nothing in it beyond what it counts (no path in it is ever opened).
//
// Thread safety: the functions share no state. One writer per record file (the node's agent);
// readers may run concurrently with it (the file is replaced atomically).
#ifndef LIFELINE_INTERNAL_REPLICATION_RECORD_H_
#define LIFELINE_INTERNAL_REPLICATION_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

// The directory of records inside a checkpoint directory, and the record format's name.
inline constexpr const char* kReplicationRecordDirName = ".replicas";
inline constexpr const char* kReplicationRecordFormat = "lifeline-replication-1";
// Limits a reader enforces (and the writer keeps to).
inline constexpr uint64_t kMaxReplicationRecordBytes = 64 << 10;
inline constexpr uint32_t kMaxReplicationRecordSteps = 64;
inline constexpr uint32_t kMaxReplicationWorldSize = 1u << 24;

// One node's record: which of its ranks' snapshots are held in peers' memory, for which steps.
struct ReplicationRecord {
  uint32_t world_size = 0;      // the world the ranks belong to
  uint32_t first_rank = 0;      // global ranks first_rank .. first_rank + ranks - 1
  uint32_t ranks = 0;
  std::string node;             // the writing node's id (etcd node id; informative)
  std::vector<std::string> peers;  // the nodes holding the replicas (ids; informative)
  std::vector<uint64_t> steps;  // steps whose every rank above is on every peer, newest first (at most 64)
  uint64_t updated_unix_ms = 0;
};

// The record's file name, "ranks-<first>-<last>-of-<world>.json" (meaningful for a valid record).
std::string ReplicationRecordFileName(const ReplicationRecord& record);

// Writes DIR/.replicas/<ReplicationRecordFileName> atomically (a synced temporary file renamed over
// it, then the directory synced), creating .replicas. The steps are written newest first without
// duplicates, the newest kMaxReplicationRecordSteps of them; updated_unix_ms 0 is written as now.
// InvalidArgument for a record a reader would refuse (ranks 0, ranks beyond world_size, world_size
// above kMaxReplicationWorldSize, or one too large); NotFound when DIR is not a directory (a record
// never creates a checkpoint directory); FailedPrecondition when DIR/.replicas is a symbolic link.
Status WriteReplicationRecord(Env* env, const std::string& checkpoint_dir, const ReplicationRecord& record);

// Removes this record's file (already absent is OK) and syncs the directory.
Status RemoveReplicationRecord(Env* env, const std::string& checkpoint_dir, const ReplicationRecord& record);

// Every well-formed record under DIR/.replicas, ordered by world size then first rank, their steps
// newest first; a missing directory is an empty list. Malformed, oversized, symlinked, non-regular
// or wrongly named entries (a name that does not match the record's content included) are skipped,
// never followed, each with "<path>: <why>" appended to *skipped when non-null; so is a .replicas
// that is a symbolic link or not a directory (no records then). Temporary files of a writer in
// progress are passed over silently. An error only when the directory cannot be listed.
Result<std::vector<ReplicationRecord>> ReadReplicationRecords(Env* env, const std::string& checkpoint_dir,
                                                              std::vector<std::string>* skipped = nullptr);

// How many of the ranks 0..world_size-1 of `step` the records say are on a peer: records of another
// world size do not count, and a rank in several records counts once.
uint32_t ReplicatedRanks(const std::vector<ReplicationRecord>& records, uint64_t step, uint32_t world_size);

}  // namespace lifeline

#endif  // LIFELINE_INTERNAL_REPLICATION_RECORD_H_
