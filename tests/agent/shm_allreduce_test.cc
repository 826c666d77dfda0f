// The shared-memory allreduce of lifeline-drill, with ranks as forked processes: sums in rank
// order on every rank, waits for a late peer without spinning, forms the group whichever rank
// starts first, replaces a segment left behind by a killed launch, and fails the join with a
// message that names what is missing.
#include "agent/drill/shm_allreduce.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace lifeline::drill {
namespace {

std::string UniqueName(const std::string& tag) {
  static int counter = 0;
  return "lifeline-drill-test." + std::to_string(getpid()) + "." + tag + "." + std::to_string(counter++);
}

bool ShmExists(const std::string& name) { return access(("/dev/shm/" + name).c_str(), F_OK) == 0; }

ShmAllReduceOptions Options(const std::string& name, uint32_t rank, uint32_t world, uint64_t count,
                            double timeout = 5) {
  ShmAllReduceOptions o;
  o.name = name;
  o.rank = rank;
  o.world_size = world;
  o.count = count;
  o.join_timeout_seconds = timeout;
  return o;
}

// A forked rank: `body` runs in the child, whose exit status is its return value. Killed and
// reaped on destruction if still running, so a failed assertion never leaves a process behind.
class Child {
 public:
  explicit Child(const std::function<int()>& body) {
    pid_ = fork();
    if (pid_ == 0) _exit(body());
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // The exit status, or -1 when it did not exit normally within `timeout` seconds (then killed).
  int Wait(double timeout = 10) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) return -1;  // the destructor kills it
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  void Kill() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// Contributions of very different magnitudes, so that adding them in another order than 0..N-1
// gives other bits for many elements.
float Contribution(uint32_t rank, int round, uint64_t i) {
  const float scale[] = {1e6f, 1.0f, 1e-3f, 3.3f, 7e4f};
  return scale[(rank + i) % 5] * (static_cast<float>((i * 2654435761u + rank * 97 + round * 13) % 1000) / 999.0f - 0.5f);
}

// Exit codes of the ranks below.
constexpr int kOk = 0;
constexpr int kJoinFailed = 10;
constexpr int kWrongSum = 11;
constexpr int kWrongGather = 12;
constexpr int kTooFast = 13;
constexpr int kSpun = 14;

int SumRank(const std::string& name, uint32_t rank, uint32_t world, uint64_t count, int rounds) {
  auto joined = ShmAllReduce::Join(Options(name, rank, world, count));
  if (!joined.ok()) return kJoinFailed;
  ShmAllReduce& comm = **joined;
  std::vector<float> mine(count), out(count), want(count);
  for (int round = 0; round < rounds; ++round) {
    for (uint64_t i = 0; i < count; ++i) mine[i] = Contribution(rank, round, i);
    // Alternate between a separate output and reducing in place.
    float* dest = round % 2 ? mine.data() : out.data();
    comm.AllReduceSum(mine.data(), dest);
    for (uint64_t i = 0; i < count; ++i) {
      float s = Contribution(0, round, i);
      for (uint32_t r = 1; r < world; ++r) s += Contribution(r, round, i);
      want[i] = s;
    }
    if (std::memcmp(dest, want.data(), count * sizeof(float)) != 0) return kWrongSum;
    if (round % 7 == 3) {
      const std::vector<uint64_t> all = comm.AllGather(uint64_t{rank} * 1000 + round);
      for (uint32_t r = 0; r < world; ++r)
        if (all[r] != uint64_t{r} * 1000 + round) return kWrongGather;
    }
  }
  return kOk;
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

TEST(ShmAllReduceTest, FourRanksGetTheRankOrderSumBitForBit) {
  const std::string name = UniqueName("sum");
  std::vector<std::unique_ptr<Child>> ranks;
  // 1001 floats: not a multiple of any vector width.
  for (uint32_t r = 0; r < 4; ++r) ranks.push_back(std::make_unique<Child>([&, r] { return SumRank(name, r, 4, 1001, 40); }));
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(ranks[r]->Wait(), kOk) << "rank " << r;
  EXPECT_FALSE(ShmExists(name)) << "rank 0 unlinks the name once the group is complete";
}

TEST(ShmAllReduceTest, NonZeroRanksMayStartLongBeforeRankZero) {
  const std::string name = UniqueName("late0");
  Child r1([&] { return SumRank(name, 1, 3, 64, 5); });
  Child r2([&] { return SumRank(name, 2, 3, 64, 5); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Child r0([&] { return SumRank(name, 0, 3, 64, 5); });
  EXPECT_EQ(r0.Wait(), kOk);
  EXPECT_EQ(r1.Wait(), kOk);
  EXPECT_EQ(r2.Wait(), kOk);
}

TEST(ShmAllReduceTest, ASingleRankGetsItsOwnContribution) {
  auto comm = ShmAllReduce::Join(Options(UniqueName("one"), 0, 1, 3));
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  float v[3] = {1.5f, -2.0f, 0.25f};
  float out[3] = {};
  (*comm)->AllReduceSum(v, out);
  EXPECT_EQ(std::memcmp(v, out, sizeof(v)), 0);
  EXPECT_EQ((*comm)->AllGather(42), std::vector<uint64_t>{42});
  EXPECT_EQ((*comm)->completed(), 2u);
}

TEST(ShmAllReduceTest, WaitsForALatePeerWithoutSpinning) {
  const std::string name = UniqueName("late");
  constexpr double kLateSeconds = 1.5;
  Child waiter([&] {
    auto comm = ShmAllReduce::Join(Options(name, 0, 2, 16));
    if (!comm.ok()) return kJoinFailed;
    std::vector<float> v(16, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    const double cpu = CpuSeconds();
    (*comm)->AllReduceSum(v.data(), v.data());
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited < kLateSeconds - 0.5) return kTooFast;
    // A spinning wait would burn the whole 1.5 s; polling every millisecond costs a few percent.
    if (CpuSeconds() - cpu > 0.3) return kSpun;
    return v[0] == 3.0f ? kOk : kWrongSum;
  });
  Child late([&] {
    auto comm = ShmAllReduce::Join(Options(name, 1, 2, 16));
    if (!comm.ok()) return kJoinFailed;
    std::this_thread::sleep_for(std::chrono::duration<double>(kLateSeconds));
    std::vector<float> v(16, 2.0f);
    (*comm)->AllReduceSum(v.data(), v.data());
    return v[0] == 3.0f ? kOk : kWrongSum;
  });
  EXPECT_EQ(waiter.Wait(), kOk);
  EXPECT_EQ(late.Wait(), kOk);
}

TEST(ShmAllReduceTest, JoinWithoutRankZeroTimesOutNamingIt) {
  const std::string name = UniqueName("norank0");
  auto comm = ShmAllReduce::Join(Options(name, 1, 2, 8, 0.2));
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(comm.status().IsUnavailable()) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("rank 0"), std::string::npos) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find(name), std::string::npos) << comm.status().ToString();
}

TEST(ShmAllReduceTest, JoinWithAMissingPeerTimesOutNamingItAndLeavesNothing) {
  const std::string name = UniqueName("nopeer");
  auto comm = ShmAllReduce::Join(Options(name, 0, 3, 8, 0.2));
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(comm.status().IsUnavailable()) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("rank 1, 2"), std::string::npos) << comm.status().ToString();
  EXPECT_FALSE(ShmExists(name));
}

TEST(ShmAllReduceTest, APeerWithAnotherCountIsRejected) {
  const std::string name = UniqueName("count");
  Child r0([&] { return SumRank(name, 0, 2, 100, 1); });
  auto comm = ShmAllReduce::Join(Options(name, 1, 2, 200, 5));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("100 floats"), std::string::npos) << comm.status().ToString();
  r0.Kill();
  shm_unlink(("/" + name).c_str());  // rank 0 was killed before it could
}

TEST(ShmAllReduceTest, TwoProcessesWithTheSameRankAreRejected) {
  const std::string name = UniqueName("dup");
  Child r0([&] { return SumRank(name, 0, 3, 8, 1); });
  Child r1([&] { return SumRank(name, 1, 3, 8, 1); });
  // Wait until the first rank 1 holds its claim: the group stays incomplete without rank 2.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto comm = ShmAllReduce::Join(Options(name, 1, 3, 8, 2));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("already held by pid " + std::to_string(r1.pid())), std::string::npos)
      << comm.status().ToString();
  r0.Kill();
  shm_unlink(("/" + name).c_str());
}

TEST(ShmAllReduceTest, ASegmentLeftByAKilledLaunchIsReplaced) {
  const std::string prefix = UniqueName("stale") + ".";
  const std::string name = prefix + "w2.r0";
  // An older launch's segment of the same job: rank 0 removes it by prefix.
  const std::string older = prefix + "w2.old";
  const int fd = shm_open(("/" + older).c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);

  ShmAllReduceOptions first = Options(name, 0, 2, 32, 30);
  first.stale_prefix = prefix;
  {
    // A launch killed during its join leaves the segment with rank 0's claim by a dead process.
    Child killed([&] { return ShmAllReduce::Join(first).ok() ? kOk : kJoinFailed; });
    for (int i = 0; i < 200 && !ShmExists(name); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    killed.Kill();
  }
  ASSERT_TRUE(ShmExists(name));

  // The relaunch's rank 1 starts first and finds the stale segment; rank 0 comes later.
  Child r1([&] { return SumRank(name, 1, 2, 32, 3); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Child r0([&] {
    auto comm = ShmAllReduce::Join(first);
    if (!comm.ok()) return kJoinFailed;
    std::vector<float> mine(32), out(32);
    for (int round = 0; round < 3; ++round) {
      for (uint64_t i = 0; i < 32; ++i) mine[i] = Contribution(0, round, i);
      (*comm)->AllReduceSum(mine.data(), out.data());
      for (uint64_t i = 0; i < 32; ++i)
        if (out[i] != Contribution(0, round, i) + Contribution(1, round, i)) return kWrongSum;
    }
    return kOk;
  });
  EXPECT_EQ(r1.Wait(), kOk);
  EXPECT_EQ(r0.Wait(), kOk);
  EXPECT_FALSE(ShmExists(name));
  EXPECT_FALSE(ShmExists(older));
}

TEST(ShmAllReduceTest, BadOptionsAreRejected) {
  EXPECT_EQ(ShmAllReduce::Join(Options("a/b", 0, 1, 1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmAllReduce::Join(Options("", 0, 1, 1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmAllReduce::Join(Options(UniqueName("bad"), 2, 2, 1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmAllReduce::Join(Options(UniqueName("bad"), 0, 0, 1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmAllReduce::Join(Options(UniqueName("bad"), 0, 1, 0)).status().code(), StatusCode::kInvalidArgument);
}

TEST(ShmNameComponentTest, KeepsSafeCharactersOnly) {
  EXPECT_EQ(ShmNameComponent("job-7_a"), "job-7_a");
  EXPECT_EQ(ShmNameComponent("a/b.c d"), "a_b_c_d");
  EXPECT_EQ(ShmNameComponent(""), "_");
  EXPECT_EQ(ShmNameComponent(std::string(200, 'x')).size(), 80u);
}

}  // namespace
}  // namespace lifeline::drill
