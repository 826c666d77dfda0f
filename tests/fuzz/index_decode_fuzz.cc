// libFuzzer target: arbitrary bytes into DecodeIndex and ManifestPartReader. Neither may crash,
// read out of bounds or allocate without bound; whatever DecodeIndex accepts must encode again and
// decode to the same index, and read in parts, give the same index.
//
// Each input is decoded as given, then resealed (index_reseal.h).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "formats/index_codec.h"
#include "tests/fuzz/index_reseal.h"

namespace {

using lifeline::format::CheckpointIndex;

// The same bytes read in parts (formats/SPEC.md §5.5), every tensor's fragments fetched. It must
// never crash; when the whole-file decoder also accepts the input, both must agree.
void ReadInPartsAndCheck(std::string_view bytes, const lifeline::Result<CheckpointIndex>& decoded) {
  auto read = [bytes](uint64_t offset, uint64_t length, char* out) -> lifeline::Status {
    if (offset > bytes.size() || length > bytes.size() - offset) return lifeline::Status::IOError("fuzz", "past the end");
    std::memcpy(out, bytes.data() + offset, length);
    return lifeline::Status::OK();
  };
  auto parts = lifeline::format::ManifestPartReader::Open(read, bytes.size(), "fuzz");
  if (!parts.ok() || *parts == nullptr) return;
  CheckpointIndex all = (*parts)->head();
  std::vector<uint32_t> every(all.tensors.size());
  for (uint32_t t = 0; t < every.size(); ++t) every[t] = t;
  if (!(*parts)->AddTensors(every, &all).ok()) return;
  if (decoded.ok() && !(all == *decoded)) std::abort();
}

void DecodeAndCheck(std::string_view bytes) {
  lifeline::Result<CheckpointIndex> decoded = lifeline::format::DecodeIndex(bytes, "fuzz");
  ReadInPartsAndCheck(bytes, decoded);
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
