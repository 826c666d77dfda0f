// Checkpointer on an s3:// directory, against a real SeaweedFS cluster (tools/seaweedfs): what a
// user of a bucket sees is what a user of a disk sees. Saves by two ranks commit and load into
// other layouts with ranged GETs of exactly the bytes needed; retention and gc remove whole steps;
// the memory tier stays in local shared memory while the durable copy goes to the bucket, directly
// or drained from a local disk; a failed upload is never published and harms no earlier step; a
// volume server killed during a save loses nothing.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/env/s3_client.h"
#include "lib/src/env/s3_env.h"
#include "lib/src/env/s3_test_cluster.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/inspect.h"

namespace lifeline {
namespace checkpointer_s3_test {

using s3_test::SeaweedCluster;
using s3_test::UniquePrefix;

constexpr int64_t kRows = 1024, kCols = 1024;  // 4 MiB of f32 per step, 2 MiB per rank

std::vector<float> Values(uint64_t step) {
  std::vector<float> v(kRows * kCols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(step * 1000003 + i);
  return v;
}

// Rank r of 2 holds rows [r * kRows / 2, (r + 1) * kRows / 2) of "w".
SaveRequest RankRequest(std::vector<float>& full, uint32_t rank) {
  SaveRequest r;
  const int64_t rows = kRows / 2;
  r.tensors.push_back(TensorShard::Box("w", DType::kF32, {kRows, kCols}, {rank * rows, 0}, {rows, kCols},
                                       full.data() + rank * rows * kCols));
  r.objects.push_back({"rng", "rank " + std::to_string(rank)});
  r.metadata_json = "{\"saved_by\": \"two ranks\"}";
  return r;
}

class CheckpointerS3Test : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    cluster_ = SeaweedCluster::Shared(&why);
    if (cluster_ == nullptr) GTEST_SKIP() << why;
    // Env::Routing() reads the standard AWS variables, as a user's job does.
    for (const char* name : {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"})
      setenv(name, cluster_->Get(name).c_str(), 1);
    root_ = "s3://" + cluster_->bucket() + "/" + UniquePrefix("ckpt");
    Result<std::unique_ptr<S3Client>> client = S3Client::Create(cluster_->Options());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
  }

  CheckpointerOptions Options(uint32_t rank, uint32_t world = 2) const {
    CheckpointerOptions o;
    o.directory = root_;
    o.rank = rank;
    o.world_size = world;
    o.run_id = "launch-" + root_;
    o.staging_budget_bytes = 64ull << 20;
    return o;
  }

  // Saves step `step` by two ranks (one Checkpointer each, as two processes would) and waits
  // until it is committed.
  void SaveByTwoRanks(std::vector<std::unique_ptr<Checkpointer>>& ranks, uint64_t step) {
    std::vector<float> full = Values(step);
    std::vector<SaveTicket> tickets;
    for (uint32_t r = 0; r < 2; ++r) tickets.push_back(ranks[r]->Save(step, RankRequest(full, r)));
    for (SaveTicket& t : tickets) ASSERT_TRUE(t.WaitPersisted().ok()) << t.WaitPersisted().ToString();
    for (SaveTicket& t : tickets) ASSERT_TRUE(t.WaitCommitted(30).ok()) << t.WaitCommitted(30).ToString();
  }

  std::vector<std::unique_ptr<Checkpointer>> OpenTwoRanks(std::function<void(CheckpointerOptions&)> adjust = nullptr) {
    std::vector<std::unique_ptr<Checkpointer>> ranks;
    for (uint32_t r = 0; r < 2; ++r) {
      CheckpointerOptions o = Options(r);
      if (adjust) adjust(o);
      Result<std::unique_ptr<Checkpointer>> c = Checkpointer::Open(o);
      EXPECT_TRUE(c.ok()) << c.status().ToString();
      if (c.ok()) ranks.push_back(std::move(*c));
    }
    return ranks;
  }

  // Every key under the bucket's prefix `prefix` (empty: the test's root).
  std::vector<std::string> Keys(std::string prefix = "") {
    if (prefix.empty()) prefix = root_.substr(root_.find('/', 5) + 1) + "/";
    Result<S3Listing> listing = client_->ListObjects(cluster_->bucket(), prefix, "");
    EXPECT_TRUE(listing.ok()) << listing.status().ToString();
    std::vector<std::string> keys;
    if (listing.ok())
      for (const S3ObjectInfo& o : listing->objects) keys.push_back(o.key);
    return keys;
  }

  size_t UploadsUnder(const std::string& prefix) {
    Result<std::vector<S3MultipartUpload>> uploads = client_->ListMultipartUploads(cluster_->bucket(), prefix);
    EXPECT_TRUE(uploads.ok()) << uploads.status().ToString();
    return uploads.ok() ? uploads->size() : 0;
  }

  SeaweedCluster* cluster_ = nullptr;
  std::unique_ptr<S3Client> client_;
  std::string root_;
};

TEST_F(CheckpointerS3Test, SavesCommitAndLoadIntoAnotherLayoutReadingExactlyTheBytesNeeded) {
  std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks();
  ASSERT_EQ(2u, ranks.size());
  SaveByTwoRanks(ranks, 10);
  SaveByTwoRanks(ranks, 20);

  Result<std::vector<CheckpointInfo>> listed = ranks[0]->List();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(2u, listed->size());
  EXPECT_EQ(20u, (*listed)[0].step);
  EXPECT_TRUE((*listed)[0].complete) << (*listed)[0].problem;
  EXPECT_EQ(root_ + "/step-00000000000000000020", (*listed)[0].directory);
  Result<std::optional<uint64_t>> latest = ranks[1]->LatestStep();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(20u, **latest);

  // One process, another world size, the whole tensor: every stored byte once, no alignment slack.
  CheckpointerOptions one = Options(0, 1);
  one.run_id = "reader";
  Result<std::unique_ptr<Checkpointer>> reader = Checkpointer::Open(one);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> whole(kRows * kCols, -1.0f);
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("w", DType::kF32, {kRows, kCols}, whole.data()));
  load.objects_of_rank = 1;
  Result<LoadResult> loaded = (*reader)->Load(std::nullopt, load);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(20u, loaded->step);
  EXPECT_EQ(2u, loaded->saved_world_size);
  EXPECT_FALSE(loaded->from_memory_tier);
  EXPECT_TRUE(whole == Values(20));
  EXPECT_EQ("{\"saved_by\": \"two ranks\"}", loaded->metadata_json);
  ASSERT_EQ(1u, loaded->objects.size());
  EXPECT_EQ("rank 1", loaded->objects[0].second);
  EXPECT_EQ(whole.size() * sizeof(float), loaded->bytes_scattered);
  // The data plus the two small objects stored after it, read with it: nothing else.
  EXPECT_LE(loaded->bytes_read, whole.size() * sizeof(float) + 64) << loaded->bytes_read;

  // A box across both saved shards, of an older step: only the chunks that hold it are fetched.
  std::vector<float> box(64 * kCols);
  LoadRequest part;
  part.tensors.push_back(TensorShard::Box("w", DType::kF32, {kRows, kCols}, {kRows / 2 - 32, 0}, {64, kCols}, box.data()));
  Result<LoadResult> partial = (*reader)->Load(10, part);
  ASSERT_TRUE(partial.ok()) << partial.status().ToString();
  const std::vector<float> ten = Values(10);
  EXPECT_TRUE(std::equal(box.begin(), box.end(), ten.begin() + (kRows / 2 - 32) * kCols));
  // 256 KiB chunks: one per rank holds the 32 rows each side contributes (128 KiB); the small
  // object stored right after the last one comes with it.
  EXPECT_LE(partial->bytes_read, 2u * (256u << 10) + 64) << partial->bytes_read;

  Result<VerifyResult> verified = VerifyCheckpoint(root_, std::nullopt);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_TRUE(verified->status.ok()) << verified->status.ToString();
  EXPECT_EQ(20u, verified->step);
  EXPECT_EQ(2u, verified->chunks_checked / 8);  // 2 MiB per rank in 256 KiB chunks: 8 each
}

TEST_F(CheckpointerS3Test, RetentionAndGarbageCollectionRemoveWholeStepsAndNothingOutsideThePrefix) {
  // A neighbour whose name starts like the root must survive everything below.
  const std::string neighbour_key = root_.substr(root_.find('/', 5) + 1) + "-neighbour/keep.bin";
  ASSERT_TRUE(client_->PutObject(cluster_->bucket(), neighbour_key, "not lifeline's").ok());

  std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks([](CheckpointerOptions& o) { o.keep_last = 2; });
  ASSERT_EQ(2u, ranks.size());
  for (uint64_t step : {1, 2, 3}) SaveByTwoRanks(ranks, step);
  ASSERT_TRUE(ranks[0]->Flush().ok());
  ASSERT_TRUE(ranks[1]->Flush().ok());
  // Retention runs after the commit, on the rank that committed: wait for it to finish.
  std::vector<CheckpointInfo> listed;
  for (int i = 0; i < 100; ++i) {
    Result<std::vector<CheckpointInfo>> l = ranks[0]->List();
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    listed = *l;
    if (listed.size() == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(2u, listed.size());
  EXPECT_EQ(3u, listed[0].step);
  EXPECT_EQ(2u, listed[1].step);
  for (const std::string& key : Keys())
    EXPECT_EQ(std::string::npos, key.find("step-00000000000000000001")) << key << " outlived retention";

  // A partial step older than the newest complete one, with an upload its writer never finished
  // (it died): gc removes both, and no part is left billed in the bucket.
  const std::string prefix = root_.substr(root_.find('/', 5) + 1);
  const std::string dead = prefix + "/step-00000000000000000000/0123456789abcdef.r000000-of-000002.data";
  ASSERT_TRUE(client_->PutObject(cluster_->bucket(), prefix + "/step-00000000000000000000/0123456789abcdef.r000001-of-000002.index", "x").ok());
  Result<std::string> upload = client_->CreateMultipartUpload(cluster_->bucket(), dead);
  ASSERT_TRUE(upload.ok()) << upload.status().ToString();
  ASSERT_EQ(1u, UploadsUnder(prefix + "/step-00000000000000000000/"));
  RetentionOptions gc;
  gc.keep_last = 1;
  gc.remove_partial = true;
  gc.even_while_saving = true;
  Status collected = ApplyRetention(root_, gc);
  ASSERT_TRUE(collected.ok()) << collected.ToString();
  EXPECT_EQ(0u, UploadsUnder(prefix + "/step-00000000000000000000/"));
  Result<std::vector<CheckpointInfo>> after = ScanCheckpointDirectory(root_);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ASSERT_EQ(1u, after->size());
  EXPECT_EQ(3u, (*after)[0].step);
  EXPECT_EQ(std::vector<std::string>{neighbour_key}, Keys(prefix + "-neighbour/"));
}

TEST_F(CheckpointerS3Test, TheMemoryTierStaysLocalWhileTheDurableCopyGoesToTheBucket) {
  char tier[] = "/tmp/lifeline-s3-tier-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tier));
  std::vector<float> full = Values(7);
  {
    CheckpointerOptions o = Options(0, 1);
    o.memory_tier = true;
    o.memory_tier_directory = tier;
    o.memory_tier_cleanup_on_close = false;  // as a process that crashes
    Result<std::unique_ptr<Checkpointer>> c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    SaveRequest r;
    r.tensors.push_back(TensorShard::Whole("w", DType::kF32, {kRows, kCols}, full.data()));
    SaveTicket t = (*c)->Save(7, r);
    ASSERT_TRUE(t.WaitPersisted().ok()) << t.WaitPersisted().ToString();
    EXPECT_TRUE(t.Progress().memory_tier) << t.Progress().memory_tier_note;
  }
  // The bucket holds the step, and nothing of the tier.
  Result<std::vector<CheckpointInfo>> durable = ScanCheckpointDirectory(root_);
  ASSERT_TRUE(durable.ok() && durable->size() == 1 && (*durable)[0].complete);
  for (const std::string& key : Keys()) EXPECT_EQ(std::string::npos, key.find("slot")) << key;
  // A restarted process loads from memory.
  CheckpointerOptions o = Options(0, 1);
  o.memory_tier = true;
  o.memory_tier_directory = tier;
  o.run_id = "relaunch";
  Result<std::unique_ptr<Checkpointer>> c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<float> back(kRows * kCols);
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("w", DType::kF32, {kRows, kCols}, back.data()));
  Result<LoadResult> loaded = (*c)->Load(std::nullopt, load);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(loaded->from_memory_tier);
  EXPECT_TRUE(back == full);
  c->reset();
  std::filesystem::remove_all(tier);
}

TEST_F(CheckpointerS3Test, ALocalDiskDrainsIntoTheBucket) {
  char local[] = "/tmp/lifeline-s3-local-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(local));
  std::vector<float> full = Values(5);
  {
    CheckpointerOptions o = Options(0, 1);
    o.directory = local;
    o.drain_directory = root_;
    Result<std::unique_ptr<Checkpointer>> c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    SaveRequest r;
    r.tensors.push_back(TensorShard::Whole("w", DType::kF32, {kRows, kCols}, full.data()));
    ASSERT_TRUE((*c)->Save(5, r).WaitPersisted().ok());
    ASSERT_TRUE((*c)->Flush().ok());
  }
  Result<VerifyResult> verified = VerifyCheckpoint(root_, 5);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_TRUE(verified->status.ok()) << verified->status.ToString();
  CheckpointerOptions o = Options(0, 1);
  o.run_id = "reader";
  Result<std::unique_ptr<Checkpointer>> c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok());
  std::vector<float> back(kRows * kCols);
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("w", DType::kF32, {kRows, kCols}, back.data()));
  Result<LoadResult> loaded = (*c)->Load(std::nullopt, load);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(back == full);
  std::filesystem::remove_all(local);
}

TEST_F(CheckpointerS3Test, AFailedUploadIsNeverPublishedAndEarlierStepsAreUnharmed) {
  // The store is real; the failure is injected at the Env seam, half-way through rank 1's upload.
  S3EnvOptions eo;
  eo.root = root_;
  std::shared_ptr<S3Client> client = std::move(S3Client::Create(cluster_->Options())).value();
  Result<std::unique_ptr<S3Env>> s3 = S3Env::Open(client, eo);
  ASSERT_TRUE(s3.ok()) << s3.status().ToString();
  FaultInjectionEnv faulty(s3->get());
  std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks([&](CheckpointerOptions& o) { o.env = &faulty; });
  ASSERT_EQ(2u, ranks.size());
  SaveByTwoRanks(ranks, 1);

  faulty.RestrictToPathsContaining("r000001-of-000002.data");
  faulty.FailWritesAfterBytes(1 << 20);
  std::vector<float> full = Values(2);
  SaveTicket t0 = ranks[0]->Save(2, RankRequest(full, 0));
  SaveTicket t1 = ranks[1]->Save(2, RankRequest(full, 1));
  EXPECT_TRUE(t0.WaitPersisted().ok()) << t0.WaitPersisted().ToString();
  Status failed = t1.WaitPersisted();
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(std::string::npos, failed.ToString().find(root_ + "/step-00000000000000000002/")) << failed.ToString();
  EXPECT_EQ(std::string::npos, failed.ToString().find(cluster_->Get("AWS_SECRET_ACCESS_KEY"))) << failed.ToString();
  faulty.FailWritesAfterBytes(-1);

  // Step 2 is invisible: no rank 1 index, no data object of rank 1, no upload left behind.
  const std::string prefix = root_.substr(root_.find('/', 5) + 1);
  EXPECT_EQ(0u, UploadsUnder(prefix + "/"));
  for (const std::string& key : Keys(prefix + "/step-00000000000000000002/"))
    EXPECT_EQ(std::string::npos, key.find("r000001-of-000002")) << key;
  Result<std::vector<CheckpointInfo>> listed = ScanCheckpointDirectory(root_);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(2u, listed->size());
  EXPECT_EQ(2u, (*listed)[0].step);
  EXPECT_FALSE((*listed)[0].complete);
  Result<std::optional<uint64_t>> latest = ranks[0]->LatestStep();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(1u, **latest);
  // Step 1 loads, whole and verified.
  Result<VerifyResult> verified = VerifyCheckpoint(root_, 1);
  ASSERT_TRUE(verified.ok()) << verified.status().ToString();
  EXPECT_TRUE(verified->status.ok()) << verified->status.ToString();
}

TEST_F(CheckpointerS3Test, AVolumeServerKilledDuringASaveLosesNothing) {
  std::string why;
  std::unique_ptr<SeaweedCluster> own = SeaweedCluster::StartPrivateOrFail(&why);
  if (own == nullptr) GTEST_SKIP() << why;
  std::shared_ptr<S3Client> client = std::move(S3Client::Create(own->Options())).value();
  S3EnvOptions eo;
  eo.root = "s3://" + own->bucket() + "/volume-killed";
  std::unique_ptr<S3Env> env = std::move(S3Env::Open(client, eo)).value();
  root_ = eo.root;
  std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks([&](CheckpointerOptions& o) { o.env = env.get(); });
  ASSERT_EQ(2u, ranks.size());
  SaveByTwoRanks(ranks, 1);
  std::vector<float> full = Values(2);
  SaveTicket t0 = ranks[0]->Save(2, RankRequest(full, 0));
  SaveTicket t1 = ranks[1]->Save(2, RankRequest(full, 1));
  ASSERT_EQ(0, own->Tool("kill-volume", "1"));
  ASSERT_TRUE(t0.WaitCommitted(120).ok()) << t0.WaitCommitted(1).ToString();
  ASSERT_TRUE(t1.WaitCommitted(120).ok()) << t1.WaitCommitted(1).ToString();
  for (uint64_t step : {1, 2}) {
    Result<VerifyResult> verified = VerifyCheckpoint(root_, step, env.get());
    ASSERT_TRUE(verified.ok()) << verified.status().ToString();
    EXPECT_TRUE(verified->status.ok()) << verified->status.ToString();
  }
  ranks.clear();
}

// The faults of a store under load, met by Checkpointers end to end. Each test saves and loads
// through its own S3 client (reaching the gateway straight or through tools/s3-fault-proxy), with
// the quick retries of SeaweedCluster::Options, so that the client's retries can be counted.
class CheckpointerS3FaultTest : public CheckpointerS3Test {
 protected:
  struct Store {
    std::shared_ptr<S3Client> client;
    std::unique_ptr<S3Env> env;
  };

