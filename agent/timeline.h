// The per-job state lifeline-agent derives from its ranks' trace events: the one event model that
// every detector, the metrics and the control socket read. The agent applies each event exactly
// once (Apply, in the order its rank recorded them; ranks interleave arbitrarily) and each reaped
// exit (RankExited); readers look at the state, and at the TimelineChange that Apply returns when
// they act on transitions (a step closed, a collective every member has entered).
//
// Communicators: comm 0 is the world, so every rank takes part in each of its collectives. Any
// other comm's members are the ranks seen beginning a collective on it.
//
// Bounds: per comm, the newest kMaxSeqsPerComm collectives are kept (open on a rank, or across
// ranks); older ones are forgotten (a rank that never reports them, e.g. events lost to a full
// ring). Per rank, the newest `saves_kept` checkpoint saves.
//
// Ranks: the ranks this agent supervises, by local index 0..world-1 (its node's share of the job);
// their global ranks in the job are rank_base..rank_base+world-1. Everything here is by local
// index; GlobalRank names a rank the way the job (and a person reading an anomaly) knows it.
//
// Thread safety: none; one thread (the agent's poll loop) applies and reads. Events from ranks
// outside [0, world) are ignored.
#ifndef LIFELINE_AGENT_TIMELINE_H_
#define LIFELINE_AGENT_TIMELINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "lifeline/trace.h"

namespace lifeline::agent {

// A collective a rank has begun and not ended.
struct OpenCollective {
  uint64_t begin_ns = 0;
  trace::Op op = trace::Op::kOther;
  uint64_t step = trace::kNoStep;
  bool posted = false;  // kCollectivePosted seen: the rank handed its part over
};

// One collective (comm, seq) across the ranks.
struct CollectiveRecord {
  trace::Op op = trace::Op::kOther;  // from the first kCollectiveBegin seen
  uint64_t step = trace::kNoStep;
  std::vector<uint64_t> begin_ns, posted_ns, end_ns;  // per rank; 0: not yet
  int begun = 0;                // ranks whose begin_ns is set
  bool entered_by_all = false;  // every live member had begun it at some kCollectiveBegin
  bool exited_by_all = false;   // every live member had begun and ended it at some kCollectiveEnd
  // Where the look for a member not yet in (or out) resumes: the members below `next` were in (or
  // out) or dead when last looked at, and stay so (a rank's times are set once; a dead rank stays
  // dead), so a collective of N ranks costs O(N) over all its events, not O(N) per event. A
  // communicator whose member list grew since is looked at from its start again.
  struct Scan {
    int next = 0;          // rank
    size_t members = 0;    // the member list's size then (communicators other than the world)
    bool any_live = false; // a member passed was alive
  };
  Scan enter_scan, exit_scan;
};

// One checkpoint save of a rank, from Save (kCheckpointBegin) to durable (kCheckpointPersisted).
struct CheckpointSave {
  uint64_t step = trace::kNoStep;
  uint64_t begin_ns = 0;
  uint64_t persisted_ns = 0;  // 0: not yet
  uint64_t interval_ns = 0;   // since the previous save began; 0: the first save seen
};

struct RankTimeline {
  bool alive = true;      // no exit reaped
  bool started = false;   // kProcessStart seen
  bool finished = false;  // kProcessExit seen: an orderly end, no more steps expected
  uint64_t resumed_from = trace::kNoStep;  // kProcessStart's step
  trace::ResumeSource resumed_source = trace::ResumeSource::kUnknown;  // kProcessStart's seq
  uint64_t events = 0;
  uint64_t last_event_ns = 0;  // the latest event time (heartbeats included); 0: none yet
  uint64_t step = trace::kNoStep;  // the last step begun
  bool began_step = false;         // a step begun in this launch
  uint64_t first_step = trace::kNoStep;  // the first step begun in this launch: where it resumed
  bool step_open = false;          // begun, not ended
  uint64_t step_begin_ns = 0;
  uint64_t step_first_collective_ns = 0;  // the open step's first kCollectiveBegin; 0: none yet
  uint64_t committed_step = trace::kNoStep;  // the newest kCheckpointCommitted
  uint64_t persisted_step = trace::kNoStep;  // the newest kCheckpointPersisted
  // The newest save that failed (kCheckpointFailed) with no save of that step or a later one
  // persisted since, and its StatusCode: a rank that ends so never saved its final state.
  uint64_t failed_save_step = trace::kNoStep;
  uint64_t failed_save_code = 0;
  // The StatusCode of the newest kCheckpointFailed, of any step (also one a Checkpointer reports
  // when it cannot open its directory), until a save persists; 0: none.
  uint64_t save_failure_code = 0;
  std::map<uint32_t, uint64_t> last_begun;  // per comm: the highest seq begun
  // Per comm, per seq. A rank's End of seq S also closes its older open seqs there (their End was
  // lost, or will come late): collectives on one communicator complete in order.
  std::map<uint32_t, std::map<uint64_t, OpenCollective>> open;
  // Per comm, per seq: closed so by a later End, their own End not seen yet. Python ranks record
  // an End when the user waits on the work, in any order; its duration is still measured then.
  std::map<uint32_t, std::map<uint64_t, OpenCollective>> closed_early;
  std::deque<CheckpointSave> saves;  // by begin time
};

// What one Apply did, for readers that act on transitions rather than state. `record` points into
// the timeline and is valid until the next Apply, RankExited or Reset.
struct TimelineChange {
  int rank = -1;  // -1: the event was ignored
  const trace::Event* event = nullptr;
  // kStepEnd: how long the step it closed lasted, when one was open.
  std::optional<uint64_t> step_closed_ns;
  // kCollectiveEnd: the collective it closed on this rank, when it was open, or when a later
  // seq's End had already closed it (then `closed_early`).
  std::optional<OpenCollective> collective_closed;
  bool closed_early = false;
  // kCollectiveBegin/Posted/End: the collective across ranks.
  const CollectiveRecord* record = nullptr;
  bool first_begin = false;     // kCollectiveBegin that set this rank's begin in `record`
  bool entered_by_all = false;  // this kCollectiveBegin completed `record`'s entry
  bool exited_by_all = false;   // this kCollectiveEnd completed `record`'s exit
  bool first_collective_of_step = false;  // kCollectiveBegin: the rank's first in its open step
};

class Timeline {
 public:
  static constexpr size_t kMaxSeqsPerComm = 512;
  static constexpr size_t kDefaultSavesKept = 64;

