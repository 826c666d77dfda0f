#include "lib/src/env/s3_env.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace lifeline {
namespace {

constexpr uint64_t kMinPartBytes = 5ull << 20;  // S3's smallest part but the last
constexpr int kMaxParts = 10000;                // S3's most parts in one upload
constexpr uint64_t kMaxRenameBytes = 64ull << 20;

std::string At(uint64_t offset) { return " at offset " + std::to_string(offset); }

// What an S3Env path is, relative to the Env's root.
struct Resolved {
  S3Location loc;
  bool above_root = false;  // the root's bucket or a prefix of the root: directories, nothing to do
};

class S3EnvImpl;

class S3WritableFile final : public WritableFile {
 public:
  S3WritableFile(std::shared_ptr<S3Client> client, S3Location loc, std::string path, uint64_t part_bytes)
      : client_(std::move(client)), loc_(std::move(loc)), path_(std::move(path)), part_bytes_(part_bytes) {}

  ~S3WritableFile() override {
    if (!closed_) AbortUpload();
  }

  Status WriteAt(uint64_t offset, const void* src, size_t n) override {
    if (n == 0) return Status::OK();
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return Status::FailedPrecondition(path_, "write after Close");
    if (!failed_.ok()) return failed_;
    for (const auto& [begin, end] : uploaded_) {
      if (offset < end && begin < offset + n)
        return Status::InvalidArgument(path_ + At(offset), "overlaps bytes already uploaded as a part");
    }
    size_ = std::max(size_, offset + n);
    const int part = static_cast<int>(offset / part_bytes_) + 1;
    const bool direct = n >= part_bytes_ && offset + n <= hold_from_ && part <= kMaxParts;
    if (!direct) {
      // Copied, sent at Close. Overlaps between copied extents: the later write wins, as in a file.
      pending_[offset].assign(static_cast<const char*>(src), n);
      return Status::OK();
    }
    if (upload_id_.empty()) {
      Result<std::string> id = client_->CreateMultipartUpload(loc_.bucket, loc_.key);
      if (!id.ok()) return failed_ = id.status().Annotate(path_);
      upload_id_ = *id;
    }
    const std::string upload_id = upload_id_;
    uploaded_.emplace_back(offset, offset + n);  // claimed before the lock is let go
    lock.unlock();
    Result<std::string> etag = client_->UploadPart(loc_.bucket, loc_.key, upload_id, part, src, n);
    lock.lock();
    if (!etag.ok()) {
      if (failed_.ok()) failed_ = etag.status().Annotate(path_ + At(offset));
      return failed_;
    }
    parts_[part] = *etag;
    return Status::OK();
  }

