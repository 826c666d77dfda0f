// CheckpointDetector on synthetic streams with failing and lagging saves
// (agent/detectors/event_simulator.h).
#include "agent/detectors/checkpoint_detector.h"

#include <algorithm>
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"
#include "lifeline/status.h"

namespace lifeline::agent {
namespace checkpoint_detector_test {

using namespace simulation;

TEST(CheckpointDetectorTest, FailureNamesRankStepAndCode) {
  Sim sim;
  sim.steps = 120;
  sim.checkpoint_every = 25;
  sim.checkpoint_fails = [](int r, int k) { return r == 2 && k == 49; };
  SimDriver driver(sim);
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "checkpoint");
  EXPECT_EQ(a.ranks, std::vector<int>{2});
  EXPECT_EQ(a.step, 49u);
  EXPECT_EQ(a.evidence["status_code"], static_cast<int>(StatusCode::kIOError));
}

TEST(CheckpointDetectorTest, PersistLagOnOneRankIsNamedAfterLagCountInARow) {
  Sim sim;
  sim.steps = 300;
  sim.checkpoint_every = 20;  // ~1.2 s between saves
  sim.persist = 0.3;
  sim.persist_seconds = [](int r, int k) { return r == 1 && k >= 100 ? 2.5 : 0.3; };
  CheckpointDetector checkpoint(CheckpointConfig{});
  SimDriver driver(sim, {&checkpoint});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());  // cooldown 300 s
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.ranks, std::vector<int>{1});
  EXPECT_NEAR(a.evidence["interval_seconds"].get<double>(), 1.2, 0.2);
  // Checkpoints of steps 119, 139, 159 lag. It fires once 159's save has been unpersisted for an
  // interval + lag_min_seconds (1.45 s), after 139's persist (2.5 s, at 1.3 s) arrived: the last
  // one is counted as still pending.
  ASSERT_EQ(a.evidence["persist_seconds"].size(), 3u);
  EXPECT_NEAR(a.evidence["persist_seconds"][0].get<double>(), 2.5, 0.01);
  EXPECT_NEAR(a.evidence["persist_seconds"][1].get<double>(), 2.5, 0.01);
  EXPECT_GT(a.evidence["persist_seconds"][2].get<double>(), 1.4);
  EXPECT_EQ(a.evidence["unpersisted"], 1);
  ASSERT_TRUE(a.step.has_value());
  EXPECT_EQ(*a.step, 159u);
}

// A save every step (50 ms) persisting in 100 ms is twice the cadence, but only 50 ms behind it:
// queued, not at risk (lag_min_seconds). Seen on a loaded machine with saves every 10 ms persisting
// in 12-23 ms, raised as "cannot keep up" before.
TEST(CheckpointDetectorTest, SavesMillisecondsBehindAFastCadenceAreNotALag) {
  Sim sim;
  sim.steps = 200;
  sim.checkpoint_every = 1;
  sim.persist = 0.1;
  CheckpointDetector checkpoint(CheckpointConfig{});
  SimDriver driver(sim, {&checkpoint});
  driver.RunPast(1 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());

  CheckpointConfig strict;
  strict.lag_min_seconds = 0;
  CheckpointDetector without_floor(strict);
  SimDriver driver2(sim, {&without_floor});
  driver2.RunPast(1 * kSec);
  EXPECT_EQ(driver2.all().size(), 1u) << Describe(driver2.all());
}

