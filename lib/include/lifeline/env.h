// Env: the single seam between Lifeline and the operating system (files, directories, async I/O).
//
// Implementations that ship with the library:
//   Env::Default()          POSIX files; O_DIRECT when asked and supported; io_uring queues with a
//                           thread-pool fallback when the kernel or sandbox forbids io_uring.
//   Env::Routing()          every path Lifeline accepts as a checkpoint directory: "s3://bucket/..."
//                           paths go to an object store (S3 API, formats/SPEC.md §18), all others to
//                           Env::Default(). What `Env* env = nullptr` means everywhere.
//   NewMemEnv()             everything in memory, with crash simulation: bytes not yet synced and
//                           directory entries not yet made durable are dropped by SimulateCrash().
//   FaultInjectionEnv       wraps any Env and fails chosen operations on demand.
//
// Paths are plain strings ("/a/b/c"); every error names the path it concerns.
//
// Thread safety: Env methods are safe for concurrent use. A file object may be used from several
// threads for positional reads/writes (ReadAt/WriteAt carry their own offset); Sync and Close
// require external synchronisation against other calls on the same object. An IoQueue is used
// by one thread at a time.
#ifndef LIFELINE_ENV_H_
#define LIFELINE_ENV_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lifeline/export.h"
#include "lifeline/status.h"

namespace lifeline {

// O_DIRECT needs buffers, offsets and lengths aligned to the logical block size. Lifeline aligns
// everything it submits to this value, which covers every block size in use (512 B to 4 KiB).
inline constexpr size_t kDirectIoAlignment = 4096;

struct LIFELINE_EXPORT FileOptions {
  // Bypass the page cache (O_DIRECT). If the file system refuses (tmpfs), the file silently uses
  // buffered I/O instead; direct() on the file tells which mode is in effect.
  bool direct_io = false;
  // Whether a symbolic link as the path's last component is followed. Off by default: every file
  // Lifeline opens inside a checkpoint (or its other own directories) must be the entry itself, so
  // a link planted there cannot make a save write, or a load read, a file elsewhere on the
  // machine. The open then fails with FailedPrecondition naming the link. Set it only for a file
  // a user named (a CLI input), which may legitimately be a link.
  bool follow_symlinks = false;
};

// What a directory entry is, without following a symbolic link (lstat).
enum class EntryType { kFile, kDirectory, kSymlink, kOther };

class LIFELINE_EXPORT RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads exactly n bytes at `offset` into dst. A read past the end of the file is Corruption
  // ("short read") naming the file and offset. For a direct file, dst/offset/n must be aligned.
  virtual Status ReadAt(uint64_t offset, void* dst, size_t n) const = 0;
  virtual Result<uint64_t> Size() const = 0;
  virtual const std::string& path() const = 0;
  virtual bool direct() const { return false; }
  // The OS descriptor when io_uring may be used on it directly, else -1.
  virtual int fd() const { return -1; }
};

class LIFELINE_EXPORT WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all n bytes at `offset` (retrying short writes). For a direct file, src/offset/n must
  // be aligned to kDirectIoAlignment.
  virtual Status WriteAt(uint64_t offset, const void* src, size_t n) = 0;
  // Sets the file's length (used to drop the alignment padding after direct writes).
  virtual Status Truncate(uint64_t size) = 0;
  // Reserves storage for the first `size` bytes (fallocate), so later writes do not grow the file
  // one extent at a time. A file system that cannot reserve is not an error; the default does nothing.
  virtual Status Allocate(uint64_t size) { return Status::OK(); }
  // Makes every byte written so far durable (fdatasync).
  virtual Status Sync() = 0;
  virtual Status Close() = 0;
  virtual const std::string& path() const = 0;
  virtual bool direct() const { return false; }
  virtual int fd() const { return -1; }
};

// One asynchronous read or write. The queue does the whole transfer (re-queuing short transfers
// and retrying EAGAIN) and reports it once, successful or not.
struct LIFELINE_EXPORT IoRequest {
  enum class Kind { kRead, kWrite };
  Kind kind = Kind::kWrite;
  WritableFile* writer = nullptr;      // for kWrite
  RandomAccessFile* reader = nullptr;  // for kRead
  uint64_t offset = 0;
  void* buffer = nullptr;
  size_t length = 0;
  uint64_t tag = 0;  // returned in the completion
  int buffer_index = -1;  // >= 0: `buffer` lies inside registered buffer #buffer_index (RegisterBuffers)
};

