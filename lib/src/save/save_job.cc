#include "lib/src/save/save_job.h"

#include <algorithm>

#include "formats/checksum.h"
#include "lib/src/save/commit.h"
#include "lib/src/save/replica_digest.h"
#include "lifeline/trace.h"

namespace lifeline {

const char* SavePhaseName(SavePhase phase) {
  switch (phase) {
    case SavePhase::kCopying: return "copying";
    case SavePhase::kPersisting: return "persisting";
    case SavePhase::kPersisted: return "persisted";
    case SavePhase::kCommitted: return "committed";
    case SavePhase::kFailed: return "failed";
    case SavePhase::kSkipped: return "skipped";
  }
  return "unknown";
}

uint64_t DefaultChunkBytes(SaveCodec codec) { return codec == SaveCodec::kNone ? uint64_t{256} << 10 : uint64_t{4} << 20; }

const char* SaveCodecName(SaveCodec codec) {
  switch (codec) {
    case SaveCodec::kNone: return "none";
    case SaveCodec::kZstd: return "zstd";
    case SaveCodec::kZstdByteGroup: return "zstd-bytegroup";
  }
  return "unknown";
}

Result<SaveCodec> ParseSaveCodec(std::string_view name) {
  if (name.empty() || name == "none") return SaveCodec::kNone;
  if (name == "zstd") return SaveCodec::kZstd;
  if (name == "zstd-bytegroup" || name == "zstd_bytegroup" || name == "bytegroup") return SaveCodec::kZstdByteGroup;
  return Status::InvalidArgument("codec '" + std::string(name) + "'", "is not none, zstd or zstd-bytegroup");
}

namespace internal {

format::Codec StoredCodec(SaveCodec codec) {
  switch (codec) {
    case SaveCodec::kNone: return format::Codec::kNone;
    case SaveCodec::kZstd: return format::Codec::kZstd;
    case SaveCodec::kZstdByteGroup: return format::Codec::kZstdByteGroup;
  }
  return format::Codec::kNone;
}

void PlanPieces(SaveJob& job, const SaveRequest& request, std::shared_ptr<const std::vector<CopyPiece>> fragment_pieces) {
  const RankSavePlan& plan = *job.plan;
  const uint64_t chunk = job.write_options.chunk_bytes;
  const bool reused = fragment_pieces != nullptr;
  job.shared_pieces = std::move(fragment_pieces);
  job.pieces.reserve((reused ? 0 : job.index.chunks.size()) + job.objects.size());
  auto piece_of = [&](size_t i, uint64_t k) {  // chunk k of fragment i
    const PlannedFragment& pf = plan.fragments[i];
    const format::FragmentInfo& f = job.index.fragments[i];
    CopyPiece p;
    if (pf.strided()) {
      p.source = pf.source;
      p.source_stride = pf.source_stride;
      p.run_bytes = pf.run_bytes;
      p.source_offset = k * chunk;
    } else {
      p.source = pf.source + k * chunk;
    }
    p.image_offset = job.layout.fragment_offset[i] + k * chunk;
    p.length = job.index.chunks[f.first_chunk + k].stored_length;
    p.target = f.first_chunk + k;
    p.request_tensor = pf.request_index;
    p.device = request.tensors[pf.request_index].device >= 0;
    return p;
  };
  // Column blocks side by side in one shard (save_plan.h: consecutive fragments of one request
  // tensor, same stride and width, each starting where the previous one's columns end) make a band.
  auto same_band = [&](size_t a, size_t b) {
    const PlannedFragment &x = plan.fragments[a], &y = plan.fragments[b];
    return x.strided() && y.strided() && x.request_index == y.request_index && x.source_stride == y.source_stride &&
           x.run_bytes == y.run_bytes && y.source == x.source + x.run_bytes * (b - a) &&
           job.index.fragments[a].num_chunks == job.index.fragments[b].num_chunks;
  };
  for (size_t i = 0; !reused && i < plan.fragments.size();) {
    size_t end = i + 1;
    while (end < plan.fragments.size() && end - i < kMaxBandPieces && same_band(i, end)) ++end;
    const uint64_t chunks = job.index.fragments[i].num_chunks;
    for (uint64_t k = 0; k < chunks; ++k) {
      for (size_t j = i; j < end; ++j) {
        CopyPiece p = piece_of(j, k);
        p.band = end - i == 1 ? 1 : j == i ? static_cast<uint32_t>(end - i) : 0;
        job.pieces.push_back(p);
      }
    }
    i = end;
  }
  for (size_t i = 0; i < job.objects.size(); ++i) {
    const std::string& bytes = job.objects[i].second;
    if (bytes.empty()) {
      job.index.objects[i].checksum = format::Checksum64(bytes);
      continue;
    }
    CopyPiece p;
    p.source = reinterpret_cast<const uint8_t*>(bytes.data());
    p.image_offset = job.layout.object_offset[i];
    p.length = bytes.size();
    p.target = i;
    p.object = true;
    job.pieces.push_back(p);
  }
}

// The checkpoint lifecycle for the node agent (nothing happens without one).
void SaveJob::Trace(trace::EventType type, uint64_t aux) const {
  if (!trace::Active()) return;
  trace::Event e;
  e.type = type;
  e.step = step;
  e.bytes = bytes_total;
  e.duration_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - started).count());
  e.aux = aux;
  trace::Record(e);
}

