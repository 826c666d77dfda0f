#include "agent/summary_stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "lib/net/socket.h"

namespace lifeline::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint8_t kHello = 1;
constexpr uint8_t kSummary = 2;

std::string PeerName(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    if (a.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
      inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
      port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
      inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
      port = ntohs(v6->sin6_port);
    }
  }
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace

// One sender's connection, as the receiver's thread reads it.
struct SummaryReceiver::Peer {
  int fd = -1;
  std::string name;      // host:port, for errors
  std::string in;        // bytes not yet a whole frame
  bool hello = false;
  uint64_t round = 0;
  std::string node;
};

Result<std::unique_ptr<SummaryReceiver>> SummaryReceiver::Start(std::string job, uint16_t port) {
  LL_ASSIGN_OR_RETURN(int fd, net::Listen(port, 1024, "the agent's summary port"));
  net::SetBlocking(fd, false);
  auto r = std::unique_ptr<SummaryReceiver>(new SummaryReceiver(std::move(job), fd, net::LocalPort(fd)));
  if (pipe2(r->wake_, O_CLOEXEC | O_NONBLOCK) != 0) return Status::FromErrno(errno, "summary receiver: pipe");
  r->thread_ = std::thread([p = r.get()] { p->Run(); });
  return r;
}

SummaryReceiver::SummaryReceiver(std::string job, int listen_fd, uint16_t port)
    : job_(std::move(job)), listen_fd_(listen_fd), port_(port) {}

SummaryReceiver::~SummaryReceiver() {
  if (wake_[1] >= 0) {
    const char c = 0;
    (void)!write(wake_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) close(fd);
}

std::vector<ReceivedSummary> SummaryReceiver::Summaries(uint64_t round, bool with_text) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ReceivedSummary> out;
  const auto it = by_round_.find(round);
  if (it == by_round_.end()) return out;
  for (const auto& [node, s] : it->second) {
    if (with_text) {
      out.push_back(s);
      continue;
    }
    // Named: positional, the frame count once landed in etcd_age (the field between), and a leader
    // cut off from etcd misjudged when the others had last reached it.
    ReceivedSummary light{.node = s.node, .summary = {}, .received = s.received, .connected = s.connected,
                          .closed = s.closed,
                          .etcd_age = s.etcd_age, .frames = s.frames, .wire_bytes = s.wire_bytes,
                          .frames_pending = {}, .frames_dropped = s.frames_dropped};
    out.push_back(std::move(light));
  }
  return out;
}

std::vector<ReceivedSummary> SummaryReceiver::TakeSummaries(uint64_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ReceivedSummary> out;
  const auto it = by_round_.find(round);
  if (it == by_round_.end()) return out;
  for (auto& [node, s] : it->second) {
    if (s.frames_pending.empty()) continue;
    ReceivedSummary taken{.node = s.node, .summary = {}, .received = s.received, .connected = s.connected,
                          .closed = s.closed,
                          .etcd_age = s.etcd_age, .frames = s.frames, .wire_bytes = s.wire_bytes,
                          .frames_pending = std::move(s.frames_pending), .frames_dropped = s.frames_dropped};
    s.frames_pending.clear();
    out.push_back(std::move(taken));
  }
  return out;
}

std::vector<std::string> SummaryReceiver::errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

std::vector<std::string> SummaryReceiver::ErrorsSince(uint64_t* seen) const {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t fresh = std::min<uint64_t>(errors_total_ - std::min(*seen, errors_total_), errors_.size());
  *seen = errors_total_;
  return std::vector<std::string>(errors_.end() - static_cast<ptrdiff_t>(fresh), errors_.end());
}

uint64_t SummaryReceiver::wire_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wire_bytes_;
}

