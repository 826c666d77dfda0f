#include "formats/index_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/checksum.h"

namespace lifeline::format {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// ---- building valid indexes ----

int64_t Volume(const std::vector<int64_t>& shape) {
  int64_t v = 1;
  for (int64_t e : shape) v *= e;
  return v;
}

Region BoxRegion(std::vector<int64_t> offsets, std::vector<int64_t> shape) {
  Region r;
  r.flat_end = Volume(shape);
  r.offsets = std::move(offsets);
  r.shape = std::move(shape);
  return r;
}

Region FlatRegion(std::vector<int64_t> tensor_shape, int64_t begin, int64_t end) {
  Region r;
  r.offsets.assign(tensor_shape.size(), 0);
  r.shape = std::move(tensor_shape);
  r.flat_begin = begin;
  r.flat_end = end;
  return r;
}

// Builds a consistent rank index (or manifest) the way a saver would: one data file, fragments'
// chunks packed after a 4096-byte header, objects after the fragments.
class IndexBuilder {
 public:
  IndexBuilder(uint32_t rank, uint32_t world_size, uint64_t chunk_bytes = 64) {
    index_.kind = IndexKind::kRankIndex;
    index_.step = 1200;
    index_.rank = rank;
    index_.world_size = world_size;
    index_.run_id = "job-7:restart-0";
    index_.chunk_bytes = chunk_bytes;
    index_.created_unix_ns = 1700000000123456789ull + rank;
    index_.metadata_json = R"({"epoch": 3, "lr": 0.001})";
    char name[64];
    std::snprintf(name, sizeof(name), "0123456789abcdef.r%06u-of-%06u.data", rank, world_size);
    index_.files.push_back(FileInfo{name, rank, 4096});
  }

  uint32_t Tensor(std::string name, DType dtype, std::vector<int64_t> shape) {
    index_.tensors.push_back(TensorInfo{std::move(name), dtype, std::move(shape)});
    return static_cast<uint32_t>(index_.tensors.size() - 1);
  }

  // Appends a fragment with its chunks; compressed codecs store 3/4 of each chunk's raw length.
  IndexBuilder& Fragment(uint32_t tensor, Region region, Codec codec = Codec::kNone) {
    FragmentInfo fr;
    fr.tensor = tensor;
    fr.file = 0;
    fr.offset = index_.files[0].size;
    fr.codec = codec;
    fr.first_chunk = index_.chunks.size();
    const uint64_t raw = static_cast<uint64_t>(region.num_elements()) * DTypeSize(index_.tensors[tensor].dtype);
    fr.region = std::move(region);
    for (uint64_t pos = 0; pos < raw; pos += index_.chunk_bytes) {
      const uint64_t len = std::min(index_.chunk_bytes, raw - pos);
      const uint64_t stored = codec == Codec::kNone ? len : (len * 3 + 3) / 4;
      index_.chunks.push_back(ChunkInfo{stored, 0x9e3779b97f4a7c15ull * (index_.chunks.size() + 1)});
      index_.files[0].size += stored;
      ++fr.num_chunks;
    }
    index_.fragments.push_back(std::move(fr));
    return *this;
  }

  IndexBuilder& Object(std::string name, uint64_t length) {
    index_.objects.push_back(
        ObjectInfo{std::move(name), index_.rank, 0, index_.files[0].size, length, 0x1234567890abcdefull + length});
    index_.files[0].size += length;
    return *this;
  }

  CheckpointIndex& index() { return index_; }