  Status Truncate(uint64_t size) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::FailedPrecondition(path_, "truncate after Close");
    for (const auto& [begin, end] : uploaded_) {
      if (end > size)
        return Status::NotSupported(path_, "cannot truncate to " + std::to_string(size) + " bytes: bytes up to " +
                                               std::to_string(end) + " were already uploaded as a part");
    }
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->first >= size) {
        it = pending_.erase(it);
        continue;
      }
      if (it->first + it->second.size() > size) it->second.resize(size - it->first);
      ++it;
    }
    size_ = size;
    return Status::OK();
  }

  Status Allocate(uint64_t size) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!uploaded_.empty()) return Status::OK();  // too late to change the part size
    part_bytes_ = std::max(part_bytes_, (size + kMaxParts - 1) / kMaxParts);
    hold_from_ = size > kDirectIoAlignment ? size - kDirectIoAlignment : 0;
    return Status::OK();
  }

  Status Sync() override {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

  Status Close() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Status::OK();
    closed_ = true;
    Status s = failed_.ok() ? Finish() : failed_;
    if (!s.ok()) AbortUpload();
    return s;
  }

  const std::string& path() const override { return path_; }

 private:
  // Bytes [begin, end) from the copied extents, zeros where nothing was written (as a file's hole).
  std::string Assemble(uint64_t begin, uint64_t end) const {
    std::string out(end - begin, '\0');
    auto it = pending_.upper_bound(begin);
    if (it != pending_.begin()) --it;
    for (; it != pending_.end() && it->first < end; ++it) {
      const uint64_t b = std::max(begin, it->first);
      const uint64_t e = std::min(end, it->first + it->second.size());
      if (b < e) std::memcpy(out.data() + (b - begin), it->second.data() + (b - it->first), e - b);
    }
    return out;
  }

  // REQUIRES: mu_ held.
  Status Finish() {
    if (upload_id_.empty() && size_ <= 4 * part_bytes_) {
      const std::string body = Assemble(0, size_);
      return client_->PutObject(loc_.bucket, loc_.key, body).Annotate(path_);
    }
    if (upload_id_.empty()) {
      LL_ASSIGN_OR_RETURN(upload_id_, client_->CreateMultipartUpload(loc_.bucket, loc_.key));
    }
    // The bytes between uploaded parts go up as parts of their own: each at least part_bytes long
    // (a gap is cut into pieces of part_bytes, the remainder joining the last piece), and numbered
    // by where it starts, like the direct parts, so the numbers grow with the offset.
    std::vector<std::pair<uint64_t, uint64_t>> uploaded = uploaded_;
    std::sort(uploaded.begin(), uploaded.end());
    std::vector<std::pair<uint64_t, uint64_t>> gaps;
    uint64_t at = 0;
    for (const auto& [begin, end] : uploaded) {
      if (begin > at) gaps.emplace_back(at, begin);
      at = std::max(at, end);
    }
    if (size_ > at) gaps.emplace_back(at, size_);
    for (const auto& [begin, end] : gaps) {
      const bool last = end == size_;
      if (end - begin < kMinPartBytes && !last)
        return Status::NotSupported(path_ + At(begin), std::to_string(end - begin) +
                                                           " bytes written in pieces smaller than a part lie between "
                                                           "uploaded parts (S3 parts but the last are at least 5 MiB)");
      for (uint64_t piece = begin; piece < end;) {
        uint64_t piece_end = std::min(end, piece + part_bytes_);
        if (end - piece_end < part_bytes_) piece_end = end;  // no short piece in the middle
        const int part = static_cast<int>(piece / part_bytes_) + 1;
        if (part > kMaxParts || parts_.count(part))
          return Status::NotSupported(path_ + At(piece), "no part number left for these bytes (more than 10000 parts)");
        const std::string body = Assemble(piece, piece_end);
        LL_ASSIGN_OR_RETURN(std::string etag,
                            client_->UploadPart(loc_.bucket, loc_.key, upload_id_, part, body.data(), body.size()));
        parts_[part] = std::move(etag);
        piece = piece_end;
      }
    }
    std::vector<S3CompletedPart> parts;
    parts.reserve(parts_.size());
    for (const auto& [number, etag] : parts_) parts.push_back(S3CompletedPart{number, etag});
    Status s = client_->CompleteMultipartUpload(loc_.bucket, loc_.key, upload_id_, parts).Annotate(path_);
    if (s.ok()) upload_id_.clear();
    return s;
  }

  void AbortUpload() {
    if (upload_id_.empty()) return;
    client_->AbortMultipartUpload(loc_.bucket, loc_.key, upload_id_).IgnoreError();
    upload_id_.clear();
  }

  const std::shared_ptr<S3Client> client_;
  const S3Location loc_;
  const std::string path_;

  std::mutex mu_;
  uint64_t part_bytes_;                                 // GUARDED_BY(mu_)
  uint64_t hold_from_ = ~0ull;                          // GUARDED_BY(mu_): writes reaching past it are copied
  uint64_t size_ = 0;                                   // GUARDED_BY(mu_)
  std::string upload_id_;                               // GUARDED_BY(mu_)
  std::vector<std::pair<uint64_t, uint64_t>> uploaded_; // GUARDED_BY(mu_): [begin, end) sent as parts
  std::map<int, std::string> parts_;                    // GUARDED_BY(mu_): part number -> ETag
  std::map<uint64_t, std::string> pending_;             // GUARDED_BY(mu_): copied writes by offset
  Status failed_;                                       // GUARDED_BY(mu_): the first failure
  bool closed_ = false;                                 // GUARDED_BY(mu_)
};

class S3RandomAccessFile final : public RandomAccessFile {
 public:
  S3RandomAccessFile(std::shared_ptr<S3Client> client, S3Location loc, std::string path, uint64_t size)
      : client_(std::move(client)), loc_(std::move(loc)), path_(std::move(path)), size_(size) {}

