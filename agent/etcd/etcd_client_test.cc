#include "agent/etcd/etcd_client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "agent/etcd/etcd_server_fixture.h"
#include "agent/rendezvous.h"

namespace lifeline::agent {
namespace etcd_client_test {

TEST(Base64Test, RoundTripsEveryLengthAndRejectsWhatIsNotBase64) {
  std::string bytes;
  for (int n = 0; n < 70; ++n) {
    EXPECT_EQ(*Base64Decode(Base64Encode(bytes)), bytes) << "length " << n;
    bytes += static_cast<char>(n * 37 + 11);
  }
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_FALSE(Base64Decode("abc").ok());    // not a multiple of 4
  EXPECT_FALSE(Base64Decode("ab!d").ok());   // not in the alphabet
  EXPECT_FALSE(Base64Decode("a=bc").ok());   // padding in the middle
  EXPECT_FALSE(Base64Decode("Zg==Zg==").ok());
}

TEST(PrefixEndTest, IsTheFirstKeyPastThePrefix) {
  EXPECT_EQ(PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
}

TEST(EtcdClientTest, AnUnreachableEndpointIsUnavailableNamingItWithinTheTimeout) {
  const int port = testing::FreeLoopbackPort();  // nothing listens there
  auto c = EtcdClient::Create("127.0.0.1:" + std::to_string(port), 1.0);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const auto t0 = std::chrono::steady_clock::now();
  Status s = (*c)->Ping();
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(s.ToString().find("127.0.0.1:" + std::to_string(port)), std::string::npos) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_FALSE(EtcdClient::Create("no-port-here").ok());
  EXPECT_FALSE(EtcdClient::Create("https://127.0.0.1:2379").ok());
}

using EtcdClientServerTest = testing::EtcdServerTest;

TEST_F(EtcdClientServerTest, PutGetPrefixAndDelete) {
  ASSERT_TRUE(client_->Put("/job/a", "1").ok());
  ASSERT_TRUE(client_->Put("/job/b", std::string("\0\xff binary", 9)).ok());
  ASSERT_TRUE(client_->Put("/jobs", "outside the prefix").ok());
  auto got = client_->Get("/job/b");
  ASSERT_TRUE(got.ok() && got->has_value()) << got.status().ToString();
  EXPECT_EQ((*got)->value, std::string("\0\xff binary", 9));
  EXPECT_GT((*got)->create_revision, 0);
  auto missing = client_->Get("/job/none");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  int64_t revision = 0;
  auto all = client_->GetPrefix("/job/", &revision);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].key, "/job/a");
  EXPECT_EQ((*all)[1].key, "/job/b");
  EXPECT_GE(revision, (*all)[1].mod_revision);
  auto deleted = client_->DeletePrefix("/job/");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 2);
  EXPECT_TRUE(client_->GetPrefix("/job/")->empty());
  EXPECT_TRUE(client_->Get("/jobs")->has_value());
  EXPECT_GT(client_->traffic().requests, 5u);
  EXPECT_GT(client_->traffic().bytes_received, client_->traffic().requests * 50);
}

TEST_F(EtcdClientServerTest, ReadManyReadsKeysAndPrefixesInOneRequest) {
  ASSERT_TRUE(client_->Put("/r/round", "7").ok());
  ASSERT_TRUE(client_->Put("/r/nodes/a", "a long value").ok());
  ASSERT_TRUE(client_->Put("/r/nodes/b", "another").ok());
  const uint64_t before = client_->traffic().requests;
  auto read = client_->ReadMany({{"/r/round"}, {"/r/give_up"}, {"/r/nodes/", /*keys_only=*/true}});
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(client_->traffic().requests, before + 1);
  ASSERT_EQ(read->size(), 3u);
  ASSERT_EQ((*read)[0].size(), 1u);
  EXPECT_EQ((*read)[0][0].value, "7");
  EXPECT_TRUE((*read)[1].empty());
  ASSERT_EQ((*read)[2].size(), 2u);
  EXPECT_EQ((*read)[2][0].key, "/r/nodes/a");
  EXPECT_EQ((*read)[2][0].value, "");  // keys only
  EXPECT_EQ((*read)[2][1].key, "/r/nodes/b");
}

