// "sdc_suspect": data-parallel replicas that must be bit-identical and are not, found at every
// snapshot from the digests the ranks' saves report (trace::kReplicaDigest: one 64-bit digest of a
// rank's copy of each replicated shard, keyed by the shard, the same key on every replica;
// formats/SPEC.md §7 and §15).
//
// Per (step, shard key) the digests of the replicas are compared: once every replica the key says
// there are (its replica count) has reported, or hold_seconds after the first of them came (a
// multi-node job: only this node's replicas report here). With a majority (more than half of the
// digests compared agree), the ranks whose digest differs from it are named; with none (two
// replicas that differ, or a tie), every rank compared is named, and the evidence says no majority
// could tell the odd one out. One anomaly per step: its evidence lists the tensors (named by the
// kReplicaName events, else by key), each with its byte range (in the tensor when the shard is a
// flat range of it, else in the shard), the digests by rank and the majority's. The cost is linear:
// one map entry per (step, shard) and one per digest; a step whose replicas all agree leaves
// nothing behind. A poll looks only at the shards whose replicas all came since the last one and
// at those whose hold ran out, not at every shard still waiting: on a node of a multi-node job
// most shards' other replicas report elsewhere, and a hold's worth of snapshots waits at once.
//
// In a multi-node job the replicas of a shard are mostly on other nodes, so the node does not
// judge: it folds (set_folding) each rank's digests of a snapshot into one DigestFold (which
// shards, and a digest of its copy of all of them) for the round's leader to compare across the
// job (agent/detectors/job_digest_detector.h), and keeps the digests of the newest snapshots shard
// by shard, so that when the leader asks (its fold differs) it can say which tensors differ.
//
// Thread safety: none (see agent/detector.h).
#ifndef LIFELINE_AGENT_DETECTORS_REPLICA_DIGEST_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_REPLICA_DIGEST_DETECTOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/detector.h"
#include "agent/progress.h"

namespace lifeline::agent {

// One shard whose replicas differ at a step, as an sdc_suspect verdict reports it.
struct ShardDifference {
  std::string tensor;                        // its name as shown (printable), or "shard key <hex>"
  uint64_t key = 0;
  uint32_t replicas = 0;
  uint64_t bytes = 0;
  uint64_t tensor_offset = trace::kNoOffset;  // kNoOffset: the range is in the shard (a box)
  std::map<int, uint64_t> digests;           // by global rank: the copies compared
  std::optional<uint64_t> majority;          // the majority's digest; nullopt: none could tell
  std::vector<int> ranks;                    // whose copy differs from it (every one compared: no majority)
};

// The sdc_suspect anomaly of `step` for `differences` (this node's verdict, or the leader's
// across the job): its ranks, message and evidence (the tensors, at most 16, with byte ranges and
// digests; how many shards and which ranks were compared).
// `majority`: whether a majority named the ranks (default: every difference had one).
Anomaly SdcSuspectAnomaly(uint64_t step, const std::vector<ShardDifference>& differences, uint64_t shards_compared,
                          const std::set<int>& ranks_compared, uint64_t now_ns,
                          std::optional<bool> majority = std::nullopt);

// A tensor name as evidence and messages show it: its bytes are the script's, so anything outside
// printable ASCII is spelled \xNN (JSON text must be UTF-8).
std::string PrintableName(const std::string& bytes);
// A digest as evidence shows it: 16 hex digits.
std::string DigestHex(uint64_t v);

class ReplicaDigestDetector : public Detector {
 public:
  // A step's digests wait at most `hold_seconds` for replicas that have not reported.
  explicit ReplicaDigestDetector(double hold_seconds = 30) : hold_seconds_(hold_seconds) {}
  const char* kind() const override { return "replica_digest"; }
  void Reset(int world) override;
  void Observe(const Timeline& timeline, const TimelineChange& change) override;
  void Poll(const Timeline& timeline, uint64_t now_ns, std::vector<Anomaly>* out) override;

