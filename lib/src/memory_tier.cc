#include "lib/src/memory_tier.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "formats/checksum.h"
#include "lib/src/checkpoint_layout.h"
#include "lib/src/checkpoint_reader.h"
#include "lib/src/commit.h"

namespace lifeline {
namespace {

// The per-user directory must be ours alone: snapshots are the job's weights.
Status CheckPrivateDir(const std::string& dir) {
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, dir);
  if (!S_ISDIR(st.st_mode)) return Status::FailedPrecondition(dir, "memory tier path is not a directory");
  if (st.st_uid != geteuid())
    return Status::FailedPrecondition(dir, "memory tier directory belongs to another user (uid " + std::to_string(st.st_uid) + ")");
  if ((st.st_mode & 077) != 0 && chmod(dir.c_str(), 0700) != 0) return Status::FromErrno(errno, dir + ": chmod 0700");
  return Status::OK();
}

Status MakePrivateDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, dir);
  return CheckPrivateDir(dir);
}

std::string SlotPrefix(std::string_view run_hash, uint32_t rank, uint32_t world_size) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), ".r%06u-of-%06u.slot", rank, world_size);
  return std::string(run_hash) + buf;
}

}  // namespace

std::string DefaultMemoryTierRoot(const std::string& checkpoint_dir) {
  char resolved[PATH_MAX];
  const std::string real = realpath(checkpoint_dir.c_str(), resolved) != nullptr ? resolved : checkpoint_dir;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(format::Checksum64(real)));
  return "/dev/shm/lifeline-" + std::to_string(geteuid()) + "/" + hex;
}

MemoryTier::MemoryTier(std::string root, std::string run_hash, uint32_t rank, uint32_t world_size, unsigned slots)
    : env_(Env::Default()), root_(std::move(root)), run_hash_(std::move(run_hash)), rank_(rank),
      world_size_(world_size), slots_(slots) {}

Result<std::unique_ptr<MemoryTier>> MemoryTier::Open(std::string root, const std::string& checkpoint_dir,
                                                     std::string run_hash, uint32_t rank, uint32_t world_size,
                                                     unsigned slots) {
  if (root.empty()) {
    root = DefaultMemoryTierRoot(checkpoint_dir);
    const std::string user_dir = root.substr(0, root.rfind('/'));
    LL_RETURN_IF_ERROR(MakePrivateDir(user_dir).Annotate("memory tier"));
  } else {
    LL_RETURN_IF_ERROR(Env::Default()->CreateDir(root).Annotate("memory tier"));
  }
  LL_RETURN_IF_ERROR(MakePrivateDir(root).Annotate("memory tier"));
  LL_RETURN_IF_ERROR(MakePrivateDir(JoinPath(root, "slots")).Annotate("memory tier"));
  std::unique_ptr<MemoryTier> tier(new MemoryTier(std::move(root), std::move(run_hash), rank, world_size, slots));
  LL_RETURN_IF_ERROR(tier->RemoveStaleSlots());
  return tier;
}

std::string MemoryTier::SlotPath(unsigned k) const {
  return JoinPath(JoinPath(root_, "slots"), SlotPrefix(run_hash_, rank_, world_size_) + std::to_string(k));
}

Status MemoryTier::RemoveStaleSlots() {
  const std::string dir = JoinPath(root_, "slots");
  LL_ASSIGN_OR_RETURN(std::vector<std::string> names, env_->GetChildren(dir));
  for (const std::string& name : names) {
    if (name.size() > run_hash_.size() && name.compare(0, run_hash_.size(), run_hash_) == 0 && name[run_hash_.size()] == '.')
      continue;  // this attempt's
    Status s = env_->RemoveFile(JoinPath(dir, name));
    if (!s.ok() && !s.IsNotFound()) return s;
  }
  return Status::OK();
}

Status MemoryTier::Withdraw(uint64_t step) {
  const std::string step_dir = JoinPath(root_, StepDirName(step));
  for (const std::string& name : {IndexFileName(run_hash_, rank_, world_size_), DataFileName(run_hash_, rank_, world_size_)}) {
    Status s = env_->RemoveFile(JoinPath(step_dir, name));
    if (!s.ok() && !s.IsNotFound()) return s;
  }
  // The last rank to leave removes what is left (the manifest).
  Result<std::vector<std::string>> left = env_->GetChildren(step_dir);
  if (!left.ok()) return left.status().IsNotFound() ? Status::OK() : left.status();
  for (const std::string& name : *left)
    if (ParseIndexFileName(name) || name.find(".data") != std::string::npos) return Status::OK();
  return RemoveDirRecursively(env_, step_dir);
}

Status MemoryTier::Publish(uint64_t step, unsigned slot, std::string_view encoded_index) {
  LL_ASSIGN_OR_RETURN(std::string step_dir, PrepareStepDir(env_, root_, step, run_hash_, rank_, world_size_));
  const std::string data = JoinPath(step_dir, DataFileName(run_hash_, rank_, world_size_));
  Status s = env_->RemoveFile(data);
  if (!s.ok() && !s.IsNotFound()) return s;
  if (link(SlotPath(slot).c_str(), data.c_str()) != 0) return Status::FromErrno(errno, "linking " + data);
  return PublishRankIndex(env_, root_, step, run_hash_, rank_, world_size_, encoded_index, /*retention=*/true, slots_)
      .status();
}

void MemoryTier::RemoveSlotFiles() {
  for (unsigned k = 0; k < slots_; ++k) env_->RemoveFile(SlotPath(k)).IgnoreError();
}

Result<std::vector<CheckpointInfo>> MemoryTier::List() const { return ScanCheckpoints(env_, root_); }

}  // namespace lifeline
