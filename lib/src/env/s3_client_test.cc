// S3Client against a real SeaweedFS cluster (tools/seaweedfs): the calls a checkpoint needs, the
// refusals a user meets, and the store's faults survived.
#include "lib/src/env/s3_client.h"

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/env/s3_test_cluster.h"

namespace lifeline {
namespace s3_client_test {

using s3_test::SeaweedCluster;
using s3_test::UniquePrefix;

std::unique_ptr<S3Client> NewClient(const S3ClientOptions& o) {
  Result<std::unique_ptr<S3Client>> c = S3Client::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

TEST(S3ClientTest, PutGetRangeHeadDelete) {
  LL_S3_CLUSTER_OR_SKIP(cluster);
  auto client = NewClient(cluster->Options());
  const std::string b = cluster->bucket(), key = UniquePrefix("roundtrip") + "/obj";
  const std::string data = RandomBytes(100000, 1);
  ASSERT_TRUE(client->PutObject(b, key, data).ok());
  Result<std::string> got = client->GetObject(b, key, 1 << 20);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(data, *got);
  std::string part(1000, '\0');
  ASSERT_TRUE(client->GetObjectRange(b, key, 4321, part.data(), part.size()).ok());
  EXPECT_EQ(data.substr(4321, 1000), part);
  Result<S3ObjectInfo> head = client->HeadObject(b, key);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(data.size(), head->size);
  EXPECT_FALSE(head->etag.empty());
  // Past the end: a short read, not bytes made up.
  Status past = client->GetObjectRange(b, key, data.size() - 10, part.data(), 100);
  EXPECT_TRUE(past.IsCorruption()) << past.ToString();
  EXPECT_TRUE(client->GetObject(b, key, 10).status().code() == StatusCode::kResourceExhausted);
  ASSERT_TRUE(client->DeleteObject(b, key).ok());
  Status gone = client->HeadObject(b, key).status();
  EXPECT_TRUE(gone.IsNotFound()) << gone.ToString();
  EXPECT_TRUE(client->GetObject(b, key, 1 << 20).status().IsNotFound());
  EXPECT_TRUE(client->DeleteObject(b, key).ok());  // absent: S3 does not tell
}

TEST(S3ClientTest, KeysWithAwkwardCharactersRoundTrip) {
  LL_S3_CLUSTER_OR_SKIP(cluster);
  auto client = NewClient(cluster->Options());
  const std::string b = cluster->bucket(), dir = UniquePrefix("awkward");
  for (const std::string name : {"a b+c=d&e", "sp%20ace", "ünï~cødé", "x;y,z(1)[2]"}) {
    const std::string key = dir + "/" + name;
    ASSERT_TRUE(client->PutObject(b, key, name).ok()) << key;
    EXPECT_EQ(name, client->GetObject(b, key, 100).value_or("<missing>")) << key;
  }
  Result<S3Listing> listing = client->ListObjects(b, dir + "/", "/");
  ASSERT_TRUE(listing.ok()) << listing.status().ToString();
  EXPECT_EQ(4u, listing->objects.size());
}

TEST(S3ClientTest, ListsByPrefixDelimiterAndContinuation) {
  LL_S3_CLUSTER_OR_SKIP(cluster);
  auto client = NewClient(cluster->Options());
  const std::string b = cluster->bucket(), dir = UniquePrefix("list");
  for (const std::string name : {"a", "b", "c", "d/1", "d/2", "e/1", "f"})
    ASSERT_TRUE(client->PutObject(b, dir + "/" + name, name).ok());
  ASSERT_TRUE(client->PutObject(b, dir + "-sibling/x", "x").ok());

  Result<S3Listing> top = client->ListObjects(b, dir + "/", "/");
  ASSERT_TRUE(top.ok()) << top.status().ToString();
  std::vector<std::string> keys, prefixes = top->common_prefixes;
  for (const S3ObjectInfo& o : top->objects) keys.push_back(o.key.substr(dir.size() + 1));
  EXPECT_EQ((std::vector<std::string>{"a", "b", "c", "f"}), keys);
  EXPECT_EQ((std::vector<std::string>{dir + "/d/", dir + "/e/"}), prefixes);

  // Pages of two, followed by their continuation tokens, give every key once.
  std::vector<std::string> paged;
  std::string token;
  int pages = 0;
  do {
    Result<S3Listing> page = client->ListObjectsPage(b, dir + "/", "", token, 2);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    EXPECT_LE(page->objects.size(), 2u);
    for (const S3ObjectInfo& o : page->objects) paged.push_back(o.key.substr(dir.size() + 1));
    token = page->truncated ? page->next_continuation_token : "";
    ASSERT_LT(++pages, 10);
  } while (!token.empty());
  EXPECT_EQ((std::vector<std::string>{"a", "b", "c", "d/1", "d/2", "e/1", "f"}), paged);
  EXPECT_GE(pages, 4);
}

TEST(S3ClientTest, MultipartUploadCompletesAbortsAndIsListedMeanwhile) {
  LL_S3_CLUSTER_OR_SKIP(cluster);
  auto client = NewClient(cluster->Options());
  const std::string b = cluster->bucket(), dir = UniquePrefix("multipart"), key = dir + "/big";
  const std::string p1 = RandomBytes(5 << 20, 2), p2 = RandomBytes(1 << 20, 3);
  Result<std::string> id = client->CreateMultipartUpload(b, key);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  // Uploaded out of order, as parallel uploads finish.
  Result<std::string> e2 = client->UploadPart(b, key, *id, 2, p2.data(), p2.size());
  Result<std::string> e1 = client->UploadPart(b, key, *id, 1, p1.data(), p1.size());
  ASSERT_TRUE(e1.ok() && e2.ok()) << e1.status().ToString() << e2.status().ToString();
  EXPECT_TRUE(client->HeadObject(b, key).status().IsNotFound()) << "visible before completion";
  Result<std::vector<S3MultipartUpload>> open = client->ListMultipartUploads(b, dir + "/");
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  ASSERT_EQ(1u, open->size());
  EXPECT_EQ(key, (*open)[0].key);
  EXPECT_EQ(*id, (*open)[0].upload_id);
  ASSERT_TRUE(client->CompleteMultipartUpload(b, key, *id, {{1, *e1}, {2, *e2}}).ok());
  Result<std::string> got = client->GetObject(b, key, 8 << 20);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == p1 + p2);
  std::string across(100, '\0');
  ASSERT_TRUE(client->GetObjectRange(b, key, (5 << 20) - 50, across.data(), across.size()).ok());
  EXPECT_EQ((p1 + p2).substr((5 << 20) - 50, 100), across);
  EXPECT_TRUE(client->ListMultipartUploads(b, dir + "/").value_or({{}}).empty());

  // An aborted upload leaves no object and no upload behind.
  Result<std::string> id2 = client->CreateMultipartUpload(b, dir + "/abandoned");
  ASSERT_TRUE(id2.ok());
  ASSERT_TRUE(client->UploadPart(b, dir + "/abandoned", *id2, 1, p2.data(), p2.size()).ok());
  ASSERT_TRUE(client->AbortMultipartUpload(b, dir + "/abandoned", *id2).ok());
  EXPECT_TRUE(client->HeadObject(b, dir + "/abandoned").status().IsNotFound());
  EXPECT_TRUE(client->ListMultipartUploads(b, dir + "/").value_or({{}}).empty());
}

// SeaweedFS honours If-None-Match: * on PUT (412 PreconditionFailed when the key exists): the
// commit rule of formats/SPEC.md ("Object storage layout") relies on it where the store has it.
TEST(S3ClientTest, ConditionalCreateIsRefusedWhenTheKeyExists) {
  LL_S3_CLUSTER_OR_SKIP(cluster);
  auto client = NewClient(cluster->Options());
  const std::string b = cluster->bucket(), key = UniquePrefix("conditional") + "/manifest";
  ASSERT_TRUE(client->PutObject(b, key, "first", /*if_none_match=*/true).ok());
  Status again = client->PutObject(b, key, "second", /*if_none_match=*/true);
  EXPECT_TRUE(again.IsAlreadyExists()) << again.ToString();
  EXPECT_NE(std::string::npos, again.message().find(key)) << again.ToString();
  EXPECT_EQ("first", client->GetObject(b, key, 100).value_or(""));
  ASSERT_TRUE(client->PutObject(b, key, "third").ok());  // unconditional: replaces
  EXPECT_EQ("third", client->GetObject(b, key, 100).value_or(""));

  // Completing a multipart upload is conditional the same way.
  Result<std::string> id = client->CreateMultipartUpload(b, key);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  Result<std::string> etag = client->UploadPart(b, key, *id, 1, "fourth", 6);
  ASSERT_TRUE(etag.ok()) << etag.status().ToString();
  Status complete = client->CompleteMultipartUpload(b, key, *id, {{1, *etag}}, /*if_none_match=*/true);
  EXPECT_TRUE(complete.IsAlreadyExists()) << complete.ToString();
  EXPECT_EQ("third", client->GetObject(b, key, 100).value_or(""));
  EXPECT_TRUE(client->AbortMultipartUpload(b, key, *id).ok());
}

TEST(S3ClientTest, WrongCredentialsAreRefusedNamingEndpointBucketAndKeyButNoSecret) {
  LL_S3_CLUSTER_OR_SKIP(cluster);
  const std::string b = cluster->bucket(), key = UniquePrefix("auth") + "/obj";
  S3ClientOptions wrong_secret = cluster->Options();
  wrong_secret.aws.credentials.secret_access_key = "not-the-secret-0123456789";
  S3ClientOptions unknown_key = cluster->Options();
  unknown_key.aws.credentials.access_key_id = "LLNOSUCHKEY000000000";
  for (const S3ClientOptions& o : {wrong_secret, unknown_key}) {
    const bool secret_wrong = o.aws.credentials.access_key_id == cluster->Get("AWS_ACCESS_KEY_ID");
    auto client = NewClient(o);
    const auto started = client->stats();
    Status s = client->PutObject(b, key, "x");
    EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
    const std::string text = s.ToString();
    EXPECT_NE(std::string::npos, text.find(cluster->endpoint())) << text;
    EXPECT_NE(std::string::npos, text.find("s3://" + b + "/" + key)) << text;
    EXPECT_EQ(std::string::npos, text.find(o.aws.credentials.secret_access_key)) << text;
    EXPECT_EQ(std::string::npos, text.find(cluster->Get("AWS_SECRET_ACCESS_KEY"))) << text;
    EXPECT_EQ(std::string::npos, text.find(o.aws.credentials.access_key_id)) << "the key id is shown masked: " << text;
    EXPECT_EQ(started.requests + 1, client->stats().requests) << "a refusal is not retried";
    // Saying which of the two is wrong, and where it came from.
    if (secret_wrong) {
      EXPECT_NE(std::string::npos, text.find("the secret access key does not match access key ****")) << text;
    } else {
      EXPECT_NE(std::string::npos, text.find("the store knows no access key ****")) << text;
    }
    EXPECT_NE(std::string::npos, text.find("(from test)")) << text;
  }
}

TEST(S3ClientTest, MissingBucketIsNotFoundNamingTheBucket) {
  LL_S3_CLUSTER_OR_SKIP(cluster);
  auto client = NewClient(cluster->Options());
  Status s = client->PutObject("lifeline-no-such-bucket", "k", "x");
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("bucket 'lifeline-no-such-bucket' does not exist")) << s.ToString();
  EXPECT_TRUE(client->ListObjects("lifeline-no-such-bucket", "", "/").status().IsNotFound());
  // A bucket made through the API is usable at once.
  const std::string fresh = "lifeline-made-" + std::to_string(getpid());
  ASSERT_TRUE(client->CreateBucket(fresh).ok());
  ASSERT_TRUE(client->CreateBucket(fresh).ok()) << "an existing bucket of ours is fine";
  ASSERT_TRUE(client->PutObject(fresh, "k", "x").ok());
  EXPECT_EQ("x", client->GetObject(fresh, "k", 10).value_or(""));
}

TEST(S3ClientTest, PrefixWithoutPermissionIsRefused) {
  LL_S3_CLUSTER_OR_SKIP(cluster);
  auto limited = NewClient(cluster->Options(/*limited=*/true));
  const std::string b = cluster->bucket(), mine = "limited/" + UniquePrefix("perm") + "/obj";
  ASSERT_TRUE(limited->PutObject(b, mine, "ok").ok());
  EXPECT_EQ("ok", limited->GetObject(b, mine, 10).value_or(""));
  Status refused = limited->PutObject(b, UniquePrefix("perm") + "/obj", "no");
  EXPECT_EQ(StatusCode::kFailedPrecondition, refused.code()) << refused.ToString();
  EXPECT_NE(std::string::npos, refused.message().find("AccessDenied")) << refused.ToString();
  Status list = limited->ListObjects(b, "t/", "/").status();
  EXPECT_EQ(StatusCode::kFailedPrecondition, list.code()) << list.ToString();
}

TEST(S3ClientTest, UnreachableEndpointIsUnavailableAfterBoundedRetries) {
  S3ClientOptions o;
  o.aws.endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  o.aws.credentials.access_key_id = "AKIDEXAMPLE";
  o.aws.credentials.secret_access_key = "secret-never-shown";
  o.max_attempts = 3;
  o.initial_backoff_ms = 1;
  o.max_backoff_ms = 5;
  auto client = NewClient(o);
  Status s = client->PutObject("bucket", "key", "x");
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(std::string::npos, s.ToString().find("s3://bucket/key at http://127.0.0.1:1")) << s.ToString();
  EXPECT_NE(std::string::npos, s.ToString().find("after 3 attempts")) << s.ToString();
  EXPECT_EQ(std::string::npos, s.ToString().find("secret-never-shown"));
  EXPECT_EQ(3u, client->stats().requests);
}

// HTTPS with a self-signed certificate: trusted through the CA bundle (AWS_CA_BUNDLE), refused
// without it, at once and saying why.
TEST(S3ClientTlsTest, SelfSignedCertificateIsTrustedOnlyThroughTheCaBundle) {
  std::string why;
  std::unique_ptr<SeaweedCluster> cluster = SeaweedCluster::StartPrivateOrFail(&why, "--https");
  if (cluster == nullptr) GTEST_SKIP() << why;
  S3ClientOptions o = cluster->Options();
  ASSERT_EQ(0u, o.aws.endpoint.rfind("https://", 0)) << o.aws.endpoint;
  ASSERT_FALSE(o.aws.ca_bundle.empty());
  auto client = NewClient(o);
  const std::string b = cluster->bucket(), key = UniquePrefix("tls") + "/obj";
  ASSERT_TRUE(client->PutObject(b, key, "over tls").ok());
  EXPECT_EQ("over tls", client->GetObject(b, key, 100).value_or(""));
  o.aws.ca_bundle.clear();
  auto untrusting = NewClient(o);
  Status s = untrusting->GetObject(b, key, 100).status();
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("AWS_CA_BUNDLE")) << s.ToString();
  EXPECT_EQ(1u, untrusting->stats().requests) << "an untrusted certificate is not retried";
}

