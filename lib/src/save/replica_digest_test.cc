// Replica digests from the save path: the replicas of a data-parallel job, each saving through its
// own Checkpointer, report the same digest for each replicated shard whichever of them writes it
// (the writer's from its chunk checksums, the others' from hashing their own copy), whether the
// shard is written whole by one replica or split among them; one flipped bit in one replica's copy
// changes that replica's digest of that tensor only; and a non-writing replica's hashing never
// writes its copy into the checkpoint.
#include "lib/src/save/replica_digest.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace replica_digest_test {

constexpr uint32_t kReplicas = 3;

// One replica's state: a small tensor (written whole by one replica), a large one (split in
// kReplicas parts, several chunks each) and a tensor of its own (not replicated: no digest).
struct ReplicaState {
  std::vector<float> small = std::vector<float>(100);
  std::vector<float> large = std::vector<float>(3000);  // 12000 bytes > replica_split_bytes
  std::vector<int64_t> own = std::vector<int64_t>(10);

  explicit ReplicaState(uint32_t rank) {
    for (size_t i = 0; i < small.size(); ++i) small[i] = 0.5f * static_cast<float>(i);
    for (size_t i = 0; i < large.size(); ++i) large[i] = 1.0f / static_cast<float>(i + 1);
    for (size_t i = 0; i < own.size(); ++i) own[i] = rank * 100 + static_cast<int64_t>(i);
  }
  SaveRequest Request(uint32_t rank) {
    SaveRequest r;
    r.tensors.push_back(TensorShard::Whole("small", DType::kF32, {100}, small.data()).Replica(rank, kReplicas));
    r.tensors.push_back(TensorShard::Whole("large", DType::kF32, {30, 100}, large.data()).Replica(rank, kReplicas));
    r.tensors.push_back(TensorShard::Whole("own." + std::to_string(rank), DType::kI64, {10}, own.data()));
    return r;
  }
};

class ReplicaDigestTest : public ::testing::Test {
 protected:
  // Saves `step` on every replica; returns each rank's digests by tensor.
  std::vector<std::map<std::string, uint64_t>> SaveAll(uint64_t step, std::vector<ReplicaState>& states,
                                                      bool column_blocks = false) {
    std::vector<std::unique_ptr<Checkpointer>> ranks;
    std::vector<SaveTicket> tickets;
    for (uint32_t r = 0; r < kReplicas; ++r) {
      CheckpointerOptions o = test::InMemoryCheckpointerOptions(env_.get(), "replica-digest-test", 1024, r, kReplicas);
      o.replica_split_bytes = 4096;
      o.column_blocks = column_blocks;
      o.replica_digests = CheckpointerOptions::ReplicaDigests::kOn;
      auto c = Checkpointer::Open(o);
      EXPECT_TRUE(c.ok()) << c.status().ToString();
      tickets.push_back((*c)->Save(step, states[r].Request(r)));
      ranks.push_back(std::move(*c));
    }
    std::vector<std::map<std::string, uint64_t>> out(kReplicas);
    for (uint32_t r = 0; r < kReplicas; ++r) {
      EXPECT_TRUE(tickets[r].WaitSnapshot().ok());
      for (const SaveTicket::ReplicaDigest& d : tickets[r].ReplicaDigests()) {
        EXPECT_EQ(d.replica_count, kReplicas);
        out[r][d.tensor] = d.digest;
      }
      EXPECT_TRUE(tickets[r].WaitPersisted().ok());
    }
    return out;
  }

  std::unique_ptr<MemEnv> env_ = NewMemEnv();
};

TEST_F(ReplicaDigestTest, EveryReplicaReportsTheSameDigestWhicheverWritesTheShard) {
  std::vector<ReplicaState> states;
  for (uint32_t r = 0; r < kReplicas; ++r) states.emplace_back(r);
  const auto digests = SaveAll(1, states);
  for (uint32_t r = 0; r < kReplicas; ++r) {
    ASSERT_EQ(digests[r].size(), 2u) << "rank " << r << ": the replicated tensors only";
    EXPECT_EQ(digests[r].at("small"), digests[0].at("small"));
    EXPECT_EQ(digests[r].at("large"), digests[0].at("large"));
  }
  EXPECT_NE(digests[0].at("small"), digests[0].at("large"));
}

TEST_F(ReplicaDigestTest, ColumnBlocksDigestTheSameBytesAlike) {
  std::vector<ReplicaState> states;
  for (uint32_t r = 0; r < kReplicas; ++r) states.emplace_back(r);
  const auto plain = SaveAll(1, states, /*column_blocks=*/false);
  const auto blocked = SaveAll(2, states, /*column_blocks=*/true);
  for (uint32_t r = 0; r < kReplicas; ++r) EXPECT_EQ(plain[r], blocked[r]) << "rank " << r;
}

TEST_F(ReplicaDigestTest, AFlippedBitChangesThatReplicasDigestOfThatTensorOnly) {
  std::vector<ReplicaState> states;
  for (uint32_t r = 0; r < kReplicas; ++r) states.emplace_back(r);
  const auto before = SaveAll(1, states);
  // One bit of rank 1's copy of the large tensor, in the part rank 2 writes (rank 1 only hashes it).
  uint32_t bits;
  std::memcpy(&bits, &states[1].large[2500], sizeof(bits));
  bits ^= 1u << 3;
  std::memcpy(&states[1].large[2500], &bits, sizeof(bits));
  const auto after = SaveAll(2, states);
  EXPECT_EQ(after[0], before[0]);
  EXPECT_EQ(after[2], before[2]);
  EXPECT_EQ(after[1].at("small"), before[1].at("small"));
  EXPECT_NE(after[1].at("large"), before[1].at("large"));

  // The checkpoint holds rank 2's copy of that part, untouched by rank 1's hashing.
  CheckpointerOptions o = test::InMemoryCheckpointerOptions(env_.get(), "reader", 1024);
  auto reader = Checkpointer::Open(o);
  ASSERT_TRUE(reader.ok());
  std::vector<float> back(3000);
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("large", DType::kF32, {30, 100}, back.data()));
  ASSERT_TRUE((*reader)->Load(2, load).ok());
  EXPECT_EQ(back, states[0].large);
}

TEST_F(ReplicaDigestTest, NoDigestsWhenOffOrWithoutAnAgent) {
  ReplicaState state(0);
  for (auto mode : {CheckpointerOptions::ReplicaDigests::kOff, CheckpointerOptions::ReplicaDigests::kAuto}) {
    CheckpointerOptions o = test::InMemoryCheckpointerOptions(env_.get(), "off", 1024, 0, kReplicas);
    o.replica_digests = mode;
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok());
    SaveTicket t = (*c)->Save(mode == CheckpointerOptions::ReplicaDigests::kOff ? 1 : 2, state.Request(0));
    ASSERT_TRUE(t.WaitSnapshot().ok());
    EXPECT_TRUE(t.ReplicaDigests().empty());  // LIFELINE_AGENT is unset in the tests
    ASSERT_TRUE(t.WaitPersisted().ok());
  }
}

}  // namespace replica_digest_test
}  // namespace lifeline
