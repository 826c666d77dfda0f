#include "agent/net/http_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <system_error>
#include <utility>
#include <vector>

#include "lib/net/socket.h"

namespace lifeline::net {
namespace {

// After the response: how long the connection is read from (and what comes discarded) before it
// is closed. Closing with unread bytes would reset it, and a reset can destroy the response before
// the client reads it (a refused oversized head is the usual case).
constexpr std::chrono::milliseconds kLinger{1000};
// After accept() fails for want of descriptors or memory: how long to wait before trying again
// (the listening socket stays readable, so poll() would otherwise spin).
constexpr std::chrono::milliseconds kAcceptBackoff{100};
// Connections accepted in one turn of the loop, so a burst cannot starve those already open.
constexpr int kAcceptsPerTurn = 64;
// Bytes read from one connection in one turn, for the same reason.
constexpr size_t kReadPerTurn = 64 * 1024;

enum class Phase { kHead, kResponse, kLinger };

struct Connection {
  int fd = -1;
  Phase phase = Phase::kHead;
  std::string in;   // the request head so far
  std::string out;  // the response
  size_t sent = 0;
  Clock::time_point deadline;  // of the current phase
  Clock::time_point active;    // last byte moved either way: the idle-longest goes first
};

// The length of the head in `in` up to and with the blank line that ends it, or npos. A bare LF
// ends lines too (RFC 9112 lets a server accept it).
size_t HeadLength(const std::string& in) {
  const size_t crlf = in.find("\r\n\r\n");
  const size_t lf = in.find("\n\n");
  if (crlf == std::string::npos && lf == std::string::npos) return std::string::npos;
  if (lf == std::string::npos || (crlf != std::string::npos && crlf < lf)) return crlf + 4;
  return lf + 2;
}

void Respond(Connection& c, Clock::time_point now, const HttpServerOptions& options, const char* status,
             const std::string& content_type, const std::string& extra_headers, const std::string& body,
             bool send_body) {
  c.out = std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + content_type +
          "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n" + extra_headers + "\r\n";
  if (send_body) c.out += body;
  c.sent = 0;
  c.in = std::string();
  c.phase = Phase::kResponse;
  c.deadline = now + options.response_timeout;
}

void RespondError(Connection& c, Clock::time_point now, const HttpServerOptions& options, const char* status,
                  bool send_body = true, const std::string& extra_headers = "") {
  Respond(c, now, options, status, "text/plain; charset=utf-8", extra_headers, std::string(status) + "\n", send_body);
}

// Turns the complete head of `c` (`head` bytes long) into its response.
void Answer(Connection& c, size_t head, Clock::time_point now, const HttpResource& resource,
            const HttpServerOptions& options) {
  // The request line: METHOD SP TARGET SP HTTP/1.x. The header fields are not needed.
  std::string line = c.in.substr(0, std::min(c.in.find('\n'), head));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.find(' ', sp2 + 1) != std::string::npos || sp1 == 0 || sp2 == sp1 + 1 ||
      (line.compare(sp2 + 1, std::string::npos, "HTTP/1.0") != 0 &&
       line.compare(sp2 + 1, std::string::npos, "HTTP/1.1") != 0)) {
    RespondError(c, now, options, "400 Bad Request");
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find_first_of("?#"));  // a query changes nothing here
  const bool head_only = method == "HEAD";
  if (path != resource.path) {
    RespondError(c, now, options, "404 Not Found", !head_only);
  } else if (method != "GET" && !head_only) {
    RespondError(c, now, options, "405 Method Not Allowed", true, "Allow: GET, HEAD\r\n");
  } else {
    std::string body;
    try {
      body = resource.render();
    } catch (const std::exception&) {  // out of memory: this request fails, the server goes on
      RespondError(c, now, options, "500 Internal Server Error", !head_only);
      return;
    }
    Respond(c, now, options, "200 OK", resource.content_type, "", body, !head_only);
  }
}

// Sends what is left of the response; true while the connection stays open.
bool Write(Connection& c, Clock::time_point now) {
  while (c.sent < c.out.size()) {
    const ssize_t w = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (w > 0) {
      c.sent += static_cast<size_t>(w);
      c.active = now;
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else {
      return w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }
  c.out = std::string();
  ::shutdown(c.fd, SHUT_WR);  // the client sees the end now, whatever it still sends
  c.phase = Phase::kLinger;
  c.deadline = now + kLinger;
  return true;
}

// Reads what the client sent (the head, or in the linger what it still sends, discarded); true
// while the connection stays open.
bool Read(Connection& c, Clock::time_point now, const HttpResource& resource, const HttpServerOptions& options) {
  char buf[4096];
  for (size_t total = 0; total < kReadPerTurn;) {
    const ssize_t r = ::recv(c.fd, buf, sizeof(buf), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    if (r == 0) return false;  // the client is gone or done: nothing to answer
    total += static_cast<size_t>(r);
    c.active = now;
    if (c.phase != Phase::kHead) continue;
    c.in.append(buf, static_cast<size_t>(r));
    const size_t head = HeadLength(c.in);
    if (head != std::string::npos && head <= options.max_head_bytes) {
      Answer(c, head, now, resource, options);
      return Write(c, now);
    }
    if (head != std::string::npos || c.in.size() > options.max_head_bytes) {
      RespondError(c, now, options, "431 Request Header Fields Too Large");
      return Write(c, now);
    }
  }
  return true;
}

void CloseIdleLongest(std::vector<Connection>& conns) {
  auto oldest = std::min_element(conns.begin(), conns.end(),
                                 [](const Connection& a, const Connection& b) { return a.active < b.active; });
  ::close(oldest->fd);
  conns.erase(oldest);
}

// Takes the connections waiting on `listen_fd`.
void Accept(int listen_fd, Clock::time_point now, const HttpServerOptions& options, std::vector<Connection>& conns,
            Clock::time_point& accept_again) {
  for (int k = 0; k < kAcceptsPerTurn; ++k) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // A connection reset before it was taken, or a network error on it (accept(2) lists these
      // as to be retried): the next one may be fine.
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == ENETDOWN || errno == ENOPROTOOPT ||
          errno == EHOSTDOWN || errno == ENONET || errno == EHOSTUNREACH || errno == EOPNOTSUPP ||
          errno == ENETUNREACH)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) accept_again = now + kAcceptBackoff;  // EMFILE, ENOBUFS...
      return;
    }
    // Full: the newcomer wins over whoever has been silent longest, so holding connections open
    // cannot lock the scraper out.
    if (conns.size() >= std::max<size_t>(options.max_connections, 1)) CloseIdleLongest(conns);
    Connection c;
    c.fd = fd;
    c.deadline = now + options.head_timeout;
    c.active = now;
    conns.push_back(std::move(c));
  }
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Start(int listen_fd, HttpResource resource, HttpServerOptions options) {
  SetBlocking(listen_fd, false);  // a connection reset between poll() and accept() must not block the thread
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    Status s = Status::FromErrno(errno, "eventfd for the HTTP server");
    ::close(listen_fd);
    return s;
  }
  std::unique_ptr<HttpServer> server(new HttpServer(listen_fd, wake, std::move(resource), options));
  try {
    server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  } catch (const std::system_error& e) {
    return Status::ResourceExhausted("HTTP server thread", e.what());  // ~HttpServer closes both descriptors
  }
  return server;
}

