// The agent's metrics: every documented family is exported, fed by the events a user's job
// produces (applied to a Timeline, as the agent does), and served over HTTP.
#include "agent/metrics.h"

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/net/socket.h"

namespace lifeline::agent {
namespace metrics_test {

trace::Event Ev(trace::EventType type, uint64_t t_ms, uint64_t step, uint64_t seq = 0) {
  trace::Event e;
  e.type = type;
  e.time_ns = t_ms * 1000000;
  e.step = step;
  e.seq = seq;
  e.op = trace::Op::kAllReduce;
  return e;
}

// Applies `e` to `timeline` and hands the change to `m`, as the agent does.
void Feed(Timeline* timeline, AgentMetrics* m, int rank, const trace::Event& e) {
  m->Observe(*timeline, timeline->Apply(rank, e));
}

// The value of the sample `series` (name plus labels, as printed) in an exposition, or -1.
double Sample(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(MetricsTest, EveryDocumentedFamilyIsExportedWithItsType) {
  AgentMetrics m("job", 2);
  const std::string text = m.Render();
  for (const MetricFamilyInfo& f : MetricFamilies()) {
    EXPECT_NE(text.find(std::string("# TYPE ") + f.name + " " + f.type), std::string::npos) << f.name;
    EXPECT_NE(text.find(std::string("# HELP ") + f.name + " "), std::string::npos) << f.name;
  }
  EXPECT_EQ(Sample(text, "lifeline_ranks_alive"), 2);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_last_committed_step"), -1);
}

TEST(MetricsTest, EventsBecomeStepCollectiveAndCheckpointFigures) {
  AgentMetrics m("job", 3);
  Timeline timeline;
  timeline.Reset(3);
  for (uint64_t k = 0; k < 5; ++k) {
    const uint64_t t = 1000 + k * 100;
    for (int r = 0; r < 3; ++r) {
      Feed(&timeline, &m, r, Ev(trace::EventType::kStepBegin, t, k));
      // Rank 2 enters every allreduce 30 ms after the others.
      Feed(&timeline, &m, r, Ev(trace::EventType::kCollectiveBegin, t + 10 + (r == 2 ? 30 : 0), k, k + 1));
      Feed(&timeline, &m, r, Ev(trace::EventType::kCollectiveEnd, t + 45, k, k + 1));
      Feed(&timeline, &m, r, Ev(trace::EventType::kStepEnd, t + 50, k));
    }
  }
  trace::Event copied = Ev(trace::EventType::kCheckpointCopied, 2000, 4);
  copied.aux = 400000;  // 0.4 ms stall
  Feed(&timeline, &m, 0, copied);
  trace::Event persisted = Ev(trace::EventType::kCheckpointPersisted, 3000, 4);
  persisted.duration_ns = 2000000000;
  persisted.aux = 1 << 20;
  Feed(&timeline, &m, 0, persisted);
  Feed(&timeline, &m, 0, Ev(trace::EventType::kCheckpointCommitted, 3000, 4));
  Feed(&timeline, &m, 1, Ev(trace::EventType::kCheckpointFailed, 3000, 4));
  trace::Event fallback = Ev(trace::EventType::kCheckpointFallback, 3000, 4);
  fallback.aux = 1;  // from the memory tier
  Feed(&timeline, &m, 2, fallback);
  m.Anomaly("straggler", {2});
  m.Restarted();
  timeline.RankExited(1);
  m.RankExited(timeline);
  m.RingDropped(0, 7);

  const std::string text = m.Render();
  EXPECT_EQ(Sample(text, "lifeline_steps_total{rank=\"0\"}"), 5);
  EXPECT_EQ(Sample(text, "lifeline_step{rank=\"2\"}"), 4);
  EXPECT_EQ(Sample(text, "lifeline_step_duration_seconds_count{rank=\"1\"}"), 5);
  EXPECT_NEAR(Sample(text, "lifeline_step_duration_seconds_sum{rank=\"1\"}"), 0.25, 1e-9);
  EXPECT_EQ(Sample(text, "lifeline_collective_duration_seconds_count{op=\"allreduce\"}"), 15);
  EXPECT_GT(Sample(text, "lifeline_collective_lateness_seconds{rank=\"2\"}"), 0.025);
  EXPECT_NEAR(Sample(text, "lifeline_collective_lateness_seconds{rank=\"0\"}"), 0, 1e-9);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_stall_seconds_count"), 1);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_stall_seconds_bucket{le=\"0.001\"}"), 1);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_stall_seconds_bucket{le=\"0.0001\"}"), 0);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_persist_seconds_sum"), 2);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_bytes_total"), 1 << 20);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_failures_total"), 1);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_load_fallbacks_total{location=\"memory\"}"), 1);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_load_fallbacks_total{location=\"disk\"}"), 0);
  EXPECT_EQ(Sample(text, "lifeline_checkpoint_last_committed_step"), 4);
  EXPECT_GT(Sample(text, "lifeline_checkpoint_last_committed_timestamp_seconds"), 1.7e9);
  EXPECT_EQ(Sample(text, "lifeline_anomalies_total{kind=\"straggler\",rank=\"2\"}"), 1);
  EXPECT_EQ(Sample(text, "lifeline_anomalies_total{kind=\"hang\",rank=\"none\"}"), 0);
  EXPECT_EQ(Sample(text, "lifeline_restarts_total"), 1);
  EXPECT_EQ(Sample(text, "lifeline_ranks_alive"), 2);
  EXPECT_EQ(Sample(text, "lifeline_trace_events_dropped_total{rank=\"0\"}"), 7);
}

