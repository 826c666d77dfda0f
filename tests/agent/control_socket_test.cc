// The agent's control socket: requests reach the handler and its reply comes back; the socket is
// private to the agent's user (mode 0600, a directory only we can change, SO_PEERCRED for anyone
// who still gets through); stale, live and foreign files at the path are told apart; a silent or
// oversized client cannot hold the agent up.
//
// The tests that connect as another user fork a child that drops to uid/gid 65534 (nobody); they
// need root and are skipped otherwise.
#include "agent/control_socket.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace lifeline::agent {
namespace control_socket_test {

using Clock = std::chrono::steady_clock;

constexpr uid_t kNobody = 65534;

class ControlSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lifeline-ctl-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/agent.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Serves `sock` until `done` returns true (checked between polls) or 20 s pass.
  static void ServeUntil(ControlSocket& sock, const ControlSocket::Handler& handler,
                         const std::function<bool()>& done) {
    const auto give_up = Clock::now() + std::chrono::seconds(20);
    while (!done() && Clock::now() < give_up) {
      pollfd p{sock.fd(), POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) sock.ServePending(handler);
    }
  }

  // Sends `request` from another thread while this one serves; returns the client's result.
  static Result<std::string> RoundTrip(ControlSocket& sock, const std::string& request,
                                       const ControlSocket::Handler& handler) {
    std::atomic<bool> finished{false};
    Result<std::string> result = Status::Aborted("client did not run");
    std::thread client([&] {
      result = ControlRequest(sock.path(), request, 10);
      finished = true;
    });
    ServeUntil(sock, handler, [&] { return finished.load(); });
    client.join();
    return result;
  }

  // Runs ControlRequest(path_, "status") in a child process as uid/gid 65534, serving `sock`
  // meanwhile. Returns "ok:<reply>", "err:<status>", or "skip:<why>" when the child could not
  // change its identity.
  static std::string RequestAsNobody(ControlSocket& sock, const ControlSocket::Handler& handler) {
    int fds[2];
    if (::pipe(fds) != 0) return "skip:pipe failed";
    const pid_t pid = ::fork();
    if (pid < 0) return "skip:fork failed";
    if (pid == 0) {
      ::close(fds[0]);
      std::string out;
      if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
        out = std::string("skip:cannot become uid 65534: ") + std::strerror(errno);
      } else {
        Result<std::string> r = ControlRequest(sock.path(), "status", 10);
        out = r.ok() ? "ok:" + *r : "err:" + r.status().ToString();
      }
      if (::write(fds[1], out.data(), out.size()) < 0) _exit(2);
      _exit(0);
    }
    ::close(fds[1]);
    int wstatus = 0;
    bool exited = false;
    ServeUntil(sock, handler, [&] {
      exited = ::waitpid(pid, &wstatus, WNOHANG) == pid;
      return exited;
    });
    if (!exited) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &wstatus, 0);
    }
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    return out;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(ControlSocketTest, RequestGetsTheHandlersReply) {
  auto sock = ControlSocket::Listen(path_);
  ASSERT_TRUE(sock.ok()) << sock.status().ToString();
  EXPECT_EQ((*sock)->path(), path_);

  std::string seen;
  Result<std::string> r = RoundTrip(**sock, "status --json", [&](const std::string& req) {
    seen = req;
    return "ok: " + req;
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "ok: status --json");
  EXPECT_EQ(seen, "status --json");

  // A multi-line reply that ends with its own newline comes back whole, minus that newline.
  r = RoundTrip(**sock, "dump", [](const std::string&) { return std::string("line 1\nline 2\n"); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "line 1\nline 2");
}

TEST_F(ControlSocketTest, SocketFileIsPrivateAndRemovedAtClose) {
  {
    auto sock = ControlSocket::Listen(path_);
    ASSERT_TRUE(sock.ok()) << sock.status().ToString();
    struct stat st;
    ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    EXPECT_EQ(st.st_uid, ::geteuid());
  }
  EXPECT_FALSE(std::filesystem::exists(path_));
}

TEST_F(ControlSocketTest, RefusesADirectoryOthersCanWrite) {
  for (mode_t mode : {mode_t{0777}, mode_t{0770}, mode_t{01777}}) {
    ASSERT_EQ(::chmod(dir_.c_str(), mode), 0);
    auto sock = ControlSocket::Listen(path_);
    ASSERT_FALSE(sock.ok()) << std::oct << mode;
    EXPECT_EQ(sock.status().code(), StatusCode::kFailedPrecondition) << sock.status().ToString();
    EXPECT_NE(sock.status().message().find(dir_), std::string::npos) << sock.status().message();
    EXPECT_FALSE(std::filesystem::exists(path_));
  }
}

TEST_F(ControlSocketTest, RefusesADirectoryOfAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the directory to another user";
  ASSERT_EQ(::chown(dir_.c_str(), kNobody, kNobody), 0);
  auto sock = ControlSocket::Listen(path_);
  ASSERT_FALSE(sock.ok());
  EXPECT_EQ(sock.status().code(), StatusCode::kFailedPrecondition) << sock.status().ToString();
  EXPECT_NE(sock.status().message().find("owned by uid 65534"), std::string::npos) << sock.status().message();
}

TEST_F(ControlSocketTest, ReplacesAStaleSocketButNotALiveOneOrAForeignFile) {
  {
    // A socket file whose listener is gone, as a crashed agent leaves it.
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  ASSERT_TRUE(std::filesystem::exists(path_));
  auto first = ControlSocket::Listen(path_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();

  // A second agent on the same path must not steal the first one's socket.
  auto second = ControlSocket::Listen(path_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().ToString();
  EXPECT_NE(second.status().message().find("listening"), std::string::npos) << second.status().message();
  (*first)->ServePending([](const std::string&) { return std::string("unused"); });  // the probe
  first = Status::Aborted("closed");
  EXPECT_FALSE(std::filesystem::exists(path_));

  std::ofstream(path_) << "not a socket";
  auto third = ControlSocket::Listen(path_);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kAlreadyExists) << third.status().ToString();
  std::ifstream in(path_);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "not a socket");  // left alone
}

TEST_F(ControlSocketTest, SilentClientDoesNotHoldTheAgent) {
  auto sock = ControlSocket::Listen(path_);
  ASSERT_TRUE(sock.ok()) << sock.status().ToString();

  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);

  int calls = 0;
  const auto start = Clock::now();
  (*sock)->ServePending([&](const std::string&) {
    ++calls;
    return std::string("unused");
  });
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(secs, 10.0);  // 1 s by design; generous for a loaded machine
  EXPECT_EQ(calls, 0);

  char buf[256] = {};
  const ssize_t n = ::recv(fd, buf, sizeof(buf) - 1, 0);
  ::close(fd);
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(buf).find("error: no request line"), std::string::npos) << buf;
}

TEST_F(ControlSocketTest, OversizedRequestIsRefused) {
  auto sock = ControlSocket::Listen(path_);
  ASSERT_TRUE(sock.ok()) << sock.status().ToString();
  int calls = 0;
  Result<std::string> r = RoundTrip(**sock, std::string(70 * 1024, 'x'), [&](const std::string&) {
    ++calls;
    return std::string("unused");
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->find("error: request longer than 65536 bytes"), std::string::npos) << *r;
  EXPECT_EQ(calls, 0);
}

TEST_F(ControlSocketTest, ClientErrorsNameThePath) {
  Result<std::string> r = ControlRequest(path_, "status", 1);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path_), std::string::npos) << r.status().message();

  r = ControlRequest(path_, "two\nlines", 1);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
}