// Throttling, a connection reset mid-body and a stalled answer, injected by tools/s3-fault-proxy in
// front of the real gateway: each is retried and the call succeeds with the right bytes.
class S3ProxyFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    cluster_ = SeaweedCluster::Shared(&why);
    if (cluster_ == nullptr) GTEST_SKIP() << why;
    direct_ = NewClient(cluster_->Options());
    key_ = UniquePrefix("proxy") + "/obj";
    data_ = RandomBytes(1 << 20, 6);
    ASSERT_TRUE(direct_->PutObject(cluster_->bucket(), key_, data_).ok());
  }

  // A client that reaches the gateway through a proxy with `plan`.
  std::unique_ptr<S3Client> ThroughProxy(const std::string& plan, S3ClientOptions o, const std::string& args = "") {
    std::string why;
    proxy_ = s3_test::FaultProxy::Start(*cluster_, plan, args, &why);
    EXPECT_NE(nullptr, proxy_) << why;
    if (proxy_ == nullptr) return nullptr;
    o.aws.endpoint = proxy_->endpoint();
    return NewClient(o);
  }

  SeaweedCluster* cluster_ = nullptr;
  std::unique_ptr<S3Client> direct_;
  std::unique_ptr<s3_test::FaultProxy> proxy_;
  std::string key_, data_;
};

