// DecodeIndex on hostile bytes: every truncation, flipped byte, absurd count and bad reference is
// Corruption (or NotSupported for a newer version), never a crash.
#include "formats/index_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/index_test_kit.h"

namespace lifeline::format {
namespace index_decode_test {

using ::testing::AllOf;
using ::testing::HasSubstr;

Status DecodeStatus(const std::string& bytes) {
  Result<CheckpointIndex> r = DecodeIndex(bytes, "r000002.index");
  return r.ok() ? Status::OK() : r.status();
}

// Replaces the bytes of `from` in the string table by `to` (same length).
void ReplaceString(std::string* b, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  const size_t at = b->find(from, SectionStart(*b, kStrings));
  ASSERT_NE(at, std::string::npos);
  std::memcpy(b->data() + at, to.data(), to.size());
  Reseal(b);
}

// ---- hostile bytes ----

TEST(IndexCodecTest, EveryTruncationIsCorruption) {
  const std::string bytes = MustEncode(SmallIndex());
  for (size_t n = 0; n < bytes.size(); ++n) {
    Status s = DecodeStatus(bytes.substr(0, n));
    ASSERT_TRUE(s.IsCorruption()) << "prefix " << n << ": " << s.ToString();
  }
  Status s = DecodeStatus(bytes + "x");
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_THAT(s.message(), HasSubstr("trailing bytes"));
}

TEST(IndexCodecTest, EveryFlippedByteIsCorruption) {
  const std::string bytes = MustEncode(SmallIndex());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80, 0xff}) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      Status s = DecodeStatus(bad);
      ASSERT_TRUE(s.IsCorruption()) << "byte " << i << " ^ " << int(mask) << ": " << s.ToString();
    }
  }
}

TEST(IndexCodecTest, ChecksumMismatchesAreNamed) {
  std::string bytes = MustEncode(SmallIndex());
  std::string bad = bytes;
  bad[40] ^= 1;  // inside the header
  EXPECT_THAT(DecodeStatus(bad).message(), AllOf(HasSubstr("r000002.index"), HasSubstr("header checksum")));
  bad = bytes;
  bad[SectionStart(bad, kChunks) + 3] ^= 1;  // inside the body
  EXPECT_THAT(DecodeStatus(bad).message(), HasSubstr("checksum mismatch"));
}

TEST(IndexCodecTest, RejectsWrongMagic) {
  std::string bytes = MustEncode(SmallIndex());
  bytes[0] = 'X';
  Status s = DecodeStatus(bytes);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_THAT(s.message(), HasSubstr("bad magic"));
  EXPECT_THAT(DecodeStatus("hello, world: definitely not an index").message(), HasSubstr("bad magic"));
}

TEST(IndexCodecTest, RejectsNewerVersionClearly) {
  std::string bytes = MustEncode(SmallIndex());
  PutU32(&bytes, 8, 2);
  Reseal(&bytes);
  Status s = DecodeStatus(bytes);
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.ToString();
  EXPECT_THAT(s.message(), AllOf(HasSubstr("version 2"), HasSubstr("newer")));

  // A newer version may have a longer header: still recognised as newer, not as damage.
  std::string longer = bytes.substr(0, 200) + std::string(64, '\0') + bytes.substr(200);
  PutU32(&longer, kHeaderLengthAt, 208 + 64);
  Reseal(&longer);
  EXPECT_EQ(DecodeStatus(longer).code(), StatusCode::kNotSupported);

  PutU32(&bytes, 8, 0);
  Reseal(&bytes);
  EXPECT_TRUE(DecodeStatus(bytes).IsCorruption());
}

TEST(IndexCodecTest, AbsurdCountsFailFastWithoutAllocating) {
  const std::string good = MustEncode(SmallIndex());
  for (int section = kFiles; section <= kObjects; ++section) {
    for (uint64_t count : {uint64_t{1} << 40, uint64_t{1} << 61, ~uint64_t{0}}) {
      std::string bytes = good;
      PutU64(&bytes, kCountsAt + 8 * section, count);
      Reseal(&bytes);
      Status s = DecodeStatus(bytes);
      ASSERT_TRUE(s.IsCorruption()) << s.ToString();
      // Count and byte length agreeing, but far beyond the file.
      PutU64(&bytes, kSectionBytesAt + 8 * section, count * 16);
      Reseal(&bytes);
      s = DecodeStatus(bytes);
      ASSERT_TRUE(s.IsCorruption()) << s.ToString();
    }
  }
  for (size_t field : {size_t{168}, size_t{176}, size_t{184}, size_t{192}}) {  // run id, metadata refs
    std::string bytes = good;
    PutU64(&bytes, field, uint64_t{1} << 40);
    Reseal(&bytes);
    Status s = DecodeStatus(bytes);
    ASSERT_TRUE(s.IsCorruption()) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("string table"));
  }
  // A tiny file claiming 2^40 fragments.
  std::string tiny = good.substr(0, 208) + good.substr(good.size() - 16);
  for (int i = 0; i < 7; ++i) PutU64(&tiny, kSectionBytesAt + 8 * i, 0);
  for (int i = 0; i < 6; ++i) PutU64(&tiny, kCountsAt + 8 * i, 0);
  PutU64(&tiny, 168, 0);
  PutU64(&tiny, 176, 0);
  PutU64(&tiny, 184, 0);
  PutU64(&tiny, 192, 0);
  PutU64(&tiny, 56, tiny.size());
  Reseal(&tiny);
  ASSERT_TRUE(DecodeStatus(tiny).ok()) << DecodeStatus(tiny).ToString();
  PutU64(&tiny, kCountsAt + 8 * kFragments, uint64_t{1} << 40);
  PutU64(&tiny, kSectionBytesAt + 8 * kFragments, (uint64_t{1} << 40) * 64);
  Reseal(&tiny);
  Status s = DecodeStatus(tiny);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_THAT(s.message(), HasSubstr("fragments section"));
}