TEST_F(EtcdClientServerTest, PutIfAbsentAndCompareAndSwapDecideOnce) {
  EXPECT_TRUE(*client_->PutIfAbsent("/k", "first"));
  EXPECT_FALSE(*client_->PutIfAbsent("/k", "second"));
  EXPECT_EQ((*client_->Get("/k"))->value, "first");
  EXPECT_FALSE(*client_->CompareAndSwap("/k", "wrong", "x"));
  EXPECT_TRUE(*client_->CompareAndSwap("/k", "first", "third"));
  EXPECT_EQ((*client_->Get("/k"))->value, "third");
  EXPECT_FALSE(*client_->CompareAndSwap("/absent", "", "y"));
}

TEST_F(EtcdClientServerTest, LeasedKeysGoWithTheirLease) {
  auto lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(client_->Put("/live/me", "here", *lease).ok());
  EXPECT_EQ((*client_->Get("/live/me"))->lease, *lease);
  EXPECT_TRUE(client_->KeepAlive(*lease).ok());
  // Not kept alive: gone after its TTL (etcd checks expiry about every 500 ms).
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  EXPECT_FALSE(client_->Get("/live/me")->has_value());
  EXPECT_TRUE(client_->KeepAlive(*lease).IsNotFound());
  auto other = client_->GrantLease(30);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(client_->Put("/live/you", "here", *other).ok());
  EXPECT_TRUE(client_->RevokeLease(*other).ok());
  EXPECT_FALSE(client_->Get("/live/you")->has_value());
  EXPECT_TRUE(client_->RevokeLease(*other).ok());  // already gone: not an error
}

TEST_F(EtcdClientServerTest, TheSameClientWorksAgainAfterEtcdRestarts) {
  ASSERT_TRUE(client_->Put("/survives", "yes").ok());
  server_.Stop();
  Status down = client_->Put("/during", "no");
  EXPECT_TRUE(down.IsUnavailable()) << down.ToString();
  server_.Start();
  ASSERT_TRUE(server_.ok()) << server_.error();
  auto got = client_->Get("/survives");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "yes");
}

// Issue 32, item 11: which node failed first was decided by the times the nodes wrote, so a node
// whose clock is 2 s behind saw its echo as the first failure. etcd's order decides now.
TEST_F(EtcdClientServerTest, FailuresAreOrderedByEtcdNotByTheNodesClocks) {
  RendezvousConfig config;
  config.endpoint = server_.endpoint();
  config.job = "skew";
  config.host = "node-a";
  auto a = Rendezvous::Connect(config);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  config.host = "node-b";
  auto b = Rendezvous::Connect(config);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE((*a)->ReportFailure(0, 5000).ok());  // first, by a clock 2 s ahead
  ASSERT_TRUE((*b)->ReportFailure(0, 3000).ok());  // its echo, by a clock behind
  Result<bool> b_earlier = (*b)->FailedEarlierElsewhere(0, 3000);
  Result<bool> a_earlier = (*a)->FailedEarlierElsewhere(0, 5000);
  ASSERT_TRUE(b_earlier.ok() && a_earlier.ok());
  EXPECT_TRUE(*b_earlier) << "b's failure came second";
  EXPECT_FALSE(*a_earlier) << "a's failure came first";
  // Issue 32, item 10: a node of the round that reported nothing may be gone.
  Result<std::vector<std::string>> silent = (*a)->NodesWithoutFailure(0, {(*b)->node_id(), "node-c:1:lost"});
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  EXPECT_EQ(*silent, std::vector<std::string>{"node-c:1:lost"});
}

}  // namespace etcd_client_test
}  // namespace lifeline::agent
