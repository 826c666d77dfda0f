// ReplicaDigestDetector on synthetic snapshots: replicas that agree raise nothing; a copy that
// differs from the majority's is named with its tensor and byte range; with no majority (two
// replicas, or a tie) every rank compared is named and the evidence says so.
#include "agent/detectors/replica_digest_detector.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/event_simulator.h"

namespace lifeline::agent {
namespace replica_digest_detector_test {

using namespace simulation;
using trace::Event;
using trace::EventType;

class DigestJob {
 public:
  explicit DigestJob(int world, int rank_base = 0, double hold_seconds = 30)
      : detector_(hold_seconds), driver_({&detector_}, world, rank_base) {}

  void Digest(int rank, uint64_t step, uint64_t key, uint32_t replicas, uint64_t digest, uint64_t bytes = 4096,
              uint64_t offset = 0) {
    Event e;
    e.time_ns = now_;
    e.type = EventType::kReplicaDigest;
    e.comm = replicas;
    e.step = step;
    e.seq = key;
    e.bytes = bytes;
    e.duration_ns = offset;
    e.aux = digest;
    driver_.Observe(rank, e);
  }
  // The name in kReplicaName parts, as the library sends it.
  void Name(int rank, uint64_t key, const std::string& name) {
    const uint32_t parts = static_cast<uint32_t>((name.size() + 23) / 24);
    for (uint32_t k = 0; k < parts; ++k) {
      Event e;
      e.time_ns = now_;
      e.type = EventType::kReplicaName;
      e.op = static_cast<trace::Op>(parts);
      e.comm = k;
      e.seq = key;
      const size_t n = std::min<size_t>(24, name.size() - 24 * k);
      std::memcpy(reinterpret_cast<char*>(&e) + offsetof(Event, bytes), name.data() + 24 * k, n);
      driver_.Observe(rank, e);
    }
  }
  void Advance(uint64_t ns) {
    now_ += ns;
    std::vector<Anomaly> found;
    driver_.Poll(now_, &found);
    all_.insert(all_.end(), found.begin(), found.end());
  }
  const std::vector<Anomaly>& anomalies() const { return all_; }
  const ReplicaDigestDetector& detector() const { return detector_; }
  ReplicaDigestDetector& mutable_detector() { return detector_; }
  const Timeline& timeline() const { return driver_.timeline(); }
  uint64_t now() const { return now_; }

