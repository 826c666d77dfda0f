// EncodeIndex, checked by decoding what it wrote: every kind of record survives the round trip.
#include "formats/index_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "formats/index_test_kit.h"

namespace lifeline::format {
namespace index_encode_test {

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

}  // namespace index_encode_test
}  // namespace lifeline::format
