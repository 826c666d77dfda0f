// All six detectors together, as MakeDetectors gives them to the agent, on synthetic streams
// (agent/detectors/event_simulator.h): a clean run raises nothing, nor do the agent's own stops.
#include "agent/detector.h"

#include <csignal>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"
#include "agent/host_cpu.h"

namespace lifeline::agent {
namespace detector_test {

using namespace simulation;

TEST(DetectorsTest, CleanJitteryStreamRaisesNothing) {
  Sim sim;
  sim.ranks = 4;
  sim.steps = 1000;
  sim.seed = 42;
  sim.spike_probability = 0.02;
  sim.checkpoint_every = 50;
  sim.persist = 1.0;
  sim.process_exit = true;
  auto detectors = MakeDetectors(Config(4));
  ASSERT_EQ(detectors.size(), 7u);
  SimDriver driver(sim, std::move(detectors));
  driver.RunPast(5 * kSec);
  for (int r = 0; r < 4; ++r) driver.Exit(r, 0, /*expected=*/false);  // finished: exit 0
  driver.RunUntil(driver.now() + 2 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

TEST(DetectorsTest, MakeDetectorsGivesOneOfEachKind) {
  auto detectors = MakeDetectors(Config(2));
  std::vector<std::string> kinds;
  for (auto& d : detectors) kinds.push_back(d->kind());
  EXPECT_EQ(kinds, (std::vector<std::string>{"dead", "hang", "straggler", "slow_collective", "checkpoint",
                                              "training_signal", "replica_digest"}));
}

TEST(DetectorsTest, ExpectedExitsRaiseNothingFromAnyDetector) {
  Sim sim;
  sim.steps = 40;
  SimDriver driver(sim);
  driver.RunUntil(LastTime(driver.stream()) / 2);  // mid-step, collectives open
  for (int r = 0; r < 4; ++r) driver.Exit(r, r % 2 ? SIGKILL : SIGTERM, /*expected=*/true);
  driver.RunUntil(driver.now() + 120 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

// Issue 32, item 13: on a host whose CPUs are saturated, a straggler a few ms behind and a
// communicator slower as a whole are the host; a rank far behind, or one named by a slow link, is
// still paged. Nothing is taken on a host with CPU to spare.
TEST(DetectorsTest, ASaturatedHostIsNotPagedForButARealStragglerStillIs) {
  const HostCpu busy = ParseHostCpu("some avg10=62.50 avg60=40.00 avg300=10.00 total=1\n", "3.0 2.0 1.0 5/100 7\n", 2);
  ASSERT_TRUE(busy.saturated);
  EXPECT_EQ(busy.Describe(), "cpu pressure 62% (some avg10)");
  const HostCpu idle = ParseHostCpu("some avg10=1.00 avg60=0.50 avg300=0.10 total=1\n", "3.0 2.0 1.0 5/100 7\n", 2);
  EXPECT_FALSE(idle.saturated);
  EXPECT_TRUE(ParseHostCpu("", "4.0 1 1 1/1 1", 2).saturated) << "no PSI: load 2 per cpu";

  auto straggler = [](int rank, double own, double peers) {
    Anomaly a;
    a.kind = "straggler";
    a.ranks = {rank};
    a.evidence["per_rank"][std::to_string(rank)] = {
        {"basis", "lateness"}, {"lateness_median_seconds", own}, {"peers_lateness_median_seconds", peers}};
    return a;
  };
  Anomaly comm_slow;
  comm_slow.kind = "slow_collective";
  Anomaly link_slow = comm_slow;
  link_slow.ranks = {3};
  Anomaly hang;
  hang.kind = "hang";
  hang.ranks = {1};
  // Persistence behind the saves' pace (the checkpoint detector's evidence, per rank).
  auto lag = [](int rank, std::vector<double> persist, double interval) {
    Anomaly a;
    a.kind = "checkpoint";
    a.ranks = {rank};
    a.evidence = {{"persist_seconds", persist}, {"interval_seconds", interval}, {"lag_factor", 1.0}};
    a.evidence["per_rank"][std::to_string(rank)] = a.evidence;
    return a;
  };
  Anomaly failed_save;
  failed_save.kind = "checkpoint";
  failed_save.ranks = {0};
  failed_save.evidence["status"] = "IOError";
  std::vector<Anomaly> all = {straggler(1, 0.019, 0.001), straggler(2, 0.060, 0.001), comm_slow, link_slow, hang,
                              lag(0, {0.079, 0.101, 0.069}, 0.0695), lag(2, {0.079, 0.150, 0.069}, 0.0695),
                              failed_save};

  std::vector<Anomaly> kept = all;
  EXPECT_TRUE(TakeHostNoise(idle, &kept).empty());
  EXPECT_EQ(kept.size(), all.size());

  kept = all;
  const std::vector<Anomaly> taken = TakeHostNoise(busy, &kept);
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[0].ranks, std::vector<int>{1});  // 18 ms behind: the host
  EXPECT_EQ(taken[1].kind, "slow_collective");
  EXPECT_EQ(taken[2].kind, "checkpoint");  // saves 1.0-1.5x their interval: the host
  EXPECT_EQ(taken[2].ranks, std::vector<int>{0});
  ASSERT_EQ(kept.size(), 5u);
  EXPECT_EQ(kept[0].ranks, std::vector<int>{2});  // 59 ms behind: paged
  EXPECT_EQ(kept[1].ranks, std::vector<int>{3});  // a slow link names its rank
  EXPECT_EQ(kept[2].kind, "hang");
  EXPECT_EQ(kept[3].ranks, std::vector<int>{2});  // a save 2.2x its interval: paged
  EXPECT_EQ(kept[4].evidence["status"], "IOError");  // a failed save always is
}

}  // namespace detector_test
}  // namespace lifeline::agent
