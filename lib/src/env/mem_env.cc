// NewMemEnv(): an in-memory file system that keeps, next to what a program sees, what would
// survive a power cut, so crash consistency can be tested by simulation.
//
// Model. A file is an inode with `current` and `durable` contents; WritableFile::Sync copies
// current to durable (the content only: whether the file is reachable is its directory's
// business). A directory has `current` and `durable` entry maps (name -> file or subdirectory);
// SyncDir copies current to durable, which makes creations, renames into or out of it, removals
// and subdirectory creations in it durable. CreateDir is a change of the parent directory like
// any other creation, so a new directory survives a crash only after SyncDir of its parent.
// A rename whose source and target directories differ touches both; each half becomes durable
// with its own directory's SyncDir (so a crash between them may show the file under both names
// or neither, as POSIX allows).
//
// SimulateCrash restores, from the root down, every directory's current entries to its durable
// ones and every reachable file's current content to its durable content; anything not reachable
// that way is gone.
//
// Crash points: mutating calls (WriteAt, Truncate, Sync, SyncDir, NewWritableFile, RenameFile,
// RemoveFile, RemoveDir, CreateDir) pass a gate first. mutating_operations() counts the calls
// that passed it, whether or not they then succeeded (a RemoveFile of a missing file counts);
// after CrashAfterOperations(k) exactly k more calls pass, and every later one fails with
// Aborted("simulated crash") having done nothing. Calls on files invalidated by a crash fail
// before the gate and are not counted. Reads are never gated.
//
// Thread safety: one mutex guards the whole tree; file objects share it.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "lib/src/env/io_queue_internal.h"
#include "lifeline/env.h"

namespace lifeline {
namespace {

using internal::AtOffset;

struct MemFile {
  std::string current;
  std::string durable;
};

struct MemDir;

struct MemEntry {
  std::shared_ptr<MemFile> file;  // exactly one of file and dir is set
  std::shared_ptr<MemDir> dir;
};

struct MemDir {
  std::map<std::string, MemEntry> current;
  std::map<std::string, MemEntry> durable;
};

struct MemState {
  std::mutex mu;
  std::shared_ptr<MemDir> root = std::make_shared<MemDir>();
  uint64_t epoch = 0;        // bumped by SimulateCrash; file objects of older epochs are dead
  int64_t operations = 0;    // mutating calls that passed the gate
  int64_t crash_after = -1;  // calls still allowed to pass; negative: no crash armed

  // REQUIRES: mu held.
  Status Gate() {
    if (crash_after == 0) return Status::Aborted("simulated crash");
    ++operations;
    if (crash_after > 0) --crash_after;
    return Status::OK();
  }
};

// "/a//b/./c" -> {"a", "b", "c"}. Relative paths are taken from the root.
std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(std::move(part));
    }
    i = j + 1;
  }
  return parts;
}

// The directory holding the last component of `parts` (which must not be empty), or an error
// naming `path`. REQUIRES: mu held.
Result<MemDir*> ParentDir(MemState& st, const std::vector<std::string>& parts, const std::string& path) {
  MemDir* dir = st.root.get();
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    auto it = dir->current.find(parts[i]);
    if (it == dir->current.end()) return Status::FromErrno(ENOENT, path);
    if (!it->second.dir) return Status::FromErrno(ENOTDIR, path);
    dir = it->second.dir.get();
  }
  return dir;
}

// The entry `path` names; the root is returned as a directory entry. REQUIRES: mu held.
Result<MemEntry> Lookup(MemState& st, const std::string& path) {
  const std::vector<std::string> parts = SplitPath(path);
  if (parts.empty()) return MemEntry{nullptr, st.root};
  LL_ASSIGN_OR_RETURN(MemDir * parent, ParentDir(st, parts, path));
  auto it = parent->current.find(parts.back());
  if (it == parent->current.end()) return Status::FromErrno(ENOENT, path);
  return it->second;
}

Status Invalidated(const std::string& path) {
  return Status::Aborted(path, "file object invalidated by a simulated crash");
}

class MemWritableFile final : public WritableFile {
 public:
  MemWritableFile(std::shared_ptr<MemState> state, std::shared_ptr<MemFile> file, uint64_t epoch, std::string path)
      : state_(std::move(state)), file_(std::move(file)), epoch_(epoch), path_(std::move(path)) {}