// A load that passed over a damaged checkpoint is a checkpoint anomaly naming the ranks, the step
// skipped and the step loaded instead: a fallback is never only a log line.
TEST(CheckpointDetectorTest, LoadFallbackIsAnAnomalyNamingRanksAndSteps) {
  CheckpointDetector checkpoint(CheckpointConfig{});
  Driver driver({&checkpoint}, 4);
  Stream stream(4);
  for (int r : {1, 3}) {
    Event e = Ev(EventType::kCheckpointFallback, 1 * kSec, 200);
    e.bytes = 100;  // the step loaded instead
    stream[r].push_back(e);
  }
  driver.Load(stream);
  driver.RunUntil(2 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "checkpoint");
  EXPECT_EQ(a.ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(a.step, 200u);
  EXPECT_EQ(a.evidence["skipped_step"], 200);
  EXPECT_EQ(a.evidence["loaded_step"], 100);
  EXPECT_EQ(a.evidence["location"], "disk");
  EXPECT_NE(a.message.find("loaded step 100"), std::string::npos) << a.message;
}

TEST(CheckpointDetectorTest, SavesThatNeverPersistCountInPoll) {
  Sim sim;
  sim.steps = 200;
  sim.checkpoint_every = 20;
  sim.persist_seconds = [](int r, int k) { return k >= 100 ? -1.0 : 0.3; };  // storage gone
  CheckpointDetector checkpoint(CheckpointConfig{});
  SimDriver driver(sim, {&checkpoint});
  driver.RunPast(1 * kSec);
  // Every rank, each once (ranks crossing the limit in the same poll share one anomaly).
  std::vector<int> named;
  for (const Anomaly& a : driver.all()) {
    named.insert(named.end(), a.ranks.begin(), a.ranks.end());
    EXPECT_EQ(a.evidence["unpersisted"], 3) << a.message;
  }
  std::sort(named.begin(), named.end());
  EXPECT_EQ(named, (std::vector<int>{0, 1, 2, 3})) << Describe(driver.all());
}

// Saves superseded before the store took them (Aborted, the memory tier's answer to a store that is
// away): one anomaly per rank and episode saying the durable copy is behind, not one per save; a
// persisted save ends the episode. Other failures are reported as before.
TEST(CheckpointDetectorTest, SupersededSavesSayOncePerEpisodeThatTheDurableCopyIsBehind) {
  CheckpointDetector checkpoint(CheckpointConfig{});
  Driver driver({&checkpoint}, 2);
  Stream stream(2);
  auto save = [&](int r, uint64_t step, double at, EventType end, StatusCode code = StatusCode::kOk) {
    stream[r].push_back(Ev(EventType::kCheckpointBegin, static_cast<uint64_t>(at * kSec), step));
    Event e = Ev(end, static_cast<uint64_t>((at + 0.2) * kSec), step);
    e.aux = static_cast<uint64_t>(code);
    e.duration_ns = static_cast<uint64_t>(0.2 * kSec);
    stream[r].push_back(e);
  };
  for (int r : {0, 1}) {
    save(r, 10, 1.0, EventType::kCheckpointPersisted);
    save(r, 11, 2.0, EventType::kCheckpointFailed, StatusCode::kAborted);
    save(r, 12, 3.0, EventType::kCheckpointFailed, StatusCode::kAborted);
  }
  save(1, 13, 4.0, EventType::kCheckpointFailed, StatusCode::kIOError);
  save(0, 13, 4.0, EventType::kCheckpointPersisted);
  save(0, 14, 5.0, EventType::kCheckpointFailed, StatusCode::kAborted);
  driver.Load(stream);
  driver.RunUntil(7 * kSec);
  std::vector<const Anomaly*> behind, failed;
  for (const Anomaly& a : driver.all()) {
    if (a.evidence.contains("superseded_steps")) behind.push_back(&a);
    else if (a.evidence.contains("status_codes")) failed.push_back(&a);
  }
  ASSERT_EQ(behind.size(), 2u) << Describe(driver.all());
  EXPECT_EQ(behind[0]->kind, "checkpoint");
  EXPECT_EQ(behind[0]->ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(behind[0]->step, 11u);
  EXPECT_EQ(behind[0]->message.rfind("the durable copy is behind on ranks 0,1: the save of step 11 ", 0), 0u)
      << behind[0]->message;
  EXPECT_EQ(behind[1]->ranks, std::vector<int>{0});  // rank 0 caught up at step 13, then fell behind again
  EXPECT_EQ(behind[1]->step, 14u);
  ASSERT_EQ(failed.size(), 1u) << Describe(driver.all());
  EXPECT_EQ(failed[0]->ranks, std::vector<int>{1});
  EXPECT_EQ(failed[0]->step, 13u);
}

// On a node whose ranks are the job's 4..7, failures, fallbacks and lag name global ranks.
TEST(CheckpointDetectorTest, NamesGlobalRanksOnANodeOfALargerJob) {
  Sim sim;
  sim.rank_base = 4;
  sim.steps = 300;
  sim.checkpoint_every = 20;
  sim.checkpoint_fails = [](int r, int k) { return r == 2 && k == 39; };
  sim.persist_seconds = [](int r, int k) { return r == 1 && k >= 100 ? 2.5 : 0.3; };
  CheckpointDetector checkpoint(CheckpointConfig{});
  SimDriver driver(sim, {&checkpoint});
  driver.RunPast(1 * kSec);
  ASSERT_EQ(driver.all().size(), 2u) << Describe(driver.all());
  const Anomaly& failed = driver.all()[0];
  EXPECT_EQ(failed.ranks, std::vector<int>{6});
  EXPECT_TRUE(failed.evidence["status_codes"].contains("6")) << failed.evidence.dump();
  EXPECT_EQ(failed.message.rfind("checkpoint of step 39 failed on rank 6: ", 0), 0u) << failed.message;
  const Anomaly& lag = driver.all()[1];
  EXPECT_EQ(lag.ranks, std::vector<int>{5});
  EXPECT_TRUE(lag.evidence["per_rank"].contains("5")) << lag.evidence.dump();
  EXPECT_EQ(lag.message.rfind("checkpoint persistence cannot keep up on rank 5: ", 0), 0u) << lag.message;

  // A fallback load by local ranks 1 and 3.
  Stream stream(4);
  for (int r : {1, 3}) {
    Event e = Ev(EventType::kCheckpointFallback, driver.now() + 1 * kSec, 200);
    e.bytes = 100;  // the step loaded instead
    stream[r].push_back(e);
  }
  driver.Load(stream);
  driver.RunUntil(driver.now() + 2 * kSec);
  ASSERT_EQ(driver.all().size(), 3u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[2].ranks, (std::vector<int>{5, 7}));
  EXPECT_NE(driver.all()[2].message.find(" by ranks 5,7, "), std::string::npos) << driver.all()[2].message;
}

}  // namespace checkpoint_detector_test
}  // namespace lifeline::agent
