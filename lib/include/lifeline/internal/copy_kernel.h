// Part of the declared internal interface (lifeline/internal/): for Lifeline's own binaries, not users.
// The snapshot's copy-and-checksum kernel, which the copy engine (lib/src/save/copy_engine.h) runs on
// every piece of a snapshot. Declared here so that `lifeline bench save` can time the kernel alone
// against memcpy over the same pieces: the figure that says whether a slow snapshot is the kernel
// or the memory.
#ifndef LIFELINE_INTERNAL_COPY_KERNEL_H_
#define LIFELINE_INTERNAL_COPY_KERNEL_H_

#include <cstdint>

namespace lifeline {

// Copies n bytes from src to dst and returns XXH3-64 of them, in one pass over memory (the AVX2
// variant where the CPU has it). Thread-safe; src and dst must not overlap.
uint64_t CopyAndHash(uint8_t* dst, const uint8_t* src, uint64_t n);

}  // namespace lifeline

#endif  // LIFELINE_INTERNAL_COPY_KERNEL_H_
