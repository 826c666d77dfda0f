// lifeline-drill: a synthetic data-parallel training job for fault drills of lifeline-agent. The
// agent launches it N times on each node, torchrun-style (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LIFELINE_JOB, LIFELINE_RESTART, LIFELINE_LAUNCH_ID,
// LIFELINE_AGENT), and
// --fault makes a rank crash, hang or straggle on the first launch so the agent has something to
// detect, diagnose and restart from.
//
// The model: every rank holds the same parameter and momentum vectors (float, --params each),
// initialised from --seed. Steps are numbered 1..S (--steps S). Step k on every rank:
//   StepBegin(k)
//   crash@RANK:k     the rank kills itself with SIGKILL here
//   compute          a gradient that depends only on (params, rank, k): real work on the state,
//                    while the result stays reproducible; then, until --compute-ms (+ jitter,
//                    + slow@ faults) has passed, asleep as a GPU job's host thread waits for its
//                    device, or with --busy-compute computing it over and over as a CPU job would
//   hang@RANK:k      the rank stops here forever, before entering the collective
//   allreduce        CollectiveBegin; slowcomm@ delay; post the gradient; CollectivePosted;
//                    wait for the others and sum in rank order 0..N-1; CollectiveEnd
//   wait for the snapshot of the previous checkpoint (the compute above overlapped its copy)
//   update           SGD with momentum on the averaged gradient: the same bits on every rank
//   checkpoint       when k % --ckpt-every == 0, Save(k) of the state after step k (lazy)
//   Heartbeat; StepEnd(k)
// A checkpoint of step k therefore resumes at step k + 1, and a run that crashed and was
// relaunched ends with exactly the state of a run that never failed: the last line,
// "final rank=R step=S checksum=HEX" (XXH3-64 of the parameter then the momentum bytes), is the
// same on every rank and in both runs. Faults apply only when LIFELINE_RESTART is 0 or unset
// (--fault-every-launch: at every launch).
//
// The allreduce runs through shared memory when every rank is on this node (LOCAL_WORLD_SIZE equal
// to WORLD_SIZE, or unset), and over TCP through global rank 0 at MASTER_ADDR:MASTER_PORT when the
// world spans nodes; both add in rank order, so the final state does not depend on the layout. A
// rank whose peer's connection closes mid-collective says so and waits to be stopped, as an NCCL
// rank would: the supervisor names the rank that died, not its peers.
//
// Exit status: 0 at the end of training (a failed checkpoint is reported on stderr but does not
// stop training), 1 when the job cannot run (checkpoint directory, load, the shared-memory group),
// 2 for a bad command line or environment.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

// Header-only XXH3, so that the drill needs no more libraries than liblifeline.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "agent/drill/shm_allreduce.h"
#include "agent/drill/tcp_allreduce.h"
#include "lifeline/checkpoint.h"
#include "lifeline/internal/trace_ring.h"
#include "lifeline/log.h"
#include "lifeline/trace.h"