// The loss and the norm are one series per job: the lowest local rank's, whatever the others say.
TEST(MetricsTest, TrainingSignalsAreTheLowestRanksValues) {
  AgentMetrics m("job", 2);
  Timeline timeline;
  timeline.Reset(2);
  const std::string before = m.Render();
  EXPECT_TRUE(std::isnan(Sample(before, "lifeline_loss"))) << before;
  auto scalar = [](uint32_t id, uint64_t step, double v) {
    trace::Event e = Ev(trace::EventType::kScalar, 100 + step, step);
    e.comm = id;
    std::memcpy(&e.aux, &v, sizeof(v));
    return e;
  };
  Feed(&timeline, &m, 1, scalar(trace::kLossScalar, 3, 9.0));  // rank 1 first: shown until rank 0 says
  EXPECT_EQ(Sample(m.Render(), "lifeline_loss"), 9.0);
  Feed(&timeline, &m, 0, scalar(trace::kLossScalar, 3, 2.5));
  Feed(&timeline, &m, 1, scalar(trace::kLossScalar, 4, 8.0));
  Feed(&timeline, &m, 0, scalar(trace::kGradNormScalar, 3, 0.75));
  Feed(&timeline, &m, 1, scalar(7, 3, 1.0));
  const std::string text = m.Render();
  EXPECT_EQ(Sample(text, "lifeline_loss"), 2.5);
  EXPECT_EQ(Sample(text, "lifeline_grad_norm"), 0.75);
  EXPECT_EQ(Sample(text, "lifeline_training_signals_total"), 5);
}

// A Python rank waits on two async collectives in reverse order: both are timed.
TEST(MetricsTest, CollectivesEndedOutOfOrderAreAllTimed) {
  AgentMetrics m("job", 1);
  Timeline timeline;
  timeline.Reset(1);
  Feed(&timeline, &m, 0, Ev(trace::EventType::kCollectiveBegin, 100, 0, 1));
  Feed(&timeline, &m, 0, Ev(trace::EventType::kCollectiveBegin, 110, 0, 2));
  Feed(&timeline, &m, 0, Ev(trace::EventType::kCollectiveEnd, 150, 0, 2));
  Feed(&timeline, &m, 0, Ev(trace::EventType::kCollectiveEnd, 160, 0, 1));
  const std::string text = m.Render();
  EXPECT_EQ(Sample(text, "lifeline_collective_duration_seconds_count{op=\"allreduce\"}"), 2) << text;
  EXPECT_NEAR(Sample(text, "lifeline_collective_duration_seconds_sum{op=\"allreduce\"}"), 0.1, 1e-9) << text;
}

TEST(MetricsTest, NodeFamiliesFollowTheRoundsAndTheRendezvous) {
  AgentMetrics m("job", 2);
  std::string text = m.Render();
  EXPECT_EQ(Sample(text, "lifeline_nodes"), 1) << text;
  EXPECT_EQ(Sample(text, "lifeline_round"), 0);
  EXPECT_EQ(Sample(text, "lifeline_round_leader"), 0);
  EXPECT_EQ(Sample(text, "lifeline_etcd_reachable"), 1);
  EXPECT_EQ(Sample(text, "lifeline_anomalies_total{kind=\"node_lost\",rank=\"none\"}"), 0);

  // Node 1 of 3 in round 2 (ranks 2..3), leading it, then losing etcd and a node.
  m.JoinedRound("vm:17:ab", 1, 3, 2);
  m.Launched(2, 2);
  m.Rendezvous(/*leader=*/true, /*etcd_reachable=*/true);
  m.Anomaly("node_lost", {4, 5});
  text = m.Render();
  EXPECT_EQ(Sample(text, "lifeline_nodes"), 3);
  EXPECT_EQ(Sample(text, "lifeline_round"), 2);
  EXPECT_EQ(Sample(text, "lifeline_round_leader"), 1);
  EXPECT_EQ(Sample(text, "lifeline_node_info{group_rank=\"1\",node=\"vm:17:ab\"}"), 1) << text;
  EXPECT_EQ(Sample(text, "lifeline_anomalies_total{kind=\"node_lost\",rank=\"4\"}"), 1) << text;
  EXPECT_EQ(Sample(text, "lifeline_anomalies_total{kind=\"node_lost\",rank=\"5\"}"), 1);
  m.Rendezvous(false, false);
  m.JoinedRound("vm:17:ab", 0, 2, 3);  // the next round, without the lost node
  text = m.Render();
  EXPECT_EQ(Sample(text, "lifeline_etcd_reachable"), 0);
  EXPECT_EQ(Sample(text, "lifeline_round_leader"), 0);
  EXPECT_EQ(Sample(text, "lifeline_nodes"), 2);
  EXPECT_EQ(Sample(text, "lifeline_round"), 3);
  EXPECT_EQ(Sample(text, "lifeline_node_info{group_rank=\"1\",node=\"vm:17:ab\"}"), -1) << "old place kept";

  // A single-node job's round is its restart count.
  AgentMetrics one("job", 2);
  one.SetRound(4);
  EXPECT_EQ(Sample(one.Render(), "lifeline_round"), 4);
}

