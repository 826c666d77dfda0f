// The agent's HTTP server: scrapes are answered whatever other clients do (half a request held
// open, a head trickled byte by byte, more connections than it keeps), a bad request gets its
// error status, and HEAD has no body.
#include "agent/net/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lib/net/socket.h"

namespace lifeline::net {
namespace http_server_test {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Bounds that a loaded machine holds; what is tested is that the answer comes, not how fast.
constexpr seconds kGenerous{10};

const char kBody[] = "lifeline_test_metric 1\n";

// A server on a port of 127.0.0.1 the kernel picked.
std::unique_ptr<HttpServer> StartServer(HttpServerOptions options = {}) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 64) != 0) {
    ADD_FAILURE() << "cannot listen on 127.0.0.1: " << strerror(errno);
    return nullptr;
  }
  HttpResource resource{"/metrics", "text/plain; version=0.0.4; charset=utf-8", [] { return std::string(kBody); }};
  auto server = HttpServer::Start(fd, std::move(resource), options);
  if (!server.ok()) {
    ADD_FAILURE() << server.status().ToString();
    return nullptr;
  }
  EXPECT_NE((*server)->port(), 0);
  return std::move(*server);
}

int Dial(const HttpServer& server) {
  auto fd = Connect("127.0.0.1", server.port(), Clock::now() + kGenerous);
  EXPECT_TRUE(fd.ok()) << fd.status().ToString();
  return fd.ok() ? *fd : -1;
}

// What the server sent on `fd` until it closed the connection; `closed` false when it had not
// by `deadline`.
struct Reply {
  std::string bytes;
  bool closed = false;
  int error = 0;  // errno when the connection ended by a reset rather than a close
};
Reply ReadUntilClosed(int fd, Clock::time_point deadline) {
  Reply reply;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int left = static_cast<int>(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
    if (left <= 0 || ::poll(&p, 1, left) != 1) return reply;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      reply.bytes.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    reply.closed = true;
    reply.error = n < 0 ? errno : 0;
    return reply;
  }
}

// One request on a connection of its own, the whole reply.
Reply Exchange(const HttpServer& server, const std::string& request) {
  const int fd = Dial(server);
  if (fd < 0) return {};
  EXPECT_TRUE(SendAll(fd, request.data(), request.size(), "the server").ok());
  Reply reply = ReadUntilClosed(fd, Clock::now() + kGenerous);
  ::close(fd);
  return reply;
}

// True when the server has neither sent anything on `fd` nor closed it.
bool StillOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

std::string StatusLine(const std::string& reply) { return reply.substr(0, reply.find("\r\n")); }

