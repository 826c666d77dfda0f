// lifeline/internal/replication_record.h: the agents' records of which steps are in peers' memory,
// as `lifeline ls` reads them from a checkpoint directory any node (or anyone) may have written to.
#include "lifeline/internal/replication_record.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/inspect.h"

namespace lifeline {
namespace replication_record_test {

ReplicationRecord Record(uint32_t world, uint32_t first, uint32_t ranks, std::vector<uint64_t> steps) {
  ReplicationRecord r;
  r.world_size = world;
  r.first_rank = first;
  r.ranks = ranks;
  r.node = "node-" + std::to_string(first);
  r.peers = {"node-peer"};
  r.steps = std::move(steps);
  return r;
}

bool Mentions(const std::vector<std::string>& skipped, const std::string& text) {
  for (const std::string& s : skipped)
    if (s.find(text) != std::string::npos) return true;
  return false;
}

// On the real file system: links are what a hostile or confused directory would hold.
class ReplicationRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lifeline-replicas-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/ckpt";
    ASSERT_TRUE(env_->CreateDir(dir_).ok());
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void WriteRaw(const std::string& name, const std::string& text) {
    std::filesystem::create_directories(dir_ + "/.replicas");
    std::ofstream(dir_ + "/.replicas/" + name) << text;
  }
  std::vector<ReplicationRecord> ReadAll(std::vector<std::string>* skipped = nullptr) {
    Result<std::vector<ReplicationRecord>> records = ReadReplicationRecords(env_, dir_, skipped);
    EXPECT_TRUE(records.ok()) << records.status().ToString();
    return records.value_or(std::vector<ReplicationRecord>{});
  }

  Env* env_ = Env::Default();
  std::string root_;
  std::string dir_;
};

TEST_F(ReplicationRecordTest, RoundTripsUnderItsRankRangeName) {
  ReplicationRecord r = Record(4, 2, 2, {100, 150, 100});
  r.node = "node-b";
  r.peers = {"node-a", "node-c"};
  r.updated_unix_ms = 1700000000123;
  ASSERT_TRUE(WriteReplicationRecord(env_, dir_, r).ok());
  EXPECT_TRUE(std::filesystem::is_regular_file(dir_ + "/.replicas/ranks-2-3-of-4.json"));

  std::vector<std::string> skipped;
  std::vector<ReplicationRecord> records = ReadAll(&skipped);
  EXPECT_TRUE(skipped.empty()) << skipped[0];
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].world_size, 4u);
  EXPECT_EQ(records[0].first_rank, 2u);
  EXPECT_EQ(records[0].ranks, 2u);
  EXPECT_EQ(records[0].node, "node-b");
  EXPECT_EQ(records[0].peers, (std::vector<std::string>{"node-a", "node-c"}));
  EXPECT_EQ(records[0].steps, (std::vector<uint64_t>{150, 100})) << "newest first, once each";
  EXPECT_EQ(records[0].updated_unix_ms, 1700000000123u);
}

TEST_F(ReplicationRecordTest, WriterStampsTheTimeAndKeepsTheNewestSteps) {
  std::vector<uint64_t> steps;
  for (uint64_t s = 1; s <= 100; ++s) steps.push_back(s);
  ASSERT_TRUE(WriteReplicationRecord(env_, dir_, Record(1, 0, 1, steps)).ok());
  std::vector<ReplicationRecord> records = ReadAll();
  ASSERT_EQ(records.size(), 1u);
  ASSERT_EQ(records[0].steps.size(), kMaxReplicationRecordSteps);
  EXPECT_EQ(records[0].steps.front(), 100u);
  EXPECT_EQ(records[0].steps.back(), 100u - kMaxReplicationRecordSteps + 1);
  EXPECT_GT(records[0].updated_unix_ms, 1600000000000u);
}

