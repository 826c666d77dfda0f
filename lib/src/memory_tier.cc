#include "lib/src/memory_tier.h"

#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "formats/checksum.h"
#include "lib/src/checkpoint_layout.h"
#include "lib/src/checkpoint_reader.h"
#include "lib/src/checkpoint_writer.h"
#include "lib/src/commit.h"
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

MemoryTier::MemoryTier(std::string root, std::string run_hash, uint32_t rank, uint32_t world_size, unsigned slots)
    : env_(Env::Default()), root_(std::move(root)), run_hash_(std::move(run_hash)), rank_(rank),
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
  if (root.empty()) {
    LL_ASSIGN_OR_RETURN(root, CreateDefaultMemoryTierRoot(checkpoint_dir, dir_id));
  } else {
    LL_RETURN_IF_ERROR(Env::Default()->CreateDir(root).Annotate("memory tier"));
  }
  LL_RETURN_IF_ERROR(MakePrivateDir(root).Annotate("memory tier"));
  LL_RETURN_IF_ERROR(MakePrivateDir(JoinPath(root, "slots")).Annotate("memory tier"));
  std::unique_ptr<MemoryTier> tier(new MemoryTier(std::move(root), std::move(run_hash), rank, world_size, slots));
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
  return Open(std::move(root), checkpoint_dir, dir_id, std::move(run_hash), rank, world_size, slots);
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
  return env_->RemoveTree(step_dir);
}

Status MemoryTier::Publish(uint64_t step, unsigned slot, std::string_view encoded_index) {
  // Written through the one checkpoint writer; the data file is the slot itself, hard-linked.
  LL_ASSIGN_OR_RETURN(CheckpointWriter writer,
                      CheckpointWriter::Begin(env_, StepTarget{{root_, run_hash_, rank_, world_size_}, step}));
  const std::string data = writer.data_path();
  Status s = env_->RemoveFile(data);
  if (!s.ok() && !s.IsNotFound()) return s;
  if (link(SlotPath(slot).c_str(), data.c_str()) != 0) return Status::FromErrno(errno, "linking " + data);
  return writer.PublishEncoded(encoded_index, CommitOptions{/*retention=*/true, slots_}).status();
}

void MemoryTier::RemoveSlotFiles() {
  for (unsigned k = 0; k < slots_; ++k) env_->RemoveFile(SlotPath(k)).IgnoreError();
}

Result<std::vector<CheckpointInfo>> MemoryTier::List() const { return ScanCheckpoints(env_, root_); }

}  // namespace lifeline
