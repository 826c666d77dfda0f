#include "formats/codec.h"

#include <cstring>
#include <string>

// For the parameter names ZSTD_c_literalCompressionMode and ZSTD_ps_enable only: they are values
// passed to the stable ZSTD_CCtx_setParameter, no experimental function is called.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

namespace lifeline::format {
namespace {

// The transforms work on blocks of a fixed number of elements: at -O2 GCC vectorises only loops
// whose trip count needs no scalar remainder, and a fixed block gives it one.
constexpr size_t kBlock = 64;

template <typename U>
inline U LoadLe(const uint8_t* p) {
  U x;
  std::memcpy(&x, p, sizeof(U));
  return x;
}

template <typename U>
inline void StoreLe(uint8_t* p, U x) {
  std::memcpy(p, &x, sizeof(U));
}

// Element i of src (count elements of E bytes) sends byte j to dst[j * stride + i].
template <size_t E>
void GroupScalar(const uint8_t* src, size_t begin, size_t count, uint8_t* dst, size_t stride) {
  for (size_t i = begin; i < count; ++i)
    for (size_t j = 0; j < E; ++j) dst[j * stride + i] = src[i * E + j];
}

template <size_t E>
void UngroupScalar(const uint8_t* src, size_t stride, size_t begin, size_t count, uint8_t* dst) {
  for (size_t i = begin; i < count; ++i)
    for (size_t j = 0; j < E; ++j) dst[i * E + j] = src[j * stride + i];
}

// The streams are separate restrict parameters (not offsets of one pointer) so that GCC knows
// they do not overlap; otherwise it leaves the loops scalar, at a tenth of the speed.
size_t Group2Blocks(const uint8_t* __restrict src, size_t count, uint8_t* __restrict o0, uint8_t* __restrict o1) {
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    for (size_t k = 0; k < kBlock; ++k) {
      const uint16_t x = LoadLe<uint16_t>(src + (i + k) * 2);
      o0[i + k] = static_cast<uint8_t>(x);
      o1[i + k] = static_cast<uint8_t>(x >> 8);
    }
  }
  return i;
}

size_t Group4Blocks(const uint8_t* __restrict src, size_t count, uint8_t* __restrict o0, uint8_t* __restrict o1,
                    uint8_t* __restrict o2, uint8_t* __restrict o3) {
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    for (size_t k = 0; k < kBlock; ++k) {
      const uint32_t x = LoadLe<uint32_t>(src + (i + k) * 4);
      o0[i + k] = static_cast<uint8_t>(x);
      o1[i + k] = static_cast<uint8_t>(x >> 8);
      o2[i + k] = static_cast<uint8_t>(x >> 16);
      o3[i + k] = static_cast<uint8_t>(x >> 24);
    }
  }
  return i;
}

size_t Ungroup2Blocks(const uint8_t* __restrict i0, const uint8_t* __restrict i1, size_t count,
                      uint8_t* __restrict dst) {
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    for (size_t k = 0; k < kBlock; ++k)
      StoreLe<uint16_t>(dst + (i + k) * 2, static_cast<uint16_t>(i0[i + k] | (i1[i + k] << 8)));
  }
  return i;
}

size_t Ungroup4Blocks(const uint8_t* __restrict i0, const uint8_t* __restrict i1, const uint8_t* __restrict i2,
                      const uint8_t* __restrict i3, size_t count, uint8_t* __restrict dst) {
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    for (size_t k = 0; k < kBlock; ++k) {
      const uint32_t x = uint32_t{i0[i + k]} | uint32_t{i1[i + k]} << 8 | uint32_t{i2[i + k]} << 16 |
                         uint32_t{i3[i + k]} << 24;
      StoreLe<uint32_t>(dst + (i + k) * 4, x);
    }
  }
  return i;
}

void Group2(const uint8_t* src, size_t count, uint8_t* dst, size_t stride) {
  GroupScalar<2>(src, Group2Blocks(src, count, dst, dst + stride), count, dst, stride);
}

