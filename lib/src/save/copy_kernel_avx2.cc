// The AVX2 variant of CopyAndHash (copy_engine.cc picks it at run time when the CPU has AVX2).
// This file alone is compiled with -mavx2; it includes xxHash inline so that XXH3 uses its AVX2
// code path here whatever the shared libxxhash was built for.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace lifeline::internal {

uint64_t CopyAndHashAvx2(uint8_t* dst, const uint8_t* src, uint64_t n) {
  // Copy 16 KiB with streaming stores (no read-for-ownership of the destination, which the disk's
  // DMA reads next, not a core), then hash the same source bytes while they are still in L1.
  constexpr uint64_t kStep = 16 << 10;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (uint64_t done = 0; done < n;) {
    const uint64_t take = std::min(kStep, n - done);
    uint8_t* d = dst + done;
    const uint8_t* s = src + done;
    const uint64_t head = std::min<uint64_t>((32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31, take);
    std::memcpy(d, s, head);
    uint64_t i = head;
    for (; i + 128 <= take; i += 128) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
      const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
    }
    std::memcpy(d + i, s + i, take - i);
    XXH3_64bits_update(&state, s, take);
    done += take;
  }
  _mm_sfence();  // streaming stores are weakly ordered: complete them before the piece is published
  return XXH3_64bits_digest(&state);
}

}  // namespace lifeline::internal