namespace lifeline::drill {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr float kLearningRate = 0.05f;
constexpr float kMomentum = 0.9f;
constexpr size_t kBlock = 4096;  // elements computed between two looks at the clock
constexpr uint64_t kProgressEvery = 50;
constexpr const char* kRankObject = "drill.rank_state";

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Mix(uint64_t a, uint64_t b, uint64_t c) { return SplitMix64(a ^ SplitMix64(b ^ SplitMix64(c))); }

// Uniform in [-1, 1), exactly representable.
float SignedUnit(uint64_t bits) { return static_cast<float>(bits >> 40) * 0x1p-23f - 1.0f; }

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- launch environment ----

struct Launch {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t restart = 0;
  std::string job;       // LIFELINE_JOB, may be empty
  std::string shm_key;   // what names the shared-memory segment: the job, else the port, else the uid
  bool spans_nodes = false;  // LOCAL_WORLD_SIZE < WORLD_SIZE: the allreduce goes over TCP
  std::string master_addr;
  uint16_t master_port = 0;
  std::string launch_key;  // LIFELINE_LAUNCH_ID, else the job and the restart
};

bool ParseU64(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 19) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

std::optional<std::string> Getenv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// Reads an unsigned variable; an error message naming it when it is set but not a number.
std::optional<std::string> ReadEnvU64(const char* name, std::optional<uint64_t>* out) {
  const std::optional<std::string> text = Getenv(name);
  out->reset();
  if (!text) return std::nullopt;
  uint64_t v = 0;
  if (!ParseU64(*text, &v)) return std::string(name) + "='" + *text + "' is not a non-negative integer";
  *out = v;
  return std::nullopt;
}

std::optional<std::string> ReadLaunch(Launch* l) {
  std::optional<uint64_t> rank, world, local_rank, local_world, restart, port;
  for (auto [name, out] : {std::pair{"RANK", &rank}, std::pair{"WORLD_SIZE", &world},
                           std::pair{"LOCAL_RANK", &local_rank}, std::pair{"LOCAL_WORLD_SIZE", &local_world},
                           std::pair{"LIFELINE_RESTART", &restart}, std::pair{"MASTER_PORT", &port}}) {
    if (auto err = ReadEnvU64(name, out)) return err;
  }
  if (rank.has_value() != world.has_value())
    return std::string(rank ? "RANK is set but WORLD_SIZE is not" : "WORLD_SIZE is set but RANK is not");
  if (world) {
    if (*world == 0 || *world > ShmAllReduce::kMaxWorldSize)
      return "WORLD_SIZE=" + std::to_string(*world) + " must be 1 to " + std::to_string(ShmAllReduce::kMaxWorldSize);
    if (*rank >= *world)
      return "RANK=" + std::to_string(*rank) + " must be below WORLD_SIZE=" + std::to_string(*world);
    l->rank = static_cast<uint32_t>(*rank);
    l->world_size = static_cast<uint32_t>(*world);
  }
  if (port && (*port == 0 || *port > 65535)) return "MASTER_PORT=" + std::to_string(*port) + " is not a port";
  if (local_world && (*local_world == 0 || *local_world > l->world_size))
    return "LOCAL_WORLD_SIZE=" + std::to_string(*local_world) + " must be 1 to WORLD_SIZE=" +
           std::to_string(l->world_size);
  l->spans_nodes = local_world && *local_world < l->world_size;
  if (!l->spans_nodes && local_rank && *local_rank != l->rank)
    return "LOCAL_RANK=" + std::to_string(*local_rank) + " differs from RANK=" + std::to_string(l->rank) +
           " in a world on one node (LOCAL_WORLD_SIZE=WORLD_SIZE)";
  if (l->spans_nodes) {  // the allreduce goes over TCP through global rank 0
    l->master_addr = Getenv("MASTER_ADDR").value_or("");
    if (l->master_addr.empty() || !port)
      return "the world spans nodes (LOCAL_WORLD_SIZE=" + std::to_string(*local_world) + " < WORLD_SIZE=" +
             std::to_string(l->world_size) + ") but MASTER_ADDR or MASTER_PORT is not set";
    l->master_port = static_cast<uint16_t>(*port);
  }
  l->restart = restart.value_or(0);
  l->job = Getenv("LIFELINE_JOB").value_or("");
  if (!l->job.empty()) {
    l->shm_key = l->job;
  } else if (port) {
    l->shm_key = "port" + std::to_string(*port);
  } else {
    l->shm_key = "uid" + std::to_string(getuid());
  }
  l->launch_key = Getenv("LIFELINE_LAUNCH_ID").value_or(l->shm_key + ":" + std::to_string(l->restart));
  return std::nullopt;
}

// ---- faults ----

enum class FaultKind { kCrash, kHang, kSlow, kSlowComm, kExitHang };

struct Fault {
  FaultKind kind = FaultKind::kCrash;
  uint32_t rank = 0;
  uint64_t step = 0;
  uint64_t ms = 0;
};

std::optional<std::string> ParseFault(const std::string& spec, uint32_t world_size, uint64_t steps, Fault* f) {
  const std::string usage = "--fault '" + spec +
                            "': expected crash@RANK:STEP, hang@RANK:STEP, slow@RANK:STEP:MS, "
                            "slowcomm@RANK:STEP:MS or exithang@RANK:STEP";
  const size_t at = spec.find('@');
  if (at == std::string::npos) return usage;
  const std::string kind = spec.substr(0, at);
  std::vector<std::string> fields;
  for (size_t begin = at + 1;;) {
    const size_t colon = spec.find(':', begin);
    fields.push_back(spec.substr(begin, colon == std::string::npos ? std::string::npos : colon - begin));
    if (colon == std::string::npos) break;
    begin = colon + 1;
  }
  size_t want = 0;
  if (kind == "crash") {
    f->kind = FaultKind::kCrash, want = 2;
  } else if (kind == "hang") {
    f->kind = FaultKind::kHang, want = 2;
  } else if (kind == "slow") {
    f->kind = FaultKind::kSlow, want = 3;
  } else if (kind == "slowcomm") {
    f->kind = FaultKind::kSlowComm, want = 3;
  } else if (kind == "exithang") {
    f->kind = FaultKind::kExitHang, want = 2;
  } else {
    return usage + " (unknown kind '" + kind + "')";
  }
  if (fields.size() != want) return usage;
  uint64_t rank = 0;
  if (!ParseU64(fields[0], &rank) || !ParseU64(fields[1], &f->step) || (want == 3 && !ParseU64(fields[2], &f->ms)))
    return usage;
  if (rank >= world_size)
    return "--fault '" + spec + "': rank " + std::to_string(rank) + " is not below WORLD_SIZE=" +
           std::to_string(world_size);
  if (f->step < 1 || f->step > steps)
    return "--fault '" + spec + "': step " + std::to_string(f->step) + " is outside the steps 1.." +
           std::to_string(steps);
  f->rank = static_cast<uint32_t>(rank);
  return std::nullopt;
}

// The faults of one rank, as the step loop asks about them.
struct FaultPlan {
  std::vector<Fault> faults;  // this rank's only