void Group4(const uint8_t* src, size_t count, uint8_t* dst, size_t stride) {
  const size_t done = Group4Blocks(src, count, dst, dst + stride, dst + 2 * stride, dst + 3 * stride);
  GroupScalar<4>(src, done, count, dst, stride);
}

void Ungroup2(const uint8_t* src, size_t stride, size_t count, uint8_t* dst) {
  UngroupScalar<2>(src, stride, Ungroup2Blocks(src, src + stride, count, dst), count, dst);
}

void Ungroup4(const uint8_t* src, size_t stride, size_t count, uint8_t* dst) {
  const size_t done = Ungroup4Blocks(src, src + stride, src + 2 * stride, src + 3 * stride, count, dst);
  UngroupScalar<4>(src, stride, done, count, dst);
}

// Eight streams are too many for the vectoriser in one loop, so an 8-byte element is split into its
// low and high 4-byte halves first (through a small buffer that stays in L1), and each half is
// grouped as a 4-byte element: bytes 0-3 of the halves are bytes 0-3 of the element, 4-7 likewise.
constexpr size_t kHalvesBlock = 1024;

void Group8(const uint8_t* src, size_t count, uint8_t* dst, size_t stride) {
  alignas(64) uint8_t lo[kHalvesBlock * 4];
  alignas(64) uint8_t hi[kHalvesBlock * 4];
  size_t i = 0;
  for (; i + kHalvesBlock <= count; i += kHalvesBlock) {
    for (size_t k = 0; k < kHalvesBlock; ++k) {
      const uint64_t x = LoadLe<uint64_t>(src + (i + k) * 8);
      StoreLe<uint32_t>(lo + k * 4, static_cast<uint32_t>(x));
      StoreLe<uint32_t>(hi + k * 4, static_cast<uint32_t>(x >> 32));
    }
    Group4(lo, kHalvesBlock, dst + i, stride);
    Group4(hi, kHalvesBlock, dst + 4 * stride + i, stride);
  }
  GroupScalar<8>(src, i, count, dst, stride);
}

void Ungroup8(const uint8_t* src, size_t stride, size_t count, uint8_t* dst) {
  alignas(64) uint8_t lo[kHalvesBlock * 4];
  alignas(64) uint8_t hi[kHalvesBlock * 4];
  size_t i = 0;
  for (; i + kHalvesBlock <= count; i += kHalvesBlock) {
    Ungroup4(src + i, stride, kHalvesBlock, lo);
    Ungroup4(src + 4 * stride + i, stride, kHalvesBlock, hi);
    for (size_t k = 0; k < kHalvesBlock; ++k) {
      const uint64_t x = uint64_t{LoadLe<uint32_t>(lo + k * 4)} | uint64_t{LoadLe<uint32_t>(hi + k * 4)} << 32;
      StoreLe<uint64_t>(dst + (i + k) * 8, x);
    }
  }
  UngroupScalar<8>(src, stride, i, count, dst);
}

bool ValidElemSize(size_t e) { return e == 1 || e == 2 || e == 4 || e == 8; }

bool ValidCodec(Codec c) { return c == Codec::kNone || c == Codec::kZstd || c == Codec::kZstdByteGroup; }


// Levels at and below this use zstd's fast and double-fast match finders, which the byte-grouping
// codec replaces by its own parameters (see Configure).
constexpr int kFastestLevels = 3;

// How far zstd's fast match finder strides over data where it finds no match. Grouped float bytes
// have almost no repeats: the default (1) costs half the speed and finds short, spurious matches
// that code worse than the literals (normal bf16, 4 MiB chunks: ratio 1.46 -> 1.49, compression
// 0.47 -> 1.1 GB/s). Long repeats (zero padding, tied rows) are still found.
constexpr int kGroupedSkipLength = 256;
// Shorter matches in grouped floats are mostly chance and code worse than the literals they
// replace (normal bf16, level 3: ratio 1.47 with zstd's 5, 1.49 with 7; also faster).
constexpr int kGroupedMinMatch = 7;

}  // namespace

