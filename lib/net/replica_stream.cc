#include "lib/net/replica_stream.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "lib/net/socket.h"
#include "formats/checksum.h"
#include "lifeline/internal/shared_memory.h"

namespace lifeline::replication {
namespace {

constexpr char kMagic[8] = {'L', 'L', 'R', 'E', 'P', 'L', '0', '1'};
constexpr uint32_t kMaxFiles = 1024;
constexpr uint64_t kMaxChunk = 256ull << 20;
constexpr uint64_t kMaxFileBytes = 1ull << 40;

struct StreamHeader {
  char magic[8];
  uint32_t dir_size;
  uint32_t file_count;
};

struct FileHeader {
  uint32_t name_size;
  uint32_t reserved;
  uint64_t bytes;
};

struct ChunkHeader {
  uint64_t bytes;
};

// Follows the chunk's bytes: the sender checksums each piece as it sends it, while the piece is
// still in its cache, and the receiver as it lands (one pass over memory on each side, not two).
struct ChunkTrailer {
  uint64_t checksum;  // XXH3-64 of the chunk
};

// What is checksummed and sent (or received and checksummed) at a time.
constexpr uint64_t kPieceBytes = 256 << 10;

struct Ack {
  char code;  // 'K': every file placed; 'E': refused, the reason follows
  char reserved[3];
  uint32_t reason_size;
};

// The layout of formats/SPEC.md §16: these structs go on the wire as they are, in the host's byte
// order, which the spec fixes as little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the replica stream is little-endian");
static_assert(sizeof(StreamHeader) == 16 && sizeof(FileHeader) == 16 && sizeof(ChunkHeader) == 8 &&
              sizeof(ChunkTrailer) == 8 && sizeof(Ack) == 8);

double SecondsSince(net::Clock::time_point t) {
  return std::chrono::duration<double>(net::Clock::now() - t).count();
}

Status SendString(int fd, const std::string& s, const std::string& who) { return net::SendAll(fd, s.data(), s.size(), who); }

StreamReader FromSocket(int fd, std::string who) {
  return [fd, who = std::move(who)](void* out, size_t n) { return net::RecvAll(fd, out, n, who); };
}

Result<std::string> RecvString(const StreamReader& read, uint32_t size, uint32_t max, const std::string& who) {
  if (size > max) return Status::Corruption(who, "a name of " + std::to_string(size) + " bytes");
  std::string s(size, '\0');
  LL_RETURN_IF_ERROR(read(s.data(), size));
  return s;
}

// Paces a sender to `rate` bytes per second from the moment it was made.
class Pacer {
 public:
  explicit Pacer(uint64_t rate) : rate_(rate), start_(net::Clock::now()) {}
  void Sent(uint64_t bytes) {
    if (rate_ == 0) return;
    sent_ += bytes;
    const double due = static_cast<double>(sent_) / static_cast<double>(rate_);
    const double ahead = due - SecondsSince(start_);
    if (ahead > 0) std::this_thread::sleep_for(std::chrono::duration<double>(ahead));
  }

