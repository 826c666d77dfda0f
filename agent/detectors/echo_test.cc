// Which failures may be echoes of a peer's (agent/detectors/echo.h): DeadRankDetector's evidence of
// where a rank died, on synthetic streams, and MayBeEcho's verdict on it.
#include "agent/detectors/echo.h"

#include <csignal>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/dead_rank_detector.h"
#include "agent/detectors/detector_test_kit.h"

namespace lifeline::agent {
namespace echo_test {

using namespace simulation;

constexpr int kExit1 = 1 << 8;  // as waitpid reports `exit(1)`, a Python exception

// The "dead" anomaly of local rank `rank` of `driver`, ending with `wait_status` now.
Anomaly DeathOf(Driver* driver, int rank, int wait_status) {
  std::vector<Anomaly> out;
  driver->Exit(rank, wait_status, /*expected=*/false, driver->now(), &out);
  EXPECT_EQ(out.size(), 1u) << Describe(out);
  return out.empty() ? Anomaly{} : out[0];
}

// A rank that dies in its compute, between collectives, with an exit status: its own failure (two
// such on two nodes at once are two faults), not held as an echo.
TEST(EchoTest, ExitBetweenCollectivesIsTheRanksOwn) {
  DeadRankDetector dead;
  // Rank 2 records StepBegin(70) and nothing more: it died in that step's compute.
  SimDriver driver(StalledSim(100, Stall::kNeverJoins, 2, 70), std::vector<Detector*>{&dead});
  driver.RunPast(20 * kMs);
  const Anomaly a = DeathOf(&driver, 2, kExit1);
  EXPECT_EQ(a.evidence["in_collective"], false) << a.evidence.dump();
  EXPECT_EQ(a.evidence["collective_in_step"], false) << a.evidence.dump();
  EXPECT_FALSE(MayBeEcho(a, kExit1));
  EXPECT_FALSE(MayBeEcho(a, SIGABRT));
}

// Its peers wait in that step's allreduce for it; one that then fails (gloo raising on the closed
// connection, NCCL aborting) fails inside the collective: it may be the echo, and is held.
TEST(EchoTest, ExitInsideACollectiveMayBeAnEcho) {
  DeadRankDetector dead;
  SimDriver driver(StalledSim(100, Stall::kNeverJoins, 2, 70), std::vector<Detector*>{&dead});
  driver.RunPast(20 * kMs);
  const Anomaly a = DeathOf(&driver, 0, kExit1);
  ASSERT_TRUE(a.evidence["in_collective"].is_object()) << a.evidence.dump();
  EXPECT_EQ(a.evidence["in_collective"]["comm"], 0);
  EXPECT_EQ(a.evidence["in_collective"]["op"], "allreduce");
  EXPECT_EQ(a.evidence["in_collective"]["posted"], true);
  EXPECT_TRUE(MayBeEcho(a, kExit1));
  const Anomaly b = DeathOf(&driver, 1, SIGABRT);
  EXPECT_TRUE(MayBeEcho(b, SIGABRT));
}

// Python ranks: a collective that raises (gloo, when the dead peer's connection closes) is ended by
// its trace scope as the exception unwinds, and so is the step. The rank was in no collective when
// it exited, but it had begun one in its step: it may be an echo. One that raised at the start of a
// step, before its first collective, failed on its own.
TEST(EchoTest, PythonRanksEndTheirScopesOnTheWayOut) {
  DeadRankDetector dead;
  Driver driver({&dead}, 2);
  for (int r = 0; r < 2; ++r) {  // step 5 completes on both
    driver.Observe(r, Ev(EventType::kStepBegin, 1 * kSec, 5));
    driver.Observe(r, Coll(EventType::kCollectiveBegin, 1 * kSec + 50 * kMs, 5, 1, Op::kAllReduce));
    driver.Observe(r, Coll(EventType::kCollectiveEnd, 1 * kSec + 60 * kMs, 5, 1));
    driver.Observe(r, Ev(EventType::kStepEnd, 1 * kSec + 65 * kMs, 5));
    driver.Observe(r, Ev(EventType::kStepBegin, 1 * kSec + 70 * kMs, 6));
  }
  // Rank 0 enters step 6's allreduce, which raises: its scopes end, then it exits.
  driver.Observe(0, Coll(EventType::kCollectiveBegin, 1 * kSec + 120 * kMs, 6, 2, Op::kAllReduce));
  driver.Observe(0, Coll(EventType::kCollectiveEnd, 1 * kSec + 300 * kMs, 6, 2));
  driver.Observe(0, Ev(EventType::kStepEnd, 1 * kSec + 300 * kMs, 6));
  // Rank 1 raises in step 6's forward, before any collective.
  driver.Observe(1, Ev(EventType::kStepEnd, 1 * kSec + 90 * kMs, 6));
  driver.SetNow(2 * kSec);
  const Anomaly echo = DeathOf(&driver, 0, kExit1);
  EXPECT_EQ(echo.evidence["in_collective"], false) << echo.evidence.dump();
  EXPECT_EQ(echo.evidence["collective_in_step"], true) << echo.evidence.dump();
  EXPECT_TRUE(MayBeEcho(echo, kExit1));
  const Anomaly own = DeathOf(&driver, 1, kExit1);
  EXPECT_EQ(own.evidence["collective_in_step"], false) << own.evidence.dump();
  EXPECT_FALSE(MayBeEcho(own, kExit1));
}

// A rank killed by another signal is never an echo, inside a collective or not.
TEST(EchoTest, KilledBySignalIsNeverAnEcho) {
  DeadRankDetector dead;
  SimDriver driver(StalledSim(100, Stall::kNeverJoins, 2, 70), std::vector<Detector*>{&dead});
  driver.RunPast(20 * kMs);
  const Anomaly a = DeathOf(&driver, 0, SIGKILL);
  ASSERT_TRUE(a.evidence["in_collective"].is_object());
  EXPECT_FALSE(MayBeEcho(a, SIGKILL));
  EXPECT_FALSE(MayBeEcho(a, SIGSEGV | 0x80));
}

// A rank that never recorded a collective (not traced, or died before its first): nothing says
// where it died, so an exit status may still be an echo.
TEST(EchoTest, NoCollectivesRecordedMayBeAnEcho) {
  DeadRankDetector dead;
  Driver driver({&dead}, 4);
  driver.Observe(1, Ev(EventType::kStepBegin, 1 * kSec, 0));
  driver.SetNow(2 * kSec);
  const Anomaly a = DeathOf(&driver, 1, kExit1);
  EXPECT_FALSE(a.evidence.contains("in_collective")) << a.evidence.dump();
  EXPECT_TRUE(MayBeEcho(a, kExit1));
  EXPECT_FALSE(MayBeEcho(a, SIGKILL));
}


// The poll that sees the round move: a failure of its own found in it is kept to be logged (both
// of two independent failures named), a possible echo is set apart, anything else is dropped.
TEST(EchoTest, AsTheRoundMovesOwnFailuresStayAndEchoesGoApart) {
  DeadRankDetector dead;
  SimDriver driver(StalledSim(100, Stall::kNeverJoins, 2, 70), std::vector<Detector*>{&dead});
  driver.RunPast(20 * kMs);
  std::vector<Anomaly> anomalies = {DeathOf(&driver, 2, kExit1), DeathOf(&driver, 0, kExit1)};
  Anomaly hang;
  hang.kind = "hang";
  hang.ranks = {2};
  anomalies.push_back(hang);
  std::vector<Anomaly> echoes;
  SortFailuresAsTheRoundMoves(&anomalies, [](int) { return kExit1; }, &echoes);
  ASSERT_EQ(anomalies.size(), 1u) << Describe(anomalies);
  EXPECT_EQ(anomalies[0].kind, "dead");
  EXPECT_EQ(anomalies[0].ranks, std::vector<int>{2});  // died in its compute
  ASSERT_EQ(echoes.size(), 1u) << Describe(echoes);
  EXPECT_EQ(echoes[0].ranks, std::vector<int>{0});  // died waiting in the allreduce
}

}  // namespace echo_test
}  // namespace lifeline::agent
