// DeadRankDetector on synthetic streams and by hand (agent/detectors/event_simulator.h).
#include "agent/detectors/dead_rank_detector.h"

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"

namespace lifeline::agent {
namespace dead_rank_detector_test {

using namespace simulation;

TEST(DeadRankDetectorTest, SigkillNamesRankSignalAndStep) {
  // Rank 1 stops recording in step 70: it was killed there.
  SimDriver driver(StalledSim(100, Stall::kNeverJoins, 1, 70));
  driver.RunPast(50 * kMs);
  driver.Exit(1, SIGKILL, /*expected=*/false);

  const auto dead = driver.OfKind("dead");
  ASSERT_EQ(dead.size(), 1u) << Describe(driver.all());
  EXPECT_EQ(dead[0].ranks, std::vector<int>{1});
  EXPECT_EQ(dead[0].step, 70u);
  EXPECT_EQ(dead[0].evidence["signal"], SIGKILL);
  EXPECT_EQ(dead[0].evidence["signal_name"], "SIGKILL");
  EXPECT_EQ(dead[0].message, "rank 1 died (SIGKILL) at step 70");
  EXPECT_EQ(dead[0].detected_ns, driver.now());

  // The same death reported twice by the agent is still one anomaly.
  driver.Exit(1, SIGKILL, false);
  EXPECT_EQ(driver.OfKind("dead").size(), 1u);
}

TEST(DeadRankDetectorTest, NonZeroExitCodeFiresZeroAndExpectedDoNot) {
  DeadRankDetector dead;
  Driver driver({&dead}, 4);
  driver.Observe(2, Ev(EventType::kStepBegin, 1 * kSec, 12));
  std::vector<Anomaly> out;
  driver.Exit(0, 0, /*expected=*/false, 2 * kSec, &out);            // finished early
  driver.Exit(1, SIGTERM, /*expected=*/true, 2 * kSec, &out);       // the agent stopping it
  driver.Exit(3, 3 << 8, /*expected=*/true, 2 * kSec, &out);
  EXPECT_TRUE(out.empty()) << Describe(out);
  driver.Exit(2, 3 << 8, /*expected=*/false, 2 * kSec, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>{2});
  EXPECT_EQ(out[0].evidence["exit_code"], 3);
  EXPECT_EQ(out[0].step, 12u);
  EXPECT_EQ(out[0].message, "rank 2 exited with status 3 at step 12");
}

// On a node whose ranks are the job's 4..7, local rank 1 is rank 5 everywhere a person reads it.
TEST(DeadRankDetectorTest, NamesTheGlobalRankOnANodeOfALargerJob) {
  DeadRankDetector dead;
  Driver driver({&dead}, 4, /*rank_base=*/4);
  driver.Observe(1, Ev(EventType::kStepBegin, 1 * kSec, 12));
  std::vector<Anomaly> out;
  driver.Exit(1, SIGKILL, /*expected=*/false, 2 * kSec, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>{5});
  EXPECT_EQ(out[0].message, "rank 5 died (SIGKILL) at step 12");
}

// Issue 32, item 12: a rank that returned 0 early was never named; its peer, which then failed in
// its collective with it, was blamed. The rank that left early is the culprit, the failure its echo.
TEST(DeadRankDetectorTest, ARankThatLeftEarlyIsNamedWhenItsPeerThenFailsInACollective) {
  DeadRankDetector dead;
  Driver driver({&dead}, 3);
  for (int r = 0; r < 3; ++r) driver.Observe(r, Ev(EventType::kStepBegin, 1 * kSec, 5));
  std::vector<Anomaly> out;
  driver.Exit(1, 0, /*expected=*/false, 2 * kSec, &out);  // returns from its script at step 5
  EXPECT_TRUE(out.empty()) << Describe(out);
  // Rank 0 waits for it in the next allreduce, which raises: exit 1.
  driver.Observe(0, Ev(EventType::kStepBegin, 2 * kSec, 6));
  driver.Observe(0, Coll(EventType::kCollectiveBegin, 2 * kSec + 10 * kMs, 6, 1, Op::kAllReduce));
  driver.Exit(0, 1 << 8, /*expected=*/false, 3 * kSec, &out);
  ASSERT_EQ(out.size(), 1u) << Describe(out);
  EXPECT_EQ(out[0].kind, "dead");
  EXPECT_EQ(out[0].ranks, std::vector<int>{1});
  EXPECT_EQ(out[0].step, 5u);
  EXPECT_EQ(out[0].evidence["early_exit"], true);
  EXPECT_EQ(out[0].evidence["echo"]["rank"], 0);
  EXPECT_EQ(out[0].message, "rank 1 exited with status 0 at step 5 while its peers were still training; rank 0 "
                            "exited with status 1 in a collective afterwards, an echo of that early exit");
  // A rank failing on its own (in its step, before any collective) is still named itself.
  out.clear();
  driver.Observe(2, Ev(EventType::kStepEnd, 3 * kSec, 5));
  driver.Observe(2, Ev(EventType::kStepBegin, 3 * kSec, 6));
  driver.Exit(2, SIGSEGV, false, 4 * kSec, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>{2});
}

// The usual end: ranks finish one after the other, nobody fails, nothing is raised.
TEST(DeadRankDetectorTest, RanksFinishingOneAfterAnotherRaiseNothing) {
  DeadRankDetector dead;
  Driver driver({&dead}, 2);
  std::vector<Anomaly> out;
  driver.Exit(1, 0, false, 2 * kSec, &out);
  driver.Exit(0, 0, false, 3 * kSec, &out);
  EXPECT_TRUE(out.empty()) << Describe(out);
}

}  // namespace dead_rank_detector_test
}  // namespace lifeline::agent