TEST_F(ReplicationRecordTest, WriterRefusesRecordsNoReaderWouldTake) {
  EXPECT_EQ(WriteReplicationRecord(env_, dir_, Record(4, 0, 0, {1})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteReplicationRecord(env_, dir_, Record(4, 3, 2, {1})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteReplicationRecord(env_, dir_, Record(0, 0, 1, {1})).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteReplicationRecord(env_, dir_, Record((1u << 24) + 1, 0, 1, {1})).code(),
            StatusCode::kInvalidArgument);
  ReplicationRecord huge = Record(2, 0, 1, {1});
  huge.node = std::string(100 << 10, 'n');
  EXPECT_EQ(WriteReplicationRecord(env_, dir_, huge).code(), StatusCode::kInvalidArgument);
  // A checkpoint directory removed under the job is not created again by its agent.
  EXPECT_TRUE(WriteReplicationRecord(env_, root_ + "/gone", Record(2, 0, 1, {1})).IsNotFound());
  EXPECT_FALSE(std::filesystem::exists(root_ + "/gone"));
  EXPECT_TRUE(ReadAll().empty());
}

TEST_F(ReplicationRecordTest, MissingDirectoryIsNoRecordsAndRemovalIsIdempotent) {
  EXPECT_TRUE(ReadAll().empty());
  const ReplicationRecord r = Record(2, 0, 1, {5});
  EXPECT_TRUE(RemoveReplicationRecord(env_, dir_, r).ok());
  ASSERT_TRUE(WriteReplicationRecord(env_, dir_, r).ok());
  EXPECT_EQ(ReadAll().size(), 1u);
  EXPECT_TRUE(RemoveReplicationRecord(env_, dir_, r).ok());
  EXPECT_TRUE(ReadAll().empty());
  EXPECT_TRUE(RemoveReplicationRecord(env_, dir_, r).ok());
}

TEST_F(ReplicationRecordTest, CountsEachRankOnceAndOnlyForItsWorldSize) {
  const std::vector<ReplicationRecord> records = {
      Record(4, 0, 2, {200, 100}),  // ranks 0-1
      Record(4, 1, 2, {200}),       // ranks 1-2: rank 1 again
      Record(4, 3, 1, {100}),       // rank 3
      Record(8, 0, 8, {200, 100}),  // an earlier world of 8: not these steps' ranks
  };
  EXPECT_EQ(ReplicatedRanks(records, 200, 4), 3u);
  EXPECT_EQ(ReplicatedRanks(records, 100, 4), 3u);
  EXPECT_EQ(ReplicatedRanks(records, 150, 4), 0u);
  EXPECT_EQ(ReplicatedRanks(records, 200, 8), 8u);
  EXPECT_EQ(ReplicatedRanks(records, 200, 2), 0u);
  EXPECT_EQ(ReplicatedRanks(records, 200, 0), 0u);
  EXPECT_EQ(ReplicatedRanks({Record(4, 0, 4, {7}), Record(4, 0, 4, {7})}, 7, 4), 4u);
  EXPECT_EQ(ReplicatedRanks({}, 7, 4), 0u);
}

TEST_F(ReplicationRecordTest, ReadsRecordsOfSeveralNodes) {
  ASSERT_TRUE(WriteReplicationRecord(env_, dir_, Record(4, 2, 2, {20, 10})).ok());
  ASSERT_TRUE(WriteReplicationRecord(env_, dir_, Record(4, 0, 2, {20})).ok());
  std::vector<ReplicationRecord> records = ReadAll();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].first_rank, 0u);
  EXPECT_EQ(records[1].first_rank, 2u);
  EXPECT_EQ(ReplicatedRanks(records, 20, 4), 4u);
  EXPECT_EQ(ReplicatedRanks(records, 10, 4), 2u);
}

