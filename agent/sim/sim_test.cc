// lifeline-sim on a small job: every drill's culprits named with the right kind by the agents'
// real detectors, and nothing named in clean runs.
#include "agent/sim/sim.h"

#include <algorithm>
#include <csignal>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace lifeline::agent::sim {
namespace sim_test {

SimConfig SmallJob() {
  SimConfig c;
  c.ranks = 64;
  c.nodes = 8;
  c.agent.hang.floor_seconds = 5;
  // A lost node must be named before its stale summary makes the job-wide view call its ranks
  // hung: the lease shorter than the hang timeout, as in tests/agent/multinode_drill_test.cc.
  c.agent.rendezvous.lease_seconds = 3;
  return c;
}

std::string Describe(const DrillResult& r) { return r.drill.name + " (seed " + std::to_string(r.drill.seed) + "): " + r.verdict; }

TEST(SimTest, EveryDrillNamesItsCulpritsAndKind) {
  const SimConfig config = SmallJob();
  const std::vector<Drill> drills = MakeDrills(config, 20, 3, /*seed=*/7);
  std::set<std::string> kinds;
  for (const Drill& d : drills) {
    const DrillResult r = RunDrill(config, d);
    if (d.faults.empty()) {
      EXPECT_TRUE(r.raised.empty()) << Describe(r);
      continue;
    }
    kinds.insert(d.name);
    EXPECT_TRUE(r.correct) << Describe(r);
    EXPECT_EQ(r.false_alarms, 0) << Describe(r);
    ASSERT_EQ(r.faults.size(), d.faults.size());
    for (size_t i = 0; i < d.faults.size(); ++i) {
      EXPECT_TRUE(r.faults[i].named) << Describe(r);
      EXPECT_EQ(r.faults[i].expected_kind, ExpectedKind(d.faults[i].kind));
      if (d.faults[i].kind != FaultKind::kNodeLoss) {
        EXPECT_EQ(r.faults[i].culprits, std::vector<int>{d.faults[i].rank});
      }
    }
    // Every anomaly names a faulty rank with its fault's kind.
    for (const Raised& a : r.raised) {
      ASSERT_FALSE(a.anomaly.ranks.empty()) << Describe(r);
      bool fits = false;
      for (const FaultOutcome& f : r.faults)
        for (int rank : a.anomaly.ranks)
          fits = fits || (a.anomaly.kind == f.expected_kind &&
                          std::find(f.culprits.begin(), f.culprits.end(), rank) != f.culprits.end());
      EXPECT_TRUE(fits) << a.anomaly.kind << ": " << a.anomaly.message << " in " << Describe(r);
    }
  }
  // The seed draws every kind of fault, so the assertions above cover them all.
  for (const char* kind : {"hang", "crash", "node_loss", "straggler", "slow_link"})
    EXPECT_TRUE(kinds.count(kind)) << kind << " not drawn";
}

TEST(SimTest, NodeLossNamesTheNodesRanks) {
  const SimConfig config = SmallJob();
  Drill d;
  d.name = "node_loss";
  d.seed = 11;
  Fault f;
  f.kind = FaultKind::kNodeLoss;
  f.rank = 21;  // node 2: ranks 16..23
  f.step = 62;
  d.faults.push_back(f);
  d.steps = 63;
  const DrillResult r = RunDrill(config, d);
  ASSERT_EQ(r.faults.size(), 1u);
  EXPECT_EQ(r.faults[0].culprits, (std::vector<int>{16, 17, 18, 19, 20, 21, 22, 23}));
  EXPECT_TRUE(r.correct) << Describe(r);
  ASSERT_FALSE(r.raised.empty());
  EXPECT_EQ(r.raised[0].anomaly.kind, "node_lost");
}

TEST(SimTest, DrillsRepeatFromTheirSeed) {
  const SimConfig config = SmallJob();
  const std::vector<Drill> a = MakeDrills(config, 6, 1, 3);
  const std::vector<Drill> b = MakeDrills(config, 6, 1, 3);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].seed, b[i].seed);
  }
  const DrillResult x = RunDrill(config, a[0]);
  const DrillResult y = RunDrill(config, a[0]);
  EXPECT_EQ(x.verdict, y.verdict);
  EXPECT_EQ(x.raised.size(), y.raised.size());
}


