// FaultInjectionEnv: each knob, the path restriction, and faults seen through an IoQueue.
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace fault_env_test {

bool Contains(const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

class FaultEnvTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(mem_->CreateDir("/d").ok()); }

  std::unique_ptr<WritableFile> Open(const std::string& path) {
    Result<std::unique_ptr<WritableFile>> w = env_.NewWritableFile(path, FileOptions{});
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(w).value() : nullptr;
  }

  std::unique_ptr<MemEnv> mem_ = NewMemEnv();
  FaultInjectionEnv env_{mem_.get()};
};

TEST_F(FaultEnvTest, PassesThroughWhenNoKnobIsSet) {
  ASSERT_TRUE(WriteFileAtomically(&env_, "/d/f", "data").ok());
  EXPECT_EQ("data", ReadFileToString(&env_, "/d/f", 10).value_or(""));
  EXPECT_EQ(mem_.get(), env_.target());
}

TEST_F(FaultEnvTest, WritesFailWithNoSpaceOnceTheBudgetIsSpent) {
  std::unique_ptr<WritableFile> a = Open("/d/a");
  std::unique_ptr<WritableFile> b = Open("/d/b");
  env_.FailWritesAfterBytes(100);
  const std::string chunk(60, 'x');
  ASSERT_TRUE(a->WriteAt(0, chunk.data(), 60).ok());
  // The budget is shared: 40 bytes are left, so a 60-byte write to another file fails whole.
  Status s = b->WriteAt(0, chunk.data(), 60);
  EXPECT_EQ(StatusCode::kResourceExhausted, s.code()) << s.ToString();
  EXPECT_TRUE(Contains(s, "/d/b")) << s.ToString();
  EXPECT_TRUE(Contains(s, "No space left on device")) << s.ToString();
  EXPECT_EQ(0u, mem_->GetFileSize("/d/b").value_or(99));  // nothing of it landed
  ASSERT_TRUE(b->WriteAt(0, chunk.data(), 40).ok());     // exactly fits
  EXPECT_FALSE(a->WriteAt(60, chunk.data(), 1).ok());
  EXPECT_TRUE(a->WriteAt(60, chunk.data(), 0).ok());

  env_.FailWritesAfterBytes(-1);
  EXPECT_TRUE(a->WriteAt(60, chunk.data(), 60).ok());
}

TEST_F(FaultEnvTest, SyncsFailWhileSet) {
  std::unique_ptr<WritableFile> f = Open("/d/f");
  env_.FailSyncs(true);
  Status s = f->Sync();
  EXPECT_EQ(StatusCode::kIOError, s.code());
  EXPECT_TRUE(Contains(s, "/d/f")) << s.ToString();
  s = env_.SyncDir("/d");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, "/d")) << s.ToString();
  EXPECT_FALSE(WriteFileAtomically(&env_, "/d/g", "x").ok());
  env_.FailSyncs(false);
  EXPECT_TRUE(f->Sync().ok());
  EXPECT_TRUE(env_.SyncDir("/d").ok());
}

TEST_F(FaultEnvTest, RenamesFailWhileSetAndLeaveTheOldContent) {
  ASSERT_TRUE(WriteFileAtomically(&env_, "/d/meta", "old").ok());
  env_.FailRenames(true);
  Status s = WriteFileAtomically(&env_, "/d/meta", "new");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, "/d/meta")) << s.ToString();
  EXPECT_EQ("old", ReadFileToString(&env_, "/d/meta", 10).value_or(""));
  Result<std::vector<std::string>> children = env_.GetChildren("/d");
  ASSERT_TRUE(children.ok());
  EXPECT_EQ(std::vector<std::string>{"meta"}, *children);  // the temporary was cleaned up
  env_.FailRenames(false);
  EXPECT_TRUE(WriteFileAtomically(&env_, "/d/meta", "new").ok());
}

