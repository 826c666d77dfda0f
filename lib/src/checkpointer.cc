#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>
#include <thread>

#include "formats/index_codec.h"
#include "lib/src/checkpoint_layout.h"
#include "lib/src/checkpoint_reader.h"
#include "lib/src/saver.h"
#include "lib/src/step_scan.h"
#include "lifeline/checkpoint.h"
#include "lifeline/log.h"

namespace lifeline {

struct Checkpointer::Impl {
  Env* env = nullptr;
  std::string run_hash;
};

namespace {

// Removes a step directory so that it stops being visible first: one rank index goes before
// anything else, so a crash half-way leaves a partial step, never a complete one with holes.
Status RemoveStep(Env* env, const StepState& state) {
  const std::string& dir = state.info.directory;
  if (state.info.complete) {
    Status s = env->RemoveFile(JoinPath(dir, IndexFileName(state.run_hash, 0, state.info.world_size)));
    if (!s.ok() && !s.IsNotFound()) return s;
    LL_RETURN_IF_ERROR(env->SyncDir(dir));
  }
  return RemoveDirRecursively(env, dir);
}

std::string ParentDir(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;
  const size_t slash = path.rfind('/', end - 1);
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Creates `dir` and its missing parents durably: a directory entry survives a crash only once
// its parent is synced, and without that a whole checkpoint root could vanish with the machine.
Status CreateDirDurably(Env* env, const std::string& dir) {
  std::vector<std::string> created;  // deepest first
  for (std::string p = dir; !p.empty() && p != "/" && p != "." && !env->IsDirectory(p); p = ParentDir(p))
    created.push_back(p);
  LL_RETURN_IF_ERROR(env->CreateDir(dir));
  for (auto it = created.rbegin(); it != created.rend(); ++it) LL_RETURN_IF_ERROR(env->SyncDir(ParentDir(*it)));
  return Status::OK();
}

}  // namespace

Checkpointer::Checkpointer(CheckpointerOptions options) : options_(std::move(options)), impl_(new Impl) {}
Checkpointer::~Checkpointer() = default;

Result<std::unique_ptr<Checkpointer>> Checkpointer::Open(CheckpointerOptions options) {
  if (options.directory.empty()) return Status::InvalidArgument("checkpoint directory is empty");
  if (options.world_size == 0 || options.world_size > format::kMaxWorldSize || options.rank >= options.world_size)
    return Status::InvalidArgument("rank " + std::to_string(options.rank) + " of world size " +
                                   std::to_string(options.world_size) + " is not a valid rank");
  if (options.chunk_bytes == 0 || options.chunk_bytes % 8 != 0)
    return Status::InvalidArgument("chunk_bytes must be a positive multiple of 8");
  if (options.run_id.empty()) options.run_id = RunIdFromEnvironment();
  std::unique_ptr<Checkpointer> c(new Checkpointer(std::move(options)));
  c->impl_->env = c->options_.env != nullptr ? c->options_.env : Env::Default();
  c->impl_->run_hash = RunHash(c->options_.run_id);
  LL_RETURN_IF_ERROR(CreateDirDurably(c->impl_->env, c->options_.directory));
  return c;
}

Status Checkpointer::Save(uint64_t step, const SaveRequest& request) {
  Env* env = impl_->env;
  const CheckpointerOptions& o = options_;
  const std::string& hash = impl_->run_hash;
  const std::string where = "saving step " + std::to_string(step) + " on rank " + std::to_string(o.rank);

  std::set<std::string_view> object_names;
  for (const auto& [name, bytes] : request.objects) {
    if (name.empty() || name.size() > format::kMaxNameBytes || !object_names.insert(name).second)
      return Status::InvalidArgument(where, "object names must be unique and 1 to 4096 bytes: '" + name + "'");
  }
  LL_ASSIGN_OR_RETURN(RankSavePlan plan, PlanRankSave(request, o.replica_split_bytes));

  const std::string step_dir = JoinPath(o.directory, StepDirName(step));
  LL_RETURN_IF_ERROR(env->CreateDir(step_dir));
  LL_RETURN_IF_ERROR(env->SyncDir(o.directory));
  {
    LL_ASSIGN_OR_RETURN(StepState state, ScanStep(env, step_dir, step));
    if (state.info.complete)
      return Status::AlreadyExists(step_dir, "step " + std::to_string(step) + " is already committed");
  }
  // A previous attempt of this very run and rank (a retried save) must not be mistaken for ours.
  const std::string index_path = JoinPath(step_dir, IndexFileName(hash, o.rank, o.world_size));
  Status s = env->RemoveFile(index_path);
  if (!s.ok() && !s.IsNotFound()) return s.Annotate(where);

  RankWriteOptions w;
  w.step = step;
  w.rank = o.rank;
  w.world_size = o.world_size;
  w.run_id = o.run_id;
  w.run_hash = hash;
  w.chunk_bytes = o.chunk_bytes;
  w.write_block_bytes = o.write_block_bytes;
  w.memory_budget = o.save_memory_budget;
  w.queue_depth = o.queue_depth;
  w.direct_io = o.direct_io;
  LL_ASSIGN_OR_RETURN(format::CheckpointIndex index, WriteRankData(env, step_dir, plan, request, w));
  LL_ASSIGN_OR_RETURN(std::string encoded, format::EncodeIndex(index));
  LL_RETURN_IF_ERROR(WriteFileAtomically(env, index_path, encoded).Annotate(where));

  // Commit: the rank that completes the set of indexes writes the manifest.
  LL_ASSIGN_OR_RETURN(StepState state, ScanStep(env, step_dir, step));
  if (!state.info.complete || state.run_hash != hash || state.info.world_size != o.world_size) return Status::OK();
  auto manifest = MergeRankIndexes(env, step_dir, hash, o.world_size, step);
  if (!manifest.ok()) return manifest.status().Annotate("step " + std::to_string(step) + " cannot be committed");
  // The last index was the commit point: the step is visible now. The manifest only spares readers
  // the merge, so failing to write it must not report a save failure (a retry would find the step
  // committed and get AlreadyExists).
  Result<std::string> manifest_bytes = format::EncodeIndex(*manifest);
  Status written = manifest_bytes.ok()
                       ? WriteFileAtomically(env, JoinPath(step_dir, ManifestFileName(hash, o.world_size)), *manifest_bytes)
                       : manifest_bytes.status();
  if (!written.ok())
    Log(LogLevel::kWarning, where + ": step committed, but its manifest was not written (readers merge the rank "
                                    "indexes instead): " + written.ToString());
  Status gc = CollectGarbage();
  if (!gc.ok()) Log(LogLevel::kWarning, "garbage collection after step " + std::to_string(step) + ": " + gc.ToString());
  return Status::OK();
}

Status Checkpointer::WaitForCommit(uint64_t step, double timeout_seconds) {
  const std::string step_dir = JoinPath(options_.directory, StepDirName(step));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (impl_->env->IsDirectory(step_dir)) {
      LL_ASSIGN_OR_RETURN(StepState state, ScanStep(impl_->env, step_dir, step));
      if (state.info.complete) return Status::OK();
      if (std::chrono::steady_clock::now() >= deadline)
        return Status::Aborted(step_dir, "not committed after " + std::to_string(timeout_seconds) + " s: " + state.info.problem);
    } else if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Aborted(step_dir, "not committed after " + std::to_string(timeout_seconds) + " s: no such step");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

Result<LoadResult> Checkpointer::Load(std::optional<uint64_t> step, const LoadRequest& request) {
  Env* env = impl_->env;
  ReaderOptions ropt;
  ropt.memory_budget = options_.load_memory_budget;
  ropt.queue_depth = options_.queue_depth;
  ropt.direct_io = options_.direct_io;

  auto complete_steps = [&]() -> Result<std::vector<uint64_t>> {
    LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(env, options_.directory));
    std::vector<uint64_t> steps;
    for (const CheckpointInfo& info : all)
      if (info.complete) steps.push_back(info.step);
    return steps;
  };
  std::vector<uint64_t> candidates;
  if (step.has_value()) {
    candidates.push_back(*step);
  } else {
    LL_ASSIGN_OR_RETURN(candidates, complete_steps());
    if (candidates.empty()) return Status::NotFound(options_.directory, "no complete checkpoint");
  }
  Status last;
  for (int round = 0;; ++round) {
    for (uint64_t candidate : candidates) {
      bool request_mismatch = false;
      auto attempt = [&]() -> Result<LoadResult> {
        LL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                            CheckpointReader::Open(env, options_.directory, candidate, ropt));
        // A tensor the newest checkpoint does not hold is the caller's mismatch, not damage: falling
        // back to an older checkpoint that has it would silently resume from the past.
        std::set<std::string_view> stored;
        for (const format::TensorInfo& t : reader->manifest().tensors) stored.insert(t.name);
        for (const TensorShard& t : request.tensors) {
          if (!stored.count(t.name)) {
            request_mismatch = true;
            return Status::NotFound(reader->step_dir(), "tensor '" + t.name + "' is not in the checkpoint of step " +
                                                            std::to_string(candidate));
          }
        }
        LL_ASSIGN_OR_RETURN(LoadStats stats, reader->Load(request.tensors));
        LoadResult result;
        result.step = reader->step();
        result.saved_world_size = reader->manifest().world_size;
        result.metadata_json = reader->manifest().metadata_json;
        result.bytes_read = stats.bytes_read;
        result.bytes_scattered = stats.bytes_scattered;
        const uint32_t owner = request.objects_of_rank.value_or(options_.rank);
        for (const format::ObjectInfo& obj : reader->manifest().objects) {
          if (obj.rank != owner) continue;
          LL_ASSIGN_OR_RETURN(std::string bytes, reader->ReadObject(obj));
          result.objects.emplace_back(obj.name, std::move(bytes));
        }
        return result;
      };
      auto result = attempt();
      if (result.ok() || step.has_value() || request_mismatch) return result;
      // With no step asked for, a damaged newest checkpoint falls back to the next older one.
      last = result.status();
      if (!last.IsCorruption() && !last.IsNotFound()) return last;
      Log(LogLevel::kWarning, "checkpoint of step " + std::to_string(candidate) + " unusable, trying an older one: " +
                                  last.ToString());
    }
    // Retention of a concurrent save may have removed the checkpoints listed above, which means a
    // newer one was committed meanwhile: look again when the newest complete step has changed.
    if (round == 2) return last;
    LL_ASSIGN_OR_RETURN(std::vector<uint64_t> again, complete_steps());
    if (again.empty() || again.front() == candidates.front()) return last;
    candidates = std::move(again);
  }
}

Result<std::vector<CheckpointInfo>> Checkpointer::List() { return ScanCheckpoints(impl_->env, options_.directory); }

Result<std::optional<uint64_t>> Checkpointer::LatestStep() {
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, List());
  for (const CheckpointInfo& info : all)
    if (info.complete) return std::optional<uint64_t>(info.step);
  return std::optional<uint64_t>();
}

