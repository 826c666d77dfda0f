// The producer side of tracing: finds the agent's ring from the environment once, then records
// events with a few stores. See lifeline/trace.h and lifeline/internal/trace_ring.h (layout: formats/SPEC.md §15).
#include "lifeline/trace.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lifeline/internal/shared_memory.h"
#include "lifeline/internal/trace_ring.h"
#include "lifeline/env.h"
#include "lifeline/log.h"

namespace lifeline::trace {

const char* EventTypeName(EventType type) {
  switch (type) {
    case EventType::kNone: return "none";
    case EventType::kProcessStart: return "process_start";
    case EventType::kStepBegin: return "step_begin";
    case EventType::kStepEnd: return "step_end";
    case EventType::kCollectiveBegin: return "collective_begin";
    case EventType::kCollectivePosted: return "collective_posted";
    case EventType::kCollectiveEnd: return "collective_end";
    case EventType::kHeartbeat: return "heartbeat";
    case EventType::kCheckpointBegin: return "checkpoint_begin";
    case EventType::kCheckpointCopied: return "checkpoint_copied";
    case EventType::kCheckpointPersisted: return "checkpoint_persisted";
    case EventType::kCheckpointCommitted: return "checkpoint_committed";
    case EventType::kCheckpointFailed: return "checkpoint_failed";
    case EventType::kProcessExit: return "process_exit";
    case EventType::kCheckpointFallback: return "checkpoint_fallback";
    case EventType::kScalar: return "scalar";
    case EventType::kScalarName: return "scalar_name";
    case EventType::kReplicaDigest: return "replica_digest";
    case EventType::kReplicaName: return "replica_name";
  }
  return "unknown";
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kOther: return "other";
    case Op::kAllReduce: return "allreduce";
    case Op::kAllGather: return "allgather";
    case Op::kReduceScatter: return "reducescatter";
    case Op::kBroadcast: return "broadcast";
    case Op::kReduce: return "reduce";
    case Op::kAllToAll: return "alltoall";
    case Op::kSend: return "send";
    case Op::kRecv: return "recv";
    case Op::kBarrier: return "barrier";
  }
  return "other";
}

Op OpFromName(const std::string& name) {
  std::string n;
  for (char c : name)
    if (c != '_' && c != '-' && c != ' ') n.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  for (Op op : {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter, Op::kBroadcast, Op::kReduce, Op::kAllToAll,
                Op::kSend, Op::kRecv, Op::kBarrier})
    if (n == OpName(op)) return op;
  return Op::kOther;
}

