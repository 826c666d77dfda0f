// The read-only directory API of lifeline/checkpoint.h that the agent and the CLI use instead of
// the library's internals: scanning, the metadata check, the memory tier's root, and verification
// that names the damage.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace checkpoint_directory_test {

class CheckpointDirectoryTest : public ::testing::Test {
 protected:
  void SaveSteps(std::vector<uint64_t> steps) {
    auto c = Checkpointer::Open(test::InMemoryCheckpointerOptions(env_.get(), "directory-test", 1024));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<float> w(4096, 1.5f);
    for (uint64_t step : steps) {
      SaveRequest r;
      r.tensors.push_back(TensorShard::Whole("w", DType::kF32, {static_cast<int64_t>(w.size())}, w.data()));
      ASSERT_TRUE((*c)->Save(step, r).WaitPersisted().ok());
    }
  }
  std::string DataFile(uint64_t step) {
    auto all = ScanCheckpointDirectory("/ckpt", env_.get());
    EXPECT_TRUE(all.ok());
    for (const CheckpointInfo& info : *all)
      if (info.step == step) return JoinPath(info.directory, DataFileName(RunHash("directory-test"), 0, 1));
    return "";
  }
  std::unique_ptr<MemEnv> env_ = NewMemEnv();
};

TEST_F(CheckpointDirectoryTest, ScanListsStepsNewestFirstAndTheirMetadataChecksOut) {
  SaveSteps({3, 7});
  auto all = ScanCheckpointDirectory("/ckpt", env_.get());
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].step, 7u);
  EXPECT_EQ((*all)[1].step, 3u);
  for (const CheckpointInfo& info : *all) {
    EXPECT_TRUE(info.complete);
    EXPECT_TRUE(CheckCheckpointMetadata(info, env_.get()).ok());
  }
  // A directory with no memory tier says so.
  EXPECT_FALSE(FindMemoryTierOf("/ckpt", env_.get()).ok());
}

TEST_F(CheckpointDirectoryTest, VerifyChecksEveryChunkAndNamesTheDamagedFile) {
  SaveSteps({5});
  auto good = VerifyCheckpoint("/ckpt", std::nullopt, env_.get());
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(good->status.ok()) << good->status.ToString();
  EXPECT_EQ(good->step, 5u);
  EXPECT_EQ(good->indexes_checked, 2u);  // the rank index and the manifest
  EXPECT_EQ(good->chunks_checked, 16u);  // 16 KiB of floats in 1 KiB chunks
  EXPECT_GE(good->bytes_checked, 16384u);

  const std::string data = DataFile(5);
  auto bytes = ReadFileToString(env_.get(), data, 1 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  (*bytes)[4096 + 100] ^= 0x40;  // inside the first chunk, after the 4 KiB header
  ASSERT_TRUE(WriteFileAtomically(env_.get(), data, *bytes).ok());
  auto bad = VerifyCheckpoint("/ckpt", 5, env_.get());
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  EXPECT_EQ(bad->status.code(), StatusCode::kCorruption) << bad->status.ToString();
  EXPECT_NE(bad->status.ToString().find(DataFileName(RunHash("directory-test"), 0, 1)), std::string::npos)
      << bad->status.ToString();

  auto missing = VerifyCheckpoint("/ckpt", 6, env_.get());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
}

}  // namespace checkpoint_directory_test
}  // namespace lifeline
