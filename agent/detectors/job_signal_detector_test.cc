// JobSignalDetector, the leader's comparison of a replicated training signal across nodes: a rank
// whose norm differs from the rest of its group is named even when no node holds two members of
// the group; values that agree, or that come twice, raise nothing; a group short of a rank is
// judged at the hold.
#include "agent/detectors/job_signal_detector.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/event_simulator.h"

namespace lifeline::agent {
namespace job_signal_detector_test {

using simulation::kMs;
using simulation::kSec;

uint64_t Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// Node `rank`'s report (one rank a node) of the norm at `step`.
ValueReport Norm(int rank, uint64_t step, double value) { return {"grad_norm", 0, step, {{rank, Bits(value)}}}; }

TEST(JobSignalDetector, ARankWhoseNormDiffersOnItsOwnNodeIsNamedAcrossNodes) {
  JobSignalDetector leader(TrainingSignalConfig{}, 3);
  std::vector<Anomaly> out;
  uint64_t now = kSec;
  for (uint64_t step = 1; step <= 12; ++step) {
    now += 100 * kMs;
    for (int r = 0; r < 3; ++r) {
      const double norm = 2.0 + 0.01 * step;
      // Rank 2's last bit differs at steps 7 and 8 (one episode), and again at 11 (another).
      const bool odd = r == 2 && (step == 7 || step == 8 || step == 11);
      leader.Add(Norm(r, step, odd ? std::nextafter(norm, 10.0) : norm), now);
      if (r == 2) leader.Add(Norm(r, step, odd ? std::nextafter(norm, 10.0) : norm), now);  // sent twice
    }
    leader.Poll(now, &out);
  }
  ASSERT_EQ(out.size(), 2u);
  for (const Anomaly& a : out) {
    EXPECT_EQ(a.kind, "disagreement");
    EXPECT_EQ(a.ranks, std::vector<int>{2});
    EXPECT_EQ(a.evidence["compared_by"], "leader");
    EXPECT_EQ(a.evidence["ranks_compared"], 3);
    EXPECT_NE(a.message.find("grad_norm differs across the replicas of group 0"), std::string::npos) << a.message;
  }
  EXPECT_EQ(out[0].step, 7u);
  EXPECT_EQ(out[1].step, 11u);
  EXPECT_EQ(leader.compared(), 12u);
}

TEST(JobSignalDetector, AGroupShortOfARankIsJudgedAtTheHold) {
  TrainingSignalConfig config;
  config.replica_group_size = 3;
  JobSignalDetector leader(config, 6);
  std::vector<Anomaly> out;
  leader.Add({"grad_norm", 1, 5, {{3, Bits(1.5)}, {4, Bits(1.25)}}}, kSec);  // rank 5 never reports
  leader.Add({"grad_norm", 0, 5, {{0, Bits(1.0)}, {1, Bits(1.0)}, {2, Bits(1.0)}}}, kSec);
  leader.Poll(kSec + kSec, &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(leader.compared(), 1u);  // group 0 was whole
  leader.Poll(kSec + 6 * kSec, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, (std::vector<int>{3, 4}));  // two that differ: no majority
  EXPECT_TRUE(out[0].evidence["majority"].is_null());
}

}  // namespace job_signal_detector_test
}  // namespace lifeline::agent
