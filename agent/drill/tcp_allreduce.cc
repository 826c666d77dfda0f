#include "agent/drill/tcp_allreduce.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "lib/net/socket.h"

namespace lifeline::drill {
namespace {

constexpr char kMagic[8] = {'L', 'L', 'D', 'R', 'I', 'L', 'L', '1'};
constexpr size_t kMaxKey = 256;
constexpr uint64_t kAllReduce = 1;
constexpr uint64_t kAllGather = 2;

// What a rank sends first. Fixed size, so the root can collect it without parsing.
struct Hello {
  char magic[8];
  uint32_t rank;
  uint32_t world_size;
  uint64_t count;
  uint32_t key_size;
  char key[kMaxKey];
};

// The root's answer: 'K' (joined; sent once the group is complete) or 'R' and a reason.
struct Reply {
  char code;
  char reason[255];
};

// Precedes every contribution and every result.
struct Frame {
  uint64_t seq;
  uint64_t kind;
  uint64_t bytes;
};

using net::Clock;
using net::MillisLeft;
using net::RecvAll;
using net::SendAll;
using net::SetBlocking;
using net::SetNoDelay;

std::string RankName(uint32_t r) { return "rank " + std::to_string(r); }

void Refuse(int fd, const std::string& reason) {
  Reply r{};
  r.code = 'R';
  std::strncpy(r.reason, reason.c_str(), sizeof(r.reason) - 1);
  ::send(fd, &r, sizeof(r), MSG_NOSIGNAL);  // best effort: the peer may be gone
  ::close(fd);
}

std::string JoinRanks(const std::vector<uint32_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) out += " and " + std::to_string(ranks.size() - 16) + " more";
  return out;
}

// The root's side of the join: accepts connections until every rank has introduced itself.
Result<std::vector<int>> AcceptGroup(const TcpAllReduceOptions& o, Clock::time_point deadline) {
  LL_ASSIGN_OR_RETURN(int listener, net::Listen(o.master_port, static_cast<int>(std::min<uint32_t>(o.world_size, 4096)),
                                                "MASTER_PORT"));
  struct Pending {
    int fd;
    Hello hello;
    size_t got;
  };
  std::vector<Pending> pending;
  std::vector<int> fds(o.world_size, -1);
  uint32_t joined = 1;
  auto close_all = [&]() {
    ::close(listener);
    for (Pending& p : pending) ::close(p.fd);
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  };
  while (joined < o.world_size) {
    if (Clock::now() >= deadline) {
      std::vector<uint32_t> missing;
      for (uint32_t r = 1; r < o.world_size; ++r)
        if (fds[r] < 0) missing.push_back(r);
      close_all();
      return Status::Unavailable("drill group on port " + std::to_string(o.master_port),
                                 "ranks " + JoinRanks(missing) + " never joined within " +
                                     std::to_string(o.join_timeout_seconds) + " s");
    }
    std::vector<pollfd> pfds{{listener, POLLIN, 0}};
    for (const Pending& p : pending) pfds.push_back({p.fd, POLLIN, 0});
    if (::poll(pfds.data(), pfds.size(), std::max(1, MillisLeft(deadline))) <= 0) continue;
    if (pfds[0].revents != 0) {
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) pending.push_back({fd, {}, 0});
    }
    for (size_t i = 1; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      Pending& p = pending[i - 1];
      const ssize_t r = ::recv(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got, 0);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (r <= 0) {  // gone before introducing itself
        ::close(p.fd);
        p.fd = -1;
        continue;
      }
      p.got += static_cast<size_t>(r);
      if (p.got < sizeof(Hello)) continue;
      const Hello& h = p.hello;
      const std::string key(h.key, std::min<size_t>(h.key_size, kMaxKey));
      std::string refusal;
      if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
        refusal = "not a lifeline-drill peer";
      } else if (key != o.launch_key) {
        refusal = "rank " + std::to_string(h.rank) + " belongs to launch '" + key + "', the group is launch '" +
                  o.launch_key + "'";
      } else if (h.world_size != o.world_size || h.count != o.count) {
        refusal = "rank " + std::to_string(h.rank) + " has WORLD_SIZE=" + std::to_string(h.world_size) + " and " +
                  std::to_string(h.count) + " floats, the group " + std::to_string(o.world_size) + " and " +
                  std::to_string(o.count);
      } else if (h.rank == 0 || h.rank >= o.world_size) {
        refusal = "rank " + std::to_string(h.rank) + " is not a peer of rank 0 in a world of " +
                  std::to_string(o.world_size);
      } else if (fds[h.rank] >= 0) {
        refusal = "rank " + std::to_string(h.rank) + " has already joined";
      }
      if (!refusal.empty()) {
        Refuse(p.fd, refusal);
      } else {
        fds[h.rank] = p.fd;
        ++joined;
      }
      p.fd = -1;
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(), [](const Pending& p) { return p.fd < 0; }),
                  pending.end());
  }
  ::close(listener);
  for (Pending& p : pending) ::close(p.fd);
  Reply ok{};
  ok.code = 'K';
  for (uint32_t r = 1; r < o.world_size; ++r) {
    SetBlocking(fds[r], true);
    SetNoDelay(fds[r]);
    Status s = SendAll(fds[r], &ok, sizeof(ok), RankName(r));
    if (!s.ok()) {
      for (int fd : fds)
        if (fd >= 0) ::close(fd);
      return s;
    }
  }
  return fds;
}

