// S3Env against a real SeaweedFS cluster: the Env contract as objects give it (formats/SPEC.md,
// "Object storage layout"), and nothing outside the root ever touched.
#include "lib/src/env/s3_env.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/env/s3_test_cluster.h"

namespace lifeline {
namespace s3_env_test {

using s3_test::SeaweedCluster;
using s3_test::UniquePrefix;

std::string Bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(gen());
  return s;
}

class S3EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    cluster_ = SeaweedCluster::Shared(&why);
    if (cluster_ == nullptr) GTEST_SKIP() << why;
    Result<std::unique_ptr<S3Client>> client = S3Client::Create(cluster_->Options());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
    root_ = "s3://" + cluster_->bucket() + "/" + UniquePrefix("env");
    S3EnvOptions o;
    o.root = root_;
    o.part_bytes = 5 << 20;
    Result<std::unique_ptr<S3Env>> env = S3Env::Open(client_, o);
    ASSERT_TRUE(env.ok()) << env.status().ToString();
    env_ = std::move(*env);
  }

  std::string Read(const std::string& path) {
    Result<std::string> r = ReadFileToString(env_.get(), path, 64 << 20);
    return r.ok() ? *r : "<" + r.status().ToString() + ">";
  }

  std::vector<std::string> Children(const std::string& dir) {
    Result<std::vector<std::string>> c = env_->GetChildren(dir);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    std::vector<std::string> v = c.ok() ? *c : std::vector<std::string>{};
    std::sort(v.begin(), v.end());
    return v;
  }

  SeaweedCluster* cluster_ = nullptr;
  std::shared_ptr<S3Client> client_;
  std::string root_;
  std::unique_ptr<S3Env> env_;
};

TEST_F(S3EnvTest, FilesAppearWholeAtCloseAndBehaveLikeAFileSystem) {
  const std::string dir = root_ + "/step-1", f = dir + "/data";
  ASSERT_TRUE(env_->CreateDir(dir).ok());
  ASSERT_TRUE(env_->SyncDir(root_).ok());
  EXPECT_TRUE(env_->IsDirectory(root_));
  EXPECT_TRUE(Children(root_).empty());
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(f, FileOptions{});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->WriteAt(5, "world", 5).ok());
  ASSERT_TRUE((*w)->WriteAt(0, "hello", 5).ok());
  ASSERT_TRUE((*w)->Sync().ok());
  EXPECT_FALSE(env_->FileExists(f)) << "visible before Close";
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ("helloworld", Read(f));
  EXPECT_EQ(10u, env_->GetFileSize(f).value_or(0));
  EXPECT_EQ(EntryType::kFile, env_->GetEntryType(f).value_or(EntryType::kOther));
  EXPECT_EQ(EntryType::kDirectory, env_->GetEntryType(dir).value_or(EntryType::kOther));
  EXPECT_TRUE(env_->GetEntryType(root_ + "/missing").status().IsNotFound());

  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(f, FileOptions{});
  ASSERT_TRUE(r.ok());
  char buf[8];
  Status s = (*r)->ReadAt(6, buf, 8);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find(f + " at offset 6")) << s.ToString();
  EXPECT_TRUE(env_->NewRandomAccessFile(root_ + "/missing", FileOptions{}).status().IsNotFound());

  ASSERT_TRUE(WriteFileAtomically(env_.get(), dir + "/index", "idx").ok());
  EXPECT_EQ("idx", Read(dir + "/index"));
  EXPECT_TRUE(WriteFileAtomically(env_.get(), dir + "/index", "other", /*replace=*/false).IsAlreadyExists());
  EXPECT_EQ("idx", Read(dir + "/index"));
  ASSERT_TRUE(WriteFileAtomically(env_.get(), root_ + "/step-2/sub/x", "x").ok());
  EXPECT_EQ((std::vector<std::string>{"data", "index"}), Children(dir));
  EXPECT_EQ((std::vector<std::string>{"step-1", "step-2"}), Children(root_));
  EXPECT_FALSE(env_->RemoveDir(dir).ok()) << "not empty";

  ASSERT_TRUE(env_->RenameFile(dir + "/index", dir + "/index2").ok());
  EXPECT_FALSE(env_->FileExists(dir + "/index"));
  EXPECT_EQ("idx", Read(dir + "/index2"));
  EXPECT_TRUE(env_->RemoveFile(dir + "/index").IsNotFound());
  ASSERT_TRUE(env_->RemoveFile(dir + "/index2").ok());
  ASSERT_TRUE(env_->RemoveTree(dir).ok());
  EXPECT_FALSE(env_->FileExists(f));
  EXPECT_EQ((std::vector<std::string>{"step-2"}), Children(root_));
}

