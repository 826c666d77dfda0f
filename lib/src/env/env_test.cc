// Env::Default(): POSIX files and directories, O_DIRECT and its fallback, and the helpers.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/env/aligned_buffer.h"
#include "lib/src/env/io_queue_internal.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace env_test {

constexpr long kExt4Magic = 0xEF53;

using test::TempDir;

bool HasODirect(int fd) { return (::fcntl(fd, F_GETFL) & O_DIRECT) != 0; }

bool Contains(const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

class PosixEnvTest : public ::testing::Test {
 protected:
  Env* env_ = Env::Default();
  TempDir dir_;
  std::string Path(const std::string& name) const { return JoinPath(dir_.path(), name); }
};

TEST_F(PosixEnvTest, DefaultIsASingleton) { EXPECT_EQ(Env::Default(), Env::Default()); }

TEST_F(PosixEnvTest, WriteReadRoundTrip) {
  const std::string path = Path("f");
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(path, FileOptions{});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(path, (*w)->path());
  EXPECT_FALSE((*w)->direct());
  EXPECT_GE((*w)->fd(), 0);
  ASSERT_TRUE((*w)->WriteAt(6, "world", 5).ok());
  ASSERT_TRUE((*w)->WriteAt(0, "hello ", 6).ok());
  ASSERT_TRUE((*w)->Sync().ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_TRUE((*w)->Close().ok());  // twice is harmless

  EXPECT_EQ(11u, env_->GetFileSize(path).value_or(0));
  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(path, FileOptions{});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(11u, (*r)->Size().value_or(0));
  char buf[5];
  ASSERT_TRUE((*r)->ReadAt(6, buf, 5).ok());
  EXPECT_EQ("world", std::string(buf, 5));
  EXPECT_EQ("hello world", ReadFileToString(env_, path, 100).value_or(""));
}

TEST_F(PosixEnvTest, NewWritableFileTruncatesAndTruncateShrinks) {
  const std::string path = Path("t");
  ASSERT_TRUE(WriteFileAtomically(env_, path, "0123456789").ok());
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(path, FileOptions{});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(0u, env_->GetFileSize(path).value_or(99));
  ASSERT_TRUE((*w)->WriteAt(0, "abcdefgh", 8).ok());
  ASSERT_TRUE((*w)->Truncate(3).ok());
  EXPECT_EQ("abc", ReadFileToString(env_, path, 100).value_or(""));
}

TEST_F(PosixEnvTest, ReadPastEndIsCorruptionNamingFileAndOffset) {
  const std::string path = Path("short");
  ASSERT_TRUE(WriteFileAtomically(env_, path, "abc").ok());
  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(path, FileOptions{});
  ASSERT_TRUE(r.ok());
  char buf[8];
  Status s = (*r)->ReadAt(1, buf, 8);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_TRUE(Contains(s, path + " at offset 1")) << s.ToString();
  EXPECT_TRUE(Contains(s, "short read")) << s.ToString();
}

TEST_F(PosixEnvTest, ErrorsNameTheFile) {
  const std::string missing = Path("nope");
  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(missing, FileOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotFound());
  EXPECT_TRUE(Contains(r.status(), missing)) << r.status().ToString();

  Status s = env_->RemoveFile(missing);
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_TRUE(Contains(s, missing));

  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(Path("no/such/dir/f"), FileOptions{});
  ASSERT_FALSE(w.ok());
  EXPECT_TRUE(Contains(w.status(), Path("no/such/dir/f")));

  s = env_->RenameFile(missing, Path("other"));
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_TRUE(Contains(s, missing));

  Result<uint64_t> size = env_->GetFileSize(missing);
  EXPECT_TRUE(size.status().IsNotFound());
  EXPECT_TRUE(env_->GetChildren(missing).status().IsNotFound());
  EXPECT_TRUE(env_->SyncDir(missing).IsNotFound());
}

TEST_F(PosixEnvTest, DirectoriesAndRenames) {
  const std::string nested = Path("a/b/c");
  ASSERT_TRUE(env_->CreateDir(nested).ok());
  ASSERT_TRUE(env_->CreateDir(nested).ok());  // already there
  EXPECT_TRUE(env_->IsDirectory(nested));
  EXPECT_TRUE(env_->FileExists(nested));
  ASSERT_TRUE(WriteFileAtomically(env_, JoinPath(nested, "x"), "1").ok());
  ASSERT_TRUE(WriteFileAtomically(env_, JoinPath(nested, "y"), "2").ok());
  EXPECT_FALSE(env_->IsDirectory(JoinPath(nested, "x")));
  EXPECT_TRUE(env_->FileExists(JoinPath(nested, "x")));

  // CreateDir over a file fails and names it.
  Status s = env_->CreateDir(JoinPath(nested, "x/sub"));
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, JoinPath(nested, "x")));

  Result<std::vector<std::string>> children = env_->GetChildren(nested);
  ASSERT_TRUE(children.ok());
  std::sort(children->begin(), children->end());
  EXPECT_EQ((std::vector<std::string>{"x", "y"}), *children);

  // Rename replaces the target atomically.
  ASSERT_TRUE(env_->RenameFile(JoinPath(nested, "x"), JoinPath(nested, "y")).ok());
  EXPECT_FALSE(env_->FileExists(JoinPath(nested, "x")));
  EXPECT_EQ("1", ReadFileToString(env_, JoinPath(nested, "y"), 10).value_or(""));
  ASSERT_TRUE(env_->SyncDir(nested).ok());

  EXPECT_FALSE(env_->RemoveDir(Path("a")).ok());  // not empty
  ASSERT_TRUE(env_->RemoveFile(JoinPath(nested, "y")).ok());
  ASSERT_TRUE(env_->RemoveDir(nested).ok());
  EXPECT_FALSE(env_->FileExists(nested));
  ASSERT_TRUE(WriteFileAtomically(env_, Path("a/b/z"), "z").ok());
  ASSERT_TRUE(env_->RemoveTree(Path("a")).ok());
  EXPECT_FALSE(env_->FileExists(Path("a")));
  EXPECT_TRUE(env_->RemoveTree(Path("a")).ok());  // absent is fine
}

