#include <algorithm>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <map>
#include <set>

#include "formats/index_codec.h"
#include "lib/src/env/aligned_buffer.h"
#include "lib/src/env/s3_url.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/commit.h"
#include "lib/src/save/copy_engine.h"
#include "lib/src/save/drainer.h"
#include "lib/src/save/cuda_copy.h"
#include "lib/src/tier/memory_tier.h"
#include "lib/src/save/persist_pipeline.h"
#include "lib/src/save/rank_objects.h"
#include "lib/src/save/replica_digest.h"
#include "lib/src/save/save_job.h"
#include "lifeline/trace.h"
#include "lib/src/store/save_lock.h"
#include "lib/src/save/rank_data.h"
#include "lib/src/save/staging_arena.h"
#include "lib/src/store/step_scan.h"
#include "lifeline/checkpoint.h"
#include "lifeline/log.h"

namespace lifeline {

// Members are destroyed bottom-up: the pipeline first (it waits for every copy and feeds the
// drainer), then the copy threads, the drainer, and the memory the saves used.
namespace {

// The size of every part of a multipart upload but the last (S3EnvOptions::part_bytes).
constexpr uint64_t kObjectPartBytes = 8ull << 20;

// What Save plans from a request's tensors alone (Checkpointer::Impl::tensor_plan).
struct TensorPlan {
  std::vector<TensorShard> tensors;  // the request's (data addresses included; streams ignored)
  std::shared_ptr<const RankSavePlan> plan;
  std::vector<uint64_t> fragment_offset;
  uint64_t fragments_end = 0;
  // The first save's index (its tensors and fragments are every later save's: SaveJob::CompleteIndex).
  std::shared_ptr<const format::CheckpointIndex> index;
  std::vector<format::ChunkInfo> chunks;  // checksums zero
  std::shared_ptr<const std::vector<internal::CopyPiece>> pieces;  // the fragments'
  // The replica digests' plan, made at the first save that computes them.
  std::shared_ptr<const internal::ReplicaDigestPlan> replicas;
};

}  // namespace

struct Checkpointer::Impl {
  // First, so released last: after every save below has ended.
  std::unique_ptr<SaveLock> save_lock;  // taken (or checked) at the first save
  Env* env = nullptr;
  std::string run_hash;
  std::unique_ptr<MemoryTier> tier;
  std::unique_ptr<StagingArena> arena;
  std::unique_ptr<Drainer> drainer;
  std::unique_ptr<CopyEngine> copier;
  std::unique_ptr<PersistPipeline> pipeline;
  // The newest job of each staging slot (caller's thread only): what the slot holds.
  std::vector<std::shared_ptr<internal::SaveJob>> slot_job;
  // The last staged save's plan of its tensors (caller's thread only), reused by the next save of
  // the same tensors: a training loop saves the same ones at the same addresses every time, and
  // planning 8,192 chunks of a 2 GiB state again costs a millisecond of the loop's time.
  std::optional<TensorPlan> tensor_plan;
  bool warned_streaming = false;
  // Device snapshots (caller's thread only): a copy stream per CUDA device, and the slot memory
  // page-locked for them (address and length per slot; null when not pinned).
  std::map<int, std::unique_ptr<cuda::CopyStream>> copy_streams;
  std::vector<std::pair<uint8_t*, uint64_t>> pinned;
  bool warned_unpinned = false;
  // The launch's resume step (CheckpointerOptions::resume_step), until the first Save.
  bool resume_pinned = false;
  std::optional<uint64_t> resume_step;
};

namespace {

// Each checkpoint a load passed over reaches the agent, which raises a checkpoint anomaly for it.
void ReportFallbacks(const LoadResult& result) {
  if (!trace::Active()) return;
  for (const SkippedCheckpoint& s : result.skipped) {
    trace::Event e;
    e.type = trace::EventType::kCheckpointFallback;
    e.step = s.step;
    e.bytes = result.step;
    e.aux = s.location == "memory" ? 1 : 0;
    trace::Record(e);
  }
}

// `path` resolved as far as it exists (realpath of its longest existing prefix), the rest appended:
// a directory that one rank has created and another not yet gets the same answer from both.
std::string ResolvedPath(const std::string& path) {
  if (IsObjectStorePath(path)) {  // no links there: one spelling per prefix
    Result<S3Location> loc = ParseS3Path(path);
    return loc.ok() ? loc->ToString() : path;
  }
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) != nullptr) return resolved;
  if (path == ".") return path;  // the working directory is gone
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ResolvedPath(".") + "/" + path;
  if (slash == 0) return path;
  const std::string parent = path.substr(0, slash), leaf = path.substr(slash + 1);
  if (leaf.empty() || leaf == ".") return ResolvedPath(parent);
  return ResolvedPath(parent) + "/" + leaf;
}

bool SameDirectory(const std::string& a, const std::string& b) { return ResolvedPath(a) == ResolvedPath(b); }