HttpServer::HttpServer(int listen_fd, int wake_fd, HttpResource resource, HttpServerOptions options)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      resource_(std::move(resource)),
      options_(options),
      port_(LocalPort(listen_fd)) {}

HttpServer::~HttpServer() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  ::close(wake_fd_);
  ::close(listen_fd_);
}

void HttpServer::Loop() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  Clock::time_point accept_again{};
  for (;;) {
    Clock::time_point now = Clock::now();
    const bool accepting = now >= accept_again;
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // poll() skips a negative descriptor
    Clock::time_point next = accepting ? Clock::time_point::max() : accept_again;
    for (const Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.phase == Phase::kResponse ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    int timeout_ms = -1;
    if (next != Clock::time_point::max())
      timeout_ms = static_cast<int>(
          std::clamp<int64_t>(std::chrono::ceil<std::chrono::milliseconds>(next - now).count(), 0, 60000));
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      // Only ENOMEM is possible here; try again shortly rather than spin.
      ::poll(nullptr, 0, 10);
      continue;
    }
    if (fds[0].revents != 0) break;
    now = Clock::now();
    size_t kept = 0;
    for (size_t i = 0; i < conns.size(); ++i) {
      Connection& c = conns[i];
      const short revents = fds[i + 2].revents;
      bool open = true;
      if (revents & POLLNVAL) {
        open = false;
      } else if (c.phase == Phase::kResponse && (revents & (POLLOUT | POLLERR | POLLHUP))) {
        open = Write(c, now);  // an error shows as the send's
      } else if (c.phase != Phase::kResponse && (revents & (POLLIN | POLLERR | POLLHUP))) {
        open = Read(c, now, resource_, options_);
      }
      if (open && now >= c.deadline) open = false;  // too slow in its phase: dropped unanswered
      if (open) {
        if (kept != i) conns[kept] = std::move(c);
        ++kept;
      } else {
        ::close(c.fd);
      }
    }
    conns.resize(kept);
    if (accepting && fds[1].revents != 0) Accept(listen_fd_, now, options_, conns, accept_again);
  }
  for (const Connection& c : conns) ::close(c.fd);
}

}  // namespace lifeline::net