TEST(IndexCodecTest, RejectsOverlappingStrings) {
  // Two tensors' names pointing at the same bytes would let a small file decode into a huge one.
  IndexBuilder b(0, 1);
  b.Tensor("aaaa", DType::kF32, {});
  b.Tensor("bbbb", DType::kF32, {});
  std::string bytes = MustEncode(b.index());
  const size_t t1 = SectionStart(bytes, kTensors) + 24;
  PutU64(&bytes, t1, GetU64(bytes, t1 - 24));  // "aaaabbbb": 4 bytes more than the table holds
  PutU32(&bytes, t1 + 8, 8);
  Reseal(&bytes);
  Status s = DecodeStatus(bytes);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_THAT(s.message(), HasSubstr("overlap"));
}

TEST(IndexCodecTest, RejectsOutOfRangeReferences) {
  const std::string good = MustEncode(SmallIndex());
  const size_t frag0 = SectionStart(good, kFragments);
  struct Case {
    size_t at;
    uint64_t value;
    int width;
    const char* expect;
  } cases[] = {
      {frag0 + 0, 2, 4, "tensor 2 out of range"},
      {frag0 + 4, 1, 4, "file 1 out of range"},
      {frag0 + 16, 99, 8, "out of range (2 chunks)"},
      {frag0 + 64 + 16, 0, 8, "earlier fragment"},
      {frag0 + 24, 7, 8, "7 chunks"},
      {frag0 + 8, 1ull << 63, 8, "outside file"},
      {frag0 + 57, 9, 1, "unknown codec 9"},
      {frag0 + 56, 3, 1, "dimensions"},
      {frag0 + 56, 200, 1, "outside the pool"},
      {frag0 + 48, 1ull << 40, 8, "outside the pool"},
      {frag0 + 32, static_cast<uint64_t>(-1), 8, "flat range"},
      {SectionStart(good, kObjects) + 16, 3, 4, "file 3 out of range"},
      {SectionStart(good, kObjects) + 32, 1ull << 40, 8, "outside file"},
      {SectionStart(good, kObjects) + 12, 0, 4, "rank 0 is not the index's rank 2"},
      {SectionStart(good, kFiles) + 12, 5, 4, "rank 5"},
      {SectionStart(good, kTensors) + 12, 0, 1, "invalid dtype code 0"},
      {SectionStart(good, kTensors) + 13, 40, 1, "dimensions exceed"},
      {16, 3, 1, "unknown index kind 3"},
      {20, 4, 4, "rank 4 is not below world size 4"},
      {24, 0, 4, "world size 0"},
      {40, 12, 8, "chunk size 12"},
      {40, 0, 8, "chunk size 0"},
  };
  for (const Case& c : cases) {
    std::string bytes = good;
    if (c.width == 8) PutU64(&bytes, c.at, c.value);
    if (c.width == 4) PutU32(&bytes, c.at, static_cast<uint32_t>(c.value));
    if (c.width == 1) bytes[c.at] = static_cast<char>(c.value);
    Reseal(&bytes);
    Status s = DecodeStatus(bytes);
    EXPECT_TRUE(s.IsCorruption()) << c.expect << ": " << s.ToString();
    EXPECT_THAT(s.message(), AllOf(HasSubstr("r000002.index"), HasSubstr(c.expect)));
  }
}

