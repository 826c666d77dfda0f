// JobDigestDetector, the leader's comparison of the replicas' snapshot folds across nodes: replicas
// that agree raise nothing; a copy that differs from its group's majority is named once its group
// is in, the nodes are asked which tensors, and the verdict names them with their byte ranges; with
// no majority every rank of the group is named; a node that does not answer still has its rank
// named, the evidence saying which tensors is not known.
#include "agent/detectors/job_digest_detector.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/event_simulator.h"

namespace lifeline::agent {
namespace job_digest_detector_test {

using simulation::kMs;
using simulation::kSec;

constexpr uint64_t kGood = 0x600d, kBad = 0xbad;

DigestFold Fold(int rank, uint64_t step, uint64_t keyset, uint64_t digest, uint32_t expect) {
  DigestFold f;
  f.rank = rank;
  f.step = step;
  f.keyset = keyset;
  f.digest = digest;
  f.shards = 2;
  f.expect = expect;
  return f;
}

// Rank `rank`'s two shards at `step`: "w" (its second half of 8 KiB differs when `bad`) and "b".
DigestDetail Detail(int rank, uint64_t step, bool bad) {
  DigestDetail d;
  d.rank = rank;
  d.step = step;
  d.shards.push_back({0x1, bad ? 0x77u : 0x11u, 4, 4096, 4096, "layers.3.weight"});
  d.shards.push_back({0x2, 0x22, 4, 512, 0, "layers.3.bias"});
  return d;
}

struct Leader {
  JobDigestDetector detector{30, 10};
  uint64_t now = kSec;
  std::vector<Anomaly> anomalies;
  std::vector<DigestQuery> queries;
  void Advance(uint64_t ns) {
    now += ns;
    detector.Poll(now, &anomalies, &queries);
  }
};

std::string NodeOf(int rank) { return "node-" + std::to_string(rank / 2); }

TEST(JobDigestDetector, AgreeingReplicasOnEveryNodeRaiseNothing) {
  Leader l;
  for (uint64_t step = 10; step <= 30; step += 10) {
    for (int r = 0; r < 4; ++r) l.detector.AddFold(NodeOf(r), Fold(r, step, 0xa, kGood + step, 4), l.now);
    l.Advance(500 * kMs);
  }
  l.Advance(40 * kSec);
  EXPECT_TRUE(l.anomalies.empty());
  EXPECT_TRUE(l.queries.empty());
  EXPECT_EQ(l.detector.groups_compared(), 3u);
}

// DDP over two nodes of two ranks: rank 3 (node 1) holds a flipped copy. Its group is judged when
// its 4 folds are in; the nodes are asked for ranks 0 (the majority's) and 3; their answers name
// the tensor and the byte range.
TEST(JobDigestDetector, ACopyThatDiffersOnAnotherNodeIsNamedWithItsTensor) {
  Leader l;
  for (int r = 0; r < 4; ++r) l.detector.AddFold(NodeOf(r), Fold(r, 20, 0xa, r == 3 ? kBad : kGood, 4), l.now);
  l.detector.AddFold(NodeOf(3), Fold(3, 20, 0xa, kBad, 4), l.now);  // sent again: taken once
  l.Advance(500 * kMs);
  EXPECT_TRUE(l.anomalies.empty());  // waiting for which tensors
  ASSERT_EQ(l.queries.size(), 1u);
  EXPECT_EQ(l.queries[0].step, 20u);
  EXPECT_EQ(l.queries[0].ranks, (std::vector<int>{0, 3}));
  l.detector.AddDetail(Detail(0, 20, false));
  l.detector.AddDetail(Detail(2, 20, false));  // not asked: ignored
  l.Advance(500 * kMs);
  EXPECT_TRUE(l.anomalies.empty());
  l.detector.AddDetail(Detail(3, 20, true));
  l.Advance(500 * kMs);
  ASSERT_EQ(l.anomalies.size(), 1u);
  const Anomaly& a = l.anomalies[0];
  EXPECT_EQ(a.kind, "sdc_suspect");
  EXPECT_EQ(a.ranks, std::vector<int>{3});
  EXPECT_EQ(a.step, 20u);
  EXPECT_NE(a.message.find("rank 3 holds a copy of 'layers.3.weight'"), std::string::npos) << a.message;
  EXPECT_EQ(a.evidence["compared_by"], "leader");
  EXPECT_EQ(a.evidence["nodes"]["3"], "node-1");
  EXPECT_EQ(a.evidence["tensors_differing"], 1);
  const nlohmann::json& t = a.evidence["tensors"][0];
  EXPECT_EQ(t["tensor"], "layers.3.weight");
  EXPECT_EQ(t["byte_range"], nlohmann::json({4096, 8192}));
  EXPECT_EQ(t["ranks"], nlohmann::json({3}));
  EXPECT_EQ(t["majority"], "0000000000000011");
  EXPECT_EQ(a.evidence["ranks_compared"], nlohmann::json({0, 1, 2, 3}));
  EXPECT_FALSE(a.evidence.contains("details_missing"));
  l.Advance(60 * kSec);
  EXPECT_EQ(l.anomalies.size(), 1u);  // once
}

// TP 2 x DP 3, each node one tensor-parallel pair: two keysets, each replicated on three nodes. No
// node holds two replicas of a shard; the leader compares each keyset's three copies.
TEST(JobDigestDetector, EachKeysetIsComparedApartAndOnlyItsOddRankNamed) {
  Leader l;
  for (int r = 0; r < 6; ++r) {
    const uint64_t keyset = r % 2 == 0 ? 0xa : 0xb;
    l.detector.AddFold("node-" + std::to_string(r / 2), Fold(r, 40, keyset, r == 5 ? kBad : kGood + keyset, 3), l.now);
  }
  l.Advance(100 * kMs);
  ASSERT_EQ(l.queries.size(), 1u);
  EXPECT_EQ(l.queries[0].ranks, (std::vector<int>{1, 5}));
  l.Advance(11 * kSec);  // nobody answers
  ASSERT_EQ(l.anomalies.size(), 1u);
  const Anomaly& a = l.anomalies[0];
  EXPECT_EQ(a.ranks, std::vector<int>{5});
  EXPECT_EQ(a.evidence["groups_compared"], 2);
  EXPECT_EQ(a.evidence["details_missing"], nlohmann::json({1, 5}));
  EXPECT_NE(a.message.find("which tensors is not known"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("node-0, node-2"), std::string::npos) << a.message;
}

// Two replicas that differ: no majority, both named; the details show the one tensor that differs.
TEST(JobDigestDetector, TwoReplicasThatDifferAreBothNamed) {
  Leader l;
  l.detector.AddFold("node-0", Fold(0, 50, 0xa, kGood, 2), l.now);
  l.detector.AddFold("node-1", Fold(1, 50, 0xa, kBad, 2), l.now);
  l.Advance(100 * kMs);
  ASSERT_EQ(l.queries.size(), 1u);
  EXPECT_EQ(l.queries[0].ranks, (std::vector<int>{0, 1}));
  l.detector.AddDetail(Detail(0, 50, false));
  l.detector.AddDetail(Detail(1, 50, true));
  l.Advance(100 * kMs);
  ASSERT_EQ(l.anomalies.size(), 1u);
  const Anomaly& a = l.anomalies[0];
  EXPECT_EQ(a.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(a.evidence["majority"], false);
  EXPECT_EQ(a.evidence["tensors"][0]["tensor"], "layers.3.weight");
  EXPECT_NE(a.message.find("no majority"), std::string::npos) << a.message;
}

// A replica that never reports (its node lost, its save failed): the others are judged at the hold.
TEST(JobDigestDetector, AGroupShortOfAReplicaIsJudgedAtTheHold) {
  Leader l;
  for (int r = 0; r < 3; ++r) l.detector.AddFold(NodeOf(r), Fold(r, 60, 0xa, r == 1 ? kBad : kGood, 4), l.now);
  l.Advance(29 * kSec);
  EXPECT_TRUE(l.queries.empty());
  l.Advance(2 * kSec);
  ASSERT_EQ(l.queries.size(), 1u);
  EXPECT_EQ(l.queries[0].ranks, (std::vector<int>{0, 1}));
  l.Advance(11 * kSec);
  ASSERT_EQ(l.anomalies.size(), 1u);
  EXPECT_EQ(l.anomalies[0].ranks, std::vector<int>{1});
}

}  // namespace job_digest_detector_test
}  // namespace lifeline::agent
