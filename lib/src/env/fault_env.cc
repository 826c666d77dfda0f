// FaultInjectionEnv: fails writes (ENOSPC), syncs and renames on demand.
#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>

#include "lifeline/env.h"

namespace lifeline {

struct FaultInjectionEnv::State {
  std::atomic<bool> fail_syncs{false};
  std::atomic<bool> fail_renames{false};

  // Decides whether a write of n bytes to `path` may go ahead, charging the budget if it does.
  // A write that does not fit fails whole, so no file is left with a torn write the caller
  // was told failed.
  bool ChargeWrite(const std::string& path, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    if (byte_budget < 0 || !MatchesLocked(path)) return true;
    if (static_cast<uint64_t>(n) > static_cast<uint64_t>(byte_budget)) return false;
    byte_budget -= static_cast<int64_t>(n);
    return true;
  }

  bool Matches(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu);
    return MatchesLocked(path);
  }

  bool MatchesLocked(const std::string& path) const {
    return restrict_to.empty() || path.find(restrict_to) != std::string::npos;
  }

  std::mutex mu;
  int64_t byte_budget = -1;  // GUARDED_BY(mu); negative: unlimited
  std::string restrict_to;   // GUARDED_BY(mu)
};

namespace {

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(std::unique_ptr<WritableFile> target, std::shared_ptr<FaultInjectionEnv::State> state)
      : target_(std::move(target)), state_(std::move(state)) {}

  Status WriteAt(uint64_t offset, const void* src, size_t n) override {
    if (!state_->ChargeWrite(path(), n)) return Status::FromErrno(ENOSPC, path());
    return target_->WriteAt(offset, src, n);
  }
  Status Truncate(uint64_t size) override { return target_->Truncate(size); }
  Status Allocate(uint64_t size) override { return target_->Allocate(size); }
  Status Sync() override {
    if (state_->fail_syncs.load() && state_->Matches(path())) {
      return Status::FromErrno(EIO, path() + " (injected fsync failure)");
    }
    return target_->Sync();
  }
  Status Close() override { return target_->Close(); }
  const std::string& path() const override { return target_->path(); }
  bool direct() const override { return target_->direct(); }
  // No descriptor: an io_uring queue must not bypass the injected faults.
  int fd() const override { return -1; }

 private:
  const std::unique_ptr<WritableFile> target_;
  const std::shared_ptr<FaultInjectionEnv::State> state_;
};

}  // namespace

FaultInjectionEnv::FaultInjectionEnv(Env* target) : EnvWrapper(target), state_(std::make_shared<State>()) {}

FaultInjectionEnv::~FaultInjectionEnv() = default;

void FaultInjectionEnv::FailWritesAfterBytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->byte_budget = bytes < 0 ? -1 : bytes;
}

void FaultInjectionEnv::FailSyncs(bool fail) { state_->fail_syncs.store(fail); }

void FaultInjectionEnv::FailRenames(bool fail) { state_->fail_renames.store(fail); }

void FaultInjectionEnv::RestrictToPathsContaining(std::string substring) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->restrict_to = std::move(substring);
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path,
                                                                         const FileOptions& options) {
  LL_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, target()->NewWritableFile(path, options));
  return std::unique_ptr<WritableFile>(new FaultWritableFile(std::move(file), state_));
}

Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  if (state_->fail_renames.load() && (state_->Matches(from) || state_->Matches(to))) {
    return Status::FromErrno(EIO, from + " -> " + to + " (injected rename failure)");
  }
  return target()->RenameFile(from, to);
}

Status FaultInjectionEnv::RenameFileNoReplace(const std::string& from, const std::string& to) {
  if (state_->fail_renames.load() && (state_->Matches(from) || state_->Matches(to))) {
    return Status::FromErrno(EIO, from + " -> " + to + " (injected rename failure)");
  }
  return target()->RenameFileNoReplace(from, to);
}

Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  if (state_->fail_syncs.load() && state_->Matches(dir)) {
    return Status::FromErrno(EIO, dir + " (injected fsync failure)");
  }
  return target()->SyncDir(dir);
}

Result<std::unique_ptr<IoQueue>> FaultInjectionEnv::NewIoQueue(const IoQueueOptions& options) {
  return NewThreadPoolIoQueue(options);
}

}  // namespace lifeline
