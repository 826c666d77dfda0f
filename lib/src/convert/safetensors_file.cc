#include "lib/src/convert/safetensors_file.h"

#include <algorithm>
#include <new>
#include <string>
#include <string_view>

namespace lifeline {

Result<format::SafetensorsHeader> ReadSafetensorsHeader(const RandomAccessFile& file) {
  using format::kSafetensorsLengthBytes;
  const std::string& path = file.path();
  LL_ASSIGN_OR_RETURN(const uint64_t file_size, file.Size());
  char first[kSafetensorsLengthBytes];
  const size_t first_len = static_cast<size_t>(std::min<uint64_t>(file_size, sizeof(first)));
  LL_RETURN_IF_ERROR(file.ReadAt(0, first, first_len));
  LL_ASSIGN_OR_RETURN(const uint64_t n,
                      format::DecodeSafetensorsHeaderLength(std::string_view(first, first_len), file_size, path));

  std::string header_json;
  try {
    header_json.resize(n);
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted(path, "cannot allocate " + std::to_string(n) + " bytes for the header");
  }
  LL_RETURN_IF_ERROR(file.ReadAt(kSafetensorsLengthBytes, header_json.data(), n));
  return format::ParseSafetensorsHeader(header_json, file_size - kSafetensorsLengthBytes - n, path);
}

}  // namespace lifeline
