// The drill's allreduce across nodes: every rank gets the sum added in rank order (the bits of the
// shared-memory one), gathers are indexed by rank, a rank of another launch, world or size is
// refused with a reason it can report, a group that never completes names who is missing, and a
// peer that dies mid-collective is an error naming it rather than a silent wrong sum. Ranks are
// threads here; the drills run them as processes on separate agents.
#include "agent/drill/tcp_allreduce.h"

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "agent/etcd/etcd_test_server.h"

namespace lifeline::drill {
namespace {

TcpAllReduceOptions Options(uint16_t port, uint32_t rank, uint32_t world, uint64_t count, double timeout = 10) {
  TcpAllReduceOptions o;
  o.master_addr = "localhost";  // resolved, IPv6 or IPv4: the root listens on both
  o.master_port = port;
  o.launch_key = "job:abc:0";
  o.rank = rank;
  o.world_size = world;
  o.count = count;
  o.join_timeout_seconds = timeout;
  return o;
}

uint16_t Port() {
  const int p = agent::testing::FreeLoopbackPort();
  EXPECT_GT(p, 0);
  return static_cast<uint16_t>(p);
}

// Runs body(rank) for every rank of `world` on its own thread and waits for all.
void RunRanks(uint32_t world, const std::function<void(uint32_t)>& body) {
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < world; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

// Contributions whose sum depends on the order of addition in float.
float Contribution(uint32_t rank, uint64_t i, uint64_t k) {
  return (rank % 2 == 0 ? 1e8f : 1.0f) * static_cast<float>(1 + (i * 7 + rank * 13 + k) % 11) / 3.0f;
}

TEST(TcpAllReduceTest, EveryRankGetsTheRankOrderSumAndGathersAreIndexedByRank) {
  constexpr uint32_t kWorld = 4;
  constexpr uint64_t kCount = 30000;  // more than a socket buffer per rank
  constexpr uint64_t kSteps = 25;
  const uint16_t port = Port();
  std::vector<std::vector<float>> results(kWorld);
  std::vector<std::vector<uint64_t>> gathered(kWorld);
  std::vector<std::string> errors(kWorld);
  RunRanks(kWorld, [&](uint32_t rank) {
    auto joined = TcpAllReduce::Join(Options(port, rank, kWorld, kCount));
    if (!joined.ok()) {
      errors[rank] = joined.status().ToString();
      return;
    }
    TcpAllReduce& comm = **joined;
    std::vector<float> mine(kCount);
    for (uint64_t k = 0; k < kSteps; ++k) {
      for (uint64_t i = 0; i < kCount; ++i) mine[i] = Contribution(rank, i, k);
      comm.Post(mine.data());
      if (Status s = comm.Finish(mine.data()); !s.ok()) errors[rank] = s.ToString();
      results[rank].insert(results[rank].end(), mine.begin(), mine.end());
    }
    auto all = comm.AllGather(1000 + rank);
    if (all.ok()) gathered[rank] = *all;
    else errors[rank] = all.status().ToString();
    EXPECT_EQ(comm.completed(), kSteps + 1);
  });
  std::vector<float> want;
  for (uint64_t k = 0; k < kSteps; ++k) {
    for (uint64_t i = 0; i < kCount; ++i) {
      float sum = Contribution(0, i, k);
      for (uint32_t r = 1; r < kWorld; ++r) sum += Contribution(r, i, k);
      want.push_back(sum);
    }
  }
  for (uint32_t r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(results[r].size(), want.size()) << "rank " << r;
    EXPECT_EQ(0, std::memcmp(results[r].data(), want.data(), want.size() * sizeof(float)))
        << "rank " << r << " did not get the rank-order sum bit for bit";
    EXPECT_EQ(gathered[r], (std::vector<uint64_t>{1000, 1001, 1002, 1003})) << "rank " << r;
  }
}

TEST(TcpAllReduceTest, AWorldOfOneNeedsNoPeers) {
  auto joined = TcpAllReduce::Join(Options(Port(), 0, 1, 2));
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  float v[2] = {1.5f, 2.5f};
  (*joined)->Post(v);
  ASSERT_TRUE((*joined)->Finish(v).ok());
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_EQ(v[1], 2.5f);
}

TEST(TcpAllReduceTest, AGroupThatNeverCompletesNamesTheMissingRanks) {
  const uint16_t port = Port();
  Status root, peer;
  RunRanks(2, [&](uint32_t r) {
    // Rank 1 of a world of 3 comes; rank 2 never does.
    auto joined = TcpAllReduce::Join(Options(port, r, 3, 4, /*timeout=*/1.0));
    (r == 0 ? root : peer) = joined.status();
  });
  ASSERT_TRUE(root.IsUnavailable()) << root.ToString();
  EXPECT_NE(root.ToString().find("ranks 2 never joined"), std::string::npos) << root.ToString();
  EXPECT_NE(root.ToString().find(std::to_string(port)), std::string::npos) << root.ToString();
  EXPECT_TRUE(peer.IsUnavailable()) << peer.ToString();

  // Nobody listening: the peer names the address it tried.
  auto alone = TcpAllReduce::Join(Options(Port(), 1, 2, 4, /*timeout=*/0.5));
  ASSERT_TRUE(alone.status().IsUnavailable()) << alone.status().ToString();
  EXPECT_NE(alone.status().ToString().find("localhost:"), std::string::npos) << alone.status().ToString();
}

TEST(TcpAllReduceTest, RanksOfAnotherLaunchWorldOrSizeAreRefusedWithTheReason) {
  const uint16_t port = Port();
  Status root, stale, other_count, twin, good;
  std::thread root_thread([&] {
    auto joined = TcpAllReduce::Join(Options(port, 0, 2, 4, /*timeout=*/10));
    root = joined.status();
    if (joined.ok()) {
      float v[4] = {1, 2, 3, 4};
      (*joined)->Post(v);
      root = (*joined)->Finish(v);
    }
  });
  TcpAllReduceOptions o = Options(port, 1, 2, 4);
  o.launch_key = "job:abc:1";  // a rank of the next launch, or the last one, at the same port
  stale = TcpAllReduce::Join(o).status();
  other_count = TcpAllReduce::Join(Options(port, 1, 2, 5)).status();
  auto joined = TcpAllReduce::Join(Options(port, 1, 2, 4));
  good = joined.status();
  if (joined.ok()) {
    float v[4] = {10, 20, 30, 40};
    (*joined)->Post(v);
    good = (*joined)->Finish(v);
    EXPECT_EQ(v[3], 44.0f);
  }
  root_thread.join();
  EXPECT_TRUE(root.ok()) << root.ToString();
  EXPECT_TRUE(good.ok()) << good.ToString();
  ASSERT_EQ(stale.code(), StatusCode::kInvalidArgument) << stale.ToString();
  EXPECT_NE(stale.ToString().find("launch 'job:abc:1'"), std::string::npos) << stale.ToString();
  ASSERT_EQ(other_count.code(), StatusCode::kInvalidArgument) << other_count.ToString();
  EXPECT_NE(other_count.ToString().find("5 floats"), std::string::npos) << other_count.ToString();
}

TEST(TcpAllReduceTest, APeerThatDiesMidCollectiveIsAnErrorNamingIt) {
  const uint16_t port = Port();
  Status root_finish;
  RunRanks(3, [&](uint32_t rank) {
    auto joined = TcpAllReduce::Join(Options(port, rank, 3, 8));
    ASSERT_TRUE(joined.ok()) << joined.status().ToString();
    std::vector<float> v(8, 1.0f);
    if (rank == 2) return;  // its connection closes without a contribution, as a killed process's does
    (*joined)->Post(v.data());
    Status s = (*joined)->Finish(v.data());
    if (rank == 0) root_finish = s;
    // Rank 1 learns of it from rank 0 going away below.
  });
  ASSERT_FALSE(root_finish.ok());
  EXPECT_NE(root_finish.ToString().find("rank 2"), std::string::npos) << root_finish.ToString();
  EXPECT_NE(root_finish.ToString().find("closed"), std::string::npos) << root_finish.ToString();
}

TEST(TcpAllReduceTest, BadOptionsAreRejected) {
  EXPECT_EQ(TcpAllReduce::Join(Options(Port(), 2, 2, 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpAllReduce::Join(Options(Port(), 0, 2, 0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpAllReduce::Join(Options(0, 1, 2, 4)).status().code(), StatusCode::kInvalidArgument);
  TcpAllReduceOptions o = Options(Port(), 1, 2, 4);
  o.launch_key.assign(300, 'k');
  EXPECT_EQ(TcpAllReduce::Join(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lifeline::drill