TEST_F(S3EnvTest, NothingOutsideTheRootIsTouched) {
  const std::string sibling_key = root_.substr(5 + cluster_->bucket().size() + 1) + "-sibling/keep";
  ASSERT_TRUE(client_->PutObject(cluster_->bucket(), sibling_key, "keep").ok());
  ASSERT_TRUE(WriteFileAtomically(env_.get(), root_ + "/a", "a").ok());
  for (const std::string& outside : std::vector<std::string>{root_ + "-sibling/keep", "s3://other-bucket/x", "/tmp/x",
                                                             root_ + "/../x", root_ + "/a/../../x"}) {
    EXPECT_EQ(StatusCode::kInvalidArgument, env_->RemoveFile(outside).code()) << outside;
    EXPECT_EQ(StatusCode::kInvalidArgument, env_->NewWritableFile(outside, FileOptions{}).status().code()) << outside;
    EXPECT_EQ(StatusCode::kInvalidArgument, env_->RemoveTree(outside).code()) << outside;
    EXPECT_FALSE(env_->GetChildren(outside).ok()) << outside;
  }
  EXPECT_FALSE(env_->RemoveTree("s3://" + cluster_->bucket()).ok()) << "the bucket is above the root";
  ASSERT_TRUE(env_->RemoveTree(root_).ok());
  EXPECT_EQ("keep", client_->GetObject(cluster_->bucket(), sibling_key, 10).value_or("<gone>"));
  EXPECT_FALSE(env_->FileExists(root_ + "/a"));
}

// The persist pipeline's way of writing: blocks of the part size submitted to the Env's IoQueue
// (so uploaded in parallel, each straight from its buffer), direct-I/O padding at the end, the
// size fixed by Truncate. Read back through the queue with ranged GETs.
TEST_F(S3EnvTest, ParallelPartUploadsThroughTheIoQueueReadBackExactly) {
  const std::string f = root_ + "/step-3/rank0.data";
  const size_t block = 5 << 20, size = 3 * block + 12345;
  const size_t padded = (size + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
  std::string data = Bytes(padded, 7);
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(f, FileOptions{});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Allocate(padded).ok());
  IoQueueOptions qo;
  qo.depth = 8;
  Result<std::unique_ptr<IoQueue>> q = env_->NewIoQueue(qo);
  ASSERT_TRUE(q.ok());
  for (size_t off = 0; off < padded; off += block) {
    IoRequest req;
    req.kind = IoRequest::Kind::kWrite;
    req.writer = w->get();
    req.offset = off;
    req.buffer = data.data() + off;
    req.length = std::min(block, padded - off);
    req.tag = off;
    ASSERT_TRUE((*q)->Submit(req).ok());
  }
  std::vector<IoCompletion> done;
  while ((*q)->in_flight() > 0) ASSERT_TRUE((*q)->Reap(1, &done).ok());
  for (const IoCompletion& c : done) EXPECT_TRUE(c.status.ok()) << c.status.ToString();
  ASSERT_TRUE((*w)->Truncate(size).ok());
  ASSERT_TRUE((*w)->Close().ok());
  data.resize(size);
  EXPECT_EQ(size, env_->GetFileSize(f).value_or(0));
  Result<S3ObjectInfo> head = client_->HeadObject(cluster_->bucket(), f.substr(5 + cluster_->bucket().size() + 1));
  ASSERT_TRUE(head.ok());
  EXPECT_NE(std::string::npos, head->etag.find('-')) << "not a multipart object: " << head->etag;

  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(f, FileOptions{});
  ASSERT_TRUE(r.ok());
  std::string back(size, '\0');
  const size_t piece = 1 << 20;
  for (size_t off = 0; off < size; off += piece) {
    IoRequest req;
    req.kind = IoRequest::Kind::kRead;
    req.reader = r->get();
    req.offset = off;
    req.buffer = back.data() + off;
    req.length = std::min(piece, size - off);
    while ((*q)->in_flight() >= (*q)->depth()) ASSERT_TRUE((*q)->Reap(1, &done).ok());
    ASSERT_TRUE((*q)->Submit(req).ok());
  }
  done.clear();
  while ((*q)->in_flight() > 0) ASSERT_TRUE((*q)->Reap(1, &done).ok());
  for (const IoCompletion& c : done) EXPECT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_TRUE(back == data) << "bytes read back differ";
}

