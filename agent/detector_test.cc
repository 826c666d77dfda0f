// All five detectors together, as MakeDetectors gives them to the agent, on synthetic streams
// (agent/detectors/event_simulator.h): a clean run raises nothing, nor do the agent's own stops.
#include "agent/detector.h"

#include <csignal>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"

namespace lifeline::agent {
namespace {

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
  ASSERT_EQ(detectors.size(), 5u);
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
  EXPECT_EQ(kinds, (std::vector<std::string>{"dead", "hang", "straggler", "slow_collective", "checkpoint"}));
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

}  // namespace
}  // namespace lifeline::agent
