// HangDetector on synthetic streams with stalls injected (agent/detectors/event_simulator.h).
#include "agent/detectors/hang_detector.h"

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"

namespace lifeline::agent {
namespace hang_detector_test {

using namespace simulation;

TEST(HangDetectorTest, RankThatNeverJoinsIsNamedAfterTheFloorAndNotBefore) {
  HangDetector hang(FastHang());
  SimDriver driver(StalledSim(200, Stall::kNeverJoins, 2, 110), {&hang});  // allreduce #111
  const uint64_t t0 = FirstBeginOf(driver.stream(), 111);
  const uint64_t fired_at = driver.FirstFoundBy(t0 + 60 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());  // once per stall
  const Anomaly& a = driver.all()[0];
  EXPECT_GT(fired_at, t0 + 2 * kSec);
  EXPECT_LE(fired_at, t0 + 2 * kSec + 20 * kMs);
  EXPECT_EQ(a.kind, "hang");
  EXPECT_EQ(a.ranks, std::vector<int>{2});
  EXPECT_EQ(a.seq, 111u);
  EXPECT_EQ(a.comm, 0u);
  EXPECT_EQ(a.op, "allreduce");
  EXPECT_EQ(a.step, 110u);
  EXPECT_EQ(a.evidence["waiting_ranks"], (std::vector<int>{0, 1, 3}));
  EXPECT_DOUBLE_EQ(a.evidence["timeout_seconds"].get<double>(), 2.0);  // jittery ms history: the floor
  EXPECT_GT(a.evidence["waited_seconds"].get<double>(), 2.0);
  EXPECT_GT(a.evidence["history_size"].get<int>(), 0);
  EXPECT_EQ(a.message.rfind("rank 2 never joined allreduce #111 (comm 0) at step 110; ranks 0,1,3 waited 2.", 0), 0u)
      << a.message;
}

TEST(HangDetectorTest, AllJoinedButOneNeverPosted) {
  HangDetector hang(FastHang());
  SimDriver driver(StalledSim(50, Stall::kNeverPosts, 1, 30), {&hang});
  driver.RunPast(10 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{1});
  EXPECT_EQ(driver.all()[0].seq, 31u);
  EXPECT_EQ(driver.all()[0].evidence["waiting_ranks"], (std::vector<int>{0, 2, 3}));
}

TEST(HangDetectorTest, StepStuckWithNoCollectiveNamesTheRankBehind) {
  Sim sim = StalledSim(300, Stall::kNeverJoins, 2, 40);  // the others go on for ~15 s
  sim.collectives = false;
  HangDetector hang(FastHang());
  SimDriver driver(sim, {&hang});
  uint64_t t0 = 0;
  for (const Event& e : driver.stream()[2])
    if (e.type == EventType::kStepBegin && e.step == 40) t0 = e.time_ns;
  ASSERT_NE(t0, 0u);
  const uint64_t fired_at = driver.FirstFoundBy(LastTime(driver.stream()) + 10 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_GT(fired_at, t0 + 2 * kSec);
  EXPECT_LE(fired_at, t0 + 2 * kSec + 20 * kMs);
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{2});
  EXPECT_EQ(driver.all()[0].step, 40u);
  EXPECT_FALSE(driver.all()[0].seq.has_value());
}

// Four ranks in step 5, local rank 2 silent from its StepBegin on while the others report: what
// the hang detector says about it over 9 s.
std::vector<Anomaly> OneRankSilentInAStep(int rank_base) {
  HangDetector hang(FastHang());
  Driver driver({&hang}, 4, rank_base);
  for (int r = 0; r < 4; ++r) driver.Observe(r, Ev(EventType::kStepBegin, 1 * kSec + r * kMs, 5));
  std::vector<Anomaly> out;
  for (uint64_t now = 1 * kSec + 100 * kMs; now < 10 * kSec; now += 100 * kMs) {
    for (int r : {0, 1, 3}) driver.Observe(r, Ev(EventType::kHeartbeat, now - 50 * kMs, 5));
    driver.Poll(now, &out);
  }
  return out;
}

TEST(HangDetectorTest, AllAtOneStepNamesTheSilentRank) {
  const std::vector<Anomaly> out = OneRankSilentInAStep(/*rank_base=*/0);
  ASSERT_EQ(out.size(), 1u) << Describe(out);
  EXPECT_EQ(out[0].ranks, std::vector<int>{2});
  EXPECT_EQ(out[0].step, 5u);
  EXPECT_EQ(out[0].evidence["waiting_ranks"], (std::vector<int>{0, 1, 3}));
}

TEST(HangDetectorTest, FirstSlowCollectiveWaitsForTheFloor) {
  HangDetector hang(FastHang());
  Driver driver({&hang}, 4);
  std::vector<Anomaly> out;
  for (int r = 0; r < 4; ++r) {
    driver.Observe(r, Ev(EventType::kStepBegin, 1 * kSec, 0));
    driver.Observe(r, Coll(EventType::kCollectiveBegin, 1 * kSec + kMs, 0, 1, Op::kAllReduce));
  }
  // Communicator setup: the first allreduce takes 1.9 s, under the 2 s floor.
  for (uint64_t now = 1 * kSec; now <= 2900 * kMs; now += 10 * kMs) driver.Poll(now, &out);
  for (int r = 0; r < 4; ++r) {
    driver.Observe(r, Coll(EventType::kCollectiveEnd, 2901 * kMs, 0, 1));
    driver.Observe(r, Ev(EventType::kStepEnd, 2905 * kMs, 0));
  }
  for (uint64_t now = 2910 * kMs; now <= 4 * kSec; now += 10 * kMs) driver.Poll(now, &out);
  EXPECT_TRUE(out.empty()) << Describe(out);
}

TEST(HangDetectorTest, TimeoutAdaptsToLongCollectives) {
  Sim sim = StalledSim(30, Stall::kNeverJoins, 0, 20);
  sim.op = 0.5;  // collectives routinely take half a second: timeout 10 x ~0.5 s
  HangDetector hang(FastHang());
  SimDriver driver(sim, {&hang});
  const uint64_t t0 = FirstBeginOf(driver.stream(), 21);
  const uint64_t fired_at = driver.FirstFoundBy(t0 + 30 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const double timeout = driver.all()[0].evidence["timeout_seconds"].get<double>();
  EXPECT_GT(timeout, 5.0);
  EXPECT_LT(timeout, 6.0);
  EXPECT_GT(fired_at, t0 + Ns(timeout));
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{0});
}

TEST(HangDetectorTest, ResetForgetsTheOpenCollectivesOfThePreviousLaunch) {
  Sim sim = StalledSim(60, Stall::kNeverJoins, 3, 40);
  HangDetector hang(FastHang());
  SimDriver driver(sim, {&hang});
  const uint64_t t0 = FirstBeginOf(driver.stream(), 41);
  driver.RunUntil(t0 + 1 * kSec);
  EXPECT_TRUE(driver.all().empty());

  // Restart: a fresh launch whose first events come a little later.
  driver.ResetAll(4);
  driver.Load(Stream(4));
  driver.RunUntil(t0 + 30 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());

  // The new launch counts seqs from 1 again, and its own stall is reported.
  sim.start_ns = driver.now() + 100 * kMs;
  sim.stall_rank = 1;
  sim.stall_step = 10;
  driver.Play(sim);
  driver.RunPast(5 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{1});
  EXPECT_EQ(driver.all()[0].seq, 11u);
}

TEST(HangDetectorTest, ExitedRankIsNeitherWaiterNorCulprit) {
  HangDetector hang(FastHang());
  SimDriver driver(StalledSim(60, Stall::kNeverJoins, 2, 20), {&hang});
  driver.RunPast(100 * kMs);
  driver.Exit(0, SIGKILL, /*expected=*/false);  // a waiter dies
  driver.RunPast(5 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{2});
  EXPECT_EQ(driver.all()[0].evidence["waiting_ranks"], (std::vector<int>{1, 3}));
}

// On a node whose ranks are the job's 4..7, culprits, waiters and exited ranks are global ranks.
TEST(HangDetectorTest, CollectiveHangNamesGlobalRanksOnANodeOfALargerJob) {
  Sim sim = StalledSim(60, Stall::kNeverJoins, 2, 20);  // allreduce #21
  sim.rank_base = 4;
  HangDetector hang(FastHang());
  SimDriver driver(sim, {&hang});
  driver.RunPast(100 * kMs);
  driver.Exit(0, SIGKILL, /*expected=*/false);
  driver.RunPast(5 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.ranks, std::vector<int>{6});
  EXPECT_EQ(a.evidence["waiting_ranks"], (std::vector<int>{5, 7}));
  EXPECT_EQ(a.evidence["exited_ranks"], std::vector<int>{4});
  EXPECT_EQ(a.message.rfind("rank 6 never joined allreduce #21 (comm 0) at step 20; ranks 5,7 waited ", 0), 0u)
      << a.message;
  EXPECT_NE(a.message.find("; exited: 4"), std::string::npos) << a.message;
}

TEST(HangDetectorTest, StepHangNamesGlobalRanksOnANodeOfALargerJob) {
  const std::vector<Anomaly> out = OneRankSilentInAStep(/*rank_base=*/4);
  ASSERT_EQ(out.size(), 1u) << Describe(out);
  EXPECT_EQ(out[0].ranks, std::vector<int>{6});
  EXPECT_EQ(out[0].evidence["waiting_ranks"], (std::vector<int>{4, 5, 7}));
  EXPECT_EQ(out[0].message.rfind("rank 6 silent for ", 0), 0u) << out[0].message;
  EXPECT_NE(out[0].message.find("; ranks 4,5,7 still report"), std::string::npos) << out[0].message;
}

}  // namespace hang_detector_test
}  // namespace lifeline::agent
