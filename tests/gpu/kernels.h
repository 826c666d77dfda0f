// Device kernels for the CUDA tests (kernels.cu), callable from plain C++.
#ifndef LIFELINE_TESTS_GPU_KERNELS_H_
#define LIFELINE_TESTS_GPU_KERNELS_H_

#include <cstddef>
#include <cstdint>

namespace lifeline::testing {

// Queues on `stream` a kernel that writes value(i) = seed * 2654435761 + i to p[i] for i < n,
// after spinning about `spin_cycles` GPU clock cycles (a slow producer or a slow optimizer).
void LaunchFill(uint32_t* p, size_t n, uint32_t seed, long long spin_cycles, void* stream);

// The value LaunchFill writes at index i.
inline uint32_t FillValue(uint32_t seed, size_t i) { return seed * 2654435761u + static_cast<uint32_t>(i); }

}  // namespace lifeline::testing

#endif  // LIFELINE_TESTS_GPU_KERNELS_H_
