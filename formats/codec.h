// The per-chunk codecs of the format (formats/SPEC.md §12): none, zstd, and zstd of the bytes
// grouped by significance. Every chunk is one independent zstd frame, so chunks encode and decode
// in parallel and a load reads only the chunks it needs.
//
// Byte grouping stores byte 0 of every element, then byte 1 of every element, and so on. In
// floating-point weights the sign-and-exponent bytes vary little while the low mantissa bytes are
// close to random; grouped, zstd's entropy coder sees the two kinds apart and compresses the first
// well (ZipNN, arXiv 2411.05239).
//
// Decoding treats its input as hostile: a frame that is malformed, truncated, followed by extra
// bytes, or decodes to any length other than the expected one is Corruption, and no byte outside
// the given buffers is read or written.
//
// Thread safety: ChunkCodec is not thread-safe; use one per thread. MaxEncodedSize is pure.
#ifndef LIFELINE_FORMATS_CODEC_H_
#define LIFELINE_FORMATS_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/model.h"
#include "lifeline/status.h"

namespace lifeline::format {

// "none", "zstd" or "zstd-bytegroup"; "codec N" for a value outside the format.
std::string CodecName(Codec c);

// Reusable encoding and decoding state: the zstd contexts and the byte-grouping scratch buffer.
// After the first chunks of the largest size it allocates nothing.
class ChunkCodec {
 public:
  ChunkCodec();
  ~ChunkCodec();
  ChunkCodec(const ChunkCodec&) = delete;
  ChunkCodec& operator=(const ChunkCodec&) = delete;

  // Upper bound of the stored size of n raw bytes under `codec`.
  static size_t MaxEncodedSize(Codec codec, size_t n);

  // Encodes n raw bytes (whole elements of elem_size bytes; elem_size in {1, 2, 4, 8}) into dst,
  // which holds `capacity` bytes (at least MaxEncodedSize(codec, n)). Returns the stored length.
  // kNone copies. `level` is a zstd level (clamped to zstd's range); the entropy coder stays on at
  // negative levels. Under kZstdByteGroup, levels up to 3 share one setting tuned for weights (a
  // match finder that strides through noise, long matches only); higher levels search like zstd
  // does, which weights rarely repay. InvalidArgument on an unknown codec, a bad elem_size, a
  // partial element or too small a capacity.
  Result<size_t> Encode(Codec codec, size_t elem_size, int level, const uint8_t* src, size_t n, uint8_t* dst,
                        size_t capacity);

  // Decodes `stored` bytes at src into exactly raw_len bytes at dst. Corruption naming `what`
  // (e.g. "file X offset Y, tensor 'w'") when the frame is malformed, truncated, followed by other
  // bytes, or decodes to another length; InvalidArgument on an unknown codec or a bad elem_size.
  // On error the contents of dst are unspecified.
  Status Decode(Codec codec, size_t elem_size, const uint8_t* src, size_t stored, uint8_t* dst, size_t raw_len,
                std::string_view what);

 private:
  uint8_t* Scratch(size_t n);
  // Sets cctx_'s parameters for `codec` at `level` unless they already are.
  Status Configure(Codec codec, int level);

  void* cctx_;  // ZSTD_CCtx*, opaque so zstd.h stays out of this header
  void* dctx_;  // ZSTD_DCtx*
  Codec cctx_codec_;  // what cctx_ is set up for; kNone: not set up
  int cctx_level_;
  std::vector<uint8_t> scratch_;  // grouped bytes (encode) or decoded grouped bytes (decode)
};

// The byte-grouping transform of n bytes (whole elements of elem_size bytes, elem_size in
// {1, 2, 4, 8}) and its inverse; src and dst must not overlap. Exposed for tests and benchmarks.
void GroupBytes(size_t elem_size, const uint8_t* src, size_t n, uint8_t* dst);
void UngroupBytes(size_t elem_size, const uint8_t* src, size_t n, uint8_t* dst);

}  // namespace lifeline::format

#endif  // LIFELINE_FORMATS_CODEC_H_