SaveJob::SaveJob(uint64_t step, Env* env, std::string root) : step(step), env(env), root(std::move(root)) {}

void SaveJob::CompleteIndex() {
  std::call_once(index_completed_, [this] {
    if (index_structure == nullptr) return;
    index.tensors = index_structure->tensors;
    index.fragments = index_structure->fragments;
  });
}

void SaveJob::InitCounters(size_t request_tensors, bool streamed) {
  num_tensors_ = request_tensors;
  staged_.store(!streamed);
  tensor_pending_.reset(new std::atomic<uint32_t>[num_tensors_]);
  const uint64_t image_end = layout.bytes;
  num_blocks_ = block_bytes == 0 ? 0 : (image_end + block_bytes - 1) / block_bytes;
  block_pending_.reset(new std::atomic<int64_t>[num_blocks_ + 1]);
  // Counted in plain integers, then stored: nothing reads the counters before Submit.
  std::vector<uint32_t> per_tensor(num_tensors_, 0);
  std::vector<int64_t> per_block(num_blocks_ + 1, 0);
  bool bands = false;
  for (size_t i = 0, n = num_pieces(); i < n; ++i) {
    const CopyPiece& p = piece(i);
    bands = bands || p.band != 1;
    if (!p.object) ++per_tensor[p.request_tensor];
    if (p.verify) continue;  // in no block
    for (uint64_t at = p.image_offset, end = p.image_offset + p.length; at < end;) {
      const uint64_t b = at / block_bytes, stop = std::min(end, (b + 1) * block_bytes);
      per_block[b] += static_cast<int64_t>(stop - at);
      at = stop;
    }
  }
  band_starts_.clear();  // without bands, every piece is claimed alone, by its index
  for (size_t i = 0, n = bands ? num_pieces() : 0; i < n; ++i)
    if (piece(i).band != 0) band_starts_.push_back(i);
  for (size_t i = 0; i < num_tensors_; ++i)
    tensor_pending_[i].store((streamed ? 1 : 0) + per_tensor[i], std::memory_order_relaxed);
  for (size_t b = 0; b <= num_blocks_; ++b) block_pending_[b].store(per_block[b], std::memory_order_relaxed);
  pieces_left_.store(num_pieces(), std::memory_order_release);
}

void SaveJob::SetReplicaDigests(std::shared_ptr<const ReplicaDigestPlan> plan, bool report) {
  replica_plan_ = std::move(plan);
  verify_pieces_ = &replica_plan_->verify_pieces;
  num_verify_ = verify_pieces_->size();
  verify_hashes_.assign(num_verify_, 0);
  report_digests_ = report;
}

