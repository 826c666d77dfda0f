// Tracing for the node agent: a rank reports its steps, its collectives and its heartbeats, and
// the library adds its own checkpoint lifecycle, so that lifeline-agent can tell a hang from a
// straggler and name the rank at fault.
//
// Events go to a per-rank ring in shared memory that the agent created and named in the
// environment (LIFELINE_AGENT, a directory; the rank comes from RANK). Recording an event is a few
// stores into that ring: no lock, no system call, no allocation. A full ring drops the event and
// counts the drop; a producer never waits for the agent. Without LIFELINE_AGENT every call returns
// after one load and one branch, and nothing else happens.
//
// Thread safety: every function may be called from any thread (the ring takes several producers:
// the training thread and the library's own copy and persist threads).
//
//   lifeline::trace::StepScope step(k);           // StepBegin(k) now, StepEnd(k) at scope exit
//   {
//     lifeline::trace::CollectiveScope c(lifeline::trace::Op::kAllReduce, grad_bytes);
//     allreduce(grads);                           // CollectiveBegin / CollectiveEnd around it
//   }
//
// On a signal (SIGUSR2 unless LIFELINE_DUMP_SIGNAL names another number, 0 turns it off) the
// library writes the ring's last LIFELINE_DUMP_EVENTS events (default 1000) as JSON lines to
// $LIFELINE_AGENT/dump.<rank>.<pid>.jsonl; the agent sends that signal when its policy says
// "dump". The handler is installed only when an agent is present and no other handler holds the
// signal.
#ifndef LIFELINE_TRACE_H_
#define LIFELINE_TRACE_H_

#include <cstdint>
#include <string>

#include "lifeline/export.h"
#include "lifeline/status.h"