void SummaryReceiver::Run() {
  ZSTD_DCtx* zstd = ZSTD_createDCtx();
  std::string plain;
  auto refuse = [&](Peer& p, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    errors_.push_back("summary from " + p.name + (p.node.empty() ? "" : " (node " + p.node + ")") + ": " + why);
    if (errors_.size() > 16) errors_.erase(errors_.begin());
    ++errors_total_;
  };
  // A whole frame of `p`: false when it breaks the wire's rules.
  auto frame = [&](Peer& p, const char* data, size_t n) -> bool {
    if (n < 1) return refuse(p, "an empty frame"), false;
    const uint8_t kind = static_cast<uint8_t>(data[0]);
    std::string_view body(data + 1, n - 1);
    if (!p.hello) {
      if (kind != kHello) return refuse(p, "no hello first"), false;
      const size_t a = body.find('\n'), b = a == std::string_view::npos ? a : body.find('\n', a + 1);
      if (b == std::string_view::npos) return refuse(p, "a hello that is not job, round and node"), false;
      if (body.substr(0, a) != job_) return refuse(p, "a summary of another job (" + std::string(body.substr(0, a)) + ")"), false;
      const std::string round(body.substr(a + 1, b - a - 1));
      if (round.empty() || round.size() > 19 || round.find_first_not_of("0123456789") != std::string::npos)
        return refuse(p, "a hello whose round is not a number"), false;
      p.round = std::stoull(round);
      p.node = std::string(body.substr(b + 1));
      if (p.node.empty() || p.node.size() > 512) return refuse(p, "a hello without a node id"), false;
      p.hello = true;
      // Heard from: the node is connected from now on, before its first summary.
      std::lock_guard<std::mutex> lock(mu_);
      ReceivedSummary& s = by_round_[p.round][p.node];
      s.node = p.node;
      s.received = Clock::now();
      s.connected = true;
      while (by_round_.size() > 2) by_round_.erase(by_round_.begin());
      return true;
    }
    if (kind != kSummary) return refuse(p, "a frame of unknown kind " + std::to_string(kind)), false;
    if (body.empty()) return refuse(p, "a summary without its lease's age"), false;
    const uint8_t etcd_age = static_cast<uint8_t>(body[0]);
    body.remove_prefix(1);
    const unsigned long long size = ZSTD_getFrameContentSize(body.data(), body.size());
    if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN || size > kMaxSummaryBytes)
      return refuse(p, "a summary that is not one zstd frame of at most 64 MiB"), false;
    plain.resize(size);
    const size_t got = ZSTD_decompressDCtx(zstd, plain.data(), plain.size(), body.data(), body.size());
    if (ZSTD_isError(got) || got != size) return refuse(p, "a summary that does not decompress"), false;
    std::lock_guard<std::mutex> lock(mu_);
    ReceivedSummary& s = by_round_[p.round][p.node];
    s.node = p.node;
    s.summary = plain;
    // Kept until the leader takes them: a summary may carry only what the one before it did not.
    if (s.frames_pending.size() >= kMaxPendingSummaries) {
      s.frames_pending.erase(s.frames_pending.begin());
      ++s.frames_dropped;
    }
    s.frames_pending.push_back(std::move(plain));
    s.received = Clock::now();
    s.connected = true;
    s.etcd_age = etcd_age / 10.0;
    ++s.frames;
    s.wire_bytes += n + 4;
    wire_bytes_ += n + 4;
    // Rounds long past are forgotten (a node's summaries of its current round are what counts).
    while (by_round_.size() > 2) by_round_.erase(by_round_.begin());
    return true;
  };
  auto closed = [&](Peer& p) {
    close(p.fd);
    p.fd = -1;
    if (!p.hello) return;
    std::lock_guard<std::mutex> lock(mu_);
    const auto r = by_round_.find(p.round);
    if (r == by_round_.end()) return;
    const auto s = r->second.find(p.node);
    if (s != r->second.end()) {
      s->second.connected = false;
      s->second.closed = Clock::now();  // a process that dies closes its sockets: its last sign
    }
  };
  // One epoll set of every connection: poll() looks at every connection for each summary that
  // comes, which with 2,048 nodes was about a quarter of lifeline-etcd-load's CPU.
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  constexpr uint64_t kWake = 0, kListen = 1;
  auto watch = [&](int fd, uint64_t id) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = id;
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0;
  };
  if (ep < 0 || !watch(wake_[0], kWake) || !watch(listen_fd_, kListen)) {
    const int error = errno;
    if (ep >= 0) close(ep);
    ZSTD_freeDCtx(zstd);
    std::lock_guard<std::mutex> lock(mu_);
    errors_.push_back(std::string("the summary port cannot wait for connections: ") + std::strerror(error));
    ++errors_total_;
    return;
  }
  std::unordered_map<uint64_t, Peer> peers;  // by their id in the epoll set
  uint64_t next_id = 2;
  epoll_event events[256];
  char buffer[64 << 10];
  for (bool running = true; running;) {
    const int ready = epoll_wait(ep, events, 256, 1000);
    if (ready < 0 && errno != EINTR) break;
    for (int e = 0; e < ready; ++e) {
      const uint64_t id = events[e].data.u64;
      if (id == kWake) {
        running = false;
        break;
      }
      if (id == kListen) {
        for (;;) {
          const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (fd < 0) break;
          Peer p;
          p.fd = fd;
          p.name = PeerName(fd);
          if (!watch(fd, next_id)) {
            close(fd);
            continue;
          }
          peers.emplace(next_id++, std::move(p));
        }
        continue;
      }
      const auto it = peers.find(id);
      if (it == peers.end()) continue;
      Peer& p = it->second;
      bool open = true;
      for (;;) {
        const ssize_t r = recv(p.fd, buffer, sizeof(buffer), 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r <= 0) {
          open = false;
          break;
        }
        p.in.append(buffer, static_cast<size_t>(r));
      }
      size_t at = 0;
      while (open && p.in.size() - at >= 4) {
        uint32_t n;
        std::memcpy(&n, p.in.data() + at, 4);
        n = ntohl(n);
        if (n > kMaxSummaryFrame) {
          refuse(p, "a frame of " + std::to_string(n) + " bytes (at most 16 MiB)");
          open = false;
          break;
        }
        if (p.in.size() - at - 4 < n) break;
        if (!frame(p, p.in.data() + at + 4, n)) {
          open = false;
        } else if (p.in[at + 4] != static_cast<char>(kHello)) {
          // The answer: when the leader last renewed its lease. A sender that does not read them
          // fills its own buffer first; one lost answer is no harm.
          const char answer = static_cast<char>(TenthsSince(Clock::time_point(Clock::duration(last_renewal_ns_.load()))));
          (void)!send(p.fd, &answer, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        at += 4 + n;
      }
      p.in.erase(0, at);
      if (!open) {
        closed(p);  // closing the descriptor takes it out of the epoll set
        peers.erase(it);
      }
    }
  }
  for (auto& [id, p] : peers) close(p.fd);
  close(ep);
  ZSTD_freeDCtx(zstd);
}

SummarySender::SummarySender(std::string job, std::string node_id) : job_(std::move(job)), node_id_(std::move(node_id)) {
  zstd_ = ZSTD_createCCtx();
}

SummarySender::~SummarySender() {
  Close();
  ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(zstd_));
}