  // A client and an Env on root_ reaching `cluster` through a fault proxy with `plan` (and the
  // proxy's `args`), or straight when `plan` is empty. Stalls are abandoned after 2 s.
  Store Open(const SeaweedCluster& cluster, const std::string& plan, const std::string& args = "",
             int max_attempts = 100) {
    S3ClientOptions o = cluster.Options();
    o.low_speed_seconds = 2;
    o.max_attempts = max_attempts;
    if (!plan.empty()) {
      std::string why;
      proxies_.push_back(s3_test::FaultProxy::Start(cluster, plan, args, &why));
      EXPECT_NE(nullptr, proxies_.back()) << why;
      if (proxies_.back() == nullptr) return {};
      o.aws.endpoint = proxies_.back()->endpoint();
    }
    Store s;
    s.client = std::move(S3Client::Create(o)).value();
    S3EnvOptions eo;
    eo.root = root_;
    Result<std::unique_ptr<S3Env>> env = S3Env::Open(s.client, eo);
    EXPECT_TRUE(env.ok()) << env.status().ToString();
    if (env.ok()) s.env = std::move(*env);
    return s;
  }

  // Step `step` as one process loads it through `env`: the whole tensor, or the load's error.
  Result<std::vector<float>> LoadWhole(Env* env, uint64_t step) {
    CheckpointerOptions o = Options(0, 1);
    o.run_id = "reader";
    o.env = env;
    LL_ASSIGN_OR_RETURN(std::unique_ptr<Checkpointer> reader, Checkpointer::Open(o));
    std::vector<float> whole(kRows * kCols, -1.0f);
    LoadRequest load;
    load.tensors.push_back(TensorShard::Whole("w", DType::kF32, {kRows, kCols}, whole.data()));
    LL_ASSIGN_OR_RETURN(LoadResult loaded, reader->Load(step, load));
    if (loaded.step != step) return Status::Corruption("loaded step " + std::to_string(loaded.step));
    return whole;
  }

