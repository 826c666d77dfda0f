// The staging arena: which slot a snapshot gets (the oldest, so the newest snapshot stays in the
// memory tier), waiting for a free slot or being told there is none, and slots that are memory a
// second process can read (shared-memory files).
#include "lib/src/save/staging_arena.h"

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/kit/test_kit.h"

namespace lifeline {
namespace staging_arena_test {

constexpr uint64_t kMiB = 1 << 20;

TEST(StagingArenaTest, SlotLimitIsTheBudgetSharedByTheSlotsPageAligned) {
  EXPECT_EQ(32 * kMiB, StagingArena(2, 64 * kMiB, {}).slot_limit());
  EXPECT_EQ(4096u, StagingArena(3, 3 * 4096 + 100, {}).slot_limit());
  EXPECT_EQ(1u, StagingArena(0, 4096, {}).num_slots());  // at least one slot
}

TEST(StagingArenaTest, AFreedSlotGoesBackLastSoTheNewestSnapshotIsKept) {
  StagingArena arena(2, 8 * kMiB, {});
  auto a = arena.Acquire(false);
  ASSERT_TRUE(a.has_value());
  arena.SetStep(*a, 10);
  arena.Release(*a);
  auto b = arena.Acquire(false);
  ASSERT_TRUE(b.has_value());
  EXPECT_NE(*a, *b) << "the slot holding step 10 was handed out while another was older";
  EXPECT_EQ(10u, arena.StepOf(*a));  // still there for the memory tier
  EXPECT_FALSE(arena.StepOf(*b).has_value());
  arena.SetStep(*b, 20);
  arena.Release(*b);
  auto c = arena.Acquire(false);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*a, *c);  // step 10 is now the oldest
  EXPECT_FALSE(arena.StepOf(*c).has_value()) << "acquiring a slot forgets its old step";
  EXPECT_EQ(20u, arena.StepOf(*b));
  arena.Release(*c);
}

TEST(StagingArenaTest, EveryBusySlotMeansNoneWithoutWaitingAndTheOldestBusyStepExplainsWhy) {
  StagingArena arena(2, 8 * kMiB, {});
  auto a = arena.Acquire(false), b = arena.Acquire(false);
  ASSERT_TRUE(a && b);
  arena.SetStep(*a, 7);
  arena.SetStep(*b, 5);
  EXPECT_FALSE(arena.Acquire(false).has_value());
  EXPECT_EQ(5u, arena.OldestBusyStep());
  arena.Release(*b);
  EXPECT_EQ(7u, arena.OldestBusyStep());
  arena.Release(*a);
  EXPECT_FALSE(arena.OldestBusyStep().has_value());
}

TEST(StagingArenaTest, AWaitingAcquireGetsTheSlotReleasedByAnotherThread) {
  StagingArena arena(1, 4 * kMiB, {});
  auto held = arena.Acquire(false);
  ASSERT_TRUE(held.has_value());
  std::atomic<bool> got{false};
  std::optional<unsigned> waited;
  std::thread waiter([&] {
    waited = arena.Acquire(true);
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(got.load()) << "Acquire(wait) returned while the only slot was busy";
  arena.Release(*held);
  waiter.join();
  ASSERT_TRUE(waited.has_value());
  EXPECT_EQ(*held, *waited);
}

TEST(StagingArenaTest, ReserveGrowsASlotToHoldTheSnapshotAndTellsRegisteredQueues) {
  StagingArena arena(2, 64 * kMiB, {});
  EXPECT_TRUE(arena.Regions().empty());  // nothing allocated before the first snapshot
  const uint64_t g0 = arena.generation();
  auto s = arena.Acquire(false);
  ASSERT_TRUE(s.has_value());
  ASSERT_TRUE(arena.Reserve(*s, 3 * kMiB + 1).ok());
  ASSERT_NE(nullptr, arena.data(*s));
  EXPECT_GE(arena.capacity(*s), 3 * kMiB + 1);
  EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(arena.data(*s)) % 4096) << "direct I/O needs page alignment";
  std::memset(arena.data(*s), 0x5a, arena.capacity(*s));  // all of it is writable
  const uint64_t g1 = arena.generation();
  EXPECT_NE(g0, g1);
  ASSERT_EQ(1u, arena.Regions().size());
  EXPECT_EQ(arena.data(*s), arena.Regions()[0].first);
  // A smaller snapshot reuses the slot as it is: no new allocation, no new registration.
  uint8_t* before = arena.data(*s);
  ASSERT_TRUE(arena.Reserve(*s, kMiB).ok());
  EXPECT_EQ(before, arena.data(*s));
  EXPECT_EQ(g1, arena.generation());
  arena.Release(*s);
  ASSERT_TRUE(arena.Prepare(kMiB).ok());  // grows the other slot too
  EXPECT_EQ(2u, arena.Regions().size());
}

TEST(StagingArenaTest, SharedMemorySlotsAreFilesAnotherProcessCanReadAndAreUnlinkedOnRequest) {
  test::TempDir shm("/dev/shm", "lifeline-arena-test");
  if (shm.path().empty()) GTEST_SKIP() << "no /dev/shm here";
  const std::string p0 = shm.Sub("slot0"), p1 = shm.Sub("slot1");
  StagingArena arena(2, 8 * kMiB, {p0, p1});
  EXPECT_EQ(p0, arena.shm_path(0));
  auto s = arena.Acquire(false);
  ASSERT_TRUE(s.has_value());
  ASSERT_TRUE(arena.Reserve(*s, 4096).ok());
  const std::string& path = arena.shm_path(*s);
  std::memcpy(arena.data(*s), "snapshot", 8);
  struct stat st;
  ASSERT_EQ(0, ::stat(path.c_str(), &st));
  EXPECT_EQ(0600u, st.st_mode & 0777) << "a snapshot is readable by its owner only";
  EXPECT_GE(static_cast<uint64_t>(st.st_size), arena.capacity(*s));
  EXPECT_EQ("snapshot", test::ReadWholeFile(path).substr(0, 8));
  arena.Release(*s);
  arena.ReleaseAll(/*unlink_files=*/false);
  EXPECT_EQ("snapshot", test::ReadWholeFile(path).substr(0, 8)) << "the pages outlive the mapping";
  arena.ReleaseAll(/*unlink_files=*/true);
  EXPECT_NE(0, ::stat(path.c_str(), &st));
}

}  // namespace staging_arena_test
}  // namespace lifeline