std::string RandomHex64() {
  std::random_device device;
  const uint64_t v = (static_cast<uint64_t>(device()) << 32) ^ device();
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Queues the device-to-host copies of the job's device pieces into its staging slot, each device's
// after the work queued so far on its producers' streams, and records one fence per device. On
// failure, waits for whatever was queued (the slot is about to be released).
struct DeviceState {
  StagingArena* arena;
  std::map<int, std::unique_ptr<cuda::CopyStream>>& copy_streams;
  std::vector<std::pair<uint8_t*, uint64_t>>& pinned;
  bool& warned_unpinned;
};

Status QueueDeviceCopies(DeviceState m, internal::SaveJob& job, const SaveRequest& request, unsigned slot) {
  if (m.pinned.size() < m.arena->num_slots()) m.pinned.resize(m.arena->num_slots(), {nullptr, 0});
  auto& pin = m.pinned[slot];
  uint8_t* base = m.arena->data(slot);
  const uint64_t capacity = m.arena->capacity(slot);
  if (pin.first != base || pin.second != capacity) {
    if (pin.first != nullptr) cuda::UnpinHostMemory(pin.first);
    pin = {nullptr, 0};
    Status s = cuda::PinHostMemory(base, capacity);
    if (s.ok()) {
      pin = {base, capacity};
    } else if (!m.warned_unpinned) {
      m.warned_unpinned = true;
      Log(LogLevel::kWarning, "device snapshots go through pageable staging memory (slower, and the copy blocks "
                              "the caller): " + s.ToString());
    }
  }
  std::set<std::pair<int, void*>> waited;
  std::set<int> used;
  Status s;
  const size_t n = job.num_pieces();
  for (size_t i = 0; i < n && s.ok(); ++i) {
    const internal::CopyPiece& p = job.piece(i);
    if (!p.device) continue;
    const TensorShard& t = request.tensors[p.request_tensor];
    std::unique_ptr<cuda::CopyStream>& stream = m.copy_streams[t.device];
    if (stream == nullptr) {
      Result<std::unique_ptr<cuda::CopyStream>> created = cuda::CopyStream::Create(t.device);
      if (!created.ok()) {
        m.copy_streams.erase(t.device);
        s = created.status().Annotate("tensor '" + t.name + "'");
        break;
      }
      stream = std::move(created).value();
    }
    if (waited.insert({t.device, t.stream}).second) s = stream->WaitFor(t.stream);
    used.insert(t.device);
    // Adjacent pieces of one fragment are contiguous on both sides: one copy for the run.
    uint64_t length = p.length;
    size_t j = i + 1;
    for (; j < n; ++j) {
      const internal::CopyPiece& q = job.piece(j);
      if (!q.device || q.request_tensor != p.request_tensor || q.source != p.source + length ||
          q.image_offset != p.image_offset + length)
        break;
      length += q.length;
    }
    if (s.ok()) s = stream->CopyToHost(job.image + p.image_offset, p.source, length);
    i = j - 1;
  }
  for (int device : used) {
    Result<std::shared_ptr<cuda::Fence>> fence = m.copy_streams[device]->Record();
    if (fence.ok()) {
      job.device_fences.push_back(std::move(fence).value());
    } else if (s.ok()) {
      s = fence.status();
    }
  }
  if (!s.ok()) {
    for (const auto& fence : job.device_fences) fence->Synchronize().IgnoreError();
    job.device_fences.clear();
  }
  return s;
}

}  // namespace

bool CudaCopyEngineBuilt() { return cuda::Built(); }

Checkpointer::Checkpointer(CheckpointerOptions options) : options_(std::move(options)), impl_(new Impl) {}

Checkpointer::~Checkpointer() {
  Impl& m = *impl_;
  m.pipeline.reset();
  m.copier.reset();
  m.drainer.reset();
  if (m.tier != nullptr && options_.memory_tier_cleanup_on_close && !options_.load_only) {
    // Snapshots durable on disk are no longer needed in memory; one whose disk copy failed is the
    // only copy, and stays for the next process.
    for (const auto& job : m.slot_job) {
      if (job == nullptr) continue;
      const SaveProgress p = job->Progress();
      if (p.phase == SavePhase::kPersisted || p.phase == SavePhase::kCommitted) m.tier->Withdraw(job->step).IgnoreError();
    }
    // And whatever else of this rank's the tier holds of a step complete on disk (a snapshot whose
    // slot went to a later save before its own withdrawal was due).
    if (Result<std::vector<CheckpointInfo>> disk = ScanCheckpoints(m.env, options_.directory); disk.ok())
      for (const CheckpointInfo& info : *disk)
        if (info.complete) {
          m.tier->Withdraw(info.step).IgnoreError();
          m.tier->WithdrawEarlierLaunches(info.step).IgnoreError();
        }
    m.tier->RemoveSlotFiles();
    m.tier->RemoveRootIfEmpty();
  }
  m.copy_streams.clear();  // waits for their copies
  for (const auto& [base, length] : m.pinned)
    if (base != nullptr) cuda::UnpinHostMemory(base);
  if (m.arena != nullptr) m.arena->ReleaseAll(/*unlink_files=*/false);
}

