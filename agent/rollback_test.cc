// The rollback policy: which checkpoint a rollback resumes from, what data it skips, when it gives
// up; and the Supervisor deciding it from a NaN loss as the agent drives it.
#include "agent/rollback.h"

#include <cstring>
#include <limits>
#include <optional>

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

// Adam's state flipped at step 40, which is saved: the loss is NaN at 41. The first rollback goes
// to 40 (the newest before the fault); the NaN is back at 41, the first step after it, so 40 holds
// the damage: the second goes to 30, replaying the data (it was not at fault), not giving up.
TEST(RollbackLedgerTest, ACheckpointThatBringsTheFaultStraightBackIsPassedOver) {
  RollbackConfig config;  // on_repeat, 2 per checkpoint
  RollbackLedger ledger(config);
  const auto listing = Disk({40, 30, 20});
  RollbackDecision first = ledger.Decide(At("non_finite", 41), 41, listing);
  ASSERT_EQ(*first.point.step, 40u);
  RollbackDecision second = ledger.Decide(At("non_finite", 41), 41, listing);
  EXPECT_EQ(second.give_up, "");
  ASSERT_TRUE(second.point.step);
  EXPECT_EQ(*second.point.step, 30u);
  EXPECT_EQ(second.point.passed_over, (std::vector<uint64_t>{40}));
  EXPECT_NE(second.point.why.find("step 40 is passed over too"), std::string::npos) << second.point.why;
  EXPECT_EQ(second.repeat, 0u);
  EXPECT_FALSE(second.skipped);
  EXPECT_EQ(second.steps_rolled_back(), 11u);
  // A fault that comes back later than the first step is the data's: the same checkpoint again,
  // its steps skipped (on_repeat).
  RollbackLedger data(config);
  ASSERT_EQ(*data.Decide(At("spike", 45), 46, listing).point.step, 40u);
  RollbackDecision again = data.Decide(At("spike", 45), 46, listing);
  EXPECT_EQ(*again.point.step, 40u);
  EXPECT_TRUE(again.skipped);
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

// Three replicas step to 6; at the snapshot of `step` rank `bad`'s copy of one tensor differs from
// the others' (its digest): the poll that judges it.
PollDecision SdcAt(Supervisor& s, uint64_t step, int bad, uint64_t* now, const std::optional<RoundPlan>& plan = {},
                   int rank_base = 0) {
  SupervisedLaunch l;
  l.world = 3;
  l.rank_base = rank_base;
  l.now_ns = *now;
  l.plan = plan;
  s.Launched(l);
  // A multi-node job: this node leads its round, reading its own summaries back as Rendezvous
  // hands them over, and its questions come back as the round's digest queries.
  RendezvousNews news;
  news.leader = true;
  for (uint64_t k = 0; k <= (plan ? 60 : 6); ++k) {
    *now += 100 * kMs;
    for (int r = 0; r < 3; ++r) {
      s.Observe(r, Ev(EventType::kStepBegin, *now, k));
      s.Observe(r, Ev(EventType::kStepEnd, *now + kMs, k));
      if (k % 2 != 0) continue;
      trace::Event e;  // one replicated tensor of 4 KiB, three replicas
      e.time_ns = *now + 2 * kMs;
      e.type = EventType::kReplicaDigest;
      e.comm = 3;
      e.step = k;
      e.seq = 0x1234;
      e.bytes = 4096;
      e.duration_ns = 0;
      e.aux = r == bad && k >= step ? 0xbad : 0x600d;
      s.Observe(r, e);
    }
    PollInput in;
    in.now_ns = *now + 3 * kMs;
    if (plan) in.news = &news;
    PollDecision d = s.Poll(in);
    if (d.restart || !d.raised.empty()) return d;
    news.progress.clear();
    if (d.progress) {
      news.progress.push_back({"summary of node id-b", *d.progress});
      news.progress_acked = SummaryNumber(*d.progress);
    }
    news.digest_queries.insert(news.digest_queries.end(), d.digest_queries.begin(), d.digest_queries.end());
  }
  return {};
}

AgentConfig SdcConfig() {
  AgentConfig config;
  config.nproc = 3;
  config.rendezvous.node_name = "host-a";
  return config;
}

TEST(SupervisorRollbackTest, AnSdcSuspectRollsBackBeforeTheSuspectStepAndNeverSkipsItsData) {
  AgentConfig config = SdcConfig();
  config.rollback.skip_data = RollbackConfig::SkipData::kAlways;  // for non_finite and spike only
  Around around;
  Supervisor s(config, &around);
  uint64_t now = 10 * kSec;
  const PollDecision d = SdcAt(s, 4, 2, &now);
  ASSERT_TRUE(d.restart);
  EXPECT_TRUE(d.rollback);  // the default policy of sdc_suspect
  EXPECT_EQ(d.restart->kind, "sdc_suspect");
  EXPECT_EQ(d.restart->ranks, std::vector<int>{2});
  ASSERT_EQ(d.raised.size(), 1u);
  EXPECT_EQ(d.raised[0].record["policy"], "rollback");

  // Step 4 is marked suspect by then, so the listing lacks it; step 6 (newer) is passed over.
  const RollbackPlan plan = s.PlanRollback(*d.restart, now, {{0, ""}, {0, ""}, {0, ""}}, Disk({6, 2, 0}));
  EXPECT_EQ(plan.restart.give_up, "");
  ASSERT_TRUE(plan.decision.point.step);
  EXPECT_EQ(*plan.decision.point.step, 2u);
  EXPECT_EQ(plan.decision.point.passed_over, (std::vector<uint64_t>{6}));
  EXPECT_FALSE(plan.decision.skipped);  // the data was sound: it is trained again
  EXPECT_TRUE(s.SkipSteps(2).empty());
  EXPECT_EQ(plan.decision.sdc_on_node, 1u);
  EXPECT_EQ(plan.decision.node_out, "");
  // One line with the decision and its evidence: the rank, its node, the tensors that differ.
  const nlohmann::json line = plan.decision.Record(*d.restart);
  EXPECT_EQ(line["action"], "rollback");
  EXPECT_EQ(line["anomaly"], "sdc_suspect");
  EXPECT_EQ(line["ranks"], nlohmann::json::array({2}));
  EXPECT_EQ(line["nodes"], nlohmann::json::array({"host-a"}));
  EXPECT_EQ(line["checkpoint"], 2);
  ASSERT_TRUE(line["evidence"].contains("tensors")) << line.dump();
  EXPECT_EQ(line["evidence"]["tensors"][0]["ranks"], nlohmann::json::array({2}));
}

TEST(SupervisorRollbackTest, ASecondSdcSuspectOnTheSameNodeEndsASingleNodeJobNamingTheNodeAndRank) {
  AgentConfig config = SdcConfig();
  Around around;
  Supervisor s(config, &around);
  uint64_t now = 10 * kSec;
  PollDecision d = SdcAt(s, 4, 2, &now);
  ASSERT_TRUE(d.restart && d.rollback);
  RollbackPlan plan = s.PlanRollback(*d.restart, now, {{0, ""}, {0, ""}, {0, ""}}, Disk({2, 0}));
  ASSERT_EQ(plan.restart.give_up, "");
  // The relaunch: another rank of the same node this time (the node's machine, not one rank).
  d = SdcAt(s, 6, 1, &now);
  ASSERT_TRUE(d.restart && d.rollback);
  plan = s.PlanRollback(*d.restart, now, {{0, ""}, {0, ""}, {0, ""}}, Disk({4, 2, 0}));
  EXPECT_EQ(plan.decision.sdc_on_node, 2u);
  EXPECT_EQ(plan.decision.node_out, "host-a");
  const std::string& why = plan.restart.give_up;
  EXPECT_NE(why.find("node host-a (rank 1)"), std::string::npos) << why;
  EXPECT_NE(why.find("for the 2nd time"), std::string::npos) << why;
  EXPECT_NE(why.find("a single-node job cannot leave it out"), std::string::npos) << why;
  EXPECT_TRUE(plan.restart.job_wide);
  EXPECT_TRUE(plan.restart.incurable);  // a requeue could land on the same machine
  EXPECT_EQ(plan.decision.Record(*d.restart)["node_out"], "host-a");

  // A node with no name (lifeline-sim, a test) is taken out all the same, as "this node".
  AgentConfig unnamed = SdcConfig();
  unnamed.rendezvous.node_name.clear();
  Supervisor u(unnamed, &around);
  for (int launch = 0; launch < 2; ++launch) {
    d = SdcAt(u, 4, 2, &now);
    ASSERT_TRUE(d.restart && d.rollback) << launch;
    plan = u.PlanRollback(*d.restart, now, {{0, ""}, {0, ""}, {0, ""}}, Disk({2}));
  }
  EXPECT_NE(plan.restart.give_up.find("this node (rank 2) held a replica unlike the others' for the 2nd time"),
            std::string::npos) << plan.restart.give_up;

  // rollback.sdc_per_node: 0 never takes a node out; the rollbacks go on.
  AgentConfig never = SdcConfig();
  never.rollback.sdc_per_node = 0;
  Supervisor t(never, &around);
  for (int launch = 0; launch < 2; ++launch) {
    d = SdcAt(t, 4, 2, &now);
    ASSERT_TRUE(d.restart && d.rollback) << launch;
    plan = t.PlanRollback(*d.restart, now, {{0, ""}, {0, ""}, {0, ""}}, Disk({2 + 2 * static_cast<uint64_t>(launch)}));
    EXPECT_EQ(plan.restart.give_up, "") << launch;
    EXPECT_EQ(plan.decision.node_out, "") << launch;
  }
}

// Round `round` of two nodes of `nproc` ranks: host-a (id-a), host-b (id-b).
RoundPlan TwoNodes(uint64_t round, uint32_t nproc) {
  RoundPlan plan;
  plan.round = round;
  plan.world_size = 2 * nproc;
  for (const char* name : {"host-a", "host-b"}) {
    RoundNode n;
    n.id = std::string("id-") + name[5];
    n.name = name;
    n.nproc = nproc;
    plan.nodes.push_back(n);
  }
  return plan;
}

TEST(SupervisorRollbackTest, InAMultiNodeJobTheRepeatNamesTheNodeToExcludeAndTheRollbackGoesOn) {
  AgentConfig config = SdcConfig();
  Around around;
  Supervisor s(config, &around, "id-b");
  RoundPlan plan = TwoNodes(1, 3);
  plan.group_rank = 1;
  plan.rank_base = 3;
  uint64_t now = 10 * kSec;
  for (int launch = 0; launch < 2; ++launch) {
    const PollDecision d = SdcAt(s, 4, 1, &now, plan, 3);
    ASSERT_TRUE(d.restart && d.rollback) << launch;  // rolled back in a multi-node job too
    EXPECT_EQ(d.restart->ranks, std::vector<int>{4});
    // Judged by the round's leader from the folds, with the tensor its question brought back.
    EXPECT_EQ(d.restart->evidence["compared_by"], "leader");
    EXPECT_EQ(d.restart->evidence["nodes"]["4"], "host-b");
    EXPECT_EQ(d.restart->evidence["tensors"][0]["ranks"], nlohmann::json({4}));
    EXPECT_FALSE(d.restart->evidence.contains("details_missing"));
    const RollbackPlan p = s.PlanRollback(*d.restart, now, {{0, ""}, {0, ""}, {0, ""}}, Disk({2}));
    EXPECT_EQ(p.restart.give_up, "") << launch;
    EXPECT_EQ(p.decision.nodes, std::vector<std::string>{"host-b"});
    EXPECT_EQ(p.decision.node_out, launch == 0 ? "" : "host-b") << launch;
  }
}

// A multi-node job: node b's two ranks hold a NaN gradient norm at step 25 only because the
// all-reduce spread it (their losses stay finite). Polled every 100 ms for 12 s after it; the round
// moves at `move_after` seconds when given. The decisions that raised something, and every record.
struct SpreadRun {
  std::vector<RaisedAnomaly> raised;
  double raised_after = -1;  // seconds after the NaN step
  std::vector<nlohmann::json> records;
};

SpreadRun SpreadAt(bool leader, std::optional<double> move_after) {
  AgentConfig config;
  config.nproc = 2;
  Around around;
  Supervisor s(config, &around, "id-b");
  RoundPlan plan = TwoNodes(0, 2);
  plan.group_rank = 1;
  plan.rank_base = 2;
  SupervisedLaunch l;
  l.world = 2;
  l.rank_base = 2;
  l.now_ns = 10 * kSec;
  l.plan = plan;
  s.Launched(l);
  uint64_t now = 10 * kSec;
  SpreadRun run;
  for (uint64_t k = 0; k < 26 + 120; ++k) {
    now += 100 * kMs;
    for (int r = 0; r < 2 && k <= 30; ++r) {
      s.Observe(r, Ev(EventType::kStepBegin, now, k));
      s.Observe(r, Loss(now + kMs, k, 1.0 + 0.01 * k));
      trace::Event norm = Loss(now + kMs, k, k >= 25 ? std::numeric_limits<double>::quiet_NaN() : 2.0);
      norm.comm = trace::kGradNormScalar;
      s.Observe(r, norm);
      s.Observe(r, Ev(EventType::kStepEnd, now + 2 * kMs, k));
    }
    RendezvousNews news;
    news.leader = leader;
    const double after = k >= 25 ? (k - 25) * 0.1 : -1;
    if (move_after && after >= *move_after) news.round = 1;
    PollInput in;
    in.now_ns = now + 3 * kMs;
    in.news = &news;
    PollDecision d = s.Poll(in);
    run.records.insert(run.records.end(), d.records.begin(), d.records.end());
    if (!d.raised.empty() && run.raised.empty()) {
      run.raised = d.raised;
      run.raised_after = after;
    }
    if (d.round_moved || d.restart) break;
  }
  return run;
}

// One node's rank went NaN and the all-reduce spread it to every rank of the job: only that node
// (its rank's own value) or, failing it, the round's leader acts; the other nodes hold the spread
// value and let it go when the round moves, so a job of 2,048 nodes records one decision, not 2,048.
TEST(SupervisorRollbackTest, ANonFiniteValueSpreadFromAnotherNodeIsLeftToThatNodeOrTheLeader) {
  const SpreadRun moved = SpreadAt(/*leader=*/false, /*move_after=*/1.0);
  EXPECT_TRUE(moved.raised.empty());
  bool echo = false;
  for (const nlohmann::json& r : moved.records)
    if (r.value("action", "") == "echo" && r.value("anomaly", "") == "non_finite" && !r.contains("kind")) echo = true;
  EXPECT_TRUE(echo);

  const SpreadRun by_leader = SpreadAt(/*leader=*/true, std::nullopt);
  ASSERT_EQ(by_leader.raised.size(), 1u);
  EXPECT_EQ(by_leader.raised[0].anomaly.kind, "non_finite");
  EXPECT_EQ(by_leader.raised[0].anomaly.evidence["decided_by"], "leader");
  EXPECT_EQ(by_leader.raised[0].action, Action::kRollback);
  EXPECT_GE(by_leader.raised_after, kSpreadHoldSeconds);
  EXPECT_LT(by_leader.raised_after, kSpreadHoldSeconds + 1);

  // The leader did nothing (its ranks did not see it): the node acts after the backup wait.
  const SpreadRun backup = SpreadAt(/*leader=*/false, std::nullopt);
  ASSERT_EQ(backup.raised.size(), 1u);
  EXPECT_EQ(backup.raised[0].anomaly.evidence["decided_by"], "node");
  EXPECT_GE(backup.raised_after, kSpreadHoldSeconds + kSpreadBackupSeconds);
  EXPECT_NE(backup.raised[0].anomaly.message.find("this node does"), std::string::npos);
}

TEST(RollbackLedgerTest, RangesAdoptedFromAnotherNodeAreSkippedAsOwnOnes) {
  RollbackLedger ledger(RollbackConfig{});
  ledger.Adopt({{21, 27}, {21, 27}, {40, 41}});
  EXPECT_EQ(ledger.skips().size(), 2u);
  EXPECT_EQ(FormatStepRanges(ledger.SkipAfter(20)), "21-27,40-41");
  EXPECT_EQ(FormatStepRanges(ledger.SkipAfter(25)), "26-27,40-41");
}

}  // namespace
}  // namespace lifeline::agent
