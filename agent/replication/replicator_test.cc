// Two "nodes" of a 4-rank job, each with its own memory tier holding its 2 ranks' snapshots: once
// each node's replicator has sent its newest step to the other, both tiers hold the whole step,
// committed, and a rank restarted on either node loads it from memory, bit for bit.
#include "agent/replication/replicator.h"

#include <chrono>
#include <filesystem>

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lifeline/checkpoint.h"
#include "agent/replication/replication_service.h"
#include "lifeline/internal/tier_replica.h"
#include "tests/kit/test_kit.h"

namespace lifeline::replication {
namespace replicator_test {

constexpr int64_t kCols = 5000;

std::vector<float> Row(uint32_t rank, uint64_t step) {
  std::vector<float> v(kCols);
  for (int64_t i = 0; i < kCols; ++i) v[i] = static_cast<float>(rank * 100000 + i) + 0.25f * static_cast<float>(step);
  return v;
}

CheckpointerOptions RankOptions(const std::string& dir, const std::string& tier, uint32_t rank) {
  CheckpointerOptions o;
  o.directory = dir;
  o.run_id = "launch-1";
  o.rank = rank;
  o.world_size = 4;
  o.memory_tier = true;
  o.memory_tier_directory = tier;
  o.memory_tier_cleanup_on_close = false;  // a node's tier outlives its processes
  return o;
}

// Every rank saves its row of "w" (4 x kCols) at `step`; ranks 0-1 on tier a, 2-3 on tier b.
void SaveStep(const std::string& dir, const std::string& a, const std::string& b, uint64_t step) {
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      auto ckpt = Checkpointer::Open(RankOptions(dir, r < 2 ? a : b, r));
      ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
      std::vector<float> row = Row(r, step);
      SaveRequest req;
      req.tensors.push_back(TensorShard::Box("w", DType::kF32, {4, kCols}, {r, 0}, {1, kCols}, row.data()));
      Status s = (*ckpt)->Save(step, req).WaitCommitted(60);
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.ToString();
    });
  }
  for (std::thread& t : ranks) t.join();
}

uint64_t RanksInTier(const std::string& tier, uint64_t step) {
  auto all = ListTierSnapshots(Env::Default(), tier);
  uint64_t n = 0;
  for (const TierSnapshot& s : all.value_or(std::vector<TierSnapshot>{})) n += s.step == step;
  return n;
}

ReplicaSendOptions ToLocalhost(uint16_t port) {
  ReplicaSendOptions o;
  o.host = "localhost";
  o.port = port;
  o.chunk_bytes = 16 << 10;
  return o;
}

TEST(ReplicatorTest, TwoNodesEachEndWithTheWholeStepInMemory) {
  test::TempDir disk;
  test::TempDir shm("/dev/shm", "lifeline-replicator-test");
  ASSERT_FALSE(shm.path().empty());
  const std::string dir = disk.Sub("ckpt"), a = shm.Sub("node-a"), b = shm.Sub("node-b");
  SaveStep(dir, a, b, 5);
  ASSERT_EQ(RanksInTier(a, 5), 2u);
  ASSERT_EQ(RanksInTier(b, 5), 2u);

  auto into_a = ReplicaReceiver::Start(a + "/.incoming", 0, TierPlacer(a, 2));
  auto into_b = ReplicaReceiver::Start(b + "/.incoming", 0, TierPlacer(b, 2));
  ASSERT_TRUE(into_a.ok() && into_b.ok());
  auto options = [](const std::string& tier, uint32_t first, uint16_t port) {
    ReplicatorOptions o;
    o.tier_root = tier;
    o.first_rank = first;
    o.ranks = 2;
    o.peers.push_back(ToLocalhost(port));
    return o;
  };
  Replicator from_a(options(a, 0, (*into_b)->port()));
  Replicator from_b(options(b, 2, (*into_a)->port()));
  for (Replicator* r : {&from_a, &from_b}) {
    auto pass = r->RunOnce();
    ASSERT_TRUE(pass.ok()) << pass.status().ToString();
    EXPECT_EQ(pass->step.value_or(0), 5u);
    EXPECT_GT(pass->bytes, 2 * kCols * sizeof(float));
  }
  EXPECT_EQ(RanksInTier(a, 5), 4u);
  EXPECT_EQ(RanksInTier(b, 5), 4u);
  auto again = from_a.RunOnce();
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->step.has_value()) << "step 5 sent twice";
  EXPECT_EQ(from_a.replicated_step().value_or(0), 5u);

  // A rank of the next launch on node a loads another node's row from memory (its own tier).
  CheckpointerOptions o = RankOptions(dir, a, 3);
  o.run_id = "launch-2";
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  std::vector<float> row(kCols);
  LoadRequest load;
  load.tensors.push_back(TensorShard::Box("w", DType::kF32, {4, kCols}, {3, 0}, {1, kCols}, row.data()));
  auto r = (*ckpt)->Load(std::nullopt, load);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->from_memory_tier) << "the replicated step was not complete in node a's tier";
  EXPECT_EQ(r->step, 5u);
  EXPECT_EQ(row, Row(3, 5));
}

