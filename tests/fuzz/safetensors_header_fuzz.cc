// libFuzzer target: the bytes of a safetensors file (the length field and the JSON header) into
// DecodeSafetensorsHeaderLength and ParseSafetensorsHeader, and the same bytes as a bare header.
// They must never crash, read out of bounds or allocate without bound; a header they accept must
// describe tensors that LayOutSafetensors and BuildSafetensorsPrefix write out again and that
// parse back to the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "formats/safetensors.h"

namespace {

using namespace lifeline::format;

void ParseAndCheck(std::string_view header_json, uint64_t data_bytes) {
  lifeline::Result<SafetensorsHeader> parsed = ParseSafetensorsHeader(header_json, data_bytes, "fuzz");
  if (!parsed.ok()) return;
  for (const SafetensorsEntry& e : parsed->tensors)
    if (e.begin > e.end || e.end > data_bytes) std::abort();
  lifeline::Result<std::vector<SafetensorsEntry>> laid_out = LayOutSafetensors(parsed->tensors);
  if (!laid_out.ok()) std::abort();  // accepted by the reader, refused by the writer
  lifeline::Result<std::string> prefix = BuildSafetensorsPrefix(*laid_out, parsed->metadata);
  if (!prefix.ok()) std::abort();
  const uint64_t written_data = laid_out->empty() ? 0 : laid_out->back().end;
  lifeline::Result<uint64_t> n = DecodeSafetensorsHeaderLength(*prefix, prefix->size() + written_data, "fuzz");
  if (!n.ok() || *n + kSafetensorsLengthBytes != prefix->size()) std::abort();
  lifeline::Result<SafetensorsHeader> again =
      ParseSafetensorsHeader(std::string_view(*prefix).substr(kSafetensorsLengthBytes), written_data, "fuzz again");
  if (!again.ok() || again->tensors != *laid_out || again->metadata != parsed->metadata) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  lifeline::Result<uint64_t> n = DecodeSafetensorsHeaderLength(file, size, "fuzz");
  if (n.ok()) {
    ParseAndCheck(file.substr(kSafetensorsLengthBytes, *n), size - kSafetensorsLengthBytes - *n);
  }
  ParseAndCheck(file, 1 << 20);  // without the length field: lets mutations change the header's size
  return 0;
}