void SummarySender::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  to_.clear();
}

uint8_t TenthsSince(Clock::time_point t) {
  const double tenths = std::chrono::duration<double>(Clock::now() - t).count() * 10;
  return static_cast<uint8_t>(std::clamp(tenths, 0.0, 255.0));
}

Clock::time_point TenthsBefore(Clock::time_point now, uint8_t tenths) {
  return now - std::chrono::milliseconds(100 * static_cast<int>(tenths));
}

std::optional<Clock::time_point> SummarySender::leader_renewed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_renewed_;
}

Status SummarySender::Send(const std::string& host, uint16_t port, uint64_t round, const std::string& summary,
                           double timeout_seconds, Clock::time_point last_renewal) {
  const std::string who = "the leader's summary port at " + host + ":" + std::to_string(port);
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  std::string frame(4 + 2, '\0');
  frame[4] = static_cast<char>(kSummary);
  frame[5] = static_cast<char>(TenthsSince(last_renewal));
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t bound = ZSTD_compressBound(summary.size());
    frame.resize(6 + bound);
    const size_t n = ZSTD_compressCCtx(static_cast<ZSTD_CCtx*>(zstd_), frame.data() + 6, bound, summary.data(),
                                       summary.size(), 3);
    if (ZSTD_isError(n)) return Status::IOError("summary", std::string("zstd: ") + ZSTD_getErrorName(n));
    frame.resize(6 + n);
    const uint32_t length = htonl(static_cast<uint32_t>(2 + n));
    std::memcpy(frame.data(), &length, 4);
    LL_RETURN_IF_ERROR(ConnectLocked(host, port, round, deadline, timeout_seconds));
    if (Status s = net::SendAll(fd_, frame.data(), frame.size(), who); !s.ok()) {
      close(fd_);
      fd_ = -1;
      to_.clear();
      return Status::Unavailable("summary", s.ToString());
    }
    // The leader's answers so far (to this summary and the ones before): the newest counts.
    char answers[256];
    const ssize_t got = recv(fd_, answers, sizeof(answers), MSG_DONTWAIT);
    if (got > 0) leader_renewed_ = TenthsBefore(Clock::now(), static_cast<uint8_t>(answers[got - 1]));
  }
  wire_bytes_ += frame.size();
  return Status::OK();
}

