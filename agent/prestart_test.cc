#include "agent/prestart.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace lifeline::agent {
namespace prestart_test {

namespace fs = std::filesystem;

const std::string kBootstrap = std::string(LIFELINE_SOURCE_DIR) + "/lib/python/lifeline_startup/_lifeline_prestart.py";
const std::string kAnyFile = std::string(LIFELINE_SOURCE_DIR) + "/agent/prestart_test.cc";

std::string Python() {
  for (const char* p : {"/usr/bin/python3", "/usr/local/bin/python3"})
    if (access(p, X_OK) == 0) return p;
  return "python3";
}

class PrestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lifeline-prestart-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream(path) << text;
    return path;
  }

  // Everything the process writes to `fd` until it closes it (bounded by 60 s).
  static std::string ReadAll(int fd) {
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n == 0) break;
      if (n > 0) text.append(buf, static_cast<size_t>(n));
    }
    return text;
  }

  static int Wait(pid_t pid) {
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    return status;
  }

  std::string dir_;
};

TEST(ParsePythonScript, APythonInterpreterRunningAScriptFileIsPrestarted) {
  const std::string script = kAnyFile;  // any regular file will do
  auto p = ParsePythonScript({"python3", script, "--steps", "8"});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->interpreter, (std::vector<std::string>{"python3"}));
  EXPECT_EQ(p->script, script);
  EXPECT_EQ(p->args, (std::vector<std::string>{"--steps", "8"}));

  p = ParsePythonScript({"/opt/venv/bin/python3.11", "-u", "-X", "dev", "-Wignore", "-OO", script});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->interpreter, (std::vector<std::string>{"/opt/venv/bin/python3.11", "-u", "-X", "dev", "-Wignore", "-OO"}));
  EXPECT_TRUE(p->args.empty());
  EXPECT_TRUE(ParsePythonScript({"python", script}).has_value());
}

TEST(ParsePythonScript, AnythingElseStartsAfresh) {
  const std::string script = kAnyFile;
  EXPECT_FALSE(ParsePythonScript({}).has_value());
  EXPECT_FALSE(ParsePythonScript({"python3", "-m", "train"}).has_value());
  EXPECT_FALSE(ParsePythonScript({"python3", "-c", "print(1)"}).has_value());
  EXPECT_FALSE(ParsePythonScript({"python3", "-uc", "print(1)"}).has_value());
  EXPECT_FALSE(ParsePythonScript({"python3", "-", script}).has_value());
  EXPECT_FALSE(ParsePythonScript({"python3", "-u"}).has_value());
  EXPECT_FALSE(ParsePythonScript({"python3", "/nonexistent/train.py"}).has_value());
  EXPECT_FALSE(ParsePythonScript({"bash", script}).has_value());
  EXPECT_FALSE(ParsePythonScript({"torchrun", "--nproc-per-node", "2", script}).has_value());
  EXPECT_FALSE(ParsePythonScript({"pythonista", script}).has_value());
  EXPECT_FALSE(ParsePythonScript({"python3", "-X"}).has_value());
}

// A spare imports the script's imports before it is needed, then runs the script as `python
// SCRIPT ARGS` would, under the environment it is handed and nothing of its own.
TEST_F(PrestartTest, ASpareRunsTheScriptUnderTheEnvironmentItIsHanded) {
  const std::string script = Write("job/train.py",
                                   "import sys\n"
                                   "preloaded = 'json' in sys.modules and 'helper' not in sys.modules\n"
                                   "import os, json\n"
                                   "import helper\n"
                                   "print(json.dumps({'preloaded': preloaded, 'name': __name__, 'argv': sys.argv,\n"
                                   "  'path0': sys.path[0], 'rank': os.environ.get('RANK'), 'extra': os.environ.get('EXTRA'),\n"
                                   "  'prestart': os.environ.get('LIFELINE_PRESTART'), 'helper': helper.VALUE,\n"
                                   "  'odd': os.environb.get(b'ODD', b'').hex()}), flush=True)\n"
                                   "sys.exit(int(sys.argv[2]))\n");
  // A module beside the script: left to the script (it may read the rank's variables).
  Write("job/helper.py", "import os\nVALUE = os.environ.get('RANK')\n");
  auto command = ParsePythonScript({Python(), script, "--code", "5"});
  ASSERT_TRUE(command.has_value());
  SparePool pool(*command, kBootstrap);
  std::map<std::string, std::string> base = {{"PATH", "/usr/bin:/bin"}, {"LIFELINE_PRESTART", "1"}, {"STALE", "x"}};
  pool.Fill(2, base);
  ASSERT_EQ(pool.waiting(), 2u) << pool.failure();
  EXPECT_EQ(pool.pids().size(), 2u);
  pool.Fill(2, base);  // already full: nothing more
  EXPECT_EQ(pool.waiting(), 2u);

  std::map<std::string, std::string> env = {{"PATH", "/usr/bin:/bin"}, {"RANK", "7"}, {"EXTRA", "yes"},
                                            {"ODD", std::string("\xff\x01", 2)}};
  std::optional<ChildProcess> child = pool.Hand(env);
  ASSERT_TRUE(child.has_value()) << pool.failure();
  EXPECT_EQ(pool.waiting(), 1u);
  const std::string out = ReadAll(child->out_fd);
  const int status = Wait(child->pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 5) << status << " " << out;
  EXPECT_NE(out.find("\"preloaded\": true"), std::string::npos) << out;
  EXPECT_NE(out.find("\"name\": \"__main__\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"argv\": [\"" + script + "\", \"--code\", \"5\"]"), std::string::npos) << out;
  EXPECT_NE(out.find("\"path0\": \"" + dir_ + "/job\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"rank\": \"7\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"helper\": \"7\""), std::string::npos) << out;  // imported under the rank's environment
  EXPECT_NE(out.find("\"extra\": \"yes\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"prestart\": null"), std::string::npos) << out;
  EXPECT_NE(out.find("\"odd\": \"ff01\""), std::string::npos) << out;
  EXPECT_EQ(out.find("STALE"), std::string::npos) << out;
  close(child->out_fd);
  close(child->err_fd);
  EXPECT_TRUE(pool.failure().empty()) << pool.failure();
}

