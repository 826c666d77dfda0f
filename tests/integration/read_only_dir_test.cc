// A checkpoint directory that cannot be written (a read-only mount, a colleague's checkpoints)
// still loads, also through a Checkpointer that asks for the memory tier: the tier needs the
// directory's identity file, which cannot be created there, so it is skipped with one warning.
//
// The tests run as root, where permission bits are not enforced: the read-only file system is an
// EnvWrapper that refuses every change under the directory with EROFS.
#include <cerrno>
#include <mutex>

#include <gtest/gtest.h>

#include "lifeline/log.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {
namespace read_only_dir_test {

constexpr uint64_t kSalt = 5;

class ReadOnlyEnv : public EnvWrapper {
 public:
  ReadOnlyEnv(Env* target, std::string dir) : EnvWrapper(target), dir_(std::move(dir)) {}

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path, const FileOptions& o) override {
    if (Under(path)) return Refuse(path);
    return EnvWrapper::NewWritableFile(path, o);
  }
  Status CreateDir(const std::string& path) override {
    if (Under(path) && !IsDirectory(path)) return Refuse(path);  // mkdir of an existing one: EEXIST, i.e. OK
    return EnvWrapper::CreateDir(path);
  }
  Status RemoveFile(const std::string& path) override { return Under(path) ? Refuse(path) : EnvWrapper::RemoveFile(path); }
  Status RemoveDir(const std::string& path) override { return Under(path) ? Refuse(path) : EnvWrapper::RemoveDir(path); }
  Status RemoveTree(const std::string& path) override { return Under(path) ? Refuse(path) : EnvWrapper::RemoveTree(path); }
  Status RenameFile(const std::string& from, const std::string& to) override {
    return Under(from) || Under(to) ? Refuse(to) : EnvWrapper::RenameFile(from, to);
  }
  Status RenameFileNoReplace(const std::string& from, const std::string& to) override {
    return Under(from) || Under(to) ? Refuse(to) : EnvWrapper::RenameFileNoReplace(from, to);
  }

 private:
  bool Under(const std::string& path) const { return path == dir_ || path.rfind(dir_ + "/", 0) == 0; }
  static Status Refuse(const std::string& path) { return Status::FromErrno(EROFS, path); }
  const std::string dir_;
};

// Collects warnings for the duration of a test.
class LogCapture {
 public:
  LogCapture() {
    SetLogSink([this](LogLevel level, std::string_view message) {
      std::lock_guard<std::mutex> lock(mu_);
      if (level >= LogLevel::kWarning) warnings_.emplace_back(message);
    });
  }
  ~LogCapture() { SetLogSink(nullptr); }
  std::vector<std::string> warnings() {
    std::lock_guard<std::mutex> lock(mu_);
    return warnings_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> warnings_;
};

CheckpointerOptions Options(const std::string& dir) {
  CheckpointerOptions o;
  o.directory = dir;
  o.run_id = "read-only-test";
  o.direct_io = false;
  return o;
}

TEST(ReadOnlyDirectoryTest, MemoryTierCheckpointerLoadsFromAReadOnlyDirectory) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  const std::vector<GlobalTensor> tensors = StandardTensors(kSalt);
  const std::vector<Status> saved = SaveAllRanks(Options(dir), tensors, WholeLayout(), 9, kSalt, false);
  ASSERT_TRUE(AllOk(saved)) << Describe(saved);
  ASSERT_FALSE(Env::Default()->FileExists(dir + "/lifeline.id")) << "saved without the memory tier";

  ReadOnlyEnv read_only(Env::Default(), dir);
  LogCapture log;
  CheckpointerOptions o = Options(dir);
  o.env = &read_only;
  o.memory_tier = true;  // default root: keyed by the directory's identity, which cannot be written
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->memory_tier_directory(), "");

  std::string diff;
  auto step = LoadWholeAndCompare(ckpt->get(), std::nullopt, tensors, &diff);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, 9u);
  EXPECT_EQ(diff, "");
  auto again = LoadWholeAndCompare(ckpt->get(), 9, tensors, &diff);
  ASSERT_TRUE(again.ok()) << again.status().ToString();

  const std::vector<std::string> warnings = log.warnings();
  ASSERT_EQ(warnings.size(), 1u) << "one warning, at open";
  EXPECT_NE(warnings[0].find("memory tier off for " + dir), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("lifeline.id"), std::string::npos) << warnings[0];
  EXPECT_FALSE(Env::Default()->FileExists(dir + "/lifeline.id"));

  // A save into it fails with the file system's error, not silently.
  RankState none;
  const Status s = (*ckpt)->Save(10, RequestOf(none, 0, kSalt)).WaitPersisted();
  EXPECT_FALSE(s.ok());
}

// A corrupt identity file is still an error: it cannot be told from a directory whose snapshots
// belong to another directory.
TEST(ReadOnlyDirectoryTest, CorruptIdentityStillFailsTheOpen) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  ASSERT_TRUE(Env::Default()->CreateDir(dir).ok());
  ASSERT_TRUE(WriteWholeFile(dir + "/lifeline.id", "not an id\n"));
  ReadOnlyEnv read_only(Env::Default(), dir);
  CheckpointerOptions o = Options(dir);
  o.env = &read_only;
  o.memory_tier = true;
  auto ckpt = Checkpointer::Open(o);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_TRUE(ckpt.status().IsCorruption()) << ckpt.status().ToString();
}

}  // namespace read_only_dir_test
}  // namespace lifeline::testing