struct LIFELINE_EXPORT IoCompletion {
  uint64_t tag = 0;
  Status status;  // names the file and offset on failure
};

struct LIFELINE_EXPORT IoQueueOptions {
  unsigned depth = 32;    // requests in flight at most
  unsigned threads = 4;   // workers of the thread-pool engine
};

// A queue of asynchronous file I/O: io_uring where allowed, otherwise a pool of threads doing
// pread/pwrite. Used by one thread at a time.
class LIFELINE_EXPORT IoQueue {
 public:
  virtual ~IoQueue() = default;
  // Starts a request. ResourceExhausted when `depth` requests are already in flight.
  virtual Status Submit(const IoRequest& request) = 0;
  // Waits until at least `min_completions` requests (bounded by the number in flight) have
  // completed, and appends every completed request to `out`.
  virtual Status Reap(size_t min_completions, std::vector<IoCompletion>* out) = 0;
  virtual size_t in_flight() const = 0;
  virtual unsigned depth() const = 0;
  // "io_uring" or "threads".
  virtual const char* engine() const = 0;
  // Registers long-lived memory regions (each page-aligned) for faster transfers: requests whose
  // buffer_index names one of them skip the per-request page pinning (io_uring fixed buffers).
  // Replaces any earlier registration; waits for nothing, so call it with nothing in flight
  // (FailedPrecondition otherwise). InvalidArgument for an empty or misaligned region.
  // NotSupported when the engine cannot (thread pool, or the kernel/RLIMIT_MEMLOCK refuses); requests
  // with buffer_index still work then, as ordinary transfers. An empty list unregisters.
  // The regions must stay mapped until they are unregistered or the queue is destroyed.
  virtual Status RegisterBuffers(const std::vector<std::pair<void*, size_t>>& /*regions*/) {
    return Status::NotSupported("io queue", "buffer registration");
  }
};

// An exclusive advisory lock on a file (Env::LockFile), held until this object is destroyed or
// the process ends, however it ends.
class LIFELINE_EXPORT FileLock {
 public:
  virtual ~FileLock() = default;
  // Replaces the file's text: who holds the lock, for those it refuses (Env::LockHolder).
  virtual Status SetHolder(std::string_view text) = 0;
  virtual const std::string& path() const = 0;
};

class LIFELINE_EXPORT Env {
 public:
  virtual ~Env() = default;

  // The POSIX environment. Never deleted.
  static Env* Default();
  // Local paths through Default(), object-store paths ("s3://bucket/key", IsObjectStorePath)
  // through an Env per bucket over one S3 client of the process, configured at the first such path
  // from the standard AWS places (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
  // AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, ~/.aws/credentials and ~/.aws/config). When that
  // configuration fails, every operation on an s3:// path fails with its error (bool queries answer
  // false). Its IoQueues send each request to the engine of the request's file: io_uring (or the
  // thread pool) for local files, a pool of at least 16 threads for objects. Never deleted.
  static Env* Routing();
  // `env`, or Routing() where it is null (what every option `Env* env = nullptr` means): a
  // checkpoint directory may be local or an object-store prefix.
  static Env* OrDefault(Env* env) { return env != nullptr ? env : Routing(); }

