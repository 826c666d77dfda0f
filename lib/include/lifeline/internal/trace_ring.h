// Part of the declared internal interface (lifeline/internal/): for Lifeline's own binaries, not users.
// The shared-memory ring between a rank (producers: any of its threads) and the node agent (the
// single consumer). The agent creates the file before it launches the rank; the rank maps it.
//
// Layout: a 4 KiB header, then `capacity` (a power of two) 64-byte events. Positions grow without
// bound; position p lives in slot p & (capacity - 1). Each slot carries a stamp: p + 1 once the
// event at position p is complete, so the consumer never reads a half-written event, and a
// producer claims position p only when the slot's stamp says the consumer has read position
// p - capacity (stamp p - capacity + 1 and tail past it). A producer that finds the ring full
// counts a drop and returns: it never waits. Producers claim positions with a compare-and-swap on
// `head`; the consumer alone moves `tail`.
//
// Nothing in the header is trusted by the other side beyond its bounds: the consumer checks the
// magic, version, event size and capacity against the file's size before reading an event.
#ifndef LIFELINE_INTERNAL_TRACE_RING_H_
#define LIFELINE_INTERNAL_TRACE_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lifeline/internal/shared_memory.h"
#include "lifeline/status.h"
#include "lifeline/trace.h"

namespace lifeline::trace {

inline constexpr uint64_t kRingMagic = 0x31474e49524c4c4cull;  // "LLLRING1"
inline constexpr uint32_t kRingVersion = 1;
inline constexpr uint64_t kRingHeaderBytes = 4096;

struct RingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t event_bytes;   // sizeof(Event)
  uint64_t capacity;      // events, a power of two
  int32_t rank;
  int32_t producer_pid;   // set by the rank when it maps the ring
  int32_t dump_signal;    // the signal the rank dumps on (0: none installed)
  uint32_t reserved0;
  uint64_t created_ns;    // CLOCK_MONOTONIC at creation
  alignas(64) std::atomic<uint64_t> head;     // next position a producer claims
  alignas(64) std::atomic<uint64_t> tail;     // next position the consumer reads
  alignas(64) std::atomic<uint64_t> dropped;  // events refused because the ring was full
};
static_assert(sizeof(RingHeader) <= kRingHeaderBytes, "header fits its page");
// The layout is a format between processes of possibly different builds (formats/SPEC.md §15).
static_assert(offsetof(RingHeader, version) == 8 && offsetof(RingHeader, event_bytes) == 12 &&
              offsetof(RingHeader, capacity) == 16 && offsetof(RingHeader, rank) == 24 &&
              offsetof(RingHeader, producer_pid) == 28 && offsetof(RingHeader, dump_signal) == 32 &&
              offsetof(RingHeader, created_ns) == 40 && offsetof(RingHeader, head) == 64 &&
              offsetof(RingHeader, tail) == 128 && offsetof(RingHeader, dropped) == 192,
              "ring header as in SPEC.md §15");
static_assert(offsetof(Event, type) == 8 && offsetof(Event, op) == 10 && offsetof(Event, comm) == 12 &&
              offsetof(Event, step) == 16 && offsetof(Event, seq) == 24 && offsetof(Event, bytes) == 32 &&
              offsetof(Event, duration_ns) == 40 && offsetof(Event, aux) == 48 && offsetof(Event, stamp) == 56,
              "event as in SPEC.md §15");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the ring needs lock-free 64-bit atomics");

// The ring's file for `rank` in the agent directory `dir`.
std::string RingPath(const std::string& dir, int rank);

// A mapping of one ring file.
class TraceRing {
 public:
  // Creates (or truncates and re-initialises) the ring file at `path`, mode 0600, for `capacity`
  // events (rounded up to a power of two, at least 64).
  static Result<std::unique_ptr<TraceRing>> Create(const std::string& path, int rank, uint64_t capacity);
  // Maps an existing ring, checking its header against the file.
  static Result<std::unique_ptr<TraceRing>> Open(const std::string& path);
  ~TraceRing();
  TraceRing(const TraceRing&) = delete;
  TraceRing& operator=(const TraceRing&) = delete;

  // Producer side: false (and a drop counted) when the ring is full.
  bool Push(const Event& event);
  // Consumer side: appends every complete event in order and frees their slots. Returns how many.
  size_t Drain(std::vector<Event>* out);
  // The newest `max_events` published events, oldest first, without consuming them (a slot the
  // consumer already freed still holds its event until a producer reuses it). For dumps; safe to
  // call from a signal handler when `out` has room (no allocation then: pass a sized buffer).
  size_t Recent(Event* out, size_t max_events) const;

  RingHeader* header() { return header_; }
  const RingHeader* header() const { return header_; }
  uint64_t capacity() const { return capacity_; }
  const std::string& path() const { return path_; }

 private:
  TraceRing(std::string path, MappedRegion region);

  std::string path_;
  MappedRegion region_;
  RingHeader* header_;
  Event* slots_;
  uint64_t capacity_;
};

// CLOCK_MONOTONIC in nanoseconds.
uint64_t MonotonicNanos();

// Formats `e` as one JSON object (no newline), the shape of the agent's logs and of dumps:
// {"t_ns":..,"type":"collective_begin","step":..,"comm":..,"seq":..,"op":"allreduce",...}.
// Writes at most `size` bytes and returns the length; never allocates (signal-safe).
size_t FormatEventJson(const Event& e, int rank, char* buf, size_t size);

}  // namespace lifeline::trace

#endif  // LIFELINE_INTERNAL_TRACE_RING_H_