namespace {

constexpr uint32_t kCountedComms = 256;  // communicators whose sequence numbers the library counts
constexpr size_t kMaxDumpEvents = 1 << 16;

struct Tracer {
  std::unique_ptr<TraceRing> ring;
  int rank = 0;
  std::atomic<uint64_t> step{kNoStep};
  std::atomic<uint64_t> next_seq[kCountedComms] = {};
  // For the dump signal handler: everything allocated up front.
  std::unique_ptr<Event[]> dump_buffer;
  size_t dump_events = 0;
  char dump_path[4096] = {};
};

// 0: not looked yet; 1: inactive; 2: active (g_tracer set).
std::atomic<int> g_state{0};
Tracer* g_tracer = nullptr;  // written once under g_init, published by g_state
std::mutex g_init;

// False (errno set) when a write fails.
bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Async-signal-safe: no allocation, no locks, only open/write/close.
void DumpTo(const Tracer& t, const char* path, uint64_t max_events) {
  const int saved_errno = errno;
  const int fd = CreateFreshFile(path, O_WRONLY, 0600);  // never through a planted link
  if (fd >= 0) {
    const size_t n = t.ring->Recent(t.dump_buffer.get(), std::min<uint64_t>(max_events, t.dump_events));
    char line[512];
    for (size_t i = 0; i < n; ++i) {
      size_t len = FormatEventJson(t.dump_buffer[i], t.rank, line, sizeof(line) - 1);
      line[len++] = '\n';
      if (!WriteAll(fd, line, len)) break;
    }
    close(fd);
  }
  errno = saved_errno;
}

// The handler that was on the dump signal before ours (Python's faulthandler, which the agent's
// start-up hook registers there to write the rank's Python stacks): called after the ring's dump.
struct sigaction g_previous_dump_action{};

void OnDumpSignal(int sig, siginfo_t* info, void* context) {
  if (g_state.load(std::memory_order_acquire) == 2) DumpTo(*g_tracer, g_tracer->dump_path, g_tracer->dump_events);
  const struct sigaction& prev = g_previous_dump_action;
  if ((prev.sa_flags & SA_SIGINFO) != 0) {
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN && prev.sa_handler != nullptr) {
    prev.sa_handler(sig);
  }
}

uint64_t EnvUint(const char* name, uint64_t fallback) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = strtoull(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0') return fallback;
  return x;
}

void InstallDumpHandler(Tracer* t, const std::string& dir) {
  const uint64_t sig = EnvUint("LIFELINE_DUMP_SIGNAL", SIGUSR2);
  if (sig == 0 || sig >= static_cast<uint64_t>(NSIG)) return;
  t->dump_events = std::clamp<uint64_t>(EnvUint("LIFELINE_DUMP_EVENTS", 1000), 1, kMaxDumpEvents);
  t->dump_buffer.reset(new Event[t->dump_events]);
  const std::string path = dir + "/dump." + std::to_string(t->rank) + "." + std::to_string(getpid()) + ".jsonl";
  if (path.size() >= sizeof(t->dump_path)) return;
  std::memcpy(t->dump_path, path.c_str(), path.size() + 1);
  struct sigaction old{};
  if (sigaction(static_cast<int>(sig), nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) == 0 && old.sa_handler == SIG_IGN) {
    Log(LogLevel::kInfo, "trace: signal " + std::to_string(sig) + " is ignored by the process; no dumps on it");
    return;
  }
  g_previous_dump_action = old;  // a handler already there runs after the dump
  struct sigaction sa{};
  sa.sa_sigaction = OnDumpSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  if (sigaction(static_cast<int>(sig), &sa, nullptr) == 0) t->ring->header()->dump_signal = static_cast<int32_t>(sig);
}

void Initialise() {
  const char* dir = getenv("LIFELINE_AGENT");
  if (dir == nullptr || *dir == '\0') {
    g_state.store(1, std::memory_order_release);
    return;
  }
  const char* rank_env = getenv("RANK");
  // A spare interpreter the agent started ahead of a relaunch (LIFELINE_PRESTART=1) learns its
  // rank only when it is handed one: decide then, not now.
  if (rank_env == nullptr) {
    const char* prestart = getenv("LIFELINE_PRESTART");
    if (prestart != nullptr && std::strcmp(prestart, "1") == 0) return;
  }
  char* end = nullptr;
  const long rank = rank_env != nullptr ? strtol(rank_env, &end, 10) : -1;
  if (rank_env == nullptr || end == rank_env || *end != '\0' || rank < 0 || rank > 1 << 24) {
    Log(LogLevel::kWarning, "trace: LIFELINE_AGENT is set but RANK is not a rank number; tracing is off");
    g_state.store(1, std::memory_order_release);
    return;
  }
  // The agent makes one ring per rank it launched, numbered by its local rank (the same as the
  // global rank on a single node).
  long local = rank;
  if (const char* local_env = getenv("LOCAL_RANK"); local_env != nullptr && *local_env != '\0') {
    char* local_end = nullptr;
    local = strtol(local_env, &local_end, 10);
    if (local_end == local_env || *local_end != '\0' || local < 0 || local > 1 << 24) {
      Log(LogLevel::kWarning, "trace: LOCAL_RANK is not a rank number; tracing is off");
      g_state.store(1, std::memory_order_release);
      return;
    }
  }
  Result<std::unique_ptr<TraceRing>> ring = TraceRing::Open(RingPath(dir, static_cast<int>(local)));
  if (!ring.ok()) {
    Log(LogLevel::kWarning, "trace: no ring from the agent, tracing is off: " + ring.status().ToString());
    g_state.store(1, std::memory_order_release);
    return;
  }
  auto* t = new Tracer;  // lives as long as the process: a signal handler may use it at any time
  t->ring = std::move(*ring);
  t->rank = static_cast<int>(rank);
  t->ring->header()->producer_pid = static_cast<int32_t>(getpid());
  g_tracer = t;
  InstallDumpHandler(t, dir);
  g_state.store(2, std::memory_order_release);
}

// The tracer, or null when no agent listens. After the first call: one load and one branch.
inline Tracer* Get() {
  const int state = g_state.load(std::memory_order_acquire);
  if (state == 2) return g_tracer;
  if (state == 1) return nullptr;
  {
    std::lock_guard<std::mutex> lock(g_init);
    if (g_state.load(std::memory_order_acquire) == 0) Initialise();
  }
  return g_state.load(std::memory_order_acquire) == 2 ? g_tracer : nullptr;
}

inline void Emit(Tracer* t, Event e) {
  if (e.time_ns == 0) e.time_ns = MonotonicNanos();
  t->ring->Push(e);
}

inline void EmitSimple(EventType type, uint64_t step) {
  Tracer* t = Get();
  if (t == nullptr) return;
  Event e;
  e.type = type;
  e.step = step;
  Emit(t, e);
}

inline void EmitCollective(EventType type, uint64_t seq, uint32_t comm) {
  Tracer* t = Get();
  if (t == nullptr) return;
  Event e;
  e.type = type;
  e.comm = comm;
  e.seq = seq;
  e.step = t->step.load(std::memory_order_relaxed);
  Emit(t, e);
}

// The scalars this process named (RegisterScalar), by id. Registration takes `mu`; reporting reads
// `count` (acquire) and the names below it, which never change once published.
struct ScalarTable {
  std::mutex mu;
  std::vector<std::string> names{"loss", "grad_norm"};  // GUARDED_BY(mu)
  std::atomic<uint32_t> count{kFirstUserScalar};
  char packed[kMaxScalars][kMaxScalarNameBytes] = {};  // each id's name as its kScalarName event holds it
  std::atomic<bool> announced[kMaxScalars] = {};       // its kScalarName is in the ring
};

ScalarTable& Scalars() {
  static ScalarTable* table = new ScalarTable;  // used until the process ends, from any thread
  return *table;
}

bool IsScalarNameChar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' || c == '/' || c == '-';
}

