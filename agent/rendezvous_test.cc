// Rendezvous against a real etcd (EtcdTestServer): many agents of one job in one process join one
// round, each reads the same plan, and a plan past a few KiB is stored compressed (every node's
// entry in one value, which each agent of the round receives).
#include "agent/rendezvous.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/etcd/etcd_server_fixture.h"

namespace lifeline::agent {
namespace rendezvous_test {

class RendezvousTest : public testing::EtcdServerTest {};

TEST_F(RendezvousTest, SixteenAgentsJoinOneRoundAndReadOneCompressedPlan) {
  constexpr int kAgents = 16;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int n = 0; n < kAgents; ++n) {
    RendezvousConfig c;
    c.endpoint = server_.endpoint();
    c.job = "plan";
    c.min_nodes = c.max_nodes = kAgents;
    c.nproc_per_node = 8;
    c.host = "127.0.0.1";
    c.node_name = "node-" + std::to_string(n);
    c.join_timeout_seconds = 60;
    Result<std::unique_ptr<Rendezvous>> r = Rendezvous::Connect(c);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    agents.push_back(std::move(*r));
  }
  std::vector<Result<RoundPlan>> plans(kAgents, Status::Unavailable("not joined"));
  std::vector<std::thread> joins;
  for (int n = 0; n < kAgents; ++n) joins.emplace_back([&, n] { plans[n] = agents[n]->Join(ResumeOffer{}); });
  for (std::thread& t : joins) t.join();
  std::vector<bool> placed(kAgents, false);
  for (int n = 0; n < kAgents; ++n) {
    ASSERT_TRUE(plans[n].ok()) << "agent " << n << ": " << plans[n].status().ToString();
    const RoundPlan& p = *plans[n];
    EXPECT_EQ(p.world_size, 8u * kAgents);
    ASSERT_EQ(p.nodes.size(), static_cast<size_t>(kAgents));
    EXPECT_EQ(p.launch_id, plans[0]->launch_id);
    ASSERT_GE(p.group_rank, 0);
    EXPECT_EQ(p.nodes[p.group_rank].name, "node-" + std::to_string(n));
    placed[p.group_rank] = true;
  }
  for (int g = 0; g < kAgents; ++g) EXPECT_TRUE(placed[g]) << "no agent at group rank " << g;
  // What etcd holds: the plan compressed (a zstd frame after "LLZ" 1), far smaller than its JSON.
  Result<std::optional<EtcdKeyValue>> plan = client_->Get("/lifeline/plan/rounds/" + std::to_string(plans[0]->round) + "/plan");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(plan->has_value());
  EXPECT_EQ((*plan)->value.substr(0, 4), std::string("LLZ\x01", 4));
  EXPECT_LT((*plan)->value.size(), 1200u) << "the JSON of these 16 entries: 2,666 bytes";
  for (auto& a : agents) a->Leave(/*finished=*/true);
}

}  // namespace rendezvous_test
}  // namespace lifeline::agent