std::vector<uint64_t> SaveJob::replica_digests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return replica_digests_;
}

void SaveJob::FinishReplicaDigests() {
  const ReplicaDigestPlan& plan = *replica_plan_;
  std::vector<uint64_t> digests;
  digests.reserve(plan.shards.size());
  for (const ReplicaShardDigest& shard : plan.shards) digests.push_back(ShardDigest(shard, index.chunks, verify_hashes_));
  if (report_digests_ && trace::Active()) {
    if (!plan.names_sent.load(std::memory_order_acquire)) {
      bool all = true;
      for (const ReplicaShardDigest& shard : plan.shards) all = trace::ReportReplicaName(shard.key, shard.name) && all;
      if (all) plan.names_sent.store(true, std::memory_order_release);
    }
    for (size_t k = 0; k < plan.shards.size(); ++k) {
      const ReplicaShardDigest& shard = plan.shards[k];
      trace::ReportReplicaDigest(step, shard.key, shard.replica_count, shard.bytes, shard.tensor_offset, digests[k]);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  replica_digests_ = std::move(digests);
}

void SaveJob::PieceDone(size_t i, uint64_t checksum) {
  const CopyPiece& p = piece(i);
  if (p.verify) {
    if (!cancelled()) verify_hashes_[p.target] = checksum;
    if (tensor_pending_[p.request_tensor].fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
    if (pieces_left_.fetch_sub(1, std::memory_order_acq_rel) == 1) CompleteCopy();
    return;
  }
  if (!cancelled()) {
    // Each slot is written by one thread only, before the release below publishes it.
    if (p.object) {
      index.objects[p.target].checksum = checksum;
    } else {
      index.chunks[p.target].checksum = checksum;
    }
    bytes_copied_.fetch_add(p.length, std::memory_order_relaxed);
  }
  bool wake = false;
  if (!p.object && tensor_pending_[p.request_tensor].fetch_sub(1, std::memory_order_acq_rel) == 1) wake = true;
  for (uint64_t at = p.image_offset, end = p.image_offset + p.length; at < end;) {
    const uint64_t b = at / block_bytes, stop = std::min(end, (b + 1) * block_bytes);
    const int64_t n = static_cast<int64_t>(stop - at);
    if (block_pending_[b].fetch_sub(n, std::memory_order_acq_rel) == n) wake = true;
    at = stop;
  }
  if (pieces_left_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    CompleteCopy();
  } else if (wake) {
    std::lock_guard<std::mutex> lock(mu_);  // pairs with the waiters' predicate checks
    cv_.notify_all();
  }
}

void SaveJob::CompleteCopy() {
  if (replica_plan_ != nullptr && !cancelled()) FinishReplicaDigests();
  {
    std::lock_guard<std::mutex> lock(mu_);
    copied_ = true;
    copied_at_ = Clock::now();
    if (phase_ == SavePhase::kCopying) phase_ = SavePhase::kPersisting;
  }
  cv_.notify_all();
  if (!cancelled()) Trace(trace::EventType::kCheckpointCopied, stall_ns_.load());
  if (on_copied && !cancelled()) on_copied(*this);
  {
    std::lock_guard<std::mutex> lock(mu_);
    copy_done_ = true;
  }
  cv_.notify_all();
}

void SaveJob::WaitCopyStopped() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return copy_done_; });
}

bool SaveJob::WaitCopiedThrough(uint64_t end) {
  if (end == 0 || block_bytes == 0) return !cancelled();
  const uint64_t last_block = (std::min(end, layout.bytes) + block_bytes - 1) / block_bytes;
  std::unique_lock<std::mutex> lock(mu_);
  for (uint64_t b = 0; b < last_block; ++b) {
    cv_.wait(lock, [&] { return cancelled() || block_pending_[b].load(std::memory_order_acquire) == 0; });
    if (cancelled()) return false;
  }
  return true;
}

