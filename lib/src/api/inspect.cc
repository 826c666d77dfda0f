// lifeline/inspect.h over the library's reader (manifest), scanner, commit rules (retention) and
// the memory tier's naming.
#include "lifeline/inspect.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "formats/codec.h"
#include "formats/geometry.h"
#include "formats/model.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/commit.h"
#include "lib/src/tier/memory_tier.h"
#include "lib/src/store/save_lock.h"
#include "lifeline/internal/replication_record.h"

namespace lifeline {
namespace {


uint64_t StoredLength(const format::CheckpointIndex& m, const format::FragmentInfo& f) {
  uint64_t n = 0;
  for (uint64_t c = f.first_chunk; c < f.first_chunk + f.num_chunks && c < m.chunks.size(); ++c) {
    n += m.chunks[c].stored_length;
  }
  return n;
}

RetentionPolicy PolicyFor(Env* env, const std::string& root, const RetentionOptions& options) {
  RetentionPolicy policy;
  policy.keep_last = options.keep_last;
  if (options.verify) {
    policy.loadable = [env, root](const CheckpointInfo& info) -> Status {
      LL_ASSIGN_OR_RETURN(VerifyResult v, VerifyCheckpoint(root, info.step, env));
      return v.status;
    };
  } else {
    policy.loadable = [env](const CheckpointInfo& info) { return CheckStepMetadata(env, info); };
  }
  if (options.remove_partial) {
    policy.stale = [](const CheckpointInfo&) { return true; };
  } else if (!options.saving_run_id.empty()) {
    policy.stale = SaverRetention(env, options.keep_last, RunHash(options.saving_run_id)).stale;
  }
  return policy;
}

}  // namespace

std::string ShapeText(const std::vector<int64_t>& shape) { return format::ShapeString(shape); }

uint64_t CheckpointDescription::tensor_bytes() const {
  uint64_t n = 0;
  for (const TensorDescription& t : tensors) n += t.bytes;
  return n;
}

uint64_t CheckpointDescription::stored_bytes() const {
  uint64_t n = 0;
  for (const TensorDescription& t : tensors) n += t.stored_bytes;
  return n;
}

Result<CheckpointDescription> DescribeCheckpoint(const std::string& root, std::optional<uint64_t> step, Env* env) {
  LL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(Env::OrDefault(env), root, step));
  const format::CheckpointIndex& m = reader->manifest();
  CheckpointDescription d;
  d.step = m.step;
  d.directory = reader->step_dir();
  d.run_id = m.run_id;
  d.world_size = m.world_size;
  d.chunk_bytes = m.chunk_bytes;
  d.created_unix_ns = m.created_unix_ns;
  d.metadata_json = m.metadata_json;
  d.chunks = m.chunks.size();
  d.tensors.reserve(m.tensors.size());
  for (const format::TensorInfo& t : m.tensors) d.tensors.push_back({t.name, t.dtype, t.shape});
  d.fragments.reserve(m.fragments.size());
  for (const format::FragmentInfo& f : m.fragments) {
    const uint64_t stored = StoredLength(m, f);
    // The reader validated the indexes on open; out-of-range names are still shown, not trusted.
    if (f.tensor < d.tensors.size()) {
      TensorDescription& t = d.tensors[f.tensor];
      ++t.fragments;
      t.bytes += static_cast<uint64_t>(f.region.num_elements()) * DTypeSize(t.dtype);
      t.stored_bytes += stored;
    }
    d.fragments.push_back({f.tensor < m.tensors.size() ? m.tensors[f.tensor].name : "?",
                           f.file < m.files.size() ? m.files[f.file].name : "?", f.offset, stored, f.num_chunks,
                           format::CodecName(f.codec), f.region.offsets, f.region.shape, f.region.flat_begin,
                           f.region.flat_end});
  }
  for (const format::ObjectInfo& o : m.objects) d.objects.push_back({o.name, o.rank, o.length});
  for (const format::FileInfo& f : m.files) d.files.push_back({f.name, f.rank, f.size});
  return d;
}

CheckpointState CheckpointStateOf(const CheckpointInfo& info) {
  if (info.complete) return info.suspect ? CheckpointState::kSuspect : CheckpointState::kComplete;
  if (info.invalid) return CheckpointState::kInvalid;
  const bool damaged = info.problem.rfind("damaged", 0) == 0 || info.problem.rfind("cannot be loaded", 0) == 0;
  return damaged ? CheckpointState::kDamaged : CheckpointState::kPartial;
}

