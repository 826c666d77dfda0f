// Env::Default(): POSIX files and directories.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "lib/src/env/io_queue_internal.h"
#include "lifeline/env.h"
#include "lifeline/internal/shared_memory.h"

namespace lifeline {
namespace internal {

namespace {
std::atomic<bool> direct_io_refused_for_testing{false};
}  // namespace

void SetDirectIoRefusedForTesting(bool refused) { direct_io_refused_for_testing.store(refused); }

std::string AtOffset(uint64_t offset) { return " at offset " + std::to_string(offset); }

}  // namespace internal

namespace {

using internal::AtOffset;

// Opens `path`, adding O_DIRECT when asked. A file system that refuses O_DIRECT answers EINVAL;
// the file is then opened buffered and *direct reports false.
int OpenMaybeDirect(const std::string& path, int flags, bool want_direct, bool* direct) {
  *direct = false;
  if (want_direct) {
    int fd;
    if (internal::direct_io_refused_for_testing.load()) {
      fd = -1;
      errno = EINVAL;
    } else {
      do {
        fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
      } while (fd < 0 && errno == EINTR);
    }
    if (fd >= 0) {
      *direct = true;
      return fd;
    }
    if (errno != EINVAL) return -1;
  }
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// `fd`, a file just created at `path`, reopened for writing with O_DIRECT when the file system
// allows it (and the name still leads to the same inode); else `fd` itself, buffered.
int ReopenDirect(const std::string& path, int fd, bool* direct) {
  bool reopened = false;
  const int dfd = OpenMaybeDirect(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC, true, &reopened);
  struct stat a, b;
  if (dfd >= 0 && reopened && ::fstat(fd, &a) == 0 && ::fstat(dfd, &b) == 0 && a.st_dev == b.st_dev &&
      a.st_ino == b.st_ino) {
    ::close(fd);
    *direct = true;
    return dfd;
  }
  if (dfd >= 0) ::close(dfd);
  return fd;
}

// The Status for a failed open: a link at the last component refused by O_NOFOLLOW says so
// (ELOOP alone would read "too many levels of symbolic links").
Status OpenError(int err, const std::string& path) {
  struct stat st;
  if (err == ELOOP && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return SymlinkRefused(path);
  return Status::FromErrno(err, path);
}

int NoFollow(const FileOptions& options) { return options.follow_symlinks ? 0 : O_NOFOLLOW; }

// Opens the directory `name` inside the directory `dirfd` without following a link.
int OpenDirAt(int dirfd, const char* name) {
  int fd;
  do {
    fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// The names in the open directory `fd` (without "." and ".."); the descriptor stays open.
Result<std::vector<std::string>> ListDirFd(int fd, const std::string& path) {
  const int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return Status::FromErrno(errno, path);
  DIR* d = ::fdopendir(dup_fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(dup_fd);
    return Status::FromErrno(err, path);
  }
  std::vector<std::string> names;
  int err;
  for (;;) {
    errno = 0;  // readdir tells the end from an error only through errno
    const struct dirent* e = ::readdir(d);
    err = errno;
    if (e == nullptr) break;
    const char* n = e->d_name;
    if (!(n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0')))) names.emplace_back(n);
  }
  ::closedir(d);
  if (err != 0) return Status::FromErrno(err, path);
  return names;
}

// Empties the directory open as `fd` (named `path` in errors). Every entry is examined with
// fstatat(AT_SYMLINK_NOFOLLOW) and subdirectories are opened with O_NOFOLLOW relative to their
// parent's descriptor, so no link is ever followed, whatever is renamed meanwhile.
Status RemoveChildrenAt(int fd, const std::string& path, int depth) {
  if (depth > 64) return Status::FailedPrecondition(path, "directory tree nested too deeply to remove");
  LL_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirFd(fd, path));
  for (const std::string& name : names) {
    const std::string child = JoinPath(path, name);
    struct stat st;
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      return Status::FromErrno(errno, child);
    }
    if (S_ISDIR(st.st_mode)) {
      const int sub = OpenDirAt(fd, name.c_str());
      if (sub < 0) {
        if (errno == ENOENT) continue;
        // ELOOP/ENOTDIR: replaced by a link or a file since the fstatat; unlinked below as such.
        if (errno != ELOOP && errno != ENOTDIR) return Status::FromErrno(errno, child);
      } else {
        Status s = RemoveChildrenAt(sub, child, depth + 1);
        ::close(sub);
        LL_RETURN_IF_ERROR(s);
        if (::unlinkat(fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) return Status::FromErrno(errno, child);
        continue;
      }
    }
    if (::unlinkat(fd, name.c_str(), 0) != 0 && errno != ENOENT) return Status::FromErrno(errno, child);
  }
  return Status::OK();
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd, bool direct) : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  Status WriteAt(uint64_t offset, const void* src, size_t n) override {
    const char* p = static_cast<const char*>(src);
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, path_ + AtOffset(offset));
      }
      if (w == 0) return Status::IOError(path_ + AtOffset(offset), "write made no progress");
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return Status::OK();
  }

  Status Truncate(uint64_t size) override {
    int rc;
    do {
      rc = ::ftruncate(fd_, static_cast<off_t>(size));
    } while (rc < 0 && errno == EINTR);
    return rc < 0 ? Status::FromErrno(errno, path_) : Status::OK();
  }

  Status Allocate(uint64_t size) override {
    // Reserving the extent up front lets direct writes run in parallel instead of serialising on
    // file growth (ext4 and XFS). A file system without fallocate is not an error.
    int rc;
    do {
      rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(size));
    } while (rc < 0 && errno == EINTR);
    if (rc < 0 && errno != EOPNOTSUPP && errno != ENOSYS) return Status::FromErrno(errno, path_);
    return Status::OK();
  }

  Status Sync() override {
    int rc;
    do {
      rc = ::fdatasync(fd_);
    } while (rc < 0 && errno == EINTR);
    return rc < 0 ? Status::FromErrno(errno, path_) : Status::OK();
  }

  Status Close() override {
    if (fd_ < 0) return Status::OK();
    const int fd = fd_;
    fd_ = -1;
    // close(2) must not be retried on EINTR: the descriptor is gone either way on Linux.
    return ::close(fd) < 0 && errno != EINTR ? Status::FromErrno(errno, path_) : Status::OK();
  }

  const std::string& path() const override { return path_; }
  bool direct() const override { return direct_; }
  int fd() const override { return fd_; }

 private:
  const std::string path_;
  int fd_;
  const bool direct_;
};

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, bool direct) : path_(std::move(path)), fd_(fd), direct_(direct) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  Status ReadAt(uint64_t offset, void* dst, size_t n) const override {
    char* p = static_cast<char*>(dst);
    const uint64_t start = offset;
    const size_t wanted = n;
    while (n > 0) {
      ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, path_ + AtOffset(offset));
      }
      if (r == 0) {
        return Status::Corruption(path_ + AtOffset(start), "short read: wanted " + std::to_string(wanted) +
                                                             " bytes, the file ends after " +
                                                             std::to_string(wanted - n));
      }
      p += r;
      n -= static_cast<size_t>(r);
      offset += static_cast<uint64_t>(r);
    }
    return Status::OK();
  }

  Result<uint64_t> Size() const override {
    struct stat st;
    if (::fstat(fd_, &st) < 0) return Status::FromErrno(errno, path_);
    return static_cast<uint64_t>(st.st_size);
  }

  const std::string& path() const override { return path_; }
  bool direct() const override { return direct_; }
  int fd() const override { return fd_; }

 private:
  const std::string path_;
  const int fd_;
  const bool direct_;
};