namespace {

// The checkpoint directory, created when missing (with `create`). A path that is no directory,
// or one that cannot be written, is FailedPrecondition: the operator must change something.
Status CreateCheckpointDirectory(Env* env, const std::string& dir, bool create) {
  Status s = create ? CreateDirDurably(env, dir) : Status::OK();
  if (!create && env->FileExists(dir) && !env->IsDirectory(dir)) s = Status::IOError(dir, "not a directory");
  if (s.ok()) return s;
  std::string existing = dir;  // the deepest part of the path that exists
  while (!existing.empty() && existing != "/" && !env->FileExists(existing)) {
    const size_t slash = existing.find_last_not_of('/') == std::string::npos
                             ? std::string::npos
                             : existing.rfind('/', existing.find_last_not_of('/'));
    existing = slash == std::string::npos ? "." : slash == 0 ? "/" : existing.substr(0, slash);
    if (existing == ".") break;
  }
  if (!existing.empty() && env->FileExists(existing) && !env->IsDirectory(existing))
    return Status::FailedPrecondition(dir, (existing == dir ? std::string("is") : existing + " is") +
                                               " a file, not a directory: a checkpoint directory must be one");
  if ((env == Env::Default() || env == Env::Routing()) && !IsObjectStorePath(dir) && !existing.empty() && ::access(existing.c_str(), W_OK | X_OK) != 0 &&
      (errno == EACCES || errno == EROFS || errno == EPERM))
    return Status::FailedPrecondition(dir, "cannot be written (" + existing + ": " + std::strerror(errno) + ")");
  return s;
}

}  // namespace

Result<std::unique_ptr<Checkpointer>> Checkpointer::Open(CheckpointerOptions options) {
  if (options.directory.empty()) return Status::InvalidArgument("checkpoint directory is empty");
  for (std::string* dir : {&options.directory, &options.drain_directory}) {
    if (!IsObjectStorePath(*dir)) continue;
    LL_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(*dir));
    if (loc.key.empty())
      return Status::InvalidArgument(*dir, "a checkpoint directory in a bucket needs a prefix (s3://bucket/prefix): "
                                           "the bucket's other keys are never touched, so they cannot be its own");
    *dir = loc.ToString();  // one spelling: no trailing slash
    // Each write block is one part of a multipart upload, sent straight from the snapshot; a
    // smaller one would be copied and held until the file closes (formats/SPEC.md §18).
    options.write_block_bytes = std::max(options.write_block_bytes, kObjectPartBytes);
  }
  if (options.world_size == 0 || options.world_size > format::kMaxWorldSize || options.rank >= options.world_size)
    return Status::InvalidArgument("rank " + std::to_string(options.rank) + " of world size " +
                                   std::to_string(options.world_size) + " is not a valid rank");
  if (options.chunk_bytes % 8 != 0)
    return Status::InvalidArgument("chunk_bytes must be a multiple of 8 (or 0, the default)");
  if (options.write_block_bytes == 0 || options.write_block_bytes % kDirectIoAlignment != 0)
    return Status::InvalidArgument("write_block_bytes must be a positive multiple of 4096");
  if (options.staging_slots == 0 || options.staging_slots > 16)
    return Status::InvalidArgument("staging_slots must be 1 to 16");
  if (options.run_id.empty()) options.run_id = RunIdFromEnvironment();
  // One process is its own launch: any id unique to it will do.
  if (options.run_id.empty() && options.world_size == 1) options.run_id = "solo:" + RandomHex64();
  if (options.resume_step.empty()) {
    // The agent's pin is for the directory it was computed from, not for every Checkpointer.
    const char* v = std::getenv("LIFELINE_RESUME_STEP");
    const char* dir = std::getenv("LIFELINE_RESUME_DIR");
    if (v != nullptr && (dir == nullptr || SameDirectory(dir, options.directory))) options.resume_step = v;
  }
  std::optional<uint64_t> resume_step;
  if (!options.resume_step.empty() && options.resume_step != "none") {
    const std::string& v = options.resume_step;
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    if (v.find_first_not_of("0123456789") != std::string::npos || errno != 0 || end != v.c_str() + v.size())
      return Status::InvalidArgument("resume step (LIFELINE_RESUME_STEP)", "'" + v + "' is neither a step nor \"none\"");
    resume_step = n;
  }
  options.copy_threads = std::clamp(options.copy_threads, 1u, 64u);
  std::unique_ptr<Checkpointer> c(new Checkpointer(std::move(options)));
  const CheckpointerOptions& o = c->options_;
  Impl& m = *c->impl_;
  m.env = Env::OrDefault(o.env);
  m.run_hash = RunHash(o.run_id);
  m.resume_pinned = !o.resume_step.empty();
  m.resume_step = resume_step;
  trace::ReportCheckpointDirectory(o.directory);
  {
    if (Status s = CreateCheckpointDirectory(m.env, o.directory, /*create=*/!o.load_only); !s.ok()) {
      // The agent learns it before the process dies of it: no relaunch cures this.
      trace::Event failed;
      failed.type = trace::EventType::kCheckpointFailed;
      failed.step = trace::kNoStep;
      failed.aux = static_cast<uint64_t>(s.code());
      trace::Record(failed);
      return s;
    }
  }

  std::vector<std::string> shm_paths;
  if (o.load_only) {
    // A reader takes the tier as it finds it: opening one would claim its slots from the saver.
    Result<std::string> root = o.memory_tier_directory.empty() ? FindMemoryTierRoot(m.env, o.directory)
                                                               : Result<std::string>(o.memory_tier_directory);
    if (root.ok() && Env::Default()->IsDirectory(*root)) m.tier = MemoryTier::Existing(*root, o.rank, o.world_size);
  } else if (o.memory_tier) {
    // Null for a read-only directory: loads from it work, from disk.
    LL_ASSIGN_OR_RETURN(m.tier, MemoryTier::OpenFor(m.env, o.memory_tier_directory, o.directory, m.run_hash, o.rank,
                                                    o.world_size, o.staging_slots));
    for (unsigned k = 0; m.tier != nullptr && k < o.staging_slots; ++k) shm_paths.push_back(m.tier->SlotPath(k));
    if (m.tier != nullptr) trace::ReportMemoryTier(m.tier->root());
  }
  m.arena = std::make_unique<StagingArena>(o.staging_slots, o.staging_budget_bytes, std::move(shm_paths));
  m.slot_job.resize(o.staging_slots);
  if (!o.drain_directory.empty()) {
    DrainConfig d;
    d.source_root = o.directory;
    d.writer = RankWriterConfig{{o.drain_directory, m.run_hash, o.rank, o.world_size}, o.drain_keep_last, o.direct_io};
    d.nice_levels = o.background_nice;
    m.drainer = std::make_unique<Drainer>(m.env, std::move(d));
  }
  m.copier = std::make_unique<CopyEngine>(o.copy_threads, o.background_nice);
  PersistConfig p;
  p.writer = RankWriterConfig{{o.directory, m.run_hash, o.rank, o.world_size}, o.keep_last, o.direct_io};
  p.queue_depth = o.queue_depth;
  p.register_buffers = o.register_buffers;
  p.nice_levels = o.background_nice;
  Drainer* drainer = m.drainer.get();
  MemoryTier* tier = m.tier.get();
  m.pipeline = std::make_unique<PersistPipeline>(m.env, std::move(p), m.arena.get(),
                                                 [drainer, tier](internal::SaveJob& job) {
    if (tier != nullptr && job.Progress().memory_tier) {
      Status s = tier->MarkOnDisk(job.step);
      if (!s.ok()) Log(LogLevel::kWarning, "memory tier: step " + std::to_string(job.step) + ": " + s.ToString());
    }
    if (drainer != nullptr) drainer->Enqueue(job.step, job.disk_index);
  });
  return c;
}