 private:
  ReplicaDigestDetector detector_;
  Driver driver_;
  uint64_t now_ = kSec;
  std::vector<Anomaly> all_;
};

constexpr uint64_t kWeight = 0x1111, kBias = 0x2222;

TEST(ReplicaDigestDetector, AgreeingReplicasRaiseNothing) {
  DigestJob job(3);
  for (uint64_t step = 10; step <= 50; step += 10) {
    for (int r = 0; r < 3; ++r) {
      job.Digest(r, step, kWeight, 3, 0xabc + step);
      job.Digest(r, step, kBias, 3, 0xdef + step);
    }
    job.Advance(100 * kMs);
  }
  EXPECT_TRUE(job.anomalies().empty());
  EXPECT_EQ(job.detector().shards_compared(), 10u);
}

TEST(ReplicaDigestDetector, NamesTheRankWhoseCopyDiffersFromTheMajority) {
  DigestJob job(3);
  job.Name(1, kWeight, "model.layers.0.attention.wq.weight");  // two parts
  for (int r = 0; r < 3; ++r) {
    job.Digest(r, 20, kWeight, 3, r == 1 ? 0xbad : 0x900d, 4096, 0);
    job.Digest(r, 20, kBias, 3, 0x5a5a);
  }
  job.Advance(100 * kMs);  // every replica reported: judged at once
  ASSERT_EQ(job.anomalies().size(), 1u);
  const Anomaly& a = job.anomalies()[0];
  EXPECT_EQ(a.kind, "sdc_suspect");
  EXPECT_EQ(a.ranks, std::vector<int>({1}));
  EXPECT_EQ(a.step, 20u);
  EXPECT_TRUE(a.evidence["majority"].get<bool>());
  ASSERT_EQ(a.evidence["tensors"].size(), 1u);
  const auto& t = a.evidence["tensors"][0];
  EXPECT_EQ(t["tensor"], "model.layers.0.attention.wq.weight");
  EXPECT_EQ(t["byte_range"], nlohmann::json({0, 4096}));
  EXPECT_EQ(t["range_of"], "tensor");
  EXPECT_EQ(t["majority"], "000000000000900d");
  EXPECT_EQ(t["digests"]["1"], "0000000000000bad");
  EXPECT_EQ(a.evidence["shards_compared"], 2);
  EXPECT_NE(a.message.find("rank 1 holds a copy of 'model.layers.0.attention.wq.weight'"), std::string::npos) << a.message;
}

TEST(ReplicaDigestDetector, TwoReplicasThatDifferAreBothNamedWithoutAMajority) {
  DigestJob job(2);
  job.Digest(0, 7, kWeight, 2, 1);
  job.Digest(1, 7, kWeight, 2, 2);
  job.Advance(100 * kMs);
  ASSERT_EQ(job.anomalies().size(), 1u);
  const Anomaly& a = job.anomalies()[0];
  EXPECT_EQ(a.ranks, std::vector<int>({0, 1}));
  EXPECT_FALSE(a.evidence["majority"].get<bool>());
  EXPECT_TRUE(a.evidence["tensors"][0]["majority"].is_null());
  EXPECT_NE(a.message.find("no majority"), std::string::npos) << a.message;
}

TEST(ReplicaDigestDetector, ATieNamesEveryRankCompared) {
  DigestJob job(4);
  for (int r = 0; r < 4; ++r) job.Digest(r, 3, kWeight, 4, r < 2 ? 1 : 2);
  job.Advance(100 * kMs);
  ASSERT_EQ(job.anomalies().size(), 1u);
  EXPECT_EQ(job.anomalies()[0].ranks, std::vector<int>({0, 1, 2, 3}));
  EXPECT_FALSE(job.anomalies()[0].evidence["majority"].get<bool>());
}

TEST(ReplicaDigestDetector, WaitsForMissingReplicasThenJudgesWhatCame) {
  DigestJob job(3, /*rank_base=*/8, /*hold_seconds=*/5);
  job.Digest(0, 4, kWeight, 4, 7);  // four replicas, three on this node
  job.Digest(1, 4, kWeight, 4, 7);
  job.Digest(2, 4, kWeight, 4, 9);
  job.Advance(1 * kSec);
  EXPECT_TRUE(job.anomalies().empty());  // the fourth may still come
  job.Advance(5 * kSec);
  ASSERT_EQ(job.anomalies().size(), 1u);
  EXPECT_EQ(job.anomalies()[0].ranks, std::vector<int>({10}));  // global ranks
}

// A node of a multi-node job: every snapshot's shards wait for replicas that report elsewhere. A
// step whose replicas all came in the meantime is judged at once, each waiting one at its own hold,
// and a step's anomaly waits for its last shard (lifeline-sim's 16,384-rank layouts hold thousands).
TEST(ReplicaDigestDetector, ShardsWaitingForReplicasElsewhereAreJudgedEachAtItsHold) {
  DigestJob job(3, /*rank_base=*/0, /*hold_seconds=*/5);
  job.Digest(0, 10, kWeight, 6, 7);  // six replicas, three here; rank 2's copy differs
  job.Digest(1, 10, kWeight, 6, 7);
  job.Digest(2, 10, kWeight, 6, 9);
  job.Advance(1 * kSec);
  job.Digest(0, 10, kBias, 6, 5);    // the step's second shard comes a second later
  job.Digest(1, 10, kBias, 6, 5);
  job.Digest(2, 10, kBias, 6, 5);
  job.Digest(0, 20, kWeight, 3, 1);  // a later step whose replicas are all here
  job.Digest(1, 20, kWeight, 3, 2);
  job.Digest(2, 20, kWeight, 3, 1);
  job.Advance(1 * kSec);
  ASSERT_EQ(job.anomalies().size(), 1u);  // step 20 at once; step 10 still waits
  EXPECT_EQ(job.anomalies()[0].step, 20u);
  EXPECT_EQ(job.anomalies()[0].ranks, std::vector<int>({1}));
  job.Advance(4 * kSec);  // the weight's hold is over, the bias's not yet: the step's verdict waits
  EXPECT_EQ(job.anomalies().size(), 1u);
  job.Advance(1 * kSec);
  ASSERT_EQ(job.anomalies().size(), 2u);
  EXPECT_EQ(job.anomalies()[1].step, 10u);
  EXPECT_EQ(job.anomalies()[1].ranks, std::vector<int>({2}));
  EXPECT_EQ(job.anomalies()[1].evidence["shards_compared"], 2);
  EXPECT_EQ(job.detector().shards_compared(), 3u);
}

TEST(ReplicaDigestDetector, OneAnomalyPerStepListsEveryTensorThatDiffers) {
  DigestJob job(3);
  for (int r = 0; r < 3; ++r) {
    job.Digest(r, 5, kWeight, 3, r == 2 ? 1 : 0, 1 << 20, trace::kNoOffset);
    job.Digest(r, 5, kBias, 3, r == 2 ? 1 : 0, 64, 128);
  }
  job.Advance(100 * kMs);
  ASSERT_EQ(job.anomalies().size(), 1u);
  const Anomaly& a = job.anomalies()[0];
  EXPECT_EQ(a.ranks, std::vector<int>({2}));
  ASSERT_EQ(a.evidence["tensors"].size(), 2u);
  EXPECT_EQ(a.evidence["tensors"][0]["range_of"], "shard");  // a box: bytes of the shard
  EXPECT_EQ(a.evidence["tensors"][1]["byte_range"], nlohmann::json({128, 192}));
  EXPECT_EQ(a.evidence["tensors"][1]["tensor"], "shard key 0000000000002222");  // never named
}

TEST(ReplicaDigestDetector, UnprintableNameBytesAreSpelled) {
  DigestJob job(2);
  job.Name(0, kWeight, std::string("w\x01\xff", 3));
  job.Digest(0, 1, kWeight, 3, 1);
  job.Digest(1, 1, kWeight, 3, 1);
  job.Advance(100 * kSec);
  EXPECT_TRUE(job.anomalies().empty());
  job.Digest(0, 2, kWeight, 2, 1);
  job.Digest(1, 2, kWeight, 2, 3);
  job.Advance(100 * kMs);
  ASSERT_EQ(job.anomalies().size(), 1u);
  EXPECT_EQ(job.anomalies()[0].evidence["tensors"][0]["tensor"], "w\\x01\\xff");
  EXPECT_NO_THROW(job.anomalies()[0].evidence.dump());
}

// A multi-node job (folding): the node judges nothing; each rank's digests of a snapshot become
// one fold once the rank reports a later step's, or a second after its newest; replicas that agree
// fold alike, a copy that differs folds apart, and the shards stay for the leader's question.
TEST(ReplicaDigestDetector, FoldsEachRanksSnapshotForTheLeaderAndKeepsItsShards) {
  DigestJob job(3, /*rank_base=*/6);
  job.mutable_detector().set_folding(true);
  job.Name(0, kWeight, "layers.0.weight");
  for (int r = 0; r < 3; ++r) {
    job.Digest(r, 10, kWeight, 6, r == 2 ? 0xbad : 0xabc, 4096, 8192);
    job.Digest(r, 10, kBias, 3, 0xdef);
  }
  job.Advance(100 * kMs);
  EXPECT_TRUE(job.anomalies().empty());  // the leader's to judge
  EXPECT_TRUE(job.mutable_detector().TakeFolds(job.timeline(), job.now()).empty());  // still coming
  job.Advance(1100 * kMs);
  EXPECT_TRUE(job.anomalies().empty());
  std::vector<DigestFold> folds = job.mutable_detector().TakeFolds(job.timeline(), job.now());
  ASSERT_EQ(folds.size(), 3u);
  EXPECT_EQ(folds[0].rank, 6);
  EXPECT_EQ(folds[0].step, 10u);
  EXPECT_EQ(folds[0].shards, 2u);
  EXPECT_EQ(folds[0].expect, 3u);  // the fewest replicas of its shards
  EXPECT_EQ(folds[0].keyset, folds[2].keyset);
  EXPECT_EQ(folds[0].digest, folds[1].digest);
  EXPECT_NE(folds[0].digest, folds[2].digest);
  EXPECT_TRUE(job.mutable_detector().TakeFolds(job.timeline(), job.now()).empty());  // once each

  // A later step's digest finishes the earlier snapshot at once.
  job.Digest(0, 20, kWeight, 6, 0x1);
  job.Digest(0, 30, kWeight, 6, 0x2);
  folds = job.mutable_detector().TakeFolds(job.timeline(), job.now());
  ASSERT_EQ(folds.size(), 1u);
  EXPECT_EQ(folds[0].step, 20u);

  const std::optional<DigestDetail> d = job.detector().Detail(job.timeline(), 8, 10);
  ASSERT_TRUE(d.has_value());
  ASSERT_EQ(d->shards.size(), 2u);
  const ShardDigestEntry& w = d->shards[0].key == kWeight ? d->shards[0] : d->shards[1];
  EXPECT_EQ(w.digest, 0xbadu);
  EXPECT_EQ(w.name, "layers.0.weight");
  EXPECT_EQ(w.tensor_offset, 8192u);
  EXPECT_FALSE(job.detector().Detail(job.timeline(), 8, 20).has_value());  // rank 8 reported no step 20
  EXPECT_FALSE(job.detector().Detail(job.timeline(), 5, 10).has_value());  // not this node's
}

}  // namespace replica_digest_detector_test
}  // namespace lifeline::agent