TEST_F(ControlSocketTest, AgentThatNeverAnswersTimesOut) {
  auto sock = ControlSocket::Listen(path_);
  ASSERT_TRUE(sock.ok()) << sock.status().ToString();
  // Nobody calls ServePending: the connection sits in the backlog.
  Result<std::string> r = ControlRequest(path_, "status", 0.2);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path_), std::string::npos) << r.status().message();
}

// With the socket file at 0600, the kernel already refuses connect() to another user (EACCES),
// before the agent sees anything.
TEST_F(ControlSocketTest, OtherUserCannotConnectToThePrivateSocket) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (65534)";
  ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);  // let nobody reach the socket, so only its mode stops it
  auto sock = ControlSocket::Listen(path_);
  ASSERT_TRUE(sock.ok()) << sock.status().ToString();

  int calls = 0;
  const std::string out = RequestAsNobody(**sock, [&](const std::string&) {
    ++calls;
    return std::string("secret");
  });
  if (out.rfind("skip:", 0) == 0) GTEST_SKIP() << out.substr(5);
  EXPECT_EQ(out.rfind("err:", 0), 0u) << out;
  EXPECT_NE(out.find("Permission denied"), std::string::npos) << out;
  EXPECT_NE(out.find(path_), std::string::npos) << out;
  EXPECT_EQ(calls, 0);
}

// If the file mode is opened up (by mistake, or by whoever owns the directory), the agent's
// SO_PEERCRED check still turns the other user away, and the handler never runs.
TEST_F(ControlSocketTest, PeerOfAnotherUidIsRefusedEvenWhenTheModeAllowsIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid (65534)";
  ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);
  auto sock = ControlSocket::Listen(path_);
  ASSERT_TRUE(sock.ok()) << sock.status().ToString();
  ASSERT_EQ(::chmod(path_.c_str(), 0666), 0);

  int calls = 0;
  const std::string out = RequestAsNobody(**sock, [&](const std::string&) {
    ++calls;
    return std::string("secret");
  });
  if (out.rfind("skip:", 0) == 0) GTEST_SKIP() << out.substr(5);
  EXPECT_EQ(out, "ok:error: permission denied: uid 65534 is not the agent's user");
  EXPECT_EQ(calls, 0);

  // The agent's own user is still served on the same socket.
  Result<std::string> r = RoundTrip(**sock, "status", [](const std::string&) { return std::string("fine"); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "fine");
}

}  // namespace control_socket_test
}  // namespace lifeline::agent
