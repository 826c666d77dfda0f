#include "lib/src/tier/memory_tier.h"

#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <utility>

#include "formats/checksum.h"
#include "lib/src/env/s3_url.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/checkpoint_writer.h"
#include "lib/src/save/commit.h"
#include "lifeline/inspect.h"
#include "lifeline/log.h"

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

constexpr char kDirIdFile[] = "lifeline.id";
constexpr char kOwnerFile[] = "owner";  // in a tier root: "<real path>\n<dir id>\n"

std::string RealPath(const std::string& path) {
  if (IsObjectStorePath(path)) {  // no links there: one spelling per prefix (no trailing slash)
    Result<S3Location> loc = ParseS3Path(path);
    return loc.ok() ? loc->ToString() : path;
  }
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

bool IsDirId(std::string_view id) {
  if (id.size() != 32) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

Result<std::string> NewDirId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "getrandom");
    }
    got += static_cast<size_t>(n);
  }
  std::string id;
  for (unsigned char b : bytes) {
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", b);
    id += hex;
  }
  return id;
}

Result<std::string> ReadDirId(Env* env, const std::string& path) {
  LL_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, path, 64));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (!IsDirId(text))
    return Status::Corruption(path, "not a checkpoint directory identity (32 lowercase hex digits); remove the file "
                                    "to give the directory a new one (its memory-tier snapshots are then ignored)");
  return text;
}

// Removes tier roots of an earlier directory at the same path: their owner file names the path
// with another identity. Best effort; another user's or malformed entries are left alone.
void RemoveOrphanRoots(const std::string& user_dir, const std::string& keep, const std::string& real_path,
                       const std::string& dir_id) {
  Env* env = Env::Default();
  Result<std::vector<std::string>> names = env->GetChildren(user_dir);
  if (!names.ok()) return;
  for (const std::string& name : *names) {
    const std::string root = JoinPath(user_dir, name);
    if (root == keep) continue;
    Result<std::string> owner = ReadFileToString(env, JoinPath(root, kOwnerFile), PATH_MAX + 64);
    if (!owner.ok()) continue;
    const size_t nl = owner->find('\n');
    if (nl == std::string::npos || owner->substr(0, nl) != real_path) continue;
    std::string other_id = owner->substr(nl + 1);
    while (!other_id.empty() && other_id.back() == '\n') other_id.pop_back();
    if (other_id == dir_id) continue;
    env->RemoveTree(root).IgnoreError();
  }
}

std::string SlotPrefix(std::string_view run_hash, uint32_t rank, uint32_t world_size) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), ".r%06u-of-%06u.slot", rank, world_size);
  return std::string(run_hash) + buf;
}

}  // namespace

Result<std::string> CheckpointDirectoryId(Env* env, const std::string& checkpoint_dir, bool create) {
  const std::string path = JoinPath(checkpoint_dir, kDirIdFile);
  if (env->FileExists(path) || !create) return ReadDirId(env, path);
  LL_ASSIGN_OR_RETURN(std::string id, NewDirId());
  Status s = WriteFileAtomically(env, path, id + "\n", /*replace=*/false);
  if (s.IsAlreadyExists()) return ReadDirId(env, path);  // another rank was first: use its identity
  if (!s.ok()) return s.Annotate("creating the checkpoint directory's identity");
  return id;
}

Result<std::string> MemoryTierFileSystem() {
  const char* set = std::getenv(kMemoryTierDirVariable);
  if (set == nullptr || *set == '\0') return std::string("/dev/shm");
  std::string dir(set);
  if (dir[0] != '/')
    return Status::InvalidArgument(std::string(kMemoryTierDirVariable) + "='" + dir + "'",
                                   "must be an absolute path (every process of the node must find the same tier)");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

Result<std::string> DefaultMemoryTierRoot(const std::string& checkpoint_dir, std::string_view dir_id) {
  LL_ASSIGN_OR_RETURN(std::string base, MemoryTierFileSystem());
  std::string key = RealPath(checkpoint_dir);
  key.push_back('\0');
  key.append(dir_id);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(format::Checksum64(key)));
  return JoinPath(base, "lifeline-" + std::to_string(geteuid())) + "/" + hex;
}