  // Creates (or truncates) a file for writing.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                const FileOptions& options) = 0;
  virtual Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                        const FileOptions& options) = 0;
  // OK if the directory already exists. Creates missing parents.
  virtual Status CreateDir(const std::string& path) = 0;
  // NotFound if absent.
  virtual Status RemoveFile(const std::string& path) = 0;
  // Removes an empty directory.
  virtual Status RemoveDir(const std::string& path) = 0;
  // Atomically replaces `to` with `from` (rename(2)).
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  // Renames `from` to `to` only if `to` does not exist: AlreadyExists otherwise, and `from` stays.
  // Atomic in the POSIX Env (renameat2 RENAME_NOREPLACE, else link + unlink); the default checks
  // FileExists first, which is enough for single-process test Envs.
  virtual Status RenameFileNoReplace(const std::string& from, const std::string& to) {
    if (FileExists(to)) return Status::AlreadyExists(to);
    return RenameFile(from, to);
  }
  // Names (not paths) of the entries of a directory, without "." and "..", in no order.
  virtual Result<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  // Follows symbolic links (stat): true for a link to a directory.
  virtual bool IsDirectory(const std::string& path) = 0;
  // The type of the entry `path` names itself, not following a link at the last component.
  // NotFound if absent. The default, for Envs without links, asks IsDirectory and FileExists.
  virtual Result<EntryType> GetEntryType(const std::string& path);
  // Removes `path` and, when it is a directory, everything below it. A symbolic link, at the top or
  // anywhere below, is removed as a link: its target is never touched, listed or descended into.
  // OK if absent; entries vanishing concurrently (another rank removing the same tree) are fine.
  // The POSIX Env works relative to directory descriptors opened with O_NOFOLLOW, so a directory
  // swapped for a link during the walk is not followed either. The default walks the tree with
  // GetEntryType, GetChildren, RemoveFile and RemoveDir.
  virtual Status RemoveTree(const std::string& path);
  virtual Result<uint64_t> GetFileSize(const std::string& path) = 0;
  // Makes the directory's entries (creations, renames, removals) durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  // A new asynchronous I/O queue for files opened through this Env.
  virtual Result<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) = 0;
  // Takes an exclusive lock on `path` without waiting, creating it (a regular file, never through
  // a link) when missing. Unavailable naming the path, with the holder's text in the message, when
  // another holder has it: another process, or another FileLock of this one. The POSIX Env uses
  // open-file-description locks (fcntl F_OFD_SETLK): the kernel drops them when the holder dies,
  // and NFS carries them between machines. NotSupported in Envs without locks (the default).
  virtual Result<std::unique_ptr<FileLock>> LockFile(const std::string& path);
  // The text of the holder of the lock on `path` (FileLock::SetHolder), or nullopt when nobody
  // holds it or the file does not exist. Takes nothing and creates nothing. NotSupported where
  // LockFile is.
  virtual Result<std::optional<std::string>> LockHolder(const std::string& path);
  // Makes `path` hold exactly `data`, atomically and durably: afterwards it holds either its old
  // content or `data`, never a mix, even across a crash. With `replace` false an existing `path` is
  // left alone and the result is AlreadyExists: the first of several concurrent writers wins. The
  // default writes path.tmp-<unique> through NewWritableFile, syncs it, renames it into place
  // (RenameFile, or RenameFileNoReplace) and syncs the directory; an object store PUTs `path`
  // itself (If-None-Match: * without `replace`), since an object is visible whole or not at all.
  // Callers use the free function WriteFileAtomically.
  virtual Status PutFile(const std::string& path, std::string_view data, bool replace);
  // Removes writes begun at or below `path` that never completed and never will (the multipart
  // uploads of a writer that died), returning how many. Never call it while a writer may still be
  // writing there. Files have no such leftovers: the default removes nothing and returns 0.
  virtual Result<size_t> AbortIncompleteWrites(const std::string& /*path*/) { return size_t{0}; }
};

// Forwards every call to another Env; a test double overrides only what it needs.
class LIFELINE_EXPORT EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override {
    return target_->NewWritableFile(path, options);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                const FileOptions& options) override {
    return target_->NewRandomAccessFile(path, options);
  }
  Status CreateDir(const std::string& path) override { return target_->CreateDir(path); }
  Status RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  Status RemoveDir(const std::string& path) override { return target_->RemoveDir(path); }
  Status RenameFile(const std::string& from, const std::string& to) override {
    return target_->RenameFile(from, to);
  }
  Status RenameFileNoReplace(const std::string& from, const std::string& to) override {
    return target_->RenameFileNoReplace(from, to);
  }
  Result<std::vector<std::string>> GetChildren(const std::string& dir) override {
    return target_->GetChildren(dir);
  }
  bool FileExists(const std::string& path) override { return target_->FileExists(path); }
  bool IsDirectory(const std::string& path) override { return target_->IsDirectory(path); }
  Result<EntryType> GetEntryType(const std::string& path) override { return target_->GetEntryType(path); }
  Status RemoveTree(const std::string& path) override { return target_->RemoveTree(path); }
  Result<uint64_t> GetFileSize(const std::string& path) override { return target_->GetFileSize(path); }
  Status SyncDir(const std::string& dir) override { return target_->SyncDir(dir); }
  Result<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) override {
    return target_->NewIoQueue(options);
  }
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override { return target_->LockFile(path); }
  Result<std::optional<std::string>> LockHolder(const std::string& path) override {
    return target_->LockHolder(path);
  }
  // PutFile is not forwarded: the default goes through this wrapper's NewWritableFile and renames,
  // so a test double sees (and may fail) every step of it.
  Result<size_t> AbortIncompleteWrites(const std::string& path) override { return target_->AbortIncompleteWrites(path); }

 private:
  Env* target_;
};

