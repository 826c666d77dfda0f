// NewMemEnv(): the Env contract in memory, and what survives SimulateCrash().
#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lifeline/env.h"

namespace lifeline {
namespace mem_env_test {

std::string Read(Env* env, const std::string& path) {
  Result<std::string> r = ReadFileToString(env, path, 1 << 20);
  return r.ok() ? *r : "<" + r.status().ToString() + ">";
}

// Writes a file and syncs its content (not its directory entry).
void WriteSynced(Env* env, const std::string& path, const std::string& data) {
  Result<std::unique_ptr<WritableFile>> w = env->NewWritableFile(path, FileOptions{});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->WriteAt(0, data.data(), data.size()).ok());
  ASSERT_TRUE((*w)->Sync().ok());
  ASSERT_TRUE((*w)->Close().ok());
}

class MemEnvTest : public ::testing::Test {
 protected:
  // A durable directory /d, as a freshly mounted file system would have it.
  void SetUp() override {
    ASSERT_TRUE(env_->CreateDir("/d").ok());
    ASSERT_TRUE(env_->SyncDir("/").ok());
  }
  std::unique_ptr<MemEnv> env_ = NewMemEnv();
};

TEST_F(MemEnvTest, BehavesLikeAFileSystem) {
  ASSERT_TRUE(env_->CreateDir("/d/a/b").ok());
  ASSERT_TRUE(env_->CreateDir("/d/a/b").ok());
  EXPECT_TRUE(env_->IsDirectory("/d/a"));
  EXPECT_TRUE(env_->IsDirectory("/"));
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile("/d/a/b/f", FileOptions{});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ("/d/a/b/f", (*w)->path());
  EXPECT_LT((*w)->fd(), 0);
  ASSERT_TRUE((*w)->WriteAt(3, "xyz", 3).ok());
  EXPECT_EQ(std::string("\0\0\0xyz", 6), Read(env_.get(), "/d/a/b/f"));
  ASSERT_TRUE((*w)->Truncate(4).ok());
  EXPECT_EQ(4u, env_->GetFileSize("/d/a/b/f").value_or(0));
  EXPECT_TRUE(env_->FileExists("/d/a/b/f"));
  EXPECT_FALSE(env_->IsDirectory("/d/a/b/f"));

  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile("/d/a/b/f", FileOptions{});
  ASSERT_TRUE(r.ok());
  char buf[8];
  Status s = (*r)->ReadAt(2, buf, 8);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_NE(std::string::npos, s.message().find("/d/a/b/f at offset 2")) << s.ToString();
  EXPECT_NE(std::string::npos, s.message().find("short read")) << s.ToString();

  EXPECT_TRUE(env_->NewRandomAccessFile("/d/missing", FileOptions{}).status().IsNotFound());
  EXPECT_TRUE(env_->NewWritableFile("/d/nodir/f", FileOptions{}).status().IsNotFound());
  EXPECT_FALSE(env_->NewWritableFile("/d/a", FileOptions{}).ok());
  EXPECT_FALSE(env_->CreateDir("/d/a/b/f/g").ok());
  EXPECT_TRUE(env_->RemoveFile("/d/missing").IsNotFound());
  EXPECT_FALSE(env_->RemoveDir("/d/a").ok());  // not empty

  ASSERT_TRUE(env_->RenameFile("/d/a/b/f", "/d/g").ok());
  EXPECT_FALSE(env_->FileExists("/d/a/b/f"));
  EXPECT_EQ(std::string("\0\0\0x", 4), Read(env_.get(), "/d/g"));
  Result<std::vector<std::string>> children = env_->GetChildren("/d");
  ASSERT_TRUE(children.ok());
  std::sort(children->begin(), children->end());
  EXPECT_EQ((std::vector<std::string>{"a", "g"}), *children);

  EXPECT_EQ(EntryType::kDirectory, env_->GetEntryType("/d/a").value_or(EntryType::kOther));
  EXPECT_EQ(EntryType::kFile, env_->GetEntryType("/d/g").value_or(EntryType::kOther));
  EXPECT_TRUE(env_->GetEntryType("/d/missing").status().IsNotFound());
  ASSERT_TRUE(env_->RemoveTree("/d/g").ok());  // a file is removed as well
  EXPECT_FALSE(env_->FileExists("/d/g"));
  ASSERT_TRUE(env_->RemoveTree("/d").ok());
  EXPECT_FALSE(env_->FileExists("/d"));
  EXPECT_TRUE(env_->RemoveTree("/d").ok());  // absent is fine
}

TEST_F(MemEnvTest, DirectIoIsAcceptedAndIgnored) {
  FileOptions direct;
  direct.direct_io = true;
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile("/d/f", direct);
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE((*w)->direct());
  ASSERT_TRUE((*w)->WriteAt(1, "a", 1).ok());
}

TEST_F(MemEnvTest, UnsyncedWritesVanishAfterCrash) {
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile("/d/f", FileOptions{});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());  // the name is durable, the content is not yet
  ASSERT_TRUE((*w)->WriteAt(0, "synced", 6).ok());
  ASSERT_TRUE((*w)->Sync().ok());
  ASSERT_TRUE((*w)->WriteAt(6, " and not", 8).ok());
  EXPECT_EQ("synced and not", Read(env_.get(), "/d/f"));