TEST(IndexCodecTest, RejectsRegionOutsideTensor) {
  std::string bytes = MustEncode(SmallIndex());
  // Dims pool: tensor shapes (2 + 2), then fragment 0's offsets {4, 0} and shape {4, 6}.
  const size_t offsets0 = SectionStart(bytes, kDims) + 8 * 4;
  PutU64(&bytes, offsets0, 5);  // rows 5..8 of an 8-row tensor
  Reseal(&bytes);
  Status s = DecodeStatus(bytes);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_THAT(s.message(), AllOf(HasSubstr("r000002.index"), HasSubstr("fragment 0 of tensor 'layers.3.w'"),
                                 HasSubstr("exceeds")));
}

TEST(IndexCodecTest, RejectsOverflowingShape) {
  std::string bytes = MustEncode(SmallIndex());
  const size_t shape0 = SectionStart(bytes, kDims);
  PutU64(&bytes, shape0, uint64_t{1} << 40);
  PutU64(&bytes, shape0 + 8, uint64_t{1} << 40);
  Reseal(&bytes);
  Status s = DecodeStatus(bytes);
  EXPECT_TRUE(s.IsCorruption());
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'layers.3.w'"), HasSubstr("overflows")));

  PutU64(&bytes, shape0, static_cast<uint64_t>(-8));
  Reseal(&bytes);
  EXPECT_THAT(DecodeStatus(bytes).message(), HasSubstr("negative"));
}

TEST(IndexCodecTest, RejectsUnsafeFileNames) {
  const std::string valid = "0123456789abcdef.r000002-of-000004.data";
  for (const std::string& hostile : std::vector<std::string>{"..", "../x", "/etc/passwd", "a/b", ".hidden", "x\\y", "a b", std::string("a\0b", 3)}) {
    IndexBuilder b(2, 4);
    const std::string placeholder(hostile.size(), 'Q');
    b.index().files[0].name = placeholder;
    std::string bytes = MustEncode(b.index());
    ReplaceString(&bytes, placeholder, hostile);
    Status s = DecodeStatus(bytes);
    EXPECT_TRUE(s.IsCorruption()) << hostile;
    EXPECT_THAT(s.message(), HasSubstr("unsafe file name")) << hostile;
  }
  // Empty name: a zero length in the file record.
  IndexBuilder b(2, 4);
  std::string bytes = MustEncode(b.index());
  PutU32(&bytes, SectionStart(bytes, kFiles) + 8, 0);
  Reseal(&bytes);
  // The now unreferenced name bytes are harmless; the empty name is not.
  EXPECT_THAT(DecodeStatus(bytes).message(), HasSubstr("unsafe file name ''"));
  // Longer than one path component allows.
  PutU32(&bytes, SectionStart(bytes, kFiles) + 8, 256);
  Reseal(&bytes);
  EXPECT_THAT(DecodeStatus(bytes).message(), HasSubstr("exceeds the limit of 255"));
}

TEST(IndexCodecTest, RejectsBadNames) {
  IndexBuilder b(0, 1);
  b.Tensor("abc", DType::kF32, {});
  b.Tensor("abd", DType::kF32, {});
  b.Object("obj", 1);
  const std::string good = MustEncode(b.index());
  std::string bytes = good;
  ReplaceString(&bytes, "abd", "abc");
  EXPECT_THAT(DecodeStatus(bytes).message(), HasSubstr("duplicate name 'abc'"));
  bytes = good;
  ReplaceString(&bytes, "abd", std::string("a\0d", 3));
  EXPECT_THAT(DecodeStatus(bytes).message(), HasSubstr("NUL"));
  bytes = good;
  PutU32(&bytes, SectionStart(bytes, kObjects) + 8, 0);
  Reseal(&bytes);
  EXPECT_THAT(DecodeStatus(bytes).message(), HasSubstr("object 0: empty name"));
}

TEST(IndexCodecTest, DecodesHostileRandomBytesWithoutCrashing) {
  // Cheap stand-in for the fuzzer in CI: random edits of a valid index, resealed or not.
  const std::string good = MustEncode(SmallIndex());
  std::mt19937_64 rng(42);
  for (int iter = 0; iter < 20000; ++iter) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0: bytes[at] = static_cast<char>(rng()); break;
        case 1: if (at + 8 <= bytes.size()) PutU64(&bytes, at, rng() >> (rng() % 64)); break;
        case 2: if (at + 4 <= bytes.size()) PutU32(&bytes, at, static_cast<uint32_t>(rng() % 64)); break;
      }
    }
    if (bytes.size() >= 224 && GetU32(bytes, kHeaderLengthAt) == 208) Reseal(&bytes);
    Result<CheckpointIndex> r = DecodeIndex(bytes, "random");
    if (r.ok()) {
      Result<std::string> again = EncodeIndex(*r);
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      Result<CheckpointIndex> r2 = DecodeIndex(*again, "again");
      ASSERT_TRUE(r2.ok());
      ASSERT_TRUE(*r2 == *r);
    }
  }
}

}  // namespace index_decode_test
}  // namespace lifeline::format