namespace {

// Whether two requests' tensors make the same plan: all that PlanRankSave and PlanPieces read.
bool SameTensors(const std::vector<TensorShard>& a, const std::vector<TensorShard>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const TensorShard& x = a[i];
    const TensorShard& y = b[i];
    if (x.data != y.data || x.dtype != y.dtype || x.flat_begin != y.flat_begin || x.flat_end != y.flat_end ||
        x.replica_index != y.replica_index || x.replica_count != y.replica_count || x.device != y.device ||
        x.global_shape != y.global_shape || x.offsets != y.offsets || x.shape != y.shape || x.name != y.name)
      return false;
  }
  return true;
}

}  // namespace

SaveTicket Checkpointer::Save(uint64_t step, const SaveRequest& request) {
  using Part = internal::SaveJob::StallPart;
  auto last = internal::SaveJob::Clock::now();
  Impl& m = *impl_;
  const CheckpointerOptions& o = options_;
  auto job = std::make_shared<internal::SaveJob>(step, m.env, o.directory);
  // The caller's time since the last lap, as `part` of the save's stall.
  auto lap = [&job, &last](Part part) {
    const auto now = internal::SaveJob::Clock::now();
    job->AddStall(now - last, part);
    last = now;
  };
  const std::string where = "saving step " + std::to_string(step) + " on rank " + std::to_string(o.rank);
  auto refuse = [&](Status s, SavePhase phase) {
    job->InitCounters(request.tensors.size());
    job->FinishWithoutCopy(std::move(s), phase);
    return SaveTicket(job);
  };

  if (o.load_only)
    return refuse(Status::FailedPrecondition(where, "this Checkpointer of " + o.directory +
                                                    " was opened load_only (a reader): it never saves"),
                  SavePhase::kFailed);
  m.resume_pinned = false;  // Load(latest) means the newest again
  if (o.run_id.empty())
    return refuse(Status::FailedPrecondition(
                      where, "no launch id, so ranks of two launches could complete one step together: set "
                             "CheckpointerOptions::run_id (Python: run_id=) to a value that is the same on every "
                             "rank and new for every launch, or launch with lifeline-agent or torchrun --rdzv-id, "
                             "or create the Python Checkpointer after torch.distributed is initialised (the ranks "
                             "then agree on one)"),
                  SavePhase::kFailed);
  if (m.save_lock == nullptr) {
    Result<std::unique_ptr<SaveLock>> claimed = SaveLock::Claim(m.env, o.directory, o.run_id, o.rank);
    if (!claimed.ok()) return refuse(claimed.status().Annotate(where), SavePhase::kFailed);
    m.save_lock = std::move(*claimed);
  }
  std::set<std::string_view> object_names;
  for (const auto& [name, bytes] : request.objects) {
    if (name.empty() || name.size() > format::kMaxNameBytes || !object_names.insert(name).second)
      return refuse(Status::InvalidArgument(where, "object names must be unique and 1 to 4096 bytes: '" + name + "'"),
                    SavePhase::kFailed);
    if (IsReservedObjectName(name))
      return refuse(Status::InvalidArgument(where, "object name '" + name + "': names rank<R>/... are reserved for "
                                                   "objects folded by a conversion to a smaller world"),
                    SavePhase::kFailed);
  }
  const TensorPlan* reuse =
      m.tensor_plan && SameTensors(m.tensor_plan->tensors, request.tensors) ? &*m.tensor_plan : nullptr;
  if (reuse != nullptr) {
    job->plan = reuse->plan;
  } else {
    Result<RankSavePlan> plan = PlanRankSave(request, o.replica_split_bytes, true, o.column_blocks);
    if (!plan.ok()) return refuse(plan.status().Annotate(where), SavePhase::kFailed);
    job->plan = std::make_shared<const RankSavePlan>(std::move(*plan));
  }
  job->objects = request.objects;
  job->metadata_json = request.metadata_json;
  RankWriteOptions& w = job->write_options;
  w.step = step;
  w.rank = o.rank;
  w.world_size = o.world_size;
  w.run_id = o.run_id;
  w.run_hash = m.run_hash;
  w.chunk_bytes = o.chunk_bytes != 0 ? o.chunk_bytes : DefaultChunkBytes(o.codec);
  w.write_block_bytes = o.write_block_bytes;
  w.memory_budget = o.save_memory_budget;
  w.queue_depth = o.queue_depth;
  w.direct_io = o.direct_io;
  w.codec = internal::StoredCodec(o.codec);
  w.codec_level = o.codec_level;
  if (reuse != nullptr) {
    job->layout.fragment_offset = reuse->fragment_offset;
    job->layout.bytes = reuse->fragments_end;
    LayoutObjects(job->objects, &job->layout);
  } else {
    job->layout = LayoutImage(*job->plan, job->objects);
  }
  job->bytes_total = job->layout.bytes - kDataHeaderBytes;
  job->block_bytes = o.write_block_bytes;
  const uint64_t padded = AlignUp(job->layout.bytes, kDirectIoAlignment);

  lap(Part::kPlan);

  std::optional<unsigned> slot;
  if (padded <= m.arena->slot_limit()) {
    slot = m.arena->Acquire(/*wait=*/false);
    if (!slot && m.tier != nullptr && o.busy_policy == BusyPolicy::kWait &&
        o.supersede_waiting_saves.value_or(IsObjectStorePath(o.directory))) {
      // With the memory tier, training does not wait for an object store that is slow or away (its
      // requests retry for up to a minute each): the oldest snapshot still queued for persisting
      // gives its slot to this one (it leaves the tier below), so the tier holds the newest steps
      // while the durable copy falls behind. A disk keeps its back-pressure: every save persisted.
      std::vector<std::shared_ptr<internal::SaveJob>> queued;
      for (const std::shared_ptr<internal::SaveJob>& j : m.slot_job)
        if (j != nullptr && j->slot && !j->finished()) queued.push_back(j);
      std::sort(queued.begin(), queued.end(), [](const auto& a, const auto& b) { return a->started < b->started; });
      for (const std::shared_ptr<internal::SaveJob>& j : queued) {
        const std::string superseded = "saving step " + std::to_string(j->step) + " on rank " + std::to_string(o.rank);
        std::optional<uint64_t> busy;  // the oldest other save still in a slot: the one being persisted
        for (const std::shared_ptr<internal::SaveJob>& k : queued)
          if (k != j && (!busy || k->step < *busy)) busy = k->step;
        j->WaitCopyStopped();  // a snapshot still being copied is waited for: memory speed, not the store's
        if (!j->Supersede(Status::Aborted(
                superseded, "superseded by step " + std::to_string(step) + " before it was persisted: step " +
                                (busy ? std::to_string(*busy) : std::string("?")) + " was still being persisted to " +
                                o.directory + " (the store is slow or unreachable), and with the memory tier a save "
                                "takes the slot of a snapshot still waiting to be persisted rather than block "
                                "training; this step was never published")))
          continue;
        Log(LogLevel::kWarning, superseded + ": superseded by step " + std::to_string(step) +
                                    " before it was persisted to " + o.directory + " (the durable copy is behind)");
        m.arena->Release(*j->slot);
        slot = m.arena->Acquire(/*wait=*/false);
        break;
      }
    }
    if (!slot) slot = m.arena->Acquire(o.busy_policy == BusyPolicy::kWait);
    lap(Part::kSlot);
    if (!slot) {
      const std::optional<uint64_t> busy = m.arena->OldestBusyStep();
      return refuse(Status::Unavailable(where, "skipped: step " + (busy ? std::to_string(*busy) : std::string("?")) +
                                                   " is still being persisted and all " +
                                                   std::to_string(o.staging_slots) + " staging slots are busy"),
                    SavePhase::kSkipped);
    }
    Status reserved = m.arena->Reserve(*slot, padded);
    if (!reserved.ok()) {
      Log(LogLevel::kWarning, where + ": cannot stage the snapshot (" + reserved.ToString() +
                                  "); streaming it to disk instead, which blocks until it is written");
      if (m.tier != nullptr)
        job->NoteMemoryTier("cannot stage the snapshot in shared memory (" + reserved.ToString() +
                            "): give the tier's file system (" + m.tier->root() +
                            ") room for two snapshots, e.g. docker --shm-size or a Kubernetes emptyDir with medium: "
                            "Memory");
      m.arena->Release(*slot);
      slot.reset();
    }
  } else {
    const std::string why = "the snapshot (" + std::to_string(padded) + " bytes) exceeds a staging slot (" +
                            std::to_string(m.arena->slot_limit()) + " bytes: staging_budget_bytes / staging_slots)";
    if (m.tier != nullptr) job->NoteMemoryTier(why + ": it is streamed to disk, and not kept in memory");
    if (!m.warned_streaming) {
      m.warned_streaming = true;
      Log(LogLevel::kWarning, where + ": " + why + "; streaming it to disk instead, which blocks until it is written");
    }
  }

  const bool has_device = std::any_of(request.tensors.begin(), request.tensors.end(),
                                      [](const TensorShard& t) { return t.device >= 0; });
  if (!slot && has_device) {
    return refuse(Status::FailedPrecondition(where, "device tensors are snapshotted through a staging slot, and this "
                                                    "snapshot (" + std::to_string(padded) +
                                                    " bytes) gets none: raise staging_budget_bytes to at least "
                                                    "staging_slots x that"),
                  SavePhase::kFailed);
  }
  if (!slot) {
    job->InitCounters(request.tensors.size(), /*streamed=*/true);
    lap(Part::kPlan);
    m.pipeline->Submit(job);
    lap(Part::kSubmit);
    return SaveTicket(job);
  }

  // The slot's previous snapshot leaves the memory tier before its bytes are overwritten.
  std::shared_ptr<internal::SaveJob>& previous = m.slot_job[*slot];
  if (m.tier != nullptr && previous != nullptr) {
    Status s = m.tier->Withdraw(previous->step);
    if (!s.ok()) Log(LogLevel::kWarning, "memory tier: withdrawing step " + std::to_string(previous->step) + ": " + s.ToString());
  }
  previous = job;
  m.arena->SetStep(*slot, step);
  job->slot = slot;
  job->image = m.arena->data(*slot);
  EncodeDataHeader(o.rank, o.world_size, step, m.run_hash, job->image);
  std::memset(job->image + job->layout.bytes, 0, padded - job->layout.bytes);
  lap(Part::kStage);
  if (reuse != nullptr) {
    job->index = RawImageIndexOfReusedPlan(reuse->chunks, job->objects, job->metadata_json, job->layout, w);
    job->index_structure = reuse->index;
    internal::PlanPieces(*job, request, reuse->pieces);
  } else {
    job->index = RawImageIndex(*job->plan, job->objects, job->metadata_json, job->layout, w);
    internal::PlanPieces(*job, request);
    TensorPlan& t = m.tensor_plan.emplace();
    t.tensors = request.tensors;
    t.plan = job->plan;
    t.fragment_offset = job->layout.fragment_offset;
    t.fragments_end = job->layout.object_offset.empty() ? job->layout.bytes : job->layout.object_offset[0];
    t.index = std::make_shared<const format::CheckpointIndex>(job->index);
    t.chunks = job->index.chunks;
    t.pieces = std::make_shared<const std::vector<internal::CopyPiece>>(
        job->pieces.begin(), job->pieces.begin() + static_cast<ptrdiff_t>(job->index.chunks.size()));
  }
  if (has_device) {
    Status s = QueueDeviceCopies(DeviceState{m.arena.get(), m.copy_streams, m.pinned, m.warned_unpinned}, *job,
                                 request, *slot);
    if (!s.ok()) {
      previous = nullptr;
      m.arena->Release(*slot);
      job->slot.reset();
      job->image = nullptr;
      return refuse(s.Annotate(where), SavePhase::kFailed);
    }
  }
  if (o.replica_digests == CheckpointerOptions::ReplicaDigests::kOn ||
      (o.replica_digests == CheckpointerOptions::ReplicaDigests::kAuto && trace::Active())) {
    TensorPlan& t = *m.tensor_plan;  // this save's (reused or just made)
    if (t.replicas == nullptr)
      t.replicas = internal::PlanReplicaDigests(request, *t.plan, t.index->fragments, w.chunk_bytes, o.replica_split_bytes);
    if (!t.replicas->shards.empty()) job->SetReplicaDigests(t.replicas, trace::Active());
  }
  job->InitCounters(request.tensors.size());
  if (m.tier != nullptr) {
    MemoryTier* tier = m.tier.get();
    const unsigned k = *slot;
    job->on_copied = [tier, k](internal::SaveJob& j) {
      j.CompleteIndex();
      Result<std::string> encoded = format::EncodeIndex(j.index);
      Status s = encoded.ok() ? tier->Publish(j.step, k, *encoded) : encoded.status();
      if (s.ok()) {
        j.MarkMemoryTier();
      } else {
        Log(LogLevel::kWarning, "memory tier: step " + std::to_string(j.step) + " not published: " + s.ToString());
        j.NoteMemoryTier("not published to the memory tier: " + s.ToString());
      }
    };
  }
  lap(Part::kPlan);
  job->Trace(trace::EventType::kCheckpointBegin);
  m.copier->Submit(job);
  m.pipeline->Submit(job);
  lap(Part::kSubmit);
  return SaveTicket(job);
}