bool IsScalarName(const char* p, size_t n) {
  if (n == 0 || n > kMaxScalarNameBytes) return false;
  for (size_t i = 0; i < n; ++i)
    if (!IsScalarNameChar(static_cast<unsigned char>(p[i]))) return false;
  return true;
}

// The 32 name bytes of a kScalarName event live in seq, bytes, duration_ns and aux, in that order.
constexpr size_t kNameOffset = offsetof(Event, seq);
static_assert(offsetof(Event, aux) + sizeof(uint64_t) - kNameOffset == kMaxScalarNameBytes, "a name fills 32 bytes");

bool AnnounceScalar(Tracer* t, uint32_t id) {
  ScalarTable& table = Scalars();
  Event e;
  e.type = EventType::kScalarName;
  e.comm = id;
  e.step = t->step.load(std::memory_order_relaxed);
  std::memcpy(reinterpret_cast<char*>(&e) + kNameOffset, table.packed[id], kMaxScalarNameBytes);
  e.time_ns = MonotonicNanos();
  if (!t->ring->Push(e)) return false;
  table.announced[id].store(true, std::memory_order_relaxed);
  return true;
}

}  // namespace

bool Active() { return Get() != nullptr; }

Result<uint32_t> RegisterScalar(const std::string& name) {
  if (!IsScalarName(name.data(), name.size()))
    return Status::InvalidArgument("scalar name '" + name + "'",
                                   "expected 1 to 32 characters of A-Z a-z 0-9 _ . : / -");
  ScalarTable& table = Scalars();
  std::lock_guard<std::mutex> lock(table.mu);
  for (size_t id = 0; id < table.names.size(); ++id)
    if (table.names[id] == name) return static_cast<uint32_t>(id);
  if (table.names.size() >= kMaxScalars)
    return Status::ResourceExhausted("scalar name '" + name + "'",
                                     "a process names at most " + std::to_string(kMaxScalars) + " scalars");
  const auto id = static_cast<uint32_t>(table.names.size());
  table.names.push_back(name);
  std::memcpy(table.packed[id], name.data(), name.size());
  table.count.store(id + 1, std::memory_order_release);
  return id;
}

void ReportScalar(uint32_t id, double value, uint64_t step) {
  Tracer* t = Get();
  if (t == nullptr) return;
  ScalarTable& table = Scalars();
  if (id >= table.count.load(std::memory_order_acquire)) return;
  // A user scalar's name goes first; when the ring refuses it, so is the value (retried next time).
  if (id >= kFirstUserScalar && !table.announced[id].load(std::memory_order_relaxed) && !AnnounceScalar(t, id)) return;
  Event e;
  e.type = EventType::kScalar;
  e.comm = id;
  e.step = step != kNoStep ? step : t->step.load(std::memory_order_relaxed);
  std::memcpy(&e.aux, &value, sizeof(value));
  Emit(t, e);
}

double ScalarValue(const Event& event) {
  double v;
  std::memcpy(&v, &event.aux, sizeof(v));
  return v;
}

