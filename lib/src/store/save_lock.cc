#include "lib/src/store/save_lock.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include "lib/src/store/checkpoint_layout.h"

namespace lifeline {

namespace {

std::string ThisHost() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// Keeps a value on its line.
std::string OneLine(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

// Whether the holder named by a lock that outlives its holder (an object store's lock object) has
// ended, as far as can be told: a process of this host that is gone, or an earlier launch of the job
// this process belongs to (lifeline-agent ends every rank of a launch before it starts the next,
// so a launch id of the same job that is not ours names a launch that is over).
bool ObjectLockIsStale(const SaveLockHolder& holder, const std::string& run_id) {
  if (holder.run_id == run_id) return false;
  if (holder.host == ThisHost() && holder.pid > 0 && ::kill(static_cast<pid_t>(holder.pid), 0) != 0 && errno == ESRCH)
    return true;
  const char* job = std::getenv("LIFELINE_JOB");
  return job != nullptr && *job != '\0' && holder.job == job;
}

}  // namespace

std::string SaveLockHolder::Describe() const {
  std::string out = "launch '" + run_id + "' (pid " + std::to_string(pid) + " on host " + host;
  if (since_unix > 0) {
    const std::time_t t = static_cast<std::time_t>(since_unix);
    std::tm tm = {};
    char buf[32];
    if (::gmtime_r(&t, &tm) != nullptr && std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm) > 0)
      out += std::string(", since ") + buf;
  }
  return out + ")";
}

std::string EncodeSaveLockHolder(const SaveLockHolder& holder) {
  return "run_id=" + OneLine(holder.run_id) + "\njob=" + OneLine(holder.job) + "\nhost=" + OneLine(holder.host) +
         "\npid=" + std::to_string(holder.pid) + "\nsince=" + std::to_string(holder.since_unix) + "\n";
}

SaveLockHolder DecodeSaveLockHolder(const std::string& text) {
  SaveLockHolder h;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "run_id") h.run_id = value;
    if (key == "job") h.job = value;
    if (key == "host") h.host = value;
    if (key == "pid") h.pid = std::strtoll(value.c_str(), nullptr, 10);
    if (key == "since") h.since_unix = std::strtoll(value.c_str(), nullptr, 10);
  }
  return h;
}

Result<std::optional<SaveLockHolder>> FindSaveLockHolder(Env* env, const std::string& dir) {
  Result<std::optional<std::string>> text = env->LockHolder(JoinPath(dir, kSaveLockFileName));
  if (text.status().IsNotSupported()) return std::optional<SaveLockHolder>();
  LL_RETURN_IF_ERROR(text.status());
  if (!text->has_value()) return std::optional<SaveLockHolder>();
  return std::optional<SaveLockHolder>(DecodeSaveLockHolder(**text));
}

Status DirectoryInUse(const std::string& dir, const SaveLockHolder& holder) {
  if (holder.pid == static_cast<int64_t>(::getpid()) && holder.host == ThisHost())
    return Status::FailedPrecondition(
        dir, "is being saved into by another Checkpointer of this process, " + holder.Describe() +
                 ", of another launch: close it first, or give both the same run_id");
  const std::string who = holder.run_id.empty() ? std::string("another process (it has not said which launch yet)")
                                                : "another job, " + holder.Describe();
  return Status::FailedPrecondition(
      dir, "is being saved into by " + who +
               ": two jobs saving into one directory overwrite each other's steps; give this job a directory of "
               "its own, or stop the other one" +
               (IsObjectStorePath(dir)
                    ? " (the lock is the object " + JoinPath(dir, kSaveLockFileName) +
                          ", deleted when that job closes its Checkpointer; if that job died, delete the object)"
                    : std::string(" (the lock is ") + kSaveLockFileName + ", held until that process ends)"));
}

Result<std::unique_ptr<SaveLock>> SaveLock::Claim(Env* env, const std::string& dir, const std::string& run_id,
                                                  uint32_t rank) {
  const std::string path = JoinPath(dir, kSaveLockFileName);
  // An object store's lock is an object: it outlives a holder that dies (formats/SPEC.md §18).
  const bool object_store = IsObjectStorePath(dir);
  if (rank != 0) {
    // Rank 0 of this launch may not have taken it yet, or not written its name: only a lock that
    // names another launch, by a process that is alive as far as this host can tell, refuses.
    LL_ASSIGN_OR_RETURN(std::optional<SaveLockHolder> holder, FindSaveLockHolder(env, dir));
    const bool gone = holder && holder->host == ThisHost() && holder->pid > 0 &&
                      ::kill(static_cast<pid_t>(holder->pid), 0) != 0 && errno == ESRCH;
    const bool ended = holder && object_store && ObjectLockIsStale(*holder, run_id);
    if (holder && !gone && !ended && !holder->run_id.empty() && holder->run_id != run_id)
      return DirectoryInUse(dir, *holder);
    return std::unique_ptr<SaveLock>(new SaveLock(nullptr));
  }
  Result<std::unique_ptr<FileLock>> lock = env->LockFile(path);
  for (int attempt = 0; lock.status().IsUnavailable() && attempt < 3; ++attempt) {
    LL_ASSIGN_OR_RETURN(std::optional<SaveLockHolder> holder, FindSaveLockHolder(env, dir));
    if (holder) {
      // Another Checkpointer of this very launch (in this process) holds it.
      if (holder->run_id == run_id) return std::unique_ptr<SaveLock>(new SaveLock(nullptr));
      if (!object_store || !ObjectLockIsStale(*holder, run_id)) return DirectoryInUse(dir, *holder);
      // A lock object left by a launch that has ended: removed, then taken by a conditional create,
      // so that of several claimants only one wins it.
      Status removed = env->RemoveFile(path);
      if (!removed.ok() && !removed.IsNotFound()) return removed;
    }
    lock = env->LockFile(path);  // let go meanwhile
  }
  if (lock.status().IsNotSupported()) return std::unique_ptr<SaveLock>(new SaveLock(nullptr));
  LL_RETURN_IF_ERROR(lock.status());
  const char* job = std::getenv("LIFELINE_JOB");
  SaveLockHolder me{run_id, job != nullptr ? job : "", ThisHost(), static_cast<int64_t>(::getpid()),
                    static_cast<int64_t>(std::time(nullptr))};
  LL_RETURN_IF_ERROR((*lock)->SetHolder(EncodeSaveLockHolder(me)));
  return std::unique_ptr<SaveLock>(new SaveLock(std::move(*lock)));
}

}  // namespace lifeline