TEST_F(PrestartTest, RetiredSparesExitWithoutRunningTheScript) {
  const std::string marker = dir_ + "/ran";
  const std::string script = Write("job/train.py", "open('" + marker + "', 'w').write('ran')\n");
  std::vector<pid_t> pids;
  {
    SparePool pool(*ParsePythonScript({Python(), script}), kBootstrap);
    pool.Fill(2, {{"PATH", "/usr/bin:/bin"}});
    ASSERT_EQ(pool.waiting(), 2u) << pool.failure();
    pids = pool.pids();
  }
  for (pid_t pid : pids) EXPECT_NE(kill(pid, 0), 0) << "spare " << pid << " outlived its pool";
  EXPECT_FALSE(fs::exists(marker)) << "a retired spare ran the script";
}

// A spare that ends before it is needed (here a module it imports ahead ends the process) turns
// the spares off, says why, and the rank is left to a fresh process.
TEST_F(PrestartTest, ASpareThatEndsEarlyIsReportedAndNotHandedARank) {
  Write("site/fragile.py", "import os, sys\nif os.environ.get('LIFELINE_PRESTART'):\n"
                           "    print('fragile: cannot start here', file=sys.stderr, flush=True)\n    os._exit(3)\n");
  const std::string script = Write("job/train.py", "import fragile\n");
  SparePool pool(*ParsePythonScript({Python(), script}), kBootstrap);
  pool.Fill(1, {{"PATH", "/usr/bin:/bin"}, {"PYTHONPATH", dir_ + "/site"}, {"LIFELINE_PRESTART", "1"}});
  ASSERT_EQ(pool.waiting(), 1u) << pool.failure();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (pool.waiting() > 0 && std::chrono::steady_clock::now() < deadline) {
    pool.Collect();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(pool.waiting(), 0u);
  EXPECT_NE(pool.failure().find("ended before it was needed (exit code 3: fragile: cannot start here)"), std::string::npos)
      << pool.failure();
  EXPECT_FALSE(pool.Hand({{"RANK", "0"}}).has_value());
  pool.Fill(1, {{"PATH", "/usr/bin:/bin"}});  // turned off: nothing more is started
  EXPECT_EQ(pool.waiting(), 0u);
}

// A spare killed while it waits is found at the hand-over: the rank is not given to it.
TEST_F(PrestartTest, AKilledSpareIsPassedOverAtTheHandOver) {
  const std::string script = Write("job/train.py", "print('ran', flush=True)\n");
  SparePool pool(*ParsePythonScript({Python(), script}), kBootstrap);
  pool.Fill(2, {{"PATH", "/usr/bin:/bin"}});
  ASSERT_EQ(pool.waiting(), 2u) << pool.failure();
  const pid_t first = pool.pids()[0];
  ASSERT_EQ(kill(first, SIGKILL), 0);
  // Reaped or not by the time of the hand-over, the dead spare is never the one handed the rank.
  while (kill(first, 0) == 0) {
    int status = 0;
    if (waitpid(first, &status, WNOHANG) == first) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::optional<ChildProcess> child = pool.Hand({{"PATH", "/usr/bin:/bin"}, {"RANK", "1"}});
  ASSERT_TRUE(child.has_value()) << pool.failure();
  EXPECT_NE(child->pid, first);
  EXPECT_NE(ReadAll(child->out_fd).find("ran"), std::string::npos);
  Wait(child->pid);
  close(child->out_fd);
  close(child->err_fd);
  EXPECT_FALSE(pool.failure().empty());
}

}  // namespace prestart_test
}  // namespace lifeline::agent