TEST_F(ReplicationRecordTest, SkipsMalformedAndWronglyNamedRecordsSayingWhy) {
  ASSERT_TRUE(WriteReplicationRecord(env_, dir_, Record(2, 0, 1, {9})).ok());
  const std::string good_json =
      R"({"format":"lifeline-replication-1","world_size":2,"first_rank":1,"ranks":1,"node":"b",)"
      R"("peers":["a"],"steps":[9],"updated_unix_ms":1})";
  WriteRaw("ranks-1-1-of-2.json", "{\"format\": \"lifeline-replication-1\", \"world_size\": ");  // cut short
  WriteRaw("ranks-0-1-of-2.json", good_json);     // holds ranks 1..1, not 0..1
  WriteRaw("ranks-0-0-of-3.json", R"({"format":"lifeline-replication-1","world_size":3,"first_rank":0,)"
                                  R"("ranks":1,"node":"x","peers":[],"steps":["9"],"updated_unix_ms":1})");
  WriteRaw("ranks-2-2-of-3.json", R"({"format":"lifeline-replication-1","world_size":3,"first_rank":2,)"
                                  R"("ranks":4,"node":"x","peers":[],"steps":[9],"updated_unix_ms":1})");
  WriteRaw("ranks-0-0-of-5.json", R"({"format":"lifeline-replication-9","world_size":5,"first_rank":0,)"
                                  R"("ranks":1,"node":"x","peers":[],"steps":[9],"updated_unix_ms":1})");
  WriteRaw("ranks-0-0-of-6.json", "[1, 2, 3]");
  WriteRaw("notes.txt", good_json);
  WriteRaw("ranks-0-0-of-2.json.tmp-123-0", "half a rec");  // a writer in progress
  std::filesystem::create_directories(dir_ + "/.replicas/ranks-0-0-of-7.json");

  std::vector<std::string> skipped;
  std::vector<ReplicationRecord> records = ReadAll(&skipped);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].first_rank, 0u);
  EXPECT_EQ(records[0].ranks, 1u);
  EXPECT_EQ(skipped.size(), 8u);
  const std::string replicas = dir_ + "/.replicas/";
  EXPECT_TRUE(Mentions(skipped, replicas + "ranks-1-1-of-2.json: not a replication record: not a JSON object"));
  EXPECT_TRUE(Mentions(skipped, replicas + "ranks-0-1-of-2.json: holds the record of ranks-1-1-of-2.json"));
  EXPECT_TRUE(Mentions(skipped, replicas + "ranks-0-0-of-3.json: not a replication record: \"steps\""));
  EXPECT_TRUE(Mentions(skipped, replicas + "ranks-2-2-of-3.json: not a replication record: ranks 2..5"));
  EXPECT_TRUE(Mentions(skipped, replicas + "ranks-0-0-of-5.json: not a replication record: \"format\""));
  EXPECT_TRUE(Mentions(skipped, replicas + "ranks-0-0-of-6.json: not a replication record"));
  EXPECT_TRUE(Mentions(skipped, replicas + "notes.txt: not a replication record's name"));
  EXPECT_TRUE(Mentions(skipped, replicas + "ranks-0-0-of-7.json: is not a regular file"));
  EXPECT_FALSE(Mentions(skipped, ".tmp-")) << "a temporary file is a writer at work, not a problem";
  EXPECT_EQ(ReplicatedRanks(records, 9, 2), 1u);
}

TEST_F(ReplicationRecordTest, SkipsAnOversizedFileWithoutReadingIt) {
  const std::string json =
      R"({"format":"lifeline-replication-1","world_size":1,"first_rank":0,"ranks":1,"node":"a",)"
      R"("peers":[],"steps":[3],"updated_unix_ms":1})";
  WriteRaw("ranks-0-0-of-1.json", json + std::string(kMaxReplicationRecordBytes, ' '));
  std::vector<std::string> skipped;
  EXPECT_TRUE(ReadAll(&skipped).empty());
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("ranks-0-0-of-1.json: larger than 65536 bytes"), std::string::npos) << skipped[0];
}