  uint64_t digests() const { return digests_; }            // digest events taken
  uint64_t shards_compared() const { return compared_; }   // (step, shard) comparisons judged

  // Folding instead of judging (a multi-node job), from the next digest on.
  void set_folding(bool on) { folding_ = on; }
  bool folding() const { return folding_; }
  // The folds of the snapshots finished by `now_ns`, each once: a rank's digests of a step are
  // finished when it reports a later step's, or kFoldQuietSeconds after its newest one.
  std::vector<DigestFold> TakeFolds(const Timeline& timeline, uint64_t now_ns);
  // Rank `global`'s digests of `step`, shard by shard and named; nullopt when not kept (the steps
  // of the last kKeptSeconds are, at most kKeptSnapshots of them).
  std::optional<DigestDetail> Detail(const Timeline& timeline, int global, uint64_t step) const;
  static constexpr double kFoldQuietSeconds = 1.0;
  static constexpr double kKeptSeconds = 120;
  static constexpr size_t kKeptSnapshots = 64;

 private:
  // A rank's digests of one snapshot (folding).
  struct RankSnapshot {
    std::map<uint64_t, ShardDigestEntry> shards;  // by key (the name is filled in by Detail)
    uint64_t newest_ns = 0;                       // its newest digest's time
    bool folded = false;
  };
  void Keep(int rank, const trace::Event& e);
  using StepKey = std::pair<uint64_t, uint64_t>;  // (step, shard key)
  struct Comparison {
    uint64_t id = 0;                  // tells it from a later one of the same (step, key)
    uint32_t replica_count = 0;
    uint64_t bytes = 0;
    uint64_t tensor_offset = 0;
    std::map<int, uint64_t> digests;  // by local rank
    uint64_t seen_ns = 0;             // the first poll that saw it
  };
  // A shard whose replicas differ at a step, waiting for the step's other shards.
  struct Difference {
    uint64_t key = 0;
    Comparison comparison;
  };
  struct StepVerdict {
    std::vector<Difference> differences;
    uint64_t shards = 0;  // compared at this step
  };

  // A shard's hold runs out at `at_ns`.
  struct Deadline {
    uint64_t at_ns = 0;
    StepKey key;
    uint64_t id = 0;
  };

  void Judge(const Timeline& timeline, uint64_t step, uint64_t key, Comparison c);
  // Judges the comparison at `it` and forgets it.
  void JudgeAndErase(const Timeline& timeline, std::map<StepKey, Comparison>::iterator it);
  void Raise(const Timeline& timeline, uint64_t step, const StepVerdict& v, uint64_t now_ns, std::vector<Anomaly>* out);
  std::string NameOf(uint64_t key) const;

  const double hold_seconds_;
  int world_ = 0;
  // Names being assembled, per local rank: key -> parts; and the names complete, by key.
  std::vector<std::map<uint64_t, std::vector<std::string>>> parts_;
  std::map<uint64_t, std::string> names_;
  std::map<StepKey, Comparison> comparisons_;
  std::map<uint64_t, StepVerdict> verdicts_;  // by step
  std::map<uint64_t, size_t> waiting_;        // by step: its comparisons not judged yet
  std::vector<StepKey> unseen_;               // comparisons begun since the last poll
  std::vector<StepKey> complete_;             // ...and those whose replicas all came since
  std::deque<Deadline> deadlines_;            // by time: the polls' clock only goes forward
  bool folding_ = false;
  std::map<std::pair<uint64_t, int>, RankSnapshot> snapshots_;  // (step, local rank): folding
  std::map<uint64_t, uint64_t> kept_steps_;                     // their steps: the newest digest's time
  uint64_t next_id_ = 0;
  uint64_t digests_ = 0;
  uint64_t compared_ = 0;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_REPLICA_DIGEST_DETECTOR_H_