  bool Crash(uint64_t k) const { return Has(FaultKind::kCrash, k); }
  bool Hang(uint64_t k) const { return Has(FaultKind::kHang, k); }
  // After its final line the rank never exits, as a collective library's teardown that deadlocks.
  bool ExitHang() const {
    return std::any_of(faults.begin(), faults.end(), [](const Fault& f) { return f.kind == FaultKind::kExitHang; });
  }
  // Milliseconds added from the fault's step on; several faults of a kind add up.
  uint64_t ExtraMs(FaultKind kind, uint64_t k) const {
    uint64_t ms = 0;
    for (const Fault& f : faults)
      if (f.kind == kind && k >= f.step) ms += f.ms;
    return ms;
  }
  bool Starts(FaultKind kind, uint64_t k) const { return Has(kind, k); }

 private:
  bool Has(FaultKind kind, uint64_t k) const {
    for (const Fault& f : faults)
      if (f.kind == kind && f.step == k) return true;
    return false;
  }
};

// ---- the model ----

struct Model {
  std::vector<float> params;
  std::vector<float> momentum;
};

Model InitModel(uint64_t count, uint64_t seed) {
  Model m;
  m.params.resize(count);
  m.momentum.assign(count, 0.0f);
  for (uint64_t i = 0; i < count; ++i) m.params[i] = SignedUnit(Mix(seed, 0x706172616d73ull, i));
  return m;
}

// The gradient of elements [begin, end) at `step` on `rank`: a pull of every parameter towards
// zero plus per-rank noise, so that the ranks' contributions differ and the sum matters.
// The noise of element i comes from a 32-bit hash of (base, i), so that the loop vectorizes (with
// -O3, agent/CMakeLists.txt): four elements at a time, each the same bits as alone.
void GradientBlock(const float* __restrict p, uint32_t rank, uint64_t step, uint64_t seed, float* __restrict g,
                   size_t begin, size_t end) {
  const uint64_t mixed = Mix(seed, rank, step);
  const uint32_t base = static_cast<uint32_t>(mixed ^ (mixed >> 32));
  for (size_t i = begin; i < end; ++i) {
    const float x = p[i];
    uint32_t h = base + static_cast<uint32_t>(i);  // a 32-bit finalizer: each input bit moves half the output
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    const float noise = static_cast<float>(static_cast<int32_t>(h >> 8)) * 0x1p-23f - 1.0f;  // [-1, 1), exact
    g[i] = 0.5f * x + 0.05f * x * x * x + 0.02f * noise;
  }
}

// Computes the gradient, then spends the rest of `compute_seconds` since `start` as `busy` says:
// recomputing it block by block (a CPU training job: the result is the same however often a block
// is computed, so the time spent varies and the values do not; the clock read between blocks keeps
// the compiler from dropping the repeats), or asleep (the host thread of a GPU job, waiting for its
// device: the default, which leaves the cores to the rest of the machine).
void ComputeGradient(const Model& m, uint32_t rank, uint64_t step, uint64_t seed, double start,
                     double compute_seconds, bool busy, std::vector<float>* grad) {
  const size_t n = m.params.size();
  const size_t blocks = (n + kBlock - 1) / kBlock;
  const double deadline = start + compute_seconds;
  size_t done = 0;
  for (size_t b = 0;; b = (b + 1 == blocks) ? 0 : b + 1) {
    GradientBlock(m.params.data(), rank, step, seed, grad->data(), b * kBlock, std::min(n, (b + 1) * kBlock));
    if (done < blocks) ++done;
    if (done < blocks) continue;
    const double left = deadline - Now();
    if (left <= 0) return;
    if (!busy) {
      std::this_thread::sleep_for(std::chrono::duration<double>(left));
      return;
    }
  }
}

// SGD with momentum on the average of the summed gradient. Every rank applies it to the same bits.
void Update(const std::vector<float>& sum, uint32_t world_size, Model* m) {
  const float scale = 1.0f / static_cast<float>(world_size);
  for (size_t i = 0; i < m->params.size(); ++i) {
    m->momentum[i] = kMomentum * m->momentum[i] + sum[i] * scale;
    m->params[i] -= kLearningRate * m->momentum[i];
  }
}

uint64_t Checksum(const Model& m) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, m.params.data(), m.params.size() * sizeof(float));
  XXH3_64bits_update(&state, m.momentum.data(), m.momentum.size() * sizeof(float));
  return XXH3_64bits_digest(&state);
}

