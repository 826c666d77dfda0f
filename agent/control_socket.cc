#include "agent/control_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace lifeline::agent {

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kRequestTimeout = std::chrono::seconds(1);  // for the request, and again for the reply
constexpr size_t kMaxReplyBytes = size_t{64} << 20;          // a client's guard against a runaway reply

std::string OctalMode(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Fills `addr` for `path`; false when the path does not fit sun_path.
bool MakeAddress(const std::string& path, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr->sun_path)) return false;
  std::memcpy(addr->sun_path, path.data(), path.size());
  return true;
}

Status BadAddress(const std::string& path) {
  return Status::InvalidArgument("control socket " + path, "a Unix socket path must be 1.." +
                                                               std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) +
                                                               " bytes");
}

// Waits until `fd` is ready for `events` or `deadline` passes. True when ready (or in error or
// hung up: the next read or write finds out which).
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(left));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // let the caller's syscall report the error
  }
}

// Sends all of `data` on the non-blocking socket `fd` by `deadline`. Returns 0, ETIMEDOUT, or the
// errno of the failed send (EPIPE when the peer has closed).
int WriteAll(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(fd, POLLOUT, deadline)) return ETIMEDOUT;
      continue;
    }
    return n < 0 ? errno : EPIPE;
  }
  return 0;
}

// Throws away what the peer has already sent, without waiting for more: closing a Unix socket
// with unread data makes the peer's next read fail with ECONNRESET instead of a clean EOF.
void DiscardPending(int fd) {
  char buf[4096];
  for (size_t total = 0; total < ControlSocket::kMaxRequestBytes * 2;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    total += static_cast<size_t>(n);
  }
}

}  // namespace

Result<std::unique_ptr<ControlSocket>> ControlSocket::Listen(const std::string& path) {
  sockaddr_un addr;
  if (!MakeAddress(path, &addr)) return BadAddress(path);

  // The directory decides who can replace or remove the socket file; a socket in a directory
  // someone else can write to could be swapped for theirs under our clients.
  const std::string dir = ParentDir(path);
  struct stat ds;
  if (::stat(dir.c_str(), &ds) != 0) return Status::FromErrno(errno, "control socket directory " + dir);
  const uid_t me = ::geteuid();
  if (!S_ISDIR(ds.st_mode)) return Status::FailedPrecondition("control socket directory " + dir, "not a directory");
  if (ds.st_uid != me) {
    return Status::FailedPrecondition("control socket directory " + dir,
                                      "owned by uid " + std::to_string(ds.st_uid) + ", not by the agent's user (uid " +
                                          std::to_string(me) + ")");
  }
  if ((ds.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return Status::FailedPrecondition("control socket directory " + dir,
                                      "mode " + OctalMode(ds.st_mode) +
                                          " lets group or others write to it; use a directory only its owner can change");
  }

  // A socket file left by an earlier agent of ours is replaced, but only once nobody answers on it;
  // anything else at the path is not ours to delete.
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode) || st.st_uid != me) {
      return Status::AlreadyExists("control socket " + path, "exists and is not a socket of ours; not removing it");
    }
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (probe < 0) return Status::FromErrno(errno, "control socket " + path + ": socket");
    const int rc = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    const int err = errno;
    ::close(probe);
    if (rc == 0 || err == EAGAIN) {  // EAGAIN: alive, with its backlog full
      return Status::AlreadyExists("control socket " + path, "another agent is listening on it");
    }
    if (err != ECONNREFUSED) return Status::FromErrno(err, "control socket " + path + ": probing the old socket");
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::FromErrno(errno, "control socket " + path + ": removing the stale socket");
    }
  } else if (errno != ENOENT) {
    return Status::FromErrno(errno, "control socket " + path);
  }

  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, "control socket " + path + ": socket");
  // bind() creates the file with 0777 & ~umask: mask so it is born 0600, never briefly open.
  const mode_t old_mask = ::umask(0177);
  const int bind_rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int bind_err = errno;
  ::umask(old_mask);
  if (bind_rc != 0) {
    ::close(fd);
    return Status::FromErrno(bind_err, "control socket " + path + ": bind");
  }
  const auto fail = [&](const char* what) -> Status {
    const Status s = Status::FromErrno(errno, "control socket " + path + ": " + what);
    ::unlink(path.c_str());
    ::close(fd);
    return s;
  };
  // umask is per process: another thread may have changed it around our bind(); settle the mode.
  if (::chmod(path.c_str(), 0600) != 0) return fail("chmod");
  struct stat bound;
  if (::lstat(path.c_str(), &bound) != 0) return fail("stat");
  if (::listen(fd, SOMAXCONN) != 0) return fail("listen");
  return std::unique_ptr<ControlSocket>(new ControlSocket(fd, path, bound.st_dev, bound.st_ino));
}

