// Byte sizes as people type and read them: "256MiB", "2G", "1.5GiB", "4096".
//
// Thread safety: pure functions.
#ifndef LIFELINE_TOOLS_LIFELINE_BYTE_SIZE_H_
#define LIFELINE_TOOLS_LIFELINE_BYTE_SIZE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "lifeline/status.h"

namespace lifeline::cli {

// Parses a non-negative number with an optional unit: B, K/KiB/KB, M/MiB/MB, G/GiB/GB, T/TiB/TB
// (case-insensitive, all powers of 1024, optional space before the unit). Fractions are allowed
// with a unit ("1.5GiB") and rounded down to whole bytes. InvalidArgument quoting the text when it
// is not such a size or does not fit in 64 bits.
Result<uint64_t> ParseByteSize(std::string_view text);

// "1.50 GiB", "256.00 MiB", "512 B".
std::string FormatByteSize(uint64_t bytes);

}  // namespace lifeline::cli

#endif  // LIFELINE_TOOLS_LIFELINE_BYTE_SIZE_H_