double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return v.empty() ? 0 : std::sqrt(s / static_cast<double>(v.size()));
}

// ---- the program ----

struct Flags {
  std::string dir;
  uint64_t steps = 200;
  uint64_t ckpt_every = 20;
  uint64_t params = 65536;
  double compute_ms = 5;
  bool busy_compute = false;
  double jitter_ms = 1;
  std::vector<std::string> faults;
  bool fault_every_launch = false;
  bool no_memory_tier = false;
  bool quiet = false;
  double join_timeout_s = 60;
  uint64_t seed = 0x6c6966656c696e65ull;  // "lifeline"
};

SaveRequest MakeSaveRequest(Model* m, const Launch& l, uint64_t step, const Flags& flags) {
  const int64_t n = static_cast<int64_t>(m->params.size());
  SaveRequest req;
  // Data parallel: every rank holds the whole tensors; Replica lets each byte be written once.
  req.tensors.push_back(
      TensorShard::Whole("params", DType::kF32, {n}, m->params.data()).Replica(l.rank, l.world_size));
  req.tensors.push_back(
      TensorShard::Whole("momentum", DType::kF32, {n}, m->momentum.data()).Replica(l.rank, l.world_size));
  req.objects.emplace_back(kRankObject, "step=" + std::to_string(step) + " rank=" + std::to_string(l.rank));
  req.metadata_json = "{\"drill\":{\"params\":" + std::to_string(n) + ",\"steps\":" + std::to_string(flags.steps) +
                      ",\"ckpt_every\":" + std::to_string(flags.ckpt_every) + ",\"seed\":" +
                      std::to_string(flags.seed) + "}}";
  return req;
}

// True when the checkpoint directory or the memory tier holds a complete checkpoint.
// ---- the collective ----

