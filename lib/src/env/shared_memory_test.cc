#include "lifeline/internal/shared_memory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

namespace lifeline {
namespace shared_memory_test {

class SharedMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/lifeline-shm-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_EQ(system(("rm -rf " + dir_).c_str()), 0); }
  std::string dir_;
};

TEST_F(SharedMemoryTest, TwoMappingsOfOneFileSeeEachOthersWritesAndOutliveTheDescriptor) {
  const std::string path = dir_ + "/slot";
  MappedRegion a, b;
  {
    Result<OwnedFd> fd = OpenSharedFile(path, CreateMode::kOpenOrCreate);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    ASSERT_TRUE(SizeSharedFile(fd->get(), 1 << 20, /*reserve=*/true, path).ok());
    Result<MappedRegion> r = MappedRegion::MapFile(fd->get(), 1 << 20, true, path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    a = std::move(*r);
  }  // the descriptor is closed: the mapping stays
  {
    Result<OwnedFd> fd = OpenSharedFile(path, CreateMode::kOpenOrCreate);
    ASSERT_TRUE(fd.ok());
    Result<MappedRegion> r = MappedRegion::MapFile(fd->get(), 1 << 20, false, path);
    ASSERT_TRUE(r.ok());
    b = std::move(*r);
  }
  std::memcpy(a.data() + 4096, "lifeline", 8);
  EXPECT_EQ(std::memcmp(b.data() + 4096, "lifeline", 8), 0);
  a.Prefault();  // keeps what is there
  EXPECT_EQ(std::memcmp(a.data() + 4096, "lifeline", 8), 0);
}

TEST_F(SharedMemoryTest, AFreshFileIsANewInodeAndKeepsTheOldMappingApart) {
  const std::string path = dir_ + "/ring";
  Result<OwnedFd> first = OpenSharedFile(path, CreateMode::kFresh);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(SizeSharedFile(first->get(), 4096, false, path).ok());
  Result<MappedRegion> old_map = MappedRegion::MapFile(first->get(), 4096, true, path);
  ASSERT_TRUE(old_map.ok());
  Result<OwnedFd> second = OpenSharedFile(path, CreateMode::kFresh);
  ASSERT_TRUE(second.ok());
  Result<FileIdentity> a = IdentifyFile(first->get(), path), b = IdentifyFile(second->get(), path);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->ino, b->ino);
  EXPECT_EQ(b->size, 0u);
  old_map->data()[0] = 7;  // writes to the unlinked inode, not the new file
  ASSERT_TRUE(SizeSharedFile(second->get(), 4096, false, path).ok());
  Result<MappedRegion> new_map = MappedRegion::MapFile(second->get(), 4096, false, path);
  ASSERT_TRUE(new_map.ok());
  EXPECT_EQ(new_map->data()[0], 0);
}

TEST_F(SharedMemoryTest, ASymbolicLinkIsNeverFollowed) {
  const std::string target = dir_ + "/target", link = dir_ + "/link";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  Result<OwnedFd> fd = OpenSharedFile(link, CreateMode::kOpenOrCreate);
  EXPECT_FALSE(fd.ok());
  EXPECT_NE(fd.status().ToString().find(link), std::string::npos) << fd.status().ToString();
  struct stat st;
  EXPECT_NE(lstat(target.c_str(), &st), 0);  // nothing created through the link
}

// A memory-tier slot has a predictable name: a hard link planted there must not make the tier
// write into another file, and a FIFO must not block the open.
TEST_F(SharedMemoryTest, AHardLinkOrFifoAtTheSlotIsReplacedNotWrittenThrough) {
  const std::string outside = dir_ + "/outside", slot = dir_ + "/slot0", fifo = dir_ + "/slot1";
  FILE* f = fopen(outside.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("keep me", f);
  fclose(f);
  ASSERT_EQ(link(outside.c_str(), slot.c_str()), 0);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {slot, fifo}) {
    Result<OwnedFd> fd = OpenSharedFile(path, CreateMode::kOpenOrCreate);
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    ASSERT_TRUE(SizeSharedFile(fd->get(), 4096, false, path).ok());
    ASSERT_EQ(pwrite(fd->get(), "overwritten", 11, 0), 11);
    struct stat st;
    ASSERT_EQ(fstat(fd->get(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_nlink, 1u);
  }
  char buf[16] = {};
  f = fopen(outside.c_str(), "r");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(fread(buf, 1, sizeof(buf) - 1, f), 7u);
  fclose(f);
  EXPECT_STREQ(buf, "keep me");
}

TEST_F(SharedMemoryTest, AReservationLargerThanTheFileSystemIsResourceExhaustedNamingTheFile) {
  const std::string path = dir_ + "/huge";
  Result<OwnedFd> fd = OpenSharedFile(path, CreateMode::kOpenOrCreate);
  ASSERT_TRUE(fd.ok());
  Status s = SizeSharedFile(fd->get(), uint64_t{1} << 50, /*reserve=*/true, path);  // 1 PiB
  ASSERT_FALSE(s.ok());
  // ENOSPC from the reservation; a file system that refuses the size itself says EFBIG.
  EXPECT_TRUE(s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kIOError)
      << s.ToString();
  EXPECT_NE(s.ToString().find(path), std::string::npos) << s.ToString();
}

TEST(MappedRegionTest, AnonymousMemoryIsZeroedAndMovesWithItsOwner) {
  Result<MappedRegion> r = MappedRegion::Anonymous(2 << 20, /*huge_pages=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->data()[12345], 0);
  MappedRegion moved = std::move(*r);
  EXPECT_FALSE(r->mapped());
  EXPECT_TRUE(moved.mapped());
  EXPECT_EQ(moved.size(), 2u << 20);
  moved.Reset();
  EXPECT_FALSE(moved.mapped());
}

}  // namespace shared_memory_test
}  // namespace lifeline
