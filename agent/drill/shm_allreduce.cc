#include "agent/drill/shm_allreduce.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>  // shm_open, shm_unlink (the mappings: lifeline/internal/shared_memory.h)
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>

namespace lifeline::drill {

namespace {

constexpr uint64_t kMagic = 0x314c4c4952444c4cull;  // "LLDRILL1"
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 4096;
// How often a waiting rank wakes up to look again even without a wake-up (a lost wake-up then
// costs at most this), and how often a joining rank polls.
constexpr long kPollNanos = 1'000'000;
// How often a joining rank checks that the name still refers to the segment it mapped.
constexpr double kNameCheckSeconds = 0.02;

struct SegmentHeader {
  uint64_t magic;  // stored last by rank 0, with release: the rest is valid once it reads kMagic
  uint32_t version;
  uint32_t world_size;
  uint64_t count;
  int32_t creator_pid;
  uint32_t reserved;
  alignas(64) uint32_t arrived;     // ranks arrived at the current barrier
  alignas(64) uint32_t generation;  // barriers completed; the futex word the waiters sleep on
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes, "header fits its page");

uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void SleepNanos(long ns) {
  timespec ts{0, ns};
  nanosleep(&ts, nullptr);
}

void FutexWait(uint32_t* word, uint32_t expected) {
  timespec ts{0, kPollNanos};
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

bool ProcessAlive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

std::string ShmPath(const std::string& name) { return "/dev/shm/" + name; }

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 200 || name == "." || name == "..") return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Unlinks `name` and every segment whose name starts with `prefix`, as far as it may.
void RemoveStale(const std::string& name, const std::string& prefix) {
  shm_unlink(("/" + name).c_str());
  if (prefix.empty()) return;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* e = readdir(dir)) {
    const std::string entry = e->d_name;
    if (entry.compare(0, prefix.size(), prefix) == 0) shm_unlink(("/" + entry).c_str());
  }
  closedir(dir);
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

std::string RankList(const std::vector<uint32_t>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += ", ...";
  return s;
}

// A mapping owned during the join; released to the ShmAllReduce on success.
struct Mapping {
  MappedRegion region;
  dev_t dev = 0;
  ino_t ino = 0;
  void Reset() { region.Reset(); }
  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(region.data()); }
  int32_t* claims() const { return reinterpret_cast<int32_t*>(region.data() + kHeaderBytes); }
};

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

// Where things lie in the segment: the header page, a claim (pid) per rank, two sets of a word per
// rank (AllGather), then two sets of a slot per rank, each slot on its own cache lines.
struct ShmAllReduce::Layout {
  uint64_t words_offset;
  uint64_t slots_offset;
  uint64_t slot_stride;
  uint64_t total;

  static Layout For(uint32_t world_size, uint64_t count) {
    Layout l;
    l.words_offset = kHeaderBytes + RoundUp(uint64_t{world_size} * sizeof(int32_t), 64);
    l.slots_offset = RoundUp(l.words_offset + 2 * uint64_t{world_size} * sizeof(uint64_t), 4096);
    l.slot_stride = RoundUp(count * sizeof(float), 64);
    l.total = l.slots_offset + 2 * uint64_t{world_size} * l.slot_stride;
    return l;
  }
};

std::string ShmNameComponent(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 80)) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  return out.empty() ? "_" : out;
}

ShmAllReduce::ShmAllReduce(std::string name, uint32_t rank, uint32_t world_size, uint64_t count,
                           MappedRegion region)
    : name_(std::move(name)), rank_(rank), world_size_(world_size), count_(count), region_(std::move(region)) {}

ShmAllReduce::~ShmAllReduce() = default;

