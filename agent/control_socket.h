// The agent's control socket: a Unix stream socket through which `lifeline` commands on the same
// machine ask the running agent for its status or a dump. Only the agent's own user may use it,
// enforced three ways: the directory holding it must be ours and not writable by others, the
// socket file is mode 0600, and every peer's uid is checked with SO_PEERCRED (the last word: file
// modes can be changed, the kernel's record of who connected cannot).
//
// Protocol: one request line in, one reply out, then the agent closes the connection. A reply
// always ends with "\n"; ControlRequest strips it.
#ifndef LIFELINE_AGENT_CONTROL_SOCKET_H_
#define LIFELINE_AGENT_CONTROL_SOCKET_H_

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "lifeline/status.h"

namespace lifeline::agent {

// The listening side, owned by the agent's event loop.
// Thread safety: none; use one ControlSocket from one thread.
class ControlSocket {
 public:
  // Binds and listens (non-blocking) at `path`.
  // FailedPrecondition naming the directory when the parent directory is not owned by the
  // effective uid or is group/other writable (someone else could swap the socket); an errno status
  // (NotFound when missing) when it cannot be inspected. A socket file left at `path` by a dead
  // agent of ours is replaced; AlreadyExists when an agent is still listening there, or when
  // `path` is something else (not a socket, or not ours), which is never removed.
  // Note: briefly sets the process umask to 0177 around bind(); files other threads create in that
  // instant get that mask.
  static Result<std::unique_ptr<ControlSocket>> Listen(const std::string& path);

  // Closes the socket and removes the socket file, unless it has been replaced meanwhile.
  ~ControlSocket();
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  // The listening descriptor, to poll for readability (a pending connection).
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  // Gets the request line (without its "\n") and returns the reply.
  using Handler = std::function<std::string(const std::string& request)>;

  // Serves every connection already pending, one after the other, and returns when none is left
  // (at most kMaxPerCall, so a flood cannot monopolise the caller). A peer of another uid gets
  // "error: permission denied: uid U is not the agent's user" and never reaches `handler`. Each
  // connection gets at most 1 s to deliver its request and 1 s to take the reply, so a stalled
  // client delays the agent by about 2 s at worst. A request over 64 KiB is refused. Errors are
  // the client's problem: the connection is dropped and serving goes on.
  void ServePending(const Handler& handler);

  static constexpr size_t kMaxRequestBytes = 64 * 1024;
  static constexpr int kMaxPerCall = 64;

 private:
  ControlSocket(int fd, std::string path, dev_t dev, ino_t ino)
      : fd_(fd), path_(std::move(path)), dev_(dev), ino_(ino) {}
  void ServeOne(int conn, const Handler& handler);

  int fd_;
  std::string path_;
  dev_t dev_;  // identity of the socket file we bound, so the destructor never removes another's
  ino_t ino_;
};

// The client side: connects to `path`, sends `request` (a "\n" is appended), and returns the reply
// up to EOF without its trailing "\n". Everything (connect, send, receive) must finish within
// `timeout_seconds`, else Unavailable. InvalidArgument when `request` contains a newline; an errno
// status naming the path when connecting fails (NotFound: no agent there; IOError "Permission
// denied": the socket belongs to another user).
Result<std::string> ControlRequest(const std::string& path, const std::string& request, double timeout_seconds);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_CONTROL_SOCKET_H_
