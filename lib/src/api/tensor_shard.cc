#include "lifeline/checkpoint.h"

namespace lifeline {
namespace {

int64_t Product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

}  // namespace

TensorShard TensorShard::Whole(std::string name, DType dtype, std::vector<int64_t> shape, void* data) {
  std::vector<int64_t> offsets(shape.size(), 0);
  std::vector<int64_t> box = shape;
  const int64_t n = Product(shape);
  return BoxFlat(std::move(name), dtype, std::move(shape), std::move(offsets), std::move(box), 0, n, data);
}

TensorShard TensorShard::Box(std::string name, DType dtype, std::vector<int64_t> global_shape,
                             std::vector<int64_t> offsets, std::vector<int64_t> shape, void* data) {
  const int64_t n = Product(shape);
  return BoxFlat(std::move(name), dtype, std::move(global_shape), std::move(offsets), std::move(shape),
                 0, n, data);
}

TensorShard TensorShard::Flat(std::string name, DType dtype, std::vector<int64_t> global_shape,
                              int64_t flat_begin, int64_t flat_end, void* data) {
  std::vector<int64_t> offsets(global_shape.size(), 0);
  std::vector<int64_t> box = global_shape;
  return BoxFlat(std::move(name), dtype, std::move(global_shape), std::move(offsets), std::move(box),
                 flat_begin, flat_end, data);
}

TensorShard TensorShard::BoxFlat(std::string name, DType dtype, std::vector<int64_t> global_shape,
                                 std::vector<int64_t> offsets, std::vector<int64_t> shape,
                                 int64_t flat_begin, int64_t flat_end, void* data) {
  TensorShard s;
  s.name = std::move(name);
  s.dtype = dtype;
  s.global_shape = std::move(global_shape);
  s.offsets = std::move(offsets);
  s.shape = std::move(shape);
  s.flat_begin = flat_begin;
  s.flat_end = flat_end;
  s.data = data;
  return s;
}

}  // namespace lifeline