// Two ranks on two nodes fail on their own in the same step, both with an exit status (which a
// peer's failure could also cause), 64 ms apart: each died in its compute, not in a collective, so
// neither is held as the other's echo, and both are named, unless the second node had already left
// the round for the first's restart when its rank failed (its ranks were being stopped: not scored;
// the agents' phases vary by seed).
TEST(SimTest, TwoIndependentCrashesOnTwoNodesAreBothNamed) {
  const SimConfig config = SmallJob();
  int both = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    Drill d;
    d.name = "crash+crash";
    d.seed = seed;
    Fault a;
    a.kind = FaultKind::kCrash;
    a.rank = 9;  // node 1
    a.step = 62;
    a.wait_status = 1 << 8;  // exit(1)
    a.at_fraction = 0.1;
    Fault b = a;
    b.rank = 50;  // node 6
    b.wait_status = SIGABRT;
    b.at_fraction = 0.9;
    d.faults = {a, b};
    d.steps = 63;
    const DrillResult r = RunDrill(config, d);
    ASSERT_EQ(r.faults.size(), 2u);
    EXPECT_TRUE(r.faults[0].named) << Describe(r);
    EXPECT_TRUE(r.faults[1].named || r.faults[1].preempted) << Describe(r);
    EXPECT_TRUE(r.echoes.empty()) << Describe(r);
    EXPECT_TRUE(r.correct) << Describe(r);
    both += r.faults[1].named ? 1 : 0;
  }
  EXPECT_GE(both, 4);
}

// A crash that brings peers on two other nodes down (exit status 1, inside the allreduce the crashed
// rank never joined, 50 ms later): those are echoes, held and logged as such, and only the crashed
// rank is named.
TEST(SimTest, EchoesOfACrashOnOtherNodesAreHeldNotNamed) {
  SimConfig config = SmallJob();
  // The echoes come about 0.1 s after the crash; the other nodes must still be in the round then
  // (with news of the restart every 0.1 s they are often stopping their ranks already, and the
  // echoes never happen): the watcher's news every 0.25 s, as a node that does not lead has it.
  config.watch_seconds = 0.25;
  Drill d;
  d.name = "crash";
  d.seed = 9;
  Fault f;
  f.kind = FaultKind::kCrash;
  f.rank = 9;  // node 1
  f.step = 62;
  f.wait_status = 1 << 8;
  f.at_fraction = 0.3;
  f.echo_ranks = {30, 50};  // nodes 3 and 6
  d.faults = {f};
  d.steps = 63;
  const DrillResult r = RunDrill(config, d);
  ASSERT_EQ(r.faults.size(), 1u);
  EXPECT_TRUE(r.faults[0].named) << Describe(r);
  EXPECT_EQ(r.false_alarms, 0) << Describe(r);
  EXPECT_TRUE(r.correct) << Describe(r);
  std::vector<int> echoes = r.echoes;
  std::sort(echoes.begin(), echoes.end());
  EXPECT_EQ(echoes, (std::vector<int>{30, 50})) << Describe(r);
}

