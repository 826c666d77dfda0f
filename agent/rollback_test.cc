// The rollback policy: which checkpoint a rollback resumes from, what data it skips, when it gives
// up; and the Supervisor deciding it from a NaN loss as the agent drives it.
#include "agent/rollback.h"

#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"
#include "agent/detectors/event_simulator.h"
#include "agent/supervisor.h"

namespace lifeline::agent {
namespace {

using simulation::Ev;
using simulation::kMs;
using simulation::kSec;
using trace::EventType;

std::vector<ResumableStep> Disk(std::initializer_list<uint64_t> steps) {
  std::vector<ResumableStep> out;
  for (uint64_t s : steps) out.push_back({s, "disk"});
  return out;
}

Anomaly At(const std::string& kind, uint64_t step) {
  Anomaly a;
  a.kind = kind;
  a.step = step;
  a.ranks = {1};
  a.message = kind + " at step " + std::to_string(step);
  return a;
}

Anomaly SpikeOver(uint64_t first, uint64_t last) {
  Anomaly a = At("spike", first);
  for (uint64_t s = first; s <= last; ++s) a.evidence["steps"].push_back(s);
  return a;
}

TEST(ChooseRollbackPointTest, TheNewestCheckpointBeforeTheFaultNeverOneAtOrAfterIt) {
  const RollbackPoint p = ChooseRollbackPoint(Disk({50, 40, 30, 45, 20}), 45);
  ASSERT_TRUE(p.step);
  EXPECT_EQ(*p.step, 40u);
  EXPECT_EQ(p.location, "disk");
  EXPECT_EQ(p.passed_over, (std::vector<uint64_t>{50, 45}));  // 45 was saved after step 45's update
  EXPECT_NE(p.why.find("passed over steps 50, 45"), std::string::npos) << p.why;
}

TEST(ChooseRollbackPointTest, TheMemoryTiersCopyIsPreferredForTheSameStep) {
  std::vector<ResumableStep> listing = Disk({30, 20});
  listing.push_back({30, "memory"});
  listing.push_back({60, "memory"});
  const RollbackPoint p = ChooseRollbackPoint(listing, 31);
  EXPECT_EQ(*p.step, 30u);
  EXPECT_EQ(p.location, "memory");
  EXPECT_EQ(p.passed_over, (std::vector<uint64_t>{60}));
}

TEST(ChooseRollbackPointTest, NoCheckpointBeforeTheFaultStartsFromScratch) {
  const RollbackPoint p = ChooseRollbackPoint(Disk({10, 20}), 10);
  EXPECT_FALSE(p.step);
  EXPECT_EQ(p.location, "");
  EXPECT_EQ(p.passed_over, (std::vector<uint64_t>{20, 10}));
  EXPECT_NE(p.why.find("start from scratch"), std::string::npos) << p.why;
  EXPECT_FALSE(ChooseRollbackPoint({}, 5).step);
}

TEST(StepRangesTest, FormattedAsTheRanksReadThem) {
  EXPECT_EQ(FormatStepRanges({{41, 47}, {60, 60}}), "41-47,60");
  EXPECT_EQ(FormatStepRanges({}), "");
}

TEST(AnomalyLastStepTest, ASpikesRunEndsWhereItsLastHighValueIs) {
  EXPECT_EQ(AnomalyLastStep(SpikeOver(45, 47)), 47u);
  EXPECT_EQ(AnomalyLastStep(At("non_finite", 45)), 45u);
  EXPECT_FALSE(AnomalyLastStep(Anomaly{}));
}

TEST(RollbackLedgerTest, ReplaysFirstSkipsTheDataOnARepeatThenGivesUp) {
  RollbackConfig config;  // on_repeat, 2 per checkpoint
  RollbackLedger ledger(config);
  const auto listing = Disk({40, 30});

  RollbackDecision first = ledger.Decide(SpikeOver(45, 47), 48, listing);
  EXPECT_EQ(first.give_up, "");
  EXPECT_EQ(*first.point.step, 40u);
  EXPECT_EQ(first.repeat, 0u);
  EXPECT_FALSE(first.skipped);  // a transient fault does not come back: the same data again
  EXPECT_TRUE(first.skip.empty());

  RollbackDecision second = ledger.Decide(SpikeOver(45, 47), 47, listing);
  EXPECT_EQ(second.give_up, "");
  EXPECT_EQ(second.repeat, 1u);
  ASSERT_TRUE(second.skipped);
  EXPECT_EQ(FormatStepRanges(second.skip), "41-47");  // every step rolled back: after the checkpoint to the newest reached
  EXPECT_EQ(second.steps_rolled_back(), 7u);

  RollbackDecision third = ledger.Decide(SpikeOver(45, 47), 47, listing);
  EXPECT_NE(third.give_up.find("spike at step 45 again after 2 rollbacks to step 40"), std::string::npos)
      << third.give_up;
  EXPECT_NE(third.give_up.find("deterministically"), std::string::npos);
  EXPECT_NE(third.give_up.find("lifeline.skip_steps()"), std::string::npos) << third.give_up;
  EXPECT_EQ(ledger.rollbacks(), 2u);
  EXPECT_EQ(third.Record(SpikeOver(45, 47))["action"], "rollback_give_up");
}

TEST(RollbackLedgerTest, AlwaysSkipsAtTheFirstRollbackAndNeverNeverDoes) {
  RollbackConfig always;
  always.skip_data = RollbackConfig::SkipData::kAlways;
  RollbackLedger a(always);
  const RollbackDecision d = a.Decide(At("non_finite", 25), 26, Disk({20, 10}));
  EXPECT_EQ(FormatStepRanges(d.skip), "21-26");  // the ranks had reached step 26
  EXPECT_EQ(d.steps_rolled_back(), 6u);  // 21..26 trained again
  const nlohmann::json record = d.Record(At("non_finite", 25));
  EXPECT_EQ(record["action"], "rollback");
  EXPECT_EQ(record["checkpoint"], 20);
  EXPECT_EQ(record["anomaly_step"], 25);
  EXPECT_EQ(record["skipped"], "21-26");
  EXPECT_EQ(record["steps_rolled_back"], 6);

  RollbackConfig never;
  never.skip_data = RollbackConfig::SkipData::kNever;
  never.max_per_checkpoint = 1;
  RollbackLedger n(never);
  EXPECT_TRUE(n.Decide(At("non_finite", 25), 26, Disk({20})).skip.empty());
  const RollbackDecision again = n.Decide(At("non_finite", 25), 26, Disk({20}));
  EXPECT_NE(again.give_up.find("rollback.skip_data: on_repeat"), std::string::npos) << again.give_up;
}

TEST(RollbackLedgerTest, SkippedRangesStayForLaterLaunchesThatResumeBeforeTheirEnd) {
  RollbackConfig always;
  always.skip_data = RollbackConfig::SkipData::kAlways;
  RollbackLedger ledger(always);
  (void)ledger.Decide(At("non_finite", 25), 25, Disk({20}));
  (void)ledger.Decide(At("spike", 62), 62, Disk({60, 20}));
  EXPECT_EQ(FormatStepRanges(ledger.SkipAfter(20)), "21-25,61-62");
  EXPECT_EQ(FormatStepRanges(ledger.SkipAfter(23)), "24-25,61-62");  // a later restart from step 23
  EXPECT_EQ(FormatStepRanges(ledger.SkipAfter(60)), "61-62");
  EXPECT_EQ(FormatStepRanges(ledger.SkipAfter(std::nullopt)), "21-25,61-62");
  EXPECT_TRUE(ledger.SkipAfter(70).empty());
}

TEST(RollbackLedgerTest, RollbacksToDifferentCheckpointsAreCountedApart) {
  RollbackConfig config;
  config.max_per_checkpoint = 1;
  RollbackLedger ledger(config);
  EXPECT_EQ(ledger.Decide(At("non_finite", 25), 25, Disk({20})).give_up, "");
  EXPECT_EQ(ledger.Decide(At("non_finite", 45), 45, Disk({40, 20})).give_up, "");  // a new fault, later
  EXPECT_NE(ledger.Decide(At("non_finite", 45), 45, Disk({40, 20})).give_up, "");
}

// The Supervisor, as the agent drives it.
class Around final : public simulation::QuietSurroundings {
 public:
  bool CheckpointDirKnown() override { return known; }
  bool known = true;
};

trace::Event Loss(uint64_t t, uint64_t step, double value) {
  trace::Event e;
  e.time_ns = t;
  e.type = EventType::kScalar;
  e.comm = trace::kLossScalar;
  e.step = step;
  std::memcpy(&e.aux, &value, sizeof(value));
  return e;
}

// Two ranks step to `steps` (exclusive), rank 1's loss NaN at step `nan_at`; the poll after.
PollDecision NanAt(Supervisor& s, uint64_t nan_at, uint64_t steps, uint64_t* now) {
  SupervisedLaunch l;
  l.world = 2;
  l.now_ns = *now;
  s.Launched(l);
  PollDecision last;
  for (uint64_t k = 0; k < steps; ++k) {
    *now += 100 * kMs;
    for (int r = 0; r < 2; ++r) {
      s.Observe(r, Ev(EventType::kStepBegin, *now, k));
      const double v = r == 1 && k == nan_at ? std::numeric_limits<double>::quiet_NaN() : 1.0 + 0.01 * k;
      s.Observe(r, Loss(*now + kMs, k, v));
      s.Observe(r, Ev(EventType::kStepEnd, *now + 2 * kMs, k));
    }
    PollInput in;
    in.now_ns = *now + 3 * kMs;
    PollDecision d = s.Poll(in);
    if (d.restart || !d.raised.empty()) return d;
    last = std::move(d);
  }
  return last;
}

TEST(SupervisorRollbackTest, ANanLossRollsBackToTheCheckpointBeforeItAndTheRestartBudgetCountsIt) {
  AgentConfig config;
  config.nproc = 2;
  Around around;
  Supervisor s(config, &around);
  uint64_t now = 10 * kSec;
  const PollDecision d = NanAt(s, 25, 40, &now);
  ASSERT_TRUE(d.restart);
  EXPECT_TRUE(d.rollback);  // the default policy of non_finite
  EXPECT_EQ(d.restart->kind, "non_finite");
  ASSERT_EQ(d.raised.size(), 1u);
  EXPECT_EQ(d.raised[0].record["policy"], "rollback");

  const RollbackPlan plan = s.PlanRollback(*d.restart, now, {{0, ""}, {0, ""}}, Disk({30, 20, 10}));
  EXPECT_EQ(plan.restart.give_up, "");
  EXPECT_EQ(*plan.decision.point.step, 20u);
  EXPECT_EQ(plan.decision.point.passed_over, (std::vector<uint64_t>{30}));
  EXPECT_EQ(plan.decision.anomaly_step, 25u);
  EXPECT_GE(plan.decision.reached_step, 26u);  // the NaN is judged once both ranks stepped past it
  EXPECT_EQ(plan.restart.backoff_seconds, 0);  // the launch ran: relaunched at once
}

TEST(SupervisorRollbackTest, TheSameNanAfterTwoRollbacksGivesUpAndARequeueWouldNotHelp) {
  AgentConfig config;
  config.nproc = 2;
  config.rollback.skip_data = RollbackConfig::SkipData::kNever;
  Around around;
  Supervisor s(config, &around);
  uint64_t now = 10 * kSec;
  RollbackPlan plan;
  for (int launch = 0; launch < 3; ++launch) {
    const PollDecision d = NanAt(s, 25, 40, &now);
    ASSERT_TRUE(d.restart && d.rollback) << launch;
    plan = s.PlanRollback(*d.restart, now, {{0, ""}, {0, ""}}, Disk({20}));
    if (launch < 2) EXPECT_EQ(plan.restart.give_up, "") << launch;
  }
  EXPECT_NE(plan.restart.give_up.find("non_finite at step 25 again after 2 rollbacks to step 20"), std::string::npos)
      << plan.restart.give_up;
  EXPECT_TRUE(plan.restart.incurable);
}

TEST(SupervisorRollbackTest, WithNoCheckpointDirectoryKnownOrThePolicyLogTheRanksTrainOn) {
  AgentConfig config;
  config.nproc = 2;
  Around around;
  around.known = false;
  Supervisor s(config, &around);
  uint64_t now = 10 * kSec;
  const PollDecision d = NanAt(s, 25, 40, &now);
  EXPECT_FALSE(d.restart);
  bool named = false;
  for (const RaisedAnomaly& r : d.raised) {
    if (r.anomaly.kind != "non_finite") continue;
    named = true;
    EXPECT_EQ(r.record["policy"], "rollback");
    EXPECT_NE(r.record.value("not_acted_on", "").find("no checkpoint directory is known"), std::string::npos);
  }
  EXPECT_TRUE(named);

  AgentConfig log = config;
  log.policy["non_finite"] = Action::kLog;
  Around known;
  Supervisor quiet(log, &known);
  now = 10 * kSec;
  EXPECT_FALSE(NanAt(quiet, 25, 40, &now).restart);
}

}  // namespace
}  // namespace lifeline::agent