TEST_F(ReplicationRecordTest, NeverFollowsALinkOutOfTheDirectory) {
  // A well-formed record outside the checkpoint directory, linked in under a record's name.
  const std::string outside = root_ + "/outside.json";
  std::ofstream(outside) << R"({"format":"lifeline-replication-1","world_size":1,"first_rank":0,"ranks":1,)"
                            R"("node":"a","peers":[],"steps":[3],"updated_unix_ms":1})";
  std::filesystem::create_directories(dir_ + "/.replicas");
  std::filesystem::create_symlink(outside, dir_ + "/.replicas/ranks-0-0-of-1.json");
  std::vector<std::string> skipped;
  EXPECT_TRUE(ReadAll(&skipped).empty());
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("ranks-0-0-of-1.json: is a symbolic link"), std::string::npos) << skipped[0];

  // The whole .replicas a link to a directory of records elsewhere: not read, not written through.
  std::filesystem::remove_all(dir_ + "/.replicas");
  const std::string elsewhere = root_ + "/elsewhere";
  std::filesystem::create_directories(elsewhere);
  std::filesystem::copy_file(outside, elsewhere + "/ranks-0-0-of-1.json");
  std::filesystem::create_symlink(elsewhere, dir_ + "/.replicas");
  skipped.clear();
  EXPECT_TRUE(ReadAll(&skipped).empty());
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find(".replicas: is a symbolic link"), std::string::npos) << skipped[0];
  EXPECT_EQ(WriteReplicationRecord(env_, dir_, Record(2, 0, 1, {1})).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(RemoveReplicationRecord(env_, dir_, Record(1, 0, 1, {3})).code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(std::filesystem::exists(elsewhere + "/ranks-0-1-of-2.json"));
  EXPECT_TRUE(std::filesystem::exists(elsewhere + "/ranks-0-0-of-1.json"));
}

TEST_F(ReplicationRecordTest, ReplacingARecordLeavesNoTemporaryFiles) {
  ASSERT_TRUE(WriteReplicationRecord(env_, dir_, Record(2, 0, 1, {1})).ok());
  ASSERT_TRUE(WriteReplicationRecord(env_, dir_, Record(2, 0, 1, {2, 1})).ok());
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/.replicas")) names.push_back(e.path().filename());
  EXPECT_EQ(names, (std::vector<std::string>{"ranks-0-0-of-2.json"}));
  std::vector<ReplicationRecord> records = ReadAll();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].steps, (std::vector<uint64_t>{2, 1}));
}

// A crash at any point of rewriting a record leaves the old record or the new one, never a torn
// or missing one: readers on other nodes see one or the other.
TEST(ReplicationRecordCrashTest, ReplacementIsAtomicAtEveryCrashPoint) {
  for (int64_t crash_after = 0;; ++crash_after) {
    std::unique_ptr<MemEnv> env = NewMemEnv();
    ASSERT_TRUE(env->CreateDir("/ckpt").ok());
    ASSERT_TRUE(env->SyncDir("/").ok());
    ASSERT_TRUE(WriteReplicationRecord(env.get(), "/ckpt", Record(2, 0, 1, {1})).ok());
    env->CrashAfterOperations(crash_after);
    const bool finished = WriteReplicationRecord(env.get(), "/ckpt", Record(2, 0, 1, {2, 1})).ok();
    env->CrashAfterOperations(-1);
    env->SimulateCrash();
    std::vector<std::string> skipped;
    Result<std::vector<ReplicationRecord>> records = ReadReplicationRecords(env.get(), "/ckpt", &skipped);
    ASSERT_TRUE(records.ok()) << records.status().ToString();
    EXPECT_TRUE(skipped.empty()) << "crash after " << crash_after << ": " << skipped[0];
    ASSERT_EQ(records->size(), 1u) << "crash after " << crash_after;
    const std::vector<uint64_t>& steps = (*records)[0].steps;
    EXPECT_TRUE((steps == std::vector<uint64_t>{1} || steps == std::vector<uint64_t>{2, 1})) << crash_after;
    if (finished) {
      EXPECT_EQ(steps, (std::vector<uint64_t>{2, 1})) << "a write reported done survives a crash";
      break;
    }
  }
}

// ---- what `lifeline ls` and the other readers of a checkpoint directory make of .replicas ---------

