// The plugin's core: operation slots, completion inference and trace events. See nccl_profiler.h.
#include "agent/nccl/nccl_profiler.h"

#include <strings.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "lifeline/trace.h"

namespace lifeline::nccl_profiler {
namespace {

using nccl_abi::ncclDebugLogger_t;

constexpr uint32_t kContextLive = 0x4c4c4358;  // "LLCX"
constexpr uint32_t kSlotLive = 0x4c4c4f50;     // "LLOP": an operation begun and not retired
constexpr uint32_t kSlotFree = 0x4c4c4652;     // "LLFR"
constexpr uint32_t kDefaultSlots = 1024;
constexpr uint32_t kMaxSlots = 1u << 20;

// A child's handle is its parent slot's address with one of these in the low bits (slots are
// 64-byte aligned); an operation's handle is the slot's address itself.
constexpr uintptr_t kTagBits = 63;
constexpr uintptr_t kTagKernel = 1;
constexpr uintptr_t kTagProxy = 2;

struct Context;

// One operation (Coll, CeColl or P2p). Guarded by its context's mutex.
struct alignas(64) Slot {
  uint32_t magic = kSlotFree;
  Kind kind = Kind::kUntracked;
  bool stopped = false;  // NCCL stopped it: enqueued
  bool ended = false;    // CollectiveEnd written
  bool saw_child = false;
  uint16_t kernels_expected = 0;
  uint16_t kernels_stopped = 0;
  uint32_t running_children = 0;  // started, not yet stopped
  trace::Op op = trace::Op::kOther;
  uint32_t comm = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;
  uint64_t begin_ns = 0;
  Context* context = nullptr;  // set once at init, kept while free
  Slot* prev = nullptr;        // the open list (begun, not ended), in begin order
  Slot* next = nullptr;        // the open list; the free queue while free
};
static_assert(alignof(Slot) > kTagBits, "tags fit below a slot's alignment");

struct Stats {
  uint64_t begun = 0;
  uint64_t ended = 0;
  uint64_t enqueue_only = 0;
  uint64_t closed_by_successor = 0;
  uint64_t dropped = 0;         // no free slot
  uint64_t untracked = 0;       // a p2p with a peer outside the comm or an unknown function
  uint64_t stray_children = 0;  // a child whose parent is not a live operation of this context
  uint64_t repeated_stops = 0;  // a stop for an event already stopped
};

struct Context {
  uint32_t magic = kContextLive;
  std::mutex mu;
  uint64_t key = 0;  // commHash, or the name's hash
  uint32_t comm = 0;
  int rank = 0;
  int nranks = 1;
  bool kernel_children = false;  // KernelCh events were requested
  ncclDebugLogger_t logfn = nullptr;
  int abi_version = 0;
  uint64_t coll_seq = 0;                  // collectives started, dropped ones included
  std::unique_ptr<uint32_t[]> p2p_count;  // [2 * peer]: sends to peer, [2 * peer + 1]: recvs from it
  std::unique_ptr<Slot[]> slots;
  uint32_t capacity = 0;
  Slot* free_head = nullptr;
  Slot* free_tail = nullptr;
  Slot* open_head = nullptr;
  Slot* open_tail = nullptr;
  Stats stats;
};

std::atomic<bool> g_disabled{false};
std::atomic<int*> g_mask{nullptr};  // NCCL's activation mask, as init last saw it

bool Disabled() { return g_disabled.load(std::memory_order_relaxed); }

// Turns the plugin off for the process, saying why once.
void Disable(const char* why) {
  if (g_disabled.exchange(true)) return;
  if (int* mask = g_mask.load()) __atomic_store_n(mask, 0, __ATOMIC_RELAXED);
  std::fprintf(stderr, "lifeline nccl profiler: %s; collective tracing is off for the rest of this process\n", why);
}

uint64_t Now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t Fmix64(uint64_t x) {  // MurmurHash3's finalizer
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

uint32_t Fold32(uint64_t h) {
  const uint32_t v = static_cast<uint32_t>(h ^ (h >> 32));
  return v != 0 ? v : 1;
}

uint64_t CommKey(uint64_t comm_hash, const char* comm_name) {
  if (comm_hash != 0 || comm_name == nullptr) return comm_hash;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (const char* p = comm_name; *p != '\0'; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 0x100000001b3ull;
  return h;
}

uint32_t PairId(uint64_t key, int sender, int receiver) {
  const uint64_t pair = static_cast<uint64_t>(static_cast<uint32_t>(sender)) << 32 | static_cast<uint32_t>(receiver);
  return Fold32(Fmix64(key ^ (Fmix64(pair) + 0x9e3779b97f4a7c15ull)));
}

// The function names ncclFuncToString gives (NCCL 2.26-2.29).
trace::Op OpFromFunc(const char* func) {
  if (func == nullptr) return trace::Op::kOther;
  struct Name {
    const char* name;
    trace::Op op;
  };
  static constexpr Name kNames[] = {
      {"AllReduce", trace::Op::kAllReduce}, {"AllGather", trace::Op::kAllGather},
      {"ReduceScatter", trace::Op::kReduceScatter}, {"Broadcast", trace::Op::kBroadcast},
      {"Reduce", trace::Op::kReduce}, {"AlltoAll", trace::Op::kAllToAll}, {"AlltoAllv", trace::Op::kAllToAll},
      {"Send", trace::Op::kSend}, {"Recv", trace::Op::kRecv},
  };
  for (const Name& n : kNames)
    if (strcasecmp(func, n.name) == 0) return n.op;
  return trace::Op::kOther;
}

// Bytes per element for the names ncclDatatypeToString gives. Its table has no ncclUint8 case, so
// uint8 arrives as "Unknown" (NCCL rejects invalid types before it enqueues anything).
uint64_t DatatypeBytes(const char* datatype) {
  if (datatype == nullptr) return 0;
  struct Size {
    const char* name;
    uint64_t bytes;
  };
  static constexpr Size kSizes[] = {
      {"ncclInt8", 1},    {"ncclUint8", 1},    {"ncclFloat8e4m3", 1}, {"ncclFloat8e5m2", 1}, {"Unknown", 1},
      {"ncclFloat16", 2}, {"ncclBfloat16", 2}, {"ncclInt32", 4},      {"ncclUint32", 4},     {"ncclFloat32", 4},
      {"ncclInt64", 8},   {"ncclUint64", 8},   {"ncclFloat64", 8},
  };
  for (const Size& s : kSizes)
    if (std::strcmp(datatype, s.name) == 0) return s.bytes;
  return 0;
}

uint32_t SlotsFromEnv() {
  const char* v = std::getenv("LIFELINE_NCCL_PROFILER_SLOTS");
  if (v == nullptr || *v == '\0') return kDefaultSlots;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || n == 0) return kDefaultSlots;
  return n > kMaxSlots ? kMaxSlots : static_cast<uint32_t>(n);
}

// NCCL's logger (printed with NCCL_DEBUG=INFO). The arguments must be what `fmt` says.
template <typename... Args>
void LogInfo(const Context& c, const char* fmt, Args... args) {
  if (c.logfn != nullptr) c.logfn(nccl_abi::NCCL_LOG_INFO, nccl_abi::kNcclLogInit, __FILE__, __LINE__, fmt, args...);
}

using ull = unsigned long long;

// ---- slot lists (context mutex held) ----

Slot* PopFree(Context& c) {
  Slot* s = c.free_head;
  if (s == nullptr) return nullptr;
  c.free_head = s->next;
  if (c.free_head == nullptr) c.free_tail = nullptr;
  s->next = nullptr;
  return s;
}

void PushFree(Context& c, Slot* s) {
  s->magic = kSlotFree;
  s->prev = nullptr;
  s->next = nullptr;
  if (c.free_tail != nullptr) {
    c.free_tail->next = s;
  } else {
    c.free_head = s;
  }
  c.free_tail = s;
}

void AppendOpen(Context& c, Slot* s) {
  s->prev = c.open_tail;
  s->next = nullptr;
  if (c.open_tail != nullptr) {
    c.open_tail->next = s;
  } else {
    c.open_head = s;
  }
  c.open_tail = s;
}

void RemoveOpen(Context& c, Slot* s) {
  if (s->prev != nullptr) {
    s->prev->next = s->next;
  } else {
    c.open_head = s->next;
  }
  if (s->next != nullptr) {
    s->next->prev = s->prev;
  } else {
    c.open_tail = s->prev;
  }
  s->prev = nullptr;
  s->next = nullptr;
}

// Whether `p` is the address of one of c's slots.
bool IsSlotOf(const Context& c, uintptr_t p) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(c.slots.get());
  if (p < base) return false;
  const uintptr_t off = p - base;
  return off % sizeof(Slot) == 0 && off / sizeof(Slot) < c.capacity;
}

// ---- completion (context mutex held) ----

void WriteEnd(Context& c, Slot* s, uint64_t aux) {
  s->ended = true;
  RemoveOpen(c, s);
  trace::Event e;
  e.time_ns = Now();
  e.type = trace::EventType::kCollectiveEnd;
  e.op = s->op;
  e.comm = s->comm;
  e.seq = s->seq;
  e.bytes = s->bytes;
  e.duration_ns = e.time_ns >= s->begin_ns ? e.time_ns - s->begin_ns : 0;
  e.aux = aux;
  trace::Record(e);
  ++c.stats.ended;
  if (aux & kAuxEnqueueOnly) ++c.stats.enqueue_only;
  if (aux & kAuxClosedBySuccessor) ++c.stats.closed_by_successor;
}

void MaybeRetire(Context& c, Slot* s) {
  if (s->ended && s->stopped && s->running_children == 0) PushFree(c, s);
}

// Ends `s` when its completion is known, first ending every older open operation on its comm.
void Settle(Context& c, Slot* s) {
  if (!s->ended && s->stopped && s->running_children == 0 && s->kernels_stopped >= s->kernels_expected) {
    for (Slot* o = c.open_head; o != nullptr && o != s;) {
      Slot* next = o->next;
      if (o->comm == s->comm) {
        WriteEnd(c, o, kAuxClosedBySuccessor);
        MaybeRetire(c, o);
      }
      o = next;
    }
    WriteEnd(c, s, s->saw_child ? 0 : kAuxEnqueueOnly);
  }
  MaybeRetire(c, s);
}

void* StartOperation(Context& c, const Descriptor& d) {
  const trace::Op op = OpFromFunc(d.func);
  const uint64_t bytes = d.count * DatatypeBytes(d.datatype);
  std::lock_guard<std::mutex> lock(c.mu);
  uint32_t comm;
  uint64_t seq;
  if (d.kind == Kind::kP2p) {
    if ((op != trace::Op::kSend && op != trace::Op::kRecv) || d.peer < 0 || d.peer >= c.nranks) {
      ++c.stats.untracked;
      return nullptr;
    }
    const bool send = op == trace::Op::kSend;
    comm = send ? PairId(c.key, c.rank, d.peer) : PairId(c.key, d.peer, c.rank);
    seq = ++c.p2p_count[2 * static_cast<size_t>(d.peer) + (send ? 0 : 1)];
  } else {
    comm = c.comm;
    seq = ++c.coll_seq;
  }
  Slot* s = PopFree(c);
  if (s == nullptr) {
    ++c.stats.dropped;
    return nullptr;
  }
  s->magic = kSlotLive;
  s->kind = d.kind;
  s->stopped = false;
  s->ended = false;
  s->saw_child = false;
  s->running_children = 0;
  s->kernels_stopped = 0;
  s->kernels_expected = 0;
  if (c.kernel_children) {
    if (d.kind == Kind::kColl) s->kernels_expected = d.channels;
    if (d.kind == Kind::kP2p && d.channels > 0) s->kernels_expected = 1;
  }
  s->op = op;
  s->comm = comm;
  s->seq = seq;
  s->bytes = bytes;
  s->begin_ns = Now();
  AppendOpen(c, s);
  ++c.stats.begun;

  trace::Event e;
  e.time_ns = s->begin_ns;
  e.type = trace::EventType::kCollectiveBegin;
  e.op = op;
  e.comm = comm;
  e.seq = seq;
  e.bytes = bytes;
  trace::Record(e);
  return s;
}

void* StartChild(Context& c, const Descriptor& d) {
  const uintptr_t parent = reinterpret_cast<uintptr_t>(d.parent);
  std::lock_guard<std::mutex> lock(c.mu);
  if (parent == 0 || !IsSlotOf(c, parent)) {
    ++c.stats.stray_children;
    return nullptr;
  }
  Slot* s = reinterpret_cast<Slot*>(parent);
  if (s->magic != kSlotLive) {  // retired: a very late child
    ++c.stats.stray_children;
    return nullptr;
  }
  ++s->running_children;
  s->saw_child = true;
  return reinterpret_cast<void*>(parent | (d.kind == Kind::kKernelCh ? kTagKernel : kTagProxy));
}

}  // namespace

uint32_t CommId(uint64_t comm_hash, const char* comm_name) noexcept {
  return Fold32(Fmix64(CommKey(comm_hash, comm_name)));
}

uint32_t PairCommId(uint64_t comm_hash, const char* comm_name, int sender, int receiver) noexcept {
  return PairId(CommKey(comm_hash, comm_name), sender, receiver);
}

void* Init(uint64_t comm_hash, const char* comm_name, int nranks, int rank, int* activation_mask,
           uint64_t extra_events, ncclDebugLogger_t logfn, int abi_version) noexcept {
  if (activation_mask != nullptr) *activation_mask = 0;
  if (Disabled()) return nullptr;
  if (!trace::Active()) {
    if (logfn != nullptr)
      logfn(nccl_abi::NCCL_LOG_INFO, nccl_abi::kNcclLogInit, __FILE__, __LINE__,
            "lifeline profiler: no Lifeline agent (LIFELINE_AGENT unset or its ring unusable), no events requested");
    return nullptr;
  }
  const int peers = nranks > 0 ? nranks : 1;
  auto* c = new (std::nothrow) Context;
  if (c != nullptr) {
    c->capacity = SlotsFromEnv();
    c->slots.reset(new (std::nothrow) Slot[c->capacity]);
    c->p2p_count.reset(new (std::nothrow) uint32_t[2 * static_cast<size_t>(peers)]());
  }
  if (c == nullptr || c->slots == nullptr || c->p2p_count == nullptr) {
    delete c;
    Disable("out of memory for the communicator's event slots");
    return nullptr;
  }
  c->key = CommKey(comm_hash, comm_name);
  c->comm = Fold32(Fmix64(c->key));
  c->rank = rank;
  c->nranks = peers;
  c->logfn = logfn;
  c->abi_version = abi_version;
  c->kernel_children = (kRequestedEvents & nccl_abi::ncclProfileKernelCh) != 0;
  for (uint32_t i = 0; i < c->capacity; ++i) {
    c->slots[i].context = c;
    PushFree(*c, &c->slots[i]);
  }
  if (activation_mask != nullptr) {
    g_mask.store(activation_mask);
    *activation_mask = static_cast<int>(kRequestedEvents | extra_events);
  }
  LogInfo(*c, "lifeline profiler (ABI v%d): comm hash 0x%llx is trace comm %u, rank %d of %d, %u slots", abi_version,
          static_cast<ull>(comm_hash), c->comm, rank, peers, c->capacity);
  return c;
}

void* Start(void* context, const Descriptor& d) noexcept {
  if (Disabled() || context == nullptr) return nullptr;
  Context& c = *static_cast<Context*>(context);
  if (c.magic != kContextLive) {
    Disable("an event started on an unknown or finalized context");
    return nullptr;
  }
  switch (d.kind) {
    case Kind::kColl:
    case Kind::kCeColl:
    case Kind::kP2p:
      return StartOperation(c, d);
    case Kind::kKernelCh:
    case Kind::kProxyOp:
      return StartChild(c, d);
    case Kind::kUntracked:
      break;
  }
  return nullptr;
}

void Stop(void* handle) noexcept {
  if (Disabled() || handle == nullptr) return;
  const uintptr_t h = reinterpret_cast<uintptr_t>(handle);
  const uintptr_t tag = h & kTagBits;
  Slot* s = reinterpret_cast<Slot*>(h & ~kTagBits);
  Context* c = s->context;
  if (c == nullptr || c->magic != kContextLive) {
    Disable("stop for an event handle this plugin did not issue");
    return;
  }
  std::lock_guard<std::mutex> lock(c->mu);
  if (!IsSlotOf(*c, reinterpret_cast<uintptr_t>(s)) || (tag != 0 && tag != kTagKernel && tag != kTagProxy)) {
    Disable("stop for an event handle this plugin did not issue");
    return;
  }
  if (s->magic == kSlotFree) {  // a stop repeated after the operation retired
    ++c->stats.repeated_stops;
    return;
  }
  if (s->magic != kSlotLive) {
    Disable("an event slot was overwritten");
    return;
  }
  if (tag == 0) {
    if (s->stopped) {
      ++c->stats.repeated_stops;
      return;
    }
    s->stopped = true;
  } else {
    if (s->running_children == 0) {
      ++c->stats.repeated_stops;
      return;
    }
    --s->running_children;
    if (tag == kTagKernel && !s->ended && s->kernels_stopped < UINT16_MAX) ++s->kernels_stopped;
  }
  Settle(*c, s);
}

void Finalize(void* context) noexcept {
  if (context == nullptr) return;
  auto* c = static_cast<Context*>(context);
  if (c->magic != kContextLive) {
    Disable("finalize of an unknown or already finalized context");
    return;
  }
  {
    std::lock_guard<std::mutex> lock(c->mu);
    const Stats& st = c->stats;
    LogInfo(*c,
            "lifeline profiler: trace comm %u finalized: %llu begun, %llu ended (%llu enqueue-only, %llu closed by "
            "a successor), %llu dropped (no free slot), %llu untracked, %llu repeated stops",
            c->comm, static_cast<ull>(st.begun), static_cast<ull>(st.ended), static_cast<ull>(st.enqueue_only),
            static_cast<ull>(st.closed_by_successor), static_cast<ull>(st.dropped),
            static_cast<ull>(st.untracked + st.stray_children), static_cast<ull>(st.repeated_stops));
    c->magic = 0;
  }
  delete c;
}

}  // namespace lifeline::nccl_profiler
