// The agent's --run-dir: a symbolic link planted at the path, or a directory of another user, is
// refused before anything is written or chmod-ed there; a missing one is created private (0700).
//
// The test with a directory of another user chowns it to uid 65534 (nobody); it needs root and is
// skipped otherwise.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "agent/agent.h"
#include "agent/config.h"

namespace lifeline::agent {
namespace run_dir_test {

constexpr uid_t kNobody = 65534;

class RunDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lifeline-run-dir-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Runs an agent over /bin/true with `run_dir`; returns its exit code, its stderr in *err.
  int RunAgent(const std::string& run_dir, std::string* err) {
    AgentConfig config;
    config.nproc = 1;
    config.command = {"/bin/true"};
    config.run_dir = run_dir;
    config.master_port = 0;
    testing::internal::CaptureStderr();
    int code;
    {
      Agent agent(config);
      code = agent.Run();
    }
    *err = testing::internal::GetCapturedStderr();
    return code;
  }

  static mode_t Mode(const std::string& path) {
    struct stat st;
    return lstat(path.c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
  }

  std::string dir_;
};

TEST_F(RunDirTest, ALinkIsRefusedAndItsTargetLeftAlone) {
  const std::string target = dir_ + "/victim";
  ASSERT_EQ(0, mkdir(target.c_str(), 0755));
  ASSERT_EQ(0, chmod(target.c_str(), 0755));
  const std::string link = dir_ + "/run";
  ASSERT_EQ(0, symlink(target.c_str(), link.c_str()));
  for (const std::string& named : {link, link + "/"}) {
    std::string err;
    EXPECT_EQ(2, RunAgent(named, &err));
    EXPECT_NE(std::string::npos, err.find("is a symbolic link")) << err;
    EXPECT_NE(std::string::npos, err.find(link)) << err;
    EXPECT_EQ(0755u, Mode(target)) << "the agent chmod-ed the link's target";
    EXPECT_TRUE(std::filesystem::is_empty(target)) << "the agent wrote into the link's target";
  }
}

TEST_F(RunDirTest, ADirectoryOfAnotherUserIsRefusedUnchanged) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  const std::string run = dir_ + "/theirs";
  ASSERT_EQ(0, mkdir(run.c_str(), 0755));
  ASSERT_EQ(0, chmod(run.c_str(), 0755));
  ASSERT_EQ(0, chown(run.c_str(), kNobody, kNobody));
  std::string err;
  EXPECT_EQ(2, RunAgent(run, &err));
  EXPECT_NE(std::string::npos, err.find("owned by uid 65534")) << err;
  EXPECT_NE(std::string::npos, err.find(run)) << err;
  EXPECT_EQ(0755u, Mode(run)) << "the agent chmod-ed a directory it does not own";
  EXPECT_TRUE(std::filesystem::is_empty(run));
}

TEST_F(RunDirTest, AMissingDirectoryIsCreatedPrivate) {
  const std::string run = dir_ + "/a/b/run";
  std::string err;
  EXPECT_EQ(0, RunAgent(run, &err)) << err;
  EXPECT_EQ(0700u, Mode(run));
  // Run again over the directory it made: still accepted.
  EXPECT_EQ(0, RunAgent(run, &err)) << err;
}

}  // namespace run_dir_test
}  // namespace lifeline::agent
