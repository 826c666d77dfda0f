// lifeline bench replicate: snapshot replication between agents (agent/replication/) against the
// network's own limit, in the same run. A snapshot of --bytes (a data file and a small index, in
// /dev/shm as in the memory tier) is replicated to a receiver on this machine over loopback TCP:
// read from the tier file, checksummed per chunk, sent, checksummed again on arrival and written
// into the receiver's memory. The baseline moves the same bytes from memory to memory over a plain
// loopback TCP connection (one send() and one recv() loop, nothing else). Each is run --iterations
// times, alternately; the medians are compared.
//
// --json fields: bytes, chunk_bytes, iterations, replicate_gbps and tcp_gbps (medians of bytes /
// seconds / 1e9), ratio_to_tcp (replicate / tcp), replicate_seconds and tcp_seconds (every run).
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "lib/net/socket.h"
#include "lib/net/replica_stream.h"
#include "tools/lifeline/bench/bench.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

struct ReplicateOptions {
  std::string bytes = "1GiB";
  std::string chunk = "4MiB";
  unsigned iterations = 3;
  bool json = false;
};

// Seconds to move `bytes` from `src` over a fresh loopback connection into a reused buffer.
Result<double> RawTcpSeconds(const std::vector<char>& src, std::vector<char>* sink) {
  LL_ASSIGN_OR_RETURN(int listener, net::Listen(0, 1, "bench replicate"));
  const uint16_t port = net::LocalPort(listener);
  Status received;
  std::thread reader([&] {
    const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      received = Status::FromErrno(errno, "accept");
      return;
    }
    // Whole buffers as they come: what a receiver that keeps nothing costs.
    uint64_t left = src.size();
    while (left > 0 && received.ok()) {
      const ssize_t r = ::recv(fd, sink->data(), std::min<uint64_t>(sink->size(), left), 0);
      if (r <= 0) received = Status::IOError("bench replicate", "baseline connection closed early");
      else left -= static_cast<uint64_t>(r);
    }
    const char done = 1;
    (void)!::send(fd, &done, 1, MSG_NOSIGNAL);
    ::close(fd);
  });
  const auto t0 = net::Clock::now();
  Result<int> fd = net::Connect("127.0.0.1", port, t0 + std::chrono::seconds(10));
  Status sent = fd.ok() ? net::SendAll(*fd, src.data(), src.size(), "baseline") : fd.status();
  char done = 0;
  if (sent.ok()) sent = net::RecvAll(*fd, &done, 1, "baseline");  // the reader has everything
  const double seconds = std::chrono::duration<double>(net::Clock::now() - t0).count();
  if (fd.ok()) ::close(*fd);
  reader.join();
  ::close(listener);
  LL_RETURN_IF_ERROR(sent);
  LL_RETURN_IF_ERROR(received);
  return seconds;
}

