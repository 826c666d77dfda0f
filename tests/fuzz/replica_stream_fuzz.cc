// libFuzzer target: arbitrary bytes as a peer's replica stream (formats/SPEC.md §16), read by
// ReplicaReceiver::ReceiveStream from a buffer as it reads a connection, into a receiver listening
// nowhere whose root is a scratch directory (in /dev/shm, else $TMPDIR). It must never crash,
// allocate without bound or let an exception out; a stream it refuses must leave nothing under the
// root, and one it accepts must hold no more bytes than its budget admitted (its files are removed
// again before the next input).
//
// Random bytes almost never carry a valid XXH3 checksum, so each input is also received with every
// chunk's checksum recomputed where the spec places it, which lets the fuzzer reach the files after
// the first chunk and the placing.
//
// Its budget (the Admit the agent passes: the node's memory tier budget) is 1 MiB a stream here.
// Seeds (tests/fuzz/corpus/replica_stream/) are SendReplica's own bytes, captured from its socket:
// three files (one empty, one in four 256-byte chunks), no file at all, and a first chunk damaged
// in transit (damage_first_chunk).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "lib/net/replica_stream.h"
#include "formats/checksum.h"
#include "lifeline/env.h"

namespace {

using lifeline::Status;
using lifeline::replication::ReplicaReceiver;

constexpr uint64_t kBudget = 1 << 20;
uint64_t admitted = 0;  // bytes admitted in the current stream

// In /dev/shm where there is one, as the agent's receiver is (a file system on disk costs 25 times
// the executions). It exists only while an input is received (libFuzzer's exit runs no handler
// that could remove it), so a crash leaves it behind, nothing else does.
const std::string& Root() {
  static const std::string root = [] {
    const char* tmp = std::getenv("TMPDIR");
    struct stat st;
    const std::string dir = ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm"
                            : tmp != nullptr && *tmp != '\0'                     ? tmp
                                                                                  : "/tmp";
    return dir + "/lifeline_replica_fuzz." + std::to_string(::getpid());
  }();
  return root;
}

ReplicaReceiver& Receiver() {
  static const std::unique_ptr<ReplicaReceiver> receiver = [] {
    auto r = ReplicaReceiver::WithoutPort(Root(), nullptr, [](const std::string&, const std::string&, uint64_t bytes) {
      if (bytes > kBudget - admitted) return Status::ResourceExhausted("fuzz", "over the budget");
      admitted += bytes;
      return Status::OK();
    });
    if (!r.ok()) std::abort();
    return std::move(*r);
  }();
  return *receiver;
}

// Recomputes the checksum of every chunk whose bytes are all there, walking the stream as the
// receiver does (header, names, file headers, chunk lengths); stops where the bytes end or a
// length would take it past them.
void Reseal(std::string* b) {
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, b->data() + at, 4);
    return v;
  };
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, b->data() + at, 8);
    return v;
  };
  if (b->size() < 16) return;
  const uint32_t files = u32(12);
  size_t at = 16 + uint64_t{u32(8)};
  for (uint32_t f = 0; f < files && f < 1024; ++f) {
    if (at > b->size() || b->size() - at < 16) return;
    const uint64_t name = u32(at), bytes = u64(at + 8);
    at += 16;
    if (name > b->size() - at) return;
    at += name;
    for (uint64_t off = 0; off < bytes;) {
      if (b->size() - at < 8) return;
      const uint64_t chunk = u64(at);
      at += 8;
      if (chunk == 0 || chunk > bytes - off || chunk > b->size() - at || b->size() - at - chunk < 8) return;
      const uint64_t sum = lifeline::format::Checksum64(b->data() + at, chunk);
      std::memcpy(b->data() + at + chunk, &sum, 8);
      at += chunk + 8;
      off += chunk;
    }
  }
}

void ReceiveAndCheck(std::string_view bytes) {
  size_t at = 0;
  auto read = [&](void* out, size_t n) {
    if (n > bytes.size() - at) return Status::IOError("replica sender", "connection closed");
    std::memcpy(out, bytes.data() + at, n);
    at += n;
    return Status::OK();
  };
  admitted = 0;
  ReplicaReceiver& receiver = Receiver();
  if (::mkdir(Root().c_str(), 0700) != 0 && errno != EEXIST) std::abort();
  uint64_t received = 0, files = 0;
  const Status s = receiver.ReceiveStream(read, &received, &files);
  lifeline::Env* env = lifeline::Env::Default();
  auto children = env->GetChildren(Root());
  if (!children.ok()) std::abort();
  if (!s.ok() && !children->empty()) std::abort();  // a refused stream left something behind
  if (s.ok() && (received > admitted || files > 1024)) std::abort();
  for (const std::string& name : *children)
    if (!env->RemoveTree(Root() + "/" + name).ok()) std::abort();
  if (::rmdir(Root().c_str()) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  ReceiveAndCheck(bytes);
  Reseal(&bytes);
  ReceiveAndCheck(bytes);
  return 0;
}
