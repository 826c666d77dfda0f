#include "tests/gpu/kernels.h"

namespace lifeline::testing {
namespace {

__global__ void Fill(uint32_t* p, size_t n, uint32_t seed, long long spin_cycles) {
  if (spin_cycles > 0) {
    const long long start = clock64();
    while (clock64() - start < spin_cycles) {
    }
  }
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = seed * 2654435761u + static_cast<uint32_t>(i);
}

}  // namespace

void LaunchFill(uint32_t* p, size_t n, uint32_t seed, long long spin_cycles, void* stream) {
  Fill<<<256, 256, 0, static_cast<cudaStream_t>(stream)>>>(p, n, seed, spin_cycles);
}

}  // namespace lifeline::testing