// With a group of three, node a's ranks go to both others; a peer that is down does not keep the
// step from the one that is up, and the step counts as replicated only once both have it.
TEST(ReplicatorTest, AGroupSendsToEveryPeerAndCountsTheStepOnlyWhenAllHaveIt) {
  test::TempDir disk;
  test::TempDir shm("/dev/shm", "lifeline-replicator-test");
  ASSERT_FALSE(shm.path().empty());
  const std::string dir = disk.Sub("ckpt"), a = shm.Sub("node-a"), b = shm.Sub("node-b"), c = shm.Sub("node-c");
  SaveStep(dir, a, b, 7);
  std::filesystem::create_directories(c);
  auto into_c = ReplicaReceiver::Start(c + "/.incoming", 0, TierPlacer(c, 2));
  ASSERT_TRUE(into_c.ok());
  // b's receiver is not up yet: a port that refuses connections.
  uint16_t closed_port = 0;
  {
    auto probe = ReplicaReceiver::Start(shm.Sub("probe"), 0);
    ASSERT_TRUE(probe.ok());
    closed_port = (*probe)->port();
  }
  ReplicatorOptions o;
  o.tier_root = a;
  o.first_rank = 0;
  o.ranks = 2;
  o.peers = {ToLocalhost(closed_port), ToLocalhost((*into_c)->port())};
  o.peers[0].connect_timeout_seconds = 0.5;
  Replicator from_a(o);
  auto pass = from_a.RunOnce();
  ASSERT_FALSE(pass.ok()) << "a peer that is down went unnoticed";
  EXPECT_NE(pass.status().ToString().find(std::to_string(closed_port)), std::string::npos) << pass.status().ToString();
  EXPECT_EQ(RanksInTier(c, 7), 2u) << "the peer that is up did not get the step";
  EXPECT_FALSE(from_a.replicated_step().has_value()) << "counted replicated with a peer lacking it";

  auto into_b = ReplicaReceiver::Start(b + "/.incoming", closed_port, TierPlacer(b, 2));
  if (!into_b.ok()) GTEST_SKIP() << "the port was taken meanwhile: " << into_b.status().ToString();
  pass = from_a.RunOnce();
  ASSERT_TRUE(pass.ok()) << pass.status().ToString();
  EXPECT_EQ(RanksInTier(b, 7), 4u) << "node b did not end with the whole step";
  EXPECT_EQ(from_a.replicated_step().value_or(0), 7u);
  pass = from_a.RunOnce();
  ASSERT_TRUE(pass.ok());
  EXPECT_FALSE(pass->step.has_value()) << "step 7 sent twice";
}