TEST_F(S3ProxyFaultTest, SlowDownIsRetriedWithBackOff) {
  auto client = ThroughProxy("slowdown,slowdown,slowdown", cluster_->Options());
  ASSERT_NE(nullptr, client);
  ASSERT_TRUE(client->PutObject(cluster_->bucket(), key_ + "-2", "throttled").ok());
  EXPECT_EQ(3u, client->stats().retries);
  EXPECT_EQ("throttled", direct_->GetObject(cluster_->bucket(), key_ + "-2", 100).value_or(""));
}

TEST_F(S3ProxyFaultTest, EndlessSlowDownGivesUpNamingTheStoreAndTheKey) {
  S3ClientOptions o = cluster_->Options();
  o.max_attempts = 4;
  auto client = ThroughProxy("slowdown*", o);
  ASSERT_NE(nullptr, client);
  Status s = client->PutObject(cluster_->bucket(), key_ + "-3", "never");
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("SlowDown")) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("after 4 attempts")) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("s3://" + cluster_->bucket() + "/" + key_ + "-3 at " +
                                                proxy_->endpoint())) << s.ToString();
  EXPECT_TRUE(direct_->HeadObject(cluster_->bucket(), key_ + "-3").status().IsNotFound());
}

TEST_F(S3ProxyFaultTest, ConnectionResetMidBodyIsRetried) {
  auto client = ThroughProxy("reset,reset", cluster_->Options(), "--reset-after 100000");
  ASSERT_NE(nullptr, client);
  std::string back(data_.size(), '\0');
  Status s = client->GetObjectRange(cluster_->bucket(), key_, 0, back.data(), back.size());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(back == data_);
  EXPECT_EQ(2u, client->stats().retries);
}