  Status WriteAt(uint64_t offset, const void* src, size_t n) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    LL_RETURN_IF_ERROR(Usable());
    LL_RETURN_IF_ERROR(state_->Gate());
    std::string& data = file_->current;
    if (data.size() < offset + n) data.resize(offset + n, '\0');
    if (n > 0) std::memcpy(data.data() + offset, src, n);
    return Status::OK();
  }

  Status Truncate(uint64_t size) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    LL_RETURN_IF_ERROR(Usable());
    LL_RETURN_IF_ERROR(state_->Gate());
    file_->current.resize(size, '\0');
    return Status::OK();
  }

  Status Sync() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    LL_RETURN_IF_ERROR(Usable());
    LL_RETURN_IF_ERROR(state_->Gate());
    file_->durable = file_->current;
    return Status::OK();
  }

  Status Close() override {
    closed_ = true;
    return Status::OK();
  }

  const std::string& path() const override { return path_; }

 private:
  // REQUIRES: mu held.
  Status Usable() const {
    if (epoch_ != state_->epoch) return Invalidated(path_);
    if (closed_) return Status::FailedPrecondition(path_, "file is closed");
    return Status::OK();
  }

  const std::shared_ptr<MemState> state_;
  const std::shared_ptr<MemFile> file_;
  const uint64_t epoch_;
  const std::string path_;
  bool closed_ = false;
};

class MemRandomAccessFile final : public RandomAccessFile {
 public:
  MemRandomAccessFile(std::shared_ptr<MemState> state, std::shared_ptr<MemFile> file, uint64_t epoch,
                      std::string path)
      : state_(std::move(state)), file_(std::move(file)), epoch_(epoch), path_(std::move(path)) {}

  Status ReadAt(uint64_t offset, void* dst, size_t n) const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (epoch_ != state_->epoch) return Invalidated(path_);
    const std::string& data = file_->current;
    if (offset > data.size() || n > data.size() - offset) {
      const uint64_t available = offset > data.size() ? 0 : data.size() - offset;
      return Status::Corruption(path_ + AtOffset(offset), "short read: wanted " + std::to_string(n) +
                                                              " bytes, the file ends after " +
                                                              std::to_string(available));
    }
    if (n > 0) std::memcpy(dst, data.data() + offset, n);
    return Status::OK();
  }

  Result<uint64_t> Size() const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (epoch_ != state_->epoch) return Invalidated(path_);
    return static_cast<uint64_t>(file_->current.size());
  }

  const std::string& path() const override { return path_; }

 private:
  const std::shared_ptr<MemState> state_;
  const std::shared_ptr<MemFile> file_;
  const uint64_t epoch_;
  const std::string path_;
};

