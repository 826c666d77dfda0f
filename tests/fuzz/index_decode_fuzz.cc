// libFuzzer target: arbitrary bytes into DecodeIndex. It must never crash, read out of bounds or
// allocate without bound; whatever it accepts must encode again and decode to the same index.
//
// Random bytes almost never carry valid XXH3 checksums, so each input is also decoded a second
// time with its header and whole-file checksums recomputed (at the places formats/SPEC.md gives):
// that lets the fuzzer reach the structural and semantic checks behind them.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "formats/checksum.h"
#include "formats/index_codec.h"

namespace {

using lifeline::format::CheckpointIndex;

void DecodeAndCheck(std::string_view bytes) {
  lifeline::Result<CheckpointIndex> decoded = lifeline::format::DecodeIndex(bytes, "fuzz");
  if (!decoded.ok()) return;
  lifeline::Result<std::string> encoded = lifeline::format::EncodeIndex(*decoded);
  if (!encoded.ok()) std::abort();  // the decoder accepted what the encoder refuses
  lifeline::Result<CheckpointIndex> again = lifeline::format::DecodeIndex(*encoded, "fuzz re-encoded");
  if (!again.ok() || !(*again == *decoded)) std::abort();
}

// Header checksum: the header's last 8 bytes (length at offset 12). Whole-file checksum: the
// 8 bytes before the 8-byte end magic.
bool Reseal(std::string* b) {
  if (b->size() < 16) return false;
  uint32_t header_length;
  std::memcpy(&header_length, b->data() + 12, 4);
  if (header_length < 24 || header_length % 8 != 0 || uint64_t{header_length} + 16 > b->size()) return false;
  const uint64_t header_sum = lifeline::format::Checksum64(b->data(), header_length - 8);
  std::memcpy(b->data() + header_length - 8, &header_sum, 8);
  const size_t body_end = b->size() - 16;
  const uint64_t body_sum = lifeline::format::Checksum64(b->data(), body_end);
  std::memcpy(b->data() + body_end, &body_sum, 8);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  DecodeAndCheck(input);
  std::string resealed(input);
  if (Reseal(&resealed)) DecodeAndCheck(resealed);
  return 0;
}
