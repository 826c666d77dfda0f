#include "lifeline/internal/trace_ring.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <new>

namespace lifeline::trace {
namespace {

std::atomic_ref<uint64_t> StampOf(Event& e) { return std::atomic_ref<uint64_t>(e.stamp); }

// Copies an event's payload, everything but its stamp: the stamp is the slot's ownership flag and
// is only ever touched atomically.
void CopyPayload(Event* dst, const Event& src) {
  static_assert(offsetof(Event, stamp) == sizeof(Event) - sizeof(uint64_t), "stamp is the last field");
  std::memcpy(static_cast<void*>(dst), &src, offsetof(Event, stamp));
}

uint64_t RoundUpPow2(uint64_t v) {
  uint64_t p = 64;
  while (p < v && p < (uint64_t{1} << 30)) p <<= 1;
  return p;
}

}  // namespace

std::string RingPath(const std::string& dir, int rank) { return dir + "/ring." + std::to_string(rank); }

uint64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

TraceRing::TraceRing(std::string path, MappedRegion region)
    : path_(std::move(path)),
      region_(std::move(region)),
      header_(reinterpret_cast<RingHeader*>(region_.data())),
      slots_(reinterpret_cast<Event*>(region_.data() + kRingHeaderBytes)),
      capacity_(header_->capacity) {}

TraceRing::~TraceRing() = default;

Result<std::unique_ptr<TraceRing>> TraceRing::Create(const std::string& path, int rank, uint64_t capacity) {
  capacity = RoundUpPow2(capacity);
  const uint64_t bytes = kRingHeaderBytes + capacity * sizeof(Event);
  // A new inode each time: a process of an earlier launch that still maps the old file keeps
  // writing there, never into the new ring.
  LL_ASSIGN_OR_RETURN(OwnedFd fd, OpenSharedFile(path, CreateMode::kFresh));
  LL_RETURN_IF_ERROR(SizeSharedFile(fd.get(), bytes, /*reserve=*/false, path));
  LL_ASSIGN_OR_RETURN(MappedRegion region, MappedRegion::MapFile(fd.get(), bytes, /*writable=*/true, path));
  auto* h = new (region.data()) RingHeader{};
  h->magic = kRingMagic;
  h->version = kRingVersion;
  h->event_bytes = sizeof(Event);
  h->capacity = capacity;
  h->rank = rank;
  h->created_ns = MonotonicNanos();
  auto* slots = reinterpret_cast<Event*>(region.data() + kRingHeaderBytes);
  for (uint64_t i = 0; i < capacity; ++i) StampOf(slots[i]).store(i, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  return std::unique_ptr<TraceRing>(new TraceRing(path, std::move(region)));
}

Result<std::unique_ptr<TraceRing>> TraceRing::Open(const std::string& path) {
  const int raw = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (raw < 0) return Status::FromErrno(errno, path);
  OwnedFd fd(raw);
  LL_ASSIGN_OR_RETURN(FileIdentity id, IdentifyFile(fd.get(), path));
  const uint64_t size = id.size;
  if (size < kRingHeaderBytes)
    return Status::Corruption(path, "trace ring shorter than its header (" + std::to_string(size) + " bytes)");
  LL_ASSIGN_OR_RETURN(MappedRegion region, MappedRegion::MapFile(fd.get(), size, /*writable=*/true, path));
  const auto* h = reinterpret_cast<const RingHeader*>(region.data());
  std::string bad;
  if (h->magic != kRingMagic) {
    bad = "not a trace ring (bad magic)";
  } else if (h->version != kRingVersion) {
    bad = "trace ring version " + std::to_string(h->version) + ", this library reads " + std::to_string(kRingVersion);
  } else if (h->event_bytes != sizeof(Event)) {
    bad = "event size " + std::to_string(h->event_bytes) + ", expected " + std::to_string(sizeof(Event));
  } else if (h->capacity < 64 || (h->capacity & (h->capacity - 1)) != 0 || h->capacity > (uint64_t{1} << 30) ||
             kRingHeaderBytes + h->capacity * sizeof(Event) > size) {
    bad = "capacity " + std::to_string(h->capacity) + " does not fit the file of " + std::to_string(size) + " bytes";
  }
  if (!bad.empty()) return Status::Corruption(path, bad);
  return std::unique_ptr<TraceRing>(new TraceRing(path, std::move(region)));
}

bool TraceRing::Push(const Event& event) {
  const uint64_t mask = capacity_ - 1;
  uint64_t pos = header_->head.load(std::memory_order_relaxed);
  for (;;) {
    Event& cell = slots_[pos & mask];
    const uint64_t stamp = StampOf(cell).load(std::memory_order_acquire);
    const auto diff = static_cast<int64_t>(stamp - pos);
    if (diff == 0) {
      if (header_->head.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
    } else if (diff < 0) {  // the consumer has not freed this slot: full
      header_->dropped.fetch_add(1, std::memory_order_relaxed);
      return false;
    } else {  // another producer took `pos`
      pos = header_->head.load(std::memory_order_relaxed);
    }
  }
  Event& cell = slots_[pos & mask];
  CopyPayload(&cell, event);
  StampOf(cell).store(pos + 1, std::memory_order_release);
  return true;
}

size_t TraceRing::Drain(std::vector<Event>* out) {
  const uint64_t mask = capacity_ - 1;
  uint64_t t = header_->tail.load(std::memory_order_relaxed);
  size_t n = 0;
  for (;; ++t, ++n) {
    Event& cell = slots_[t & mask];
    if (StampOf(cell).load(std::memory_order_acquire) != t + 1) break;
    Event e;
    CopyPayload(&e, cell);
    e.stamp = t;
    out->push_back(e);
    StampOf(cell).store(t + capacity_, std::memory_order_release);
  }
  header_->tail.store(t, std::memory_order_release);
  return n;
}

size_t TraceRing::Recent(Event* out, size_t max_events) const {
  const uint64_t mask = capacity_ - 1;
  const uint64_t head = header_->head.load(std::memory_order_acquire);
  const uint64_t want = std::min<uint64_t>({max_events, capacity_, head});
  // Newest first into the tail of `out`, then moved to the front: oldest first.
  size_t got = 0;
  for (uint64_t k = 0; k < want; ++k) {
    const uint64_t pos = head - 1 - k;
    Event& cell = slots_[pos & mask];
    const uint64_t before = StampOf(cell).load(std::memory_order_acquire);
    if (before != pos + 1 && before != pos + capacity_) break;  // not yet published, or reused
    Event e;
    CopyPayload(&e, cell);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (StampOf(cell).load(std::memory_order_relaxed) != before) break;  // overwritten while copied
    e.stamp = pos;
    out[want - 1 - got] = e;
    ++got;
  }
  if (got < want) std::memmove(static_cast<void*>(out), out + (want - got), got * sizeof(Event));
  return got;
}

namespace {

// Appends to a fixed buffer without allocating (usable in a signal handler).
class Appender {
 public:
  Appender(char* buf, size_t size) : buf_(buf), size_(size) {}
  void Str(const char* s) {
    while (*s != '\0') Char(*s++);
  }
  void Char(char c) {
    if (len_ + 1 < size_) buf_[len_++] = c;
  }
  void Uint(uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
      tmp[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (n > 0) Char(tmp[--n]);
  }
  // A double for a person, about 9 significant digits, without allocating (snprintf is not
  // async-signal-safe); the exact bits travel beside it. JSON has no NaN or infinity: strings.
  void Double(double v) {
    if (std::isnan(v)) return Str("\"nan\"");
    if (std::isinf(v)) return Str(v > 0 ? "\"inf\"" : "\"-inf\"");
    if (v < 0) {
      Char('-');
      v = -v;
    }
    if (v == 0) return Char('0');
    int exp10 = static_cast<int>(std::floor(std::log10(v)));
    // 9 digits: 1e8 <= digits < 1e9. Subnormals need a scale beyond a double's range: in two steps.
    int shift = 8 - exp10;
    double digits = v;
    if (shift > 300) {
      digits *= 1e300;
      shift -= 300;
    }
    digits = std::round(digits * std::pow(10.0, shift));
    if (!(digits >= 1e8 && digits < 1e10)) digits = 1e8;  // never out of range, whatever rounding did
    if (digits >= 1e9) {
      digits = std::round(digits / 10);
      ++exp10;
    }
    auto m = static_cast<uint64_t>(digits);
    char tmp[9];
    for (int i = 8; i >= 0; --i, m /= 10) tmp[i] = static_cast<char>('0' + m % 10);
    int last = 8;
    while (last > 0 && tmp[last] == '0') --last;
    Char(tmp[0]);
    if (last > 0) {
      Char('.');
      for (int i = 1; i <= last; ++i) Char(tmp[i]);
    }
    if (exp10 != 0) {
      Char('e');
      if (exp10 < 0) Char('-');
      Uint(static_cast<uint64_t>(exp10 < 0 ? -exp10 : exp10));
    }
  }
  size_t Finish() {
    if (size_ > 0) buf_[len_ < size_ ? len_ : size_ - 1] = '\0';
    return len_;
  }

 private:
  char* buf_;
  size_t size_;
  size_t len_ = 0;
};

}  // namespace

size_t FormatEventJson(const Event& e, int rank, char* buf, size_t size) {
  Appender a(buf, size);
  a.Str("{\"t_ns\":");
  a.Uint(e.time_ns);
  a.Str(",\"rank\":");
  if (rank < 0) {
    a.Char('-');
    a.Uint(static_cast<uint64_t>(-static_cast<int64_t>(rank)));
  } else {
    a.Uint(static_cast<uint64_t>(rank));
  }
  a.Str(",\"type\":\"");
  a.Str(EventTypeName(e.type));
  a.Char('"');
  if (e.step != kNoStep) {
    a.Str(",\"step\":");
    a.Uint(e.step);
  }
  const bool collective = e.type == EventType::kCollectiveBegin || e.type == EventType::kCollectivePosted ||
                          e.type == EventType::kCollectiveEnd;
  if (collective) {
    a.Str(",\"comm\":");
    a.Uint(e.comm);
    a.Str(",\"seq\":");
    a.Uint(e.seq);
    a.Str(",\"op\":\"");
    a.Str(OpName(e.op));
    a.Char('"');
  }
  if (e.type == EventType::kScalar || e.type == EventType::kScalarName) {
    a.Str(",\"scalar\":");
    a.Uint(e.comm);
    if (e.type == EventType::kScalar) {
      a.Str(",\"value\":");
      a.Double(ScalarValue(e));
      a.Str(",\"value_bits\":");
      a.Uint(e.aux);
    } else {  // the bytes as they are, up to 32, anything outside a name's characters as '?'
      a.Str(",\"name\":\"");
      const char* name = reinterpret_cast<const char*>(&e) + offsetof(Event, seq);
      for (size_t i = 0; i < kMaxScalarNameBytes && name[i] != '\0'; ++i) {
        const char c = name[i];
        const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                           c == '.' || c == ':' || c == '/' || c == '-';
        a.Char(plain ? c : '?');
      }
      a.Char('"');
    }
    a.Char('}');
    return a.Finish();
  }
  if (e.type == EventType::kReplicaDigest || e.type == EventType::kReplicaName) {
    a.Str(",\"key\":");
    a.Uint(e.seq);
    a.Str(e.type == EventType::kReplicaDigest ? ",\"replicas\":" : ",\"part\":");
    a.Uint(e.comm);
    if (e.type == EventType::kReplicaDigest) {
      a.Str(",\"bytes\":");
      a.Uint(e.bytes);
      a.Str(",\"digest\":");
      a.Uint(e.aux);
    }
    a.Char('}');
    return a.Finish();
  }
  if (e.bytes != 0) {
    a.Str(",\"bytes\":");
    a.Uint(e.bytes);
  }
  if (e.duration_ns != 0) {
    a.Str(",\"duration_ns\":");
    a.Uint(e.duration_ns);
  }
  if (e.aux != 0) {
    a.Str(",\"aux\":");
    a.Uint(e.aux);
  }
  a.Char('}');
  return a.Finish();
}

}  // namespace lifeline::trace