class MemEnvImpl final : public MemEnv {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path, const FileOptions&) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_RETURN_IF_ERROR(st_->Gate());
    const std::vector<std::string> parts = SplitPath(path);
    if (parts.empty()) return Status::FromErrno(EISDIR, path);
    LL_ASSIGN_OR_RETURN(MemDir * parent, ParentDir(*st_, parts, path));
    MemEntry& entry = parent->current[parts.back()];
    if (entry.dir) return Status::FromErrno(EISDIR, path);
    if (entry.file) {
      entry.file->current.clear();  // O_TRUNC: same inode, durable content untouched until Sync
    } else {
      entry.file = std::make_shared<MemFile>();
    }
    return std::unique_ptr<WritableFile>(new MemWritableFile(st_, entry.file, st_->epoch, path));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                const FileOptions&) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_ASSIGN_OR_RETURN(MemEntry entry, Lookup(*st_, path));
    if (entry.dir) return Status::FromErrno(EISDIR, path);
    return std::unique_ptr<RandomAccessFile>(new MemRandomAccessFile(st_, entry.file, st_->epoch, path));
  }

  Status CreateDir(const std::string& path) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_RETURN_IF_ERROR(st_->Gate());
    MemDir* dir = st_->root.get();
    std::string prefix;
    for (const std::string& part : SplitPath(path)) {
      prefix += "/" + part;
      MemEntry& entry = dir->current[part];
      if (entry.file) return Status::FromErrno(ENOTDIR, prefix);
      if (!entry.dir) entry.dir = std::make_shared<MemDir>();
      dir = entry.dir.get();
    }
    return Status::OK();
  }

  Status RemoveFile(const std::string& path) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_RETURN_IF_ERROR(st_->Gate());
    const std::vector<std::string> parts = SplitPath(path);
    if (parts.empty()) return Status::FromErrno(EISDIR, path);
    LL_ASSIGN_OR_RETURN(MemDir * parent, ParentDir(*st_, parts, path));
    auto it = parent->current.find(parts.back());
    if (it == parent->current.end()) return Status::FromErrno(ENOENT, path);
    if (it->second.dir) return Status::FromErrno(EISDIR, path);
    parent->current.erase(it);
    return Status::OK();
  }

  Status RemoveDir(const std::string& path) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_RETURN_IF_ERROR(st_->Gate());
    const std::vector<std::string> parts = SplitPath(path);
    if (parts.empty()) return Status::FromErrno(EBUSY, path);
    LL_ASSIGN_OR_RETURN(MemDir * parent, ParentDir(*st_, parts, path));
    auto it = parent->current.find(parts.back());
    if (it == parent->current.end()) return Status::FromErrno(ENOENT, path);
    if (!it->second.dir) return Status::FromErrno(ENOTDIR, path);
    if (!it->second.dir->current.empty()) return Status::FromErrno(ENOTEMPTY, path);
    parent->current.erase(it);
    return Status::OK();
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_RETURN_IF_ERROR(st_->Gate());
    const std::string both = from + " -> " + to;
    const std::vector<std::string> src = SplitPath(from);
    const std::vector<std::string> dst = SplitPath(to);
    if (src.empty() || dst.empty()) return Status::FromErrno(EBUSY, both);
    LL_ASSIGN_OR_RETURN(MemDir * src_dir, ParentDir(*st_, src, from));
    LL_ASSIGN_OR_RETURN(MemDir * dst_dir, ParentDir(*st_, dst, to));
    auto it = src_dir->current.find(src.back());
    if (it == src_dir->current.end()) return Status::FromErrno(ENOENT, both);
    if (src == dst) return Status::OK();
    const MemEntry moving = it->second;
    if (moving.dir && dst.size() > src.size() && std::equal(src.begin(), src.end(), dst.begin())) {
      return Status::FromErrno(EINVAL, both);  // a directory into its own subtree
    }
    auto target = dst_dir->current.find(dst.back());
    if (target != dst_dir->current.end()) {
      if (moving.dir && target->second.file) return Status::FromErrno(ENOTDIR, both);
      if (moving.file && target->second.dir) return Status::FromErrno(EISDIR, both);
      if (target->second.dir && !target->second.dir->current.empty()) return Status::FromErrno(ENOTEMPTY, both);
    }
    src_dir->current.erase(it);
    dst_dir->current[dst.back()] = moving;
    return Status::OK();
  }

  Result<std::vector<std::string>> GetChildren(const std::string& dir) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_ASSIGN_OR_RETURN(MemEntry entry, Lookup(*st_, dir));
    if (!entry.dir) return Status::FromErrno(ENOTDIR, dir);
    std::vector<std::string> names;
    names.reserve(entry.dir->current.size());
    for (const auto& [name, child] : entry.dir->current) names.push_back(name);
    return names;
  }

  bool FileExists(const std::string& path) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    return Lookup(*st_, path).ok();
  }

  bool IsDirectory(const std::string& path) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    Result<MemEntry> entry = Lookup(*st_, path);
    return entry.ok() && entry->dir != nullptr;
  }

  // The in-memory file system has no links: an entry is a file or a directory.
  Result<EntryType> GetEntryType(const std::string& path) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_ASSIGN_OR_RETURN(MemEntry entry, Lookup(*st_, path));
    return entry.dir ? EntryType::kDirectory : EntryType::kFile;
  }

  Result<uint64_t> GetFileSize(const std::string& path) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_ASSIGN_OR_RETURN(MemEntry entry, Lookup(*st_, path));
    if (entry.dir) return Status::FromErrno(EISDIR, path);
    return static_cast<uint64_t>(entry.file->current.size());
  }

  Status SyncDir(const std::string& dir) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    LL_RETURN_IF_ERROR(st_->Gate());
    LL_ASSIGN_OR_RETURN(MemEntry entry, Lookup(*st_, dir));
    if (!entry.dir) return Status::FromErrno(ENOTDIR, dir);
    entry.dir->durable = entry.dir->current;
    return Status::OK();
  }

  Result<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) override {
    return NewThreadPoolIoQueue(options);
  }

  void SimulateCrash() override {
    std::lock_guard<std::mutex> lock(st_->mu);
    ++st_->epoch;
    st_->crash_after = -1;
    std::set<const MemDir*> visited;  // durable maps of separately synced dirs can form a cycle
    Restore(st_->root.get(), &visited);
  }

  void CrashAfterOperations(int64_t ops) override {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->crash_after = ops < 0 ? -1 : ops;
  }

  int64_t mutating_operations() const override {
    std::lock_guard<std::mutex> lock(st_->mu);
    return st_->operations;
  }

 private:
  static void Restore(MemDir* dir, std::set<const MemDir*>* visited) {
    if (!visited->insert(dir).second) return;
    dir->current = dir->durable;
    for (auto& [name, entry] : dir->current) {
      if (entry.file) {
        entry.file->current = entry.file->durable;
      } else {
        Restore(entry.dir.get(), visited);
      }
    }
  }

  const std::shared_ptr<MemState> st_ = std::make_shared<MemState>();
};

}  // namespace

std::unique_ptr<MemEnv> NewMemEnv() { return std::make_unique<MemEnvImpl>(); }

}  // namespace lifeline
