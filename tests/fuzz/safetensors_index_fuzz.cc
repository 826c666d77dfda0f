// libFuzzer target: arbitrary bytes as model.safetensors.index.json into ParseSafetensorsIndex. It
// must never crash, read out of bounds or allocate without bound; never accept a file name that
// could leave the directory; and an index it accepts must be written again by BuildSafetensorsIndex
// and parse back to the same contents.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lifeline::format;
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  lifeline::Result<SafetensorsIndex> index = ParseSafetensorsIndex(json, "fuzz");
  if (!index.ok()) return 0;
  std::set<std::string> files;
  for (const auto& [tensor, file] : index->weight_map) {
    if (!IsSafeSafetensorsFileName(file)) std::abort();
    files.insert(file);
  }
  if (files != std::set<std::string>(index->files.begin(), index->files.end()) || files.size() != index->files.size())
    std::abort();
  lifeline::Result<std::string> written = BuildSafetensorsIndex(index->total_size, index->weight_map, index->metadata);
  if (!written.ok()) std::abort();  // accepted by the reader, refused by the writer
  lifeline::Result<SafetensorsIndex> again = ParseSafetensorsIndex(*written, "fuzz again");
  if (!again.ok() || again->total_size != index->total_size || again->weight_map != index->weight_map ||
      again->metadata != index->metadata || again->files != index->files)
    std::abort();
  return 0;
}
