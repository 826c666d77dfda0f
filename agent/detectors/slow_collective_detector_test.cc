// SlowCollectiveDetector on synthetic streams with slowed collectives
// (agent/detectors/event_simulator.h).
#include "agent/detectors/slow_collective_detector.h"

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"

namespace lifeline::agent {
namespace slow_collective_detector_test {

using namespace simulation;

TEST(SlowCollectiveDetectorTest, LatePosterInsideTheCollectiveIsNamed) {
  Sim sim;
  sim.steps = 100;
  sim.extra_post = [](int r, int k) { return r == 1 && k >= 60 ? 0.030 : 0.0; };
  SimDriver driver(sim);
  driver.RunPast(1 * kSec);
  // Everyone began on time: no straggler.
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "slow_collective");
  EXPECT_EQ(a.ranks, std::vector<int>{1});
  EXPECT_EQ(a.op, "allreduce");
  EXPECT_EQ(a.comm, 0u);
  // Fired as soon as half of the 10 recent collectives were slow: the medians sit between.
  EXPECT_GT(a.evidence["posted_delay_median_seconds"]["1"].get<double>(), 0.010);
  EXPECT_LT(a.evidence["peers_posted_delay_median_seconds"].get<double>(), 0.001);
  EXPECT_NEAR(a.evidence["baseline_median_seconds"].get<double>(), 0.0053, 0.001);
  EXPECT_GT(a.evidence["recent_median_seconds"].get<double>(), 2 * 0.0053);
  ASSERT_TRUE(a.step.has_value());
  EXPECT_GE(*a.step, 64u);
  EXPECT_LE(*a.step, 70u);
  EXPECT_NE(a.message.find("rank 1 posts its part"), std::string::npos) << a.message;
}

TEST(SlowCollectiveDetectorTest, WholeCommunicatorSlowNamesNoRank) {
  Sim sim;
  sim.steps = 100;
  sim.op_seconds = [](int k) { return k >= 60 ? 0.020 : 0.005; };
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  SimDriver driver(sim, {&slow});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_TRUE(driver.all()[0].ranks.empty());
  EXPECT_NE(driver.all()[0].message.find("whole communicator"), std::string::npos) << driver.all()[0].message;
}

// The whole communicator slows first (on a saturated host, say: that alarm is not paged), then one
// rank's link: the second alarm names the rank at once instead of waiting out the first's cooldown,
// and the link slow from then on raises nothing more.
TEST(SlowCollectiveDetectorTest, ARankNamedAfterAWholeCommunicatorAlarmIsNotHeldByItsCooldown) {
  Sim sim;
  sim.steps = 200;
  sim.op_seconds = [](int k) { return k >= 60 ? 0.020 : 0.005; };
  sim.extra_post = [](int r, int k) { return r == 1 && k >= 100 ? 0.060 : 0.0; };
  SlowCollectiveDetector slow(SlowCollectiveConfig{});  // cooldown 60 s: longer than the run
  SimDriver driver(sim, {&slow});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 2u) << Describe(driver.all());
  EXPECT_TRUE(driver.all()[0].ranks.empty()) << Describe(driver.all());
  EXPECT_EQ(driver.all()[1].ranks, std::vector<int>{1}) << Describe(driver.all());
  ASSERT_TRUE(driver.all()[1].step.has_value());
  EXPECT_GE(*driver.all()[1].step, 100u);
  EXPECT_LE(*driver.all()[1].step, 110u);
}

TEST(SlowCollectiveDetectorTest, SmallSlowdownUnderTheFactorStaysSilent) {
  Sim sim;
  sim.steps = 200;
  sim.op_seconds = [](int k) { return k >= 60 ? 0.008 : 0.005; };  // x1.6 < x2
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  SimDriver driver(sim, {&slow});
  driver.RunPast(1 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

// How a late rank looks on a small host (lifeline-drill, 4 ranks on 2 cores): the peers that
// waited for it slept, and once it arrives they are woken one after another while it is already
// computing its next step on one of the cores, so they leave the collective 1, 2 and 8 ms after it
// completed, the late rank itself at once. From `late` on, `late_rank` waits for no one.
double WakeUps(int late_rank, int rank) {
  if (rank == late_rank) return 0.0;
  const int place = rank < late_rank ? rank : rank - 1;  // 0, 1, 2 among the ranks woken
  return place == 2 ? 0.008 : 0.001 * (place + 1);
}

// A compute straggler: rank 3 arrives 50 ms late into every allreduce from step 30 and its peers
// leave late as above. Timed to the last exit, the allreduce would have slowed from 2 ms to 10;
// timed to the median member's exit it did not: the straggler is the one anomaly.
TEST(SlowCollectiveDetectorTest, LateArrivalIsAStragglerAndNotASlowCollective) {
  Sim sim;
  sim.steps = 120;
  sim.op = 0.002;
  sim.extra_compute = [](int r, int k) { return r == 3 && k >= 30 ? 0.050 : 0.0; };
  sim.extra_end = [](int r, int k) { return k >= 30 ? WakeUps(3, r) : 0.0; };
  SimDriver driver(sim);
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].kind, "straggler");
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{3});
}