// The drill's allreduce, whichever way it travels. A connection that fails mid-collective is said
// once on stderr and the rank then waits to be stopped, as a rank of a broken NCCL communicator
// does: its supervisor names the rank that failed first, not the peers left waiting.
class Group {
 public:
  virtual ~Group() = default;
  virtual void Post(const float* data) = 0;
  virtual void Finish(float* out) = 0;
  virtual std::vector<uint64_t> AllGather(uint64_t word) = 0;
};

class ShmGroup final : public Group {
 public:
  explicit ShmGroup(std::unique_ptr<ShmAllReduce> c) : c_(std::move(c)) {}
  void Post(const float* data) override { c_->Post(data); }
  void Finish(float* out) override { c_->Finish(out); }
  std::vector<uint64_t> AllGather(uint64_t word) override { return c_->AllGather(word); }

 private:
  std::unique_ptr<ShmAllReduce> c_;
};

class TcpGroup final : public Group {
 public:
  explicit TcpGroup(std::unique_ptr<TcpAllReduce> c) : c_(std::move(c)) {}
  void Post(const float* data) override { c_->Post(data); }
  void Finish(float* out) override { WaitIfFailed(c_->Finish(out)); }
  std::vector<uint64_t> AllGather(uint64_t word) override {
    Result<std::vector<uint64_t>> all = c_->AllGather(word);
    WaitIfFailed(all.status());
    return std::move(all).value();
  }

 private:
  void WaitIfFailed(const Status& s) {
    if (s.ok()) return;
    std::fprintf(stderr, "lifeline-drill: rank %u: collective #%" PRIu64 " failed: %s; waiting to be stopped\n",
                 c_->rank(), c_->completed() + 1, s.ToString().c_str());
    std::fflush(nullptr);
    for (;;) pause();
  }

  std::unique_ptr<TcpAllReduce> c_;
};

// The options both collectives share: this rank's place, the vector's length, the join's bound.
template <typename Options>
Options GroupOptions(const Launch& l, const Flags& flags) {
  Options o;
  o.rank = l.rank;
  o.world_size = l.world_size;
  o.count = flags.params;
  o.join_timeout_seconds = flags.join_timeout_s;
  return o;
}

Result<std::unique_ptr<Group>> JoinGroup(const Launch& l, const Flags& flags) {
  if (l.spans_nodes) {
    auto o = GroupOptions<TcpAllReduceOptions>(l, flags);
    o.master_addr = l.master_addr;
    o.master_port = l.master_port;
    o.launch_key = l.launch_key.substr(0, 256);
    LL_ASSIGN_OR_RETURN(std::unique_ptr<TcpAllReduce> c, TcpAllReduce::Join(o));
    return std::unique_ptr<Group>(new TcpGroup(std::move(c)));
  }
  auto o = GroupOptions<ShmAllReduceOptions>(l, flags);
  o.stale_prefix = "lifeline-drill." + ShmNameComponent(l.shm_key) + ".";
  o.name = o.stale_prefix + "w" + std::to_string(l.world_size) + ".r" + std::to_string(l.restart);
  LL_ASSIGN_OR_RETURN(std::unique_ptr<ShmAllReduce> c, ShmAllReduce::Join(o));
  return std::unique_ptr<Group>(new ShmGroup(std::move(c)));
}

Result<bool> HasCheckpoint(Checkpointer* ckpt) {
  LL_ASSIGN_OR_RETURN(std::optional<uint64_t> on_disk, ckpt->LatestStep());
  if (on_disk) return true;
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> in_memory, ckpt->ListMemoryTier());
  for (const CheckpointInfo& info : in_memory)
    if (info.complete) return true;
  return false;
}