  Status ReadAt(uint64_t offset, void* dst, size_t n) const override {
    if (offset > size_ || n > size_ - offset)
      return Status::Corruption(path_ + At(offset), "short read: wanted " + std::to_string(n) + " bytes of an object of " +
                                                        std::to_string(size_));
    return client_->GetObjectRange(loc_.bucket, loc_.key, offset, dst, n);
  }
  Result<uint64_t> Size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  const std::shared_ptr<S3Client> client_;
  const S3Location loc_;
  const std::string path_;
  const uint64_t size_;
};

class S3FileLock final : public FileLock {
 public:
  S3FileLock(std::shared_ptr<S3Client> client, S3Location loc, std::string path)
      : client_(std::move(client)), loc_(std::move(loc)), path_(std::move(path)) {}
  ~S3FileLock() override { client_->DeleteObject(loc_.bucket, loc_.key).IgnoreError(); }
  Status SetHolder(std::string_view text) override {
    return client_->PutObject(loc_.bucket, loc_.key, text).Annotate(path_);
  }
  const std::string& path() const override { return path_; }

 private:
  const std::shared_ptr<S3Client> client_;
  const S3Location loc_;
  const std::string path_;
};

class S3EnvImpl final : public S3Env {
 public:
  S3EnvImpl(std::shared_ptr<S3Client> client, S3Location root, const S3EnvOptions& options)
      : client_(std::move(client)), root_(std::move(root)), options_(options) {}