Status Checkpointer::PrepareStaging(const SaveRequest& request) {
  Result<RankSavePlan> plan = PlanRankSave(request, options_.replica_split_bytes, true, options_.column_blocks);
  if (!plan.ok()) return plan.status().Annotate("preparing the staging arena");
  const uint64_t padded = AlignUp(LayoutImage(*plan, request.objects).bytes, kDirectIoAlignment);
  if (padded > impl_->arena->slot_limit())
    return Status::FailedPrecondition("preparing the staging arena",
                                      "a snapshot of " + std::to_string(padded) + " bytes exceeds a staging slot (" +
                                          std::to_string(impl_->arena->slot_limit()) +
                                          " bytes: staging_budget_bytes / staging_slots); it would be streamed");
  return impl_->arena->Prepare(padded);
}

Status Checkpointer::Flush() {
  Status s = impl_->pipeline->Flush();
  if (impl_->drainer != nullptr) {
    Status d = impl_->drainer->Flush();
    if (s.ok()) s = d;
  }
  return s;
}

const std::string& Checkpointer::memory_tier_directory() const {
  static const std::string kNone;
  return impl_->tier != nullptr ? impl_->tier->root() : kNone;
}

Status Checkpointer::WaitForCommit(uint64_t step, double timeout_seconds) {
  return WaitForCommitIn(impl_->env, options_.directory, step, timeout_seconds);
}

