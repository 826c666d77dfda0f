#include "tools/lifeline/metadata_text.h"

#include <nlohmann/json.hpp>

namespace lifeline::cli {
namespace {

std::string Cut(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  return text.substr(0, max) + "... (" + std::to_string(text.size()) + " characters)";
}

std::string ValueText(const nlohmann::json& v, size_t max) {
  const std::string dumped = v.dump();
  if (dumped.size() <= max) return dumped;
  if (v.is_object()) return "{" + std::to_string(v.size()) + " keys, " + std::to_string(dumped.size()) + " bytes}";
  if (v.is_array()) return "[" + std::to_string(v.size()) + " items, " + std::to_string(dumped.size()) + " bytes]";
  return Cut(dumped, max);
}

}  // namespace

std::vector<std::string> MetadataLines(const std::string& metadata_json, size_t max_value) {
  if (metadata_json.empty()) return {"(none)"};
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return {Cut(metadata_json, max_value)};
  if (j.empty()) return {"{}"};
  std::vector<std::string> lines;
  for (const auto& [key, value] : j.items()) lines.push_back(key + ": " + ValueText(value, max_value));
  return lines;
}

}  // namespace lifeline::cli