 private:
  CheckpointIndex index_;
};

// A small rank index touching every kind of record.
CheckpointIndex SmallIndex() {
  IndexBuilder b(2, 4);
  const uint32_t w = b.Tensor("layers.3.w", DType::kBF16, {8, 6});
  const uint32_t m = b.Tensor("optim.m", DType::kF32, {10, 3});
  b.Fragment(w, BoxRegion({4, 0}, {4, 6}));      // tensor-parallel row block
  b.Fragment(m, FlatRegion({10, 3}, 7, 21));     // ZeRO flat range
  b.Object("rng", 24).Object("loader", 9);
  return b.index();
}

std::string MustEncode(const CheckpointIndex& index) {
  Result<std::string> bytes = EncodeIndex(index);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::string();
}

void ExpectRoundTrip(const CheckpointIndex& index) {
  const std::string bytes = MustEncode(index);
  Result<CheckpointIndex> decoded = DecodeIndex(bytes, "rt.index");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(*decoded == index);
}

// ---- reading and patching encoded bytes at the offsets SPEC.md gives ----

uint64_t GetU64(const std::string& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
uint32_t GetU32(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
void PutU64(std::string* b, size_t at, uint64_t v) { std::memcpy(b->data() + at, &v, 8); }
void PutU32(std::string* b, size_t at, uint32_t v) { std::memcpy(b->data() + at, &v, 4); }

constexpr size_t kHeaderLengthAt = 12;
constexpr size_t kCountsAt = 64;
constexpr size_t kSectionBytesAt = 112;
enum SectionId { kFiles = 0, kTensors, kFragments, kChunks, kObjects, kDims, kStrings };

size_t SectionStart(const std::string& b, SectionId s) {
  size_t pos = GetU32(b, kHeaderLengthAt);
  for (int i = 0; i < s; ++i) pos += GetU64(b, kSectionBytesAt + 8 * i);
  return pos;
}

// Recomputes the header checksum and the whole-file checksum after a deliberate edit, so that the
// decoder's structural and semantic checks are what rejects it.
void Reseal(std::string* b) {
  const uint32_t hl = GetU32(*b, kHeaderLengthAt);
  PutU64(b, hl - 8, Checksum64(b->data(), hl - 8));
  const size_t body_end = b->size() - 16;
  PutU64(b, body_end, Checksum64(b->data(), body_end));
}

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

// ---- round trips ----

TEST(IndexCodecTest, RoundTripsRankIndex) { ExpectRoundTrip(SmallIndex()); }

TEST(IndexCodecTest, RoundTripsManifest) {
  CheckpointIndex index = SmallIndex();
  index.kind = IndexKind::kManifest;
  index.rank = kManifestRank;
  index.files.push_back(FileInfo{"0123456789abcdef.r000003-of-000004.data", 3, 10});
  index.objects.push_back(ObjectInfo{"rng", 3, 1, 0, 10, 77});
  ExpectRoundTrip(index);
}

TEST(IndexCodecTest, RoundTripsScalarAndEmptyTensors) {
  IndexBuilder b(0, 1);
  const uint32_t s = b.Tensor("step_count", DType::kI64, {});
  const uint32_t e = b.Tensor("empty", DType::kF32, {0, 5});
  b.Fragment(s, Region{{}, {}, 0, 1});
  b.Fragment(e, BoxRegion({0, 0}, {0, 5}));  // 0 bytes, so 0 chunks
  EXPECT_EQ(b.index().fragments[1].num_chunks, 0u);
  ExpectRoundTrip(b.index());
}

TEST(IndexCodecTest, RoundTripsEmptyIndexWithEmptyStrings) {
  CheckpointIndex index;
  index.chunk_bytes = 8;
  ExpectRoundTrip(index);  // no files, tensors, run id or metadata
}

TEST(IndexCodecTest, RoundTripsEveryDTypeAndCodec) {
  IndexBuilder b(0, 1, 16);
  const Codec codecs[] = {Codec::kNone, Codec::kZstd, Codec::kZstdByteGroup};
  for (uint8_t code = 1; code <= 12; ++code) {
    ASSERT_TRUE(IsValidDType(code));
    const uint32_t t = b.Tensor("t" + std::to_string(code), static_cast<DType>(code), {3, 7});
    b.Fragment(t, BoxRegion({0, 0}, {2, 7}), codecs[code % 3]);
    b.Fragment(t, BoxRegion({2, 0}, {1, 7}), codecs[(code + 1) % 3]);
  }
  ExpectRoundTrip(b.index());
}

TEST(IndexCodecTest, RoundTripsLargeNamesAndHighRank) {
  IndexBuilder b(0, 1);
  std::vector<int64_t> shape(kMaxRank, 1);
  shape[0] = 3;
  const uint32_t t = b.Tensor(std::string(kMaxNameBytes, 'n'), DType::kU8, shape);
  std::vector<int64_t> offsets(kMaxRank, 0);
  b.Fragment(t, BoxRegion(offsets, shape));
  b.Object(std::string(kMaxNameBytes, 'o'), 3);
  b.index().files[0].name = std::string(kMaxFileNameBytes, 'f');
  b.index().metadata_json = std::string(100000, '{');
  ExpectRoundTrip(b.index());
}

TEST(IndexCodecTest, RoundTripsOneMillionFragments) {
  // A manifest-sized index: 1M fragments over 8 ranks' files, mixing boxes and flat ranges.
  constexpr int64_t kRows = 1 << 20;
  CheckpointIndex index;
  index.kind = IndexKind::kManifest;
  index.rank = kManifestRank;
  index.world_size = 8;
  index.step = 5;
  index.run_id = "big";
  index.chunk_bytes = 64;
  index.tensors.push_back(TensorInfo{"embedding", DType::kF32, {kRows, 4}});
  for (uint32_t r = 0; r < 8; ++r)
    index.files.push_back(FileInfo{"f.r00000" + std::to_string(r) + "-of-000008.data", r, 4096});
  index.fragments.reserve(kRows);
  index.chunks.reserve(kRows);
  for (int64_t i = 0; i < kRows; ++i) {
    FragmentInfo fr;
    const uint32_t file = static_cast<uint32_t>(i % 8);
    fr.tensor = 0;
    fr.file = file;
    fr.region = (i % 2 == 0) ? BoxRegion({i, 0}, {1, 4}) : FlatRegion({kRows, 4}, i * 4, i * 4 + 4);
    fr.offset = index.files[file].size;
    fr.first_chunk = index.chunks.size();
    fr.num_chunks = 1;
    index.chunks.push_back(ChunkInfo{16, static_cast<uint64_t>(i) * 31});
    index.files[file].size += 16;
    index.fragments.push_back(std::move(fr));
  }
  Result<std::string> bytes = EncodeIndex(index);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  Result<CheckpointIndex> decoded = DecodeIndex(*bytes, "big.manifest");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(*decoded == index);
}

TEST(IndexCodecTest, SharesDimsOfConsecutiveFragmentsOfOneBox) {
  IndexBuilder b(0, 1);
  const uint32_t t = b.Tensor("w", DType::kF32, {4, 4});
  b.Fragment(t, FlatRegion({4, 4}, 0, 5)).Fragment(t, FlatRegion({4, 4}, 5, 16));
  const std::string bytes = MustEncode(b.index());
  EXPECT_EQ(GetU64(bytes, kCountsAt + 8 * kDims), 2u + 4u);  // tensor shape + one shared box
  ExpectRoundTrip(b.index());
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

// ---- BuildManifest ----

// Three ranks splitting "w" [6, 4] by rows, "b" [4] written whole by rank 1, "m" [10] flat-split
// between ranks 0 and 2.
std::vector<CheckpointIndex> ThreeRanks() {
  std::vector<CheckpointIndex> out;
  for (uint32_t r = 0; r < 3; ++r) {
    IndexBuilder b(r, 3, 16);
    const uint32_t w = b.Tensor("w", DType::kF32, {6, 4});
    b.Fragment(w, BoxRegion({2 * r, 0}, {2, 4}));
    if (r == 1) b.Fragment(b.Tensor("b", DType::kBF16, {4}), BoxRegion({0}, {4}));
    if (r != 1) b.Fragment(b.Tensor("m", DType::kF32, {10}), FlatRegion({10}, r == 0 ? 0 : 6, r == 0 ? 6 : 10));
    b.Object("rng", 8 + r);
    b.index().metadata_json = "{\"rank\": " + std::to_string(r) + "}";
    out.push_back(b.index());
  }
  return out;
}

TEST(BuildManifestTest, MergesRanksInAnyOrder) {
  std::vector<CheckpointIndex> ranks = ThreeRanks();
  const std::vector<CheckpointIndex> original = ranks;
  std::swap(ranks[0], ranks[2]);
  Result<CheckpointIndex> m = BuildManifest(ranks);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, IndexKind::kManifest);
  EXPECT_EQ(m->rank, kManifestRank);
  EXPECT_EQ(m->world_size, 3u);
  EXPECT_EQ(m->step, 1200u);
  EXPECT_EQ(m->run_id, "job-7:restart-0");
  EXPECT_EQ(m->metadata_json, "{\"rank\": 0}");
  EXPECT_EQ(m->created_unix_ns, 1700000000123456789ull + 2);
  ASSERT_EQ(m->tensors.size(), 3u);
  EXPECT_EQ(m->tensors[0].name, "w");
  EXPECT_EQ(m->tensors[1].name, "m");  // first seen at rank 0
  EXPECT_EQ(m->tensors[2].name, "b");
  ASSERT_EQ(m->files.size(), 3u);
  ASSERT_EQ(m->objects.size(), 3u);
  size_t chunks = 0, fragments = 0;
  for (const CheckpointIndex& idx : original) {
    chunks += idx.chunks.size();
    fragments += idx.fragments.size();
  }
  EXPECT_EQ(m->chunks.size(), chunks);
  ASSERT_EQ(m->fragments.size(), fragments);

  // Every manifest record, followed through its renumbered references, says what the rank said.
  // Fragments are grouped by tensor (manifest order), in rank order within a tensor, and chunks
  // follow their fragments.
  for (uint32_t r = 0; r < 3; ++r) {
    const CheckpointIndex& idx = original[r];
    EXPECT_EQ(m->files[r], idx.files[0]);
    EXPECT_EQ(m->objects[r].name, "rng");
    EXPECT_EQ(m->objects[r].rank, r);
    EXPECT_EQ(m->files[m->objects[r].file], idx.files[0]);
  }
  size_t next = 0;
  uint64_t next_chunk = 0;
  for (uint32_t t = 0; t < m->tensors.size(); ++t) {
    for (uint32_t r = 0; r < 3; ++r) {
      const CheckpointIndex& idx = original[r];
      for (const FragmentInfo& fr : idx.fragments) {
        if (idx.tensors[fr.tensor].name != m->tensors[t].name) continue;
        const FragmentInfo& out = m->fragments[next++];
        EXPECT_EQ(out.tensor, t);
        EXPECT_EQ(out.first_chunk, next_chunk);
        next_chunk += out.num_chunks;
        EXPECT_EQ(m->tensors[out.tensor], idx.tensors[fr.tensor]);
        EXPECT_EQ(m->files[out.file], idx.files[fr.file]);
        EXPECT_EQ(out.region, fr.region);
        EXPECT_EQ(out.offset, fr.offset);
        ASSERT_EQ(out.num_chunks, fr.num_chunks);
        for (uint64_t k = 0; k < fr.num_chunks; ++k)
          EXPECT_EQ(m->chunks[out.first_chunk + k], idx.chunks[fr.first_chunk + k]);
      }
    }
  }
  EXPECT_EQ(next, fragments);
  ExpectRoundTrip(*m);
}

TEST(BuildManifestTest, SingleRank) {
  IndexBuilder b(0, 1);
  b.Fragment(b.Tensor("x", DType::kI8, {5}), BoxRegion({0}, {5}));
  Result<CheckpointIndex> m = BuildManifest({b.index()});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->fragments.size(), 1u);
}

TEST(BuildManifestTest, RejectsInconsistentRankSets) {
  struct Case {
    const char* expect;
    void (*mutate)(std::vector<CheckpointIndex>*);
  } cases[] = {
      {"no rank indexes", [](std::vector<CheckpointIndex>* v) { v->clear(); }},
      {"rank index of rank 1 is missing", [](std::vector<CheckpointIndex>* v) { v->erase(v->begin() + 1); }},
      {"rank 2 appears twice", [](std::vector<CheckpointIndex>* v) { (*v)[1] = (*v)[2]; }},
      {"run id", [](std::vector<CheckpointIndex>* v) { (*v)[2].run_id = "other"; }},
      {"step 7", [](std::vector<CheckpointIndex>* v) { (*v)[1].step = 7; }},
      {"world size 4", [](std::vector<CheckpointIndex>* v) { (*v)[1].world_size = 4; }},
      {"chunk size 32", [](std::vector<CheckpointIndex>* v) { (*v)[2].chunk_bytes = 32; }},
      {"not a rank index",
       [](std::vector<CheckpointIndex>* v) {
         (*v)[0].kind = IndexKind::kManifest;
       }},
      {"tensor 'w': rank 2 declares i32 [6, 4] but rank 0 declares f32 [6, 4]",
       [](std::vector<CheckpointIndex>* v) { (*v)[2].tensors[0].dtype = DType::kI32; }},
      {"tensor 'w': rank 1 declares f32 [6, 5] but rank 0 declares f32 [6, 4]",
       [](std::vector<CheckpointIndex>* v) {
         (*v)[1].tensors[0].shape = {6, 5};
       }},
      {"tensor 'm': the ranks' fragments hold 6 elements but the tensor has 10 (part of it was saved by no rank",
       [](std::vector<CheckpointIndex>* v) {
         CheckpointIndex& r2 = (*v)[2];
         r2.fragments.pop_back();
         r2.chunks.resize(r2.fragments[0].num_chunks);
       }},
      {"tensor 'b': ranks 0 and 1 both stored overlapping pieces (4 elements stored twice, the same piece), so the "
       "checkpoint cannot be loaded. If these ranks hold data-parallel copies of it, mark them as replicas",
       [](std::vector<CheckpointIndex>* v) {
         CheckpointIndex& r0 = (*v)[0];
         IndexBuilder b(0, 3, 16);
         b.index() = r0;
         b.Fragment(b.Tensor("b", DType::kBF16, {4}), BoxRegion({0}, {4}));
         r0 = b.index();
       }},
      {"file '0123456789abcdef.r000000-of-000003.data' is listed by rank 0 and rank 1",
       [](std::vector<CheckpointIndex>* v) { (*v)[1].files[0].name = (*v)[0].files[0].name; }},
      {"rank index of rank 1: fragment 0 of tensor 'w'",
       [](std::vector<CheckpointIndex>* v) { (*v)[1].fragments[0].region.offsets[0] = 5; }},
  };
  for (const Case& c : cases) {
    std::vector<CheckpointIndex> ranks = ThreeRanks();
    c.mutate(&ranks);
    Result<CheckpointIndex> m = BuildManifest(ranks);
    ASSERT_FALSE(m.ok()) << c.expect;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status().ToString();
    EXPECT_THAT(m.status().message(), HasSubstr(c.expect));
  }
}

TEST(BuildManifestTest, MergesOneMillionFragments) {
  // 16 ranks, each writing 65536 rows of a [1M, 2] tensor as one fragment per row.
  constexpr uint32_t kWorld = 16;
  constexpr int64_t kRowsPerRank = 1 << 16;
  std::vector<CheckpointIndex> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    CheckpointIndex idx;
    idx.rank = r;
    idx.world_size = kWorld;
    idx.run_id = "big";
    idx.chunk_bytes = 1 << 20;
    idx.tensors.push_back(TensorInfo{"emb", DType::kF32, {kRowsPerRank * kWorld, 2}});
    idx.files.push_back(FileInfo{"h.r" + std::to_string(r) + ".data", r, 4096 + 8 * kRowsPerRank});
    idx.fragments.resize(kRowsPerRank);
    idx.chunks.resize(kRowsPerRank, ChunkInfo{8, 1});
    for (int64_t i = 0; i < kRowsPerRank; ++i) {
      FragmentInfo& fr = idx.fragments[i];
      fr.region = BoxRegion({r * kRowsPerRank + i, 0}, {1, 2});
      fr.offset = 4096 + 8 * i;
      fr.first_chunk = i;
      fr.num_chunks = 1;
    }
    ranks.push_back(std::move(idx));
  }
  std::reverse(ranks.begin(), ranks.end());
  Result<CheckpointIndex> m = BuildManifest(std::move(ranks));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->fragments.size(), size_t{kRowsPerRank} * kWorld);
  EXPECT_EQ(m->fragments[kRowsPerRank].file, 1u);
  EXPECT_EQ(m->fragments[kRowsPerRank].first_chunk, uint64_t{kRowsPerRank});
  EXPECT_EQ(m->fragments[kRowsPerRank].region.offsets[0], kRowsPerRank);
  ExpectRoundTrip(*m);
}


