// lifeline-sim on a small job: every drill's culprits named with the right kind by the agents'
// real detectors, and nothing named in clean runs.
#include "agent/sim/sim.h"

#include <algorithm>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace lifeline::agent::sim {
namespace {

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

}  // namespace
}  // namespace lifeline::agent::sim