// The whole reply to `request` sent to 127.0.0.1:`port`, or what came of it in 10 s (a bound a
// loaded machine holds: what matters is that the answer comes).
std::string Scrape(uint16_t port, const std::string& request) {
  const auto deadline = net::Clock::now() + std::chrono::seconds(10);
  auto fd = net::Connect("127.0.0.1", port, deadline);
  if (!fd.ok()) return fd.status().ToString();
  std::string reply;
  if (net::SendAll(*fd, request.data(), request.size(), "the agent").ok()) {
    char buf[4096];
    for (pollfd p{*fd, POLLIN, 0}; net::Clock::now() < deadline;) {
      if (poll(&p, 1, net::MillisLeft(deadline)) != 1) continue;
      const ssize_t n = read(*fd, buf, sizeof(buf));
      if (n <= 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
  }
  close(*fd);
  return reply;
}

TEST(MetricsTest, ServesTheExpositionOverHttp) {
  AgentMetrics m("job", 1);
  ASSERT_TRUE(m.Serve("127.0.0.1:0").ok());  // a port the kernel picks
  ASSERT_NE(m.port(), 0);
  const std::string reply = Scrape(m.port(), "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(reply.substr(0, reply.find("\r\n")), "HTTP/1.1 200 OK") << reply.substr(0, 200);
  EXPECT_NE(reply.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(reply.find("lifeline_build_info{version="), std::string::npos);

  // An address it cannot use is an error naming it.
  AgentMetrics other("job", 1);
  Status s = other.Serve("127.0.0.1:" + std::to_string(m.port()));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find(std::to_string(m.port()) + " is in use"), std::string::npos) << s.ToString();
  EXPECT_FALSE(other.Serve("127.0.0.1").ok());
  EXPECT_FALSE(other.Serve("no-such-host.invalid:0").ok());
}

TEST(MetricsTest, ServesOnIpv6) {
  AgentMetrics m("job", 1);
  if (!m.Serve("[::1]:0").ok()) GTEST_SKIP() << "no IPv6 loopback here";
  auto fd = net::Connect("::1", m.port(), net::Clock::now() + std::chrono::seconds(10));
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  close(*fd);
}

// Issue 32: two clients that each sent half a request used to hold the endpoint (two threads
// waiting 30 s on them); Prometheus' scrapes timed out meanwhile.
TEST(MetricsTest, ScrapesAreAnsweredWhileOtherClientsHoldHalfARequest) {
  AgentMetrics m("job", 1);
  net::HttpServerOptions options;
  options.head_timeout = std::chrono::seconds(60);  // so they are all still held when the scrape ends
  ASSERT_TRUE(m.Serve("127.0.0.1:0", options).ok());
  std::vector<int> holders;
  for (int i = 0; i < 8; ++i) {
    auto fd = net::Connect("127.0.0.1", m.port(), net::Clock::now() + std::chrono::seconds(10));
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    const std::string half = "GET /metrics HTTP/1.1\r\nHost: lo";
    ASSERT_TRUE(net::SendAll(*fd, half.data(), half.size(), "the agent").ok());
    holders.push_back(*fd);
  }
  const std::string reply = Scrape(m.port(), "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_EQ(reply.substr(0, reply.find("\r\n")), "HTTP/1.1 200 OK") << reply.substr(0, 200);
  EXPECT_NE(reply.find("lifeline_build_info{version="), std::string::npos);
  for (int fd : holders) {
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 0), 0) << "a half request was answered or dropped before its deadline";
    close(fd);
  }
}

}  // namespace metrics_test
}  // namespace lifeline::agent
