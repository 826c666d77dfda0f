// The names of a checkpoint's files and the data-file header (formats/SPEC.md, "Directory
// layout"): what is written parses back, anything else is not taken for a checkpoint file, and
// every change to a header is caught.
#include "lib/src/store/checkpoint_layout.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace lifeline {
namespace checkpoint_layout_test {

constexpr char kHash[] = "0123456789abcdef";

TEST(CheckpointLayoutTest, StepDirectoriesSortByStepAndParseBack) {
  EXPECT_EQ("step-00000000000000000100", StepDirName(100));
  // Zero-padded to 20 digits, so a directory listing sorted by name is sorted by step.
  EXPECT_LT(StepDirName(9), StepDirName(10));
  EXPECT_EQ(UINT64_MAX, ParseStepDirName(StepDirName(UINT64_MAX)));
  EXPECT_EQ(7u, ParseStepDirName(StepDirName(7)));
  for (const char* other : {"step-100", "step-0000000000000000010x", "steps-00000000000000000100",
                            "step-00000000000000000100.tmp", ""})
    EXPECT_FALSE(ParseStepDirName(other).has_value()) << other;
}

TEST(CheckpointLayoutTest, RunHashIsSixteenLowercaseHexDigitsAndStable) {
  const std::string h = RunHash("job-42:0");
  ASSERT_EQ(16u, h.size());
  for (char c : h) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << h;
  EXPECT_EQ(h, RunHash("job-42:0"));
  EXPECT_NE(h, RunHash("job-42:1"));  // a relaunch writes files of its own
}

TEST(CheckpointLayoutTest, RankFileNamesParseBackToRankAndWorld) {
  const std::string index = IndexFileName(kHash, 3, 8);
  EXPECT_EQ("0123456789abcdef.r000003-of-000008.index", index);
  EXPECT_EQ("0123456789abcdef.r000003-of-000008.data", DataFileName(kHash, 3, 8));
  auto parsed = ParseIndexFileName(index);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(kHash, parsed->run_hash);
  EXPECT_EQ(3u, parsed->rank);
  EXPECT_EQ(8u, parsed->world_size);

  auto manifest = ParseManifestFileName(ManifestFileName(kHash, 8));
  ASSERT_TRUE(manifest.has_value());
  EXPECT_EQ(8u, manifest->world_size);
  auto invalid = ParseInvalidMarkerFileName(InvalidMarkerFileName(kHash, 8));
  ASSERT_TRUE(invalid.has_value());
  EXPECT_EQ(kHash, invalid->run_hash);
  // A manifest is not a marker, nor the other way round.
  EXPECT_FALSE(ParseInvalidMarkerFileName(ManifestFileName(kHash, 8)).has_value());
  EXPECT_FALSE(ParseManifestFileName(InvalidMarkerFileName(kHash, 8)).has_value());
}

TEST(CheckpointLayoutTest, NamesThatAreNotCheckpointFilesAreRefused) {
  const std::vector<std::string> not_indexes = {
      DataFileName(kHash, 0, 1),                          // a data file
      IndexFileName(kHash, 8, 8),                         // rank beyond the world
      IndexFileName(kHash, 0, 0),                         // empty world
      "0123456789ABCDEF.r000000-of-000001.index",         // uppercase hash
      IndexFileName(kHash, 0, 1) + ".tmp-1234",           // a temporary file
      "../" + IndexFileName(kHash, 0, 1).substr(3),       // a path
  };
  for (const std::string& n : not_indexes) EXPECT_FALSE(ParseIndexFileName(n).has_value()) << n;
  EXPECT_FALSE(ParseManifestFileName(ManifestFileName(kHash, 0)).has_value());
  EXPECT_TRUE(IsTempFileName(IndexFileName(kHash, 0, 1) + ".tmp-99"));
  EXPECT_FALSE(IsTempFileName(IndexFileName(kHash, 0, 1)));
}

TEST(CheckpointLayoutTest, DataHeaderRoundTripsAndAnyChangedByteIsCorruptionNamingTheFile) {
  std::vector<uint8_t> block(kDataHeaderBytes);
  EncodeDataHeader(2, 4, 100, kHash, block.data());
  EXPECT_EQ(0, std::memcmp(block.data(), "LLDATA01", 8));
  EXPECT_TRUE(CheckDataHeader(block.data(), 2, 4, 100, kHash, "/c/f.data").ok());

  // Every byte of the block is covered: the fields by the checksum, the rest by the zero rule.
  for (size_t i : {0ul, 8ul, 12ul, 24ul, 32ul, 40ul, 48ul, 4095ul}) {
    std::vector<uint8_t> bad = block;
    bad[i] ^= 0x40;
    Status s = CheckDataHeader(bad.data(), 2, 4, 100, kHash, "/c/f.data");
    EXPECT_TRUE(s.IsCorruption()) << "byte " << i << ": " << s.ToString();
    EXPECT_NE(std::string::npos, s.ToString().find("/c/f.data")) << s.ToString();
  }
}

TEST(CheckpointLayoutTest, DataHeaderOfAnotherRankStepOrAttemptIsRefused) {
  std::vector<uint8_t> block(kDataHeaderBytes);
  EncodeDataHeader(2, 4, 100, kHash, block.data());
  EXPECT_TRUE(CheckDataHeader(block.data(), 1, 4, 100, kHash, "f").IsCorruption());
  EXPECT_TRUE(CheckDataHeader(block.data(), 2, 8, 100, kHash, "f").IsCorruption());
  EXPECT_TRUE(CheckDataHeader(block.data(), 2, 4, 101, kHash, "f").IsCorruption());
  EXPECT_TRUE(CheckDataHeader(block.data(), 2, 4, 100, "fedcba9876543210", "f").IsCorruption());
}

TEST(CheckpointLayoutTest, RunIdFromEnvironmentPrefersTheAgentsLaunchId) {
  const char* keys[] = {"LIFELINE_LAUNCH_ID", "LIFELINE_JOB", "LIFELINE_RESTART", "TORCHELASTIC_RUN_ID",
                        "TORCHELASTIC_RESTART_COUNT"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* k : keys) {
    if (const char* v = std::getenv(k)) saved.emplace_back(k, v);
    ::unsetenv(k);
  }
  EXPECT_EQ("", RunIdFromEnvironment());
  ::setenv("TORCHELASTIC_RUN_ID", "none", 1);  // torchrun's default: the same for every launch
  EXPECT_EQ("", RunIdFromEnvironment());
  ::setenv("TORCHELASTIC_RUN_ID", "r1", 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  EXPECT_EQ("torchelastic:r1:2", RunIdFromEnvironment());
  ::setenv("LIFELINE_JOB", "j", 1);
  ::setenv("LIFELINE_RESTART", "3", 1);
  EXPECT_EQ("lifeline:j:3", RunIdFromEnvironment());
  ::setenv("LIFELINE_LAUNCH_ID", "L7", 1);
  EXPECT_EQ("lifeline:L7", RunIdFromEnvironment());
  for (const char* k : keys) ::unsetenv(k);
  for (const auto& [k, v] : saved) ::setenv(k.c_str(), v.c_str(), 1);
}

}  // namespace checkpoint_layout_test
}  // namespace lifeline
