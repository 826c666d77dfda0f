// One launch saves into a checkpoint directory at a time. Two jobs given the same directory would
// otherwise write the same step names: the second one's saves fail AlreadyExists wherever the
// first committed first, its final state is never saved, and retention of either may remove what
// the other still needs.
//
// The save lock is <dir>/lifeline.lock, an exclusive lock (Env::LockFile) taken by rank 0 of the
// launch at its first save and held until its Checkpointer closes or its process dies (the kernel
// drops it: a crashed job never leaves a stale lock). The file's text names the holder: launch id,
// host, pid, since when. The other ranks check at their first save that no other launch holds it.
// Envs without locks (the in-memory Env of the tests) skip all of this.
//
// In an object store (an s3:// directory) the lock is an object created only if absent, deleted when
// the Checkpointer closes; a holder that dies leaves it behind. There a lock is stale, and is
// removed and taken again (by a conditional create, so one claimant wins), when its holder is a
// process of this host that is gone, or another launch of this process's job (LIFELINE_JOB: the
// agent ends every rank of a launch before it starts the next). A lock left by another job that
// died elsewhere refuses saves until someone deletes it; the refusal names the object and holder.
//
// Thread safety: the functions share no state; a SaveLock is used by its Checkpointer's caller.
#ifndef LIFELINE_SRC_SAVE_LOCK_H_
#define LIFELINE_SRC_SAVE_LOCK_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

inline constexpr char kSaveLockFileName[] = "lifeline.lock";

// The launch holding a directory's save lock, as its text says.
struct SaveLockHolder {
  std::string run_id;  // CheckpointerOptions::run_id of that launch
  std::string job;     // LIFELINE_JOB of its process (lifeline-agent's job id); "" without an agent
  std::string host;
  int64_t pid = 0;
  int64_t since_unix = 0;  // seconds since the epoch when it took the lock

  // "launch 'ID' (pid P on host H, since 2026-11-26T21:04:05Z)".
  std::string Describe() const;
};

// The holder's text, one "key=value" per line.
std::string EncodeSaveLockHolder(const SaveLockHolder& holder);
// Tolerant: unknown keys and malformed lines are skipped (the text is informative, the lock is
// what excludes); a text without a run id gives an empty run_id.
SaveLockHolder DecodeSaveLockHolder(const std::string& text);

// Who holds the save lock of `dir` now; nullopt when nobody does (or the Env has no locks).
Result<std::optional<SaveLockHolder>> FindSaveLockHolder(Env* env, const std::string& dir);

class SaveLock {
 public:
  // What a rank does before its first save into `dir` as launch `run_id`: rank 0 takes the lock
  // (null when the Env has no locks), any other rank checks it. FailedPrecondition naming the
  // directory and the other launch when another launch holds it.
  static Result<std::unique_ptr<SaveLock>> Claim(Env* env, const std::string& dir, const std::string& run_id,
                                                 uint32_t rank);

 private:
  explicit SaveLock(std::unique_ptr<FileLock> lock) : lock_(std::move(lock)) {}
  std::unique_ptr<FileLock> lock_;  // null on ranks other than 0
};

// The refusal of a save into `dir` while `holder` is saving there.
Status DirectoryInUse(const std::string& dir, const SaveLockHolder& holder);

}  // namespace lifeline

#endif  // LIFELINE_SRC_SAVE_LOCK_H_
