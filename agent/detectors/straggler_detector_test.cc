// StragglerDetector on synthetic streams with a slow rank (agent/detectors/event_simulator.h).
#include "agent/detectors/straggler_detector.h"

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"

namespace lifeline::agent {
namespace straggler_detector_test {

using namespace simulation;

void ExpectStragglerRank3(int ranks) {
  Sim sim;
  sim.ranks = ranks;
  sim.steps = 100;
  sim.seed = 100 + ranks;
  sim.extra_compute = [](int r, int k) { return r == 3 && k >= 30 ? 0.040 : 0.0; };
  SimDriver driver(sim);
  driver.RunPast(1 * kSec);
  // Only the straggler: its late arrival does not make the collective slow, nor does it hang.
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "straggler");
  EXPECT_EQ(a.ranks, std::vector<int>{3});
  ASSERT_TRUE(a.step.has_value());
  EXPECT_GE(*a.step, 30u + 13);  // 14 outliers (70% of a 20-entry window): steps 30..43
  EXPECT_LE(*a.step, 30u + 25);
  EXPECT_EQ(a.op, "allreduce");
  EXPECT_NEAR(a.evidence["compute_median_seconds"].get<double>() -
                  a.evidence["peers_compute_median_seconds"].get<double>(), 0.040, 0.005);
  EXPECT_NEAR(a.evidence["lateness_median_seconds"].get<double>(), 0.040, 0.005);
  EXPECT_GE(a.evidence["fraction"].get<double>(), 0.7);
  EXPECT_EQ(a.evidence["window"], 20);
  EXPECT_NE(a.message.find("rank 3"), std::string::npos) << a.message;
}

TEST(StragglerDetectorTest, SlowComputeRankAmongFour) { ExpectStragglerRank3(4); }
TEST(StragglerDetectorTest, SlowComputeRankAmongEight) { ExpectStragglerRank3(8); }

TEST(StragglerDetectorTest, TwoRanksUseTheAbsoluteRule) {
  Sim sim;
  sim.ranks = 2;
  sim.steps = 80;
  sim.extra_compute = [](int r, int k) { return r == 1 && k >= 20 ? 0.040 : 0.0; };
  StragglerDetector straggler(StragglerConfig{});
  SimDriver driver(sim, {&straggler});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{1});
  EXPECT_TRUE(driver.all()[0].evidence["z"].is_null());
}

TEST(StragglerDetectorTest, TwoRanksWithJitterStaySilent) {
  Sim sim;
  sim.ranks = 2;
  sim.steps = 500;
  sim.spike_probability = 0.02;
  StragglerDetector straggler(StragglerConfig{});
  SimDriver driver(sim, {&straggler});
  driver.RunPast(1 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

TEST(StragglerDetectorTest, CooldownThenReportedAgain) {
  StragglerConfig config;
  config.cooldown_seconds = 3;
  Sim sim;
  sim.steps = 150;  // ~9 s of straggling
  sim.extra_compute = [](int r, int k) { return r == 3 && k >= 30 ? 0.040 : 0.0; };
  StragglerDetector straggler(config);
  SimDriver driver(sim, {&straggler});
  driver.RunPast(1 * kSec);
  ASSERT_GE(driver.all().size(), 2u) << Describe(driver.all());
  for (size_t i = 1; i < driver.all().size(); ++i) {
    EXPECT_EQ(driver.all()[i].ranks, std::vector<int>{3});
    EXPECT_GE(driver.all()[i].detected_ns - driver.all()[i - 1].detected_ns, 3 * kSec);
  }
}

// On a node whose ranks are the job's 4..7, local rank 3 is rank 7 in the anomaly and its evidence.
TEST(StragglerDetectorTest, NamesTheGlobalRankOnANodeOfALargerJob) {
  Sim sim;
  sim.rank_base = 4;
  sim.extra_compute = [](int r, int k) { return r == 3 && k >= 30 ? 0.040 : 0.0; };
  StragglerDetector straggler(StragglerConfig{});
  SimDriver driver(sim, {&straggler});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.ranks, std::vector<int>{7});
  EXPECT_TRUE(a.evidence["per_rank"].contains("7")) << a.evidence.dump();
  EXPECT_EQ(a.evidence["per_rank"].size(), 1u);
  EXPECT_NE(a.message.find(": rank 7 is "), std::string::npos) << a.message;
  EXPECT_EQ(a.message.find("rank 3"), std::string::npos) << a.message;
}

}  // namespace straggler_detector_test
}  // namespace lifeline::agent
