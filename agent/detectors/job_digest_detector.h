// "sdc_suspect" across the nodes of a multi-node job: the round's leader compares the replicas'
// copies of every snapshot, wherever the replicas run (issue 53: with TP 8 on a node, every other
// replica of a shard is on another node, and no node alone compares anything).
//
// Each node folds each rank's digests of a snapshot into one DigestFold (ReplicaDigestDetector's
// folding, agent/progress.h) and sends it with its progress summary (formats/SPEC.md §17, version
// 3): about 21 bytes a rank and snapshot, where the shards' digests would be some 60 times that at
// Llama 3 405B's 72 replicated shards a rank. The leader groups the folds of a step by keyset (the
// ranks holding the same replicated shards: the replicas of one piece of the model) and judges a
// group once as many folds came as its fewest-replicated shard has replicas, or `hold_seconds`
// after its first came. With a majority (more than half of the group agree), the ranks whose fold
// differs are named; with none (two replicas that differ, or a tie), every rank of the group is.
//
// Which tensors differ is not in a fold: the leader asks the nodes of the ranks named, and of one
// rank of the majority, for their digests of that step shard by shard (DigestQuery, through etcd:
// rounds/R/digest_queries/), and waits up to `detail_seconds` for them (they come with the nodes'
// next summaries). Then one anomaly a step, its evidence the tensors and byte ranges that differ
// (as ReplicaDigestDetector's), the ranks' nodes, and, when a node did not answer in time, that it
// did not. Cost at the leader: one map entry per rank and snapshot, judged once; nothing per shard
// unless a group differs.
//
// Thread safety: none (the Supervisor's loop).
#ifndef LIFELINE_AGENT_DETECTORS_JOB_DIGEST_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_JOB_DIGEST_DETECTOR_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/detector.h"
#include "agent/progress.h"

namespace lifeline::agent {

class JobDigestDetector {
 public:
  explicit JobDigestDetector(double hold_seconds = 30, double detail_seconds = 10)
      : hold_seconds_(hold_seconds), detail_seconds_(detail_seconds) {}

  // A fold from node `node`'s summary (a fold of a (step, rank) already taken is ignored).
  void AddFold(const std::string& node, const DigestFold& fold, uint64_t now_ns);
  // A detail the leader asked for.
  void AddDetail(const DigestDetail& detail);
  // Judges what is due: anomalies into `out`, the details to ask of the nodes into `queries`.
  void Poll(uint64_t now_ns, std::vector<Anomaly>* out, std::vector<DigestQuery>* queries);

  uint64_t folds() const { return folds_; }
  uint64_t groups_compared() const { return compared_; }

 private:
  using GroupKey = std::pair<uint64_t, uint64_t>;  // (step, keyset)
  struct Group {
    std::map<int, DigestFold> folds;  // by global rank
    uint32_t expect = 0;
    uint64_t first_ns = 0;
  };
  // A group whose replicas differ: its verdict, waiting for the details asked.
  struct Odd {
    std::vector<int> named;        // the ranks whose copy differs (every one: no majority)
    int reference = -1;            // a rank of the majority (-1: none)
    bool majority = false;
    uint64_t keyset = 0;
    uint32_t shards = 0;
    std::map<int, uint64_t> folds; // every rank of the group, its fold's digest
  };
  struct StepVerdict {
    std::vector<Odd> odd;
    std::set<int> asked;           // ranks whose details were asked for
    uint64_t asked_ns = 0;         // when (0: none asked yet)
    uint64_t groups = 0;           // compared at this step
    std::set<int> compared;        // ranks compared
  };

  void Judge(uint64_t step, Group g);
  void Raise(uint64_t step, StepVerdict& v, uint64_t now_ns, std::vector<Anomaly>* out);

  const double hold_seconds_;
  const double detail_seconds_;
  std::map<GroupKey, Group> groups_;
  std::set<std::pair<uint64_t, int>> seen_;           // (step, rank) folds taken, the newest steps
  std::set<uint64_t> seen_steps_;                      // ...those steps
  std::map<int, std::string> node_of_;                 // global rank -> node id
  std::map<uint64_t, StepVerdict> verdicts_;           // by step
  std::map<std::pair<uint64_t, int>, DigestDetail> details_;  // (step, rank)
  uint64_t folds_ = 0;
  uint64_t compared_ = 0;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_JOB_DIGEST_DETECTOR_H_