void GroupBytes(size_t elem_size, const uint8_t* src, size_t n, uint8_t* dst) {
  switch (elem_size) {
    case 2: Group2(src, n / 2, dst, n / 2); return;
    case 4: Group4(src, n / 4, dst, n / 4); return;
    case 8: Group8(src, n / 8, dst, n / 8); return;
    default:
      if (n > 0) std::memcpy(dst, src, n);
      return;
  }
}

void UngroupBytes(size_t elem_size, const uint8_t* src, size_t n, uint8_t* dst) {
  switch (elem_size) {
    case 2: Ungroup2(src, n / 2, n / 2, dst); return;
    case 4: Ungroup4(src, n / 4, n / 4, dst); return;
    case 8: Ungroup8(src, n / 8, n / 8, dst); return;
    default:
      if (n > 0) std::memcpy(dst, src, n);
      return;
  }
}

ChunkCodec::ChunkCodec()
    : cctx_(ZSTD_createCCtx()), dctx_(ZSTD_createDCtx()), cctx_codec_(Codec::kNone), cctx_level_(0) {}

ChunkCodec::~ChunkCodec() {
  ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(cctx_));
  ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(dctx_));
}

size_t ChunkCodec::MaxEncodedSize(Codec codec, size_t n) {
  return codec == Codec::kNone ? n : ZSTD_compressBound(n);
}

uint8_t* ChunkCodec::Scratch(size_t n) {
  if (scratch_.size() < n) scratch_.resize(n);
  return scratch_.data();
}

Status ChunkCodec::Configure(Codec codec, int level) {
  if (cctx_codec_ == codec && cctx_level_ == level) return Status::OK();
  auto* cctx = static_cast<ZSTD_CCtx*>(cctx_);
  if (cctx == nullptr) return Status::ResourceExhausted("cannot allocate a zstd compression context");
  cctx_codec_ = Codec::kNone;  // until every parameter below is set
  ZSTD_CCtx_reset(cctx, ZSTD_reset_parameters);
  size_t r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  // Negative levels turn the entropy coder off, which is where float weights gain (the
  // sign-and-exponent bytes); keep it at every level.
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
  if (!ZSTD_isError(r) && codec == Codec::kZstdByteGroup && level <= kFastestLevels) {
    r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_strategy, ZSTD_fast);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_minMatch, kGroupedMinMatch);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cctx, ZSTD_c_targetLength, kGroupedSkipLength);
  }
  if (ZSTD_isError(r))
    return Status::InvalidArgument("zstd level " + std::to_string(level), ZSTD_getErrorName(r));
  cctx_codec_ = codec;
  cctx_level_ = level;
  return Status::OK();
}

Result<size_t> ChunkCodec::Encode(Codec codec, size_t elem_size, int level, const uint8_t* src, size_t n,
                                  uint8_t* dst, size_t capacity) {
  if (!ValidCodec(codec)) return Status::InvalidArgument(CodecName(codec), "unknown codec");
  if (!ValidElemSize(elem_size) || n % elem_size != 0)
    return Status::InvalidArgument(CodecName(codec), std::to_string(n) + " bytes are not whole elements of " +
                                                         std::to_string(elem_size) + " bytes");
  if (capacity < MaxEncodedSize(codec, n))
    return Status::InvalidArgument(CodecName(codec), "output capacity " + std::to_string(capacity) +
                                                         " is below the bound " +
                                                         std::to_string(MaxEncodedSize(codec, n)));
  if (codec == Codec::kNone) {
    if (n > 0) std::memcpy(dst, src, n);
    return n;
  }
  LL_RETURN_IF_ERROR(Configure(codec, level));
  const uint8_t* input = src;
  if (codec == Codec::kZstdByteGroup && elem_size > 1) {
    uint8_t* grouped = Scratch(n);
    GroupBytes(elem_size, src, n, grouped);
    input = grouped;
  }
  const size_t r = ZSTD_compress2(static_cast<ZSTD_CCtx*>(cctx_), dst, capacity, input, n);
  if (ZSTD_isError(r))
    return Status::InvalidArgument(CodecName(codec), std::string("zstd compression failed: ") + ZSTD_getErrorName(r));
  return r;
}

