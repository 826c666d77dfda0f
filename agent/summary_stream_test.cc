#include "agent/summary_stream.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include "lib/net/socket.h"

namespace lifeline::agent {
namespace summary_stream_test {

bool Eventually(const std::function<bool()>& holds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!holds()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

TEST(SummaryStreamTest, TheLeaderHoldsEachNodesNewestSummaryOfTheRoundAndWhetherItIsConnected) {
  auto receiver = SummaryReceiver::Start("job");
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  const uint16_t port = (*receiver)->port();
  auto a = std::make_unique<SummarySender>("job", "node-a");
  SummarySender b("job", "node-b");
  const std::string big(100000, 'x');  // compresses to little: the wire carries less than the text
  ASSERT_TRUE(a->Send("127.0.0.1", port, 3, "first").ok());
  ASSERT_TRUE(a->Send("127.0.0.1", port, 3, big).ok());
  ASSERT_TRUE(b.Send("127.0.0.1", port, 3, "from b", 2.0, std::chrono::steady_clock::now() - std::chrono::seconds(3))
                  .ok());  // node b last renewed its lease 3 s ago
  ASSERT_TRUE(Eventually([&] {
    const auto s = (*receiver)->Summaries(3);
    return s.size() == 2 && s[0].summary == big && s[1].summary == "from b";
  }));
  EXPECT_LT(a->wire_bytes(), 1000u);
  // Without the text, everything else is the same (the leader's cut-off check reads etcd_age so).
  const auto full = (*receiver)->Summaries(3), light = (*receiver)->Summaries(3, /*with_text=*/false);
  ASSERT_EQ(light.size(), full.size());
  for (size_t k = 0; k < full.size(); ++k) {
    EXPECT_TRUE(light[k].summary.empty());
    EXPECT_EQ(light[k].node, full[k].node);
    EXPECT_EQ(light[k].received, full[k].received);
    EXPECT_EQ(light[k].etcd_age, full[k].etcd_age);
    EXPECT_EQ(light[k].frames, full[k].frames);
    EXPECT_EQ(light[k].wire_bytes, full[k].wire_bytes);
  }
  EXPECT_EQ(full[0].frames, 2u);  // node-a: "first", then the big one
  EXPECT_NEAR(full[1].etcd_age, 3.0, 0.5);
  for (const ReceivedSummary& s : (*receiver)->Summaries(3)) EXPECT_TRUE(s.connected) << s.node;
  EXPECT_TRUE((*receiver)->Summaries(2).empty());
  // A node gone: its connection closes, and the leader can tell.
  a.reset();
  ASSERT_TRUE(Eventually([&] {
    for (const ReceivedSummary& s : (*receiver)->Summaries(3))
      if (s.node == "node-a") return !s.connected;
    return false;
  }));
  // The next round is a new connection, and its own summaries.
  ASSERT_TRUE(b.Send("127.0.0.1", port, 4, "b in round 4").ok());
  // Its hello may come before its summary: the node is listed, connected, with no text yet.
  ASSERT_TRUE(Eventually([&] {
    const auto s = (*receiver)->Summaries(4);
    return s.size() == 1 && !s[0].summary.empty();
  }));
  EXPECT_EQ((*receiver)->Summaries(4)[0].summary, "b in round 4");
  EXPECT_TRUE((*receiver)->errors().empty());
}

// A summary may carry only what the one before it did not (agent/progress.h): the leader takes every
// one that came, in order, none overwritten by the next; a sender counts its connections, so that
// what it sent on one the leader has since lost is not taken for the new one's.
TEST(SummaryStreamTest, TheLeaderTakesEverySummaryThatCameInOrderOnce) {
  auto receiver = SummaryReceiver::Start("job");
  ASSERT_TRUE(receiver.ok()) << receiver.status().ToString();
  const uint16_t port = (*receiver)->port();
  SummarySender a("job", "node-a");
  EXPECT_EQ(a.connections(), 0u);
  for (int k = 1; k <= 3; ++k) ASSERT_TRUE(a.Send("127.0.0.1", port, 3, "summary " + std::to_string(k)).ok());
  EXPECT_EQ(a.connections(), 1u);
  ASSERT_TRUE(Eventually([&] { return (*receiver)->Summaries(3).size() == 1 && (*receiver)->Summaries(3)[0].frames == 3; }));
  auto taken = (*receiver)->TakeSummaries(3);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].node, "node-a");
  EXPECT_EQ(taken[0].frames_pending, (std::vector<std::string>{"summary 1", "summary 2", "summary 3"}));
  EXPECT_TRUE((*receiver)->TakeSummaries(3).empty());  // taken once
  EXPECT_EQ((*receiver)->Summaries(3)[0].summary, "summary 3");  // the newest stays for a look
  // A leader that does not read keeps the newest kMaxPendingSummaries, counting those it dropped.
  for (size_t k = 0; k < kMaxPendingSummaries + 4; ++k) ASSERT_TRUE(a.Send("127.0.0.1", port, 3, "s" + std::to_string(k)).ok());
  ASSERT_TRUE(Eventually([&] { return (*receiver)->Summaries(3)[0].frames == 3 + kMaxPendingSummaries + 4; }));
  taken = (*receiver)->TakeSummaries(3);
  ASSERT_EQ(taken[0].frames_pending.size(), kMaxPendingSummaries);
  EXPECT_EQ(taken[0].frames_pending.front(), "s4");
  EXPECT_EQ(taken[0].frames_dropped, 4u);
  // Another round is another connection.
  ASSERT_TRUE(a.Send("127.0.0.1", port, 4, "round 4").ok());
  EXPECT_EQ(a.connections(), 2u);
}

TEST(SummaryStreamTest, ALeaderThatCannotBeReachedIsUnavailableNamingItWithinTheTimeout) {
  SummarySender s("job", "node-a");
  auto listener = net::Listen(0, 1, "test");
  ASSERT_TRUE(listener.ok());
  const uint16_t port = net::LocalPort(*listener);
  close(*listener);  // nothing listens there now
  const auto t0 = std::chrono::steady_clock::now();
  Status st = s.Send("127.0.0.1", port, 0, "x", 1.0);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find(std::to_string(port)), std::string::npos) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

// Raw frames: what a stranger or a broken sender could put on the port.
void SendRaw(uint16_t port, const std::string& bytes) {
  auto fd = net::Connect("127.0.0.1", port, std::chrono::steady_clock::now() + std::chrono::seconds(2));
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(net::SendAll(*fd, bytes.data(), bytes.size(), "receiver").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  close(*fd);
}

std::string Frame(uint8_t kind, const std::string& body) {
  const uint32_t n = htonl(static_cast<uint32_t>(1 + body.size()));
  return std::string(reinterpret_cast<const char*>(&n), 4) + static_cast<char>(kind) + body;
}

TEST(SummaryStreamTest, FramesThatBreakTheRulesCloseTheirConnectionNamingThePeerAndKeepNothing) {
  auto receiver = SummaryReceiver::Start("job");
  ASSERT_TRUE(receiver.ok());
  const uint16_t port = (*receiver)->port();
  SendRaw(port, Frame(1, "other-job\n0\nnode-x") + Frame(2, "zz"));
  SendRaw(port, Frame(2, "no hello"));
  SendRaw(port, Frame(1, "job\nround?\nnode-y"));
  SendRaw(port, Frame(1, "job\n0\nnode-z") + Frame(2, "not zstd at all"));
  SendRaw(port, std::string("\xff\xff\xff\xff", 4));
  ASSERT_TRUE(Eventually([&] { return (*receiver)->errors().size() == 5; }));
  const std::vector<std::string> e = (*receiver)->errors();
  uint64_t seen = 0;
  EXPECT_EQ((*receiver)->ErrorsSince(&seen), e);  // the agent logs each refused connection once
  EXPECT_TRUE((*receiver)->ErrorsSince(&seen).empty());
  SendRaw(port, Frame(2, "no hello again"));
  ASSERT_TRUE(Eventually([&] { return (*receiver)->errors().size() == 6; }));
  const std::vector<std::string> later = (*receiver)->ErrorsSince(&seen);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_NE(later[0].find("no hello first"), std::string::npos) << later[0];
  std::string all;
  for (const std::string& x : e) all += x + "\n";
  EXPECT_NE(all.find("another job (other-job)"), std::string::npos) << all;
  EXPECT_NE(all.find("no hello first"), std::string::npos) << all;
  EXPECT_NE(all.find("round is not a number"), std::string::npos) << all;
  EXPECT_NE(all.find("node node-z"), std::string::npos) << all;
  EXPECT_NE(all.find("at most 16 MiB"), std::string::npos) << all;
  EXPECT_NE(all.find("127.0.0.1:"), std::string::npos) << all;
  // The one node that said hello is known, but nothing of it is kept, and it is no longer connected.
  for (const ReceivedSummary& s : (*receiver)->Summaries(0)) {
    EXPECT_EQ(s.node, "node-z");
    EXPECT_TRUE(s.summary.empty());
    EXPECT_FALSE(s.connected);
  }
}

}  // namespace summary_stream_test
}  // namespace lifeline::agent