// A peer's side of the join: connects to the root (which may not be listening yet) until accepted.
Result<int> JoinRoot(const TcpAllReduceOptions& o, Clock::time_point deadline) {
  Hello h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.rank = o.rank;
  h.world_size = o.world_size;
  h.count = o.count;
  h.key_size = static_cast<uint32_t>(o.launch_key.size());
  std::memcpy(h.key, o.launch_key.data(), o.launch_key.size());
  const std::string where = o.master_addr + ":" + std::to_string(o.master_port);
  Status last = Status::Unavailable(where, "not tried");
  while (Clock::now() < deadline) {
    Result<int> fd = net::Connect(o.master_addr, o.master_port, deadline);
    if (!fd.ok()) {
      last = fd.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    last = SendAll(*fd, &h, sizeof(h), "rank 0 at " + where);
    Reply reply{};
    while (last.ok()) {  // the answer comes once the whole group is in
      pollfd p{*fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, std::max(1, MillisLeft(deadline)));
      if (ready > 0) {
        last = RecvAll(*fd, &reply, sizeof(reply), "rank 0 at " + where);
        break;
      }
      if (Clock::now() >= deadline) last = Status::Unavailable(where, "rank 0 never completed the group");
    }
    if (last.ok() && reply.code == 'K') return *fd;
    ::close(*fd);
    if (last.ok()) {
      reply.reason[sizeof(reply.reason) - 1] = '\0';
      return Status::InvalidArgument(where, std::string("rank 0 refused rank ") + std::to_string(o.rank) + ": " +
                                                reply.reason);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Unavailable("rank " + std::to_string(o.rank), "cannot join the drill group at " + where + " within " +
                                                                   std::to_string(o.join_timeout_seconds) +
                                                                   " s: " + last.ToString());
}

}  // namespace

TcpAllReduce::TcpAllReduce(uint32_t rank, uint32_t world_size, uint64_t count, std::vector<int> fds)
    : rank_(rank), world_size_(world_size), count_(count), fds_(std::move(fds)), posted_(count), scratch_(count) {}

TcpAllReduce::~TcpAllReduce() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

Result<std::unique_ptr<TcpAllReduce>> TcpAllReduce::Join(const TcpAllReduceOptions& o) {
  if (o.world_size == 0 || o.world_size > kMaxWorldSize || o.rank >= o.world_size)
    return Status::InvalidArgument("drill group", "rank " + std::to_string(o.rank) + " of a world of " +
                                                      std::to_string(o.world_size));
  if (o.count == 0 || o.master_port == 0 || o.launch_key.size() > kMaxKey || o.master_addr.empty())
    return Status::InvalidArgument("drill group", "needs a count, MASTER_ADDR, MASTER_PORT and a key of at most " +
                                                      std::to_string(kMaxKey) + " bytes");
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.join_timeout_seconds * 1000));
  std::vector<int> fds(o.rank == 0 ? o.world_size : 1, -1);
  if (o.world_size > 1) {
    if (o.rank == 0) {
      LL_ASSIGN_OR_RETURN(fds, AcceptGroup(o, deadline));
    } else {
      LL_ASSIGN_OR_RETURN(fds[0], JoinRoot(o, deadline));
    }
  }
  return std::unique_ptr<TcpAllReduce>(new TcpAllReduce(o.rank, o.world_size, o.count, std::move(fds)));
}

