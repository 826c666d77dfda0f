#include "lib/src/convert/tensor_mapping.h"

#include <algorithm>
#include <cstring>
#include <regex>
#include <unordered_map>
#include <utility>

#include "lib/src/convert/dtype_cast.h"

namespace lifeline {
namespace {

// Compiles `pattern`; InvalidArgument quoting the rule when std::regex refuses it.
Result<std::regex> CompileRule(const RenameRule& rule) {
  if (rule.pattern.empty()) return Status::InvalidArgument("--rename '" + RenameRuleText(rule) + "'", "the pattern is empty");
  try {
    return std::regex(rule.pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status::InvalidArgument("--rename '" + RenameRuleText(rule) + "'",
                                   std::string("not a valid regular expression: ") + e.what());
  }
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string RenameRuleText(const RenameRule& rule) { return rule.pattern + "=" + rule.replacement; }

Result<RenameRule> ParseRenameRule(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '=') continue;
    // Preceded by an odd number of backslashes, the '=' is escaped: part of the pattern.
    size_t slashes = 0;
    while (slashes < i && text[i - 1 - slashes] == '\\') ++slashes;
    if (slashes % 2 == 1) continue;
    RenameRule rule{std::string(text.substr(0, i)), std::string(text.substr(i + 1))};
    Result<std::regex> compiled = CompileRule(rule);
    if (!compiled.ok()) return compiled.status();
    return rule;
  }
  return Status::InvalidArgument("--rename '" + std::string(text) + "'", "expected PATTERN=REPLACEMENT");
}

Result<std::vector<RenameRule>> ParseRenameRules(std::string_view text, std::string_view file_name) {
  std::vector<RenameRule> rules;
  size_t line_number = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string_view line = Trim(text.substr(0, eol));
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_number;
    if (line.empty() || line.front() == '#') continue;
    Result<RenameRule> rule = ParseRenameRule(line);
    if (!rule.ok()) return rule.status().Annotate(std::string(file_name) + ":" + std::to_string(line_number));
    rules.push_back(std::move(rule).value());
  }
  return rules;
}

Result<std::vector<ExportTensor>> PlanExportTensors(const TensorSource& source, const ConvertOptions& options) {
  if (options.dtype && !IsCastTarget(*options.dtype)) {
    const std::string target(DTypeName(*options.dtype));
    for (const SourceTensor& t : source.tensors())
      if (IsFloatingDType(t.dtype) && t.dtype != *options.dtype)
        return Status::InvalidArgument(
            "--dtype " + target, "casting tensor '" + t.name + "' (" + std::string(DTypeName(t.dtype)) + ") to " + target +
                                     " is not floating to f64, f32, f16 or bf16; integers and bool are never cast");
    return Status::InvalidArgument("--dtype " + target, "the target must be f64, f32, f16 or bf16");
  }
  std::vector<std::pair<std::regex, const RenameRule*>> rules;
  for (const RenameRule& r : options.rename) {
    LL_ASSIGN_OR_RETURN(std::regex compiled, CompileRule(r));
    rules.emplace_back(std::move(compiled), &r);
  }
  std::vector<ExportTensor> plan;
  std::unordered_map<std::string, size_t> by_name;  // output name -> index into plan
  for (size_t i : SelectTensors(source, options.select)) {
    const SourceTensor& t = source.tensors()[i];
    ExportTensor e{i, t.name, t.name, -1, t.dtype, t.dtype, t.shape};
    for (size_t k = 0; k < rules.size(); ++k) {
      const auto& [re, rule] = rules[k];
      std::smatch m;
      bool matched = false;
      try {
        matched = std::regex_match(t.name, m, re);
        if (matched) e.name = m.format(rule->replacement);
      } catch (const std::regex_error& err) {  // the matcher's complexity or stack limits
        return Status::InvalidArgument("--rename '" + RenameRuleText(*rule) + "'",
                                       "matching tensor '" + t.name + "' failed: " + err.what());
      }
      if (!matched) continue;
      e.rule = static_cast<int>(k);
      if (e.name.empty())
        return Status::InvalidArgument("--rename '" + RenameRuleText(*rule) + "'",
                                       "renames tensor '" + t.name + "' to an empty name");
      break;  // the first rule that matches decides
    }
    if (options.dtype && IsFloatingDType(t.dtype)) e.dtype = *options.dtype;
    auto [it, inserted] = by_name.emplace(e.name, plan.size());
    if (!inserted)
      return Status::InvalidArgument("--rename", "tensors '" + plan[it->second].source_name + "' and '" + t.name +
                                                     "' would both be written as '" + e.name + "'");
    plan.push_back(std::move(e));
  }
  return plan;
}

MappedTensorSource::MappedTensorSource(TensorSource& inner, std::vector<ExportTensor> plan, uint64_t scratch_bytes)
    : TensorSource(inner.kind()), inner_(inner), plan_(std::move(plan)), scratch_bytes_(scratch_bytes) {
  description_ = inner.description();
  for (const ExportTensor& e : plan_) tensors_.push_back(SourceTensor{e.name, e.dtype, e.shape});
  objects_ = inner.objects();
  metadata_json_ = inner.metadata_json();
  step_ = inner.step();
  saved_world_size_ = inner.saved_world_size();
}

Status MappedTensorSource::ReadRegion(size_t tensor, const TensorRegion& region, void* dst) {
  if (tensor >= plan_.size()) return Status::InvalidArgument("tensor index " + std::to_string(tensor) + " out of range");
  const ExportTensor& e = plan_[tensor];
  if (!e.cast()) return inner_.Read(e.source_index, region, dst);
  const size_t in = DTypeSize(e.source_dtype), out = DTypeSize(e.dtype);
  const int64_t piece = std::max<int64_t>(1, static_cast<int64_t>(scratch_bytes_ / in));
  uint8_t* to = static_cast<uint8_t*>(dst);
  for (int64_t at = region.flat_begin; at < region.flat_end;) {
    const int64_t n = std::min(piece, region.flat_end - at);
    scratch_.resize(static_cast<size_t>(n) * in);
    LL_RETURN_IF_ERROR(inner_.Read(e.source_index, TensorRegion{region.offsets, region.shape, at, at + n}, scratch_.data()));
    LL_RETURN_IF_ERROR(CastElements(e.source_dtype, e.dtype, scratch_.data(),
                                    to + static_cast<size_t>(at - region.flat_begin) * out, static_cast<size_t>(n), e.name));
    at += n;
  }
  return Status::OK();
}

}  // namespace lifeline
