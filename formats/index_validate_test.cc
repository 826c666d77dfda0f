// ValidateIndex and EncodeIndex on a caller's mistakes, and the file name rule.
#include "formats/index_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/index_test_kit.h"

namespace lifeline::format {
namespace index_validate_test {

using ::testing::AllOf;
using ::testing::HasSubstr;

// ---- ValidateIndex and EncodeIndex on caller input ----

TEST(ValidateIndexTest, CallerMistakesAreInvalidArgument) {
  struct Case {
    const char* expect;
    void (*mutate)(CheckpointIndex*);
  } cases[] = {
      {"world size 0", [](CheckpointIndex* i) { i->world_size = 0; }},
      {"world size 1048577", [](CheckpointIndex* i) { i->world_size = kMaxWorldSize + 1; }},
      {"manifest carries rank 2", [](CheckpointIndex* i) { i->kind = IndexKind::kManifest; }},
      {"unknown index kind 0", [](CheckpointIndex* i) { i->kind = static_cast<IndexKind>(0); }},
      {"chunk size 4", [](CheckpointIndex* i) { i->chunk_bytes = 4; }},
      {"duplicate name 'optim.m'", [](CheckpointIndex* i) { i->tensors[0].name = "optim.m"; }},
      {"tensor 0: empty name", [](CheckpointIndex* i) { i->tensors[0].name.clear(); }},
      {"exceeds 4096", [](CheckpointIndex* i) { i->tensors[0].name.assign(kMaxNameBytes + 1, 'x'); }},
      {"invalid dtype code 13", [](CheckpointIndex* i) { i->tensors[0].dtype = static_cast<DType>(13); }},
      {"33 dimensions", [](CheckpointIndex* i) { i->tensors[0].shape.assign(33, 1); }},
      {"duplicate file name",
       [](CheckpointIndex* i) { i->files.push_back(i->files[0]); }},
      {"unsafe file name '..'", [](CheckpointIndex* i) { i->files[0].name = ".."; }},
      {"fragment 1 of tensor 'optim.m': 2 chunks, but 56 bytes in chunks of 64 need 1",
       [](CheckpointIndex* i) { i->fragments[1].num_chunks = 2; }},
      {"stores 63 bytes, but an uncompressed chunk holds 48",
       [](CheckpointIndex* i) { i->chunks[0].stored_length = 63; }},
      {"lie outside file", [](CheckpointIndex* i) { i->files[0].size = 4096 + 96; }},
      {"fragment 0 of tensor 'layers.3.w'",
       [](CheckpointIndex* i) { i->fragments[0].region.shape[0] = 5; }},
      {"unknown codec 3", [](CheckpointIndex* i) { i->fragments[0].codec = static_cast<Codec>(3); }},
      {"object 'rng': rank 1", [](CheckpointIndex* i) { i->objects[0].rank = 1; }},
      {"object 1: empty name", [](CheckpointIndex* i) { i->objects[1].name.clear(); }},
  };
  for (const Case& c : cases) {
    CheckpointIndex index = SmallIndex();
    c.mutate(&index);
    Status s = ValidateIndex(index, "caller", /*untrusted=*/false);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.expect << ": " << s.ToString();
    EXPECT_THAT(s.message(), AllOf(HasSubstr("caller"), HasSubstr(c.expect)));
    EXPECT_TRUE(ValidateIndex(index, "disk", /*untrusted=*/true).IsCorruption()) << c.expect;
    Result<std::string> encoded = EncodeIndex(index);
    EXPECT_FALSE(encoded.ok()) << c.expect;
    if (!encoded.ok()) {
      EXPECT_EQ(encoded.status().code(), StatusCode::kInvalidArgument);
    }
  }
  EXPECT_TRUE(ValidateIndex(SmallIndex(), "caller", false).ok());
}

TEST(ValidateIndexTest, CompressedChunksMayHaveAnyLength) {
  CheckpointIndex index = SmallIndex();
  index.fragments[0].codec = Codec::kZstd;
  index.chunks[0].stored_length = 3;  // the file is only required to hold the stored bytes
  EXPECT_TRUE(ValidateIndex(index, "x", false).ok());
}

TEST(IsSafeFileNameTest, AcceptsOnlyHarmlessComponents) {
  for (std::string_view ok : {"a", "0123456789abcdef.r000001-of-000008.data", "x.of-000008.manifest", "A_b-c.9"})
    EXPECT_TRUE(IsSafeFileName(ok)) << ok;
  EXPECT_TRUE(IsSafeFileName(std::string(kMaxFileNameBytes, 'a')));
  for (std::string_view bad : std::vector<std::string_view>{"", ".", "..", "../x", "/etc/passwd", "a/b", ".hidden", "a\\b", "a b", "caf\xc3\xa9",
                               std::string_view("a\0b", 3)})
    EXPECT_FALSE(IsSafeFileName(bad)) << bad;
  EXPECT_FALSE(IsSafeFileName(std::string(kMaxFileNameBytes + 1, 'a')));
}

}  // namespace index_validate_test
}  // namespace lifeline::format
