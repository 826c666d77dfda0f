// Element types a checkpoint can hold. The numeric values are part of the on-disk format
// (formats/SPEC.md, "dtype codes") and never change.
#ifndef LIFELINE_DTYPE_H_
#define LIFELINE_DTYPE_H_

#include "lifeline/export.h"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lifeline {

enum class DType : uint8_t {
  kF64 = 1,
  kF32 = 2,
  kF16 = 3,
  kBF16 = 4,
  kF8E4M3 = 5,
  kF8E5M2 = 6,
  kI64 = 7,
  kI32 = 8,
  kI16 = 9,
  kI8 = 10,
  kU8 = 11,
  kBool = 12,
};

// Size of one element in bytes; 0 for a code that is not a DType.
LIFELINE_EXPORT size_t DTypeSize(DType t);
// Lower-case short name: "f32", "bf16", "f8e4m3", "i64", "bool"...
LIFELINE_EXPORT std::string_view DTypeName(DType t);
// Inverse of DTypeName; also accepts torch spellings ("float32", "bfloat16", "int64", "float8_e4m3fn").
LIFELINE_EXPORT std::optional<DType> ParseDType(std::string_view name);
// True when `code` is one of the enumerators above (used when decoding untrusted bytes).
LIFELINE_EXPORT bool IsValidDType(uint8_t code);

}  // namespace lifeline

#endif  // LIFELINE_DTYPE_H_