// Issue 35, item 4: a drill's restart is carried through (stop, back-off, relaunch, load, the first
// step again) and its cost is accounted by phase: a crash is detected at once, a hang a timeout
// after its culprit's last event; the steps since the newest checkpoint are redone; the drill's
// ETTR falls below 1 by what the restart cost. The report sums it up.
TEST(SimTest, ARestartsTimeLostIsAccountedByPhase) {
  const SimConfig config = SmallJob();
  std::vector<DrillResult> results;
  bool saw_crash = false, saw_hang = false;
  for (const Drill& d : MakeDrills(config, 20, 2, /*seed=*/7)) {
    const DrillResult r = RunDrill(config, d);
    results.push_back(r);
    if (d.faults.size() != 1) continue;
    const FaultKind kind = d.faults[0].kind;
    if (kind != FaultKind::kCrash && kind != FaultKind::kHang) continue;
    ASSERT_TRUE(r.restart_cost.has_value()) << Describe(r);
    const RestartCost& c = *r.restart_cost;
    EXPECT_EQ(c.cause, kind == FaultKind::kCrash ? "dead" : "hang") << Describe(r);
    EXPECT_NEAR(c.stop_seconds, config.stop_seconds, 1e-6);
    EXPECT_NEAR(c.load_seconds, config.load_seconds, 1e-6);
    EXPECT_GE(c.relaunch_seconds, config.relaunch_seconds - 1e-6);
    // The fault's step, less the newest checkpoint's, were computed for nothing.
    const uint64_t every = static_cast<uint64_t>(config.checkpoint_every);
    EXPECT_EQ(c.resumed_step, c.interrupted_step / every * every + 1) << Describe(r);
    EXPECT_GT(c.redo_seconds, 0);
    if (kind == FaultKind::kCrash) {
      saw_crash = true;
      EXPECT_LT(c.detection_seconds, 0.1) << "a death is seen at the next poll";
    } else {
      saw_hang = true;
      EXPECT_GE(c.detection_seconds, config.agent.hang.floor_seconds) << "a hang waits its timeout";
    }
    EXPECT_LT(r.ettr, 1.0);
    EXPECT_GT(r.ettr, 0.0);
  }
  EXPECT_TRUE(saw_crash && saw_hang);
  const nlohmann::json report = Report(config, results, 7, 1.0);
  const nlohmann::json& lost = report["time_lost"];
  EXPECT_GT(lost["restarts"].get<int>(), 0);
  EXPECT_GT(lost["mean_seconds_per_restart"].get<double>(), config.relaunch_seconds);
  EXPECT_LT(lost["drills_ettr"].get<double>(), 1.0);
  EXPECT_NEAR(lost["ettr_at_mtbf"].get<double>(),
              1 - lost["mean_seconds_per_restart"].get<double>() / config.mtbf_seconds, 1e-3);
}

// Issue 53, item 5: the cross-rank checks on a small job. 64 ranks on 8 nodes as TP 2 x PP 2 x DP 16
// (Megatron-LM's order: a node holds 4 data-parallel replicas of each of two tensor-parallel
// pieces), so each node's agent compares 4 replicas of every shard it sees. Each fault is named on
// its rank with its kind; the NaN's spread (the norm all-reduced into every rank, the losses after
// the update) is said by the other nodes as such and names no culprit.
SimConfig SignalJob(int tp, int pp) {
  SimConfig c = SmallJob();
  c.signals.enabled = true;
  c.signals.tp = tp;
  c.signals.pp = pp;
  c.signals.shards_per_rank = 4;
  return c;
}

Drill SignalDrill(FaultKind kind, int rank, uint64_t seed) {
  Drill d;
  d.name = FaultName(kind);
  d.seed = seed;
  Fault f;
  f.kind = kind;
  f.rank = rank;
  f.step = 63;  // past the spike detector's 50 values of warm-up
  f.factor = 3;
  d.faults.push_back(f);
  d.steps = 85;  // past the snapshot of step 70
  d.tail_seconds = 32;  // a node's digest comparison waits 30 s for the replicas elsewhere
  return d;
}

TEST(SimTest, CrossRankChecksNameEachSignalFault) {
  const SimConfig config = SignalJob(2, 2);
  for (FaultKind kind :
       {FaultKind::kNormDiffers, FaultKind::kDigestDiffers, FaultKind::kNanLoss, FaultKind::kLossSpike}) {
    const DrillResult r = RunDrill(config, SignalDrill(kind, 37, 3));
    ASSERT_EQ(r.faults.size(), 1u);
    EXPECT_TRUE(r.faults[0].named) << Describe(r);
    EXPECT_EQ(r.faults[0].expected_kind, ExpectedKind(kind));
    EXPECT_TRUE(r.correct) << Describe(r);
    EXPECT_EQ(r.false_alarms, 0) << Describe(r);
    EXPECT_EQ(r.wrong_kind, 0) << Describe(r);
    // Every anomaly scored names rank 37 alone, with the fault's kind.
    int scored = 0;
    for (const Raised& a : r.raised) {
      if (a.anomaly.kind == "non_finite" && a.anomaly.evidence.value("rank_own_value", true) == false) continue;
      ++scored;
      EXPECT_EQ(a.anomaly.kind, ExpectedKind(kind)) << a.anomaly.message;
      EXPECT_EQ(a.anomaly.ranks, std::vector<int>{37}) << a.anomaly.message;
    }
    EXPECT_GE(scored, 1) << Describe(r);
    if (kind != FaultKind::kNanLoss) EXPECT_EQ(r.spread_anomalies, 0) << Describe(r);
  }
}