  // The steps of root_ that are complete, newest first, as the tools list them, and each of them
  // verified chunk by chunk.
  std::vector<uint64_t> CompleteAndVerifiedSteps(Env* env) {
    Result<CheckpointListing> listing = ListCheckpoints(root_, env);
    EXPECT_TRUE(listing.ok()) << listing.status().ToString();
    std::vector<uint64_t> steps;
    if (!listing.ok()) return steps;
    for (const ListedCheckpoint& c : listing->checkpoints) {
      if (CheckpointStateOf(c.info) != CheckpointState::kComplete) continue;
      steps.push_back(c.info.step);
      Result<VerifyResult> verified = VerifyCheckpoint(root_, c.info.step, env);
      EXPECT_TRUE(verified.ok() && verified->status.ok())
          << "step " << c.info.step << ": " << (verified.ok() ? verified->status : verified.status()).ToString();
    }
    return steps;
  }

  std::string Prefix() const { return root_.substr(root_.find('/', 5) + 1); }

  std::vector<std::unique_ptr<s3_test::FaultProxy>> proxies_;
};

TEST_F(CheckpointerS3FaultTest, ThrottlingAndAStalledAnswerDuringASaveAreRetried) {
  Store direct = Open(*cluster_, "");
  {
    std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks([&](CheckpointerOptions& o) { o.env = direct.env.get(); });
    ASSERT_EQ(2u, ranks.size());
    SaveByTwoRanks(ranks, 1);
  }
  // Step 2 through a proxy that answers the first connections with 503 SlowDown and stops the
  // answer on another one 20 bytes in (the request was carried out; its answer is lost).
  Store faulty = Open(*cluster_, "slowdown,slowdown,stall,slowdown,slowdown", "--stall-after 20 --stall-seconds 60");
  ASSERT_NE(nullptr, faulty.env);
  {
    std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks([&](CheckpointerOptions& o) { o.env = faulty.env.get(); });
    ASSERT_EQ(2u, ranks.size());
    SaveByTwoRanks(ranks, 2);
  }
  EXPECT_GE(faulty.client->stats().retries, 5u) << "the faults were not met: the test proves nothing";
  Result<std::vector<float>> two = LoadWhole(direct.env.get(), 2);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_TRUE(*two == Values(2));
  EXPECT_EQ((std::vector<uint64_t>{2, 1}), CompleteAndVerifiedSteps(direct.env.get()));
  EXPECT_EQ(0u, UploadsUnder(Prefix() + "/"));
}

// The store goes away between two saves (tools/s3-fault-proxy --down-file: open connections cut,
// new ones reset at once): the save of step 2 fails on both ranks after its bounded retries,
// naming the endpoint and the step's objects, and publishes nothing; step 1 is whole; once the
// store is back the same Checkpointers save step 3.
TEST_F(CheckpointerS3FaultTest, ASaveWhileTheStoreIsAwayFailsNamingItAndTheNextOneProceeds) {
  char scratch[] = "/tmp/lifeline-s3-down-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(scratch));
  const std::string down = std::string(scratch) + "/down";
  Store store = Open(*cluster_, "", "", /*max_attempts=*/2);  // for checks, straight
  Store away = Open(*cluster_, "ok*", "--down-file " + down, /*max_attempts=*/3);
  ASSERT_NE(nullptr, away.env);
  std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks([&](CheckpointerOptions& o) { o.env = away.env.get(); });
  ASSERT_EQ(2u, ranks.size());
  SaveByTwoRanks(ranks, 1);

  ASSERT_TRUE(std::ofstream(down).good());
  // Until the proxy has cut the connections it had, a request may still get through: wait for one
  // that does not.
  S3ClientOptions probe_options = cluster_->Options();
  probe_options.aws.endpoint = proxies_.back()->endpoint();
  probe_options.max_attempts = 1;
  probe_options.low_speed_seconds = 1;
  std::unique_ptr<S3Client> probe = std::move(S3Client::Create(probe_options)).value();
  bool through = true;
  for (int i = 0; i < 100 && through; ++i) through = probe->HeadObject(cluster_->bucket(), Prefix() + "/lifeline.lock").ok();
  ASSERT_FALSE(through) << "the store never went away";
  std::vector<float> full = Values(2);
  SaveTicket t0 = ranks[0]->Save(2, RankRequest(full, 0));
  SaveTicket t1 = ranks[1]->Save(2, RankRequest(full, 1));
  for (SaveTicket* t : {&t0, &t1}) {
    const Status failed = t->WaitPersisted();
    const std::string text = failed.ToString();
    EXPECT_EQ(StatusCode::kUnavailable, failed.code()) << text;
    EXPECT_NE(std::string::npos, text.find("s3://" + cluster_->bucket() + "/" + Prefix() + "/step-00000000000000000002/"))
        << text;
    EXPECT_NE(std::string::npos, text.find("at " + proxies_.back()->endpoint())) << text;
    EXPECT_NE(std::string::npos, text.find("gave up after 3 attempts")) << text;
    EXPECT_EQ(std::string::npos, text.find(cluster_->Get("AWS_SECRET_ACCESS_KEY"))) << text;
  }
  // Nothing of step 2 is visible; step 1 is whole.
  EXPECT_EQ((std::vector<uint64_t>{1}), CompleteAndVerifiedSteps(store.env.get()));
  for (const std::string& key : Keys(Prefix() + "/step-00000000000000000002/"))
    EXPECT_EQ(std::string::npos, key.find(".index")) << key << " published by a failed save";
  EXPECT_EQ(0u, UploadsUnder(Prefix() + "/"));

  std::filesystem::remove_all(scratch);  // the store is back
  SaveByTwoRanks(ranks, 3);
  ranks.clear();
  EXPECT_EQ((std::vector<uint64_t>{3, 1}), CompleteAndVerifiedSteps(store.env.get()));
  Result<std::vector<float>> three = LoadWhole(store.env.get(), 3);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_TRUE(*three == Values(3));
}

TEST_F(CheckpointerS3FaultTest, ThrottlingAStallAndResetsMidBodyDuringALoadAreRetriedAndTheBytesAreExact) {
  Store direct = Open(*cluster_, "");
  {
    std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks([&](CheckpointerOptions& o) { o.env = direct.env.get(); });
    ASSERT_EQ(2u, ranks.size());
    SaveByTwoRanks(ranks, 1);
  }
  // Connections cut (RST) or stalled once 100 kB of answers went through them: mid-body of the
  // ranged GETs of the data.
  Store faulty = Open(*cluster_, "slowdown,reset,stall,reset,slowdown,reset",
                      "--reset-after 100000 --stall-after 100000 --stall-seconds 60");
  ASSERT_NE(nullptr, faulty.env);
  Result<std::vector<float>> one = LoadWhole(faulty.env.get(), 1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_TRUE(*one == Values(1));
  EXPECT_GE(faulty.client->stats().retries, 4u) << "the faults were not met: the test proves nothing";
  EXPECT_EQ((std::vector<uint64_t>{1}), CompleteAndVerifiedSteps(direct.env.get()));
}

TEST_F(CheckpointerS3FaultTest, ALoadFromAStoreThatResetsEveryConnectionFailsNamingIt) {
  Store direct = Open(*cluster_, "");
  {
    std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks([&](CheckpointerOptions& o) { o.env = direct.env.get(); });
    ASSERT_EQ(2u, ranks.size());
    SaveByTwoRanks(ranks, 1);
  }
  Store faulty = Open(*cluster_, "reset*", "--reset-after 100000", /*max_attempts=*/3);
  ASSERT_NE(nullptr, faulty.env);
  Result<std::vector<float>> one = LoadWhole(faulty.env.get(), 1);
  ASSERT_FALSE(one.ok());
  const std::string text = one.status().ToString();
  EXPECT_NE(std::string::npos, text.find("at " + proxies_.back()->endpoint())) << text;
  EXPECT_NE(std::string::npos, text.find("s3://" + cluster_->bucket() + "/" + Prefix() + "/step-00000000000000000001/"))
      << text;
  EXPECT_NE(std::string::npos, text.find("gave up after 3 attempts")) << text;
  EXPECT_EQ(std::string::npos, text.find(cluster_->Get("AWS_SECRET_ACCESS_KEY"))) << text;
  EXPECT_EQ((std::vector<uint64_t>{1}), CompleteAndVerifiedSteps(direct.env.get()));
}

// The S3 gateway killed and started again while two ranks save step after step, then while a
// process loads: every save commits and every load gets the exact bytes, by retrying.
TEST_F(CheckpointerS3FaultTest, TheGatewayRestartedMidSaveAndMidLoadLosesNothing) {
  std::string why;
  std::unique_ptr<SeaweedCluster> own = SeaweedCluster::StartPrivateOrFail(&why);
  if (own == nullptr) GTEST_SKIP() << why;
  root_ = "s3://" + own->bucket() + "/gateway-restarted";
  Store store = Open(*own, "");
  ASSERT_NE(nullptr, store.env);
  std::vector<std::unique_ptr<Checkpointer>> ranks = OpenTwoRanks([&](CheckpointerOptions& o) { o.env = store.env.get(); });
  ASSERT_EQ(2u, ranks.size());
  SaveByTwoRanks(ranks, 1);

  std::atomic<bool> restarted{false};
  uint64_t saved = 1;
  std::thread saver([&] {
    // Two more saves after the restart, so that one certainly ran across it or after it.
    for (int after = 0; after < 2 && saved < 200; after += restarted.load() ? 1 : 0) {
      SaveByTwoRanks(ranks, ++saved);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
  const uint64_t retries_before = store.client->stats().retries;
  EXPECT_EQ(0, own->Tool("restart-s3", ">/dev/null"));
  restarted = true;
  saver.join();
  const uint64_t save_retries = store.client->stats().retries - retries_before;

  std::atomic<bool> loads_restarted{false};
  std::atomic<int> loads{0};
  std::thread loader([&] {
    for (int after = 0; after < 2 && loads.load() < 200; after += loads_restarted.load() ? 1 : 0) {
      Result<std::vector<float>> got = LoadWhole(store.env.get(), saved);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_TRUE(*got == Values(saved)) << "bytes differ";
      ++loads;
    }
  });
  const uint64_t load_retries_before = store.client->stats().retries;
  EXPECT_EQ(0, own->Tool("restart-s3", ">/dev/null"));
  loads_restarted = true;
  loader.join();
  ranks.clear();
  EXPECT_GT(save_retries, 0u) << "no save met the restart: the test proves nothing";
  EXPECT_GT(store.client->stats().retries - load_retries_before, 0u) << "no load met the restart";
  std::vector<uint64_t> expected;
  for (uint64_t step = saved; step >= 1; --step) expected.push_back(step);
  EXPECT_EQ(expected, CompleteAndVerifiedSteps(store.env.get()));
}

}  // namespace checkpointer_s3_test
}  // namespace lifeline
