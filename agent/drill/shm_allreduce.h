// The collective of lifeline-drill: a sum-allreduce over the ranks of one node through a POSIX
// shared-memory segment, with no network and no MPI, so that a fault drill needs nothing but the
// agent and the drill binary.
//
// The segment holds a header, one claim word per rank, and two sets of per-rank slots used
// alternately by successive collectives: a rank may post collective k+1 into one set while a slower
// peer is still summing collective k out of the other, and one barrier per collective suffices
// (a rank can only reach collective k+2, which reuses the set, after every rank has arrived at k+1,
// that is, after every rank has finished reading k).
//
// Joining: rank 0 unlinks stale segments (`stale_prefix`) and creates the segment; the other ranks
// wait for it to appear. Each rank claims its slot with its pid; once every slot is claimed by a live
// process the group is complete and rank 0 unlinks the name at once (the mappings stay), so a
// launch that is killed later leaves nothing behind in /dev/shm. A rank that finds its slot already
// claimed by a dead process, or a dead peer in a complete-looking group, has opened a segment left
// over by an earlier launch that used the same name: it waits for rank 0 to replace it. All of
// this is bounded by `join_timeout_seconds`; the collectives themselves are not (see Finish).
//
// Waiting: a waiting rank sleeps on a futex in the segment with a 1 ms timeout; the last rank to
// arrive wakes the others. It never spins, so four ranks on two cores do not starve each other,
// and a rank whose peer never arrives keeps waiting at negligible CPU cost.
//
// Thread safety: one ShmAllReduce is used by one thread at a time. The processes of the group
// synchronise through the segment alone.
#ifndef LIFELINE_AGENT_DRILL_SHM_ALLREDUCE_H_
#define LIFELINE_AGENT_DRILL_SHM_ALLREDUCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lifeline/internal/shared_memory.h"
#include "lifeline/status.h"

namespace lifeline::drill {

struct ShmAllReduceOptions {
  // shm_open name without the leading '/': letters, digits, '.', '_' and '-' only.
  std::string name;
  // Rank 0 first unlinks every segment in /dev/shm whose name starts with this (typically the
  // job's prefix, so that segments of earlier launches go). Empty: only `name` itself.
  std::string stale_prefix;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t count = 0;  // floats each rank contributes to every collective
  double join_timeout_seconds = 60;
};

class ShmAllReduce {
 public:
  static constexpr uint32_t kMaxWorldSize = 4096;

  // Creates (rank 0) or attaches to the segment and waits until every rank has joined.
  // InvalidArgument for bad options or a segment made for another world size or count;
  // Unavailable when the group is not complete within the timeout (the message names the segment
  // and the missing ranks); IOError when the operating system refuses.
  static Result<std::unique_ptr<ShmAllReduce>> Join(const ShmAllReduceOptions& options);
  ~ShmAllReduce();
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // Writes `data` (count floats) as this rank's contribution to the next collective. Never waits.
  void Post(const float* data);
  // Waits until every rank has posted this collective, then writes into `out` (count floats; may
  // be the posted buffer) the element-wise sum of the contributions added in rank order 0..N-1, so
  // that every rank gets bit-identical results. Waits forever when a peer never posts: that is the
  // hang a supervisor has to detect.
  void Finish(float* out);
  void AllReduceSum(const float* in, float* out) {
    Post(in);
    Finish(out);
  }
  // Every rank's `word`, indexed by rank (a collective of its own, ordered with the others; waits
  // forever like Finish). For checks such as "did every rank resume from the same step".
  std::vector<uint64_t> AllGather(uint64_t word);

  // Collectives (Finish and AllGather) completed by this rank.
  uint64_t completed() const { return completed_; }
  uint32_t rank() const { return rank_; }
  uint32_t world_size() const { return world_size_; }
  uint64_t count() const { return count_; }
  const std::string& name() const { return name_; }

 private:
  struct Layout;
  ShmAllReduce(std::string name, uint32_t rank, uint32_t world_size, uint64_t count, MappedRegion region);
  // The barrier of collective number completed_ + 1.
  void Arrive();
  float* Slot(uint32_t set, uint32_t rank) const;
  uint64_t* Word(uint32_t set, uint32_t rank) const;

  std::string name_;
  uint32_t rank_;
  uint32_t world_size_;
  uint64_t count_;
  MappedRegion region_;
  uint64_t completed_ = 0;
  bool posted_ = false;
};

// `text` with every character that may not appear in ShmAllReduceOptions::name (and '.', which
// callers use as a separator) replaced by '_'; at most 80 characters; "_" when empty.
std::string ShmNameComponent(std::string_view text);

}  // namespace lifeline::drill

#endif  // LIFELINE_AGENT_DRILL_SHM_ALLREDUCE_H_