TEST(HttpServerTest, ScrapeIsAnsweredWhileOtherClientsHoldHalfARequestOpen) {
  HttpServerOptions options;
  options.head_timeout = seconds(60);  // the half requests are all still open when the scrape ends
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  std::vector<int> holders;
  for (int i = 0; i < 12; ++i) {
    const int fd = Dial(*server);
    ASSERT_GE(fd, 0);
    const std::string half = "GET /metrics HTTP/1.1\r\nHost: lo";
    ASSERT_TRUE(SendAll(fd, half.data(), half.size(), "the server").ok());
    holders.push_back(fd);
  }
  const Reply reply = Exchange(*server, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
  ASSERT_TRUE(reply.closed) << "no complete answer within " << kGenerous.count() << " s: " << reply.bytes;
  EXPECT_EQ(StatusLine(reply.bytes), "HTTP/1.1 200 OK");
  EXPECT_NE(reply.bytes.find("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(reply.bytes.find("\r\nConnection: close\r\n"), std::string::npos);
  EXPECT_EQ(reply.bytes.substr(reply.bytes.find("\r\n\r\n") + 4), kBody);
  for (int fd : holders) {
    EXPECT_TRUE(StillOpen(fd)) << "a half request was dropped before its deadline";
    ::close(fd);
  }
}

TEST(HttpServerTest, ClientSilentAfterHalfARequestIsClosedAtItsDeadline) {
  HttpServerOptions options;
  options.head_timeout = milliseconds(200);
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const int fd = Dial(*server);
  ASSERT_GE(fd, 0);
  const auto start = Clock::now();
  const std::string half = "GET /metrics HTTP/1.1\r\n";
  ASSERT_TRUE(SendAll(fd, half.data(), half.size(), "the server").ok());
  const Reply reply = ReadUntilClosed(fd, start + kGenerous);
  EXPECT_TRUE(reply.closed) << "still open after " << kGenerous.count() << " s";
  EXPECT_EQ(reply.error, 0) << strerror(reply.error);
  EXPECT_EQ(reply.bytes, "") << "an unfinished request is dropped unanswered";
  EXPECT_GE(Clock::now() - start, milliseconds(150)) << "closed well before its deadline";
  ::close(fd);
}

TEST(HttpServerTest, ClientTricklingItsHeadIsClosedAtItsDeadline) {
  // Each byte is progress, but the deadline is for the whole head: trickling does not move it.
  HttpServerOptions options;
  options.head_timeout = milliseconds(200);
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  const int fd = Dial(*server);
  ASSERT_GE(fd, 0);
  const auto deadline = Clock::now() + kGenerous;
  const std::string head = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + std::string(4000, 'x');
  bool closed = false;
  for (size_t i = 0; !closed && Clock::now() < deadline; i = (i + 1) % head.size()) {
    if (::send(fd, &head[i], 1, MSG_NOSIGNAL) != 1) break;  // reset by the server: closed
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) == 1) {
      char c;
      const ssize_t n = ::recv(fd, &c, 1, 0);
      closed = n == 0 || (n < 0 && errno == ECONNRESET);
      EXPECT_TRUE(closed) << "the server answered an unfinished head";
      break;
    }
  }
  EXPECT_LT(Clock::now(), deadline) << "still open after " << kGenerous.count() << " s";
  ::close(fd);
}

TEST(HttpServerTest, OversizedHeadIsRefused) {
  auto server = StartServer();  // 8 KiB at most
  ASSERT_NE(server, nullptr);
  std::string request = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n";
  while (request.size() < 16384) request += "X-Padding: " + std::string(100, 'p') + "\r\n";
  request += "\r\n";
  EXPECT_EQ(StatusLine(Exchange(*server, request).bytes), "HTTP/1.1 431 Request Header Fields Too Large");

  // Never ending: refused all the same, once past the cap.
  const int fd = Dial(*server);
  ASSERT_GE(fd, 0);
  const std::string endless = "GET /metrics HTTP/1.1\r\nX-Padding: " + std::string(9000, 'p');
  ASSERT_TRUE(SendAll(fd, endless.data(), endless.size(), "the server").ok());
  const Reply reply = ReadUntilClosed(fd, Clock::now() + kGenerous);
  EXPECT_TRUE(reply.closed);
  EXPECT_EQ(StatusLine(reply.bytes), "HTTP/1.1 431 Request Header Fields Too Large");
  ::close(fd);
}

TEST(HttpServerTest, OtherPathsAre404OtherMethods405AndNonsense400) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(StatusLine(Exchange(*server, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").bytes), "HTTP/1.1 404 Not Found");
  EXPECT_EQ(StatusLine(Exchange(*server, "GET /metricsx HTTP/1.0\r\n\r\n").bytes), "HTTP/1.1 404 Not Found");
  const Reply post = Exchange(*server, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(StatusLine(post.bytes), "HTTP/1.1 405 Method Not Allowed");
  EXPECT_NE(post.bytes.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << post.bytes;
  EXPECT_EQ(StatusLine(Exchange(*server, "hello\r\n\r\n").bytes), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(StatusLine(Exchange(*server, "GET /metrics HTTP/2.0\r\n\r\n").bytes), "HTTP/1.1 400 Bad Request");
  // A query string is no other resource; a bare LF ends lines as CRLF does.
  EXPECT_EQ(StatusLine(Exchange(*server, "GET /metrics?debug=1 HTTP/1.1\r\nHost: x\r\n\r\n").bytes), "HTTP/1.1 200 OK");
  EXPECT_EQ(StatusLine(Exchange(*server, "GET /metrics HTTP/1.0\n\n").bytes), "HTTP/1.1 200 OK");
}

TEST(HttpServerTest, HeadHasTheHeadersOfGetButNoBody) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const Reply reply = Exchange(*server, "HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
  ASSERT_TRUE(reply.closed);
  EXPECT_EQ(StatusLine(reply.bytes), "HTTP/1.1 200 OK");
  EXPECT_NE(reply.bytes.find("\r\nContent-Length: " + std::to_string(sizeof(kBody) - 1) + "\r\n"), std::string::npos)
      << reply.bytes;
  ASSERT_NE(reply.bytes.find("\r\n\r\n"), std::string::npos);
  EXPECT_EQ(reply.bytes.find("\r\n\r\n") + 4, reply.bytes.size()) << "a body after HEAD: " << reply.bytes;
}

TEST(HttpServerTest, ConnectionIdleLongestMakesWayWhenFull) {
  HttpServerOptions options;
  options.max_connections = 4;
  options.head_timeout = seconds(60);
  auto server = StartServer(options);
  ASSERT_NE(server, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(Dial(*server));
    ASSERT_GE(idle.back(), 0);
    std::this_thread::sleep_for(milliseconds(20));  // so the first is idle longest, whatever the clock's grain
  }
  const Reply reply = Exchange(*server, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_TRUE(reply.closed);
  EXPECT_EQ(StatusLine(reply.bytes), "HTTP/1.1 200 OK");
  const Reply first = ReadUntilClosed(idle[0], Clock::now() + kGenerous);
  EXPECT_TRUE(first.closed) << "the connection idle longest was kept";
  for (size_t i = 1; i < idle.size(); ++i) EXPECT_TRUE(StillOpen(idle[i])) << "connection " << i;
  for (int fd : idle) ::close(fd);
}

TEST(HttpServerTest, StopsWithConnectionsOpenAndClosesThem) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const int fd = Dial(*server);
  ASSERT_GE(fd, 0);
  const std::string half = "GET /met";
  ASSERT_TRUE(SendAll(fd, half.data(), half.size(), "the server").ok());
  std::this_thread::sleep_for(milliseconds(50));  // accepted, most likely; the test holds either way
  server.reset();
  const Reply reply = ReadUntilClosed(fd, Clock::now() + kGenerous);
  EXPECT_TRUE(reply.closed);
  ::close(fd);
}

}  // namespace http_server_test
}  // namespace lifeline::net