TEST(ReplicaPeersTest, ARingByDefaultAndGroupsWhenAsked) {
  using Peers = std::vector<uint32_t>;
  EXPECT_EQ(ReplicaPeers(0, 1, 0), Peers{});
  EXPECT_EQ(ReplicaPeers(0, 2, 0), Peers{1});
  EXPECT_EQ(ReplicaPeers(1, 2, 0), Peers{0});
  EXPECT_EQ(ReplicaPeers(4, 5, 0), Peers{0});
  // Pairs mirror each other; a lone fifth node joins the last pair.
  EXPECT_EQ(ReplicaPeers(0, 5, 2), Peers{1});
  EXPECT_EQ(ReplicaPeers(1, 5, 2), Peers{0});
  EXPECT_EQ(ReplicaPeers(2, 5, 2), (Peers{3, 4}));
  EXPECT_EQ(ReplicaPeers(4, 5, 2), (Peers{2, 3}));
  // Groups of 3 over 8 nodes: 0-2, 3-5, and 6-7 as a group of two.
  EXPECT_EQ(ReplicaPeers(1, 8, 3), (Peers{0, 2}));
  EXPECT_EQ(ReplicaPeers(5, 8, 3), (Peers{3, 4}));
  EXPECT_EQ(ReplicaPeers(7, 8, 3), Peers{6});
  // Fewer nodes than the group size: one group of all.
  EXPECT_EQ(ReplicaPeers(1, 3, 4), (Peers{0, 2}));
  // Whatever the shape, never itself, and every node is some node's peer.
  for (uint32_t nodes = 1; nodes <= 12; ++nodes) {
    for (uint32_t k : {0u, 2u, 3u, 4u, 5u}) {
      std::vector<int> held(nodes, 0);
      for (uint32_t n = 0; n < nodes; ++n) {
        for (uint32_t p : ReplicaPeers(n, nodes, k)) {
          ASSERT_NE(p, n) << nodes << " nodes, group " << k;
          ASSERT_LT(p, nodes);
          ++held[p];
        }
      }
      for (uint32_t n = 0; nodes > 1 && n < nodes; ++n) EXPECT_GT(held[n], 0) << nodes << " nodes, group " << k;
    }
  }
}

TEST(ReplicatorTest, AStreamThatIsNotATierSnapshotIsRefused) {
  test::TempDir shm("/dev/shm", "lifeline-replicator-test");
  ASSERT_FALSE(shm.path().empty());
  auto into = ReplicaReceiver::Start(shm.Sub(".incoming"), 0, TierPlacer(shm.path(), 2));
  ASSERT_TRUE(into.ok());
  ReplicaSendOptions o;
  o.host = "localhost";
  o.port = (*into)->port();
  const std::string f = shm.Write("f", "bytes");
  auto sent = SendReplica(o, "step-00000000000000000005", {{"notes.txt", f}});
  ASSERT_FALSE(sent.ok());
  EXPECT_NE(sent.status().ToString().find("expected one rank's index and data file"), std::string::npos)
      << sent.status().ToString();
  sent = SendReplica(o, "elsewhere", {{"h.r000000-of-000002.data", f}, {"h.r000000-of-000002.index", f}});
  ASSERT_FALSE(sent.ok());
  EXPECT_NE(sent.status().ToString().find("not a rank snapshot of a memory tier"), std::string::npos)
      << sent.status().ToString();
  EXPECT_TRUE(ListTierSnapshots(Env::Default(), shm.path()).value_or(std::vector<TierSnapshot>{1}).empty());
}

// The node's budget bounds its tiers and the replicas it takes: a replica that would go beyond it
// is refused before any of its memory is taken, and counted.
TEST(ReplicationServiceTest, AReplicaBeyondTheMemoryBudgetIsRefusedNotAllocated) {
  test::TempDir shm("/dev/shm", "lifeline-budget-test");
  ASSERT_FALSE(shm.path().empty());
  test::ScopedEnv node("LIFELINE_MEMORY_TIER_DIR", shm.Sub("node").c_str());
  ReplicationSettings settings;
  settings.memory_budget_bytes = 1 << 20;
  auto service = ReplicationService::Start(settings);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  ReplicaSendOptions o;
  o.host = "localhost";
  o.port = (*service)->port();
  const std::string big = shm.Write("big", test::PatternBytes(2 << 20, 4));
  auto sent = SendReplica(o, "step-00000000000000000005", {{"h.r000001-of-000002.data", big}});
  ASSERT_FALSE(sent.ok());
  EXPECT_NE(sent.status().ToString().find("replication.memory_budget_mb"), std::string::npos) << sent.status().ToString();
  EXPECT_NE(sent.status().ToString().find("needs 2097152 bytes"), std::string::npos) << sent.status().ToString();
  ReplicationStats stats;
  for (int i = 0; i < 100 && stats.over_budget == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    stats = (*service)->stats();
  }
  EXPECT_EQ(stats.over_budget, 1u);
  EXPECT_EQ(stats.memory_budget_bytes, 1u << 20);
  auto used = MemoryTierBytesInUse();
  ASSERT_TRUE(used.ok());
  EXPECT_LT(*used, 1u << 20) << "the refused replica's memory was taken";
}

}  // namespace replicator_test
}  // namespace lifeline::replication