Status Checkpointer::CollectGarbage() {
  Env* env = impl_->env;
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, List());
  std::optional<uint64_t> newest_complete;
  uint32_t kept = 0;
  for (const CheckpointInfo& info : all) {  // newest first
    Result<StepState> scanned = ScanStep(env, info.directory, info.step);
    if (scanned.status().IsNotFound() && !env->FileExists(info.directory)) continue;  // another rank's GC
    LL_ASSIGN_OR_RETURN(StepState state, std::move(scanned));
    if (info.complete) {
      if (!newest_complete) newest_complete = info.step;
      if (options_.keep_last == 0 || kept < options_.keep_last) {
        ++kept;
        // Leftovers of other attempts at this step are never read again.
        char world[16];
        std::snprintf(world, sizeof(world), "of-%06u.", info.world_size);
        for (const std::string& name : state.children) {
          const bool ours = name.rfind(state.run_hash + ".", 0) == 0 && name.find(world) != std::string::npos;
          if (!ours && (ParseIndexFileName(name) || (name.size() > 17 && name[16] == '.'))) {
            Status s = env->RemoveFile(JoinPath(info.directory, name));
            if (!s.ok() && !s.IsNotFound()) return s;
          }
        }
        continue;
      }
      LL_RETURN_IF_ERROR(RemoveStep(env, state));
    } else if (newest_complete && info.step < *newest_complete) {
      LL_RETURN_IF_ERROR(RemoveStep(env, state));
    }
  }
  return env->SyncDir(options_.directory);
}

}  // namespace lifeline