// ---- reading a manifest in parts (§5.5) ----

// A manifest of 8 ranks and 1,000 tensors, each tensor split by rows among the ranks, plus a rank
// object each.
CheckpointIndex PartsManifest() {
  std::vector<CheckpointIndex> ranks;
  for (uint32_t r = 0; r < 8; ++r) {
    IndexBuilder b(r, 8);
    for (int t = 0; t < 1000; ++t) {
      const uint32_t id = b.Tensor("layer." + std::to_string(t) + ".weight", DType::kF32, {64, 16});
      b.Fragment(id, BoxRegion({8 * static_cast<int64_t>(r), 0}, {8, 16}));
    }
    b.Object("rng", 24);
    ranks.push_back(b.index());
  }
  Result<CheckpointIndex> m = BuildManifest(std::move(ranks));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// Reads from an in-memory file, counting the calls.
struct MemoryFile {
  std::string bytes;
  int reads = 0;
  ManifestPartReader::ReadAt Reader() {
    return [this](uint64_t offset, uint64_t length, char* out) -> Status {
      ++reads;
      if (offset > bytes.size() || length > bytes.size() - offset) return Status::IOError("read past the end");
      std::memcpy(out, bytes.data() + offset, length);
      return Status::OK();
    };
  }
};

// What a whole decode says of tensor `t`: its fragments with their chunks, chunk numbers made
// relative to the fragment.
std::vector<std::pair<FragmentInfo, std::vector<ChunkInfo>>> FragmentsOf(const CheckpointIndex& m, uint32_t t) {
  std::vector<std::pair<FragmentInfo, std::vector<ChunkInfo>>> out;
  for (const FragmentInfo& f : m.fragments) {
    if (f.tensor != t) continue;
    FragmentInfo copy = f;
    copy.first_chunk = 0;
    out.emplace_back(copy, std::vector<ChunkInfo>(m.chunks.begin() + f.first_chunk,
                                                  m.chunks.begin() + f.first_chunk + f.num_chunks));
  }
  return out;
}

TEST(ManifestPartsTest, ReadsTheHeadAndOnlyTheFragmentsAskedFor) {
  const CheckpointIndex manifest = PartsManifest();
  MemoryFile file{MustEncode(manifest)};
  EXPECT_EQ(GetU32(file.bytes, 12), 240u);  // the header carries the directory's place
  Result<CheckpointIndex> whole = DecodeIndex(file.bytes, "m.manifest");  // a reader that ignores it
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_TRUE(*whole == manifest);

  auto reader = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m.manifest");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_NE(*reader, nullptr);
  CheckpointIndex head = manifest;
  head.fragments.clear();
  head.chunks.clear();
  EXPECT_TRUE((*reader)->head() == head);
  const uint64_t head_bytes = (*reader)->bytes_read();

  CheckpointIndex part = (*reader)->head();
  ASSERT_TRUE((*reader)->AddTensors({150, 5, 6}, &part).ok());
  ASSERT_EQ(part.fragments.size(), 3u * 8);
  for (uint32_t t : {5u, 6u, 150u}) EXPECT_EQ(FragmentsOf(part, t), FragmentsOf(manifest, t)) << "tensor " << t;
  EXPECT_TRUE(FragmentsOf(part, 7).empty());
  // Three tensors' fragments (24 x 64 bytes), chunks (192 x 16 bytes) and dims come in whole
  // 16 KiB blocks, at most two of each kind per run of consecutive tensors; with the head, still a
  // small part of the 2 MB file.
  const uint64_t fragment_bytes = (*reader)->bytes_read() - head_bytes;
  EXPECT_LE(fragment_bytes, 12u * (16 << 10)) << "of " << file.bytes.size();
  EXPECT_LT((*reader)->bytes_read(), file.bytes.size() / 6) << "head " << head_bytes << ", fragments " << fragment_bytes;
  std::vector<uint32_t> more = {7};
  ASSERT_TRUE((*reader)->AddTensors(more, &part).ok());
  EXPECT_EQ(FragmentsOf(part, 7), FragmentsOf(manifest, 7));

  // A box of a tensor: only the runs (here each rank's piece is its own box) that meet it.
  const size_t before = part.fragments.size();
  ASSERT_TRUE((*reader)->AddFragments({{9, Box{{20, 0}, {10, 16}}}}, &part).ok());  // rows 20-29: ranks 2 and 3
  ASSERT_EQ(part.fragments.size(), before + 2);
  EXPECT_EQ(part.fragments[before].region.offsets, (std::vector<int64_t>{16, 0}));
  EXPECT_EQ(part.fragments[before + 1].region.offsets, (std::vector<int64_t>{24, 0}));
  ASSERT_TRUE((*reader)->AddFragments({{9, Box{{0, 0}, {64, 16}}}}, &part).ok());  // the rest, none twice
  EXPECT_EQ(part.fragments.size(), before + 8);

  // Asking for every tensor at once gives back exactly the manifest.
  auto again = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m.manifest");
  ASSERT_TRUE(again.ok());
  CheckpointIndex all = (*again)->head();
  std::vector<uint32_t> every(manifest.tensors.size());
  for (uint32_t t = 0; t < every.size(); ++t) every[t] = t;
  ASSERT_TRUE((*again)->AddTensors(every, &all).ok());
  EXPECT_TRUE(all == manifest);
  ASSERT_TRUE((*again)->AddAllFragments(&all).ok());  // nothing left to read
  EXPECT_TRUE(all == manifest);
  EXPECT_LE((*again)->bytes_read(), file.bytes.size() + 4096);
}

TEST(ManifestPartsTest, AnAlteredBlockIsCaughtWhenItIsRead) {
  const CheckpointIndex manifest = PartsManifest();
  MemoryFile file{MustEncode(manifest)};
  // One byte of the flat range of a fragment of tensor 150, with the whole-file checksum made
  // right again: only the block checksum can tell.
  const size_t fragment = 150 * 8 + 3;
  file.bytes[SectionStart(file.bytes, kFragments) + fragment * 64 + 40] ^= 0x01;
  Reseal(&file.bytes);
  auto reader = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m.manifest");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  CheckpointIndex part = (*reader)->head();
  ASSERT_TRUE((*reader)->AddTensors({5}, &part).ok());  // a block far from the damage
  Status s = (*reader)->AddTensors({150}, &part);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("m.manifest"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("does not match its checksum in the directory"), std::string::npos) << s.ToString();
}

TEST(ManifestPartsTest, EveryFlippedByteOfTheBodyIsCaught) {
  // Small enough to flip each byte: 2 ranks, 3 tensors.
  std::vector<CheckpointIndex> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    IndexBuilder b(r, 2);
    for (int t = 0; t < 3; ++t)
      b.Fragment(b.Tensor("t" + std::to_string(t), DType::kF32, {4, 4}), BoxRegion({2 * int64_t{r}, 0}, {2, 4}));
    b.Object("rng", 8);
    ranks.push_back(b.index());
  }
  Result<CheckpointIndex> m = BuildManifest(std::move(ranks));
  ASSERT_TRUE(m.ok());
  const std::string good = MustEncode(*m);
  const size_t body_end = good.size() - 16;  // the trailer is not read in parts
  for (size_t i = 0; i < body_end; ++i) {
    MemoryFile file{good};
    file.bytes[i] ^= 0x20;
    // Past the header, the whole-file checksum made right again: the blocks must tell.
    if (i >= GetU32(good, kHeaderLengthAt)) Reseal(&file.bytes);
    auto reader = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m");
    Status s = reader.status();
    if (reader.ok() && *reader != nullptr) {
      CheckpointIndex all = (*reader)->head();
      s = (*reader)->AddTensors({0, 1, 2}, &all);
      if (s.ok() && all == *m) s = Status::Corruption("m", "unchanged");  // a flip that changed nothing
    }
    if (reader.ok() && *reader == nullptr) s = Status::Corruption("m", "no directory");
    EXPECT_FALSE(s.ok()) << "byte " << i << " flipped went unnoticed";
  }
}

