#include "lifeline/internal/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace lifeline {

MappedRegion& MappedRegion::operator=(MappedRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void MappedRegion::Reset() {
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

Result<MappedRegion> MappedRegion::Anonymous(uint64_t bytes, bool huge_pages) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap of " + std::to_string(bytes) + " bytes of memory");
  if (huge_pages) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: fine to be refused
  return MappedRegion(p, bytes);
}

Result<MappedRegion> MappedRegion::MapFile(int fd, uint64_t bytes, bool writable, const std::string& what) {
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, what + ": mmap of " + std::to_string(bytes) + " bytes");
  return MappedRegion(p, bytes);
}

void MappedRegion::Prefault() {
  if (base_ == nullptr) return;
#ifdef MADV_POPULATE_WRITE
  if (madvise(base_, bytes_, MADV_POPULATE_WRITE) == 0) return;
#else
  // Linux 5.14's value, for headers older than the kernel we run on.
  if (madvise(base_, bytes_, 23) == 0) return;
#endif
  // Older kernels: touch each page, writing back what is read so that contents are kept.
  for (uint64_t off = 0; off < bytes_; off += 4096) {
    volatile uint8_t* p = data() + off;
    *p = *p;
  }
}

OwnedFd& OwnedFd::operator=(OwnedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

OwnedFd::~OwnedFd() {
  if (fd_ >= 0) close(fd_);
}

int CreateFreshFile(const char* path, int flags, mode_t mode) {
  for (int attempt = 0;; ++attempt) {
    int fd;
    do {
      fd = open(path, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0 || errno != EEXIST || attempt == 2) return fd;
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
      errno = ELOOP;
      return -1;
    }
    if (unlink(path) != 0 && errno != ENOENT) return -1;
  }
}

Result<OwnedFd> OpenSharedFile(const std::string& path, CreateMode mode) {
  if (mode == CreateMode::kOpenOrCreate) {
    // O_NONBLOCK: a FIFO at the path must not block the open; it is replaced below.
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
      struct stat st;
      if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 &&
          fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0)
        return OwnedFd(fd);
      close(fd);
    } else if (errno != ENOENT) {
      return Status::FromErrno(errno, path);
    }
  }
  const int fd = CreateFreshFile(path.c_str(), O_RDWR, 0600);
  if (fd < 0) return Status::FromErrno(errno, path);
  return OwnedFd(fd);
}

Status SizeSharedFile(int fd, uint64_t bytes, bool reserve, const std::string& what) {
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return Status::FromErrno(errno, what);
  if (!reserve) return Status::OK();
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc == ENOSPC)
    return Status::ResourceExhausted(what, "no space left (" + std::to_string(bytes) + " bytes needed)");
  if (rc != 0 && rc != EOPNOTSUPP) return Status::FromErrno(rc, what);
  return Status::OK();
}

Result<FileIdentity> IdentifyFile(int fd, const std::string& what) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Status::FromErrno(errno, what);
  return FileIdentity{st.st_dev, st.st_ino, static_cast<uint64_t>(st.st_size)};
}

}  // namespace lifeline