Result<std::string> DecodeScalarName(const Event& event) {
  if (event.type != EventType::kScalarName)
    return Status::InvalidArgument("trace event", std::string("a ") + EventTypeName(event.type) + " event, not scalar_name");
  char bytes[kMaxScalarNameBytes];
  std::memcpy(bytes, reinterpret_cast<const char*>(&event) + kNameOffset, sizeof(bytes));
  size_t n = 0;
  while (n < sizeof(bytes) && bytes[n] != '\0') ++n;
  for (size_t i = n; i < sizeof(bytes); ++i)
    if (bytes[i] != '\0') return Status::InvalidArgument("scalar_name event", "bytes after the name's end");
  if (!IsScalarName(bytes, n)) return Status::InvalidArgument("scalar_name event", "not a scalar name");
  return std::string(bytes, n);
}

void StepBegin(uint64_t step) {
  Tracer* t = Get();
  if (t == nullptr) return;
  t->step.store(step, std::memory_order_relaxed);
  Event e;
  e.type = EventType::kStepBegin;
  e.step = step;
  Emit(t, e);
}

void StepEnd(uint64_t step) { EmitSimple(EventType::kStepEnd, step); }

uint64_t CollectiveBegin(Op op, uint64_t bytes, uint32_t comm, uint64_t seq) {
  Tracer* t = Get();
  if (t == nullptr) return 0;
  if (seq == 0) {
    if (comm >= kCountedComms) return 0;  // the caller must number collectives on such communicators
    seq = t->next_seq[comm].fetch_add(1, std::memory_order_relaxed) + 1;
  }
  Event e;
  e.type = EventType::kCollectiveBegin;
  e.op = op;
  e.comm = comm;
  e.seq = seq;
  e.bytes = bytes;
  e.step = t->step.load(std::memory_order_relaxed);
  Emit(t, e);
  return seq;
}

void CollectivePosted(uint64_t seq, uint32_t comm) { EmitCollective(EventType::kCollectivePosted, seq, comm); }
void CollectiveEnd(uint64_t seq, uint32_t comm) { EmitCollective(EventType::kCollectiveEnd, seq, comm); }

void Heartbeat() {
  Tracer* t = Get();
  if (t == nullptr) return;
  Event e;
  e.type = EventType::kHeartbeat;
  e.step = t->step.load(std::memory_order_relaxed);
  Emit(t, e);
}

void ProcessStart(uint64_t resumed_step, ResumeSource source, uint64_t load_ns) {
  Tracer* t = Get();
  if (t == nullptr) return;
  Event e;
  e.type = EventType::kProcessStart;
  e.step = resumed_step;
  e.aux = static_cast<uint64_t>(getpid());
  e.seq = static_cast<uint64_t>(source);
  e.duration_ns = load_ns;
  Emit(t, e);
}

void ProcessExit() {
  Tracer* t = Get();
  if (t == nullptr) return;
  Event e;
  e.type = EventType::kProcessExit;
  e.step = t->step.load(std::memory_order_relaxed);
  Emit(t, e);
}

void ReportCheckpointDirectory(const std::string& directory) {
  Tracer* t = Get();
  const char* agent = getenv("LIFELINE_AGENT");
  if (t == nullptr || agent == nullptr || directory.empty()) return;
  std::string absolute = directory;
  if (absolute[0] != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd)) == nullptr) return;
    absolute = JoinPath(cwd, directory);
  }
  const std::string path = JoinPath(agent, kCheckpointDirFile);
  if (Env::Default()->FileExists(path)) return;
  // Already there (another rank won the race) is the normal outcome of all but one rank.
  WriteFileAtomically(Env::Default(), path, absolute, /*replace=*/false).IgnoreError();
}

void ReportMemoryTier(const std::string& root) {
  Tracer* t = Get();
  const char* agent = getenv("LIFELINE_AGENT");
  if (t == nullptr || agent == nullptr || root.empty()) return;
  const std::string path = JoinPath(agent, kMemoryTierFile);
  if (Env::Default()->FileExists(path)) return;
  WriteFileAtomically(Env::Default(), path, root, /*replace=*/false).IgnoreError();
}

void Record(const Event& event) {
  Tracer* t = Get();
  if (t == nullptr) return;
  Event e = event;
  // Integrations that do not know the step (the NCCL plugin) get the one the process is in.
  if (e.step == kNoStep) e.step = t->step.load(std::memory_order_relaxed);
  Emit(t, e);
}

