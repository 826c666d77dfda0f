// Rendezvous against a real etcd (EtcdTestServer): many agents of one job in one process join one
// round, each reads the same plan, and a plan past a few KiB is stored compressed (every node's
// entry in one value, which each agent of the round receives). When a round closes: at once when
// MAX nodes joined or a restart's round has every place of the previous one filled again (a
// replacement for a lost node), after the last call when only MIN did (issue 50, item 4).
#include "agent/rendezvous.h"

#include <gtest/gtest.h>

#include <chrono>
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

// An agent of job `job` named `name` with --nnodes MIN:MAX and a last call of `last_call` s.
std::unique_ptr<Rendezvous> Agent(const std::string& endpoint, const std::string& job, const std::string& name,
                                  uint32_t min_nodes, uint32_t max_nodes, double last_call) {
  RendezvousConfig c;
  c.endpoint = endpoint;
  c.job = job;
  c.min_nodes = min_nodes;
  c.max_nodes = max_nodes;
  c.nproc_per_node = 2;
  c.host = "127.0.0.1";
  c.node_name = name;
  c.last_call_seconds = last_call;
  c.join_timeout_seconds = 120;
  Result<std::unique_ptr<Rendezvous>> r = Rendezvous::Connect(c);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : nullptr;
}

// Joins every agent of `agents` at once; the plans, and in *seconds how long the joins took.
std::vector<Result<RoundPlan>> JoinAll(const std::vector<Rendezvous*>& agents, double* seconds) {
  std::vector<Result<RoundPlan>> plans(agents.size(), Status::Unavailable("not joined"));
  const auto began = std::chrono::steady_clock::now();
  std::vector<std::thread> joins;
  for (size_t n = 0; n < agents.size(); ++n) joins.emplace_back([&, n] { plans[n] = agents[n]->Join(ResumeOffer{}); });
  for (std::thread& t : joins) t.join();
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return plans;
}

// Every agent of `plans` got a plan, of `nodes` nodes.
void ExpectPlansOf(const std::vector<Result<RoundPlan>>& plans, size_t nodes) {
  for (const auto& p : plans) {
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->nodes.size(), nodes);
  }
}

// The last call (600 s here) is for an elastic job's MIN: a round whose MAX nodes joined closes at
// once. The bound asserted is a tenth of the last call, far above what a join takes on a loaded
// machine.
TEST_F(RendezvousTest, ARoundOfMaxNodesClosesAtOnceWithoutItsLastCall) {
  for (const uint32_t min_nodes : {2u, 1u}) {  // --nnodes 2, and --nnodes 1:2
    const std::string job = "max" + std::to_string(min_nodes);
    auto a = Agent(server_.endpoint(), job, "node-a", min_nodes, 2, 600);
    auto b = Agent(server_.endpoint(), job, "node-b", min_nodes, 2, 600);
    ASSERT_TRUE(a && b);
    double seconds = 0;
    std::vector<Result<RoundPlan>> plans = JoinAll({a.get(), b.get()}, &seconds);
    ASSERT_NO_FATAL_FAILURE(ExpectPlansOf(plans, 2));
    EXPECT_LT(seconds, 60) << "--nnodes " << min_nodes << ":2 waited for its last call";
    a->Leave(true);
    b->Leave(true);
  }
}

// With only MIN of MIN:MAX nodes in, the round waits for more for the last call, then closes with
// those it has: never before the last call passed (a bound the closer's own clock enforces).
TEST_F(RendezvousTest, ARoundOfMinNodesClosesAfterItsLastCall) {
  auto a = Agent(server_.endpoint(), "min", "node-a", 2, 3, 2.0);
  auto b = Agent(server_.endpoint(), "min", "node-b", 2, 3, 2.0);
  ASSERT_TRUE(a && b);
  double seconds = 0;
  std::vector<Result<RoundPlan>> plans = JoinAll({a.get(), b.get()}, &seconds);
  ASSERT_NO_FATAL_FAILURE(ExpectPlansOf(plans, 2));
  EXPECT_GE(seconds, 2.0);
  a->Leave(true);
  b->Leave(true);
}

// Issue 50, item 4: node-b is lost, node-a opens the next round and a replacement joins it. The
// restart's round has every place of the previous round filled again and closes at once, whatever
// the last call (600 s), for --nnodes 2 and for --nnodes 1:2 (where node-a alone makes MIN).
TEST_F(RendezvousTest, ARestartsRoundClosesAtOnceWhenAReplacementFillsTheLostPlace) {
  for (const uint32_t min_nodes : {2u, 1u}) {
    const std::string job = "replace" + std::to_string(min_nodes);
    auto a = Agent(server_.endpoint(), job, "node-a", min_nodes, 2, 600);
    auto b = Agent(server_.endpoint(), job, "node-b", min_nodes, 2, 600);
    ASSERT_TRUE(a && b);
    double seconds = 0;
    std::vector<Result<RoundPlan>> first = JoinAll({a.get(), b.get()}, &seconds);
    ASSERT_TRUE(first[0].ok() && first[1].ok());
    b.reset();  // lost: its watcher stops, its lease runs out later
    Result<uint64_t> next = a->OpenNextRound(first[0]->round);
    ASSERT_TRUE(next.ok()) << next.status().ToString();
    auto c = Agent(server_.endpoint(), job, "node-c", min_nodes, 2, 600);
    ASSERT_TRUE(c);
    std::vector<Result<RoundPlan>> second = JoinAll({a.get(), c.get()}, &seconds);
    for (const auto& p : second) {
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      EXPECT_EQ(p->round, *next);
      ASSERT_EQ(p->nodes.size(), 2u);
      EXPECT_EQ(p->nodes[0].name == "node-a" ? p->nodes[1].name : p->nodes[0].name, "node-c");
    }
    EXPECT_LT(seconds, 60) << "--nnodes " << min_nodes << ":2: the restart's round waited for its last call";
    a->Leave(true);
    c->Leave(true);
  }
}

}  // namespace rendezvous_test
}  // namespace lifeline::agent