int Run(const Flags& flags, const Launch& l) {
  const uint32_t rank = l.rank;
  std::vector<Fault> all_faults;
  for (const std::string& spec : flags.faults) {
    Fault f;
    if (auto err = ParseFault(spec, l.world_size, flags.steps, &f)) {
      std::fprintf(stderr, "lifeline-drill: %s\n", err->c_str());
      return kExitUsage;
    }
    all_faults.push_back(f);
  }
  FaultPlan plan;
  if (l.restart == 0 || flags.fault_every_launch) {
    for (const Fault& f : all_faults)
      if (f.rank == rank) plan.faults.push_back(f);
  }

  SetLogSink(StderrLogSink(LogLevel::kWarning));

  CheckpointerOptions opt;
  opt.directory = flags.dir;
  opt.rank = rank;
  opt.world_size = l.world_size;
  // One run id per launch, as the library expects: a relaunch that saves a step again writes files
  // of its own instead of mixing with the partial files of the launch that was killed.
  opt.run_id = (l.job.empty() ? std::string("drill") : l.job) + ":" + std::to_string(l.restart);
  opt.memory_tier = !flags.no_memory_tier;
  opt.keep_last = 2;
  opt.copy_threads = 1;  // several ranks share few cores
  Result<std::unique_ptr<Checkpointer>> opened = Checkpointer::Open(opt);
  if (!opened.ok()) {
    std::fprintf(stderr, "lifeline-drill: rank %u: cannot open checkpoint directory %s: %s\n", rank,
                 flags.dir.c_str(), opened.status().ToString().c_str());
    return kExitFailure;
  }
  std::unique_ptr<Checkpointer> ckpt = std::move(*opened);

  Model model = InitModel(flags.params, flags.seed);
  const int64_t n = static_cast<int64_t>(flags.params);

  // Resume from the newest complete checkpoint, if any (the library prefers the memory tier).
  uint64_t resumed = trace::kNoStep;
  Result<bool> has = HasCheckpoint(ckpt.get());
  if (!has.ok()) {
    std::fprintf(stderr, "lifeline-drill: rank %u: cannot list checkpoints in %s: %s\n", rank, flags.dir.c_str(),
                 has.status().ToString().c_str());
    return kExitFailure;
  }
  bool from_memory = false;
  uint64_t load_began = 0;
  if (*has) {
    LoadRequest load;
    load.tensors.push_back(TensorShard::Whole("params", DType::kF32, {n}, model.params.data()));
    load.tensors.push_back(TensorShard::Whole("momentum", DType::kF32, {n}, model.momentum.data()));
    load_began = trace::MonotonicNanos();
    Result<LoadResult> r = ckpt->Load(std::nullopt, load);
    if (!r.ok()) {
      std::fprintf(stderr, "lifeline-drill: rank %u: cannot load the newest checkpoint in %s: %s\n", rank,
                   flags.dir.c_str(), r.status().ToString().c_str());
      return kExitFailure;
    }
    resumed = r->step;
    from_memory = r->from_memory_tier;
    // The per-rank object is a consistency check; a checkpoint saved with fewer ranks has none for
    // the ranks it did not have.
    for (const auto& [name, value] : r->objects) {
      const std::string want = "step=" + std::to_string(r->step) + " rank=" + std::to_string(rank);
      if (name == kRankObject && value != want)
        std::fprintf(stderr, "lifeline-drill: rank %u: warning: checkpoint of step %" PRIu64
                     " holds rank state '%s', expected '%s'\n", rank, r->step, value.c_str(), want.c_str());
    }
  }
  trace::ProcessStart(resumed, resumed == trace::kNoStep ? trace::ResumeSource::kUnknown
                               : from_memory              ? trace::ResumeSource::kMemoryTier
                                                          : trace::ResumeSource::kDisk,
                      load_began == 0 ? 0 : trace::MonotonicNanos() - load_began);
  if (resumed == trace::kNoStep) {
    std::printf("rank %u starting fresh\n", rank);
  } else {
    std::printf("rank %u resumed from step %" PRIu64 " (%s)\n", rank, resumed, from_memory ? "memory tier" : "disk");
  }

  Result<std::unique_ptr<Group>> joined = JoinGroup(l, flags);
  if (!joined.ok()) {
    std::fprintf(stderr, "lifeline-drill: rank %u: cannot form the group of %u ranks: %s\n", rank, l.world_size,
                 joined.status().ToString().c_str());
    return kExitFailure;
  }
  std::unique_ptr<Group> comm = std::move(*joined);

  // Every rank must continue from the same step, or the sums mix different steps.
  const std::vector<uint64_t> starts = comm->AllGather(resumed);
  for (uint32_t r = 0; r < l.world_size; ++r) {
    if (starts[r] != resumed) {
      auto text = [](uint64_t s) { return s == trace::kNoStep ? std::string("none") : std::to_string(s); };
      std::fprintf(stderr, "lifeline-drill: rank %u: ranks resumed from different checkpoints (rank %u: %s, rank %u: %s)\n",
                   rank, r, text(starts[r]).c_str(), rank, text(resumed).c_str());
      return kExitFailure;
    }
  }

  SaveRequest shape = MakeSaveRequest(&model, l, 0, flags);
  if (flags.ckpt_every > 0) {
    Status s = ckpt->PrepareStaging(shape);
    if (!s.ok())
      std::fprintf(stderr, "lifeline-drill: rank %u: warning: staging not prepared: %s\n", rank, s.ToString().c_str());
  }

  std::vector<float> grad(flags.params);
  std::vector<float> sum(flags.params);
  std::optional<SaveTicket> pending;  // a save whose snapshot has not been waited for
  uint64_t failed_saves = 0;
  auto await_snapshot = [&]() {
    if (!pending) return;
    Status s = pending->WaitSnapshot();
    const SaveProgress p = pending->Progress();
    if (!s.ok()) {
      std::fprintf(stderr, "lifeline-drill: rank %u: checkpoint of step %" PRIu64 " failed: %s\n", rank, p.step,
                   s.ToString().c_str());
      ++failed_saves;
    } else if (!flags.quiet) {
      std::printf("checkpoint step=%" PRIu64 " snapshot=%.1fms stall=%.2fms %s\n", p.step, p.snapshot_seconds * 1e3,
                  p.stall_seconds * 1e3, SavePhaseName(p.phase));
    }
    pending.reset();
  };

  const uint64_t first = resumed == trace::kNoStep ? 1 : resumed + 1;
  const uint64_t bytes = flags.params * sizeof(float);
  double window_start = Now();
  uint64_t window_steps = 0;
  for (uint64_t k = first; k <= flags.steps; ++k) {
    trace::StepBegin(k);
    if (plan.Crash(k)) {
      std::fprintf(stderr, "lifeline-drill: rank %u: fault: SIGKILL at step %" PRIu64 "\n", rank, k);
      std::fflush(nullptr);
      raise(SIGKILL);
    }
    const double start = Now();
    if (plan.Starts(FaultKind::kSlow, k))
      std::fprintf(stderr, "lifeline-drill: rank %u: fault: compute %" PRIu64 " ms slower per step from step %" PRIu64 "\n",
                   rank, plan.ExtraMs(FaultKind::kSlow, k), k);
    // Jitter varies the timing only; it is drawn from (rank, step) so that a rerun times alike.
    const double jitter_ms = flags.jitter_ms * (SignedUnit(Mix(flags.seed ^ 0x6a6974746572ull, rank, k)) + 1) / 2;
    const double compute_ms = flags.compute_ms + jitter_ms + static_cast<double>(plan.ExtraMs(FaultKind::kSlow, k));
    ComputeGradient(model, rank, k, flags.seed, start, compute_ms / 1e3, flags.busy_compute, &grad);

    if (plan.Hang(k)) {
      std::fprintf(stderr, "lifeline-drill: rank %u: fault: hanging at step %" PRIu64 " before the allreduce\n", rank, k);
      std::fflush(nullptr);
      for (;;) pause();
    }

    const uint64_t seq = trace::CollectiveBegin(trace::Op::kAllReduce, bytes);
    if (const uint64_t late_ms = plan.ExtraMs(FaultKind::kSlowComm, k)) {
      if (plan.Starts(FaultKind::kSlowComm, k))
        std::fprintf(stderr, "lifeline-drill: rank %u: fault: allreduce contribution %" PRIu64
                     " ms late from step %" PRIu64 "\n", rank, late_ms, k);
      std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
    }
    comm->Post(grad.data());
    trace::CollectivePosted(seq);
    comm->Finish(sum.data());
    trace::CollectiveEnd(seq);

    await_snapshot();  // the update below overwrites what the last Save may still be copying
    Update(sum, l.world_size, &model);
    if (flags.ckpt_every > 0 && k % flags.ckpt_every == 0) {
      pending = ckpt->Save(k, MakeSaveRequest(&model, l, k, flags));
    }
    trace::Heartbeat();
    trace::StepEnd(k);

    ++window_steps;
    if (!flags.quiet && k % kProgressEvery == 0) {
      const double now = Now();
      std::printf("step %" PRIu64 "/%" PRIu64 " %.2f ms/step param_rms=%.6f\n", k, flags.steps,
                  (now - window_start) * 1e3 / static_cast<double>(window_steps), Rms(model.params));
      window_start = now;
      window_steps = 0;
    }
  }

  await_snapshot();
  Status flushed = ckpt->Flush();
  if (!flushed.ok()) {
    std::fprintf(stderr, "lifeline-drill: rank %u: checkpoints not persisted: %s\n", rank, flushed.ToString().c_str());
    ++failed_saves;
  }
  if (failed_saves > 0)
    std::fprintf(stderr, "lifeline-drill: rank %u: %" PRIu64 " checkpoint(s) failed\n", rank, failed_saves);
  // Every rank's saves are published before any rank's Checkpointer is destroyed: its destructor
  // withdraws snapshots from the memory tier, which a peer may still be publishing into.
  comm->AllGather(failed_saves);
  trace::ProcessExit();
  const uint64_t last = resumed != trace::kNoStep && resumed > flags.steps ? resumed : flags.steps;
  std::printf("final rank=%u step=%" PRIu64 " checksum=%016" PRIx64 "\n", rank, last, Checksum(model));
  std::fflush(stdout);
  if (plan.ExitHang()) {
    std::fprintf(stderr, "lifeline-drill: rank %u: fault: never exits\n", rank);
    for (;;) pause();
  }
  return kExitOk;
}

}  // namespace
}  // namespace lifeline::drill

