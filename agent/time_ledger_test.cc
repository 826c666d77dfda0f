// The time-lost account on a synthetic restart whose every phase is known.
#include "agent/time_ledger.h"

#include <gtest/gtest.h>

namespace lifeline::agent {
namespace time_ledger_test {

constexpr uint64_t kBase = 100'000'000'000ull;  // the monotonic clock is never 0 in practice
uint64_t At(double seconds) { return kBase + static_cast<uint64_t>(seconds * 1e9); }

trace::Event Ev(trace::EventType type, uint64_t step, double at, double duration = 0) {
  trace::Event e;
  e.type = type;
  e.step = step;
  e.time_ns = At(at);
  e.duration_ns = static_cast<uint64_t>(duration * 1e9);
  return e;
}

// Two ranks step once a second (0.9 s of work) from step `first`, `count` steps from `t0`.
void Steps(TimeLedger* ledger, uint64_t first, int count, double t0) {
  for (int k = 0; k < count; ++k)
    for (int r = 0; r < 2; ++r) {
      ledger->Observe(r, Ev(trace::EventType::kStepBegin, first + k, t0 + k));
      ledger->Observe(r, Ev(trace::EventType::kStepEnd, first + k, t0 + k + 0.9));
    }
}

TEST(TimeLedgerTest, ARestartIsSplitIntoItsPhasesAndTheRedoneSteps) {
  TimeLedger ledger;
  ledger.Launched(2, At(0));
  Steps(&ledger, 0, 10, 0);  // steps 0..9
  for (int r = 0; r < 2; ++r) ledger.Observe(r, Ev(trace::EventType::kStepBegin, 10, 10));
  // Rank 1 dies at 10.5 s, in step 10; the restart is decided at 10.6 s, the ranks are stopped at
  // 11.6 s, the back-off is 1 s, the relaunch starts them at 13.0 s (a round to join).
  ledger.Fault("dead", {1}, "node-b", At(10.5), At(10.6));
  EXPECT_FALSE(ledger.Settle());
  ledger.Stopped(At(11.6), 1.0);
  ledger.Launched(2, At(13.0));
  // They load step 5 from 13.5 to 14.0 s and step from step 6 at 14.2 s.
  for (int r = 0; r < 2; ++r) ledger.Observe(r, Ev(trace::EventType::kProcessStart, 5, 14.0, 0.5));
  ledger.Observe(0, Ev(trace::EventType::kStepBegin, 6, 14.2));
  EXPECT_FALSE(ledger.Settle()) << "settled before every rank stepped";
  ledger.Observe(1, Ev(trace::EventType::kStepBegin, 6, 14.2));
  std::optional<RestartCost> cost = ledger.Settle();
  ASSERT_TRUE(cost);
  EXPECT_EQ(cost->cause, "dead");
  EXPECT_EQ(cost->node, "node-b");
  EXPECT_NEAR(cost->detection_seconds, 0.1, 1e-6);
  EXPECT_NEAR(cost->stop_seconds, 1.0, 1e-6);
  EXPECT_NEAR(cost->backoff_seconds, 1.0, 1e-6);
  // From the back-off's end (12.6 s) to the load (13.5 s), and from the load's end to the first step.
  EXPECT_NEAR(cost->relaunch_seconds, 0.9 + 0.2, 1e-6);
  EXPECT_NEAR(cost->load_seconds, 0.5, 1e-6);
  // Steps 6..9 again at the launch's 0.99 s a step (9.9 s over 10 steps), and step 10's 0.5 s.
  EXPECT_EQ(cost->interrupted_step, 10u);
  EXPECT_EQ(cost->resumed_step, 6u);
  EXPECT_EQ(cost->steps_redone, 4u);
  EXPECT_NEAR(cost->redo_seconds, 4 * 0.99 + 0.5, 1e-6);
  EXPECT_FALSE(ledger.Settle()) << "a cost is settled once";
  EXPECT_NEAR(ledger.lost_seconds("redo"), cost->redo_seconds, 1e-9);
  EXPECT_EQ(ledger.steps_redone(), 4u);

  // The second launch steps 6..11 until 20 s: productive = 10.5 s (to the fault) + 5.7 s, less the redo.
  Steps(&ledger, 6, 6, 14.2);
  const double productive = 10.5 + (14.2 + 5 + 0.9 - 14.2) - (4 * 0.99 + 0.5);
  EXPECT_NEAR(ledger.productive_seconds(), productive, 1e-6);
  EXPECT_NEAR(ledger.wall_seconds(At(20)), 20, 1e-6);
  EXPECT_NEAR(ledger.ettr(At(20)), productive / 20, 1e-6);
  const nlohmann::json j = cost->ToJson();
  EXPECT_EQ(j["action"], "time_lost");
  EXPECT_NEAR(j["seconds"].get<double>(), cost->total_seconds(), 1e-9);
}

TEST(TimeLedgerTest, WithoutARestartEveryStepIsProductive) {
  TimeLedger ledger;
  EXPECT_EQ(ledger.ettr(At(5)), 1.0);  // nothing launched yet
  ledger.Launched(2, At(0));
  Steps(&ledger, 0, 5, 1.0);  // a second of start-up, then 5 steps to 5.9 s
  EXPECT_NEAR(ledger.productive_seconds(), 4.9, 1e-6);
  EXPECT_NEAR(ledger.ettr(At(5.9)), 4.9 / 5.9, 1e-6);
  EXPECT_TRUE(ledger.restarts().empty());
}

TEST(TimeLedgerTest, ARankThatReportsNoLoadHasItCountedInTheRelaunch) {
  TimeLedger ledger;
  ledger.Launched(1, At(0));
  ledger.Observe(0, Ev(trace::EventType::kStepBegin, 0, 1));
  ledger.Fault("hang", {0}, "n", At(2), At(5));
  ledger.Stopped(At(6), 0);
  ledger.Launched(1, At(6));
  ledger.Observe(0, Ev(trace::EventType::kStepBegin, 0, 9));
  std::optional<RestartCost> cost = ledger.Settle();
  ASSERT_TRUE(cost);
  EXPECT_NEAR(cost->detection_seconds, 3, 1e-6);
  EXPECT_NEAR(cost->relaunch_seconds, 3, 1e-6);
  EXPECT_EQ(cost->load_seconds, 0);
  EXPECT_EQ(cost->steps_redone, 0u);
  EXPECT_NEAR(cost->redo_seconds, 1, 1e-6);  // the interrupted step's second
}

TEST(TimeLedgerTest, AFaultDuringARelaunchIsChargedToTheFirstRestart) {
  TimeLedger ledger;
  ledger.Launched(1, At(0));
  ledger.Fault("dead", {0}, "n", At(1), At(1));
  ledger.Stopped(At(1.5), 1);
  ledger.Launched(1, At(2.5));
  ledger.Fault("dead", {0}, "n", At(3), At(3));  // the relaunch failed before any step
  ledger.Stopped(At(3.5), 2);
  ledger.Launched(1, At(5.5));
  ledger.Observe(0, Ev(trace::EventType::kStepBegin, 0, 6));
  std::optional<RestartCost> cost = ledger.Settle();
  ASSERT_TRUE(cost);
  EXPECT_NEAR(cost->total_seconds(), 5, 1e-6) << "every second from the first fault to the first step";
  EXPECT_EQ(ledger.restarts().size(), 1u);
}

}  // namespace time_ledger_test
}  // namespace lifeline::agent
