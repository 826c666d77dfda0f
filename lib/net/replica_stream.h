// Snapshot replication between agents (issue "a memory tier that survives losing a node"): one TCP
// stream carries the files of one snapshot (a rank's index and data in the memory tier) into a
// directory under the receiving agent's root, in the peer node's memory.
//
// The agents move the bytes, not the ranks: a rank's snapshot is complete in its node's memory
// tier before replication starts, so training never waits on the network, and the agent already
// knows every node of the round from etcd. The library itself opens no port.
//
// On the wire (formats/SPEC.md §16), after a header naming the directory and the number of files:
// per file its name and size, then chunks of at most `chunk_bytes`, each with its length before
// and its XXH3-64 after. The receiver writes each chunk into the destination file as it arrives
// (through one 256 KiB buffer that stays in the cache), checks its checksum, and places the files
// under their names (a rename, after every file of the stream arrived whole) before it
// acknowledges; anything less leaves no file behind but ".partial" ones it removes. Names are
// single path components of [A-Za-z0-9._-], not starting with '.': nothing a peer sends can land
// outside the receiver's root.
//
// The sender is throttled to a bandwidth budget and polls a cancellation between chunks, so that a
// newer snapshot supersedes one still in flight.
#ifndef LIFELINE_AGENT_REPLICATION_REPLICA_STREAM_H_
#define LIFELINE_AGENT_REPLICATION_REPLICA_STREAM_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lifeline/status.h"

namespace lifeline::replication {

struct ReplicaFile {
  std::string name;  // its name at the receiver: one path component (see above)
  std::string path;  // where the sender reads it
};

struct ReplicaSendOptions {
  std::string host;
  uint16_t port = 0;
  uint64_t chunk_bytes = 4ull << 20;
  uint64_t bandwidth_bytes_per_second = 0;  // 0: as fast as the network goes
  double connect_timeout_seconds = 10;
  // Polled between chunks; true abandons the stream (the receiver keeps nothing of it).
  std::function<bool()> cancelled;
  // For fault drills only: flips one bit of the stream's first chunk after checksumming it, as a
  // link or a NIC might, so that a drill can show the receiver refusing it.
  bool damage_first_chunk = false;
};

struct ReplicaTransfer {
  uint64_t bytes = 0;    // file bytes sent
  double seconds = 0;    // connect to acknowledgement
};

// Whether `name` may name a directory or file at a receiver.
bool IsReplicaName(const std::string& name);

// Reads exactly `n` bytes of a stream into `out`, or fails (the connection closed or broke): a
// connection's socket in the receiver, a byte buffer in the fuzz target and tests.
using StreamReader = std::function<Status(void* out, size_t n)>;

// Sends `files` into directory `dir` under the receiver's root and waits for its acknowledgement.
// InvalidArgument for a bad name; Aborted when cancelled; Unavailable when the receiver cannot be
// reached; IOError or Corruption with the receiver's reason when it refused the stream.
Result<ReplicaTransfer> SendReplica(const ReplicaSendOptions& options, const std::string& dir,
                                    const std::vector<ReplicaFile>& files);

class ReplicaReceiver {
 public:
  struct Counters {
    uint64_t bytes = 0;      // file bytes placed
    uint64_t files = 0;
    uint64_t streams = 0;    // acknowledged
    uint64_t refused = 0;    // streams refused or broken off
    std::string last_error;  // why the last one was
  };

  // Where a stream's files go once every one arrived whole: `received` pairs each file's name with
  // the path it arrived at (under root/dir, hidden). The placer moves what it keeps; the receiver
  // removes whatever is left. Without one, the files are renamed to root/dir/<name>.
  using Placer = std::function<Status(const std::string& dir,
                                      const std::vector<std::pair<std::string, std::string>>& received)>;

  // Asked for each file of a stream before its memory is taken (a budget): a failure refuses the
  // stream, with that status as the reason the sender gets.
  using Admit = std::function<Status(const std::string& dir, const std::string& name, uint64_t bytes)>;

  // Listens on `port` (0: a free one) at every address and places what it receives under `root`
  // (created, mode 0700), serving each connection on a thread of its own until destroyed.
  static Result<std::unique_ptr<ReplicaReceiver>> Start(std::string root, uint16_t port = 0, Placer placer = nullptr,
                                                        Admit admit = nullptr);
  // The same receiver listening nowhere (port() is 0): streams reach it through ReceiveStream only
  // (the fuzz target, tests).
  static Result<std::unique_ptr<ReplicaReceiver>> WithoutPort(std::string root, Placer placer = nullptr,
                                                              Admit admit = nullptr);
  ~ReplicaReceiver();
  ReplicaReceiver(const ReplicaReceiver&) = delete;
  ReplicaReceiver& operator=(const ReplicaReceiver&) = delete;

  // Retires replica `dir` (superseded by a newer one): its files are kept as spares that later
  // streams write into, so their memory is not freed and allocated again (a fresh page costs more
  // than the copy into it), and the directory goes. NotFound when there is no such replica.
  Status Recycle(const std::string& dir);

  // Reads one stream from `read` and places its files, as for each connection (less the
  // acknowledgement and the counters): OK once every file is placed, else the reason the sender is
  // told, with nothing of the stream left but what the placer kept. `bytes` and `files` count
  // what was received. Safe to call from several threads (streams of different directories, or
  // of different files of one directory).
  Status ReceiveStream(const StreamReader& read, uint64_t* bytes, uint64_t* files);

  uint16_t port() const { return port_; }
  const std::string& root() const { return root_; }
  Counters counters() const;

 private:
  ReplicaReceiver(std::string root, int listener, Placer placer, Admit admit);
  void AcceptLoop();
  void Serve(int fd);
  // Renames to `path` the spare file that fits `bytes` best (the smallest as large, else the
  // largest); false when there is none.
  bool TakeSpare(const std::string& path, uint64_t bytes);

  const std::string root_;
  const int listener_;  // -1: none (WithoutPort)
  const Placer placer_;
  const Admit admit_;
  const uint16_t port_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  Counters counters_;              // GUARDED_BY(mu_)
  std::vector<int> open_fds_;      // GUARDED_BY(mu_): shut down on destruction
  std::vector<std::pair<std::string, uint64_t>> spares_;  // GUARDED_BY(mu_): files under <root>/.spare, sizes
  uint64_t spare_names_ = 0;         // GUARDED_BY(mu_)
  std::vector<std::thread> servers_;  // GUARDED_BY(mu_)
  std::vector<std::thread::id> finished_;  // GUARDED_BY(mu_): servers done, to join at the next accept
  std::thread acceptor_;
};

}  // namespace lifeline::replication

#endif  // LIFELINE_AGENT_REPLICATION_REPLICA_STREAM_H_