int main(int argc, char** argv) {
  using lifeline::drill::Flags;
  // The agent reads the lines through a pipe: one line at a time, not one buffer at a time.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  Flags flags;
  CLI::App app{"lifeline-drill: a synthetic data-parallel training job for fault drills of lifeline-agent"};
  app.set_version_flag("--version", "lifeline-drill " LIFELINE_VERSION);
  app.add_option("--dir", flags.dir, "Checkpoint directory")->required();
  app.add_option("--steps", flags.steps, "Total steps, numbered 1..S")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app.add_option("--ckpt-every", flags.ckpt_every, "Checkpoint after every K-th step (0: never)");
  app.add_option("--params", flags.params, "Floats of model state per rank")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  app.add_option("--compute-ms", flags.compute_ms, "Compute per step, in ms")->check(CLI::NonNegativeNumber);
  app.add_flag("--busy-compute", flags.busy_compute,
               "Spend the compute time recomputing the gradient (a CPU job), not asleep after computing it once "
               "(a GPU job's host thread)");
  app.add_option("--jitter-ms", flags.jitter_ms, "Up to this much extra compute per step, drawn from (rank, step)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--fault", flags.faults,
                 "crash@RANK:STEP, hang@RANK:STEP, slow@RANK:STEP:MS, slowcomm@RANK:STEP:MS or exithang@RANK:STEP "
                 "(after its final line the rank never exits); repeatable; first launch only")
      ->allow_extra_args(false);
  app.add_flag("--fault-every-launch", flags.fault_every_launch,
               "Apply the faults at every launch, not only the first (a node that fails whatever is done)");
  app.add_flag("--no-memory-tier", flags.no_memory_tier, "Checkpoint without the shared-memory tier");
  app.add_flag("--quiet", flags.quiet, "Only the resume and final lines (and errors)");
  app.add_option("--join-timeout", flags.join_timeout_s, "Seconds to wait for every rank to attach at start")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", flags.seed, "Seed of the initial parameters and the gradients");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? lifeline::drill::kExitOk : lifeline::drill::kExitUsage;
  }

  lifeline::drill::Launch launch;
  if (auto err = lifeline::drill::ReadLaunch(&launch)) {
    std::fprintf(stderr, "lifeline-drill: %s\n", err->c_str());
    return lifeline::drill::kExitUsage;
  }
  return lifeline::drill::Run(flags, launch);
}
