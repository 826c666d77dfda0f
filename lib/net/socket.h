// The few TCP calls Lifeline's processes make to each other (the drill's allreduce across nodes,
// snapshot replication between agents), with errors as Status naming the peer. Blocking sockets;
// a caller that needs a bound waits with poll() itself.
#ifndef LIFELINE_AGENT_NET_SOCKET_H_
#define LIFELINE_AGENT_NET_SOCKET_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "lifeline/status.h"

namespace lifeline::net {

using Clock = std::chrono::steady_clock;

// Writes all `n` bytes (never raises SIGPIPE); IOError naming `who` when the connection fails.
Status SendAll(int fd, const void* data, size_t n, const std::string& who);
// Reads exactly `n` bytes; IOError naming `who`, "connection closed" when the peer went away.
Status RecvAll(int fd, void* data, size_t n, const std::string& who);

// A listening socket on every address (IPv6 and IPv4 where the machine has both) at `port`
// (0: a free one, see LocalPort). `what` names the port's purpose in errors.
Result<int> Listen(uint16_t port, int backlog, const std::string& what);
// The port `fd` is bound to (0 when it cannot be told).
uint16_t LocalPort(int fd);
// One connection attempt to host:port (every address it resolves to), bounded by `deadline`.
// The connected socket, blocking, with TCP_NODELAY. Unavailable naming host:port otherwise.
Result<int> Connect(const std::string& host, uint16_t port, Clock::time_point deadline);

void SetNoDelay(int fd);
void SetBlocking(int fd, bool blocking);
// Milliseconds left until `deadline`, clamped to [0, 1000] (a poll() timeout that notices a stop).
int MillisLeft(Clock::time_point deadline);

}  // namespace lifeline::net

#endif  // LIFELINE_AGENT_NET_SOCKET_H_