TEST(SimTest, CrossRankChecksAreSilentOnCleanRuns) {
  const SimConfig config = SignalJob(2, 2);
  const std::vector<Drill> drills = MakeDrills(config, 8, 3, /*seed=*/5);
  std::set<std::string> kinds;
  for (const Drill& d : drills) {
    const DrillResult r = RunDrill(config, d);
    if (d.faults.empty()) {
      EXPECT_TRUE(r.raised.empty()) << Describe(r);
      continue;
    }
    kinds.insert(d.name);
    EXPECT_TRUE(IsSignalFault(d.faults[0].kind)) << d.name;
    EXPECT_TRUE(r.correct) << Describe(r);
    EXPECT_EQ(r.false_alarms, 0) << Describe(r);
  }
  EXPECT_GE(kinds.size(), 3u);
}

// With TP 8 every node holds one replica of its shards, the others being on other nodes: a node's
// agent alone compares nothing. The nodes' folds reach the round's leader with their summaries, and
// it names the replica that differs, with the tensor its question brought back from the rank's node
// (and nothing else is named). A gradient norm that differs is named by the node: its 8 ranks share it.
TEST(SimTest, ADigestWhoseReplicasAreAllOnOtherNodesIsNamedByTheLeader) {
  const SimConfig config = SignalJob(8, 1);
  const DrillResult sdc = RunDrill(config, SignalDrill(FaultKind::kDigestDiffers, 37, 4));
  ASSERT_EQ(sdc.faults.size(), 1u);
  EXPECT_TRUE(sdc.faults[0].named) << Describe(sdc);
  EXPECT_TRUE(sdc.correct) << Describe(sdc);
  EXPECT_EQ(sdc.false_alarms, 0) << Describe(sdc);
  ASSERT_EQ(sdc.raised.size(), 1u) << Describe(sdc);
  const Anomaly& a = sdc.raised[0].anomaly;
  EXPECT_EQ(a.ranks, std::vector<int>{37});
  EXPECT_EQ(a.evidence["compared_by"], "leader");
  EXPECT_FALSE(a.evidence.contains("details_missing")) << a.message;
  EXPECT_EQ(a.evidence["tensors_differing"], 1) << a.message;
  const DrillResult norm = RunDrill(config, SignalDrill(FaultKind::kNormDiffers, 37, 4));
  EXPECT_TRUE(norm.correct) << Describe(norm);

  const nlohmann::json node = MeasureCrossRankCost(config, 32, 8, 60);
  EXPECT_EQ(node["replicas_of_a_shard_in_view"], 1);
  EXPECT_EQ(node["per_snapshot"]["shards_compared"], 0);
  EXPECT_EQ(node["raised"], 0);
  // The leader compares every keyset (a tensor-parallel rank of a stage) once per snapshot, and a
  // clean job raises and asks nothing.
  const nlohmann::json across = MeasureLeaderDigestCost(config, 3);
  EXPECT_EQ(across["leader"]["groups_compared"], 3 * 8 * config.signals.pp);
  EXPECT_EQ(across["leader"]["folds_per_snapshot"], config.ranks);
  EXPECT_EQ(across["raised"], 0);
  EXPECT_EQ(across["queries"], 0);
}

// The cost measure feeds the real detectors a clean job: nothing is raised; a node's view of TP 2
// compares 4 replicas of each of its shards, the job's view all 16 (no timing is asserted).
TEST(SimTest, CrossRankCostMeasureComparesTheReplicasInItsView) {
  const SimConfig config = SignalJob(2, 2);
  const nlohmann::json node = MeasureCrossRankCost(config, 0, 8, 400);
  EXPECT_EQ(node["replicas_of_a_shard_in_view"], 4);
  EXPECT_EQ(node["raised"], 0);
  EXPECT_GT(node["per_snapshot"]["shards_compared"].get<int>(), 0);
  const nlohmann::json job = MeasureCrossRankCost(config, 0, 64, 60);
  EXPECT_EQ(job["replicas_of_a_shard_in_view"], 16);
  EXPECT_EQ(job["raised"], 0);
  // 5 snapshots (steps 10..50) of 2 x 2 pieces x 4 shards, each judged once its 16 replicas are in.
  EXPECT_EQ(job["per_snapshot"]["shards_compared"], 5 * 2 * 2 * 4);
}

}  // namespace sim_test
}  // namespace lifeline::agent::sim
