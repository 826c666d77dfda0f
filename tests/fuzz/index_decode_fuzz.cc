// libFuzzer target: arbitrary bytes into DecodeIndex. It must never crash, read out of bounds or
// allocate without bound; whatever it accepts must encode again and decode to the same index.
//
// Each input is decoded as given, then resealed (index_reseal.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "formats/index_codec.h"
#include "tests/fuzz/index_reseal.h"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  DecodeAndCheck(input);
  std::string resealed(input);
  if (lifeline::fuzz::ResealIndex(&resealed)) DecodeAndCheck(resealed);
  return 0;
}