TEST_F(S3ProxyFaultTest, StalledAnswerIsAbandonedAndRetried) {
  S3ClientOptions o = cluster_->Options();
  o.low_speed_seconds = 2;  // a stall of 2 s below 1 KiB/s abandons the transfer
  auto client = ThroughProxy("stall", o, "--stall-after 100000 --stall-seconds 60");
  ASSERT_NE(nullptr, client);
  const auto start = std::chrono::steady_clock::now();
  Result<std::string> got = client->GetObject(cluster_->bucket(), key_, 2 << 20);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(*got == data_);
  EXPECT_EQ(1u, client->stats().retries);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << "waited out the stall";
}

// The gateway killed and restarted while transfers run: every call still succeeds, by retrying.
TEST(S3ClientFaultTest, GatewayRestartedMidTransferIsRetried) {
  std::string why;
  std::unique_ptr<SeaweedCluster> cluster = SeaweedCluster::StartPrivateOrFail(&why);
  if (cluster == nullptr) GTEST_SKIP() << why;
  auto client = NewClient(cluster->Options());
  const std::string b = cluster->bucket(), dir = UniquePrefix("restart");
  const std::string data = RandomBytes(2 << 20, 4);
  std::atomic<bool> done{false};
  std::atomic<int> failures{0}, transfers{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&, w] {
      for (int i = 0; !done.load() || i < 3; ++i) {
        const std::string key = dir + "/w" + std::to_string(w) + "-" + std::to_string(i);
        Status put = client->PutObject(b, key, data);
        Result<std::string> got = put.ok() ? client->GetObject(b, key, 4 << 20) : Result<std::string>(put);
        if (!got.ok() || *got != data) {
          ++failures;
          ADD_FAILURE() << key << ": " << (got.ok() ? std::string("bytes differ") : got.status().ToString());
        }
        ++transfers;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(0, cluster->Tool("restart-s3", ">/dev/null"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  done = true;
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(0, failures.load());
  EXPECT_GE(transfers.load(), 9);
  EXPECT_GT(client->stats().retries, 0u) << "the restart was not noticed: the test proves nothing";
}

// A volume server killed while a multipart upload is under way: the upload completes (the other
// replica and the remaining servers take the writes, retried where one failed) and reads back
// whole, or fails with an error and publishes nothing.
TEST(S3ClientFaultTest, VolumeServerKilledMidUploadSucceedsOrFailsCleanly) {
  std::string why;
  std::unique_ptr<SeaweedCluster> cluster = SeaweedCluster::StartPrivateOrFail(&why);
  if (cluster == nullptr) GTEST_SKIP() << why;
  auto client = NewClient(cluster->Options());
  const std::string b = cluster->bucket(), key = UniquePrefix("volume") + "/data";
  const size_t part = 5 << 20;
  const std::string data = RandomBytes(4 * part, 5);
  Result<std::string> id = client->CreateMultipartUpload(b, key);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  std::vector<S3CompletedPart> parts;
  Status s;
  for (int i = 0; i < 4 && s.ok(); ++i) {
    if (i == 2) {
      ASSERT_EQ(0, cluster->Tool("kill-volume", "2"));
    }
    Result<std::string> etag = client->UploadPart(b, key, *id, i + 1, data.data() + i * part, part);
    s = etag.status();
    if (s.ok()) parts.push_back({i + 1, *etag});
  }
  if (s.ok()) s = client->CompleteMultipartUpload(b, key, *id, parts);
  if (s.ok()) {
    Result<std::string> got = client->GetObject(b, key, data.size() + 1);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(*got == data) << "the object read back differs";
  } else {
    EXPECT_NE(std::string::npos, s.ToString().find(key)) << s.ToString();
    ASSERT_TRUE(client->AbortMultipartUpload(b, key, *id).ok());
    EXPECT_TRUE(client->HeadObject(b, key).status().IsNotFound()) << "a failed upload was published";
  }
  // Whatever happened, the cluster still takes new objects.
  EXPECT_TRUE(client->PutObject(b, key + "-after", data.substr(0, part)).ok());
}

}  // namespace s3_client_test
}  // namespace lifeline