namespace lifeline::trace {

enum class EventType : uint16_t {
  kNone = 0,
  kProcessStart = 1,     // step: the step resumed from (kNoStep when none); aux: pid; seq: ResumeSource
  kStepBegin = 2,
  kStepEnd = 3,
  kCollectiveBegin = 4,  // comm, seq, op, bytes: this rank entered the collective
  kCollectivePosted = 5, // this rank's contribution has left (sent, or written for its peers)
  kCollectiveEnd = 6,    // this rank's collective completed
  kHeartbeat = 7,
  kCheckpointBegin = 8,     // Save called: step, bytes (this rank's)
  kCheckpointCopied = 9,    // snapshot copied: duration_ns since Save; aux: ns the caller was blocked so far
  kCheckpointPersisted = 10,  // this rank's data durable: duration_ns since Save
  kCheckpointCommitted = 11,  // the step became complete (this rank committed it, or saw it)
  kCheckpointFailed = 12,     // aux: the StatusCode
  kProcessExit = 13,          // an orderly end (Shutdown): step, the last step begun
  kCheckpointFallback = 14,   // a load passed over the checkpoint of `step` (damaged or unusable) and
                              // loaded the one of step `bytes`; aux: 1 from the memory tier, 0 disk
  kScalar = 15,      // a training signal: comm: the scalar's id (kLossScalar, kGradNormScalar, or one
                     // RegisterScalar gave); step: the step the value belongs to; aux: the value's
                     // IEEE 754 binary64 bits (ScalarValue)
  kScalarName = 16,  // the name of scalar `comm` of this process, said before its first value: seq,
                     // bytes, duration_ns and aux hold its bytes (DecodeScalarName)
  kReplicaDigest = 17,  // a snapshot's digest of this rank's copy of a replicated shard (data-parallel
                        // replicas): seq: the shard's key, the same on every replica; comm: the
                        // replica count; bytes: the shard's bytes; duration_ns: their offset in the
                        // tensor (kNoOffset: a box); aux: the digest (formats/SPEC.md §15)
  kReplicaName = 18,    // part `comm` of `op` parts of the name of the tensor of shard key `seq`,
                        // said once per process before its first digest (DecodeReplicaNamePart)
};

// Collective operations, as NCCL and torch.distributed name them.
enum class Op : uint16_t {
  kOther = 0,
  kAllReduce = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kBroadcast = 4,
  kReduce = 5,
  kAllToAll = 6,
  kSend = 7,
  kRecv = 8,
  kBarrier = 9,
};

inline constexpr uint64_t kNoStep = ~uint64_t{0};

// Training signals (kScalar): two scalars every process knows by number, and the ones a process
// names itself (RegisterScalar), numbered from kFirstUserScalar in the order it registers them.
inline constexpr uint32_t kLossScalar = 0;      // "loss"
inline constexpr uint32_t kGradNormScalar = 1;  // "grad_norm": the global gradient norm, after its all-reduce
inline constexpr uint32_t kFirstUserScalar = 2;
inline constexpr uint32_t kMaxScalars = 1024;   // ids per process, the two fixed ones included
inline constexpr size_t kMaxScalarNameBytes = 32;

// One record in the ring: 64 bytes, one cache line.
struct LIFELINE_EXPORT Event {
  uint64_t time_ns = 0;      // CLOCK_MONOTONIC, comparable between processes of one node
  EventType type = EventType::kNone;
  Op op = Op::kOther;
  uint32_t comm = 0;         // communicator (process group) id, chosen by the caller; 0: the world
  uint64_t step = kNoStep;   // the step current when the event was recorded
  uint64_t seq = 0;          // collective sequence number on `comm`, from 1
  uint64_t bytes = 0;
  uint64_t duration_ns = 0;
  uint64_t aux = 0;          // per type, see EventType
  uint64_t stamp = 0;        // the ring's publication stamp (internal)
};
static_assert(sizeof(Event) == 64, "an event is one cache line");

LIFELINE_EXPORT const char* EventTypeName(EventType type);  // "step_begin", "collective_end", ...
LIFELINE_EXPORT const char* OpName(Op op);                  // "allreduce", "allgather", ...
// The Op named `name` (as OpName spells it, also "all_reduce" and upper case); kOther when unknown.
LIFELINE_EXPORT Op OpFromName(const std::string& name);

// True when events go to an agent. The first call reads the environment and maps the ring.
LIFELINE_EXPORT bool Active();

LIFELINE_EXPORT void StepBegin(uint64_t step);
LIFELINE_EXPORT void StepEnd(uint64_t step);
// Enters collective number `seq` on `comm` (0: the next number on `comm`, counted by the library).
// Returns the sequence number used, for CollectivePosted and CollectiveEnd. Returns 0 and records
// nothing when tracing is inactive.
LIFELINE_EXPORT uint64_t CollectiveBegin(Op op, uint64_t bytes, uint32_t comm = 0, uint64_t seq = 0);
LIFELINE_EXPORT void CollectivePosted(uint64_t seq, uint32_t comm = 0);
LIFELINE_EXPORT void CollectiveEnd(uint64_t seq, uint32_t comm = 0);
LIFELINE_EXPORT void Heartbeat();
// Where a process resumed from, as its load found it (kProcessStart's seq).
enum class ResumeSource : uint64_t { kUnknown = 0, kDisk = 1, kMemoryTier = 2 };
// The process resumed from `step` (kNoStep: started fresh), its load having taken `load_ns`
// (kProcessStart's duration_ns; 0: not measured). Drills and integrations call it once after
// loading, so the agent can time a restart until training resumed, and tell its load apart.
LIFELINE_EXPORT void ProcessStart(uint64_t resumed_step, ResumeSource source = ResumeSource::kUnknown,
                                  uint64_t load_ns = 0);
// An orderly end: the agent tells it apart from a crash that happens to exit 0.
LIFELINE_EXPORT void ProcessExit();
// Records `event` as given (time_ns filled in when 0, step when kNoStep: the step the process is
// in): for integrations that produce their own events, such as the NCCL profiler plugin, which
// also sets aux on kCollectiveEnd (1: only the enqueue was seen, completion unknown; 2: closed
// because a later operation on the communicator completed).
LIFELINE_EXPORT void Record(const Event& event);

// The file, in the agent's directory (LIFELINE_AGENT), where a rank reports the checkpoint
// directory it uses, so that the agent can fix the resume step of the next launch.
inline constexpr char kCheckpointDirFile[] = "checkpoint-dir";
// Reports `directory` (made absolute) to the agent; the first report of a job wins. Does nothing
// without an agent. Checkpointer::Open calls it.
LIFELINE_EXPORT void ReportCheckpointDirectory(const std::string& directory);
// The file, in the agent's directory, where a rank reports its memory tier's root (the first rank
// to report wins): the agent replicates from the tier it finds itself, and says so when its ranks
// keep theirs elsewhere (LIFELINE_MEMORY_TIER_DIR set differently for them). Checkpointer::Open
// calls it when the tier is on.
inline constexpr char kMemoryTierFile[] = "memory-tier";
LIFELINE_EXPORT void ReportMemoryTier(const std::string& root);

// Training signals. A rank reports, per step, values such as its loss and its gradient norm; the
// agent's detectors look for non-finite values, spikes and replicas that disagree.
//
// The id of the scalar called `name`: kLossScalar for "loss", kGradNormScalar for "grad_norm",
// else the same id for the same name in this process (a new one, from kFirstUserScalar, the first
// time). Works without an agent too. InvalidArgument when the name is empty, longer than
// kMaxScalarNameBytes, or has a character other than [A-Za-z0-9_.:/-]; ResourceExhausted beyond
// kMaxScalars names. Takes a lock: call it once per name, not per step.
LIFELINE_EXPORT Result<uint32_t> RegisterScalar(const std::string& name);
// Records `value` of scalar `id` for `step` (kNoStep: the step the process is in). A value read
// late (a device tensor copied asynchronously) names the step it belongs to. The first value of a
// user scalar records its name first (and again after a full ring refused it). Does nothing for an
// id that RegisterScalar did not give, or without an agent.
LIFELINE_EXPORT void ReportScalar(uint32_t id, double value, uint64_t step = kNoStep);
// The value a kScalar event carries.
LIFELINE_EXPORT double ScalarValue(const Event& event);
// The name a kScalarName event carries: InvalidArgument when `event` is not one, or its bytes are
// not a name RegisterScalar takes (the agent trusts nothing a ring holds).
LIFELINE_EXPORT Result<std::string> DecodeScalarName(const Event& event);

// Replica digests (kReplicaDigest, kReplicaName). The save path reports them; the agent compares
// the replicas' digests of each shard key and names the rank whose copy differs.
inline constexpr uint64_t kNoOffset = ~uint64_t{0};
inline constexpr size_t kReplicaNamePartBytes = 24;  // name bytes per kReplicaName event
inline constexpr uint32_t kMaxReplicaNameParts = 171;  // ceil(4096 / 24)
// Records the name of the tensor of shard `key` (at most 4096 bytes, no NUL), in parts; false when
// the ring refused a part (full) or there is no agent.
LIFELINE_EXPORT bool ReportReplicaName(uint64_t key, const std::string& name);
// Records a digest of this rank's copy of shard `key` at `step`.
LIFELINE_EXPORT void ReportReplicaDigest(uint64_t step, uint64_t key, uint32_t replica_count, uint64_t bytes,
                                         uint64_t tensor_offset, uint64_t digest);
// The part of a name a kReplicaName event carries (its bytes up to the first NUL), with its part
// number and count: InvalidArgument when `event` is not one, or its fields are out of bounds (a
// part beyond the count, a count above kMaxReplicaNameParts, bytes after a NUL, an empty part).
struct ReplicaNamePart {
  uint64_t key = 0;
  uint32_t part = 0, parts = 0;
  std::string bytes;
};
LIFELINE_EXPORT Result<ReplicaNamePart> DecodeReplicaNamePart(const Event& event);

// Writes the ring's newest `max_events` events to `path`, one JSON object per line, oldest
// first. FailedPrecondition when tracing is inactive.
LIFELINE_EXPORT Status DumpRecent(const std::string& path, uint64_t max_events = 1000);

// Events this process could not record because the ring was full.
LIFELINE_EXPORT uint64_t Dropped();

class LIFELINE_EXPORT StepScope {
 public:
  explicit StepScope(uint64_t step) : step_(step) { StepBegin(step); }
  ~StepScope() { StepEnd(step_); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  uint64_t step_;
};

class LIFELINE_EXPORT CollectiveScope {
 public:
  CollectiveScope(Op op, uint64_t bytes, uint32_t comm = 0) : comm_(comm), seq_(CollectiveBegin(op, bytes, comm)) {}
  ~CollectiveScope() {
    if (seq_ != 0) CollectiveEnd(seq_, comm_);
  }
  uint64_t seq() const { return seq_; }
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;

 private:
  uint32_t comm_;
  uint64_t seq_;
};

}  // namespace lifeline::trace

#endif  // LIFELINE_TRACE_H_