// A slow link under the same wake-ups: rank 1 enters on time but posts its part 30 ms late from
// step 60, so everyone leaves late, the median member included. Named, as without the wake-ups.
TEST(SlowCollectiveDetectorTest, SlowLinkIsStillNamedWhenWaitersLeaveLate) {
  Sim sim;
  sim.steps = 120;
  sim.op = 0.002;
  sim.extra_post = [](int r, int k) { return r == 1 && k >= 60 ? 0.030 : 0.0; };
  sim.extra_end = [](int r, int k) { return k >= 60 ? WakeUps(1, r) : 0.0; };
  SimDriver driver(sim);
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "slow_collective");
  EXPECT_EQ(a.ranks, std::vector<int>{1});
  EXPECT_EQ(a.evidence["trigger"], "communicator") << a.evidence.dump();
  EXPECT_NE(a.message.find("rank 1 posts its part"), std::string::npos) << a.message;
}

// On a node whose ranks are the job's 4..7, local rank 1 is rank 5 in the anomaly and its evidence.
TEST(SlowCollectiveDetectorTest, NamesTheGlobalRankOnANodeOfALargerJob) {
  Sim sim;
  sim.rank_base = 4;
  sim.extra_post = [](int r, int k) { return r == 1 && k >= 60 ? 0.030 : 0.0; };
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  SimDriver driver(sim, {&slow});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.ranks, std::vector<int>{5});
  const nlohmann::json& delays = a.evidence["posted_delay_median_seconds"];
  EXPECT_EQ(delays.size(), 1u) << delays.dump();
  EXPECT_GT(delays.value("5", 0.0), 0.010) << delays.dump();
  EXPECT_NE(a.message.find(": rank 5 posts its part "), std::string::npos) << a.message;
}


// A job of 1,024 ranks with the jitter of a real one: compute varies by 3% and one rank in a
// thousand hiccups each step, so the last rank enters each allreduce 10-30 ms after a typical one.
Sim ThousandRanks() {
  Sim sim;
  sim.ranks = 1024;
  sim.steps = 90;
  sim.compute = 0.080;
  sim.compute_sigma = 0.0024;
  sim.spike_probability = 0.001;
  sim.spike_seconds = 0.030;
  sim.op = 0.015;
  sim.op_sigma = 0.0015;
  return sim;
}

// A slow link on one rank of 1,024: it posts its part 1.6 x the op's time late (the collective
// takes x2.6 counted from its entry), but it enters as early as a typical rank, and the collective
// timed from the last entry slows by less than x2. Named on its own.
TEST(SlowCollectiveDetectorTest, SlowLinkOnOneRankOfAThousandIsNamed) {
  Sim sim = ThousandRanks();
  sim.extra_post = [](int r, int k) { return r == 517 && k >= 60 ? 0.024 : 0.0; };
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  SimDriver driver(sim, {&slow});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "slow_collective");
  EXPECT_EQ(a.ranks, std::vector<int>{517});
  EXPECT_EQ(a.evidence["trigger"], "rank") << a.evidence.dump();
  // What hid it: timed from the last entry, the allreduce did not slow by the factor.
  EXPECT_LT(a.evidence["recent_median_seconds"].get<double>(), 2 * a.evidence["baseline_median_seconds"].get<double>());
  EXPECT_GT(a.evidence["held_back_factor"].get<double>(), 2.0);
  EXPECT_GT(a.evidence["posted_delay_median_seconds"]["517"].get<double>(), 0.020);
  EXPECT_NE(a.message.find("rank 517 posts its part"), std::string::npos) << a.message;
}

// The same job without a fault, hiccups and all: nothing is slow.
TEST(SlowCollectiveDetectorTest, ThousandRanksWithJitterStaySilent) {
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  SimDriver driver(ThousandRanks(), {&slow});
  driver.RunPast(1 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

// One rank posting late by less than (factor - 1) x the baseline does not slow the collective by
// the factor: it stands out, but it is not named on its own.
TEST(SlowCollectiveDetectorTest, LatePosterUnderTheFactorStaysSilent) {
  Sim sim = ThousandRanks();
  sim.extra_post = [](int r, int k) { return r == 517 && k >= 60 ? 0.008 : 0.0; };
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  SimDriver driver(sim, {&slow});
  driver.RunPast(1 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

}  // namespace slow_collective_detector_test
}  // namespace lifeline::agent