Result<std::string> FindMemoryTierRoot(Env* env, const std::string& checkpoint_dir) {
  LL_ASSIGN_OR_RETURN(std::string id, CheckpointDirectoryId(env, checkpoint_dir, /*create=*/false));
  LL_ASSIGN_OR_RETURN(std::string root, DefaultMemoryTierRoot(checkpoint_dir, id));
  if (!Env::Default()->IsDirectory(root)) return Status::NotFound(root, "no memory tier on this node");
  return root;
}

MemoryTier::MemoryTier(std::string root, bool default_root, std::string run_hash, uint32_t rank, uint32_t world_size,
                       unsigned slots)
    : env_(Env::Default()), root_(std::move(root)), default_root_(default_root), run_hash_(std::move(run_hash)), rank_(rank),
      world_size_(world_size), slots_(slots) {}

Result<std::string> MemoryTierUserDir() {
  LL_ASSIGN_OR_RETURN(std::string base, MemoryTierFileSystem());
  // The file system's directory itself (/dev/shm or the variable's) is created when missing and
  // otherwise left as it is; only our per-user directory below it is made private.
  LL_RETURN_IF_ERROR(Env::Default()->CreateDir(base).Annotate("memory tier"));
  const std::string user_dir = JoinPath(base, "lifeline-" + std::to_string(geteuid()));
  LL_RETURN_IF_ERROR(MakePrivateDir(user_dir).Annotate("memory tier"));
  return user_dir;
}

Result<std::string> CreateDefaultMemoryTierRoot(const std::string& checkpoint_dir, const std::string& dir_id) {
  LL_ASSIGN_OR_RETURN(std::string root, DefaultMemoryTierRoot(checkpoint_dir, dir_id));
  LL_ASSIGN_OR_RETURN(std::string user_dir, MemoryTierUserDir());
  LL_RETURN_IF_ERROR(MakePrivateDir(root).Annotate("memory tier"));
  const std::string real_path = RealPath(checkpoint_dir);
  const std::string owner = JoinPath(root, kOwnerFile);
  if (!Env::Default()->FileExists(owner))
    LL_RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), owner, real_path + "\n" + dir_id + "\n").Annotate("memory tier"));
  RemoveOrphanRoots(user_dir, root, real_path, dir_id);
  return root;
}

Result<std::unique_ptr<MemoryTier>> MemoryTier::Open(std::string root, const std::string& checkpoint_dir,
                                                     const std::string& dir_id, std::string run_hash, uint32_t rank,
                                                     uint32_t world_size, unsigned slots) {
  const bool default_root = root.empty();
  if (default_root) {
    LL_ASSIGN_OR_RETURN(root, CreateDefaultMemoryTierRoot(checkpoint_dir, dir_id));
  } else {
    LL_RETURN_IF_ERROR(Env::Default()->CreateDir(root).Annotate("memory tier"));
  }
  LL_RETURN_IF_ERROR(MakePrivateDir(root).Annotate("memory tier"));
  LL_RETURN_IF_ERROR(MakePrivateDir(JoinPath(root, "slots")).Annotate("memory tier"));
  std::unique_ptr<MemoryTier> tier(
      new MemoryTier(std::move(root), default_root, std::move(run_hash), rank, world_size, slots));
  LL_RETURN_IF_ERROR(tier->RemoveStaleSlots());
  return tier;
}

