// Classifying a step directory from its listing (ScanStep): what a damaged or hostile listing
// costs. Found by tests/fuzz/manifest_read_fuzz.
#include "lib/src/store/step_scan.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>

#include "lib/src/store/checkpoint_layout.h"
#include "lifeline/env.h"

namespace lifeline {
namespace step_scan_test {

// Counts GetFileSize calls, the per-file lookup of a scan.
class SizeCountingEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  Result<uint64_t> GetFileSize(const std::string& path) override {
    ++calls;
    return EnvWrapper::GetFileSize(path);
  }
  std::atomic<int64_t> calls{0};
};

// A rank index named for a world of 999999 ranks used to make every scan probe the data and index
// file of each of those ranks: two million lookups (seconds on a real file system) for one stray
// name. The scan sizes the attempt from the listing instead.
TEST(ScanStepTest, AHugeWorldSizeInAFileNameCostsNoPerRankLookups) {
  std::unique_ptr<MemEnv> mem = NewMemEnv();
  SizeCountingEnv env(mem.get());
  const std::string dir = JoinPath("/ck", StepDirName(5));
  ASSERT_TRUE(env.CreateDir("/ck").ok());
  ASSERT_TRUE(env.CreateDir(dir).ok());
  const std::string hash = "0123456789abcdef";
  ASSERT_TRUE(WriteFileAtomically(&env, JoinPath(dir, IndexFileName(hash, 3, 999999)), "not an index").ok());
  ASSERT_TRUE(WriteFileAtomically(&env, JoinPath(dir, DataFileName(hash, 3, 999999)), std::string(100, 'd')).ok());
  ASSERT_TRUE(WriteFileAtomically(&env, JoinPath(dir, DataFileName("fedcba9876543210", 0, 1)), "other").ok());
  env.calls = 0;

  Result<StepState> state = ScanStep(&env, dir, 5);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_FALSE(state->info.complete);
  EXPECT_EQ(state->info.world_size, 999999u);
  EXPECT_EQ(state->info.ranks_present, 1u);
  EXPECT_EQ(state->info.bytes, std::string("not an index").size() + 100);  // the attempt's files only
  EXPECT_LE(env.calls, 3);
}

}  // namespace step_scan_test
}  // namespace lifeline