void SaveJob::MarkStreamCopied() {
  for (size_t i = 0; i < num_tensors_; ++i) tensor_pending_[i].store(0, std::memory_order_release);
  bytes_copied_.store(bytes_total);
  {
    std::lock_guard<std::mutex> lock(mu_);
    copied_ = copy_done_ = true;
    copied_at_ = Clock::now();
    if (phase_ == SavePhase::kCopying) phase_ = SavePhase::kPersisting;
  }
  cv_.notify_all();
  Trace(trace::EventType::kCheckpointCopied, stall_ns_.load());
}

void SaveJob::MarkPersisted(uint64_t bytes_stored, bool committed) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    persisted_ = true;
    committed_ = committed;
    bytes_stored_ = bytes_stored;
    persisted_at_ = Clock::now();
    if (status_.ok()) phase_ = committed ? SavePhase::kCommitted : SavePhase::kPersisted;
  }
  cv_.notify_all();
  Trace(trace::EventType::kCheckpointPersisted, bytes_stored);
  if (committed) Trace(trace::EventType::kCheckpointCommitted);
}

void SaveJob::Fail(Status status) {
  const auto code = static_cast<uint64_t>(status.code());
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = status_.ok();
    if (status_.ok()) status_ = std::move(status);
    phase_ = SavePhase::kFailed;
    cancelled_.store(true, std::memory_order_release);
    // A streamed job is failed by the thread that was reading the state, once it has stopped.
    if (!staged_.load()) copied_ = copy_done_ = true;
  }
  cv_.notify_all();
  if (first && code != 0) Trace(trace::EventType::kCheckpointFailed, code);
}

void SaveJob::FinishWithoutCopy(Status status, SavePhase phase) {
  const auto code = static_cast<uint64_t>(status.code());
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    phase_ = phase;
    cancelled_.store(true, std::memory_order_release);
    copied_ = copy_done_ = true;
    persisted_ = true;
    copied_at_ = persisted_at_ = Clock::now();
  }
  for (size_t i = 0; i < num_tensors_; ++i) tensor_pending_[i].store(0, std::memory_order_release);
  cv_.notify_all();
  if (code != 0) Trace(trace::EventType::kCheckpointFailed, code);
}

bool SaveJob::BeginPersist() {
  std::lock_guard<std::mutex> lock(mu_);
  if (persist_claimed_) return false;
  persist_claimed_ = true;
  return true;
}

bool SaveJob::Supersede(Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (persist_claimed_ || !copy_done_ || persisted_ || phase_ == SavePhase::kFailed) return false;
    persist_claimed_ = true;
  }
  Fail(std::move(status));
  return true;
}

Status SaveJob::WaitSnapshot() {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return copied_; });
  lock.unlock();
  AddStall(Clock::now() - t0, StallPart::kWait);
  return status();
}

Status SaveJob::WaitTensor(size_t i) {
  if (i >= num_tensors_)
    return Status::InvalidArgument("step " + std::to_string(step), "tensor #" + std::to_string(i) + " is not in the save request");
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return copied_ || tensor_pending_[i].load(std::memory_order_acquire) == 0; });
  lock.unlock();
  AddStall(Clock::now() - t0, StallPart::kWait);
  return status();
}

bool SaveJob::TensorCopied(size_t i) const {
  return i < num_tensors_ && tensor_pending_[i].load(std::memory_order_acquire) == 0;
}

Status SaveJob::WaitPersisted() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return persisted_ || (phase_ == SavePhase::kFailed && copy_done_); });
  return status_;
}

Status SaveJob::WaitCommitted(double timeout_seconds) {
  LL_RETURN_IF_ERROR(WaitPersisted());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (committed_) return Status::OK();
  }
  LL_RETURN_IF_ERROR(WaitForCommitIn(env, root, step, timeout_seconds));
  {
    std::lock_guard<std::mutex> lock(mu_);
    committed_ = true;
    if (status_.ok()) phase_ = SavePhase::kCommitted;
  }
  return Status::OK();
}

Status SaveJob::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