Status SummarySender::Connect(const std::string& host, uint16_t port, uint64_t round, double timeout_seconds) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  std::lock_guard<std::mutex> lock(mu_);
  return ConnectLocked(host, port, round, deadline, timeout_seconds);
}

Status SummarySender::ConnectLocked(const std::string& host, uint16_t port, uint64_t round,
                                    std::chrono::steady_clock::time_point deadline, double timeout_seconds) {
  const std::string who = "the leader's summary port at " + host + ":" + std::to_string(port);
  const std::string to = host + ":" + std::to_string(port) + " " + std::to_string(round);
  {
    if (fd_ >= 0 && to_ != to) {
      close(fd_);
      fd_ = -1;
    }
    if (fd_ < 0) {
      Result<int> connected = net::Connect(host, port, deadline);
      if (!connected.ok()) return Status::Unavailable("summary", connected.status().ToString());
      const int fd = *connected;
      // Writes bounded too: a leader that stopped reading must not stall this node's watcher.
      const timeval tv{static_cast<time_t>(timeout_seconds), static_cast<suseconds_t>((timeout_seconds - static_cast<int>(timeout_seconds)) * 1e6)};
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      const std::string hello = job_ + "\n" + std::to_string(round) + "\n" + node_id_;
      std::string hello_frame(5, '\0');
      const uint32_t hello_length = htonl(static_cast<uint32_t>(1 + hello.size()));
      std::memcpy(hello_frame.data(), &hello_length, 4);
      hello_frame[4] = static_cast<char>(kHello);
      hello_frame += hello;
      if (Status s = net::SendAll(fd, hello_frame.data(), hello_frame.size(), who); !s.ok()) {
        close(fd);
        return Status::Unavailable("summary", s.ToString());
      }
      fd_ = fd;
      to_ = to;
      ++connections_;
      wire_bytes_ += hello_frame.size();
    }
  }
  return Status::OK();
}

std::vector<Status> ProbeAll(const std::vector<std::pair<std::string, uint16_t>>& targets, double timeout_seconds) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  std::vector<Status> out(targets.size());
  std::vector<std::thread> probes;
  for (size_t k = 0; k < targets.size(); ++k)
    probes.emplace_back([&, k] {
      Result<int> fd = net::Connect(targets[k].first, targets[k].second, deadline);
      if (fd.ok()) close(*fd);
      out[k] = fd.status();
    });
  for (std::thread& t : probes) t.join();
  return out;
}

}  // namespace lifeline::agent