ControlSocket::~ControlSocket() {
  ::close(fd_);
  // Remove the file only if it is still the one we bound: a newer agent may have taken the path.
  struct stat st;
  if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == dev_ && st.st_ino == ino_) {
    ::unlink(path_.c_str());
  }
}

void ControlSocket::ServePending(const Handler& handler) {
  for (int i = 0; i < kMaxPerCall; ++i) {
    const int conn = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // EAGAIN: none left. Anything else (EMFILE...) is retried at the next poll.
      return;
    }
    ServeOne(conn, handler);
    ::close(conn);
  }
}

void ControlSocket::ServeOne(int conn, const Handler& handler) {
  ucred cred;
  socklen_t len = sizeof(cred);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) return;

  auto deadline = Clock::now() + kRequestTimeout;
  if (cred.uid != ::geteuid()) {
    WriteAll(conn, "error: permission denied: uid " + std::to_string(cred.uid) + " is not the agent's user\n",
             deadline);
    DiscardPending(conn);
    return;
  }

  std::string buf;
  size_t line_end = std::string::npos;
  char chunk[4096];
  while (line_end == std::string::npos) {
    if (buf.size() > kMaxRequestBytes) {
      WriteAll(conn, "error: request longer than " + std::to_string(kMaxRequestBytes) + " bytes\n", deadline);
      DiscardPending(conn);
      return;
    }
    const size_t want = std::min(sizeof(chunk), kMaxRequestBytes + 1 - buf.size());
    const ssize_t n = ::recv(conn, chunk, want, MSG_DONTWAIT);
    if (n > 0) {
      const size_t old = buf.size();
      buf.append(chunk, static_cast<size_t>(n));
      line_end = buf.find('\n', old);
      continue;
    }
    if (n == 0) {  // EOF: an unterminated last line is still a request; nothing at all is not
      if (buf.empty()) return;
      line_end = buf.size();
      break;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return;
    if (!WaitFor(conn, POLLIN, deadline)) {
      WriteAll(conn, "error: no request line within 1 s\n", Clock::now() + std::chrono::milliseconds(100));
      return;
    }
  }
  buf.resize(line_end);
  if (!buf.empty() && buf.back() == '\r') buf.pop_back();  // from clients such as `nc -C`

  std::string reply = handler(buf);
  if (reply.empty() || reply.back() != '\n') reply.push_back('\n');
  DiscardPending(conn);  // anything sent after the line
  WriteAll(conn, reply, Clock::now() + kRequestTimeout);
}

Result<std::string> ControlRequest(const std::string& path, const std::string& request, double timeout_seconds) {
  const std::string where = "control socket " + path;
  if (request.find('\n') != std::string::npos) return Status::InvalidArgument(where, "the request contains a newline");
  if (!(timeout_seconds > 0)) return Status::InvalidArgument(where, "the timeout must be positive");
  sockaddr_un addr;
  if (!MakeAddress(path, &addr)) return BadAddress(path);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  const auto timed_out = [&](const char* stage) {
    char secs[32];
    std::snprintf(secs, sizeof(secs), "%g", timeout_seconds);
    return Status::Unavailable(where, std::string("no ") + stage + " within " + secs + " s");
  };

  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno(errno, where + ": socket");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  // A non-blocking Unix connect either completes at once or fails with EAGAIN while the agent's
  // backlog is full; then retry until the deadline.
  while (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return Status::FromErrno(errno, where + ": connect");
    if (Clock::now() >= deadline) return timed_out("connection");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // A send that fails with EPIPE may still leave a reply to read: the agent refuses a peer of
  // another user without reading its request.
  const int send_err = WriteAll(fd, request + "\n", deadline);
  if (send_err == ETIMEDOUT) return timed_out("room to send the request");

  std::string reply;
  char chunk[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n > 0) {
      reply.append(chunk, static_cast<size_t>(n));
      if (reply.size() > kMaxReplyBytes) {
        return Status::ResourceExhausted(where, "reply longer than " + std::to_string(kMaxReplyBytes) + " bytes");
      }
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!WaitFor(fd, POLLIN, deadline)) return timed_out("complete reply");
      continue;
    }
    // The agent closed with part of our request unread: the reply it sent is still whole.
    if (errno == ECONNRESET && !reply.empty()) break;
    return Status::FromErrno(errno, where + ": receive");
  }
  if (reply.empty()) {
    if (send_err != 0) return Status::FromErrno(send_err, where + ": send");
    return Status::IOError(where, "the agent closed the connection without a reply");
  }
  if (reply.back() == '\n') reply.pop_back();
  return reply;
}

}  // namespace lifeline::agent