bool SaveJob::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return persisted_ || (phase_ == SavePhase::kFailed && copy_done_);
}

void SaveJob::NoteMemoryTier(std::string why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (memory_tier_note_.empty()) memory_tier_note_ = std::move(why);
}

SaveProgress SaveJob::Progress() const {
  SaveProgress p;
  p.step = step;
  p.bytes_total = bytes_total;
  p.bytes_copied = bytes_copied_.load(std::memory_order_relaxed);
  p.stall_seconds = static_cast<double>(stall_ns_.load()) * 1e-9;
  auto part = [this](StallPart k) { return static_cast<double>(stall_part_ns_[static_cast<size_t>(k)].load()) * 1e-9; };
  p.stall_breakdown.plan_seconds = part(StallPart::kPlan);
  p.stall_breakdown.slot_seconds = part(StallPart::kSlot);
  p.stall_breakdown.stage_seconds = part(StallPart::kStage);
  p.stall_breakdown.submit_seconds = part(StallPart::kSubmit);
  p.stall_breakdown.wait_seconds = part(StallPart::kWait);
  p.staged = staged_.load();
  p.memory_tier = memory_tier_.load();
  std::lock_guard<std::mutex> lock(mu_);
  p.memory_tier_note = memory_tier_note_;
  p.phase = phase_;
  p.status = status_;
  p.bytes_stored = bytes_stored_;
  if (copied_) p.snapshot_seconds = std::chrono::duration<double>(copied_at_ - started).count();
  if (persisted_) p.persist_seconds = std::chrono::duration<double>(persisted_at_ - started).count();
  return p;
}

Status SaveJob::WaitDeviceCopies() {
  std::call_once(device_once_, [this] {
    for (const auto& fence : device_fences) {
      Status s = fence->Synchronize();
      if (!s.ok()) {
        device_status_ = s;
        break;
      }
    }
  });
  return device_status_;
}

}  // namespace internal

// ---- SaveTicket: forwards to the job ----

namespace {
Status NoSave() { return Status::FailedPrecondition("save ticket", "refers to no save"); }
}  // namespace

uint64_t SaveTicket::step() const { return job_ ? job_->step : 0; }
Status SaveTicket::WaitSnapshot() const { return job_ ? job_->WaitSnapshot() : NoSave(); }
Status SaveTicket::WaitTensor(size_t i) const { return job_ ? job_->WaitTensor(i) : NoSave(); }
bool SaveTicket::TensorCopied(size_t i) const { return job_ && job_->TensorCopied(i); }
Status SaveTicket::FenceOn(void* stream) const {
  if (!job_) return NoSave();
  // No fence: no device shard (nothing to order), or a save refused before its copies were
  // queued (its error).
  if (job_->device_fences.empty()) return job_->status();
  for (const auto& fence : job_->device_fences) LL_RETURN_IF_ERROR(fence->OrderStream(stream));
  return Status::OK();
}

Status SaveTicket::WaitPersisted() const { return job_ ? job_->WaitPersisted() : NoSave(); }
Status SaveTicket::WaitCommitted(double timeout_seconds) const {
  return job_ ? job_->WaitCommitted(timeout_seconds) : NoSave();
}
std::vector<SaveTicket::ReplicaDigest> SaveTicket::ReplicaDigests() const {
  std::vector<ReplicaDigest> out;
  if (!job_ || job_->replica_plan() == nullptr) return out;
  const std::vector<uint64_t> digests = job_->replica_digests();
  const auto& shards = job_->replica_plan()->shards;
  for (size_t k = 0; k < digests.size() && k < shards.size(); ++k)
    out.push_back({shards[k].name, shards[k].key, shards[k].replica_count, shards[k].bytes, digests[k]});
  return out;
}

SaveProgress SaveTicket::Progress() const {
  if (!job_) {
    SaveProgress p;
    p.phase = SavePhase::kFailed;
    p.status = NoSave();
    return p;
  }
  return job_->Progress();
}

}  // namespace lifeline