void TcpAllReduce::Post(const float* data) {
  assert(!has_posted_ && "Post twice without Finish");
  std::memcpy(posted_.data(), data, count_ * sizeof(float));
  has_posted_ = true;
}

Status TcpAllReduce::Exchange(uint64_t kind, const void* mine, size_t bytes, void* out) {
  const uint64_t seq = completed_ + 1;
  // What comes back: the sum (count floats), or every rank's word.
  const size_t result_bytes = kind == kAllReduce ? bytes : bytes * world_size_;
  if (rank_ != 0) {
    const std::string root = RankName(0);
    const Frame f{seq, kind, bytes};
    LL_RETURN_IF_ERROR(SendAll(fds_[0], &f, sizeof(f), root));
    LL_RETURN_IF_ERROR(SendAll(fds_[0], mine, bytes, root));
    Frame back{};
    LL_RETURN_IF_ERROR(RecvAll(fds_[0], &back, sizeof(back), root));
    if (back.seq != seq || back.kind != kind || back.bytes != result_bytes)
      return Status::IOError(root, "answered collective #" + std::to_string(back.seq) + " to #" + std::to_string(seq));
    LL_RETURN_IF_ERROR(RecvAll(fds_[0], out, result_bytes, root));
  } else {
    // Rank order 0..N-1, whatever order the contributions arrive in: the same bits as one node.
    std::memcpy(out, mine, bytes);
    for (uint32_t r = 1; r < world_size_; ++r) {
      Frame f{};
      LL_RETURN_IF_ERROR(RecvAll(fds_[r], &f, sizeof(f), RankName(r)));
      if (f.seq != seq || f.kind != kind || f.bytes != bytes)
        return Status::IOError(RankName(r), "sent collective #" + std::to_string(f.seq) + " of " +
                                                std::to_string(f.bytes) + " bytes during #" + std::to_string(seq));
      if (kind == kAllReduce) {
        LL_RETURN_IF_ERROR(RecvAll(fds_[r], scratch_.data(), bytes, RankName(r)));
        float* sum = static_cast<float*>(out);
        for (uint64_t i = 0; i < count_; ++i) sum[i] += scratch_[i];
      } else {
        LL_RETURN_IF_ERROR(RecvAll(fds_[r], static_cast<char*>(out) + r * bytes, bytes, RankName(r)));
      }
    }
    const Frame back{seq, kind, result_bytes};
    for (uint32_t r = 1; r < world_size_; ++r) {
      LL_RETURN_IF_ERROR(SendAll(fds_[r], &back, sizeof(back), RankName(r)));
      LL_RETURN_IF_ERROR(SendAll(fds_[r], out, result_bytes, RankName(r)));
    }
  }
  ++completed_;
  return Status::OK();
}

Status TcpAllReduce::Finish(float* out) {
  assert(has_posted_ && "Finish without Post");
  has_posted_ = false;
  return Exchange(kAllReduce, posted_.data(), count_ * sizeof(float), out);
}

Result<std::vector<uint64_t>> TcpAllReduce::AllGather(uint64_t word) {
  assert(!has_posted_ && "AllGather between Post and Finish");
  std::vector<uint64_t> all(world_size_);
  LL_RETURN_IF_ERROR(Exchange(kAllGather, &word, sizeof(word), all.data()));
  return all;
}

}  // namespace lifeline::drill
