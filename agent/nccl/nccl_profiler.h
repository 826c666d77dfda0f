// The Lifeline NCCL profiler plugin, libnccl-profiler-lifeline.so: turns NCCL's collectives and
// point-to-point operations into the trace events lifeline-agent consumes (lifeline/trace.h), so
// the agent sees NCCL work without any change to the training code.
//
// Loading: NCCL_PROFILER_PLUGIN=lifeline with the library on the loader's path (it lies beside
// liblifeline.so, which it links through an $ORIGIN RUNPATH), or NCCL_PROFILER_PLUGIN=/path/to/
// libnccl-profiler-lifeline.so. The library exports ncclProfiler_v6, _v5 and _v4, the tables NCCL
// 2.27 to 2.29 look for (see nccl_profiler_abi.h). Without LIFELINE_AGENT (no agent listening)
// init asks NCCL for no events at all, so NCCL pays nothing.
//
// What reaches the ring (one communicator = one NCCL comm = one plugin context):
//
//   NCCL event                  trace event        comm                 seq
//   Coll start (and v6 CeColl)  CollectiveBegin    CommId(comm)         the context's count of
//                                                                       collectives, from 1
//   P2p start, "Send" to p      CollectiveBegin    PairCommId(me -> p)  count of sends me -> p
//   P2p start, "Recv" from p    CollectiveBegin    PairCommId(p -> me)  count of recvs p -> me
//   completion (below)          CollectiveEnd      as its Begin         as its Begin
//
// op comes from the function name ("AllReduce" -> kAllReduce, "AlltoAll" -> kAllToAll, "Send",
// "Recv"; others kOther), bytes = count x the datatype's size (NCCL already passes AllGather and
// Broadcast as bytes of ncclInt8). End also carries op, bytes and duration_ns (End - Begin, host
// clock) and in aux the flags below. step is the one the process is in (trace::Record fills it).
//
// Sequence numbers: NCCL's own coll.seqNumber counts per function (AllReduce and AllGather each
// from 0) and skips graph-captured work, so it cannot number a communicator's collectives in
// order; the agent needs one count per comm, identical on every rank. The plugin counts every
// collective NCCL starts on the context (even one it drops for want of a slot), which is the same
// sequence on every rank because NCCL requires all ranks to issue a communicator's collectives in
// the same order. Point-to-point work is numbered per directed pair instead: the k-th send from
// rank a to rank b matches the k-th receive at b from a (NCCL's matching rule), and the pair has
// its own comm id, so sends between two ranks never shift the collective numbers of the others.
//
// Comm ids: key = commHash (NCCL's 64-bit id of the communicator, the same on all its ranks; the
// commName's FNV-1a hash when NCCL passes 0); CommId = fold32(fmix64(key)) and PairCommId(a -> b)
// = fold32(fmix64(key ^ fmix64(a << 32 | b) + golden)), where fold32 xors the halves and maps 0 to
// 1 (0 is the agent's world comm). The agent learns each comm's members from the ranks that begin
// work on it.
//
// Completion: NCCL stops a Coll or P2p event once the operation is enqueued, not when it is done.
// Its children tell when it is done: one KernelCh event per channel the kernel runs on (the
// descriptor's nChannels) and ProxyOp events for network work, all started and stopped on NCCL's
// proxy thread with the operation as parent, possibly after its own stop. An operation ends when
//   its own stop has come, no child is running, and (Coll) nChannels KernelCh children have
//   stopped, or (P2p, whose channel count NCCL reports per pair in some versions) at least one.
// When no child was ever seen by then (nothing expected: nChannels 0, a copy-engine collective,
// a version without kernel events) the End is written at the stop with aux kAuxEnqueueOnly: the
// operation was enqueued, its completion is unknown. Operations on one comm complete in order,
// so when one ends every older open one on the same comm ends too (aux kAuxClosedBySuccessor);
// this also closes an operation whose expected children never came.
//
// Resources: each context owns a fixed array of operation slots (LIFELINE_NCCL_PROFILER_SLOTS,
// default 1024, operations begun and not yet retired) and a send/recv counter per peer, all
// allocated at init; children take no slot (their handle is the parent's address with a tag in
// the low bits). Nothing is allocated per event. With every slot in use an operation is dropped:
// neither its Begin nor its End is written, the drop is counted (NCCL_DEBUG=INFO prints the counts
// at finalize), and its sequence number is still consumed. Freed slots are reused oldest first,
// so a child NCCL reports very late finds its parent retired rather than reused.
//
// Threads: NCCL calls start/stop from the user's thread (Coll, P2p) and from its proxy thread
// (children) concurrently. Each context has one mutex, held for a few dozen instructions per call
// and contended only between those two threads; ring writes are lock-free.
//
// Errors: every entry point returns ncclSuccess. A stop NCCL repeats for an event already stopped
// (a stray double stop, as around graph replays in some versions) is counted and ignored. On an
// internal inconsistency (a handle that is not one of the plugin's slots, a slot overwritten, an
// unknown context) the plugin turns itself off for the process: it prints one line to stderr
// starting "lifeline nccl profiler:", zeroes NCCL's event mask so NCCL stops calling it, and
// ignores every later call.
#ifndef LIFELINE_AGENT_NCCL_NCCL_PROFILER_H_
#define LIFELINE_AGENT_NCCL_NCCL_PROFILER_H_

#include <cstdint>

#include "agent/nccl/nccl_profiler_abi.h"

namespace lifeline::nccl_profiler {

// Flags in the aux field of a CollectiveEnd written by the plugin.
inline constexpr uint64_t kAuxEnqueueOnly = 1;        // no child event seen: only the enqueue is known
inline constexpr uint64_t kAuxClosedBySuccessor = 2;  // a later operation on the comm ended first

// The events init asks NCCL for (versions 4 and 5; version 6 adds ncclProfileCeColl).
inline constexpr uint64_t kRequestedEvents =
    nccl_abi::ncclProfileColl | nccl_abi::ncclProfileP2p | nccl_abi::ncclProfileProxyOp | nccl_abi::ncclProfileKernelCh;

// What the plugin reads from a descriptor, whatever its version.
enum class Kind : uint8_t { kUntracked, kColl, kCeColl, kP2p, kKernelCh, kProxyOp };
struct Descriptor {
  Kind kind = Kind::kUntracked;
  void* parent = nullptr;  // parentObj
  const char* func = nullptr;
  const char* datatype = nullptr;
  uint64_t count = 0;
  int peer = -1;         // P2p
  uint8_t channels = 0;  // Coll, P2p: nChannels
};

// The version-independent core behind the three exported tables. Thread-safe; never fails.

// Creates the context of one communicator and sets *activation_mask (0 when tracing is inactive
// or the plugin is off, in which case it returns null). `extra_events` are added to
// kRequestedEvents (version 6: ncclProfileCeColl).
void* Init(uint64_t comm_hash, const char* comm_name, int nranks, int rank, int* activation_mask,
           uint64_t extra_events, nccl_abi::ncclDebugLogger_t logfn, int abi_version) noexcept;
// The handle for an event NCCL starts, or null for one the plugin does not follow.
void* Start(void* context, const Descriptor& descriptor) noexcept;
void Stop(void* handle) noexcept;
void Finalize(void* context) noexcept;

// The comm ids described above.
uint32_t CommId(uint64_t comm_hash, const char* comm_name) noexcept;
uint32_t PairCommId(uint64_t comm_hash, const char* comm_name, int sender, int receiver) noexcept;

}  // namespace lifeline::nccl_profiler

#endif  // LIFELINE_AGENT_NCCL_NCCL_PROFILER_H_