  explicit Timeline(size_t saves_kept = kDefaultSavesKept);

  // A new launch of `world` ranks, global ranks `rank_base`.. (0 on a single node): everything
  // about the previous one is forgotten.
  void Reset(int world, int rank_base = 0);
  // Applies `event` of `rank`. The returned change refers to `event`, which must outlive its use.
  TimelineChange Apply(int rank, const trace::Event& event);
  // `rank`'s process ended (expected or not): it is no longer a live member of anything.
  void RankExited(int rank);
  // Events of `rank` were lost (its ring was full: the agent stalled, or fell behind): what the
  // timeline holds open for it is stale. Its open collectives and step are forgotten (in the
  // collective records its part counts as ended at `now_ns`, unknown how), and it counts as heard
  // from at `now_ns`; its next events open new ones. Detectors then judge only what they saw.
  void MarkGap(int rank, uint64_t now_ns);

  int world() const { return static_cast<int>(ranks_.size()); }
  int rank_base() const { return rank_base_; }
  // The job's rank of local rank `local`.
  int GlobalRank(int local) const { return rank_base_ + local; }
  const RankTimeline& rank(int r) const { return ranks_[static_cast<size_t>(r)]; }
  const std::vector<RankTimeline>& ranks() const { return ranks_; }
  int alive_count() const;
  // The ranks taking part in `comm`, ascending (see the comment at the top).
  std::vector<int> Members(uint32_t comm) const;
  // The collectives seen on `comm` across ranks, by seq (the newest kMaxSeqsPerComm).
  const std::map<uint64_t, CollectiveRecord>* Collectives(uint32_t comm) const;

 private:
  CollectiveRecord* Touch(uint32_t comm, uint64_t seq);
  void AddSave(RankTimeline* r, CheckpointSave save);
  bool AllLiveMembers(uint32_t comm, CollectiveRecord& rec, bool need_end) const;

  size_t saves_kept_;
  int rank_base_ = 0;
  std::vector<RankTimeline> ranks_;
  std::map<uint32_t, std::set<int>> members_;  // comm != 0: ranks seen beginning on it
  std::map<uint32_t, std::map<uint64_t, CollectiveRecord>> collectives_;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_TIMELINE_H_
