#include "formats/checksum.h"

#include <xxhash.h>

namespace lifeline::format {

uint64_t Checksum64(const void* data, size_t n) { return XXH3_64bits(data, n); }

StreamingChecksum::StreamingChecksum() : state_(XXH3_createState()) { Reset(); }
StreamingChecksum::~StreamingChecksum() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void StreamingChecksum::Reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }

void StreamingChecksum::Update(const void* data, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, n);
}

uint64_t StreamingChecksum::Digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

}  // namespace lifeline::format