 private:
  const uint64_t rate_;
  const net::Clock::time_point start_;
  uint64_t sent_ = 0;
};

// Whether the receiver has said something: before the end of a stream, only a refusal.
bool HasAnswer(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

Status ReadFull(int fd, uint8_t* out, uint64_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, path);
    if (r == 0) return Status::IOError(path, "shrank while being replicated");
    out += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return Status::OK();
}

Status WriteFull(int fd, const uint8_t* in, uint64_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, in, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::FromErrno(errno, path);
    in += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<uint64_t>(w);
  }
  return Status::OK();
}

Status SendFile(int fd, const ReplicaSendOptions& o, const ReplicaFile& f, const std::string& peer, Pacer* pacer,
                uint64_t* sent, bool* damage) {
  OwnedFd file(::open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.get() < 0) return Status::FromErrno(errno, f.path);
  struct stat st;
  if (fstat(file.get(), &st) != 0) return Status::FromErrno(errno, f.path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // Read a piece at a time into a buffer that stays in the cache: mapping the whole file would
  // cost a page-table entry per page to set up and tear down, more than the copy.
  std::vector<uint8_t> piece(kPieceBytes);
  const FileHeader h{static_cast<uint32_t>(f.name.size()), 0, size};
  LL_RETURN_IF_ERROR(net::SendAll(fd, &h, sizeof(h), peer));
  LL_RETURN_IF_ERROR(SendString(fd, f.name, peer));
  for (uint64_t off = 0; off < size;) {
    if (o.cancelled && o.cancelled()) return Status::Aborted("replica of " + f.path, "superseded");
    const uint64_t n = std::min(o.chunk_bytes, size - off);
    const ChunkHeader c{n};
    LL_RETURN_IF_ERROR(net::SendAll(fd, &c, sizeof(c), peer));
    format::StreamingChecksum sum;
    for (uint64_t p = 0; p < n; p += kPieceBytes) {
      const uint64_t k = std::min(kPieceBytes, n - p);
      LL_RETURN_IF_ERROR(ReadFull(file.get(), piece.data(), k, off + p, f.path));
      sum.Update(piece.data(), k);
      if (*damage && k > 0) {
        piece[k / 2] ^= 0x10;
        *damage = false;
      }
      LL_RETURN_IF_ERROR(net::SendAll(fd, piece.data(), k, peer));
    }
    const ChunkTrailer t{sum.Digest()};
    LL_RETURN_IF_ERROR(net::SendAll(fd, &t, sizeof(t), peer));
    off += n;
    *sent += n;
    if (HasAnswer(fd)) return Status::OK();  // refused already: the caller reads why
    pacer->Sent(n);
  }
  return Status::OK();
}

}  // namespace

bool IsReplicaName(const std::string& name) {
  if (name.empty() || name.size() > 255 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

Result<ReplicaTransfer> SendReplica(const ReplicaSendOptions& o, const std::string& dir,
                                    const std::vector<ReplicaFile>& files) {
  if (!IsReplicaName(dir)) return Status::InvalidArgument("replica directory '" + dir + "'", "not a plain name");
  if (files.size() > kMaxFiles) return Status::InvalidArgument("replica " + dir, "too many files");
  if (o.chunk_bytes == 0 || o.chunk_bytes > kMaxChunk) return Status::InvalidArgument("replica chunk size");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& name = files[i].name;
    if (!IsReplicaName(name)) return Status::InvalidArgument("replica file '" + name + "'", "not a plain name");
    for (size_t j = 0; j < i; ++j)
      if (files[j].name == name) return Status::InvalidArgument("replica file '" + name + "'", "named twice");
  }
  const auto start = net::Clock::now();
  const std::string peer = "replica receiver " + o.host + ":" + std::to_string(o.port);
  const auto deadline = start + std::chrono::milliseconds(static_cast<int64_t>(o.connect_timeout_seconds * 1000));
  LL_ASSIGN_OR_RETURN(int raw, net::Connect(o.host, o.port, deadline));
  OwnedFd fd(raw);
  StreamHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.dir_size = static_cast<uint32_t>(dir.size());
  h.file_count = static_cast<uint32_t>(files.size());
  LL_RETURN_IF_ERROR(net::SendAll(fd.get(), &h, sizeof(h), peer));
  LL_RETURN_IF_ERROR(SendString(fd.get(), dir, peer));
  Pacer pacer(o.bandwidth_bytes_per_second);
  ReplicaTransfer t;
  Status sending;
  bool damage = o.damage_first_chunk;
  for (const ReplicaFile& f : files) {
    sending = SendFile(fd.get(), o, f, peer, &pacer, &t.bytes, &damage);
    if (!sending.ok() || HasAnswer(fd.get())) break;
  }
  // The receiver's answer: its acknowledgement, or why it refused, which may come before all was
  // sent (a budget, a damaged chunk).
  if (!sending.ok() && !HasAnswer(fd.get())) return sending;  // cancelled, or the connection failed
  Ack ack{};
  Status answered = net::RecvAll(fd.get(), &ack, sizeof(ack), peer);
  if (!answered.ok()) return sending.ok() ? answered : sending;
  if (ack.code != 'K') {
    Result<std::string> reason = RecvString(FromSocket(fd.get(), peer), ack.reason_size, 4096, peer);
    return Status::IOError(peer, "refused " + dir + ": " + (reason.ok() ? *reason : reason.status().ToString()));
  }
  LL_RETURN_IF_ERROR(sending);
  t.seconds = SecondsSince(start);
  return t;
}

// ---- the receiver ----

ReplicaReceiver::ReplicaReceiver(std::string root, int listener, Placer placer, Admit admit)
    : root_(std::move(root)),
      listener_(listener),
      placer_(std::move(placer)),
      admit_(std::move(admit)),
      port_(listener < 0 ? 0 : net::LocalPort(listener)) {
  if (listener_ >= 0) acceptor_ = std::thread([this] { AcceptLoop(); });
}

namespace {

// The receiver's root, created (mode 0700) when missing, without a trailing '/'.
Status MakeRoot(std::string* root) {
  while (root->size() > 1 && root->back() == '/') root->pop_back();
  if (mkdir(root->c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, *root);
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<ReplicaReceiver>> ReplicaReceiver::Start(std::string root, uint16_t port, Placer placer,
                                                                Admit admit) {
  LL_RETURN_IF_ERROR(MakeRoot(&root));
  LL_ASSIGN_OR_RETURN(int listener, net::Listen(port, 64, "snapshot replicas"));
  return std::unique_ptr<ReplicaReceiver>(
      new ReplicaReceiver(std::move(root), listener, std::move(placer), std::move(admit)));
}

Result<std::unique_ptr<ReplicaReceiver>> ReplicaReceiver::WithoutPort(std::string root, Placer placer, Admit admit) {
  LL_RETURN_IF_ERROR(MakeRoot(&root));
  return std::unique_ptr<ReplicaReceiver>(new ReplicaReceiver(std::move(root), -1, std::move(placer), std::move(admit)));
}

ReplicaReceiver::~ReplicaReceiver() {
  stopping_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> servers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);  // a stream in progress ends as broken off
    servers.swap(servers_);
  }
  for (std::thread& t : servers) t.join();
  if (listener_ >= 0) ::close(listener_);
}

Status ReplicaReceiver::Recycle(const std::string& dir) {
  if (!IsReplicaName(dir)) return Status::InvalidArgument("replica directory '" + dir + "'", "not a plain name");
  const std::string path = root_ + "/" + dir;
  const std::string spare_dir = root_ + "/.spare";
  if (mkdir(spare_dir.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, spare_dir);
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return Status::FromErrno(errno, path);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  ::closedir(d);
  for (const std::string& name : names) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string spare = spare_dir + "/" + std::to_string(spare_names_++);
    struct stat st;
    if (::rename((path + "/" + name).c_str(), spare.c_str()) == 0 && ::stat(spare.c_str(), &st) == 0)
      spares_.emplace_back(spare, static_cast<uint64_t>(st.st_size));
  }
  if (::rmdir(path.c_str()) != 0) return Status::FromErrno(errno, path);
  return Status::OK();
}

bool ReplicaReceiver::TakeSpare(const std::string& path, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!spares_.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < spares_.size(); ++i) {
      const uint64_t have = spares_[i].second, chosen = spares_[best].second;
      const bool fits = have >= bytes, chosen_fits = chosen >= bytes;
      if (fits != chosen_fits ? fits : (fits ? have < chosen : have > chosen)) best = i;
    }
    const std::string spare = spares_[best].first;
    spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(best));
    if (::rename(spare.c_str(), path.c_str()) == 0) return true;
  }
  return false;
}