  env_->SimulateCrash();
  EXPECT_EQ("synced", Read(env_.get(), "/d/f"));
  // The old file object died with the crash.
  Status s = (*w)->WriteAt(0, "x", 1);
  EXPECT_EQ(StatusCode::kAborted, s.code()) << s.ToString();
  EXPECT_EQ(StatusCode::kAborted, (*w)->Sync().code());
}

TEST_F(MemEnvTest, SyncedFileInUnsyncedDirectoryVanishes) {
  WriteSynced(env_.get(), "/d/f", "content");
  EXPECT_TRUE(env_->FileExists("/d/f"));
  env_->SimulateCrash();
  EXPECT_FALSE(env_->FileExists("/d/f"));

  WriteSynced(env_.get(), "/d/f", "content");
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  env_->SimulateCrash();
  EXPECT_EQ("content", Read(env_.get(), "/d/f"));
}

TEST_F(MemEnvTest, NewDirectoryNeedsItsParentSynced) {
  ASSERT_TRUE(env_->CreateDir("/d/new").ok());
  WriteSynced(env_.get(), "/d/new/f", "x");
  ASSERT_TRUE(env_->SyncDir("/d/new").ok());
  env_->SimulateCrash();
  EXPECT_FALSE(env_->FileExists("/d/new"));

  ASSERT_TRUE(env_->CreateDir("/d/new").ok());
  WriteSynced(env_.get(), "/d/new/f", "x");
  ASSERT_TRUE(env_->SyncDir("/d/new").ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  env_->SimulateCrash();
  EXPECT_EQ("x", Read(env_.get(), "/d/new/f"));
}

TEST_F(MemEnvTest, RenameIsNotDurableUntilSyncDir) {
  WriteSynced(env_.get(), "/d/f", "old");
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  WriteSynced(env_.get(), "/d/f.tmp", "new");
  ASSERT_TRUE(env_->RenameFile("/d/f.tmp", "/d/f").ok());
  EXPECT_EQ("new", Read(env_.get(), "/d/f"));
  env_->SimulateCrash();
  EXPECT_EQ("old", Read(env_.get(), "/d/f"));
  EXPECT_FALSE(env_->FileExists("/d/f.tmp"));

  WriteSynced(env_.get(), "/d/f.tmp", "new");
  ASSERT_TRUE(env_->RenameFile("/d/f.tmp", "/d/f").ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  env_->SimulateCrash();
  EXPECT_EQ("new", Read(env_.get(), "/d/f"));
}

TEST_F(MemEnvTest, RemovalIsNotDurableUntilSyncDir) {
  WriteSynced(env_.get(), "/d/f", "keep");
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  ASSERT_TRUE(env_->RemoveFile("/d/f").ok());
  EXPECT_FALSE(env_->FileExists("/d/f"));
  env_->SimulateCrash();
  EXPECT_EQ("keep", Read(env_.get(), "/d/f"));
  ASSERT_TRUE(env_->RemoveFile("/d/f").ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  env_->SimulateCrash();
  EXPECT_FALSE(env_->FileExists("/d/f"));
}

TEST_F(MemEnvTest, CrashAfterOperationsStopsMutationsButNotReads) {
  WriteSynced(env_.get(), "/d/f", "abc");
  const int64_t before = env_->mutating_operations();
  env_->CrashAfterOperations(2);
  ASSERT_TRUE(env_->CreateDir("/d/x").ok());
  ASSERT_TRUE(env_->SyncDir("/d").ok());
  Status s = env_->RemoveFile("/d/f");
  EXPECT_EQ(StatusCode::kAborted, s.code());
  EXPECT_NE(std::string::npos, s.message().find("simulated crash"));
  EXPECT_TRUE(env_->FileExists("/d/f"));  // the failed call did nothing
  EXPECT_EQ("abc", Read(env_.get(), "/d/f"));
  EXPECT_EQ(StatusCode::kAborted, env_->NewWritableFile("/d/g", FileOptions{}).status().code());
  EXPECT_EQ(before + 2, env_->mutating_operations());

  env_->CrashAfterOperations(-1);  // disarmed
  EXPECT_TRUE(env_->RemoveFile("/d/f").ok());
  EXPECT_EQ(before + 3, env_->mutating_operations());

  env_->CrashAfterOperations(0);
  env_->SimulateCrash();  // a reboot disarms the crash point
  EXPECT_TRUE(env_->IsDirectory("/d/x"));
  EXPECT_EQ("abc", Read(env_.get(), "/d/f"));
  EXPECT_TRUE(env_->RemoveFile("/d/f").ok());
}

// The property the commit protocol relies on: at every crash point, the file holds either its
// old content or the new one, never a mix or nothing.
TEST(MemEnvCrashPoints, WriteFileAtomicallyIsAtomicAtEveryCrashPoint) {
  const std::string kOld(5000, 'o');
  const std::string kNew(7000, 'n');
  auto setup = [&](MemEnv* env) {
    ASSERT_TRUE(env->CreateDir("/ckpt").ok());
    ASSERT_TRUE(env->SyncDir("/").ok());
    WriteSynced(env, "/ckpt/latest", kOld);
    ASSERT_TRUE(env->SyncDir("/ckpt").ok());
  };

  int64_t total;
  {
    std::unique_ptr<MemEnv> env = NewMemEnv();
    setup(env.get());
    const int64_t base = env->mutating_operations();
    ASSERT_TRUE(WriteFileAtomically(env.get(), "/ckpt/latest", kNew).ok());
    total = env->mutating_operations() - base;
  }
  ASSERT_GE(total, 5);  // create, write, sync, rename, syncdir

  int olds = 0, news = 0;
  for (int64_t k = 0; k <= total; ++k) {
    SCOPED_TRACE("crash after " + std::to_string(k) + " of " + std::to_string(total) + " operations");
    std::unique_ptr<MemEnv> env = NewMemEnv();
    setup(env.get());
    env->CrashAfterOperations(k);
    Status s = WriteFileAtomically(env.get(), "/ckpt/latest", kNew);
    EXPECT_EQ(k == total, s.ok()) << s.ToString();
    // The content a reader sees before the power goes is already one or the other.
    const std::string seen = Read(env.get(), "/ckpt/latest");
    EXPECT_TRUE(seen == kOld || seen == kNew);
    env->SimulateCrash();
    const std::string after = Read(env.get(), "/ckpt/latest");
    ASSERT_TRUE(after == kOld || after == kNew) << after.substr(0, 40);
    (after == kOld ? olds : news)++;
    if (k == total) {
      EXPECT_EQ(kNew, after);
    }
  }
  EXPECT_GT(olds, 0);
  EXPECT_GT(news, 0);
}

TEST_F(MemEnvTest, IoQueueWritesAreCountedAndCrashable) {
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile("/d/q", FileOptions{});
  ASSERT_TRUE(w.ok());
  Result<std::unique_ptr<IoQueue>> q = env_->NewIoQueue(IoQueueOptions{});
  ASSERT_TRUE(q.ok());
  const std::string data(4096, 'z');
  const int64_t before = env_->mutating_operations();
  env_->CrashAfterOperations(3);
  for (int i = 0; i < 4; ++i) {
    IoRequest r;
    r.writer = w->get();
    r.offset = i * data.size();
    r.buffer = const_cast<char*>(data.data());
    r.length = data.size();
    r.tag = i;
    ASSERT_TRUE((*q)->Submit(r).ok());
  }
  std::vector<IoCompletion> done;
  ASSERT_TRUE((*q)->Reap(4, &done).ok());
  ASSERT_EQ(4u, done.size());
  int aborted = 0;
  for (const IoCompletion& c : done) aborted += c.status.code() == StatusCode::kAborted;
  EXPECT_EQ(1, aborted);
  EXPECT_EQ(before + 3, env_->mutating_operations());
}

TEST_F(MemEnvTest, ConcurrentWritersToDistinctFiles) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      const std::string path = "/d/f" + std::to_string(t);
      Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(path, FileOptions{});
      ASSERT_TRUE(w.ok());
      for (int i = 0; i < 200; ++i) ASSERT_TRUE((*w)->WriteAt(i, "x", 1).ok());
      ASSERT_TRUE((*w)->Sync().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(std::string(200, 'x'), Read(env_.get(), "/d/f" + std::to_string(t)));
}

}  // namespace mem_env_test
}  // namespace lifeline