int RunReplicate(const ReplicateOptions& o) {
  const char* kCommand = "bench replicate";
  Result<uint64_t> bytes = ParseByteSize(o.bytes);
  if (!bytes.ok() || *bytes == 0) return ReportFailure(kCommand, Status::InvalidArgument("--bytes", o.bytes), o.json);
  Result<uint64_t> chunk = ParseByteSize(o.chunk);
  if (!chunk.ok() || *chunk == 0) return ReportFailure(kCommand, Status::InvalidArgument("--chunk", o.chunk), o.json);

  char tmpl[] = "/dev/shm/lifeline-bench-replicate-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ReportFailure(kCommand, Status::FromErrno(errno, "mkdtemp /dev/shm"), o.json);
  const std::string dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{dir};

  // The snapshot in "the tier": a data file of --bytes and a 64 KiB index.
  std::vector<char> src(*bytes);
  for (uint64_t i = 0; i < src.size(); i += 8) src[i] = static_cast<char>(i * 2654435761u >> 13);
  const std::vector<replication::ReplicaFile> files = {{"bench.r000000-of-000001.data", dir + "/data"},
                                                       {"bench.r000000-of-000001.index", dir + "/index"}};
  {
    FILE* f = std::fopen(files[0].path.c_str(), "wb");
    FILE* g = std::fopen(files[1].path.c_str(), "wb");
    const bool ok = f && g && std::fwrite(src.data(), 1, src.size(), f) == src.size() &&
                    std::fwrite(src.data(), 1, std::min<size_t>(src.size(), 64 << 10), g) > 0;
    if (f) std::fclose(f);
    if (g) std::fclose(g);
    if (!ok) return ReportFailure(kCommand, Status::IOError(dir, "cannot write the snapshot"), o.json);
  }
  auto receiver = replication::ReplicaReceiver::Start(dir + "/peer");
  if (!receiver.ok()) return ReportFailure(kCommand, receiver.status(), o.json);

  std::vector<char> sink(4 << 20);
  std::vector<double> replicate_s, tcp_s;
  uint64_t moved = 0;
  for (unsigned i = 0; i < o.iterations; ++i) {
    Result<double> raw = RawTcpSeconds(src, &sink);
    if (!raw.ok()) return ReportFailure(kCommand, raw.status(), o.json);
    tcp_s.push_back(*raw);
    replication::ReplicaSendOptions so;
    so.host = "127.0.0.1";
    so.port = (*receiver)->port();
    so.chunk_bytes = *chunk;
    auto sent = replication::SendReplica(so, "step-" + std::to_string(i), files);
    if (!sent.ok()) return ReportFailure(kCommand, sent.status(), o.json);
    replicate_s.push_back(sent->seconds);
    moved = sent->bytes;
    // Superseded by the next one, as in the agent: its memory is written again, not allocated.
    if (Status s = (*receiver)->Recycle("step-" + std::to_string(i)); !s.ok()) return ReportFailure(kCommand, s, o.json);
  }
  const double tcp_gbps = static_cast<double>(src.size()) / Median(tcp_s) / 1e9;
  const double replicate_gbps = static_cast<double>(moved) / Median(replicate_s) / 1e9;
  const double ratio = tcp_gbps > 0 ? replicate_gbps / tcp_gbps : 0;
  if (o.json) {
    PrintJson({{"ok", true},
               {"command", kCommand},
               {"bytes", moved},
               {"chunk_bytes", *chunk},
               {"iterations", o.iterations},
               {"replicate_gbps", replicate_gbps},
               {"tcp_gbps", tcp_gbps},
               {"ratio_to_tcp", ratio},
               {"replicate_seconds", replicate_s},
               {"tcp_seconds", tcp_s}});
  } else {
    std::printf("replicate %s over loopback TCP, %s chunks, median of %u:\n", FormatByteSize(moved).c_str(),
                FormatByteSize(*chunk).c_str(), o.iterations);
    std::printf("  replication (read, checksum, send, verify, place)  %6.2f GB/s\n", replicate_gbps);
    std::printf("  raw TCP, memory to memory (same bytes, same run)   %6.2f GB/s\n", tcp_gbps);
    std::printf("  ratio to raw TCP                                    %6.2f\n", ratio);
  }
  return kExitOk;
}

}  // namespace

void AddBenchReplicateCommand(CLI::App* bench, std::vector<Command>* commands) {
  auto o = std::make_shared<ReplicateOptions>();
  CLI::App* app = bench->add_subcommand(
      "replicate", "Snapshot replication to a peer's memory against a raw TCP transfer of the same bytes");
  app->add_option("--bytes", o->bytes, "Snapshot size, e.g. 256MiB (default 1GiB)");
  app->add_option("--chunk", o->chunk, "Replication chunk size (default 4MiB)");
  app->add_option("--iterations", o->iterations, "Runs of each, alternating (default 3)")->check(CLI::Range(1u, 100u));
  app->add_flag("--json", o->json, "Print one JSON object on stdout");
  commands->push_back(Command{app, [o] { return RunReplicate(*o); }});
}

}  // namespace lifeline::cli
