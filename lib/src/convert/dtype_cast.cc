#include "lib/src/convert/dtype_cast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace lifeline {
namespace {

constexpr uint64_t kF64Exponent = 0x7FFull << 52;
constexpr uint64_t kF64Mantissa = (1ull << 52) - 1;

double FromBits(uint64_t bits) {
  double v;
  std::memcpy(&v, &bits, 8);
  return v;
}

// The double of a binary format with `e` exponent bits and `m` mantissa bits (IEEE-like: all-ones
// exponent is infinity or NaN). fp8 E4M3 has no infinity and one NaN pattern: the caller decides.
double DecodeBinary(uint64_t bits, int e, int m) {
  const uint64_t sign = (bits >> (e + m)) & 1;
  const uint64_t exp = (bits >> m) & ((1ull << e) - 1);
  const uint64_t man = bits & ((1ull << m) - 1);
  const int bias = (1 << (e - 1)) - 1;
  if (exp == (1ull << e) - 1) {
    // NaN keeps its sign and payload (moved to the top of the double's mantissa), made quiet.
    const uint64_t payload = man == 0 ? 0 : (man << (52 - m)) | (1ull << 51);
    return FromBits((sign << 63) | kF64Exponent | payload);
  }
  double v = exp == 0 ? std::ldexp(static_cast<double>(man), 1 - bias - m)
                      : std::ldexp(static_cast<double>(man | (1ull << m)), static_cast<int>(exp) - bias - m);
  return sign ? -v : v;
}

// `v` rounded once, to nearest with ties to even, into a binary format with `e` exponent bits and
// `m` mantissa bits (m < 52); the bits, right-aligned.
uint64_t EncodeBinary(double v, int e, int m) {
  uint64_t d;
  std::memcpy(&d, &v, 8);
  const uint64_t sign = (d >> 63) << (e + m);
  const uint64_t infinity = ((1ull << e) - 1) << m;
  const int dexp = static_cast<int>((d >> 52) & 0x7FF);
  const uint64_t dman = d & kF64Mantissa;
  if (dexp == 0x7FF) {
    if (dman == 0) return sign | infinity;
    return sign | infinity | (1ull << (m - 1)) | (dman >> (52 - m));  // quiet, payload's top bits
  }
  if (dexp == 0 && dman == 0) return sign;
  // v = mant * 2^pow exactly.
  const uint64_t mant = dexp == 0 ? dman : dman | (1ull << 52);
  const int pow = dexp == 0 ? -1074 : dexp - 1075;
  const int bias = (1 << (e - 1)) - 1;
  const int min_normal = 1 - bias;
  const int lead = pow + 63 - __builtin_clzll(mant);  // exponent of the leading bit
  const int quantum = std::max(lead, min_normal) - m;  // exponent of the last mantissa bit
  const int shift = quantum - pow;
  uint64_t r;
  if (shift <= 0) {
    r = mant << -shift;  // exact (only for values with few bits; never past 2^(m+1))
  } else if (shift >= 64) {
    r = 0;  // below half the smallest subnormal
  } else {
    r = mant >> shift;
    const uint64_t rest = mant & ((1ull << shift) - 1), half = 1ull << (shift - 1);
    if (rest > half || (rest == half && (r & 1))) ++r;
  }
  // A subnormal's r is its mantissa (reaching 2^m makes it the smallest normal); a normal's r is in
  // [2^m, 2^(m+1)], and a carry into the exponent falls out of the addition.
  uint64_t bits = lead < min_normal ? r : (static_cast<uint64_t>(lead + bias) << m) + (r - (1ull << m));
  if (bits >= infinity) bits = infinity;
  return sign | bits;
}

double DecodeF8E4M3(uint8_t b) {
  // E4M3 "fn": no infinity; S.1111.111 is the only NaN.
  if ((b & 0x7F) == 0x7F) return FromBits((uint64_t{b} >> 7) << 63 | kF64Exponent | (7ull << 49) | (1ull << 51));
  const uint64_t exp = (b >> 3) & 0xF, man = b & 7;
  double v = exp == 0 ? std::ldexp(static_cast<double>(man), -9) : std::ldexp(static_cast<double>(man | 8), static_cast<int>(exp) - 10);
  return (b & 0x80) ? -v : v;
}

template <typename T>
T LoadLE(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// One source element at `p` as a double (exactly).
double Decode(DType from, const uint8_t* p) {
  switch (from) {
    case DType::kF64: return LoadLE<double>(p);
    case DType::kF32: return LoadLE<float>(p);
    case DType::kF16: return DecodeBinary(LoadLE<uint16_t>(p), 5, 10);
    case DType::kBF16: return DecodeBinary(LoadLE<uint16_t>(p), 8, 7);
    case DType::kF8E4M3: return DecodeF8E4M3(*p);
    case DType::kF8E5M2: return DecodeBinary(*p, 5, 2);
    default: return 0;
  }
}

template <typename Store>
void CastLoop(DType from, const uint8_t* src, uint8_t* dst, size_t n, size_t out_size, Store store) {
  const size_t in_size = DTypeSize(from);
  for (size_t i = 0; i < n; ++i) store(Decode(from, src + i * in_size), dst + i * out_size);
}

// f32 to bf16, the common case, without the trip through a double: the same rounding.
void F32ToBF16(const uint8_t* src, uint8_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = LoadLE<uint32_t>(src + 4 * i);
    uint16_t h;
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) h = static_cast<uint16_t>((u >> 16) | 0x0040);
    else h = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

}  // namespace

bool IsFloatingDType(DType t) {
  switch (t) {
    case DType::kF64: case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kF8E4M3: case DType::kF8E5M2:
      return true;
    default:
      return false;
  }
}

bool IsCastTarget(DType t) {
  return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

Status CastElements(DType from, DType to, const void* src_v, void* dst_v, size_t n, std::string_view tensor) {
  if (!IsFloatingDType(from) || !IsCastTarget(to))
    return Status::InvalidArgument(
        "tensor '" + std::string(tensor) + "'",
        "cannot cast " + std::string(DTypeName(from)) + " to " + std::string(DTypeName(to)) +
            (IsFloatingDType(from) ? ": the target must be f64, f32, f16 or bf16"
                                   : ": only floating tensors are cast (integers and bool never are)"));
  const uint8_t* src = static_cast<const uint8_t*>(src_v);
  uint8_t* dst = static_cast<uint8_t*>(dst_v);
  if (from == to) {
    std::memcpy(dst, src, n * DTypeSize(from));
    return Status::OK();
  }
  if (from == DType::kF32 && to == DType::kBF16) {
    F32ToBF16(src, dst, n);
    return Status::OK();
  }
  switch (to) {
    case DType::kF64:
      CastLoop(from, src, dst, n, 8, [](double v, uint8_t* p) { std::memcpy(p, &v, 8); });
      break;
    case DType::kF32:
      CastLoop(from, src, dst, n, 4, [](double v, uint8_t* p) {
        const uint32_t b = static_cast<uint32_t>(EncodeBinary(v, 8, 23));
        std::memcpy(p, &b, 4);
      });
      break;
    case DType::kF16:
      CastLoop(from, src, dst, n, 2, [](double v, uint8_t* p) {
        const uint16_t b = static_cast<uint16_t>(EncodeBinary(v, 5, 10));
        std::memcpy(p, &b, 2);
      });
      break;
    case DType::kBF16:
      CastLoop(from, src, dst, n, 2, [](double v, uint8_t* p) {
        const uint16_t b = static_cast<uint16_t>(EncodeBinary(v, 8, 7));
        std::memcpy(p, &b, 2);
      });
      break;
    default:
      break;  // refused above
  }
  return Status::OK();
}

}  // namespace lifeline