LoadFailure ClassifyLoadFailure(StatusCode code) {
  switch (code) {
    case StatusCode::kNotInCheckpoint:
      return LoadFailure::kMismatch;
    case StatusCode::kCorruption:
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition:
      return LoadFailure::kDamage;
    default:
      return LoadFailure::kOther;
  }
}

namespace {

// Loads from one root (the checkpoint directory or the memory tier). With no step asked for, a
// damaged newest checkpoint falls back to the next older complete one.
Result<LoadResult> LoadFromRoot(Env* env, const std::string& root, std::optional<uint64_t> step,
                                const LoadRequest& request, const CheckpointerOptions& options_,
                                std::vector<SkippedCheckpoint>* skipped) {
  ReaderOptions ropt;
  ropt.memory_budget = options_.load_memory_budget;
  ropt.queue_depth = options_.queue_depth;
  ropt.direct_io = options_.direct_io;
  ropt.manifest_in_parts = true;

  auto complete_steps = [&]() -> Result<std::vector<uint64_t>> {
    LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(env, root));
    std::vector<uint64_t> steps;
    for (const CheckpointInfo& info : all)
      if (info.complete && !info.suspect) steps.push_back(info.step);  // a suspect step only when asked for
    return steps;
  };
  std::vector<uint64_t> candidates;
  if (step.has_value()) {
    candidates.push_back(*step);
  } else {
    LL_ASSIGN_OR_RETURN(candidates, complete_steps());
    if (candidates.empty()) return Status::NotFound(root, "no complete checkpoint");
  }
  Status last;
  for (int round = 0;; ++round) {
    for (uint64_t candidate : candidates) {
      auto attempt = [&]() -> Result<LoadResult> {
        LL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                            CheckpointReader::Open(env, root, candidate, ropt));
        // A tensor the newest checkpoint does not hold is the caller's mismatch, not damage: falling
        // back to an older checkpoint that has it would silently resume from the past.
        std::set<std::string_view> stored;
        for (const format::TensorInfo& t : reader->manifest().tensors) stored.insert(t.name);
        for (const TensorShard& t : request.tensors) {
          if (!stored.count(t.name))
            return Status::NotInCheckpoint(reader->step_dir(), "tensor '" + t.name + "' is not in the checkpoint of step " +
                                                                   std::to_string(candidate));
        }
        LL_ASSIGN_OR_RETURN(LoadStats stats, reader->Load(request.tensors));
        LoadResult result;
        result.step = reader->step();
        result.saved_world_size = reader->manifest().world_size;
        result.metadata_json = reader->manifest().metadata_json;
        result.bytes_read = stats.bytes_read;
        result.bytes_scattered = stats.bytes_scattered;
        const uint32_t owner = request.objects_of_rank.value_or(options_.rank);
        for (RankObjectRef& ref : ObjectsSavedBy(reader->manifest(), owner)) {
          LL_ASSIGN_OR_RETURN(std::string bytes, reader->ReadObject(*ref.object));
          result.objects.emplace_back(std::move(ref.name), std::move(bytes));
        }
        return result;
      };
      auto result = attempt();
      if (result.ok() || step.has_value()) return result;
      last = result.status();
      if (ClassifyLoadFailure(last.code()) != LoadFailure::kDamage) return last;
      Log(LogLevel::kWarning, "checkpoint of step " + std::to_string(candidate) + " unusable, trying an older one: " +
                                  last.ToString());
      skipped->push_back({candidate, "disk", last.ToString()});
    }
    // Retention of a concurrent save may have removed the checkpoints listed above, which means a
    // newer one was committed meanwhile: look again when the newest complete step has changed.
    if (round == 2) return last;
    LL_ASSIGN_OR_RETURN(std::vector<uint64_t> again, complete_steps());
    if (again.empty() || again.front() == candidates.front()) return last;
    candidates = std::move(again);
  }
}

}  // namespace

