#include "lib/src/save/staging_arena.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace lifeline {
namespace {
constexpr uint64_t kSlotGranule = 2ull << 20;  // a huge page: the kernel may back slots with THP
}

StagingSlot::~StagingSlot() { Release(/*unlink_file=*/false); }

void StagingSlot::Release(bool unlink_file) {
  region_.Reset();
  fd_ = OwnedFd();
  if (unlink_file && !shm_path_.empty()) unlink(shm_path_.c_str());
}

Status StagingSlot::Reserve(uint64_t bytes) {
  if (bytes <= capacity() && region_.mapped()) return Status::OK();
  const uint64_t want = (std::max<uint64_t>(bytes, 1) + kSlotGranule - 1) / kSlotGranule * kSlotGranule;
  region_.Reset();
  if (shm_path_.empty()) {
    LL_ASSIGN_OR_RETURN(region_, MappedRegion::Anonymous(want, /*huge_pages=*/true));
    return Status::OK();
  }
  if (fd_.get() < 0) {
    LL_ASSIGN_OR_RETURN(fd_, OpenSharedFile(shm_path_, CreateMode::kOpenOrCreate));
  }
  Status sized = SizeSharedFile(fd_.get(), want, /*reserve=*/true, shm_path_);
  if (sized.code() == StatusCode::kResourceExhausted)
    return Status::ResourceExhausted(shm_path_, "shared memory is full (" + std::to_string(want) +
                                                    " bytes needed for a snapshot slot)");
  LL_RETURN_IF_ERROR(sized);
  LL_ASSIGN_OR_RETURN(region_, MappedRegion::MapFile(fd_.get(), want, /*writable=*/true, shm_path_));
  return Status::OK();
}

// The slot holds no snapshot the caller still needs, except a memory-tier file whose bytes the
// region keeps when it faults pages in.
void StagingSlot::Prefault() { region_.Prefault(); }

StagingArena::StagingArena(unsigned slots, uint64_t budget_bytes, std::vector<std::string> shm_paths)
    : slot_limit_(budget_bytes / std::max(1u, slots) / 4096 * 4096) {
  slots = std::max(1u, slots);
  for (unsigned i = 0; i < slots; ++i) slots_.push_back(std::make_unique<StagingSlot>(i < shm_paths.size() ? shm_paths[i] : ""));
  busy_.assign(slots, false);
  step_.assign(slots, std::nullopt);
  last_use_.assign(slots, 0);
}

StagingArena::~StagingArena() = default;

std::optional<unsigned> StagingArena::Acquire(bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::optional<unsigned> best;
    for (unsigned i = 0; i < slots_.size(); ++i)
      if (!busy_[i] && (!best || last_use_[i] < last_use_[*best])) best = i;
    if (best) {
      busy_[*best] = true;
      last_use_[*best] = ++uses_;
      step_[*best].reset();
      return best;
    }
    if (!wait) return std::nullopt;
    released_.wait(lock);
  }
}

void StagingArena::Release(unsigned slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_[slot] = false;
  }
  released_.notify_all();
}

void StagingArena::SetStep(unsigned slot, uint64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  step_[slot] = step;
}

std::optional<uint64_t> StagingArena::StepOf(unsigned slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  return step_[slot];
}

std::optional<uint64_t> StagingArena::OldestBusyStep() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<uint64_t> oldest;
  for (unsigned i = 0; i < slots_.size(); ++i)
    if (busy_[i] && step_[i] && (!oldest || *step_[i] < *oldest)) oldest = step_[i];
  return oldest;
}

Status StagingArena::Reserve(unsigned i, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes <= slots_[i]->capacity() && slots_[i]->data() != nullptr) return Status::OK();
  ++generation_;
  return slots_[i]->Reserve(bytes);
}

Status StagingArena::Prepare(uint64_t bytes) {
  for (unsigned i = 0; i < slots_.size(); ++i) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      released_.wait(lock, [&] { return !busy_[i]; });
      busy_[i] = true;
      if (bytes > slots_[i]->capacity() || slots_[i]->data() == nullptr) ++generation_;
    }
    Status s = slots_[i]->Reserve(bytes);
    if (s.ok()) slots_[i]->Prefault();
    Release(i);
    LL_RETURN_IF_ERROR(s);
  }
  return Status::OK();
}

void StagingArena::ReleaseAll(bool unlink_files) {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  for (auto& s : slots_) s->Release(unlink_files);
}

std::vector<std::pair<void*, size_t>> StagingArena::Regions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<void*, size_t>> out;
  for (const auto& s : slots_)
    if (s->data() != nullptr) out.emplace_back(s->data(), s->capacity());
  return out;
}

uint64_t StagingArena::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

}  // namespace lifeline
