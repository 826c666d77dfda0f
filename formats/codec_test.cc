#include "formats/codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include <zstd.h>

namespace lifeline::format {
namespace codec_test {

using ::testing::HasSubstr;
using Bytes = std::vector<uint8_t>;

constexpr Codec kAllCodecs[] = {Codec::kNone, Codec::kZstd, Codec::kZstdByteGroup};
constexpr size_t kElemSizes[] = {1, 2, 4, 8};
constexpr char kWhat[] = "file r000000.data offset 4096, tensor 'w'";

Bytes RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// n values of a normal distribution as little-endian bf16 (rounded to nearest even) or f32, like
// trained weights.
Bytes NormalWeights(size_t n, bool bf16, float sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  Bytes b(n * (bf16 ? 2 : 4));
  for (size_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if (bf16) {
      const uint16_t h = static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
      std::memcpy(&b[i * 2], &h, 2);
    } else {
      std::memcpy(&b[i * 4], &u, 4);
    }
  }
  return b;
}

Bytes Encode(ChunkCodec& codec, Codec c, size_t elem, const Bytes& raw, int level = 1) {
  Bytes out(ChunkCodec::MaxEncodedSize(c, raw.size()));
  Result<size_t> n = codec.Encode(c, elem, level, raw.data(), raw.size(), out.data(), out.size());
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  out.resize(n.ok() ? *n : 0);
  return out;
}

// Decodes into a buffer with guard bytes on both sides and checks that the guards survived.
Status DecodeGuarded(ChunkCodec& codec, Codec c, size_t elem, const Bytes& stored, size_t raw_len, Bytes* raw) {
  constexpr size_t kGuard = 64;
  Bytes buf(raw_len + 2 * kGuard, 0xA5);
  // An exactly-sized copy of the input, so reading past it is reading past an allocation.
  const std::unique_ptr<uint8_t[]> input(new uint8_t[stored.size() + 1]);
  if (!stored.empty()) std::memcpy(input.get(), stored.data(), stored.size());
  Status s = codec.Decode(c, elem, input.get(), stored.size(), buf.data() + kGuard, raw_len, kWhat);
  for (size_t i = 0; i < kGuard; ++i) {
    EXPECT_EQ(buf[i], 0xA5) << "wrote before dst";
    EXPECT_EQ(buf[kGuard + raw_len + i], 0xA5) << "wrote after dst";
  }
  if (raw != nullptr) raw->assign(buf.begin() + kGuard, buf.begin() + kGuard + raw_len);
  return s;
}

TEST(GroupBytes, PutsByteJOfEveryElementInStreamJ) {
  const Bytes src = {0xA0, 0xA1, 0xA2, 0xA3, 0xB0, 0xB1, 0xB2, 0xB3, 0xC0, 0xC1, 0xC2, 0xC3};
  Bytes two(src.size()), four(src.size()), one(src.size());
  GroupBytes(2, src.data(), src.size(), two.data());
  GroupBytes(4, src.data(), src.size(), four.data());
  GroupBytes(1, src.data(), src.size(), one.data());
  EXPECT_EQ(two, (Bytes{0xA0, 0xA2, 0xB0, 0xB2, 0xC0, 0xC2, 0xA1, 0xA3, 0xB1, 0xB3, 0xC1, 0xC3}));
  EXPECT_EQ(four, (Bytes{0xA0, 0xB0, 0xC0, 0xA1, 0xB1, 0xC1, 0xA2, 0xB2, 0xC2, 0xA3, 0xB3, 0xC3}));
  EXPECT_EQ(one, src);
}

TEST(GroupBytes, MatchesTheDefinitionAndInvertsForEveryLength) {
  // Lengths around the vectorised block sizes, where remainders are handled separately.
  for (size_t elem : kElemSizes) {
    for (size_t count : {0, 1, 3, 63, 64, 65, 127, 1023, 1024, 1025, 2048 + 70, 5000}) {
      const size_t n = count * elem;
      const Bytes src = RandomBytes(n, count * 10 + elem);
      Bytes want(n);
      for (size_t i = 0; i < count; ++i)
        for (size_t j = 0; j < elem; ++j) want[j * count + i] = src[i * elem + j];
      Bytes grouped(n), back(n);
      GroupBytes(elem, src.data(), n, grouped.data());
      EXPECT_EQ(grouped, want) << "elem " << elem << " count " << count;
      UngroupBytes(elem, grouped.data(), n, back.data());
      EXPECT_EQ(back, src) << "elem " << elem << " count " << count;
    }
  }
}

TEST(ChunkCodec, RoundTripsEveryCodecElementSizeAndLength) {
  ChunkCodec codec;
  for (Codec c : kAllCodecs) {
    for (size_t elem : kElemSizes) {
      for (size_t count : {0, 1, 2, 7, 1000, 4097, 100003}) {
        for (bool weights : {false, true}) {
          const size_t n = count * elem;
          Bytes raw = weights && elem == 4 ? NormalWeights(count, false, 0.02f, count)
                      : weights && elem == 2 ? NormalWeights(count, true, 0.02f, count)
                                             : RandomBytes(n, count + elem);
          if (weights && (elem == 1 || elem == 8))
            for (size_t i = 0; i < n; ++i) raw[i] = static_cast<uint8_t>(i % 7 == 0 ? i : 0);  // compressible
          const Bytes stored = Encode(codec, c, elem, raw);
          EXPECT_LE(stored.size(), ChunkCodec::MaxEncodedSize(c, n));
          if (c == Codec::kNone) {
            EXPECT_EQ(stored, raw);
          }
          Bytes back;
          Status s = DecodeGuarded(codec, c, elem, stored, n, &back);
          ASSERT_TRUE(s.ok()) << s.ToString() << " codec " << int(c) << " elem " << elem << " count " << count;
          EXPECT_EQ(back, raw) << "codec " << int(c) << " elem " << elem << " count " << count;
        }
      }
    }
  }
}

TEST(ChunkCodec, RoundTripsAFullChunkAtSeveralLevels) {
  ChunkCodec codec;
  const Bytes raw = NormalWeights((4u << 20) / 2, true, 0.02f, 7);
  for (int level : {-5, 1, 3, 9}) {
    for (Codec c : {Codec::kZstd, Codec::kZstdByteGroup}) {
      const Bytes stored = Encode(codec, c, 2, raw, level);
      Bytes back;
      ASSERT_TRUE(DecodeGuarded(codec, c, 2, stored, raw.size(), &back).ok()) << "level " << level;
      EXPECT_EQ(back, raw) << "level " << level;
    }
  }
}

TEST(ChunkCodec, ReusedStateGivesTheSameFramesAsFreshState) {
  const Bytes raw = NormalWeights(50000, false, 0.02f, 3);
  ChunkCodec reused;
  const Bytes a = Encode(reused, Codec::kZstdByteGroup, 4, raw, 1);
  const Bytes b = Encode(reused, Codec::kZstd, 4, raw, 7);
  const Bytes c = Encode(reused, Codec::kZstdByteGroup, 4, raw, 1);
  ChunkCodec fresh_a, fresh_b;
  EXPECT_EQ(a, Encode(fresh_a, Codec::kZstdByteGroup, 4, raw, 1));
  EXPECT_EQ(b, Encode(fresh_b, Codec::kZstd, 4, raw, 7));
  EXPECT_EQ(a, c);
}

TEST(ChunkCodec, ByteGroupingOfOneByteElementsIsPlainZstd) {
  // Grouping is the identity for 1-byte elements, so a plain zstd frame decodes under either code.
  ChunkCodec codec;
  const Bytes raw = RandomBytes(10000, 5);
  const Bytes stored = Encode(codec, Codec::kZstd, 1, raw);
  Bytes back;
  ASSERT_TRUE(DecodeGuarded(codec, Codec::kZstdByteGroup, 1, stored, raw.size(), &back).ok());
  EXPECT_EQ(back, raw);
}

TEST(ChunkCodec, IncompressibleDataStaysWithinTheBound) {
  ChunkCodec codec;
  const Bytes raw = RandomBytes(4u << 20, 11);
  for (Codec c : {Codec::kZstd, Codec::kZstdByteGroup}) {
    const Bytes stored = Encode(codec, c, 4, raw);
    EXPECT_LE(stored.size(), ChunkCodec::MaxEncodedSize(c, raw.size()));
    EXPECT_LT(stored.size(), raw.size() + raw.size() / 100);
    Bytes back;
    ASSERT_TRUE(DecodeGuarded(codec, c, 4, stored, raw.size(), &back).ok());
    EXPECT_EQ(back, raw);
  }
}

TEST(ChunkCodec, ByteGroupingCompressesNormalWeightsBetterThanPlainZstd) {
  // One 4 MiB chunk of weights drawn like a trained layer's. Byte grouping separates the
  // low-entropy sign-and-exponent bytes from the mantissa bytes (ZipNN reports 1.51 against 1.27
  // on real bf16 weights).
  ChunkCodec codec;
  const Bytes bf16 = NormalWeights((4u << 20) / 2, true, 0.02f, 1);
  const double plain16 = double(bf16.size()) / Encode(codec, Codec::kZstd, 2, bf16).size();
  const double grouped16 = double(bf16.size()) / Encode(codec, Codec::kZstdByteGroup, 2, bf16).size();
  EXPECT_GT(grouped16, plain16 * 1.05) << "plain " << plain16 << " grouped " << grouped16;
  EXPECT_GE(grouped16, 1.3);

  const Bytes f32 = NormalWeights((4u << 20) / 4, false, 0.02f, 2);
  const double plain32 = double(f32.size()) / Encode(codec, Codec::kZstd, 4, f32).size();
  const double grouped32 = double(f32.size()) / Encode(codec, Codec::kZstdByteGroup, 4, f32).size();
  EXPECT_GT(grouped32, plain32) << "plain " << plain32 << " grouped " << grouped32;
}

TEST(ChunkCodec, NegativeLevelsStillEntropyCodeTheGroupedBytes) {
  ChunkCodec codec;
  const Bytes bf16 = NormalWeights(1u << 20, true, 0.02f, 4);
  const double ratio = double(bf16.size()) / Encode(codec, Codec::kZstdByteGroup, 2, bf16, -5).size();
  EXPECT_GE(ratio, 1.3);
}

TEST(ChunkCodec, EncodeRejectsBadArguments) {
  ChunkCodec codec;
  const Bytes raw(64, 1);
  Bytes out(ChunkCodec::MaxEncodedSize(Codec::kZstd, raw.size()));
  EXPECT_EQ(codec.Encode(Codec::kZstd, 3, 1, raw.data(), 63, out.data(), out.size()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Encode(Codec::kZstdByteGroup, 4, 1, raw.data(), 62, out.data(), out.size()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Encode(Codec::kZstd, 4, 1, raw.data(), 64, out.data(), 10).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Encode(Codec::kNone, 4, 1, raw.data(), 64, out.data(), 63).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Encode(static_cast<Codec>(9), 4, 1, raw.data(), 64, out.data(), out.size()).status().code(),
            StatusCode::kInvalidArgument);
}

class HostileDecode : public ::testing::TestWithParam<Codec> {
 protected:
  void ExpectCorruption(const Bytes& stored, size_t raw_len, const std::string& why) {
    Status s = DecodeGuarded(codec_, GetParam(), 4, stored, raw_len, nullptr);
    EXPECT_TRUE(s.IsCorruption()) << why << ": " << s.ToString();
    EXPECT_THAT(s.ToString(), HasSubstr(kWhat)) << why;
  }
  ChunkCodec codec_;
};

TEST_P(HostileDecode, TruncatedFrames) {
  const Bytes raw = NormalWeights(30000, false, 0.02f, 8);
  const Bytes stored = Encode(codec_, GetParam(), 4, raw);
  for (size_t len = 0; len < stored.size(); len += (len < 64 ? 1 : 997))
    ExpectCorruption(Bytes(stored.begin(), stored.begin() + len), raw.size(), "prefix of " + std::to_string(len));
  ExpectCorruption(Bytes(stored.begin(), stored.end() - 1), raw.size(), "last byte missing");
}

TEST_P(HostileDecode, Garbage) {
  for (size_t n : {1, 3, 4, 5, 17, 1000, 100000}) {
    Bytes junk = RandomBytes(n, n);
    ExpectCorruption(junk, 4096, "random bytes");
    if (n >= 8) {  // a valid magic number followed by junk
      const uint32_t magic = ZSTD_MAGICNUMBER;
      std::memcpy(junk.data(), &magic, 4);
      ExpectCorruption(junk, 4096, "magic and random bytes");
    }
  }
}

TEST_P(HostileDecode, FrameOfAnotherLength) {
  const Bytes raw = NormalWeights(4000, false, 0.02f, 9);
  const Bytes shorter = Encode(codec_, GetParam(), 4, Bytes(raw.begin(), raw.end() - 8));
  ExpectCorruption(shorter, raw.size(), "decodes to fewer bytes");
  const Bytes stored = Encode(codec_, GetParam(), 4, raw);
  ExpectCorruption(stored, raw.size() - 8, "decodes to more bytes");
  ExpectCorruption(stored, 0, "decodes to more than nothing");

  // The same without the content size in the frame header: only decoding can tell.
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ASSERT_NE(cctx, nullptr);
  ASSERT_FALSE(ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0)));
  Bytes bare(ZSTD_compressBound(raw.size()));
  const size_t r = ZSTD_compress2(cctx, bare.data(), bare.size(), raw.data(), raw.size());
  ZSTD_freeCCtx(cctx);
  ASSERT_FALSE(ZSTD_isError(r));
  bare.resize(r);
  ExpectCorruption(bare, raw.size() - 8, "unsized frame decodes to more bytes");
  ExpectCorruption(bare, raw.size() + 8, "unsized frame decodes to fewer bytes");
  if (GetParam() == Codec::kZstd) {
    Bytes back;
    ASSERT_TRUE(DecodeGuarded(codec_, GetParam(), 4, bare, raw.size(), &back).ok());
    EXPECT_EQ(back, raw);
  }
}

TEST_P(HostileDecode, StoredLengthBeyondTheFrame) {
  const Bytes raw = NormalWeights(4000, false, 0.02f, 10);
  const Bytes stored = Encode(codec_, GetParam(), 4, raw);
  Bytes padded = stored;
  padded.push_back(0);
  ExpectCorruption(padded, raw.size(), "a zero byte after the frame");
  Bytes twice = stored;
  twice.insert(twice.end(), stored.begin(), stored.end());
  ExpectCorruption(twice, raw.size(), "two frames");
  ExpectCorruption(twice, 2 * raw.size(), "two frames of the whole length");
  // A skippable frame holds no data.
  Bytes skippable = {0x50, 0x2A, 0x4D, 0x18, 4, 0, 0, 0, 1, 2, 3, 4};
  ExpectCorruption(skippable, raw.size(), "skippable frame");
  skippable.insert(skippable.end(), stored.begin(), stored.end());
  ExpectCorruption(skippable, raw.size(), "skippable frame before the data");
}

TEST_P(HostileDecode, FlippedBitsNeverEscapeTheBuffers) {
  // Without a content checksum zstd may decode a damaged frame into other bytes of the right
  // length (the chunk checksum catches that first); what must never happen is a crash or a write
  // outside dst.
  const Bytes raw = NormalWeights(20000, true, 0.02f, 12);
  const Bytes stored = Encode(codec_, GetParam(), 2, raw);
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 300; ++trial) {
    Bytes damaged = stored;
    for (int flips = 0; flips < 1 + trial % 4; ++flips) damaged[rng() % damaged.size()] ^= uint8_t(1u << (rng() % 8));
    Status s = DecodeGuarded(codec_, GetParam(), 2, damaged, raw.size(), nullptr);
    EXPECT_TRUE(s.ok() || s.IsCorruption()) << s.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, HostileDecode, ::testing::Values(Codec::kZstd, Codec::kZstdByteGroup),
                         [](const auto& info) { return info.param == Codec::kZstd ? "Zstd" : "ZstdByteGroup"; });

TEST(ChunkCodec, UncompressedChunkOfTheWrongLengthIsCorruption) {
  ChunkCodec codec;
  const Bytes raw(100, 7);
  Status s = DecodeGuarded(codec, Codec::kNone, 4, Bytes(raw.begin(), raw.end() - 4), raw.size(), nullptr);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_THAT(s.ToString(), HasSubstr(kWhat));
  s = DecodeGuarded(codec, Codec::kNone, 4, raw, raw.size() - 4, nullptr);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
}

TEST(ChunkCodec, DecodeRejectsBadArguments) {
  ChunkCodec codec;
  const Bytes raw(64, 1);
  Bytes out(64);
  EXPECT_EQ(codec.Decode(static_cast<Codec>(3), 4, raw.data(), raw.size(), out.data(), 64, kWhat).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Decode(Codec::kZstd, 5, raw.data(), raw.size(), out.data(), 64, kWhat).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(codec.Decode(Codec::kZstdByteGroup, 8, raw.data(), raw.size(), out.data(), 60, kWhat).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace codec_test
}  // namespace lifeline::format