Status ChunkCodec::Decode(Codec codec, size_t elem_size, const uint8_t* src, size_t stored, uint8_t* dst,
                          size_t raw_len, std::string_view what) {
  if (!ValidCodec(codec)) return Status::InvalidArgument(what, CodecName(codec) + " is not a known codec");
  if (!ValidElemSize(elem_size) || raw_len % elem_size != 0)
    return Status::InvalidArgument(what, std::to_string(raw_len) + " bytes are not whole elements of " +
                                             std::to_string(elem_size) + " bytes");
  const std::string name = CodecName(codec);
  if (codec == Codec::kNone) {
    if (stored != raw_len)
      return Status::Corruption(what, "stored length " + std::to_string(stored) + " differs from the raw length " +
                                          std::to_string(raw_len) + " of an uncompressed chunk");
    if (raw_len > 0) std::memcpy(dst, src, raw_len);
    return Status::OK();
  }
  // Exactly one zstd frame, and nothing after it: the format allows no skippable frames, no
  // concatenation and no padding, so any of them means the bytes are not what the writer stored.
  if (stored < 4 || LoadLe<uint32_t>(src) != ZSTD_MAGICNUMBER)
    return Status::Corruption(what, name + " chunk of " + std::to_string(stored) + " bytes does not start a zstd frame");
  const size_t frame = ZSTD_findFrameCompressedSize(src, stored);
  if (ZSTD_isError(frame))
    return Status::Corruption(what, name + " chunk of " + std::to_string(stored) + " bytes is not a whole zstd frame: " +
                                        ZSTD_getErrorName(frame));
  if (frame != stored)
    return Status::Corruption(what, name + " chunk of " + std::to_string(stored) + " bytes holds a zstd frame of " +
                                        std::to_string(frame) + " bytes and then other bytes");
  const unsigned long long declared = ZSTD_getFrameContentSize(src, stored);
  if (declared == ZSTD_CONTENTSIZE_ERROR)
    return Status::Corruption(what, name + " chunk has a malformed zstd frame header");
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != raw_len)
    return Status::Corruption(what, name + " chunk declares " + std::to_string(declared) + " decoded bytes, expected " +
                                        std::to_string(raw_len));
  if (dctx_ == nullptr) return Status::ResourceExhausted(what, "cannot allocate a zstd decompression context");
  const bool grouped = codec == Codec::kZstdByteGroup && elem_size > 1;
  uint8_t* out = grouped ? Scratch(raw_len) : dst;
  // Writes stay inside [out, out + raw_len): zstd fails with dstSize_tooSmall rather than write more.
  const size_t r = ZSTD_decompressDCtx(static_cast<ZSTD_DCtx*>(dctx_), out, raw_len, src, stored);
  if (ZSTD_isError(r))
    return Status::Corruption(what, name + " chunk does not decode to " + std::to_string(raw_len) +
                                        " bytes: " + ZSTD_getErrorName(r));
  if (r != raw_len)
    return Status::Corruption(what, name + " chunk decodes to " + std::to_string(r) + " bytes, expected " +
                                        std::to_string(raw_len));
  if (grouped) UngroupBytes(elem_size, out, raw_len, dst);
  return Status::OK();
}

std::string CodecName(Codec c) {
  switch (c) {
    case Codec::kNone: return "none";
    case Codec::kZstd: return "zstd";
    case Codec::kZstdByteGroup: return "zstd-bytegroup";
  }
  return "codec " + std::to_string(static_cast<int>(c));
}

}  // namespace lifeline::format
