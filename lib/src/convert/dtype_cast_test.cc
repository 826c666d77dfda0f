// CastElements (dtype_cast.h): rounding to nearest even at the edges of each target, NaN and
// infinity, exact widening of every f16, bf16 and fp8 value, and the fast f32 -> bf16 path agreeing
// bit for bit with the general one.
#include "lib/src/convert/dtype_cast.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "tests/kit/test_kit.h"

namespace lifeline::test {
namespace dtype_cast_test {

uint32_t F32Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
float F32(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

template <typename Out, typename In>
Out CastOne(DType from, DType to, In in) {
  Out out{};
  Status s = CastElements(from, to, &in, &out, 1, "t");
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

uint16_t F32ToBF16(float v) { return CastOne<uint16_t>(DType::kF32, DType::kBF16, v); }
uint16_t F64ToBF16(double v) { return CastOne<uint16_t>(DType::kF64, DType::kBF16, v); }
uint16_t F32ToF16(float v) { return CastOne<uint16_t>(DType::kF32, DType::kF16, v); }
float F64ToF32(double v) { return CastOne<float>(DType::kF64, DType::kF32, v); }

TEST(DTypeCastTest, F32ToBF16RoundsToNearestEven) {
  EXPECT_EQ(0x3F80, F32ToBF16(1.0f));
  EXPECT_EQ(0x3F80, F32ToBF16(1.0f + 0x1p-8f));             // halfway, 1.0 is even
  EXPECT_EQ(0x3F82, F32ToBF16(1.0f + 3 * 0x1p-8f));         // halfway, up to the even 1 + 2^-6
  EXPECT_EQ(0x3F81, F32ToBF16(1.0f + 0x1p-8f + 0x1p-20f));  // past halfway
  EXPECT_EQ(0x8000, F32ToBF16(-0.0f));
  EXPECT_EQ(0x7F80, F32ToBF16(std::numeric_limits<float>::max()));  // past bf16's largest: infinity
  EXPECT_EQ(0xFF80, F32ToBF16(-std::numeric_limits<float>::infinity()));
  EXPECT_EQ(0x0001, F32ToBF16(F32(0x00010000)));  // subnormals keep their top bits
  // NaN stays NaN, its sign kept, quiet even when it was signalling with only low payload bits.
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF812345u}) {
    const uint16_t h = F32ToBF16(F32(nan));
    EXPECT_EQ(0x7F80, h & 0x7F80) << std::hex << nan;
    EXPECT_NE(0, h & 0x007F) << std::hex << nan;
    EXPECT_EQ(nan >> 31, static_cast<uint32_t>(h >> 15)) << std::hex << nan;
  }
}

TEST(DTypeCastTest, TheFastF32ToBF16PathAgreesWithTheGeneralOne) {
  // f64 -> bf16 takes the general path; every f32 is exact in a double, so both must agree.
  std::mt19937 rng(7);
  std::vector<uint32_t> bits = {0, 0x80000000u, 0x7F7FFFFFu, 0x7F7F8000u, 0x7F7F7FFFu, 0x00008000u, 0x00018000u,
                                0x00007FFFu, 0x3F808000u, 0x3F818000u, 0x7F800000u};
  for (int i = 0; i < 200000; ++i) bits.push_back(rng());
  for (uint32_t b : bits) {
    const float v = F32(b);
    if (std::isnan(v)) continue;
    ASSERT_EQ(F32ToBF16(v), F64ToBF16(static_cast<double>(v))) << std::hex << b;
  }
}

TEST(DTypeCastTest, F32ToF16AtTheEdgesOfHalf) {
  EXPECT_EQ(0x3C00, F32ToF16(1.0f));
  EXPECT_EQ(0x7BFF, F32ToF16(65504.0f));  // the largest half
  EXPECT_EQ(0x7BFF, F32ToF16(65519.0f));  // below halfway to 65536
  EXPECT_EQ(0x7C00, F32ToF16(65520.0f));  // halfway, 0x7BFF is odd: up, to infinity
  EXPECT_EQ(0x0001, F32ToF16(0x1p-24f));  // the smallest subnormal
  EXPECT_EQ(0x0000, F32ToF16(0x1p-25f));  // halfway to it, 0 is even
  EXPECT_EQ(0x0001, F32ToF16(0x1.8p-25f));
  EXPECT_EQ(0x0002, F32ToF16(3 * 0x1p-25f));  // halfway between 1 and 2: even
  EXPECT_EQ(0x0400, F32ToF16(0x1p-14f));      // the smallest normal
  EXPECT_EQ(0x0400, F32ToF16(0x1p-14f - 0x1p-26f));  // the largest subnormal rounds up into it
  EXPECT_EQ(0x8000, F32ToF16(-0x1p-30f));            // underflow keeps the sign
  EXPECT_EQ(0xFC00, F32ToF16(-1e10f));
  const uint16_t nan = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(0x7C00, nan & 0x7C00);
  EXPECT_NE(0, nan & 0x03FF);
}

TEST(DTypeCastTest, F64ToF32RoundsOnce) {
  EXPECT_EQ(1.0f, F64ToF32(1.0 + 0x1p-24));  // halfway: even
  EXPECT_EQ(std::nextafter(1.0f, 2.0f), F64ToF32(1.0 + 0x1p-24 + 0x1p-50));
  EXPECT_EQ(1.0f + 0x1p-22f, F64ToF32(1.0 + 3 * 0x1p-24));  // halfway: even, up
  EXPECT_TRUE(std::isinf(F64ToF32(1e300)));
  EXPECT_EQ(0x80000000u, F32Bits(F64ToF32(-1e-300)));
  EXPECT_EQ(1u, F32Bits(F64ToF32(0x1p-149)));  // the smallest f32 subnormal
  EXPECT_EQ(0u, F32Bits(F64ToF32(0x1p-150)));  // halfway to it: even
  EXPECT_TRUE(std::isnan(F64ToF32(std::numeric_limits<double>::quiet_NaN())));
}

// Every f16 and bf16 value widens exactly and comes back unchanged.
TEST(DTypeCastTest, EveryHalfAndBF16ValueWidensExactly) {
  for (DType half : {DType::kF16, DType::kBF16}) {
    for (uint32_t b = 0; b < 0x10000; ++b) {
      const uint16_t h = static_cast<uint16_t>(b);
      const float f = CastOne<float>(half, DType::kF32, h);
      const double d = CastOne<double>(half, DType::kF64, h);
      const bool is_nan = (h & 0x7FFF) > (half == DType::kF16 ? 0x7C00 : 0x7F80);
      ASSERT_EQ(is_nan, std::isnan(f)) << std::hex << b;
      if (is_nan) {
        EXPECT_EQ(uint32_t{h} >> 15, F32Bits(f) >> 31);
        continue;
      }
      ASSERT_EQ(static_cast<double>(f), d) << std::hex << b;
      ASSERT_EQ(h, CastOne<uint16_t>(DType::kF32, half, f)) << std::hex << b;
      ASSERT_EQ(h, CastOne<uint16_t>(DType::kF64, half, d)) << std::hex << b;
      if (half == DType::kBF16) {
        ASSERT_EQ(uint32_t{h} << 16, F32Bits(f)) << std::hex << b;
      }
    }
  }
}

TEST(DTypeCastTest, Fp8ValuesWiden) {
  auto e4m3 = [](uint8_t b) { return CastOne<float>(DType::kF8E4M3, DType::kF32, b); };
  auto e5m2 = [](uint8_t b) { return CastOne<float>(DType::kF8E5M2, DType::kF32, b); };
  EXPECT_EQ(448.0f, e4m3(0x7E));  // the largest E4M3
  EXPECT_EQ(-448.0f, e4m3(0xFE));
  EXPECT_TRUE(std::isnan(e4m3(0x7F)));  // its only NaN (no infinity)
  EXPECT_EQ(0x1p-9f, e4m3(0x01));
  EXPECT_EQ(1.0f, e4m3(0x38));
  EXPECT_EQ(57344.0f, e5m2(0x7B));
  EXPECT_TRUE(std::isinf(e5m2(0x7C)));
  EXPECT_TRUE(std::isnan(e5m2(0x7D)));
  EXPECT_EQ(0x1p-16f, e5m2(0x01));
  EXPECT_EQ(1.0f, e5m2(0x3C));
  // fp8 -> bf16 is exact for every finite value.
  for (uint32_t b = 0; b < 256; ++b) {
    const float f = e4m3(static_cast<uint8_t>(b));
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32Bits(f) >> 16, uint32_t{CastOne<uint16_t>(DType::kF8E4M3, DType::kBF16, static_cast<uint8_t>(b))});
  }
}

TEST(DTypeCastTest, ManyElementsAtOnce) {
  const std::vector<float> in = {1.0f, -2.5f, 0x1p-130f, 3.0e38f};
  std::vector<uint16_t> out(in.size());
  ASSERT_TRUE(CastElements(DType::kF32, DType::kF16, in.data(), out.data(), in.size(), "t").ok());
  EXPECT_EQ((std::vector<uint16_t>{0x3C00, 0xC100, 0x0000, 0x7C00}), out);
}

TEST(DTypeCastTest, OnlyFloatingToFloatingIsCast) {
  int64_t i = 3;
  uint16_t out = 0;
  Status s = CastElements(DType::kI64, DType::kBF16, &i, &out, 1, "step");
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code());
  EXPECT_TRUE(StatusMentions(s, "'step'")) << s.ToString();
  EXPECT_TRUE(StatusMentions(s, "i64 to bf16")) << s.ToString();
  float f = 1;
  s = CastElements(DType::kF32, DType::kI32, &f, &out, 1, "w");
  EXPECT_EQ(StatusCode::kInvalidArgument, s.code());
  EXPECT_TRUE(StatusMentions(s, "'w'")) << s.ToString();
  EXPECT_FALSE(CastElements(DType::kF32, DType::kF8E4M3, &f, &out, 1, "w").ok());
  EXPECT_FALSE(CastElements(DType::kBool, DType::kF32, &f, &out, 1, "mask").ok());
  EXPECT_TRUE(IsFloatingDType(DType::kF8E5M2));
  EXPECT_FALSE(IsFloatingDType(DType::kU8));
  EXPECT_TRUE(IsCastTarget(DType::kBF16));
  EXPECT_FALSE(IsCastTarget(DType::kF8E4M3));
}

}  // namespace dtype_cast_test
}  // namespace lifeline::test
