#include "agent/etcd/etcd_mirror.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "agent/etcd/etcd_server_fixture.h"

namespace lifeline::agent {
namespace etcd_mirror_test {

class EtcdMirrorTest : public testing::EtcdServerTest {
 protected:
  std::unique_ptr<EtcdMirror> Mirror(bool watch) {
    EtcdMirrorOptions o;
    o.watch = watch;
    auto m = EtcdMirror::Start(server_.endpoint(), o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }
  // Waits (up to 10 s, on a busy machine) until `holds` is true of the mirror.
  static bool Eventually(EtcdMirror& m, const std::function<bool()>& holds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    uint64_t v = m.version();
    while (!holds()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      v = m.WaitForChange(v, 0.1);
    }
    return true;
  }
};

TEST_F(EtcdMirrorTest, HoldsTheTrackedKeysAndPrefixesAndFollowsTheirChangesThroughOneStream) {
  ASSERT_TRUE(client_->Put("/j/round", "3").ok());
  ASSERT_TRUE(client_->Put("/j/rounds/3/nodes/a", "A").ok());
  ASSERT_TRUE(client_->Put("/j/untracked", "x").ok());
  auto m = Mirror(/*watch=*/true);
  ASSERT_NE(m, nullptr);
  m->Track({"/j/round", "/j/give_up", "/j/rounds/3/nodes/"});
  ASSERT_TRUE(Eventually(*m, [&] { return m->ready() && m->connected(); }));
  ASSERT_TRUE(m->Get("/j/round").has_value());
  EXPECT_EQ(m->Get("/j/round")->value, "3");
  EXPECT_FALSE(m->Get("/j/give_up").has_value());
  EXPECT_FALSE(m->Get("/j/untracked").has_value());
  ASSERT_EQ(m->Under("/j/rounds/3/nodes/").size(), 1u);
  const EtcdTraffic before = m->traffic();

  // Changes arrive as events, not as reads: the mirror sends nothing more.
  ASSERT_TRUE(client_->Put("/j/rounds/3/nodes/b", "B").ok());
  ASSERT_TRUE(client_->Delete("/j/rounds/3/nodes/a").ok());
  ASSERT_TRUE(client_->Put("/j/give_up", "budget spent").ok());
  ASSERT_TRUE(client_->Put("/j/untracked", "y").ok());
  ASSERT_TRUE(Eventually(*m, [&] { return m->Get("/j/give_up").has_value() && m->Under("/j/rounds/3/nodes/").size() == 1 &&
                                          m->Under("/j/rounds/3/nodes/")[0].value == "B"; }));
  EXPECT_EQ(m->Get("/j/give_up")->value, "budget spent");
  EXPECT_FALSE(m->Get("/j/untracked").has_value());
  EXPECT_GE(m->events(), 3u);
  // A quiet second costs etcd nothing (a poll would have read four times).
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const EtcdTraffic after = m->traffic();
  EXPECT_EQ(after.requests, before.requests);
}

TEST_F(EtcdMirrorTest, NewRangesReplaceTheOldOnes) {
  ASSERT_TRUE(client_->Put("/j/rounds/1/plan", "p1").ok());
  ASSERT_TRUE(client_->Put("/j/rounds/2/plan", "p2").ok());
  auto m = Mirror(/*watch=*/true);
  ASSERT_NE(m, nullptr);
  m->Track({"/j/rounds/1/plan"});
  ASSERT_TRUE(Eventually(*m, [&] { return m->ready() && m->Get("/j/rounds/1/plan").has_value(); }));
  m->Track({"/j/rounds/2/plan", "/j/rounds/2/leader"});
  EXPECT_FALSE(m->ready() && m->Get("/j/rounds/1/plan").has_value());
  ASSERT_TRUE(Eventually(*m, [&] { return m->ready() && m->connected(); }));
  EXPECT_FALSE(m->Get("/j/rounds/1/plan").has_value());
  EXPECT_EQ(m->Get("/j/rounds/2/plan")->value, "p2");
  ASSERT_TRUE(client_->Put("/j/rounds/2/leader", "me").ok());
  ASSERT_TRUE(Eventually(*m, [&] { return m->Get("/j/rounds/2/leader").has_value(); }));
}

// etcd killed and started again: the stream breaks, the mirror says it is not connected, and
// once etcd is back it reads afresh and follows the changes made since.
TEST_F(EtcdMirrorTest, AnEtcdRestartIsFollowedByAFreshReadAndANewStream) {
  ASSERT_TRUE(client_->Put("/j/round", "0").ok());
  auto m = Mirror(/*watch=*/true);
  ASSERT_NE(m, nullptr);
  m->Track({"/j/round", "/j/rounds/0/nodes/"});
  ASSERT_TRUE(Eventually(*m, [&] { return m->ready() && m->connected(); }));
  server_.Stop();
  ASSERT_TRUE(Eventually(*m, [&] { return !m->connected(); }));
  server_.Start();
  ASSERT_TRUE(server_.ok()) << server_.error();
  ASSERT_TRUE(client_->Put("/j/round", "1").ok());
  ASSERT_TRUE(client_->Put("/j/rounds/0/nodes/x", "X").ok());
  ASSERT_TRUE(Eventually(*m, [&] { return m->connected() && m->Get("/j/round")->value == "1" &&
                                          m->Under("/j/rounds/0/nodes/").size() == 1; }));
}

// The polling mode keeps the same copy by reading it again and again.
TEST_F(EtcdMirrorTest, ThePollingModeHoldsTheSameCopyAtTheCostOfAReadPerPoll) {
  auto m = Mirror(/*watch=*/false);
  ASSERT_NE(m, nullptr);
  m->Track({"/j/round", "/j/x/"});
  ASSERT_TRUE(Eventually(*m, [&] { return m->ready() && m->connected(); }));
  ASSERT_TRUE(client_->Put("/j/x/1", "one").ok());
  ASSERT_TRUE(Eventually(*m, [&] { return m->Under("/j/x/").size() == 1; }));
  const EtcdTraffic before = m->traffic();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_GE(m->traffic().requests, before.requests + 2);  // a read every 0.25 s
  EXPECT_EQ(m->events(), 0u);
}

TEST_F(EtcdMirrorTest, AnEndpointWithoutEtcdIsNeverConnected) {
  EtcdMirrorOptions o;
  o.request_timeout_seconds = 0.5;
  auto m = EtcdMirror::Start("127.0.0.1:" + std::to_string(testing::FreeLoopbackPort()), o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  (*m)->Track({"/j/round"});
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  EXPECT_FALSE((*m)->connected());
  EXPECT_FALSE((*m)->ready());
  EXPECT_FALSE(EtcdMirror::Start("no-port", o).ok());
}

}  // namespace etcd_mirror_test
}  // namespace lifeline::agent