TEST(ManifestPartsTest, FilesWithoutADirectoryAreReadWhole) {
  // A manifest whose fragments are not grouped by tensor is written without a directory.
  CheckpointIndex m = PartsManifest();
  std::swap(m.fragments[0], m.fragments[8]);
  std::swap(m.fragments[0].first_chunk, m.fragments[8].first_chunk);
  MemoryFile file{MustEncode(m)};
  EXPECT_EQ(GetU32(file.bytes, 12), 208u);
  auto reader = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(*reader, nullptr);
  // A rank index is not a manifest.
  MemoryFile rank{MustEncode(SmallIndex())};
  auto not_manifest = ManifestPartReader::Open(rank.Reader(), rank.bytes.size(), "r.index");
  EXPECT_TRUE(not_manifest.status().IsCorruption()) << not_manifest.status().ToString();
  // Truncated anywhere: Corruption or a failed read, never a crash.
  MemoryFile whole{MustEncode(PartsManifest())};
  for (size_t n : {size_t{0}, size_t{10}, size_t{200}, whole.bytes.size() / 2, whole.bytes.size() - 1}) {
    MemoryFile cut{whole.bytes.substr(0, n)};
    auto r = ManifestPartReader::Open(cut.Reader(), cut.bytes.size(), "cut");
    EXPECT_FALSE(r.ok()) << n;
  }
}

}  // namespace
}  // namespace lifeline::format