Result<std::unique_ptr<ShmAllReduce>> ShmAllReduce::Join(const ShmAllReduceOptions& o) {
  if (!ValidName(o.name))
    return Status::InvalidArgument("shared-memory name '" + o.name + "'", "use letters, digits, '.', '_' and '-'");
  if (o.world_size == 0 || o.world_size > kMaxWorldSize || o.rank >= o.world_size)
    return Status::InvalidArgument("rank " + std::to_string(o.rank) + " of world size " + std::to_string(o.world_size),
                                   "not a valid rank (world size 1 to " + std::to_string(kMaxWorldSize) + ")");
  if (o.count == 0 || o.count > (uint64_t{1} << 36))
    return Status::InvalidArgument("allreduce of " + std::to_string(o.count) + " floats", "count must be 1 to 2^36");

  const Layout layout = Layout::For(o.world_size, o.count);
  const std::string shm = "/" + o.name;
  const std::string where = "shared-memory segment " + shm;
  const int32_t me = static_cast<int32_t>(getpid());
  const double deadline = Now() + o.join_timeout_seconds;
  const std::string rank_text = "rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size);

  Mapping m;
  if (o.rank == 0) {
    RemoveStale(o.name, o.stale_prefix);
    int fd = shm_open(shm.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {  // created between the unlink and here: ours to replace all the same
      shm_unlink(shm.c_str());
      fd = shm_open(shm.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    }
    if (fd < 0) return Status::FromErrno(errno, "creating " + where);
    FdCloser closer(fd);
    struct stat st;
    if (ftruncate(fd, static_cast<off_t>(layout.total)) != 0 || fstat(fd, &st) != 0) {
      const int err = errno;
      shm_unlink(shm.c_str());
      return Status::FromErrno(err, "sizing " + where + " to " + std::to_string(layout.total) + " bytes");
    }
    Result<MappedRegion> region = MappedRegion::MapFile(fd, layout.total, /*writable=*/true, where);
    if (!region.ok()) {
      shm_unlink(shm.c_str());
      return region.status();
    }
    m.region = std::move(*region);
    m.dev = st.st_dev;
    m.ino = st.st_ino;
    SegmentHeader* h = m.header();
    h->version = kVersion;
    h->world_size = o.world_size;
    h->count = o.count;
    h->creator_pid = me;
    std::atomic_ref<uint64_t>(h->magic).store(kMagic, std::memory_order_release);
  }

  // Non-zero ranks: segments (dev, ino) found to be left over from an earlier launch, to be skipped
  // until rank 0 replaces them.
  std::vector<std::pair<dev_t, ino_t>> stale;
  std::string waiting_for = "rank 0 to create it";
  auto fail_rank0 = [&](Status s) {
    if (o.rank == 0) shm_unlink(shm.c_str());
    return s;
  };

  for (;;) {
    if (o.rank != 0) {
      m.Reset();
      if (Now() > deadline)
        return Status::Unavailable(rank_text + ": timed out after " + Seconds(o.join_timeout_seconds) +
                                   " waiting for " + waiting_for, where);
      const int fd = shm_open(shm.c_str(), O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) {
        if (errno != ENOENT) return Status::FromErrno(errno, "opening " + where);
        SleepNanos(kPollNanos);
        continue;
      }
      FdCloser closer(fd);
      struct stat st;
      if (fstat(fd, &st) != 0) return Status::FromErrno(errno, "stat of " + where);
      bool skip = st.st_size < static_cast<off_t>(kHeaderBytes);  // rank 0 has not sized it yet
      for (const auto& [dev, ino] : stale) skip = skip || (dev == st.st_dev && ino == st.st_ino);
      if (skip) {
        SleepNanos(kPollNanos);
        continue;
      }
      LL_ASSIGN_OR_RETURN(MappedRegion head, MappedRegion::MapFile(fd, kHeaderBytes, /*writable=*/false, where));
      const auto* h = reinterpret_cast<const SegmentHeader*>(head.data());
      const bool ready = std::atomic_ref<const uint64_t>(h->magic).load(std::memory_order_acquire) == kMagic;
      const bool same_shape = h->version == kVersion && h->world_size == o.world_size && h->count == o.count &&
                              static_cast<uint64_t>(st.st_size) >= layout.total;
      const uint32_t their_world = h->world_size;
      const uint64_t their_count = h->count;
      const int32_t creator = h->creator_pid;
      head.Reset();
      if (!ready) {
        SleepNanos(kPollNanos);
        continue;
      }
      if (!same_shape) {
        if (!ProcessAlive(creator)) {
          stale.emplace_back(st.st_dev, st.st_ino);
          waiting_for = "rank 0 to replace a segment left over by an earlier launch";
          continue;
        }
        return Status::InvalidArgument(
            where, "rank 0 (pid " + std::to_string(creator) + ") made it for world size " +
                       std::to_string(their_world) + " and " + std::to_string(their_count) +
                       " floats per rank, but " + rank_text + " expects " + std::to_string(o.count) +
                       " floats: do all ranks get the same WORLD_SIZE and --params?");
      }
      LL_ASSIGN_OR_RETURN(m.region, MappedRegion::MapFile(fd, layout.total, /*writable=*/true, where));
      m.dev = st.st_dev;
      m.ino = st.st_ino;
    }

    // Claim this rank's slot.
    std::atomic_ref<int32_t> my_claim(m.claims()[o.rank]);
    const int32_t previous = my_claim.exchange(me);
    if (previous != 0 && previous != me) {
      if (ProcessAlive(previous)) {
        my_claim.store(previous);
        return fail_rank0(Status::InvalidArgument(
            where, "rank " + std::to_string(o.rank) + " is already held by pid " + std::to_string(previous) +
                       ": were two processes given RANK=" + std::to_string(o.rank) + "?"));
      }
      if (o.rank == 0)  // cannot happen in the segment it has just created, but never loop on it
        return fail_rank0(Status::Aborted(where, "rank 0's slot was claimed before rank 0 created it"));
      stale.emplace_back(m.dev, m.ino);  // a rank of an earlier launch held it and died
      waiting_for = "rank 0 to replace a segment left over by an earlier launch";
      continue;
    }

    // Wait until every rank has claimed its slot, every claimant alive.
    enum class Outcome { kWaiting, kComplete, kStale };
    auto look = [&](std::vector<uint32_t>* missing, int32_t* dead_pid, uint32_t* dead_rank) {
      missing->clear();
      for (uint32_t r = 0; r < o.world_size; ++r)
        if (std::atomic_ref<int32_t>(m.claims()[r]).load(std::memory_order_acquire) == 0) missing->push_back(r);
      if (!missing->empty()) return Outcome::kWaiting;
      for (uint32_t r = 0; r < o.world_size; ++r) {
        const int32_t pid = std::atomic_ref<int32_t>(m.claims()[r]).load(std::memory_order_acquire);
        if (!ProcessAlive(pid)) {
          *dead_pid = pid;
          *dead_rank = r;
          return Outcome::kStale;
        }
      }
      return Outcome::kComplete;
    };
    std::vector<uint32_t> missing;
    int32_t dead_pid = 0;
    uint32_t dead_rank = 0;
    double next_name_check = Now() + kNameCheckSeconds;
    Outcome outcome = Outcome::kWaiting;
    while ((outcome = look(&missing, &dead_pid, &dead_rank)) == Outcome::kWaiting) {
      const double now = Now();
      if (now > deadline)
        return fail_rank0(Status::Unavailable(
            rank_text + ": timed out after " + Seconds(o.join_timeout_seconds) + " waiting for rank " +
                RankList(missing) + " to join",
            where));
      if (o.rank != 0 && now >= next_name_check) {
        next_name_check = now + kNameCheckSeconds;
        struct stat st;
        const bool same = stat(ShmPath(o.name).c_str(), &st) == 0 && st.st_dev == m.dev && st.st_ino == m.ino;
        if (!same) {
          // Rank 0 unlinks the name once the group is complete; otherwise it replaced a stale one.
          outcome = look(&missing, &dead_pid, &dead_rank);
          if (outcome == Outcome::kWaiting) outcome = Outcome::kStale;
          break;
        }
      }
      SleepNanos(kPollNanos);
    }
    if (outcome == Outcome::kComplete) break;
    if (o.rank == 0)
      return fail_rank0(Status::Unavailable(where, "rank " + std::to_string(dead_rank) + " (pid " +
                                                       std::to_string(dead_pid) +
                                                       ") joined and died before every rank had joined"));
    stale.emplace_back(m.dev, m.ino);
    waiting_for = "rank 0 to replace a segment left over by an earlier launch";
  }

  // Everyone has mapped it: the name is no longer needed, and without it nothing outlives a kill.
  if (o.rank == 0) shm_unlink(shm.c_str());
  return std::unique_ptr<ShmAllReduce>(new ShmAllReduce(o.name, o.rank, o.world_size, o.count, std::move(m.region)));
}

float* ShmAllReduce::Slot(uint32_t set, uint32_t rank) const {
  const Layout l = Layout::For(world_size_, count_);
  return reinterpret_cast<float*>(reinterpret_cast<char*>(region_.data()) + l.slots_offset +
                                  (uint64_t{set} * world_size_ + rank) * l.slot_stride);
}

uint64_t* ShmAllReduce::Word(uint32_t set, uint32_t rank) const {
  const Layout l = Layout::For(world_size_, count_);
  return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(region_.data()) + l.words_offset) +
         (uint64_t{set} * world_size_ + rank);
}

void ShmAllReduce::Arrive() {
  SegmentHeader* h = reinterpret_cast<SegmentHeader*>(region_.data());
  std::atomic_ref<uint32_t> arrived(h->arrived);
  std::atomic_ref<uint32_t> generation(h->generation);
  const uint32_t target = static_cast<uint32_t>(completed_ + 1);
  if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == world_size_) {
    // Reset before the release below: a rank that sees the new generation and arrives at the next
    // barrier finds the count at zero.
    arrived.store(0, std::memory_order_relaxed);
    generation.store(target, std::memory_order_release);
    FutexWakeAll(&h->generation);
    return;
  }
  for (;;) {
    const uint32_t g = generation.load(std::memory_order_acquire);
    if (static_cast<int32_t>(g - target) >= 0) return;
    FutexWait(&h->generation, g);
  }
}

void ShmAllReduce::Post(const float* data) {
  assert(!posted_ && "Post twice without Finish");
  std::memcpy(Slot(completed_ & 1, rank_), data, count_ * sizeof(float));
  posted_ = true;
}

void ShmAllReduce::Finish(float* out) {
  assert(posted_ && "Finish without Post");
  Arrive();
  const uint32_t set = completed_ & 1;
  std::memcpy(out, Slot(set, 0), count_ * sizeof(float));
  for (uint32_t r = 1; r < world_size_; ++r) {
    const float* in = Slot(set, r);
    for (uint64_t i = 0; i < count_; ++i) out[i] += in[i];
  }
  posted_ = false;
  ++completed_;
}

std::vector<uint64_t> ShmAllReduce::AllGather(uint64_t word) {
  assert(!posted_ && "AllGather between Post and Finish");
  const uint32_t set = completed_ & 1;
  *Word(set, rank_) = word;
  Arrive();
  std::vector<uint64_t> all(world_size_);
  for (uint32_t r = 0; r < world_size_; ++r) all[r] = *Word(set, r);
  ++completed_;
  return all;
}

}  // namespace lifeline::drill