// The 24 name bytes of a kReplicaName event live in bytes, duration_ns and aux, in that order.
constexpr size_t kReplicaNameOffset = offsetof(Event, bytes);
static_assert(offsetof(Event, aux) + sizeof(uint64_t) - kReplicaNameOffset == kReplicaNamePartBytes,
              "a name part fills 24 bytes");

bool ReportReplicaName(uint64_t key, const std::string& name) {
  Tracer* t = Get();
  if (t == nullptr || name.empty()) return false;
  const size_t n = std::min<size_t>(name.size(), kMaxReplicaNameParts * kReplicaNamePartBytes);
  const uint32_t parts = static_cast<uint32_t>((n + kReplicaNamePartBytes - 1) / kReplicaNamePartBytes);
  for (uint32_t k = 0; k < parts; ++k) {
    Event e;
    e.type = EventType::kReplicaName;
    e.op = static_cast<Op>(parts);
    e.comm = k;
    e.seq = key;
    e.step = t->step.load(std::memory_order_relaxed);
    const size_t begin = k * kReplicaNamePartBytes, len = std::min(kReplicaNamePartBytes, n - begin);
    std::memcpy(reinterpret_cast<char*>(&e) + kReplicaNameOffset, name.data() + begin, len);
    e.time_ns = MonotonicNanos();
    if (!t->ring->Push(e)) return false;
  }
  return true;
}

void ReportReplicaDigest(uint64_t step, uint64_t key, uint32_t replica_count, uint64_t bytes, uint64_t tensor_offset,
                         uint64_t digest) {
  Tracer* t = Get();
  if (t == nullptr) return;
  Event e;
  e.type = EventType::kReplicaDigest;
  e.comm = replica_count;
  e.step = step;
  e.seq = key;
  e.bytes = bytes;
  e.duration_ns = tensor_offset;
  e.aux = digest;
  Emit(t, e);
}

Result<ReplicaNamePart> DecodeReplicaNamePart(const Event& event) {
  if (event.type != EventType::kReplicaName)
    return Status::InvalidArgument("trace event", std::string("a ") + EventTypeName(event.type) + " event, not replica_name");
  ReplicaNamePart part;
  part.key = event.seq;
  part.part = event.comm;
  part.parts = static_cast<uint32_t>(event.op);
  if (part.parts == 0 || part.parts > kMaxReplicaNameParts || part.part >= part.parts)
    return Status::InvalidArgument("replica_name event", "part " + std::to_string(part.part) + " of " +
                                                             std::to_string(part.parts) + " is out of bounds");
  char bytes[kReplicaNamePartBytes];
  std::memcpy(bytes, reinterpret_cast<const char*>(&event) + kReplicaNameOffset, sizeof(bytes));
  size_t n = 0;
  while (n < sizeof(bytes) && bytes[n] != '\0') ++n;
  for (size_t i = n; i < sizeof(bytes); ++i)
    if (bytes[i] != '\0') return Status::InvalidArgument("replica_name event", "bytes after a NUL");
  // Only the last part may be short.
  if (n == 0 || (n < sizeof(bytes) && part.part + 1 != part.parts))
    return Status::InvalidArgument("replica_name event", "a part of " + std::to_string(n) + " bytes");
  part.bytes.assign(bytes, n);
  return part;
}

Status DumpRecent(const std::string& path, uint64_t max_events) {
  Tracer* t = Get();
  if (t == nullptr) return Status::FailedPrecondition("trace dump", "tracing is inactive (LIFELINE_AGENT unset)");
  const uint64_t n = std::min<uint64_t>(max_events, t->ring->capacity());
  std::unique_ptr<Event[]> events(new Event[n]);
  const size_t got = t->ring->Recent(events.get(), n);
  const int fd = CreateFreshFile(path.c_str(), O_WRONLY, 0600);
  if (fd < 0) return Status::FromErrno(errno, path);
  std::string out;
  char line[512];
  for (size_t i = 0; i < got; ++i) {
    out.append(line, FormatEventJson(events[i], t->rank, line, sizeof(line)));
    out.push_back('\n');
  }
  if (!WriteAll(fd, out.data(), out.size())) {
    Status s = Status::FromErrno(errno, path);
    close(fd);
    return s;
  }
  if (close(fd) != 0) return Status::FromErrno(errno, path);
  return Status::OK();
}

uint64_t Dropped() {
  Tracer* t = Get();
  return t == nullptr ? 0 : t->ring->header()->dropped.load(std::memory_order_relaxed);
}

}  // namespace lifeline::trace