// An in-memory Env that models durability the way a POSIX file system promises it:
// file contents become durable at WritableFile::Sync(), directory entries (creations, renames,
// removals) at SyncDir() of the directory that holds them. SimulateCrash() throws away whatever
// was not durable, as a power cut would.
class LIFELINE_EXPORT MemEnv : public Env {
 public:
  // Drops every byte written since its file's last Sync and every directory change since its
  // directory's last SyncDir, then lets the Env be used again (as after a reboot). Open file
  // objects become invalid: their operations return Aborted.
  virtual void SimulateCrash() = 0;
  // After `ops` more mutating operations (writes, syncs, creates, renames, removes), every further
  // mutating operation fails with Aborted("simulated crash"), as if the machine stopped there.
  // A negative value disarms it.
  virtual void CrashAfterOperations(int64_t ops) = 0;
  // Mutating operations performed so far (to enumerate crash points).
  virtual int64_t mutating_operations() const = 0;
};

LIFELINE_EXPORT std::unique_ptr<MemEnv> NewMemEnv();

// Wraps an Env and injects failures. The knobs are safe to change while other threads use the Env.
class LIFELINE_EXPORT FaultInjectionEnv : public EnvWrapper {
 public:
  explicit FaultInjectionEnv(Env* target);
  ~FaultInjectionEnv() override;

  // Writes fail with "No space left on device" once this many more bytes have been written
  // (through WriteAt or the IoQueue). Negative disables.
  void FailWritesAfterBytes(int64_t bytes);
  // Every Sync() and SyncDir() fails while set.
  void FailSyncs(bool fail);
  // Every RenameFile and RenameFileNoReplace fails while set.
  void FailRenames(bool fail);
  // Only paths containing this substring are affected by the knobs above (empty: all paths).
  void RestrictToPathsContaining(std::string substring);

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status RenameFileNoReplace(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& dir) override;
  Result<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) override;

  struct State;  // shared with the wrapped files; defined in fault_env.cc

 private:
  std::shared_ptr<State> state_;
};

// A thread-pool IoQueue that works on any Env's files by calling ReadAt/WriteAt; the fallback
// when io_uring is unavailable and the engine of non-POSIX Envs.
LIFELINE_EXPORT std::unique_ptr<IoQueue> NewThreadPoolIoQueue(const IoQueueOptions& options);

// ---- helpers built on the seam -------------------------------------------------------------

// True for an object-store path, "s3://bucket[/key]": a checkpoint directory may be one (Env::Routing).
LIFELINE_EXPORT bool IsObjectStorePath(std::string_view path);
// path + "/" + name.
LIFELINE_EXPORT std::string JoinPath(std::string_view dir, std::string_view name);
// Reads a whole (small) file. ResourceExhausted when it is larger than max_bytes. A link at `path`
// is refused unless options.follow_symlinks.
LIFELINE_EXPORT Result<std::string> ReadFileToString(Env* env, const std::string& path, uint64_t max_bytes,
                                     const FileOptions& options = FileOptions{});
// env->PutFile(path, data, replace): on a file system, writes `data` to path.tmp-<unique>, syncs
// it, renames it over `path`, then syncs the directory; on an object store, one PUT. Afterwards
// `path` holds either its old content or `data`, never a mix, even across a crash. With `replace`
// false an existing `path` is left alone and the result is AlreadyExists (the temporary file
// removed): the first of several concurrent writers wins.
LIFELINE_EXPORT Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data, bool replace = true);
// The error for a symbolic link found where Lifeline reads or writes its own files.
LIFELINE_EXPORT Status SymlinkRefused(const std::string& path);

}  // namespace lifeline

#endif  // LIFELINE_ENV_H_
