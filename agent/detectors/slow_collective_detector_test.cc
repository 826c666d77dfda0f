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
  // The ranks' own work between collectives did not slow: the fabric, not the host.
  EXPECT_FALSE(driver.all()[0].evidence.value("host_busy", false)) << driver.all()[0].evidence.dump();
  EXPECT_NEAR(driver.all()[0].evidence["work_recent_median_seconds"].get<double>(),
              driver.all()[0].evidence["work_baseline_median_seconds"].get<double>(), 0.002);
}

// Issue 50, item 5: a host busy with other processes (a `lifeline gc` loop and another job beside
// a CPU-bound one): from step 60 the ranks' compute takes 10 ms more and their allreduce 12 ms
// instead of 5 (x2.4), every rank alike. No rank stands out and the ranks' own work between their
// collectives slowed as much as the collective: the host is busy, which the anomaly says (the
// Supervisor logs it as not paged: SupervisorTest.ABusyHostIsNotPagedAsASlowCommunicator).
TEST(SlowCollectiveDetectorTest, ABusyHostIsToldFromASlowCommunicator) {
  Sim sim;
  sim.steps = 120;
  sim.op_seconds = [](int k) { return k >= 60 ? 0.012 : 0.005; };
  sim.extra_compute = [](int, int k) { return k >= 60 ? 0.010 : 0.0; };
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  SimDriver driver(sim, {&slow});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_TRUE(a.ranks.empty());
  EXPECT_EQ(a.evidence.value("host_busy", false), true) << a.evidence.dump();
  EXPECT_GT(a.evidence["work_recent_median_seconds"].get<double>(),
            a.evidence["work_baseline_median_seconds"].get<double>() + 0.005) << a.evidence.dump();
  EXPECT_NE(a.message.find("the host is busy, not the communicator"), std::string::npos) << a.message;
}

// The same busy host, and one rank's link slow as well: the rank stands out and is named; the
// host's share does not hide it.
TEST(SlowCollectiveDetectorTest, ASlowLinkOnABusyHostIsStillNamed) {
  Sim sim;
  sim.steps = 120;
  sim.op_seconds = [](int k) { return k >= 60 ? 0.012 : 0.005; };
  sim.extra_compute = [](int, int k) { return k >= 60 ? 0.010 : 0.0; };
  sim.extra_post = [](int r, int k) { return r == 3 && k >= 60 ? 0.030 : 0.0; };
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  SimDriver driver(sim, {&slow});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{3});
  EXPECT_FALSE(driver.all()[0].evidence.value("host_busy", false));
}

// Issue 50, item 5: the two-node drill's shape as the leader's job-wide view saw it. Its allreduce
// takes 0.4 ms; rank 2's link is 20 ms slower from step 8, so the detector's baseline (the first
// 50 collectives it sees: the leader's view saw collectives 91 to 140 of a job whose link slowed
// at step 97) is made mostly of slow collectives, and the communicator never slows against it.
// Rank 2 posts its part 20 ms after entering where its peers post at once, holding back a
// collective whose own cost (from the last part posted to the median exit) is 0.4 ms: named.
TEST(SlowCollectiveDetectorTest, ASlowLinkAlreadyLateWhenTheBaselineFormedIsNamed) {
  Sim sim;
  sim.steps = 150;
  sim.compute = 0.005;
  sim.compute_sigma = 0.0003;
  sim.op = 0.0004;
  sim.op_sigma = 0.00005;
  sim.extra_post = [](int r, int k) { return r == 2 && k >= 8 ? 0.020 : 0.0; };
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  SimDriver driver(sim, {&slow});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.ranks, std::vector<int>{2});
  EXPECT_EQ(a.evidence["trigger"], "rank") << a.evidence.dump();
  EXPECT_GT(a.evidence["baseline_median_seconds"].get<double>(), 0.010) << "the baseline holds the slow link";
  EXPECT_LT(a.evidence["own_cost_seconds"].get<double>(), 0.001) << a.evidence.dump();
  EXPECT_GT(a.evidence["held_back_factor"].get<double>(), 10) << a.evidence.dump();
  EXPECT_NE(a.message.find("rank 2 posts its part"), std::string::npos) << a.message;
}

// The detector's sensitivity (its header; docs/figures.md): a slow link is named once its lateness
// is (factor - 1) x the collective's own cost, and min_excess_seconds (5 ms). Where the allreduce
// takes 28 ms (this 2-core machine saturated by other work, as tests/agent/multinode_drill_test.cc
// found), a link 30 ms slow from step 97 is named and one 20 ms slow (x1.7) is not: its documented
// miss. Where it takes 0.4 ms (the two-node drill on an idle machine), 6 ms is named, 4 ms is not.
TEST(SlowCollectiveDetectorTest, TheSmallestSlowLinkNamedDoublesTheCollective) {
  struct Case {
    double op, late;
    bool named;
  };
  for (const Case& c : {Case{0.028, 0.020, false}, Case{0.028, 0.030, true}, Case{0.0004, 0.004, false},
                        Case{0.0004, 0.006, true}}) {
    Sim sim;
    sim.steps = 200;
    sim.compute = 0.005;
    sim.compute_sigma = 0.0003;
    sim.op = c.op;
    sim.op_sigma = c.op / 30;
    sim.extra_post = [late = c.late](int r, int k) { return r == 1 && k >= 97 ? late : 0.0; };
    SlowCollectiveDetector slow(SlowCollectiveConfig{});
    SimDriver driver(sim, {&slow});
    driver.RunPast(1 * kSec);
    if (!c.named) {
      EXPECT_TRUE(driver.all().empty()) << c.op << " " << c.late << ": " << Describe(driver.all());
      continue;
    }
    ASSERT_EQ(driver.all().size(), 1u) << c.op << " " << c.late << ": " << Describe(driver.all());
    EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{1});
  }
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
