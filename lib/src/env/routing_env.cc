// Env::Routing(): local paths to the POSIX Env, s3:// paths to an S3Env per bucket over one S3 client
// of the process, created at the first s3:// path from the standard AWS settings.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "lib/src/env/s3_client.h"
#include "lib/src/env/s3_env.h"
#include "lib/src/env/s3_url.h"
#include "lifeline/env.h"

namespace lifeline {
namespace {

// Threads of the object store's queue: each request is one HTTP transfer, waiting on the network.
constexpr unsigned kObjectQueueThreads = 16;

bool OnObjectStore(const IoRequest& r) {
  const std::string& path = r.kind == IoRequest::Kind::kWrite ? r.writer->path() : r.reader->path();
  return IsObjectStorePath(path);
}

// Sends each request to the engine of its file: local files to the POSIX queue (io_uring when
// allowed), made at once, so that engine() and RegisterBuffers answer as that queue does; objects
// to a thread pool, made at their first request. Used by one thread at a time, as every IoQueue.
class RoutingIoQueue final : public IoQueue {
 public:
  RoutingIoQueue(const IoQueueOptions& options, std::unique_ptr<IoQueue> files)
      : options_(options), files_(std::move(files)) {}

  Status Submit(const IoRequest& request) override {
    if (request.kind == IoRequest::Kind::kWrite ? request.writer == nullptr : request.reader == nullptr)
      return Status::InvalidArgument("io queue", "request without a file");
    if (in_flight() >= depth())
      return Status::ResourceExhausted("io queue", "all " + std::to_string(depth()) + " slots are in flight");
    if (!OnObjectStore(request)) return files_->Submit(request);
    if (objects_ == nullptr) {
      IoQueueOptions o = options_;
      o.threads = std::max(o.threads, std::min(std::max(1u, o.depth), kObjectQueueThreads));
      objects_ = NewThreadPoolIoQueue(o);
    }
    IoRequest r = request;
    r.buffer_index = -1;  // registration is the local engine's
    return objects_->Submit(r);
  }

  Status Reap(size_t min_completions, std::vector<IoCompletion>* out) override {
    const size_t target = std::min(min_completions, in_flight());
    const size_t before = out->size();
    const size_t local = files_->in_flight(), remote = objects_ ? objects_->in_flight() : 0;
    // The common case: one engine busy, which waits itself.
    if (remote == 0 && local > 0) return files_->Reap(target, out);
    if (local == 0 && remote > 0) return objects_->Reap(target, out);
    if (local == 0 && remote == 0) return Status::OK();
    for (auto pause = std::chrono::microseconds(50);;) {
      LL_RETURN_IF_ERROR(files_->Reap(0, out));
      LL_RETURN_IF_ERROR(objects_->Reap(0, out));
      if (out->size() - before >= target) return Status::OK();
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
  }

  size_t in_flight() const override { return files_->in_flight() + (objects_ ? objects_->in_flight() : 0); }
  unsigned depth() const override { return std::max(1u, options_.depth); }
  // The local engine's name: objects always go through threads.
  const char* engine() const override { return files_->engine(); }
  Status RegisterBuffers(const std::vector<std::pair<void*, size_t>>& regions) override {
    return files_->RegisterBuffers(regions);
  }

 private:
  const IoQueueOptions options_;
  const std::unique_ptr<IoQueue> files_;  // the POSIX engine
  std::unique_ptr<IoQueue> objects_;      // the thread pool for objects
};

class RoutingEnv final : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path, const FileOptions& options) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->NewWritableFile(path, options);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                const FileOptions& options) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->NewRandomAccessFile(path, options);
  }
  Status CreateDir(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->CreateDir(path);
  }
  Status RemoveFile(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->RemoveFile(path);
  }
  Status RemoveDir(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->RemoveDir(path);
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    LL_ASSIGN_OR_RETURN(Env * env, ForBoth(from, to));
    return env->RenameFile(from, to);
  }
  Status RenameFileNoReplace(const std::string& from, const std::string& to) override {
    LL_ASSIGN_OR_RETURN(Env * env, ForBoth(from, to));
    return env->RenameFileNoReplace(from, to);
  }
  Result<std::vector<std::string>> GetChildren(const std::string& dir) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(dir));
    return env->GetChildren(dir);
  }
  bool FileExists(const std::string& path) override {
    Result<Env*> env = For(path);
    return env.ok() && (*env)->FileExists(path);
  }
  bool IsDirectory(const std::string& path) override {
    Result<Env*> env = For(path);
    return env.ok() && (*env)->IsDirectory(path);
  }
  Result<EntryType> GetEntryType(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->GetEntryType(path);
  }
  Status RemoveTree(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->RemoveTree(path);
  }
  Result<uint64_t> GetFileSize(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->GetFileSize(path);
  }
  Status SyncDir(const std::string& dir) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(dir));
    return env->SyncDir(dir);
  }
  Result<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) override {
    LL_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> files, Env::Default()->NewIoQueue(options));
    return std::unique_ptr<IoQueue>(new RoutingIoQueue(options, std::move(files)));
  }
  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->LockFile(path);
  }
  Result<std::optional<std::string>> LockHolder(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->LockHolder(path);
  }
  Status PutFile(const std::string& path, std::string_view data, bool replace) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->PutFile(path, data, replace);
  }
  Result<size_t> AbortIncompleteWrites(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Env * env, For(path));
    return env->AbortIncompleteWrites(path);
  }

 private:
  Result<Env*> For(const std::string& path) {
    if (!IsObjectStorePath(path)) return Env::Default();
    LL_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
    std::lock_guard<std::mutex> lock(mu_);
    if (client_ == nullptr) {
      // Not remembered when it fails: the settings may be put right (exported) later in the process.
      Result<S3ClientOptions> options = S3ClientOptions::LoadFromEnvironment();
      Result<std::unique_ptr<S3Client>> client =
          options.ok() ? S3Client::Create(std::move(*options)) : Result<std::unique_ptr<S3Client>>(options.status());
      if (!client.ok()) return client.status().Annotate("object storage for " + path);
      client_ = std::move(*client);
    }
    std::unique_ptr<S3Env>& env = buckets_[loc.bucket];
    if (env == nullptr) {
      S3EnvOptions o;
      o.root = S3Location{loc.bucket, ""}.ToString();
      LL_ASSIGN_OR_RETURN(env, S3Env::Open(client_, o));
    }
    return static_cast<Env*>(env.get());
  }

  Result<Env*> ForBoth(const std::string& from, const std::string& to) {
    LL_ASSIGN_OR_RETURN(Env * a, For(from));
    LL_ASSIGN_OR_RETURN(Env * b, For(to));
    if (a != b) return Status::NotSupported(from, "cannot be renamed to " + to + ", which lies on another store");
    return a;
  }

  std::mutex mu_;
  std::shared_ptr<S3Client> client_;                      // GUARDED_BY(mu_)
  std::map<std::string, std::unique_ptr<S3Env>> buckets_;  // GUARDED_BY(mu_); never erased
};

}  // namespace

Env* Env::Routing() {
  static Env* const env = new RoutingEnv();  // never deleted, as Default()
  return env;
}

}  // namespace lifeline