Result<LoadResult> Checkpointer::Load(std::optional<uint64_t> step, const LoadRequest& request) {
  // Device targets are filled through host buffers, then copied to their devices.
  std::vector<size_t> on_device;
  for (size_t i = 0; i < request.tensors.size(); ++i)
    if (request.tensors[i].device >= 0) on_device.push_back(i);
  Impl& m = *impl_;
  if (!step && m.resume_pinned) {
    if (!m.resume_step)
      return Status::NotFound(options_.directory, "this launch starts fresh: lifeline-agent found no complete "
                                                  "checkpoint when it launched the ranks (resume step \"none\")");
    step = m.resume_step;
  }
  if (on_device.empty()) return LoadHost(step, request);
  if (!cuda::Built()) return cuda::CopyStream::Create(0).status().Annotate("loading tensor '" + request.tensors[on_device[0]].name + "'");
  LoadRequest host = request;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  for (size_t i : on_device) {
    TensorShard& t = host.tensors[i];
    buffers.emplace_back(new (std::nothrow) uint8_t[std::max<uint64_t>(1, t.num_bytes())]);
    if (buffers.back() == nullptr)
      return Status::ResourceExhausted("loading tensor '" + t.name + "'", "no host memory for its " +
                                                                          std::to_string(t.num_bytes()) + " bytes");
    t.data = buffers.back().get();
    t.device = -1;
  }
  LL_ASSIGN_OR_RETURN(LoadResult result, LoadHost(step, host));
  for (size_t k = 0; k < on_device.size(); ++k) {
    const TensorShard& t = request.tensors[on_device[k]];
    if (t.num_bytes() == 0) continue;
    LL_RETURN_IF_ERROR(cuda::CopyToDevice(t.device, t.data, buffers[k].get(), t.num_bytes())
                           .Annotate("loading tensor '" + t.name + "'"));
  }
  return result;
}

