// libFuzzer target: arbitrary stored bytes into ChunkCodec::Decode, as a hostile data file would
// give them. It must never crash or touch memory outside the buffers it was given; whatever it
// decodes must encode and decode again to the same bytes.
//
// Input: byte 0 picks the codec (zstd or zstd with byte grouping) and the element size; bytes 1-3
// the expected raw length (at most 1 MiB, a multiple of the element size); the rest is the frame.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "formats/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lifeline::format::ChunkCodec;
  using lifeline::format::Codec;
  if (size < 4) return 0;
  const Codec codec = (data[0] & 1) ? Codec::kZstdByteGroup : Codec::kZstd;
  const size_t elem = size_t{1} << ((data[0] >> 1) & 3);
  const size_t raw_len = (size_t{data[1]} | size_t{data[2]} << 8 | static_cast<size_t>(data[3] & 0x0F) << 16) / elem * elem;
  static ChunkCodec codec_state;
  // Exactly sized heap buffers, so AddressSanitizer sees any write or read past them.
  std::vector<uint8_t> stored(data + 4, data + size);
  std::vector<uint8_t> out(raw_len);
  if (!codec_state.Decode(codec, elem, stored.data(), stored.size(), out.data(), raw_len, "fuzz").ok()) return 0;
  std::vector<uint8_t> again(ChunkCodec::MaxEncodedSize(codec, raw_len));
  auto n = codec_state.Encode(codec, elem, 1, out.data(), raw_len, again.data(), again.size());
  if (!n.ok()) std::abort();
  std::vector<uint8_t> back(raw_len);
  if (!codec_state.Decode(codec, elem, again.data(), *n, back.data(), raw_len, "fuzz re-encoded").ok()) std::abort();
  if (back != out) std::abort();
  return 0;
}
