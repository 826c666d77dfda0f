// Test support: a real etcd (Debian's etcd-server) on free loopback ports with its data in a
// temporary directory, started and stopped by the test. Tests of the multi-node agent use it as
// their distributed store, as a real job would.
#ifndef LIFELINE_AGENT_ETCD_ETCD_TEST_SERVER_H_
#define LIFELINE_AGENT_ETCD_ETCD_TEST_SERVER_H_

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "agent/etcd/etcd_client.h"

namespace lifeline::agent::testing {

// A port that was free a moment ago.
inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

inline std::string EtcdBinary() {
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

class EtcdTestServer {
 public:
  // Starts etcd and waits until it answers. `ok()` says whether it did; `error()` why not.
  EtcdTestServer() {
    char tmpl[] = "/tmp/lifeline-etcd-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      error_ = "cannot create a data directory";
      return;
    }
    dir_ = tmpl;
    // The ports were free a moment ago; another test may take one first, and etcd then exits at
    // once: a new pair is tried (restarts keep the ports, which agents know).
    for (int attempt = 0; attempt < 4; ++attempt) {
      client_port_ = FreeLoopbackPort();
      peer_port_ = FreeLoopbackPort();
      Start();
      if (ok()) break;
      Stop();
    }
  }
  ~EtcdTestServer() {
    Stop();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  pid_t pid() const { return pid_; }

  // SIGKILL, as a crashed etcd; Start() brings it back on the same ports with the same data.
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  void Start() {
    if (pid_ > 0) return;
    const std::string binary = EtcdBinary();
    if (binary.empty()) {
      error_ = "no etcd binary (Debian: etcd-server; tools/setup installs it)";
      return;
    }
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    const std::string log = dir_ + "/etcd.log";
    pid_ = fork();
    if (pid_ == 0) {
      FILE* out = std::freopen(log.c_str(), "a", stdout);
      (void)out;
      dup2(STDOUT_FILENO, STDERR_FILENO);
      execl(binary.c_str(), binary.c_str(), "--name", "test", "--data-dir", (dir_ + "/data").c_str(),
            "--listen-client-urls", client.c_str(), "--advertise-client-urls", client.c_str(),
            "--listen-peer-urls", peer.c_str(), "--initial-advertise-peer-urls", peer.c_str(),
            "--initial-cluster", ("test=" + peer).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    Result<std::unique_ptr<EtcdClient>> c = EtcdClient::Create(endpoint(), 0.5);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (c.ok() && (*c)->Ping().ok()) {
        error_.clear();
        return;
      }
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {  // it exited: a port taken, most likely
        pid_ = -1;
        error_ = "etcd exited at start on " + endpoint() + " (log: " + log + ")";
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    error_ = "etcd did not answer on " + endpoint() + " within 20 s (log: " + log + ")";
  }

 private:
  std::string dir_;
  std::string error_;
  int client_port_ = -1;
  int peer_port_ = -1;
  pid_t pid_ = -1;
};

}  // namespace lifeline::agent::testing

#endif  // LIFELINE_AGENT_ETCD_ETCD_TEST_SERVER_H_
