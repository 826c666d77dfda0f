// The collective of lifeline-drill when its world spans nodes: a sum-allreduce over TCP through
// the rank of global rank 0, which listens on MASTER_PORT (every address) while the others connect
// to MASTER_ADDR:MASTER_PORT, as torchrun's rendezvous store does.
//
// The root receives every contribution whole and adds them in rank order 0..N-1, exactly as
// ShmAllReduce does, so a job on two nodes ends with the bits of the same job on one node; then it
// sends the sum to every rank. That is a star (the root moves 2·(N-1)·count floats per collective):
// right for a fault-drill job of a few ranks per node, not a model of NCCL's rings.
//
// Joining: each rank introduces itself with its rank, the world size, the count and the launch's
// key (LIFELINE_LAUNCH_ID); the root refuses a peer of another launch, world, count or a rank
// already taken, with a message the peer reports, and starts the group once all N-1 are in. All of
// this is bounded by `join_timeout_seconds`; the collectives are not: a peer that never posts keeps
// the others waiting (the hang a supervisor must detect), and a peer whose connection closes turns
// Finish into an error naming it.
//
// Byte order is the machine's own: the nodes of one drill share an architecture.
// Thread safety: one TcpAllReduce is used by one thread at a time.
#ifndef LIFELINE_AGENT_DRILL_TCP_ALLREDUCE_H_
#define LIFELINE_AGENT_DRILL_TCP_ALLREDUCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lifeline/status.h"

namespace lifeline::drill {

struct TcpAllReduceOptions {
  std::string master_addr = "127.0.0.1";  // host name or address of global rank 0
  uint16_t master_port = 0;
  std::string launch_key;  // the same on every rank of one launch; at most 256 bytes
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t count = 0;  // floats each rank contributes to every collective
  double join_timeout_seconds = 60;
};

class TcpAllReduce {
 public:
  static constexpr uint32_t kMaxWorldSize = 4096;

  // Listens (rank 0) or connects and waits until every rank has joined. InvalidArgument for bad
  // options or when the root refused this rank (its reason in the message); Unavailable when the
  // group is not complete within the timeout (naming the address and, on the root, the missing
  // ranks); IOError when the operating system refuses.
  static Result<std::unique_ptr<TcpAllReduce>> Join(const TcpAllReduceOptions& options);
  ~TcpAllReduce();
  TcpAllReduce(const TcpAllReduce&) = delete;
  TcpAllReduce& operator=(const TcpAllReduce&) = delete;

  // Keeps `data` (count floats) as this rank's contribution to the next collective. Never waits.
  void Post(const float* data);
  // Sends the contribution, waits for the sum of every rank's in rank order 0..N-1 and writes it
  // into `out` (may be the posted buffer). Waits forever for a peer that never posts; IOError
  // naming the rank whose connection closed or failed.
  Status Finish(float* out);
  // Every rank's `word`, indexed by rank (a collective ordered with the others).
  Result<std::vector<uint64_t>> AllGather(uint64_t word);

  uint64_t completed() const { return completed_; }
  uint32_t rank() const { return rank_; }
  uint32_t world_size() const { return world_size_; }

 private:
  TcpAllReduce(uint32_t rank, uint32_t world_size, uint64_t count, std::vector<int> fds);
  // One collective of `kind` (sum of floats or gather of words): `mine` (bytes) from every rank,
  // combined by the root, the result into `out`.
  Status Exchange(uint64_t kind, const void* mine, size_t bytes, void* out);

  uint32_t rank_;
  uint32_t world_size_;
  uint64_t count_;
  // Rank 0: the connection of rank r at fds_[r] (fds_[0] unused); other ranks: fds_[0], the root.
  std::vector<int> fds_;
  std::vector<float> posted_;
  std::vector<float> scratch_;
  bool has_posted_ = false;
  uint64_t completed_ = 0;
};

}  // namespace lifeline::drill

#endif  // LIFELINE_AGENT_DRILL_TCP_ALLREDUCE_H_