  S3Client* client() const override { return client_.get(); }
  const S3Location& root() const override { return root_; }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path, const FileOptions&) override {
    LL_ASSIGN_OR_RETURN(S3Location loc, Object(path));
    return std::unique_ptr<WritableFile>(new S3WritableFile(client_, std::move(loc), path, options_.part_bytes));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path, const FileOptions&) override {
    LL_ASSIGN_OR_RETURN(S3Location loc, Object(path));
    LL_ASSIGN_OR_RETURN(S3ObjectInfo info, client_->HeadObject(loc.bucket, loc.key));
    return std::unique_ptr<RandomAccessFile>(new S3RandomAccessFile(client_, std::move(loc), path, info.size));
  }

  Status CreateDir(const std::string& path) override { return Resolve(path).status(); }
  Status SyncDir(const std::string& path) override { return Resolve(path).status(); }

  Status RemoveFile(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(S3Location loc, Object(path));
    LL_RETURN_IF_ERROR(client_->HeadObject(loc.bucket, loc.key).status());
    return client_->DeleteObject(loc.bucket, loc.key);
  }

  Status RemoveDir(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
    LL_ASSIGN_OR_RETURN(S3Listing page, client_->ListObjectsPage(r.loc.bucket, DirPrefix(r.loc), "/", "", 1));
    if (!page.objects.empty() || !page.common_prefixes.empty())
      return Status::FailedPrecondition(path, "directory not empty");
    return Status::OK();
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    LL_ASSIGN_OR_RETURN(S3Location src, Object(from));
    LL_ASSIGN_OR_RETURN(S3Location dst, Object(to));
    LL_RETURN_IF_ERROR(client_->CopyObject(src.bucket, src.key, dst.key));
    return client_->DeleteObject(src.bucket, src.key);
  }

  Status RenameFileNoReplace(const std::string& from, const std::string& to) override {
    LL_ASSIGN_OR_RETURN(S3Location src, Object(from));
    LL_ASSIGN_OR_RETURN(S3Location dst, Object(to));
    Result<std::string> bytes = client_->GetObject(src.bucket, src.key, kMaxRenameBytes);
    if (bytes.status().code() == StatusCode::kResourceExhausted)
      return Status::NotSupported(from, "renaming without replacing is done by a conditional PUT of at most 64 MiB");
    LL_RETURN_IF_ERROR(bytes.status());
    LL_RETURN_IF_ERROR(CreateObject(dst, *bytes));
    return client_->DeleteObject(src.bucket, src.key);
  }

  Result<std::vector<std::string>> GetChildren(const std::string& dir) override {
    LL_ASSIGN_OR_RETURN(Resolved r, Resolve(dir));
    const std::string prefix = DirPrefix(r.loc);
    LL_ASSIGN_OR_RETURN(S3Listing listing, client_->ListObjects(r.loc.bucket, prefix, "/"));
    // The listing's keys all start with `prefix` (DecodeObjectListing refuses others). A child is
    // one path component: "dir/" markers of other tools name nothing, and a key named "." or ".."
    // (legal in S3) or holding a "/" below the delimiter is no child a path could name.
    std::set<std::string> names;
    auto add = [&names](std::string name) {
      while (!name.empty() && name.back() == '/') name.pop_back();
      if (!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos)
        names.insert(std::move(name));
    };
    for (const S3ObjectInfo& o : listing.objects) add(o.key.substr(prefix.size()));
    for (const std::string& p : listing.common_prefixes) add(p.substr(prefix.size()));
    return std::vector<std::string>(names.begin(), names.end());
  }

  bool FileExists(const std::string& path) override {
    Result<EntryType> t = GetEntryType(path);
    return t.ok();
  }

  bool IsDirectory(const std::string& path) override {
    Result<EntryType> t = GetEntryType(path);
    return t.ok() && *t == EntryType::kDirectory;
  }

  Result<EntryType> GetEntryType(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
    if (r.above_root || r.loc.key.empty()) return EntryType::kDirectory;  // the bucket: never an object
    Result<S3ObjectInfo> head = client_->HeadObject(r.loc.bucket, r.loc.key);
    if (head.ok()) return EntryType::kFile;
    if (!head.status().IsNotFound()) return head.status();
    if (r.loc.key == root_.key) return EntryType::kDirectory;  // the root exists, if only as a name
    LL_ASSIGN_OR_RETURN(S3Listing page, client_->ListObjectsPage(r.loc.bucket, DirPrefix(r.loc), "/", "", 1));
    if (!page.objects.empty() || !page.common_prefixes.empty()) return EntryType::kDirectory;
    return Status::NotFound(path);
  }

  Status RemoveTree(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
    if (r.above_root) return Status::InvalidArgument(path, "is above the Env's root " + root_.ToString());
    LL_ASSIGN_OR_RETURN(S3Listing listing, client_->ListObjects(r.loc.bucket, DirPrefix(r.loc), ""));
    std::vector<std::string> keys;
    keys.reserve(listing.objects.size() + 1);
    for (const S3ObjectInfo& o : listing.objects) keys.push_back(o.key);
    if (!r.loc.key.empty()) keys.push_back(r.loc.key);  // the path itself, if it is an object
    std::atomic<size_t> next{0};
    std::mutex mu;
    Status first;
    auto worker = [&] {
      for (size_t i; (i = next.fetch_add(1)) < keys.size();) {
        Status s = client_->DeleteObject(r.loc.bucket, keys[i]);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first.ok()) first = s;
        }
      }
    };
    const size_t threads = std::min<size_t>(std::max(1u, options_.delete_threads), keys.size());
    std::vector<std::thread> pool;
    for (size_t i = 1; i < threads; ++i) pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();
    return first.ok() ? Status::OK() : first.Annotate("removing " + path);
  }

  Result<uint64_t> GetFileSize(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(S3Location loc, Object(path));
    LL_ASSIGN_OR_RETURN(S3ObjectInfo info, client_->HeadObject(loc.bucket, loc.key));
    return info.size;
  }

  Result<std::unique_ptr<IoQueue>> NewIoQueue(const IoQueueOptions& options) override {
    IoQueueOptions o = options;
    o.threads = std::max(o.threads, std::min(std::max(1u, o.depth), 16u));
    return NewThreadPoolIoQueue(o);
  }

  Result<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(S3Location loc, Object(path));
    // Created holding a token of this claim (a line the holder's decoder passes over), so that a
    // claim whose answer was lost and whose retry found the object is known to be ours.
    std::random_device random;
    char token[64];
    std::snprintf(token, sizeof token, "claim=%08x%08x%08x%08x\n", random(), random(), random(), random());
    Status s = CreateObject(loc, token);
    if (s.IsAlreadyExists()) {
      Result<std::optional<std::string>> holder = LockHolder(path);
      std::string text = holder.ok() && holder->has_value() ? **holder : std::string("unknown");
      return Status::Unavailable(path, "locked by another holder: " + text);
    }
    LL_RETURN_IF_ERROR(s);
    return std::unique_ptr<FileLock>(new S3FileLock(client_, std::move(loc), path));
  }

  Result<std::optional<std::string>> LockHolder(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(S3Location loc, Object(path));
    Result<std::string> text = client_->GetObject(loc.bucket, loc.key, 1 << 20);
    if (text.status().IsNotFound()) return std::optional<std::string>();
    LL_RETURN_IF_ERROR(text.status());
    return std::optional<std::string>(std::move(*text));
  }

  Status PutFile(const std::string& path, std::string_view data, bool replace) override {
    LL_ASSIGN_OR_RETURN(S3Location loc, Object(path));
    return replace ? client_->PutObject(loc.bucket, loc.key, data) : CreateObject(loc, data);
  }

  Result<size_t> AbortIncompleteWrites(const std::string& path) override { return AbortIncompleteUploads(path); }

  Result<size_t> AbortIncompleteUploads(const std::string& path) override {
    LL_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
    if (r.above_root) r.loc = root_;
    LL_ASSIGN_OR_RETURN(std::vector<S3MultipartUpload> uploads, client_->ListMultipartUploads(r.loc.bucket, r.loc.key));
    size_t aborted = 0;
    const std::string below = DirPrefix(r.loc);
    for (const S3MultipartUpload& u : uploads) {
      if (u.key != r.loc.key && u.key.rfind(below, 0) != 0) continue;  // "a/bc" is not below "a/b"
      LL_RETURN_IF_ERROR(client_->AbortMultipartUpload(r.loc.bucket, u.key, u.upload_id));
      ++aborted;
    }
    return aborted;
  }

 private:
  // A conditional create (If-None-Match: *) that tells a key taken by another writer from one
  // taken by an earlier attempt of this very call, whose answer was lost (a stalled or cut
  // connection: the store carried the PUT out, the retry found the key): AlreadyExists only when
  // the object holds other bytes than `data`.
  Status CreateObject(const S3Location& loc, std::string_view data) {
    Status s = client_->PutObject(loc.bucket, loc.key, data, /*if_none_match=*/true);
    if (!s.IsAlreadyExists()) return s;
    Result<std::string> held = client_->GetObject(loc.bucket, loc.key, data.size() + 1);
    return held.ok() && *held == data ? Status::OK() : s;
  }

  // The key prefix of the objects below `loc` ("" for the bucket itself).
  static std::string DirPrefix(const S3Location& loc) { return loc.key.empty() ? std::string() : loc.key + "/"; }

  Result<Resolved> Resolve(const std::string& path) const {
    LL_ASSIGN_OR_RETURN(S3Location loc, ParseS3Path(path));
    Resolved r;
    const bool same_bucket = loc.bucket == root_.bucket;
    const bool inside = root_.key.empty() || loc.key == root_.key || loc.key.rfind(root_.key + "/", 0) == 0;
    r.above_root = same_bucket && loc.key != root_.key &&
                   (loc.key.empty() || root_.key.rfind(loc.key + "/", 0) == 0);
    if (!same_bucket || (!inside && !r.above_root))
      return Status::InvalidArgument(path, "is outside " + root_.ToString() + ", the only prefix this Env may touch");
    r.loc = std::move(loc);
    return r;
  }

  // An object strictly inside the root.
  Result<S3Location> Object(const std::string& path) const {
    LL_ASSIGN_OR_RETURN(Resolved r, Resolve(path));
    if (r.above_root || r.loc.key.empty() || r.loc.key == root_.key)
      return Status::InvalidArgument(path, "names a directory of " + root_.ToString() + ", not an object below it");
    return std::move(r.loc);
  }

  const std::shared_ptr<S3Client> client_;
  const S3Location root_;
  const S3EnvOptions options_;
};

}  // namespace

Result<std::unique_ptr<S3Env>> S3Env::Open(std::shared_ptr<S3Client> client, const S3EnvOptions& options) {
  if (client == nullptr) return Status::InvalidArgument("S3 Env", "no client");
  LL_ASSIGN_OR_RETURN(S3Location root, ParseS3Path(options.root));
  if (options.part_bytes < kMinPartBytes)
    return Status::InvalidArgument("S3 Env for " + options.root, "part_bytes below S3's minimum of 5 MiB");
  return std::unique_ptr<S3Env>(new S3EnvImpl(std::move(client), std::move(root), options));
}

}  // namespace lifeline