ReplicaReceiver::Counters ReplicaReceiver::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void ReplicaReceiver::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listener_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    // Servers that are done (each said so as the last thing it did under the lock) are joined, so
    // an agent that lives for weeks does not keep a thread object per stream.
    for (const std::thread::id id : finished_) {
      auto it = std::find_if(servers_.begin(), servers_.end(), [id](const std::thread& t) { return t.get_id() == id; });
      if (it == servers_.end()) continue;
      it->join();
      servers_.erase(it);
    }
    finished_.clear();
    open_fds_.push_back(fd);
    servers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void ReplicaReceiver::Serve(int fd) {
  uint64_t bytes = 0, files = 0;
  Status s = ReceiveStream(FromSocket(fd, "replica sender"), &bytes, &files);
  Ack ack{};
  ack.code = s.ok() ? 'K' : 'E';
  const std::string reason = s.ok() ? "" : s.ToString();
  ack.reason_size = static_cast<uint32_t>(reason.size());
  if (net::SendAll(fd, &ack, sizeof(ack), "replica sender").ok()) SendString(fd, reason, "replica sender").IgnoreError();
  if (!s.ok()) {
    // A refusal may come while the sender is still sending: read on (for at most 2 s) until it
    // has read the answer and closed, so that closing here resets nothing it has not read.
    ::shutdown(fd, SHUT_WR);
    std::vector<char> sink(64 << 10);
    const auto until = net::Clock::now() + std::chrono::seconds(2);
    while (!stopping_ && net::Clock::now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      if (::recv(fd, sink.data(), sink.size(), 0) <= 0) break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (s.ok()) {
    counters_.bytes += bytes;
    counters_.files += files;
    ++counters_.streams;
  } else {
    ++counters_.refused;
    counters_.last_error = reason;
  }
  open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
  ::close(fd);
  finished_.push_back(std::this_thread::get_id());
}

Status ReplicaReceiver::ReceiveStream(const StreamReader& read, uint64_t* bytes, uint64_t* files) {
  const std::string peer = "replica sender";
  StreamHeader h{};
  LL_RETURN_IF_ERROR(read(&h, sizeof(h)));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return Status::Corruption(peer, "not a replica stream");
  if (h.file_count > kMaxFiles) return Status::Corruption(peer, std::to_string(h.file_count) + " files");
  LL_ASSIGN_OR_RETURN(std::string dir, RecvString(read, h.dir_size, 255, peer));
  if (!IsReplicaName(dir)) return Status::Corruption(peer, "directory name '" + dir + "' refused");
  const std::string dir_path = root_ + "/" + dir;
  if (mkdir(dir_path.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, dir_path);
  // However the stream ends, its directory goes once empty (another stream may still be filling it).
  struct RemoveIfEmpty {
    const std::string& path;
    ~RemoveIfEmpty() { ::rmdir(path.c_str()); }
  } remove_if_empty{dir_path};

  // Files arrive under ".<name>.partial" and take their names only once all of them are whole.
  std::vector<std::pair<std::string, std::string>> placed;  // partial, final
  auto discard = [&]() {
    for (const auto& [partial, final_path] : placed) ::unlink(partial.c_str());
  };
  std::vector<uint8_t> scratch(kPieceBytes);
  for (uint32_t i = 0; i < h.file_count; ++i) {
    FileHeader fh{};
    Status s = read(&fh, sizeof(fh));
    Result<std::string> name = s.ok() ? RecvString(read, fh.name_size, 255, peer) : Result<std::string>(s);
    if (!name.ok()) {
      discard();
      return name.status();
    }
    const std::string what = "replica " + dir + "/" + *name;
    if (!IsReplicaName(*name) || fh.bytes > kMaxFileBytes) {
      discard();
      return Status::Corruption(what, "file name or size refused");
    }
    // A second file of the name would take the first one's partial file, and the stream would be
    // refused after placing the first.
    const std::string final_path = dir_path + "/" + *name;
    if (std::any_of(placed.begin(), placed.end(), [&](const auto& p) { return p.second == final_path; })) {
      discard();
      return Status::Corruption(what, "named twice in the stream");
    }
    // Asked before any memory is taken: a replica that does not fit is refused, never an OOM.
    if (admit_) {
      Status admitted = admit_(dir, *name, fh.bytes);
      if (!admitted.ok()) {
        discard();
        return admitted;
      }
    }
    const std::string partial = dir_path + "/." + *name + ".partial";
    placed.emplace_back(partial, final_path);
    // Every block reserved now: a full memory file system is ResourceExhausted here, not a SIGBUS
    // when a chunk lands.
    // A spare keeps its pages; only what it lacks is allocated (and what it has too much, freed).
    const bool reused = TakeSpare(partial, fh.bytes);
    Result<OwnedFd> out = OpenSharedFile(partial, reused ? CreateMode::kOpenOrCreate : CreateMode::kFresh);
    if (!out.ok() && out.status().IsNotFound()) {  // another stream of this directory just removed it
      if (mkdir(dir_path.c_str(), 0700) != 0 && errno != EEXIST) {
        Status err = Status::FromErrno(errno, dir_path);
        discard();
        return err;
      }
      out = OpenSharedFile(partial, reused ? CreateMode::kOpenOrCreate : CreateMode::kFresh);
    }
    if (reused && out.ok() && ::ftruncate(out->get(), static_cast<off_t>(fh.bytes)) != 0) out = Status::FromErrno(errno, partial);
    Status sized = !out.ok()       ? out.status()
                   : fh.bytes == 0 ? Status::OK()
                                   : SizeSharedFile(out->get(), fh.bytes, /*reserve=*/true, partial);
    if (!sized.ok()) {
      discard();
      return sized;
    }
    for (uint64_t off = 0; off < fh.bytes;) {
      ChunkHeader c{};
      s = read(&c, sizeof(c));
      if (s.ok() && (c.bytes == 0 || c.bytes > kMaxChunk || c.bytes > fh.bytes - off))
        s = Status::Corruption(what, "a chunk of " + std::to_string(c.bytes) + " bytes at offset " + std::to_string(off));
      // A piece at a time through a buffer that stays in the cache: checksummed there, then
      // copied into the file (into tmpfs pages: no page cache between).
      format::StreamingChecksum sum;
      for (uint64_t p = 0; s.ok() && p < c.bytes; p += kPieceBytes) {
        const uint64_t k = std::min(kPieceBytes, c.bytes - p);
        s = read(scratch.data(), k);
        if (s.ok()) sum.Update(scratch.data(), k);
        if (s.ok()) s = WriteFull(out->get(), scratch.data(), k, off + p, partial);
      }
      ChunkTrailer t{};
      if (s.ok()) s = read(&t, sizeof(t));
      if (s.ok() && sum.Digest() != t.checksum)
        s = Status::Corruption(what, "chunk at offset " + std::to_string(off) + " fails its checksum in transit");
      if (!s.ok()) {
        discard();
        return s;
      }
      off += c.bytes;
    }
    *bytes += fh.bytes;
  }
  *files = placed.size();
  if (placer_) {
    std::vector<std::pair<std::string, std::string>> received;
    for (const auto& [partial, final_path] : placed) received.emplace_back(final_path.substr(dir_path.size() + 1), partial);
    Status s = placer_(dir, received);
    discard();  // whatever the placer left
    return s;
  }
  for (const auto& [partial, final_path] : placed) {
    if (::rename(partial.c_str(), final_path.c_str()) != 0) {
      Status err = Status::FromErrno(errno, final_path);
      discard();
      return err;
    }
  }
  return Status::OK();
}

}  // namespace lifeline::replication