TEST_F(FaultEnvTest, RestrictionLimitsEveryKnob) {
  ASSERT_TRUE(mem_->CreateDir("/d/victim").ok());
  env_.RestrictToPathsContaining("victim");
  env_.FailWritesAfterBytes(0);
  env_.FailSyncs(true);
  env_.FailRenames(true);

  std::unique_ptr<WritableFile> safe = Open("/d/safe");
  EXPECT_TRUE(safe->WriteAt(0, "abc", 3).ok());
  EXPECT_TRUE(safe->Sync().ok());
  EXPECT_TRUE(env_.SyncDir("/d").ok());
  EXPECT_TRUE(env_.RenameFile("/d/safe", "/d/safe2").ok());

  std::unique_ptr<WritableFile> hit = Open("/d/victim/f");
  EXPECT_EQ(StatusCode::kResourceExhausted, hit->WriteAt(0, "abc", 3).code());
  EXPECT_FALSE(hit->Sync().ok());
  EXPECT_FALSE(env_.SyncDir("/d/victim").ok());
  EXPECT_FALSE(env_.RenameFile("/d/safe2", "/d/victim/g").ok());

  env_.RestrictToPathsContaining("");
  EXPECT_FALSE(safe->Sync().ok());
}

TEST_F(FaultEnvTest, IoQueueWritesSeeTheFaults) {
  std::unique_ptr<WritableFile> f = Open("/d/q");
  EXPECT_LT(f->fd(), 0);
  Result<std::unique_ptr<IoQueue>> q = env_.NewIoQueue(IoQueueOptions{});
  ASSERT_TRUE(q.ok());
  env_.FailWritesAfterBytes(3 * 1024);
  const std::string block(1024, 'b');
  for (int i = 0; i < 5; ++i) {
    IoRequest r;
    r.writer = f.get();
    r.offset = i * block.size();
    r.buffer = const_cast<char*>(block.data());
    r.length = block.size();
    r.tag = i;
    ASSERT_TRUE((*q)->Submit(r).ok());
  }
  std::vector<IoCompletion> done;
  ASSERT_TRUE((*q)->Reap(5, &done).ok());
  ASSERT_EQ(5u, done.size());
  int failed = 0;
  for (const IoCompletion& c : done) {
    if (c.status.ok()) continue;
    ++failed;
    EXPECT_EQ(StatusCode::kResourceExhausted, c.status.code());
    EXPECT_TRUE(Contains(c.status, "/d/q"));
  }
  EXPECT_EQ(2, failed);
}

// Over real files, the io_uring-capable default queue must not bypass the wrapper either.
TEST(FaultEnvPosix, NoSpaceNamesTheRealFile) {
  test::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.path();
  {
    FaultInjectionEnv env(Env::Default());
    const std::string path = JoinPath(dir, "shard-00001");
    Result<std::unique_ptr<WritableFile>> w = env.NewWritableFile(path, FileOptions{});
    ASSERT_TRUE(w.ok());
    env.FailWritesAfterBytes(10);
    Status s = (*w)->WriteAt(0, "0123456789abc", 13);
    EXPECT_EQ(StatusCode::kResourceExhausted, s.code());
    EXPECT_EQ(path + ": No space left on device", s.message());

    Result<std::unique_ptr<IoQueue>> q = Env::Default()->NewIoQueue(IoQueueOptions{});
    ASSERT_TRUE(q.ok());
    IoRequest r;
    r.writer = w->get();
    r.buffer = const_cast<char*>("0123456789abc");
    r.length = 13;
    ASSERT_TRUE((*q)->Submit(r).ok());
    std::vector<IoCompletion> done;
    ASSERT_TRUE((*q)->Reap(1, &done).ok());
    ASSERT_EQ(1u, done.size());
    EXPECT_EQ(StatusCode::kResourceExhausted, done[0].status.code()) << done[0].status.ToString();
  }
  ASSERT_TRUE(Env::Default()->RemoveTree(dir).ok());
}

}  // namespace fault_env_test
}  // namespace lifeline
