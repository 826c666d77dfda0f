// The AVX2 variants of CopyAndHash and GatherBandAndHash (copy_engine.cc picks them at run time
// when the CPU has AVX2).
// This file alone is compiled with -mavx2; it includes xxHash inline so that XXH3 uses its AVX2
// code path here whatever the shared libxxhash was built for.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
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

namespace {

// Copies n bytes with streaming stores where the destination allows whole 32-byte stores.
inline void StreamRun(uint8_t* d, const uint8_t* s, uint64_t n) {
  const uint64_t head = std::min<uint64_t>((32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31, n);
  std::memcpy(d, s, head);
  uint64_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
  }
  std::memcpy(d + i, s + i, n - i);
}

}  // namespace

void GatherBandAndHashAvx2(const uint8_t* const* sources, uint8_t* const* dsts, size_t count, uint64_t stride,
                           uint64_t run, uint64_t offset, uint64_t n, uint64_t* checksums) {
  // Row by row through the shard, each row's runs to their blocks: the source is read once, in
  // order (as CopyAndHash reads it), and each run is hashed while it is still in L1. Up to 16
  // blocks at a time (a band has no more; more would only be read in several passes).
  constexpr size_t kBlocksAtOnce = 16;
  for (size_t first = 0; first < count; first += kBlocksAtOnce) {
    const size_t blocks = std::min(kBlocksAtOnce, count - first);
    alignas(64) XXH3_state_t states[kBlocksAtOnce];
    for (size_t b = 0; b < blocks; ++b) XXH3_64bits_reset(&states[b]);
    uint64_t in_row = offset % run;
    uint64_t row_start = offset / run * stride;
    for (uint64_t done = 0; done < n; row_start += stride, in_row = 0) {
      const uint64_t take = std::min(n - done, run - in_row);
      for (size_t b = 0; b < blocks; ++b) {
        const uint8_t* s = sources[first + b] + row_start + in_row;
        StreamRun(dsts[first + b] + done, s, take);
        XXH3_64bits_update(&states[b], s, take);
      }
      done += take;
    }
    for (size_t b = 0; b < blocks; ++b) checksums[first + b] = XXH3_64bits_digest(&states[b]);
  }
  _mm_sfence();  // streaming stores are weakly ordered: complete them before the pieces are published
}

}  // namespace lifeline::internal
