// hang, judged over the whole job: the collectives that ranks on other nodes hold up. Run by the
// round's leader (agent/rendezvous.h) on every node's progress summary (agent/progress.h), where
// each node's own HangDetector sees only its ranks: a collective that every local rank joined is
// stuck "with no rank standing out" on one node while the rank holding it up sits on another.
//
// Per communicator it follows the front, the highest seq any member began. When the front has
// stood for the timeout with some members in it (by the members' own time in it, as the summaries
// carry it, or else since this detector first saw it), the culprits are, in order: the members that
// never began it; else those in it that never posted their part while others did; else (every
// member in it and posted) all of them, no rank standing out. Reported once per collective.
//
// Members: every live rank for communicator 0 (the world: every rank of the round, a rank never
// read counting as one that began nothing, as stale as the round is old), the ranks that ever
// reported it for any other. A communicator with a dead member is left to the dead-rank detector.
//
// A hang with any member known only from a summary that stopped coming (older than
// kStaleSummarySeconds: its node published none since), culprit or not, is held for up to
// `stale_hold_seconds`:
// the node is likely gone, and its lease running out will name it node_lost, the right verdict;
// a node that comes back, or outlives the hold, is judged as before. Ranks read before and
// missing from a read (their node's summary is no longer read once its lease ran out) are members
// that began nothing, as stale as their last summary has grown since: the others waiting for them
// are not "every member joined", and the verdict on them is held the same way.
#ifndef LIFELINE_AGENT_DETECTORS_JOB_HANG_DETECTOR_H_
#define LIFELINE_AGENT_DETECTORS_JOB_HANG_DETECTOR_H_

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "agent/detector.h"
#include "agent/progress.h"

namespace lifeline::agent {

class JobHangDetector {
 public:
  // Summaries are put about once a second and read once a second: one older than this is not
  // being renewed.
  static constexpr double kStaleSummarySeconds = 3.0;

  explicit JobHangDetector(double timeout_seconds, double stale_hold_seconds = 0)
      : timeout_ns_(static_cast<uint64_t>(timeout_seconds * 1e9)), stale_hold_seconds_(stale_hold_seconds) {}

  // A new round of `world` ranks (0: not known): forget the previous one.
  void Reset(int world = 0) {
    fronts_.clear();
    seen_.clear();
    world_ = world;
    round_began_ns_ = 0;
  }

  // The newest progress of every rank of the job, read at `now_ns`.
  void Poll(const std::vector<RankProgress>& ranks, uint64_t now_ns, std::vector<Anomaly>* out);

 private:
  struct Front {
    uint64_t seq = 0;
    uint64_t since_ns = 0;
    bool reported = false;
  };
  struct Seen {
    uint64_t read_ns = 0;      // the last read that had the rank
    double age_seconds = 0;    // its summary's age then
    std::vector<uint32_t> comms;
  };
  const uint64_t timeout_ns_;
  const double stale_hold_seconds_;
  std::map<uint32_t, Front> fronts_;
  std::map<int, Seen> seen_;  // every rank read in this round
  int world_ = 0;                // ranks of the round, read or not
  uint64_t round_began_ns_ = 0;  // the first poll of the round
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_DETECTORS_JOB_HANG_DETECTOR_H_
