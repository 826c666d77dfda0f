// What the conversion tests (tensor_source_test.cc, convert_test.cc) build their inputs from:
// safetensors files written through any Env, with values that tell every element apart.
#ifndef LIFELINE_LIB_SRC_CONVERT_TEST_SOURCES_H_
#define LIFELINE_LIB_SRC_CONVERT_TEST_SOURCES_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/safetensors.h"
#include "lifeline/convert.h"
#include "lifeline/env.h"

namespace lifeline::test {

struct TestTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string bytes;  // num_bytes of the tensor, row-major little-endian
};

// f32 tensor whose element i is base + i.
inline TestTensor F32Tensor(std::string name, std::vector<int64_t> shape, float base) {
  TestTensor t{std::move(name), DType::kF32, std::move(shape), {}};
  int64_t n = 1;
  for (int64_t e : t.shape) n *= e;
  t.bytes.resize(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    const float v = base + static_cast<float>(i);
    std::memcpy(t.bytes.data() + i * 4, &v, 4);
  }
  return t;
}

// The bytes of a safetensors file holding `tensors` (in order) and `metadata`.
inline std::string SafetensorsBytes(const std::vector<TestTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata = {}) {
  std::vector<format::SafetensorsEntry> entries;
  for (const TestTensor& t : tensors) entries.push_back(format::SafetensorsEntry{t.name, t.dtype, t.shape, 0, 0});
  Result<std::vector<format::SafetensorsEntry>> laid = format::LayOutSafetensors(entries);
  EXPECT_TRUE(laid.ok()) << laid.status().ToString();
  if (!laid.ok()) return {};
  Result<std::string> prefix = format::BuildSafetensorsPrefix(*laid, metadata);
  EXPECT_TRUE(prefix.ok()) << prefix.status().ToString();
  if (!prefix.ok()) return {};
  std::string out = *prefix;
  for (const TestTensor& t : tensors) out += t.bytes;
  return out;
}

// Writes a safetensors file at `path` through `env` (its directory created).
inline void WriteSafetensors(Env* env, const std::string& path, const std::vector<TestTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  ASSERT_TRUE(env->CreateDir(path.substr(0, path.rfind('/'))).ok());
  Status s = WriteFileAtomically(env, path, SafetensorsBytes(tensors, metadata));
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// Every element of tensor `index` of `source`, read whole.
inline std::string ReadWhole(TensorSource& source, size_t index) {
  const SourceTensor& t = source.tensors().at(index);
  std::string out(t.num_bytes(), '\0');
  Status s = source.Read(index, TensorRegion::Whole(t), out.data());
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

}  // namespace lifeline::test

#endif  // LIFELINE_LIB_SRC_CONVERT_TEST_SOURCES_H_
