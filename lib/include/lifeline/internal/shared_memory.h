// Memory mappings: the one place that maps and unmaps memory for Lifeline (snapshot slots, the
// memory tier's files in /dev/shm, the agent's trace rings, the drill's shared-memory all-reduce).
//
// A MappedRegion owns one mapping and unmaps it when destroyed. The functions below open, size and
// map files the way shared memory must be handled: created 0600 and never through a symbolic
// link, sized up front so that a full /dev/shm is an error at reservation rather than a SIGBUS in a
// copy thread later, and closed as soon as they are mapped (a mapping keeps its pages).
//
// This is part of the Env layer but not of the Env interface: a mapping has no in-memory or
// fault-injecting variant worth having (MemEnv's files are memory already), so it stays POSIX.
#ifndef LIFELINE_INTERNAL_SHARED_MEMORY_H_
#define LIFELINE_INTERNAL_SHARED_MEMORY_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "lifeline/status.h"

namespace lifeline {

class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(MappedRegion&& other) noexcept { *this = std::move(other); }
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion() { Reset(); }

  // `bytes` of private zeroed memory; `huge_pages` asks the kernel to back it with transparent huge
  // pages where it can.
  static Result<MappedRegion> Anonymous(uint64_t bytes, bool huge_pages);
  // Maps the first `bytes` of the open file `fd`, shared (writable or read-only). `what` names the
  // file in errors. The caller keeps (and closes) `fd`.
  static Result<MappedRegion> MapFile(int fd, uint64_t bytes, bool writable, const std::string& what);

  uint8_t* data() const { return static_cast<uint8_t*>(base_); }
  uint64_t size() const { return bytes_; }
  bool mapped() const { return base_ != nullptr; }
  // Unmaps now (idempotent).
  void Reset();
  // Faults every page in now (writing zeros to pages not yet present), so that the first copy into
  // the region runs at memory speed; pages already present keep their contents.
  void Prefault();

 private:
  MappedRegion(void* base, uint64_t bytes) : base_(base), bytes_(bytes) {}
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
};

// An open file descriptor, closed when destroyed.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) : fd_(fd) {}
  OwnedFd(OwnedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  OwnedFd& operator=(OwnedFd&& other) noexcept;
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd();
  int get() const { return fd_; }

 private:
  int fd_;
};

enum class CreateMode {
  kOpenOrCreate,  // the file as it is, created when missing
  kFresh,         // a new inode: whatever was at the path is unlinked first (a process still
                  // mapping the old file keeps writing there, never into the new one)
};

// Opens (creating, mode 0600) the file at `path` read-write, never through a symbolic link. An
// existing file is used only when it is a regular file with no other name (kOpenOrCreate); a hard
// link planted at the path, or a FIFO or device, is replaced by a new file instead.
Result<OwnedFd> OpenSharedFile(const std::string& path, CreateMode mode);

// Creates `path` as a new regular file, open with `flags` (O_WRONLY or O_RDWR, ...) plus
// O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, permissions `mode`. A file, hard link or FIFO already at the
// name is unlinked first, so a write never lands in an inode that another name reaches (a hard link
// planted at a predictable name, pointing outside the checkpoint); a symbolic link there is refused
// (ELOOP) and left alone. Returns the descriptor, or -1 with errno set. Async-signal-safe.
int CreateFreshFile(const char* path, int flags, mode_t mode);
// Sets the file's size to `bytes`; with `reserve`, also allocates every block now, so that a full
// file system (/dev/shm) is ResourceExhausted here rather than a SIGBUS when the pages are touched.
Status SizeSharedFile(int fd, uint64_t bytes, bool reserve, const std::string& what);

// A file's identity and size (fstat), to tell one inode at a path from the next.
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t size = 0;
};
Result<FileIdentity> IdentifyFile(int fd, const std::string& what);

}  // namespace lifeline

#endif  // LIFELINE_INTERNAL_SHARED_MEMORY_H_