TEST_F(PosixEnvTest, WriteFileAtomicallyLeavesNoTemporaries) {
  const std::string path = Path("meta");
  ASSERT_TRUE(WriteFileAtomically(env_, path, "old").ok());
  ASSERT_TRUE(WriteFileAtomically(env_, path, "new").ok());
  EXPECT_EQ("new", ReadFileToString(env_, path, 10).value_or(""));
  Result<std::vector<std::string>> children = env_->GetChildren(dir_.path());
  ASSERT_TRUE(children.ok());
  EXPECT_EQ(std::vector<std::string>{"meta"}, *children);
  Result<std::string> limited = ReadFileToString(env_, path, 2);
  EXPECT_EQ(StatusCode::kResourceExhausted, limited.status().code());
}

TEST_F(PosixEnvTest, DirectIoOnLocalDisk) {
  FileOptions direct;
  direct.direct_io = true;
  const std::string path = Path("direct");
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(path, direct);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // direct() tells the truth whatever the file system.
  EXPECT_EQ(HasODirect((*w)->fd()), (*w)->direct());
  struct statfs fs;
  ASSERT_EQ(0, ::statfs(dir_.path().c_str(), &fs));
  if (fs.f_type == kExt4Magic) {
    EXPECT_TRUE((*w)->direct()) << "ext4 supports O_DIRECT";
  }

  constexpr size_t kSize = 3 * kDirectIoAlignment;
  AlignedBuffer out(kSize);
  for (size_t i = 0; i < kSize; ++i) out.data()[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE((*w)->WriteAt(0, out.data(), kSize).ok());
  if ((*w)->direct() && fs.f_type == kExt4Magic) {
    // ext4 rejects a misaligned direct write; the error names the file and offset.
    Status s = (*w)->WriteAt(1, out.data(), 100);
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(Contains(s, path + " at offset 1")) << s.ToString();
  }
  // Drop the alignment padding as the pipeline does.
  ASSERT_TRUE((*w)->Truncate(kSize - 100).ok());
  ASSERT_TRUE((*w)->Sync().ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(kSize - 100, env_->GetFileSize(path).value_or(0));

  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(path, direct);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(HasODirect((*r)->fd()), (*r)->direct());
  AlignedBuffer in(kSize);
  ASSERT_TRUE((*r)->ReadAt(kDirectIoAlignment, in.data(), kDirectIoAlignment).ok());
  EXPECT_EQ(0, std::memcmp(out.data() + kDirectIoAlignment, in.data(), kDirectIoAlignment));
}

TEST_F(PosixEnvTest, DirectIoOnSharedMemoryReportsTheModeInEffect) {
  TempDir shm("/dev/shm");
  if (shm.path().empty()) GTEST_SKIP() << "/dev/shm is not available";
  FileOptions direct;
  direct.direct_io = true;
  const std::string path = JoinPath(shm.path(), "f");
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(path, direct);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // tmpfs refused O_DIRECT before Linux 6.6 and accepts it since; either way direct() says which.
  EXPECT_EQ(HasODirect((*w)->fd()), (*w)->direct());
  AlignedBuffer out(kDirectIoAlignment);
  std::memset(out.data(), 'q', kDirectIoAlignment);
  ASSERT_TRUE((*w)->WriteAt(0, out.data(), kDirectIoAlignment).ok());
  ASSERT_TRUE((*w)->Close().ok());
  Result<std::string> back = ReadFileToString(env_, path, kDirectIoAlignment);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::string(kDirectIoAlignment, 'q'), *back);
}

TEST_F(PosixEnvTest, RefusedDirectIoFallsBackToBufferedIo) {
  internal::SetDirectIoRefusedForTesting(true);
  FileOptions direct;
  direct.direct_io = true;
  const std::string path = Path("fallback");
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(path, direct);
  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(dir_.path(), direct);
  internal::SetDirectIoRefusedForTesting(false);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE((*w)->direct());
  EXPECT_FALSE(HasODirect((*w)->fd()));
  EXPECT_FALSE((*r)->direct());
  // Buffered: misaligned I/O is fine.
  ASSERT_TRUE((*w)->WriteAt(1, "xyz", 3).ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(std::string("\0xyz", 4), ReadFileToString(env_, path, 10).value_or(""));
}

// ---- symbolic links: never followed inside Lifeline's own directories --------------------------

// A directory outside the tree under test, with a file in a subdirectory, that a link points to.
struct LinkTarget {
  TempDir dir;
  std::string file;
  explicit LinkTarget(Env* env) {
    EXPECT_TRUE(env->CreateDir(JoinPath(dir.path(), "sub")).ok());
    file = JoinPath(JoinPath(dir.path(), "sub"), "precious");
    EXPECT_TRUE(WriteFileAtomically(env, file, "keep me").ok());
    EXPECT_TRUE(WriteFileAtomically(env, JoinPath(dir.path(), "top"), "keep me too").ok());
  }
  bool Intact(Env* env) const {
    return ReadFileToString(env, file, 100).value_or("") == "keep me" &&
           ReadFileToString(env, JoinPath(dir.path(), "top"), 100).value_or("") == "keep me too";
  }
};

TEST_F(PosixEnvTest, GetEntryTypeDoesNotFollowLinks) {
  LinkTarget target(env_);
  ASSERT_EQ(0, ::symlink(target.dir.path().c_str(), Path("dirlink").c_str()));
  ASSERT_EQ(0, ::symlink(target.file.c_str(), Path("filelink").c_str()));
  ASSERT_TRUE(WriteFileAtomically(env_, Path("plain"), "x").ok());
  EXPECT_EQ(EntryType::kSymlink, env_->GetEntryType(Path("dirlink")).value_or(EntryType::kOther));
  EXPECT_EQ(EntryType::kSymlink, env_->GetEntryType(Path("filelink")).value_or(EntryType::kOther));
  EXPECT_EQ(EntryType::kFile, env_->GetEntryType(Path("plain")).value_or(EntryType::kOther));
  EXPECT_EQ(EntryType::kDirectory, env_->GetEntryType(dir_.path()).value_or(EntryType::kOther));
  EXPECT_TRUE(env_->GetEntryType(Path("absent")).status().IsNotFound());
  EXPECT_TRUE(env_->IsDirectory(Path("dirlink")));  // IsDirectory follows, as documented
}

TEST_F(PosixEnvTest, RemoveTreeRemovesLinksNotTheirTargets) {
  LinkTarget target(env_);
  ASSERT_TRUE(env_->CreateDir(Path("tree/step/deeper")).ok());
  ASSERT_TRUE(WriteFileAtomically(env_, Path("tree/step/data"), "d").ok());
  ASSERT_EQ(0, ::symlink(target.dir.path().c_str(), Path("tree/step/dirlink").c_str()));
  ASSERT_EQ(0, ::symlink(target.file.c_str(), Path("tree/step/deeper/filelink").c_str()));
  ASSERT_EQ(0, ::symlink("/nonexistent/dangling", Path("tree/dangling").c_str()));
  ASSERT_TRUE(env_->RemoveTree(Path("tree")).ok());
  EXPECT_FALSE(env_->FileExists(Path("tree")));
  EXPECT_TRUE(target.Intact(env_)) << "RemoveTree followed a link and deleted what it points to";
}

TEST_F(PosixEnvTest, RemoveTreeOfALinkRemovesOnlyTheLink) {
  LinkTarget target(env_);
  ASSERT_EQ(0, ::symlink(target.dir.path().c_str(), Path("step-00000000000000000000").c_str()));
  ASSERT_TRUE(env_->RemoveTree(Path("step-00000000000000000000")).ok());
  EXPECT_TRUE(env_->GetEntryType(Path("step-00000000000000000000")).status().IsNotFound());
  EXPECT_TRUE(target.Intact(env_));
  // A trailing slash must not make the link count as the directory it points to.
  ASSERT_EQ(0, ::symlink(target.dir.path().c_str(), Path("again").c_str()));
  ASSERT_TRUE(env_->RemoveTree(Path("again") + "/").ok());
  EXPECT_TRUE(env_->GetEntryType(Path("again")).status().IsNotFound());
  EXPECT_TRUE(target.Intact(env_));
}

TEST_F(PosixEnvTest, RemoveTreeRemovesAPlainFileAndRefusesDot) {
  ASSERT_TRUE(WriteFileAtomically(env_, Path("f"), "x").ok());
  ASSERT_TRUE(env_->RemoveTree(Path("f")).ok());
  EXPECT_FALSE(env_->FileExists(Path("f")));
  EXPECT_EQ(StatusCode::kInvalidArgument, env_->RemoveTree(Path(".")).code());
  EXPECT_EQ(StatusCode::kInvalidArgument, env_->RemoveTree("/").code());
  EXPECT_TRUE(env_->IsDirectory(dir_.path()));
}

TEST_F(PosixEnvTest, OpensRefuseALinkUnlessAskedToFollow) {
  LinkTarget target(env_);
  ASSERT_EQ(0, ::symlink(target.file.c_str(), Path("link").c_str()));
  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(Path("link"), FileOptions{});
  EXPECT_EQ(StatusCode::kFailedPrecondition, r.status().code());
  EXPECT_TRUE(Contains(r.status(), Path("link"))) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "is a symbolic link")) << r.status().ToString();
  FileOptions direct;
  direct.direct_io = true;
  EXPECT_TRUE(Contains(env_->NewRandomAccessFile(Path("link"), direct).status(), "is a symbolic link"));
  EXPECT_TRUE(Contains(ReadFileToString(env_, Path("link"), 100).status(), "is a symbolic link"));

  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(Path("link"), FileOptions{});
  EXPECT_TRUE(Contains(w.status(), "is a symbolic link")) << w.status().ToString();
  EXPECT_TRUE(target.Intact(env_)) << "a refused open still truncated the link's target";
  // A dangling link must not let O_CREAT make a file wherever it points.
  const std::string elsewhere = JoinPath(target.dir.path(), "created");
  ASSERT_EQ(0, ::symlink(elsewhere.c_str(), Path("dangling").c_str()));
  EXPECT_TRUE(Contains(env_->NewWritableFile(Path("dangling"), FileOptions{}).status(), "is a symbolic link"));
  EXPECT_FALSE(env_->FileExists(elsewhere));

  FileOptions follow;
  follow.follow_symlinks = true;
  EXPECT_EQ("keep me", ReadFileToString(env_, Path("link"), 100, follow).value_or(""));
  // Links before the last component (a checkpoint root that is a link) are still followed.
  ASSERT_EQ(0, ::symlink(target.dir.path().c_str(), Path("root").c_str()));
  EXPECT_EQ("keep me too", ReadFileToString(env_, Path("root/top"), 100).value_or(""));
}

