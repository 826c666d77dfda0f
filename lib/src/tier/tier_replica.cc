#include "lifeline/internal/tier_replica.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "lib/src/save/commit.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/tier/memory_tier.h"

namespace lifeline {

std::optional<TierSnapshot> ParseTierSnapshot(const std::string& root, const std::string& step_dir_name,
                                              const std::string& index_name) {
  const std::optional<uint64_t> step = ParseStepDirName(step_dir_name);
  const std::optional<RankFileName> r = ParseIndexFileName(index_name);
  if (!step || !r) return std::nullopt;
  return TierSnapshot{*step, r->run_hash, r->rank, r->world_size, JoinPath(root, step_dir_name), index_name,
                      DataFileName(r->run_hash, r->rank, r->world_size)};
}

Result<std::string> ReplicaIncomingDir() {
  LL_ASSIGN_OR_RETURN(std::string user_dir, MemoryTierUserDir());
  const std::string dir = JoinPath(user_dir, ".incoming");
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, dir);
  return dir;
}

namespace {

// Allocated bytes under `dir`, each inode once.
void AddUsage(const std::string& dir, std::set<std::pair<dev_t, ino_t>>* seen, uint64_t* bytes) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = JoinPath(dir, name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      AddUsage(path, seen, bytes);
    } else if (S_ISREG(st.st_mode) && seen->insert({st.st_dev, st.st_ino}).second) {
      *bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  ::closedir(d);
}

}  // namespace

Result<uint64_t> MemoryTierBytesInUse() {
  LL_ASSIGN_OR_RETURN(std::string user_dir, MemoryTierUserDir());
  std::set<std::pair<dev_t, ino_t>> seen;
  uint64_t bytes = 0;
  AddUsage(user_dir, &seen, &bytes);
  return bytes;
}

Result<uint64_t> MemoryTierFileSystemBytes() {
  LL_ASSIGN_OR_RETURN(std::string user_dir, MemoryTierUserDir());
  struct statvfs fs;
  if (::statvfs(user_dir.c_str(), &fs) != 0) return Status::FromErrno(errno, user_dir);
  return static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
}

Result<std::string> MemoryTierRootOf(const std::string& checkpoint_dir) {
  LL_ASSIGN_OR_RETURN(std::string id, CheckpointDirectoryId(Env::Default(), checkpoint_dir, /*create=*/false));
  return CreateDefaultMemoryTierRoot(checkpoint_dir, id);
}

Result<std::vector<TierSnapshot>> ListTierSnapshots(Env* env, const std::string& root) {
  LL_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(root));
  std::vector<TierSnapshot> out;
  for (const std::string& name : names) {
    if (!ParseStepDirName(name)) continue;
    Result<std::vector<std::string>> files = env->GetChildren(JoinPath(root, name));
    if (!files.ok()) continue;
    for (const std::string& f : *files)
      if (std::optional<TierSnapshot> s = ParseTierSnapshot(root, name, f)) out.push_back(std::move(*s));
  }
  std::sort(out.begin(), out.end(), [](const TierSnapshot& a, const TierSnapshot& b) {
    return a.step != b.step ? a.step > b.step : a.rank < b.rank;
  });
  return out;
}

Status PlaceTierReplica(Env* env, const std::string& root, const TierSnapshot& s, const std::string& data_file,
                        std::string_view encoded_index, uint32_t keep_last) {
  LL_ASSIGN_OR_RETURN(std::string step_dir, PrepareStepDir(env, root, s.step, s.run_hash, s.rank, s.world_size));
  LL_RETURN_IF_ERROR(env->RenameFile(data_file, JoinPath(step_dir, DataFileName(s.run_hash, s.rank, s.world_size))));
  return PublishRankIndex(env, root, s.step, s.run_hash, s.rank, s.world_size, encoded_index, /*retention=*/true,
                          keep_last)
      .status();
}

}  // namespace lifeline
