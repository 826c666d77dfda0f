// DeadRankDetector on synthetic streams and by hand (agent/detectors/event_simulator.h).
#include "agent/detectors/dead_rank_detector.h"

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"

namespace lifeline::agent {
namespace {

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

}  // namespace
}  // namespace lifeline::agent