TEST_F(S3EnvTest, AnUnclosedOrFailedFileIsNeverPublishedAndLeavesNoUpload) {
  const std::string f = root_ + "/step-4/rank0.data";
  const std::string part = Bytes(5 << 20, 8);
  {
    Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(f, FileOptions{});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->WriteAt(0, part.data(), part.size()).ok());  // uploaded as part 1 at once
    Result<std::vector<S3MultipartUpload>> open = client_->ListMultipartUploads(cluster_->bucket(), "");
    ASSERT_TRUE(open.ok());
    EXPECT_TRUE(std::any_of(open->begin(), open->end(), [&](const S3MultipartUpload& u) {
      return "s3://" + cluster_->bucket() + "/" + u.key == f;
    })) << "the write did not start a multipart upload";
    // destroyed without Close: a crashed save
  }
  EXPECT_FALSE(env_->FileExists(f));
  EXPECT_EQ(0u, env_->AbortIncompleteUploads(root_).value_or(99)) << "the upload was left behind";

  // Uploads a dead process left are found and aborted by key, under the root only.
  const std::string key = f.substr(5 + cluster_->bucket().size() + 1);
  Result<std::string> id = client_->CreateMultipartUpload(cluster_->bucket(), key);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(1u, env_->AbortIncompleteUploads(root_ + "/step-4").value_or(0));
  EXPECT_EQ(0u, env_->AbortIncompleteUploads(root_).value_or(99));
}

TEST_F(S3EnvTest, LockObjectRefusesASecondHolderUntilReleased) {
  const std::string path = root_ + "/lifeline.lock";
  Result<std::unique_ptr<FileLock>> first = env_->LockFile(path);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE((*first)->SetHolder("pid 1 on host a").ok());
  Result<std::unique_ptr<FileLock>> second = env_->LockFile(path);
  EXPECT_TRUE(second.status().IsUnavailable()) << second.status().ToString();
  EXPECT_NE(std::string::npos, second.status().message().find("pid 1 on host a")) << second.status().ToString();
  EXPECT_EQ("pid 1 on host a", env_->LockHolder(path).value_or(std::nullopt).value_or(""));
  first->reset();
  EXPECT_FALSE(env_->LockHolder(path).value_or(std::string("?")).has_value());
  EXPECT_TRUE(env_->LockFile(path).ok());
}

// A conditional create whose answer is lost (the store carried it out, the answer stalls, the retry
// finds the key taken) counts as done when the object holds its own bytes; a lock claimed so is
// ours. A key taken with other bytes still refuses.
TEST_F(S3EnvTest, AConditionalCreateWhoseAnswerWasLostIsKnownAsItsOwn) {
  // Each Env's first connection stops its answer 20 bytes in; the attempt is abandoned after 2 s
  // and retried on a new connection, which the proxy forwards untouched.
  struct Lossy {
    std::unique_ptr<s3_test::FaultProxy> proxy;
    std::shared_ptr<S3Client> client;
    std::unique_ptr<S3Env> env;
  };
  auto lossy = [&]() {
    Lossy l;
    std::string why;
    l.proxy = s3_test::FaultProxy::Start(*cluster_, "stall", "--stall-after 20 --stall-seconds 60", &why);
    EXPECT_NE(nullptr, l.proxy) << why;
    S3ClientOptions o = cluster_->Options();
    o.aws.endpoint = l.proxy->endpoint();
    o.low_speed_seconds = 2;
    l.client = std::move(S3Client::Create(o)).value();
    S3EnvOptions eo;
    eo.root = root_;
    l.env = std::move(S3Env::Open(l.client, eo)).value();
    return l;
  };
  Lossy id = lossy();
  ASSERT_NE(nullptr, id.proxy);
  Status put = id.env->PutFile(root_ + "/lifeline.id", "first writer\n", /*replace=*/false);
  ASSERT_TRUE(put.ok()) << put.ToString();
  EXPECT_EQ(1u, id.client->stats().retries) << "the answer was not lost: the test proves nothing";
  EXPECT_EQ("first writer\n", Read(root_ + "/lifeline.id"));
  Status again = env_->PutFile(root_ + "/lifeline.id", "second writer\n", /*replace=*/false);
  EXPECT_TRUE(again.IsAlreadyExists()) << again.ToString();

  Lossy lock = lossy();
  ASSERT_NE(nullptr, lock.proxy);
  Result<std::unique_ptr<FileLock>> held = lock.env->LockFile(root_ + "/lifeline.lock");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(1u, lock.client->stats().retries) << "the answer was not lost: the test proves nothing";
  EXPECT_TRUE(env_->LockFile(root_ + "/lifeline.lock").status().IsUnavailable());
}

}  // namespace s3_env_test
}  // namespace lifeline
