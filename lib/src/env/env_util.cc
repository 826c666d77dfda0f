// Helpers built on the Env seam (declared in lifeline/env.h).
#include <atomic>
#include <cstdio>
#include <unistd.h>

#include "lifeline/env.h"

namespace lifeline {

std::string JoinPath(std::string_view dir, std::string_view name) {
  std::string path(dir);
  if (!path.empty() && path.back() != '/') path.push_back('/');
  path.append(name);
  return path;
}

Result<std::string> ReadFileToString(Env* env, const std::string& path, uint64_t max_bytes,
                                     const FileOptions& options) {
  LL_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path, options));
  LL_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  if (size > max_bytes) {
    return Status::ResourceExhausted(path, "file of " + std::to_string(size) + " bytes exceeds the limit of " +
                                               std::to_string(max_bytes));
  }
  std::string data(size, '\0');
  if (size > 0) LL_RETURN_IF_ERROR(file->ReadAt(0, data.data(), size));
  return data;
}

bool IsObjectStorePath(std::string_view path) { return path.rfind("s3://", 0) == 0; }

Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data, bool replace) {
  return env->PutFile(path, data, replace);
}

Status Env::PutFile(const std::string& path, std::string_view data, bool replace) {
  Env* env = this;
  static std::atomic<uint64_t> counter{0};
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), ".tmp-%d-%llu", static_cast<int>(getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  const std::string tmp = path + suffix;
  Status s;
  {
    LL_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(tmp, FileOptions{}));
    s = file->WriteAt(0, data.data(), data.size());
    if (s.ok()) s = file->Sync();
    Status c = file->Close();
    if (s.ok()) s = c;
  }
  if (s.ok()) s = replace ? env->RenameFile(tmp, path) : env->RenameFileNoReplace(tmp, path);
  if (!s.ok()) {
    env->RemoveFile(tmp).IgnoreError();
    return s;
  }
  const size_t slash = path.rfind('/');
  return env->SyncDir(slash == std::string::npos ? std::string(".") : path.substr(0, slash == 0 ? 1 : slash));
}

Status SymlinkRefused(const std::string& path) {
  return Status::FailedPrecondition(path, "is a symbolic link; Lifeline never follows links inside a checkpoint");
}

Result<EntryType> Env::GetEntryType(const std::string& path) {
  if (IsDirectory(path)) return EntryType::kDirectory;
  if (FileExists(path)) return EntryType::kFile;
  return Status::NotFound(path);
}

Result<std::unique_ptr<FileLock>> Env::LockFile(const std::string& path) {
  return Status::NotSupported(path, "this Env has no file locks");
}

Result<std::optional<std::string>> Env::LockHolder(const std::string& path) {
  return Status::NotSupported(path, "this Env has no file locks");
}

Status Env::RemoveTree(const std::string& path) {
  Result<EntryType> type = GetEntryType(path);
  if (type.status().IsNotFound()) return Status::OK();
  LL_RETURN_IF_ERROR(type.status());
  if (*type != EntryType::kDirectory) {
    Status s = RemoveFile(path);
    return s.IsNotFound() ? Status::OK() : s;
  }
  Result<std::vector<std::string>> children = GetChildren(path);
  if (children.status().IsNotFound()) return Status::OK();
  LL_RETURN_IF_ERROR(children.status());
  for (const std::string& child : *children) LL_RETURN_IF_ERROR(RemoveTree(JoinPath(path, child)));
  Status s = RemoveDir(path);
  return s.IsNotFound() ? Status::OK() : s;
}

}  // namespace lifeline