Result<std::unique_ptr<MemoryTier>> MemoryTier::OpenFor(Env* env, std::string root, const std::string& checkpoint_dir,
                                                        std::string run_hash, uint32_t rank, uint32_t world_size,
                                                        unsigned slots) {
  std::string dir_id;
  if (root.empty()) {
    Result<std::string> id = CheckpointDirectoryId(env, checkpoint_dir, /*create=*/true);
    if (!id.ok() && id.status().IsCorruption()) return id.status();
    if (!id.ok()) {
      Log(LogLevel::kWarning, "memory tier off for " + checkpoint_dir + " (its identity " +
                                  JoinPath(checkpoint_dir, kDirIdFile) + " cannot be read or created: " +
                                  id.status().ToString() + "); loads read the disk");
      return std::unique_ptr<MemoryTier>();
    }
    dir_id = std::move(id).value();
  }
  LL_ASSIGN_OR_RETURN(std::unique_ptr<MemoryTier> tier,
                      Open(std::move(root), checkpoint_dir, dir_id, std::move(run_hash), rank, world_size, slots));
  tier->PruneStepsDeletedFrom(env, checkpoint_dir);
  return tier;
}

std::unique_ptr<MemoryTier> MemoryTier::Existing(std::string root, uint32_t rank, uint32_t world_size) {
  return std::unique_ptr<MemoryTier>(new MemoryTier(std::move(root), /*default_root=*/false, "", rank, world_size, 0));
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
  std::lock_guard<std::mutex> lock(publish_mu_);
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
  return env_->RemoveTree(step_dir);
}

Status MemoryTier::WithdrawEarlierLaunches(uint64_t step) {
  const std::string step_dir = JoinPath(root_, StepDirName(step));
  Result<std::vector<std::string>> names = env_->GetChildren(step_dir);
  if (!names.ok()) return names.status().IsNotFound() ? Status::OK() : names.status();
  bool ours_left = false;
  for (const std::string& name : *names) {
    // Every file of a step is "<run hash>.<rest>"; the run hash names the launch.
    const bool this_launch = name.size() > run_hash_.size() && name.compare(0, run_hash_.size(), run_hash_) == 0 &&
                             name[run_hash_.size()] == '.';
    if (this_launch) {
      ours_left = ours_left || ParseIndexFileName(name) || name.find(".data") != std::string::npos;
      continue;
    }
    Status s = env_->RemoveFile(JoinPath(step_dir, name));
    if (!s.ok() && !s.IsNotFound()) return s;
  }
  return ours_left ? Status::OK() : env_->RemoveTree(step_dir);
}

Status MemoryTier::Publish(uint64_t step, unsigned slot, std::string_view encoded_index) {
  std::lock_guard<std::mutex> lock(publish_mu_);
  // Written through the one checkpoint writer; the data file is the slot itself, hard-linked.
  LL_ASSIGN_OR_RETURN(CheckpointWriter writer,
                      CheckpointWriter::Begin(env_, StepTarget{{root_, run_hash_, rank_, world_size_}, step}));
  const std::string data = writer.data_path();
  Status s = env_->RemoveFile(data);
  if (!s.ok() && !s.IsNotFound()) return s;
  if (link(SlotPath(slot).c_str(), data.c_str()) != 0) return Status::FromErrno(errno, "linking " + data);
  return writer.PublishEncoded(encoded_index, CommitOptions{/*retention=*/true, slots_}).status();
}

namespace {
constexpr char kOnDiskSuffix[] = ".on-disk";
}  // namespace

Status MemoryTier::MarkOnDisk(uint64_t step) {
  const std::string step_dir = JoinPath(root_, StepDirName(step));
  const std::string name = IndexFileName(run_hash_, rank_, world_size_) + kOnDiskSuffix;
  Status s = WriteFileAtomically(env_, JoinPath(step_dir, name), "");
  // Not in the tier (never published, or withdrawn, even meanwhile: a peer rank's retention of the
  // tier when saves come faster than persists): nothing to mark.
  if (s.IsNotFound() && !env_->IsDirectory(step_dir)) return Status::OK();
  return s;
}

bool TierStepWasOnDisk(const std::vector<std::string>& children) {
  const size_t n = sizeof(kOnDiskSuffix) - 1;
  for (const std::string& name : children)
    if (name.size() > n && name.compare(name.size() - n, n, kOnDiskSuffix) == 0) return true;
  return false;
}

