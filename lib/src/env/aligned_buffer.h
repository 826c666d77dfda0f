// Heap memory aligned for O_DIRECT transfers.
#ifndef LIFELINE_SRC_ALIGNED_BUFFER_H_
#define LIFELINE_SRC_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "lifeline/env.h"

namespace lifeline {

inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }

// Owns `size` bytes aligned to kDirectIoAlignment. Move-only. data() is null when allocation failed.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size) : size_(size) {
    if (posix_memalign(reinterpret_cast<void**>(&data_), kDirectIoAlignment, size == 0 ? kDirectIoAlignment : size) != 0)
      data_ = nullptr, size_ = 0;
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_ALIGNED_BUFFER_H_
