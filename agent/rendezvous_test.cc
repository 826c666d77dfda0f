// Rendezvous against a real etcd (EtcdTestServer): many agents of one job in one process join one
// round, each reads the same plan, and a plan past a few KiB is stored compressed (every node's
// entry in one value, which each agent of the round receives). When a round closes: at once when
// MAX nodes joined or a restart's round has every place of the previous one filled again (a
// replacement for a lost node), after the last call when only MIN did (issue 50, item 4).
#include "agent/rendezvous.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
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

// Joins every agent of `agents` at once, each with its own offer.
std::vector<Result<RoundPlan>> JoinWith(const std::vector<Rendezvous*>& agents, const std::vector<ResumeOffer>& offers) {
  std::vector<Result<RoundPlan>> plans(agents.size(), Status::Unavailable("not joined"));
  std::vector<std::thread> joins;
  for (size_t n = 0; n < agents.size(); ++n) joins.emplace_back([&, n] { plans[n] = agents[n]->Join(offers[n]); });
  for (std::thread& t : joins) t.join();
  return plans;
}

ResumeOffer Offer(std::vector<uint64_t> disk, std::vector<uint64_t> memory) {
  ResumeOffer o;
  o.directory = "/ckpt";
  o.disk_steps = disk;
  if (!disk.empty()) o.disk_step = disk[0];
  o.memory_steps = memory;
  return o;
}

// Issue 53, item 4: a rollback decided on node-b moves the job to a round that carries it. Every
// node resumes from the newest step below the bound that every node can load: node-a's memory
// holds newer steps (25, 30), which may hold the fault's damage, and the disk's newest is past the
// bound too; both plans say step 20 and the same skipped steps.
TEST_F(RendezvousTest, ARollbacksRoundResumesEveryNodeBelowItsBoundWithTheSameSkippedSteps) {
  auto a = Agent(server_.endpoint(), "rollback", "node-a", 2, 2, 600);
  auto b = Agent(server_.endpoint(), "rollback", "node-b", 2, 2, 600);
  ASSERT_TRUE(a && b);
  std::vector<Result<RoundPlan>> first = JoinWith({a.get(), b.get()}, {Offer({30, 20, 10}, {30, 25}), Offer({30, 20, 10}, {30, 25, 20})});
  ASSERT_TRUE(first[0].ok() && first[1].ok());
  EXPECT_EQ(*first[0]->resume_step, 30u);  // no rollback: the newest
  EXPECT_FALSE(first[0]->rollback);
  RoundRollback r;
  r.before = 21;
  r.anomaly_step = 25;
  r.anomaly = "non_finite";
  r.ranks = {3};
  r.by = "node-b";
  r.skip = {{21, 27}};
  Result<uint64_t> next = b->OpenNextRound(first[1]->round, &r);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  Result<uint64_t> same = a->OpenNextRound(first[0]->round);  // node-a follows (or raced it): one round
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, *next);
  // node-a's two newest steps on disk are both past the bound (a save that committed after node-b
  // removed them): it has no say about the disk; node-b's view decides.
  std::vector<Result<RoundPlan>> second =
      JoinWith({a.get(), b.get()}, {Offer({30, 25}, {30, 25}), Offer({20, 10}, {25, 20})});
  for (const auto& p : second) {
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->round, *next);
    ASSERT_TRUE(p->resume_step);
    EXPECT_EQ(*p->resume_step, 20u);
    ASSERT_TRUE(p->rollback);
    EXPECT_EQ(p->rollback->before, 21u);
    EXPECT_EQ(p->rollback->by, "node-b");
    EXPECT_EQ(p->rollback->ranks, std::vector<int>{3});
    EXPECT_EQ(FormatStepRanges(p->skip_steps), "21-27");
  }
  // A later round (an ordinary restart) carries the job's skipped steps, not the rollback.
  next = a->OpenNextRound(*next);
  ASSERT_TRUE(next.ok());
  std::vector<Result<RoundPlan>> third = JoinWith({a.get(), b.get()}, {Offer({20}, {}), Offer({20}, {})});
  for (const auto& p : third) {
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_FALSE(p->rollback);
    EXPECT_EQ(FormatStepRanges(p->skip_steps), "21-27");
  }
  a->Leave(true);
  b->Leave(true);
}

