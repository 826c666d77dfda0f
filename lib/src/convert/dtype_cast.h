// Casting floating-point elements between dtypes, for `lifeline convert --dtype` (ConvertOptions::
// dtype in lifeline/convert.h).
//
// Every source value is read exactly (f64, f32, f16, bf16, fp8 E4M3 and E5M2 all fit in a double)
// and rounded once to the target, to nearest with ties to even; a value past the target's largest
// finite one becomes infinity of its sign, one below its smallest subnormal becomes a zero of its
// sign; infinities stay infinite, a NaN stays a NaN of its sign (quiet, the payload's top bits
// kept). f32 to bf16 is therefore bit for bit what torch's `.to(torch.bfloat16)` gives for every
// value but NaN (whose bits torch's own kernels do not agree on). torch rounds f64 through f32
// first; a direct rounding differs from that in the last bit in rare halfway cases.
//
// Targets: f64, f32, f16, bf16 (not fp8: it would need a saturation policy nobody asked for).
//
// Thread safety: pure functions.
#ifndef LIFELINE_LIB_SRC_CONVERT_DTYPE_CAST_H_
#define LIFELINE_LIB_SRC_CONVERT_DTYPE_CAST_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lifeline/dtype.h"
#include "lifeline/status.h"

namespace lifeline {

// f64, f32, f16, bf16, f8e4m3, f8e5m2.
bool IsFloatingDType(DType t);
// f64, f32, f16, bf16: what a cast may produce.
bool IsCastTarget(DType t);

// Converts `n` little-endian elements of `from` at `src` into `to` at `dst` (n * DTypeSize(to)
// bytes; src and dst must not overlap). InvalidArgument naming `tensor` unless `from` is floating
// and `to` a cast target ("tensor 'w': cannot cast i64 to bf16: only floating tensors are cast").
[[nodiscard]] Status CastElements(DType from, DType to, const void* src, void* dst, size_t n,
                                  std::string_view tensor);

}  // namespace lifeline

#endif  // LIFELINE_LIB_SRC_CONVERT_DTYPE_CAST_H_
