// Checksums of the format: XXH3-64 with seed 0 everywhere (chunks, objects, structures).
// XXH3 runs at memory speed (tens of GB/s), so verifying never limits a load.
#ifndef LIFELINE_FORMATS_CHECKSUM_H_
#define LIFELINE_FORMATS_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lifeline::format {

uint64_t Checksum64(const void* data, size_t n);
inline uint64_t Checksum64(std::string_view s) { return Checksum64(s.data(), s.size()); }

// Streaming form: the result equals Checksum64 of the concatenated updates.
class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  void Reset();
  void Update(const void* data, size_t n);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t, kept opaque so xxhash.h stays out of this header
};

}  // namespace lifeline::format

#endif  // LIFELINE_FORMATS_CHECKSUM_H_