Result<LoadResult> Checkpointer::LoadHost(std::optional<uint64_t> step, const LoadRequest& request) {
  Impl& m = *impl_;
  std::vector<SkippedCheckpoint> skipped;
  if (m.tier != nullptr) {
    // The memory tier wins when it holds the asked-for step, or a newest step at least as new as
    // the disk's: same bytes, read at memory speed, checksums verified all the same.
    auto newest_complete = [](const Result<std::vector<CheckpointInfo>>& list, std::optional<uint64_t> want) {
      std::optional<uint64_t> found;
      if (!list.ok()) return found;
      for (const CheckpointInfo& info : *list)
        if (info.complete && (want ? info.step == *want : !info.suspect)) return std::optional<uint64_t>(info.step);
      return found;
    };
    const std::optional<uint64_t> in_memory =
        newest_complete(ListTierSteps(m.env, options_.directory, m.tier->root()), step);
    bool use_tier = in_memory.has_value();
    if (use_tier && !step) {
      const std::optional<uint64_t> on_disk = newest_complete(ScanCheckpoints(m.env, options_.directory), std::nullopt);
      use_tier = !on_disk || *in_memory >= *on_disk;
    }
    if (use_tier) {
      Result<LoadResult> r = LoadFromRoot(m.tier->env(), m.tier->root(), *in_memory, request, options_, &skipped);
      if (r.ok()) {
        r->from_memory_tier = true;
        return r;
      }
      if (ClassifyLoadFailure(r.status().code()) == LoadFailure::kMismatch) return r.status();
      Log(LogLevel::kWarning, "memory tier: step " + std::to_string(*in_memory) + " unusable, loading from disk: " +
                                  r.status().ToString());
      skipped.push_back({*in_memory, "memory", r.status().ToString()});
    }
  }
  Result<LoadResult> r = LoadFromRoot(m.env, options_.directory, step, request, options_, &skipped);
  if (!r.ok()) return r;
  r->skipped = std::move(skipped);
  ReportFallbacks(*r);
  return r;
}

Result<std::vector<CheckpointInfo>> Checkpointer::List() { return ScanCheckpoints(impl_->env, options_.directory); }

Result<std::optional<uint64_t>> Checkpointer::LatestStep() {
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, List());
  for (const CheckpointInfo& info : all)
    if (info.complete && !info.suspect) return std::optional<uint64_t>(info.step);
  return std::optional<uint64_t>();
}

Result<std::vector<CheckpointInfo>> Checkpointer::ListMemoryTier() {
  if (impl_->tier == nullptr) return std::vector<CheckpointInfo>();
  return ListTierSteps(impl_->env, options_.directory, impl_->tier->root());
}

Status Checkpointer::CollectGarbage() {
  return CollectGarbageIn(impl_->env, options_.directory, SaverRetention(impl_->env, options_.keep_last, impl_->run_hash));
}

}  // namespace lifeline
