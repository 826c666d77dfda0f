// A node's compact summary of its ranks' progress, published about once a second in a multi-node
// job so that one agent (the round's leader, agent/rendezvous.h) can judge the job as a whole
// (agent/detectors/job_hang_detector.h): per rank its step, how long it has been silent, and per
// communicator the highest collective it began and the oldest one it has not ended.
//
// Size: about 40 bytes per rank plus about 20 per communicator the rank is in, and the rank's
// newest ended collectives (at most kSamplesPerComm per communicator, about 30 bytes each), so it
// grows with ranks and communicators, never with steps or the collective rate beyond that window.
#ifndef LIFELINE_AGENT_PROGRESS_H_
#define LIFELINE_AGENT_PROGRESS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/timeline.h"
#include "lifeline/status.h"

namespace lifeline::agent {

struct CommProgress {
  uint64_t begun = 0;       // the highest seq the rank began on the communicator
  int64_t open = -1;        // the oldest seq it began and did not end; -1: none
  bool posted = false;      // it handed its part of `open` over
  int op = 0;               // trace::Op of `open`
  double open_seconds = 0;  // how long the rank has been in `open` (as of reading the summary)
};

// One collective a rank ended, with its times as seconds before the summary (posted: -1 when the
// rank recorded no post).
struct CollectiveSample {
  uint32_t comm = 0;
  uint64_t seq = 0;
  int op = 0;
  double begin_ago = 0, posted_ago = -1, end_ago = 0;
};

struct RankProgress {
  int rank = 0;             // global
  int node = 0;             // the node's group rank
  bool alive = true;
  int64_t step = -1;        // the last step begun; -1: none
  double silent_seconds = 0;  // since its last event, as of the summary
  double summary_age_seconds = 0;  // how old the summary was when read (0 on the node itself):
                                   // one that stopped coming is from a node that may be gone
  std::map<uint32_t, CommProgress> comms;
  // The newest collectives it ended (at most kSamplesPerComm per communicator, oldest first): what
  // the leader replays to judge stragglers and slow collectives across nodes.
  std::vector<CollectiveSample> recent;
};

inline constexpr size_t kSamplesPerComm = 32;

// Where a node's summaries to the leader stand: per (communicator, global rank) the newest seq of
// an ended collective the leader has been sent.
using SampleCursor = std::map<std::pair<uint32_t, int>, uint64_t>;

// The progress of `timeline`'s ranks at `now_ns`, as node `node` of the job; with `after`, only the
// ended collectives newer than it (what the leader has not been sent yet: issue 36, "only what
// changed"). Every rank's state (step, silence, communicators) is in each summary, whole.
std::vector<RankProgress> SummarizeProgress(const Timeline& timeline, int node, uint64_t now_ns,
                                            const SampleCursor* after = nullptr);

// `cursor` moved past the collectives `ranks` carry.
void AdvanceCursor(const std::vector<RankProgress>& ranks, SampleCursor* cursor);

// A rank's replica digests of one snapshot, folded into one entry (formats/SPEC.md §17, version
// 3): what the leader compares across nodes (agent/detectors/job_digest_detector.h). Replicas of a
// piece of the model hold the same replicated shards, so their `keyset` is the same, and the same
// bytes, so their `digest` is.
struct DigestFold {
  int rank = 0;           // global
  uint64_t step = 0;
  uint64_t keyset = 0;    // which replicated shards the rank holds (their keys, sizes, offsets)
  uint64_t digest = 0;    // its copy of all of them (their digests, in key order)
  uint32_t shards = 0;    // how many
  uint32_t expect = 0;    // the fewest replicas any of them has: how many folds of this keyset to wait for
};

// One replicated shard's digest, as a rank's snapshot reported it (trace::kReplicaDigest).
struct ShardDigestEntry {
  uint64_t key = 0;
  uint64_t digest = 0;
  uint32_t replicas = 0;
  uint64_t bytes = 0;
  uint64_t tensor_offset = trace::kNoOffset;  // in the tensor; kNoOffset: a box
  std::string name;                           // the tensor's ("" when the rank did not say it)
};

// A rank's digests of one snapshot, shard by shard: what a node sends when the leader asks for
// them (its fold differs from its replicas'), so the verdict names the tensors and byte ranges.
struct DigestDetail {
  int rank = 0;  // global
  uint64_t step = 0;
  std::vector<ShardDigestEntry> shards;  // by key
};

// A node's ranks' values of a replicated training signal at a step (one identical by construction
// across the ranks of a replica group that spans nodes: the gradient norm after its all-reduce), as
// bits, for the leader to compare across the group (agent/detectors/job_signal_detector.h).
struct ValueReport {
  std::string scalar;   // its name (1 to 256 bytes)
  int group = 0;        // the replica group (TrainingSignalConfig::replica_group_size)
  uint64_t step = 0;
  std::vector<std::pair<int, uint64_t>> bits;  // (global rank, the double's bits), by rank
};

// The leader asks for the details of `ranks` at `step` (rounds/R/digest_queries/ in etcd).
struct DigestQuery {
  uint64_t step = 0;
  std::vector<int> ranks;  // global
};

// One summary as sent (formats/SPEC.md §17): its ranks, numbered by the sender (1, 2, ... per
// agent), and the summary it follows (`base`: the collectives are those after the ones summary
// `base` carried; 0: a whole window, a summary that stands alone); with version 3, the snapshots'
// digest folds and the details the leader asked for.
struct SummaryFrame {
  uint64_t number = 0;
  uint64_t base = 0;
  int64_t unix_ms = 0;  // when it was written, by the writer's wall clock
  std::vector<RankProgress> ranks;
  std::vector<DigestFold> folds;
  std::vector<DigestDetail> details;
  std::vector<ValueReport> values;
};

// The binary summary of §17 stamped with the wall-clock time `unix_ms`, and back: the ages in a
// summary read at `now_unix_ms` grow by the time it spent in transit (clocks of the nodes assumed in
// step, as NTP keeps them to milliseconds; never negative). Corruption naming `what` for bytes that
// are not a summary or hold a value outside the bounds of §17 (the format, field by field). The
// reader also takes the JSON summaries agents wrote before (§17.1), as number 0, base 0.
std::string EncodeProgress(const std::vector<RankProgress>& ranks, int64_t unix_ms, uint64_t number = 0,
                           uint64_t base = 0);
// The whole frame: with folds, details or values, version 3 (their section after the ranks), else
// version 2 (as EncodeProgress).
std::string EncodeSummary(const SummaryFrame& frame);
Result<SummaryFrame> DecodeSummary(std::string_view bytes, const std::string& what, int64_t now_unix_ms);
Result<std::vector<RankProgress>> DecodeProgress(std::string_view bytes, const std::string& what, int64_t now_unix_ms);
// The number of the summary `bytes` (0 when it is not a binary summary), and in `*base` the
// summary it follows, without decoding it.
uint64_t SummaryNumber(std::string_view bytes, uint64_t* base = nullptr);
// The JSON summary of §17.1, as agents wrote it before issue 36 (lifeline-etcd-load replays them).
std::string EncodeProgressJson(const std::vector<RankProgress>& ranks, int64_t unix_ms);

// The leader's copy of every node's summaries: a summary that follows another (`base`) adds its
// collectives to the window the node's earlier ones left (at most kSamplesPerComm per rank and
// communicator, each collective once); one that stands alone replaces it. What the leader's
// job-wide view reads, as if each node had sent its whole window each time.
//
// Thread safety: none; the agent's loop.
class SummaryMerger {
 public:
  // `frame` of node `node` as DecodeSummary read it at `read_unix_ms`.
  void Merge(const std::string& node, SummaryFrame frame, int64_t read_unix_ms);
  // Every node's ranks, ages as of `now_unix_ms` (nodes in the order of their names).
  void View(int64_t now_unix_ms, std::vector<RankProgress>* out) const;
  void Clear() { nodes_.clear(); }
  size_t nodes() const { return nodes_.size(); }
  // Summaries merged whose base this copy did not hold (collectives missed: the sender reconnected).
  uint64_t gaps() const { return gaps_; }

 private:
  struct Node {
    uint64_t number = 0;
    int64_t read_unix_ms = 0;  // the ages below are as of this time
    std::vector<RankProgress> ranks;
  };
  std::map<std::string, Node> nodes_;
  uint64_t gaps_ = 0;
};

// Milliseconds since the Unix epoch, now, by this node's clock (shifted by
// LIFELINE_TEST_CLOCK_OFFSET_MS when set: the skew tests' way to give a node a clock that is off).
int64_t UnixMillisNow();

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_PROGRESS_H_