// A node whose ranks held a corrupted replica twice (sdc_suspect, counted apart from the other
// failures: exclude_after is 5 here) is left out, and the spare takes its place; without a spare
// it is never kept, the job ends saying why.
TEST_F(RendezvousTest, ANodeWithTwoSdcSuspectsIsExcludedForTheSpareAndWithoutOneTheJobEnds) {
  const auto make = [&](const std::string& job, const std::string& name, bool standby, double last_call) {
    RendezvousConfig c;
    c.endpoint = server_.endpoint();
    c.job = job;
    c.min_nodes = c.max_nodes = 2;
    c.nproc_per_node = 2;
    c.host = "127.0.0.1";
    c.node_name = name;
    c.standby = standby;
    c.exclude_after = 5;
    c.exclude_after_sdc = 2;
    c.last_call_seconds = last_call;
    c.join_timeout_seconds = 60;
    Result<std::unique_ptr<Rendezvous>> r = Rendezvous::Connect(c);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  };
  for (const bool spare : {true, false}) {
    const std::string job = spare ? "sdc-spare" : "sdc-alone";
    // With the spare the round closes as soon as it joins: a long last call keeps the closer from
    // ending the job before the spare came. Without it, the last call is what ends the job.
    const double last_call = spare ? 60 : 0.5;
    auto a = make(job, "node-a", false, last_call);
    auto b = make(job, "node-b", false, last_call);
    ASSERT_TRUE(a && b);
    std::vector<Result<RoundPlan>> first = JoinWith({a.get(), b.get()}, {ResumeOffer{}, ResumeOffer{}});
    ASSERT_TRUE(first[0].ok() && first[1].ok());
    // Two rounds' sdc_suspects on node-b, and a death (not counted as one) on node-a.
    ASSERT_TRUE(b->RecordNodeFailure(0, "node-b", "sdc_suspect (ranks 3)", "sdc_suspect").ok());
    ASSERT_TRUE(b->RecordNodeFailure(1, "node-b", "sdc_suspect (ranks 2)", "sdc_suspect").ok());
    ASSERT_TRUE(a->RecordNodeFailure(1, "node-a", "dead (ranks 0)", "dead").ok());
    Result<std::vector<ExcludedNode>> bad = a->BadNodes();
    ASSERT_TRUE(bad.ok());
    ASSERT_EQ(bad->size(), 1u);
    EXPECT_EQ((*bad)[0].name, "node-b");
    EXPECT_EQ((*bad)[0].sdc, 2u);
    ASSERT_TRUE(a->OpenNextRound(first[0]->round).ok());
    if (spare) {
      // node-b, not placed, waits for the job's end: it ends once the placed nodes finish.
      std::atomic<bool> stop_b{false};
      std::future<Result<RoundPlan>> left_out =
          std::async(std::launch::async, [&] { return b->Join(ResumeOffer{}, [&] { return stop_b.load(); }); });
      // Whatever fails below, node-b's join ends with the test.
      struct StopOnExit {
        std::atomic<bool>* stop;
        std::future<Result<RoundPlan>>* joined;
        ~StopOnExit() {
          stop->store(true);
          if (joined->valid()) joined->wait();
        }
      } stop_on_exit{&stop_b, &left_out};
      auto c = make(job, "node-c", true, last_call);
      ASSERT_TRUE(c);
      std::vector<Result<RoundPlan>> second = JoinWith({a.get(), c.get()}, {ResumeOffer{}, ResumeOffer{}});
      ASSERT_TRUE(second[0].ok()) << second[0].status().ToString();
      const RoundPlan& p = *second[0];
      ASSERT_EQ(p.nodes.size(), 2u);
      EXPECT_EQ(p.nodes[0].Name(), "node-a");
      EXPECT_EQ(p.nodes[1].Name(), "node-c");
      ASSERT_EQ(p.excluded.size(), 1u);
      EXPECT_EQ(p.excluded[0].name, "node-b");
      EXPECT_FALSE(p.excluded[0].kept);
      EXPECT_EQ(p.excluded[0].sdc, 2u);
      ASSERT_TRUE(second[1].ok()) << second[1].status().ToString();
      EXPECT_EQ(second[1]->group_rank, 1);
      a->Leave(true);
      c->Leave(true);
      // A bound against a hang, not a timing: node-b learns of the end within its watcher's next look.
      ASSERT_EQ(left_out.wait_for(std::chrono::seconds(120)), std::future_status::ready) << "node-b still waits";
      const Result<RoundPlan> ended = left_out.get();
      ASSERT_TRUE(ended.ok()) << ended.status().ToString();
      EXPECT_TRUE(ended->finished);
    } else {
      std::vector<Result<RoundPlan>> second = JoinWith({a.get(), b.get()}, {ResumeOffer{}, ResumeOffer{}});
      for (const auto& p : second) {
        ASSERT_FALSE(p.ok());
        EXPECT_EQ(p.status().code(), StatusCode::kAborted) << p.status().ToString();
        EXPECT_NE(p.status().message().find("node node-b held replicas unlike the others' (sdc_suspect)"),
                  std::string::npos) << p.status().ToString();
      }
      a->Leave(false);
    }
    b->Leave(false);
  }
}

}  // namespace rendezvous_test
}  // namespace lifeline::agent