const char* CheckpointStateName(CheckpointState state) {
  switch (state) {
    case CheckpointState::kComplete: return "complete";
    case CheckpointState::kPartial: return "partial";
    case CheckpointState::kInvalid: return "invalid";
    case CheckpointState::kDamaged: return "damaged";
    case CheckpointState::kSuspect: return "suspect";
  }
  return "?";
}

Result<CheckpointListing> ListCheckpoints(const std::string& dir, Env* env) {
  env = Env::OrDefault(env);
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> disk, ScanCheckpoints(env, dir));
  CheckpointListing listing;
  for (CheckpointInfo& c : disk) listing.checkpoints.push_back({std::move(c), false});
  if (Result<std::string> root = FindMemoryTierRoot(env, dir); root.ok()) {
    listing.memory_tier = *root;
    if (Result<std::vector<CheckpointInfo>> tier = ListTierSteps(env, dir, *root); tier.ok()) {
      for (CheckpointInfo& c : *tier) listing.checkpoints.push_back({std::move(c), true});
    }
  }
  std::stable_sort(listing.checkpoints.begin(), listing.checkpoints.end(),
                   [](const ListedCheckpoint& x, const ListedCheckpoint& y) { return x.info.step > y.info.step; });
  for (ListedCheckpoint& l : listing.checkpoints) {
    if (!l.info.complete || l.info.suspect) continue;  // a suspect step is listed as such
    if (Status s = CheckStepMetadata(env, l.info); !s.ok()) {
      l.info.complete = false;
      l.info.problem = "damaged: " + s.ToString();
    }
  }
  // The agents' records are informative: when they cannot be read, the listing still stands.
  const std::vector<ReplicationRecord> records =
      ReadReplicationRecords(env, dir).value_or(std::vector<ReplicationRecord>{});
  for (ListedCheckpoint& l : listing.checkpoints)
    l.replicated_ranks = ReplicatedRanks(records, l.info.step, l.info.world_size);
  return listing;
}

Result<std::optional<std::string>> DescribeSavingLaunch(const std::string& dir, Env* env) {
  LL_ASSIGN_OR_RETURN(std::optional<SaveLockHolder> holder, FindSaveLockHolder(Env::OrDefault(env), dir));
  if (!holder) return std::optional<std::string>();
  return std::optional<std::string>(holder->Describe());
}

Status CheckNoOtherJobSaving(const std::string& dir, const std::string& job, Env* env) {
  LL_ASSIGN_OR_RETURN(std::optional<SaveLockHolder> holder, FindSaveLockHolder(Env::OrDefault(env), dir));
  if (!holder || holder->job == job) return Status::OK();
  return DirectoryInUse(dir, *holder);
}

Result<std::vector<RetentionDecision>> PlanRetention(const std::string& root, const RetentionOptions& options,
                                                     Env* env) {
  env = Env::OrDefault(env);
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(env, root));
  const std::vector<bool> remove = RetentionPlan(all, PolicyFor(env, root, options));
  std::vector<RetentionDecision> plan;
  plan.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i) plan.push_back({std::move(all[i]), remove[i]});
  return plan;
}

Status ApplyRetention(const std::string& root, const RetentionOptions& options, Env* env) {
  env = Env::OrDefault(env);
  if (options.remove_partial && !options.even_while_saving) {
    LL_ASSIGN_OR_RETURN(std::optional<SaveLockHolder> holder, FindSaveLockHolder(env, root));
    if (holder && (options.saving_run_id.empty() || holder->run_id != options.saving_run_id))
      return Status::FailedPrecondition(root, "is being saved into by " + holder->Describe() +
                                                  ": its partial steps are saves in progress, which removing them "
                                                  "would fail or publish damaged; wait for that job to end (or "
                                                  "force it: `lifeline gc --partial --force`)");
  }
  return CollectGarbageIn(env, root, PolicyFor(env, root, options));
}

Result<std::vector<uint64_t>> RemoveStepsAfter(const std::string& root, std::optional<uint64_t> step, Env* env) {
  std::vector<uint64_t> removed;
  LL_RETURN_IF_ERROR(RemoveStepsAfterIn(Env::OrDefault(env), root, step, &removed));
  return removed;
}

}  // namespace lifeline
