// A checkpoint's global metadata as `lifeline inspect` shows it to a person: one line per key of
// a JSON object, each value whole when it is short and described when it is not (DCP's planner
// data alone is a line of tens of kilobytes); `--json` keeps every byte.
//
// Thread safety: pure functions.
#ifndef LIFELINE_TOOLS_LIFELINE_METADATA_TEXT_H_
#define LIFELINE_TOOLS_LIFELINE_METADATA_TEXT_H_

#include <cstddef>
#include <string>
#include <vector>

namespace lifeline::cli {

// The lines showing `metadata_json`: "(none)" for an empty text; for a JSON object, "key: value"
// per key in the object's order, a value whose JSON is longer than `max_value` characters shown as
// "{N keys, B bytes}", "[N items, B bytes]" or the string's first characters and its length; any
// other text (a JSON array or scalar, or not JSON) on one line, cut to `max_value` characters with
// its length when longer.
std::vector<std::string> MetadataLines(const std::string& metadata_json, size_t max_value = 100);

}  // namespace lifeline::cli

#endif  // LIFELINE_TOOLS_LIFELINE_METADATA_TEXT_H_