class ReplicatedListingTest : public ::testing::Test {
 protected:
  // Saves `step` as both ranks of a world of 2 (each its own tensor), or only rank 0 (partial).
  void Save(uint64_t step, bool both_ranks = true) {
    for (uint32_t rank = 0; rank < (both_ranks ? 2u : 1u); ++rank) {
      CheckpointerOptions o;
      o.directory = "/ckpt";
      o.env = env_.get();
      o.run_id = "replication-record-test";
      o.rank = rank;
      o.world_size = 2;
      o.chunk_bytes = 1024;
      o.write_block_bytes = 4096;
      o.staging_budget_bytes = 1 << 20;
      o.direct_io = false;
      auto c = Checkpointer::Open(o);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      SaveRequest r;
      r.tensors.push_back(TensorShard::Whole("w" + std::to_string(rank), DType::kF32, {16, 16}, w_.data()));
      ASSERT_TRUE((*c)->Save(step, r).WaitPersisted().ok());
    }
  }
  std::unique_ptr<MemEnv> env_ = NewMemEnv();
  std::vector<float> w_ = std::vector<float>(256, 1.5f);
};

TEST_F(ReplicatedListingTest, ListingCountsReplicatedRanksPerStep) {
  Save(10);
  Save(20);
  Save(30, /*both_ranks=*/false);
  ASSERT_TRUE(WriteReplicationRecord(env_.get(), "/ckpt", Record(2, 0, 1, {30, 20, 10})).ok());
  ASSERT_TRUE(WriteReplicationRecord(env_.get(), "/ckpt", Record(2, 1, 1, {20})).ok());
  ASSERT_TRUE(WriteReplicationRecord(env_.get(), "/ckpt", Record(4, 0, 4, {30, 20, 10})).ok());  // another world
  Result<CheckpointListing> listing = ListCheckpoints("/ckpt", env_.get());
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  ASSERT_EQ(listing->checkpoints.size(), 3u) << ".replicas is not a step";
  EXPECT_EQ(listing->checkpoints[0].info.step, 30u);
  EXPECT_EQ(listing->checkpoints[0].replicated_ranks, 1u);  // partial on disk, rank 0 on a peer
  EXPECT_EQ(listing->checkpoints[1].info.step, 20u);
  EXPECT_EQ(listing->checkpoints[1].replicated_ranks, 2u);
  EXPECT_EQ(listing->checkpoints[2].info.step, 10u);
  EXPECT_EQ(listing->checkpoints[2].replicated_ranks, 1u);
}

TEST_F(ReplicatedListingTest, RecordsDisturbNeitherScanVerifyNorRetention) {
  Save(10);
  Save(20);
  ASSERT_TRUE(WriteReplicationRecord(env_.get(), "/ckpt", Record(2, 0, 2, {20})).ok());
  Result<std::vector<CheckpointInfo>> scan = ScanCheckpointDirectory("/ckpt", env_.get());
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  ASSERT_EQ(scan->size(), 2u);
  EXPECT_TRUE((*scan)[0].complete && (*scan)[1].complete);
  Result<VerifyResult> verified = VerifyCheckpoint("/ckpt", std::nullopt, env_.get());
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_TRUE(verified->status.ok()) << verified->status.ToString();
  RetentionOptions keep;
  keep.keep_last = 1;
  ASSERT_TRUE(ApplyRetention("/ckpt", keep, env_.get()).ok());
  Result<CheckpointListing> listing = ListCheckpoints("/ckpt", env_.get());
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  ASSERT_EQ(listing->checkpoints.size(), 1u);
  EXPECT_EQ(listing->checkpoints[0].info.step, 20u);
  EXPECT_EQ(listing->checkpoints[0].replicated_ranks, 2u);
  EXPECT_EQ(ReadReplicationRecords(env_.get(), "/ckpt").value_or(std::vector<ReplicationRecord>{}).size(), 1u)
      << "retention keeps the agents' records";
}

TEST_F(ReplicatedListingTest, UnreadableRecordsCountNothingButTheListingStands) {
  Save(10);
  ASSERT_TRUE(WriteFileAtomically(env_.get(), "/ckpt/.replicas", "not a directory").ok());
  Result<CheckpointListing> listing = ListCheckpoints("/ckpt", env_.get());
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  ASSERT_EQ(listing->checkpoints.size(), 1u);
  EXPECT_EQ(listing->checkpoints[0].replicated_ranks, 0u);
}

}  // namespace replication_record_test
}  // namespace lifeline
