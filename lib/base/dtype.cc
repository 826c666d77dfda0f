#include "lifeline/dtype.h"

#include <array>

namespace lifeline {
namespace {

struct DTypeEntry {
  DType type;
  size_t size;
  std::string_view name;
  std::string_view torch_name;
};

constexpr std::array<DTypeEntry, 12> kDTypes = {{
    {DType::kF64, 8, "f64", "float64"},
    {DType::kF32, 4, "f32", "float32"},
    {DType::kF16, 2, "f16", "float16"},
    {DType::kBF16, 2, "bf16", "bfloat16"},
    {DType::kF8E4M3, 1, "f8e4m3", "float8_e4m3fn"},
    {DType::kF8E5M2, 1, "f8e5m2", "float8_e5m2"},
    {DType::kI64, 8, "i64", "int64"},
    {DType::kI32, 4, "i32", "int32"},
    {DType::kI16, 2, "i16", "int16"},
    {DType::kI8, 1, "i8", "int8"},
    {DType::kU8, 1, "u8", "uint8"},
    {DType::kBool, 1, "bool", "bool"},
}};

const DTypeEntry* Find(DType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return &e;
  return nullptr;
}

}  // namespace

size_t DTypeSize(DType t) {
  const DTypeEntry* e = Find(t);
  return e ? e->size : 0;
}

std::string_view DTypeName(DType t) {
  const DTypeEntry* e = Find(t);
  return e ? e->name : std::string_view("invalid");
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& e : kDTypes)
    if (name == e.name || name == e.torch_name) return e.type;
  return std::nullopt;
}

bool IsValidDType(uint8_t code) { return code >= 1 && code <= 12; }

}  // namespace lifeline