// The lock file of LockFile/LockHolder: a regular file with one name. Anything else found at the
// path (a FIFO, a link, a hard link to another file) was planted: it is replaced, never written
// through; `create` false leaves a missing file missing (-1, ENOENT).
int OpenLockFile(const std::string& path, int flags, bool create) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    int fd;
    do {
      fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) {
      struct stat st;
      if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1) return fd;
      ::close(fd);
    } else if (errno == ENOENT) {
      if (!create) return -1;
      fd = CreateFreshFile(path.c_str(), flags, 0644);
      if (fd >= 0 || errno != EEXIST) return fd;
      continue;  // another process created it first: open theirs
    } else if (errno != ELOOP) {
      return -1;
    }
    if (!create) {
      errno = ENOENT;
      return -1;
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return -1;
  }
  errno = EAGAIN;
  return -1;
}

std::string ReadLockText(int fd) {
  char buf[4096];
  const ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

class PosixFileLock final : public FileLock {
 public:
  PosixFileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixFileLock() override { ::close(fd_); }  // closing the last descriptor drops the lock

  Status SetHolder(std::string_view text) override {
    if (::ftruncate(fd_, 0) != 0) return Status::FromErrno(errno, path_);
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::pwrite(fd_, text.data() + done, text.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::FromErrno(n < 0 ? errno : EIO, path_);
      done += static_cast<size_t>(n);
    }
    return Status::OK();
  }
  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  const int fd_;
};

class PosixEnv final : public Env {
 public:
  // A path the caller names and wants followed (follow_symlinks: an export's output) is truncated
  // in place; any other, a name inside a checkpoint, is made a new file (CreateFreshFile), so a hard
  // link or FIFO planted at it is replaced rather than written through or blocked on.
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override {
    bool direct = false;
    int fd;
    if (options.follow_symlinks) {
      fd = OpenMaybeDirect(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, options.direct_io, &direct);
    } else {
      fd = CreateFreshFile(path.c_str(), O_WRONLY, 0644);
      if (fd >= 0 && options.direct_io) fd = ReopenDirect(path, fd, &direct);
    }
    if (fd < 0) return OpenError(errno, path);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd, direct));
  }

  // O_NONBLOCK: a FIFO planted where a checkpoint file should be must not hang the open (nor the
  // agent's resume scan, ls, verify, gc or a load); only regular files (and directories, to be
  // synced) are opened.
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                const FileOptions& options) override {
    bool direct;
    const int fd = OpenMaybeDirect(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | NoFollow(options), options.direct_io,
                                   &direct);
    if (fd < 0) return OpenError(errno, path);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return Status::FromErrno(err, path);
    }
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {  // a directory: opened to be synced
      ::close(fd);
      return Status::FailedPrecondition(path, "is not a regular file (a FIFO, device or socket); not reading it");
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(path, fd, direct));
  }

  Status CreateDir(const std::string& path) override {
    if (path.empty()) return Status::InvalidArgument("CreateDir", "empty path");
    // Create each missing component from the top; EEXIST is fine as long as it is a directory.
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = path.find('/', pos + 1);
      const std::string prefix = path.substr(0, pos);
      if (prefix.empty() || prefix.back() == '/') continue;
      if (::mkdir(prefix.c_str(), 0755) == 0) continue;
      const int err = errno;
      // An existing directory is fine whatever mkdir said (EROFS or EACCES can win over EEXIST).
      if (IsDirectory(prefix)) continue;
      return Status::FromErrno(err == EEXIST ? ENOTDIR : err, prefix);
    }
    return Status::OK();
  }

  Status RemoveFile(const std::string& path) override {
    return ::unlink(path.c_str()) < 0 ? Status::FromErrno(errno, path) : Status::OK();
  }

  Status RemoveDir(const std::string& path) override {
    return ::rmdir(path.c_str()) < 0 ? Status::FromErrno(errno, path) : Status::OK();
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    return ::rename(from.c_str(), to.c_str()) < 0 ? Status::FromErrno(errno, from + " -> " + to) : Status::OK();
  }

  Status RenameFileNoReplace(const std::string& from, const std::string& to) override {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return Status::OK();
    if (errno == EEXIST) return Status::AlreadyExists(to);
    if (errno != EINVAL && errno != ENOSYS) return Status::FromErrno(errno, from + " -> " + to);
    // The file system cannot rename without replacing: a hard link fails on an existing name too.
    if (::link(from.c_str(), to.c_str()) != 0) {
      return errno == EEXIST ? Status::AlreadyExists(to) : Status::FromErrno(errno, from + " -> " + to);
    }
    ::unlink(from.c_str());
    return Status::OK();
  }

  Result<std::vector<std::string>> GetChildren(const std::string& dir) override {
    int fd;
    do {
      fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return Status::FromErrno(errno, dir);
    Result<std::vector<std::string>> names = ListDirFd(fd, dir);
    ::close(fd);
    return names;
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  bool IsDirectory(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }

  Result<EntryType> GetEntryType(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) < 0) return Status::FromErrno(errno, path);
    if (S_ISLNK(st.st_mode)) return EntryType::kSymlink;
    if (S_ISDIR(st.st_mode)) return EntryType::kDirectory;
    if (S_ISREG(st.st_mode)) return EntryType::kFile;
    return EntryType::kOther;
  }

  Status RemoveTree(const std::string& path) override {
    // Split into parent and last component; the walk starts from the parent's descriptor.
    size_t end = path.size();
    while (end > 1 && path[end - 1] == '/') --end;
    const std::string trimmed = path.substr(0, end);
    const size_t slash = trimmed.rfind('/');
    const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : trimmed.substr(0, slash);
    const std::string name = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
    if (name.empty() || name == "." || name == ".." || name == "/")
      return Status::InvalidArgument(path, "refusing to remove this directory tree");
    int parent_fd;
    do {
      parent_fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // the parent may be a link
    } while (parent_fd < 0 && errno == EINTR);
    if (parent_fd < 0) return errno == ENOENT ? Status::OK() : Status::FromErrno(errno, parent);
    Status s;
    const int fd = OpenDirAt(parent_fd, name.c_str());
    if (fd >= 0) {
      s = RemoveChildrenAt(fd, path, 0);
      ::close(fd);
      if (s.ok() && ::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
        s = Status::FromErrno(errno, path);
    } else if (errno == ELOOP || errno == ENOTDIR) {
      // A link (or a file): remove the entry itself, never what it points to.
      if (::unlinkat(parent_fd, name.c_str(), 0) != 0 && errno != ENOENT) s = Status::FromErrno(errno, path);
    } else if (errno != ENOENT) {
      s = Status::FromErrno(errno, path);
    }
    ::close(parent_fd);
    return s;
  }

  Result<uint64_t> GetFileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) < 0) return Status::FromErrno(errno, path);
    if (S_ISDIR(st.st_mode)) return Status::FromErrno(EISDIR, path);
    return static_cast<uint64_t>(st.st_size);
  }

  Status SyncDir(const std::string& dir) override {
    int fd;
    do {
      fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) return Status::FromErrno(errno, dir);
    int rc;
    do {
      rc = ::fsync(fd);
    } while (rc < 0 && errno == EINTR);
    const int err = errno;
    ::close(fd);
    return rc < 0 ? Status::FromErrno(err, dir) : Status::OK();
  }

  Result<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) override {
    return internal::NewPosixIoQueue(options);
  }

  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int fd = OpenLockFile(path, O_RDWR | O_CREAT, /*create=*/true);
      if (fd < 0) return Status::FromErrno(errno, path);
      struct flock fl = {};
      fl.l_type = F_WRLCK;
      fl.l_whence = SEEK_SET;
      if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
        const int err = errno;
        const std::string holder = ReadLockText(fd);
        ::close(fd);
        if (err != EAGAIN && err != EACCES) return Status::FromErrno(err, path);
        return Status::Unavailable(path, "is locked by " + (holder.empty() ? std::string("another process") : holder));
      }
      // Locked, but the name may have been given to another file meanwhile (a planted file
      // replaced by another process): a lock on a file no longer at the path excludes nobody.
      struct stat held, named;
      if (::fstat(fd, &held) == 0 && ::lstat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
          held.st_ino == named.st_ino) {
        // The previous holder's text goes at once: until SetHolder, readers find none rather
        // than a holder that is gone.
        if (::ftruncate(fd, 0) != 0) {
          const int err = errno;
          ::close(fd);
          return Status::FromErrno(err, path);
        }
        return std::unique_ptr<FileLock>(new PosixFileLock(path, fd));
      }
      ::close(fd);
    }
    return Status::Unavailable(path, "keeps being replaced; cannot lock it");
  }

  Result<std::optional<std::string>> LockHolder(const std::string& path) override {
    const int fd = OpenLockFile(path, O_RDONLY, /*create=*/false);
    if (fd < 0) {
      if (errno == ENOENT) return std::optional<std::string>();
      return Status::FromErrno(errno, path);
    }
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    const int rc = ::fcntl(fd, F_OFD_GETLK, &fl);
    const int err = errno;
    std::optional<std::string> holder;
    if (rc == 0 && fl.l_type != F_UNLCK) holder = ReadLockText(fd);
    ::close(fd);
    if (rc != 0) return Status::FromErrno(err, path);
    return holder;
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();  // never deleted: files may outlive static destruction
  return env;
}

}  // namespace lifeline