namespace {

// Splits the tier's steps into those still of `checkpoint_dir` and those deleted from it.
Status SplitTierSteps(Env* env, const std::string& checkpoint_dir, const std::string& root,
                      std::vector<CheckpointInfo>* kept, std::vector<CheckpointInfo>* deleted) {
  Env* tier_env = Env::Default();
  LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(tier_env, root));
  for (CheckpointInfo& info : all) {
    Result<std::vector<std::string>> children = tier_env->GetChildren(info.directory);
    const bool gone = children.ok() && TierStepWasOnDisk(*children) &&
                      !env->IsDirectory(JoinPath(checkpoint_dir, StepDirName(info.step)));
    // A step the agent marked suspect on disk is suspect in memory too (same snapshot).
    const std::string marker = JoinPath(JoinPath(checkpoint_dir, StepDirName(info.step)), kSuspectMarkerName);
    if (!gone && env->FileExists(marker)) {
      info.suspect = true;
      Result<std::string> text = ReadFileToString(env, marker, kMaxSuspectMarkerBytes);
      info.suspect_reason = text.ok() ? "marked suspect on disk" : text.status().ToString();
    }
    (gone ? deleted : kept)->push_back(std::move(info));
  }
  return Status::OK();
}

}  // namespace

Result<std::vector<CheckpointInfo>> ListTierSteps(Env* env, const std::string& checkpoint_dir, const std::string& root) {
  std::vector<CheckpointInfo> kept, deleted;
  LL_RETURN_IF_ERROR(SplitTierSteps(env, checkpoint_dir, root, &kept, &deleted));
  return kept;
}

void MemoryTier::PruneStepsDeletedFrom(Env* env, const std::string& checkpoint_dir) {
  std::vector<CheckpointInfo> kept, deleted;
  if (!SplitTierSteps(env, checkpoint_dir, root_, &kept, &deleted).ok()) return;
  for (const CheckpointInfo& info : deleted) env_->RemoveTree(info.directory).IgnoreError();
}

void MemoryTier::RemoveRootIfEmpty() {
  if (!default_root_) return;
  Result<std::vector<std::string>> slots = env_->GetChildren(JoinPath(root_, "slots"));
  if (!slots.ok() || !slots->empty()) return;
  Result<std::vector<std::string>> names = env_->GetChildren(root_);
  if (!names.ok()) return;
  for (const std::string& name : *names)
    if (ParseStepDirName(name)) return;
  // Another rank opening the tier now recreates what it needs (Open makes the root and slots).
  env_->RemoveTree(root_).IgnoreError();
}

void MemoryTier::RemoveSlotFiles() {
  for (unsigned k = 0; k < slots_; ++k) env_->RemoveFile(SlotPath(k)).IgnoreError();
}

Result<std::vector<CheckpointInfo>> MemoryTier::List() const { return ScanCheckpoints(env_, root_); }

// ---- this node's tier roots (lifeline tier ls / gc) ----------------------------------------------