TEST_F(PosixEnvTest, WriteFileAtomicallyReplacesALinkInsteadOfWritingThroughIt) {
  LinkTarget target(env_);
  ASSERT_EQ(0, ::symlink(target.file.c_str(), Path("index").c_str()));
  ASSERT_TRUE(WriteFileAtomically(env_, Path("index"), "new").ok());
  EXPECT_EQ(EntryType::kFile, env_->GetEntryType(Path("index")).value_or(EntryType::kOther));
  EXPECT_EQ("new", ReadFileToString(env_, Path("index"), 10).value_or(""));
  EXPECT_TRUE(target.Intact(env_));
}

// A save's data file, index temp name or dump has a predictable name: a hard link planted there
// by another user of the directory, or a FIFO, must be replaced, never written through or waited on.
TEST_F(PosixEnvTest, NewWritableFileReplacesAHardLinkOrFifoInsteadOfWritingThroughIt) {  // and reads refuse a FIFO
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    LinkTarget target(env_);
    const std::string data = Path(direct ? "direct.data" : "buffered.data");
    ASSERT_EQ(0, ::link(target.file.c_str(), data.c_str()));
    FileOptions options;
    options.direct_io = direct;
    Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(data, options);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(HasODirect((*w)->fd()), (*w)->direct());
    AlignedBuffer bytes(kDirectIoAlignment);
    std::memset(bytes.data(), 'x', kDirectIoAlignment);
    ASSERT_TRUE((*w)->WriteAt(0, bytes.data(), kDirectIoAlignment).ok());
    ASSERT_TRUE((*w)->Close().ok());
    EXPECT_TRUE(target.Intact(env_)) << "the save wrote through a hard link into a file outside";
    EXPECT_EQ(std::string(kDirectIoAlignment, 'x'), ReadFileToString(env_, data, 8192).value_or(""));
    struct stat st;
    ASSERT_EQ(0, ::stat(target.file.c_str(), &st));
    EXPECT_EQ(1u, st.st_nlink);
  }
  ASSERT_EQ(0, ::mkfifo(Path("fifo").c_str(), 0600));
  // Read, a FIFO is refused at once, naming it (no writer: an open would block forever).
  Result<std::unique_ptr<RandomAccessFile>> r = env_->NewRandomAccessFile(Path("fifo"), FileOptions{});
  EXPECT_EQ(StatusCode::kFailedPrecondition, r.status().code());
  EXPECT_TRUE(Contains(r.status(), Path("fifo"))) << r.status().ToString();
  EXPECT_TRUE(Contains(r.status(), "not a regular file")) << r.status().ToString();
  EXPECT_FALSE(ReadFileToString(env_, Path("fifo"), 100).ok());
  Result<std::unique_ptr<WritableFile>> w = env_->NewWritableFile(Path("fifo"), FileOptions{});  // no reader: would block
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ(EntryType::kFile, env_->GetEntryType(Path("fifo")).value_or(EntryType::kOther));
}

}  // namespace env_test
}  // namespace lifeline
