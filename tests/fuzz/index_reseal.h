// Random bytes almost never carry valid XXH3 checksums, so the index fuzzers also decode each input
// with its header and whole-file checksums recomputed (at the places formats/SPEC.md gives): that
// lets the fuzzer reach the structural and semantic checks behind them.
#ifndef LIFELINE_TESTS_FUZZ_INDEX_RESEAL_H_
#define LIFELINE_TESTS_FUZZ_INDEX_RESEAL_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "formats/checksum.h"

namespace lifeline::fuzz {

// Header checksum: the header's last 8 bytes (length at offset 12). Whole-file checksum: the
// 8 bytes before the 8-byte end magic. False when `b` is too short or its header length is
// unusable (left as it was).
inline bool ResealIndex(std::string* b) {
  if (b->size() < 16) return false;
  uint32_t header_length;
  std::memcpy(&header_length, b->data() + 12, 4);
  if (header_length < 24 || header_length % 8 != 0 || uint64_t{header_length} + 16 > b->size()) return false;
  const uint64_t header_sum = format::Checksum64(b->data(), header_length - 8);
  std::memcpy(b->data() + header_length - 8, &header_sum, 8);
  const size_t body_end = b->size() - 16;
  const uint64_t body_sum = format::Checksum64(b->data(), body_end);
  std::memcpy(b->data() + body_end, &body_sum, 8);
  return true;
}

}  // namespace lifeline::fuzz

#endif  // LIFELINE_TESTS_FUZZ_INDEX_RESEAL_H_