namespace {

// Whether a process of this node maps a staging slot of `root`: the job using it is alive. The
// user's own processes' maps are readable; the tier is per user.
bool RootInUse(const std::string& root) {
  const std::string slots = JoinPath(root, "slots") + "/";
  Result<std::vector<std::string>> pids = Env::Default()->GetChildren("/proc");
  if (!pids.ok()) return true;  // cannot tell: assume it is
  for (const std::string& pid : *pids) {
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream maps("/proc/" + pid + "/maps");
    std::string line;
    while (std::getline(maps, line))
      if (line.find(slots) != std::string::npos) return true;
  }
  return false;
}

// Memory held under `dir`: allocated blocks, each inode once.
void AddBytes(const std::string& dir, std::set<std::pair<dev_t, ino_t>>* seen, uint64_t* bytes, int depth) {
  Result<std::vector<std::string>> names = Env::Default()->GetChildren(dir);
  if (!names.ok() || depth > 3) return;
  for (const std::string& name : *names) {
    const std::string path = JoinPath(dir, name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      AddBytes(path, seen, bytes, depth + 1);
    } else if (seen->insert({st.st_dev, st.st_ino}).second) {
      *bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
}

MemoryTierRootInfo DescribeRoot(const std::string& root) {
  MemoryTierRootInfo info;
  info.root = root;
  info.state = "unknown";
  Result<std::string> owner = ReadFileToString(Env::Default(), JoinPath(root, kOwnerFile), PATH_MAX + 64);
  const size_t nl = owner.ok() ? owner->find('\n') : std::string::npos;
  if (nl != std::string::npos) {
    info.checkpoint_dir = owner->substr(0, nl);
    std::string id = owner->substr(nl + 1);
    while (!id.empty() && id.back() == '\n') id.pop_back();
    // The directory may be an object-store prefix: Routing() reaches both kinds.
    if (!Env::Routing()->IsDirectory(info.checkpoint_dir)) {
      info.state = "gone";
    } else {
      Result<std::string> now = CheckpointDirectoryId(Env::Routing(), info.checkpoint_dir, /*create=*/false);
      info.state = now.ok() && *now == id ? "current" : "re-created";
    }
  }
  info.in_use = RootInUse(root);
  std::vector<CheckpointInfo> kept, deleted;
  if (info.state == "current" && SplitTierSteps(Env::Routing(), info.checkpoint_dir, root, &kept, &deleted).ok()) {
    info.steps = kept.size() + deleted.size();
    info.offered = kept.size();
  } else if (Result<std::vector<CheckpointInfo>> all = ScanCheckpoints(Env::Default(), root); all.ok()) {
    info.steps = all->size();  // nobody can load them
  }
  std::set<std::pair<dev_t, ino_t>> seen;
  AddBytes(root, &seen, &info.bytes, 0);
  return info;
}

}  // namespace

Result<std::vector<MemoryTierRootInfo>> ListMemoryTierRoots() {
  LL_ASSIGN_OR_RETURN(std::string base, MemoryTierFileSystem());
  const std::string user_dir = JoinPath(base, "lifeline-" + std::to_string(geteuid()));
  std::vector<MemoryTierRootInfo> out;
  if (!Env::Default()->IsDirectory(user_dir)) return out;
  LL_RETURN_IF_ERROR(CheckPrivateDir(user_dir));
  LL_ASSIGN_OR_RETURN(std::vector<std::string> names, Env::Default()->GetChildren(user_dir));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string root = JoinPath(user_dir, name);
    if (Env::Default()->GetEntryType(root).value_or(EntryType::kOther) != EntryType::kDirectory) continue;
    out.push_back(DescribeRoot(root));
  }
  return out;
}

Result<MemoryTierGcResult> CollectMemoryTierRoots(bool all, bool dry_run) {
  LL_ASSIGN_OR_RETURN(std::vector<MemoryTierRootInfo> roots, ListMemoryTierRoots());
  MemoryTierGcResult result;
  Env* env = Env::Default();
  for (const MemoryTierRootInfo& r : roots) {
    if (r.in_use) continue;
    if (r.state != "current" || all || r.offered == 0) {
      result.removed_roots.push_back(r);
      result.bytes_freed += r.bytes;
      if (!dry_run) LL_RETURN_IF_ERROR(env->RemoveTree(r.root));
      continue;
    }
    std::vector<CheckpointInfo> kept, deleted;
    LL_RETURN_IF_ERROR(SplitTierSteps(env, r.checkpoint_dir, r.root, &kept, &deleted));
    for (const CheckpointInfo& step : deleted) {
      std::set<std::pair<dev_t, ino_t>> seen;
      uint64_t bytes = 0;
      AddBytes(step.directory, &seen, &bytes, 1);
      result.steps_removed += 1;
      result.bytes_freed += bytes;  // pages shared with a slot are freed once the slot goes too
      if (!dry_run) LL_RETURN_IF_ERROR(env->RemoveTree(step.directory));
    }
  }
  return result;
}

}  // namespace lifeline
