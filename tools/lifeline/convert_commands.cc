// lifeline convert SRC --to hdf5|safetensors|lifeline OUT, lifeline reshard D --to D2 --ranks M,
// lifeline ls DIR, lifeline gc DIR --keep K, lifeline diff A B. See README "CLI" for the contract
// of each; commands.h for the output and exit-status conventions they share.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/convert.h"
#include "lifeline/env.h"
#include "lifeline/inspect.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"
#include "tools/lifeline/progress.h"

namespace lifeline::cli {
namespace {

Result<uint64_t> OptionalByteSize(const std::string& text, const char* option) {
  if (text.empty()) return uint64_t{0};
  Result<uint64_t> v = ParseByteSize(text);
  if (!v.ok()) return Status::InvalidArgument(option, v.status().message());
  return v;
}

// ---- convert and reshard --------------------------------------------------------------------------

struct ConvertArgs {
  std::string src;
  std::string to;
  std::string out;
  int64_t step = -1;
  int64_t out_step = -1;
  uint32_t ranks = 0, tp = 0, dp = 0;
  std::string memory_budget = "256MiB";
  std::string max_shard_size;
  std::vector<std::string> select;
  std::vector<std::string> rename;
  std::string rename_file;
  std::string dtype;
  int deflate = 0;
  std::string codec = "none";
  int codec_level = 0;
  bool buffered_io = false;
  bool force = false;
  bool json = false;
};

Result<ConvertOptions> MakeConvertOptions(const ConvertArgs& a) {
  ConvertOptions o;
  LL_ASSIGN_OR_RETURN(o.memory_budget, OptionalByteSize(a.memory_budget, "--memory-budget"));
  if (o.memory_budget < (1ull << 20)) return Status::InvalidArgument("--memory-budget", "must be at least 1MiB");
  LL_ASSIGN_OR_RETURN(o.max_shard_bytes, OptionalByteSize(a.max_shard_size, "--max-shard-size"));
  o.select = a.select;
  // --rename rules first, then the file's: the first rule that matches a name decides, so one
  // given on the command line overrides the file's.
  for (const std::string& text : a.rename) {
    LL_ASSIGN_OR_RETURN(RenameRule rule, ParseRenameRule(text));
    o.rename.push_back(std::move(rule));
  }
  if (!a.rename_file.empty()) {
    Result<std::string> text = ReadFileToString(Env::Default(), a.rename_file, 16ull << 20);
    if (!text.ok()) return text.status().Annotate("--rename-file");
    LL_ASSIGN_OR_RETURN(std::vector<RenameRule> rules, ParseRenameRules(*text, a.rename_file));
    o.rename.insert(o.rename.end(), rules.begin(), rules.end());
  }
  if (!a.dtype.empty()) {
    o.dtype = ParseDType(a.dtype);
    if (!o.dtype) return Status::InvalidArgument("--dtype", "'" + a.dtype + "' is not bf16, f16, f32 or f64");
  }
  o.force = a.force;
  o.deflate_level = a.deflate;
  if (a.out_step >= 0) o.step = static_cast<uint64_t>(a.out_step);
  Result<SaveCodec> codec = ParseSaveCodec(a.codec);
  if (!codec.ok()) return codec.status().Annotate("--codec");
  o.codec = *codec;
  o.codec_level = a.codec_level;
  o.direct_io = !a.buffered_io;
  return o;
}

// With --dtype: the selected tensors it left as they were (integers and bool), by name.
std::vector<std::string> NotCast(const std::vector<ExportTensor>& plan, std::optional<DType> dtype) {
  std::vector<std::string> names;
  if (dtype)
    for (const ExportTensor& e : plan)
      if (e.dtype != *dtype) names.push_back(e.name);
  return names;
}

// The --rename rules no selected tensor matched (a typo, or a name the model does not have).
std::vector<std::string> UnusedRules(const std::vector<ExportTensor>& plan, const ConvertOptions& o) {
  std::vector<bool> used(o.rename.size(), false);
  for (const ExportTensor& e : plan)
    if (e.rule >= 0) used[static_cast<size_t>(e.rule)] = true;
  std::vector<std::string> out;
  for (size_t k = 0; k < used.size(); ++k)
    if (!used[k]) out.push_back(o.rename[k].pattern + "=" + o.rename[k].replacement);
  return out;
}

// `names` quoted, all of them when there are few, else the first three and how many more.
std::string SomeNames(const std::vector<std::string>& names) {
  constexpr size_t kAll = 8, kExamples = 3;
  std::string out;
  const size_t shown = names.size() <= kAll ? names.size() : kExamples;
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (shown < names.size()) out += " and " + std::to_string(names.size() - shown) + " more (--json lists all)";
  return out;
}

// The text output's account of --rename and --dtype: what was renamed, cast from what to what,
// and what --dtype left alone.
void PrintChanges(const ConvertReport& report, const std::vector<ExportTensor>& plan, const ConvertOptions& o) {
  if (!o.rename.empty()) {
    std::vector<std::string> pairs;
    for (const ExportTensor& e : report.renamed) pairs.push_back("'" + e.source_name + "' -> '" + e.name + "'");
    std::cout << "  renamed " << report.renamed.size() << " of " << plan.size() << " tensors by " << o.rename.size()
              << " rule(s)" << (pairs.empty() ? "" : ": " + SomeNames(pairs)) << "\n";
    std::vector<std::string> unused = UnusedRules(plan, o);
    for (std::string& r : unused) r = "'" + r + "'";
    if (!unused.empty()) std::cout << "  rules that matched no tensor: " << SomeNames(unused) << "\n";
  }
  if (!o.dtype) return;
  const std::string target(DTypeName(*o.dtype));
  std::map<std::string, std::vector<std::string>> by_source_dtype;
  for (const ExportTensor& e : report.cast) by_source_dtype[std::string(DTypeName(e.source_dtype))].push_back("'" + e.name + "'");
  if (by_source_dtype.empty()) std::cout << "  --dtype " << target << ": no tensor cast\n";
  for (const auto& [from, names] : by_source_dtype)
    std::cout << "  cast " << names.size() << " tensor(s) " << from << " -> " << target << ": " << SomeNames(names) << "\n";
  std::vector<std::string> kept = NotCast(plan, o.dtype);
  for (std::string& n : kept) n = "'" + n + "'";
  if (!kept.empty())
    std::cout << "  not cast (integers and bool keep their dtype): " << SomeNames(kept) << "\n";
}

int RunConvert(const ConvertArgs& a, const char* command, const std::string& format) {
  const double t0 = NowSeconds();
  Result<ConvertOptions> options = MakeConvertOptions(a);
  if (!options.ok()) return ReportFailure(command, options.status(), a.json);
  if (format != "lifeline" && (a.ranks || a.tp || a.dp))
    return ReportFailure(command, Status::InvalidArgument("--ranks/--tp/--dp apply to --to lifeline only"), a.json);
  if (format != "safetensors" && !a.max_shard_size.empty())
    return ReportFailure(command, Status::InvalidArgument("--max-shard-size applies to --to safetensors only"), a.json);
  SourceOptions so;
  if (a.step >= 0) so.step = static_cast<uint64_t>(a.step);
  so.memory_budget = options->memory_budget;
  Result<std::unique_ptr<TensorSource>> source = OpenTensorSource(a.src, so);
  if (!source.ok()) return ReportFailure(command, source.status(), a.json);
  TensorSource& src = **source;
  if (a.step >= 0 && src.kind() != SourceKind::kCheckpoint)
    return ReportFailure(command, Status::InvalidArgument("--step", "applies to a checkpoint directory, not " + src.description()), a.json);
  // What will be written, checked before any output is opened (renames that collide, a --dtype
  // that is no floating type).
  Result<std::vector<ExportTensor>> plan = PlanExportTensors(src, *options);
  if (!plan.ok()) return ReportFailure(command, plan.status(), a.json);
  if (!options->select.empty() && plan->empty())
    return ReportFailure(command, Status::InvalidArgument("--select", "matches no tensor of " + src.description()), a.json);
  uint64_t total = 0;
  for (const ExportTensor& e : *plan)
    total += SourceTensor{e.name, e.dtype, e.shape}.num_bytes();
  Progress progress(std::string(command), total, a.json);
  options->progress = [&progress](const std::string& tensor, uint64_t bytes) {
    progress.SetDetail(tensor);
    progress.Add(bytes);
  };
  options->ranks = a.ranks;
  options->tp = a.tp;
  options->dp = a.dp;

  Result<ConvertFormat> to = ParseConvertFormat(format);
  if (!to.ok()) return ReportFailure(command, to.status(), a.json);
  Result<ConvertReport> report = Convert(src, *to, a.out, *options);
  if (!report.ok()) return ReportFailure(command, report.status(), a.json);
  const double seconds = NowSeconds() - t0;
  const double gbps = seconds > 0 ? static_cast<double>(report->bytes) / seconds / 1e9 : 0;
  if (a.json) {
    nlohmann::json j = {{"ok", true},
                        {"command", command},
                        {"source", src.description()},
                        {"source_format", std::string(SourceKindName(src.kind()))},
                        {"format", format},
                        {"tensors", report->tensors},
                        {"objects", report->objects},
                        {"bytes", report->bytes},
                        {"seconds", seconds},
                        {"gbps", gbps},
                        {"outputs", report->outputs}};
    nlohmann::json renamed = nlohmann::json::array(), cast = nlohmann::json::array();
    for (const ExportTensor& e : report->renamed) renamed.push_back({{"from", e.source_name}, {"to", e.name}});
    for (const ExportTensor& e : report->cast)
      cast.push_back({{"name", e.name}, {"source_name", e.source_name}, {"from", std::string(DTypeName(e.source_dtype))},
                      {"to", std::string(DTypeName(e.dtype))}});
    j["rename_rules"] = options->rename.size();
    j["unused_rules"] = UnusedRules(*plan, *options);
    j["renamed"] = renamed;
    j["dtype"] = options->dtype ? nlohmann::json(std::string(DTypeName(*options->dtype))) : nlohmann::json();
    j["cast"] = cast;
    j["not_cast"] = NotCast(*plan, options->dtype);
    if (format == "lifeline") {
      j["step"] = report->step;
      j["ranks"] = report->ranks;
      j["tp"] = report->tp;
      j["dp"] = report->dp;
      j["placement"] = report->placement;
    }
    PrintJson(j);
  } else {
    std::cout << command << ": " << report->tensors << " tensors (" << FormatByteSize(report->bytes) << ") and "
              << report->objects << " per-rank objects from " << src.description() << " in " << seconds << " s ("
              << gbps << " GB/s)\n";
    if (format == "lifeline")
      std::cout << "  step " << report->step << " for " << report->ranks << " ranks (tp " << report->tp
                << " x dp " << report->dp << ", " << report->placement << " placement)\n";
    PrintChanges(*report, *plan, *options);
    for (const std::string& out : report->outputs) std::cout << "  wrote " << out << "\n";
  }
  return kExitOk;
}

void AddConvertOptions(CLI::App* app, ConvertArgs* a) {
  app->add_option("--step", a->step, "Step of a checkpoint source (default: the newest complete one)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--memory-budget", a->memory_budget, "Bytes of tensor data in memory at once (default 256MiB)");
  app->add_option("--select", a->select, "Only tensors whose name starts with this prefix (repeatable)")
      ->allow_extra_args(false);  // one prefix per --select, so a positional may follow it
  app->add_flag("--force", a->force, "Replace existing output files");
  app->add_flag("--json", a->json, "Print one JSON object on stdout");
}

void AddLifelineTargetOptions(CLI::App* app, ConvertArgs* a) {
  app->add_option("--ranks", a->ranks, "Target world size (default: the source's)")->check(CLI::PositiveNumber);
  app->add_option("--tp", a->tp, "Target tensor-parallel degree")->check(CLI::PositiveNumber);
  app->add_option("--dp", a->dp, "Target data-parallel degree")->check(CLI::PositiveNumber);
  app->add_option("--out-step", a->out_step, "Step number to write (default: the source's, else 0)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--codec", a->codec, "none | zstd | zstd-bytegroup (default none)");
  app->add_option("--codec-level", a->codec_level, "zstd level");
  app->add_flag("--buffered-io", a->buffered_io, "Write through the page cache instead of O_DIRECT");
}

// ---- ls ------------------------------------------------------------------------------------------

struct LsArgs {
  std::string dir;
  bool json = false;
};

std::string AgeText(uint64_t created_unix_ns) {
  if (created_unix_ns == 0) return "-";
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  double s = std::max(0.0, now - static_cast<double>(created_unix_ns) / 1e9);
  char buf[32];
  if (s < 120) std::snprintf(buf, sizeof(buf), "%.0fs", s);
  else if (s < 7200) std::snprintf(buf, sizeof(buf), "%.0fm", s / 60);
  else if (s < 172800) std::snprintf(buf, sizeof(buf), "%.1fh", s / 3600);
  else std::snprintf(buf, sizeof(buf), "%.1fd", s / 86400);
  return buf;
}

// complete, partial, invalid (all indexes, never loadable), damaged (all indexes, unreadable).
const char* StepStateName(const CheckpointInfo& c) { return CheckpointStateName(CheckpointStateOf(c)); }

// Every rank's snapshot of the step is in some peer node's memory, as the agents last recorded.
bool IsReplicated(const CheckpointInfo& c, uint32_t replicated_ranks) {
  return c.world_size > 0 && replicated_ranks == c.world_size;
}

int RunLs(const LsArgs& a) {
  constexpr const char* kCommand = "ls";
  // "complete" means loadable as far as the metadata tells: every index decodes and the pieces
  // cover every tensor exactly. (Data checksums: lifeline verify.)
  Result<CheckpointListing> listing = ListCheckpoints(a.dir);
  if (!listing.ok()) return ReportFailure(kCommand, listing.status(), a.json);
  const std::string& tier_root = listing->memory_tier;
  struct Row {
    std::string where;
    CheckpointInfo c;
    uint32_t replicated_ranks;
  };
  std::vector<Row> rows;
  for (ListedCheckpoint& l : listing->checkpoints)
    rows.push_back({l.in_memory_tier ? "memory" : "disk", std::move(l.info), l.replicated_ranks});
  for (auto& [where, c, replicated_ranks] : rows) {
    // The scan does not open the indexes; the step directory's last change is when it was written.
    struct stat st;
    if (c.created_unix_ns == 0 && ::stat(c.directory.c_str(), &st) == 0)
      c.created_unix_ns = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec);
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // Informative: a directory whose lock cannot be read still lists.
  const std::optional<std::string> saving = DescribeSavingLaunch(a.dir).value_or(std::nullopt);
  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [where, c, replicated_ranks] : rows) {
      nlohmann::json j = {{"step", c.step},
                          {"state", StepStateName(c)},
                          {"location", where},
                          {"world_size", c.world_size},
                          {"ranks_present", c.ranks_present},
                          {"replicated", IsReplicated(c, replicated_ranks)},
                          {"replicated_ranks", replicated_ranks},
                          {"bytes", c.bytes},
                          {"created_unix_ns", c.created_unix_ns},
                          {"age_seconds", c.created_unix_ns ? now - static_cast<double>(c.created_unix_ns) / 1e9 : 0.0},
                          {"directory", c.directory}};
      if (!c.complete) j["problem"] = c.problem;
      if (c.suspect) j["problem"] = "suspect: " + c.suspect_reason;
      list.push_back(std::move(j));
    }
    PrintJson({{"ok", true}, {"command", kCommand}, {"dir", a.dir}, {"memory_tier", tier_root},
               {"saving", saving ? nlohmann::json(*saving) : nlohmann::json()}, {"checkpoints", list}});
    return kExitOk;
  }
  if (saving) std::cout << "saving now: " << *saving << "\n";
  if (rows.empty()) {
    std::cout << a.dir << ": no checkpoints\n";
    return kExitOk;
  }
  std::printf("%-12s %-9s %-7s %-7s %-7s %12s %7s  %s\n", "STEP", "STATE", "WHERE", "REPLICA", "RANKS", "SIZE", "AGE",
              "NOTE");
  for (const auto& [where, c, replicated_ranks] : rows) {
    const std::string ranks = c.complete ? std::to_string(c.world_size)
                                         : std::to_string(c.ranks_present) + "/" + std::to_string(c.world_size);
    const std::string replica = IsReplicated(c, replicated_ranks) ? "yes"
                                : replicated_ranks > 0 ? std::to_string(replicated_ranks) + "/" + std::to_string(c.world_size)
                                                       : "-";
    std::printf("%-12llu %-9s %-7s %-7s %-7s %12s %7s  %s\n", static_cast<unsigned long long>(c.step),
                StepStateName(c), where.c_str(), replica.c_str(), ranks.c_str(), FormatByteSize(c.bytes).c_str(),
                AgeText(c.created_unix_ns).c_str(), c.suspect ? c.suspect_reason.c_str() : c.complete ? "" : c.problem.c_str());
  }
  if (!tier_root.empty()) std::cout << "memory tier: " << tier_root << "\n";
  return kExitOk;
}

// ---- gc ------------------------------------------------------------------------------------------

struct GcArgs {
  std::string dir;
  uint32_t keep = 0;
  bool partial = false;
  bool force = false;
  bool no_verify = false;
  bool dry_run = false;
  bool json = false;
};

int RunGc(const GcArgs& a) {
  constexpr const char* kCommand = "gc";
  Result<std::vector<CheckpointInfo>> before = ScanCheckpointDirectory(a.dir);
  if (!before.ok()) return ReportFailure(kCommand, before.status(), a.json);
  // A step counts toward --keep only once it verifies (every checksum read), so damage in a newer
  // step never costs the older good one; with --no-verify only its metadata is checked.
  RetentionOptions retention;
  retention.keep_last = a.keep;
  retention.verify = !a.no_verify;
  retention.remove_partial = a.partial;
  retention.even_while_saving = a.force;
  std::vector<CheckpointInfo> removed;
  if (a.dry_run) {
    Result<std::vector<RetentionDecision>> plan = PlanRetention(a.dir, retention);
    if (!plan.ok()) return ReportFailure(kCommand, plan.status(), a.json);
    for (const RetentionDecision& d : *plan)
      if (d.remove) removed.push_back(d.info);
  } else {
    Status s = ApplyRetention(a.dir, retention);
    if (!s.ok()) return ReportFailure(kCommand, s, a.json);
    Result<std::vector<CheckpointInfo>> after = ScanCheckpointDirectory(a.dir);
    if (!after.ok()) return ReportFailure(kCommand, after.status(), a.json);
    std::set<uint64_t> left;
    for (const CheckpointInfo& c : *after) left.insert(c.step);
    for (const CheckpointInfo& c : *before)
      if (!left.count(c.step)) removed.push_back(c);
  }
  uint64_t bytes = 0;
  for (const CheckpointInfo& c : removed) bytes += c.bytes;
  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const CheckpointInfo& c : removed)
      list.push_back({{"step", c.step}, {"state", StepStateName(c)}, {"bytes", c.bytes}});
    PrintJson({{"ok", true}, {"command", kCommand}, {"dry_run", a.dry_run}, {"keep", a.keep},
               {"removed", list}, {"bytes_freed", bytes}});
    return kExitOk;
  }
  const char* verb = a.dry_run ? "would remove" : "removed";
  for (const CheckpointInfo& c : removed)
    std::cout << verb << " step " << c.step << " (" << StepStateName(c) << ", "
              << FormatByteSize(c.bytes) << ")\n";
  std::cout << kCommand << ": " << verb << " " << removed.size() << " step(s), " << FormatByteSize(bytes)
            << "; kept the newest " << (a.keep == 0 ? std::string("(all)") : std::to_string(a.keep))
            << " loadable\n";
  return kExitOk;
}

// ---- tier ls / tier gc ---------------------------------------------------------------------------

struct TierArgs {
  bool all = false;
  bool dry_run = false;
  bool json = false;
};

nlohmann::json TierRootJson(const MemoryTierRootInfo& r) {
  return {{"root", r.root}, {"checkpoint_dir", r.checkpoint_dir}, {"state", r.state}, {"in_use", r.in_use},
          {"steps", r.steps}, {"offered", r.offered}, {"bytes", r.bytes}};
}

int RunTierLs(const TierArgs& a) {
  constexpr const char* kCommand = "tier ls";
  Result<std::vector<MemoryTierRootInfo>> roots = ListMemoryTierRoots();
  if (!roots.ok()) return ReportFailure(kCommand, roots.status(), a.json);
  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const MemoryTierRootInfo& r : *roots) list.push_back(TierRootJson(r));
    PrintJson({{"ok", true}, {"command", kCommand}, {"roots", list}});
    return kExitOk;
  }
  if (roots->empty()) {
    std::cout << "no memory tier of this user on this node\n";
    return kExitOk;
  }
  std::printf("%-10s %-6s %-7s %12s  %-18s %s\n", "STATE", "IN USE", "STEPS", "MEMORY", "ROOT", "DIRECTORY");
  for (const MemoryTierRootInfo& r : *roots) {
    const std::string steps = std::to_string(r.offered) + "/" + std::to_string(r.steps);
    const size_t slash = r.root.find_last_of('/');
    std::printf("%-10s %-6s %-7s %12s  %-18s %s\n", r.state.c_str(), r.in_use ? "yes" : "no", steps.c_str(),
                FormatByteSize(r.bytes).c_str(), r.root.substr(slash + 1).c_str(),
                r.checkpoint_dir.empty() ? "?" : r.checkpoint_dir.c_str());
  }
  std::cout << "STEPS: offered for loads / held (the others were deleted from the disk); "
               "`lifeline tier gc` frees what nobody can load\n";
  return kExitOk;
}

int RunTierGc(const TierArgs& a) {
  constexpr const char* kCommand = "tier gc";
  Result<MemoryTierGcResult> gc = CollectMemoryTierRoots(a.all, a.dry_run);
  if (!gc.ok()) return ReportFailure(kCommand, gc.status(), a.json);
  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const MemoryTierRootInfo& r : gc->removed_roots) list.push_back(TierRootJson(r));
    PrintJson({{"ok", true}, {"command", kCommand}, {"dry_run", a.dry_run}, {"removed_roots", list},
               {"steps_removed", gc->steps_removed}, {"bytes_freed", gc->bytes_freed}});
    return kExitOk;
  }
  const char* verb = a.dry_run ? "would remove" : "removed";
  for (const MemoryTierRootInfo& r : gc->removed_roots)
    std::cout << verb << " " << r.root << " (" << r.state << ", "
              << (r.checkpoint_dir.empty() ? std::string("?") : r.checkpoint_dir) << ", " << r.steps << " step(s), "
              << FormatByteSize(r.bytes) << ")\n";
  std::cout << kCommand << ": " << verb << " " << gc->removed_roots.size() << " root(s) and " << gc->steps_removed
            << " deleted step(s) of others, " << FormatByteSize(gc->bytes_freed) << "\n";
  return kExitOk;
}

// ---- diff ----------------------------------------------------------------------------------------

struct DiffArgs {
  std::string a, b;
  int64_t step = -1;
  std::string memory_budget = "256MiB";
  bool json = false;
};

double HalfToDouble(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v;
  if (exp == 0) v = std::ldexp(mant, -24);
  else if (exp == 31) v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(mant + 1024, exp - 25);
  return sign ? -v : v;
}

double Fp8ToDouble(uint8_t b, bool e4m3) {
  const int sign = b >> 7;
  double v;
  if (e4m3) {
    const int exp = (b >> 3) & 15, mant = b & 7;
    if (exp == 15 && mant == 7) return std::numeric_limits<double>::quiet_NaN();
    v = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(mant + 8, exp - 10);
  } else {
    const int exp = (b >> 2) & 31, mant = b & 3;
    if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    v = exp == 0 ? std::ldexp(mant, -16) : std::ldexp(mant + 4, exp - 17);
  }
  return sign ? -v : v;
}

double ElementValue(DType t, const uint8_t* p) {
  switch (t) {
    case DType::kF64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::kF32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::kF16: { uint16_t v; std::memcpy(&v, p, 2); return HalfToDouble(v); }
    case DType::kBF16: { uint16_t v; std::memcpy(&v, p, 2); uint32_t f = uint32_t{v} << 16; float x; std::memcpy(&x, &f, 4); return x; }
    case DType::kF8E4M3: return Fp8ToDouble(*p, true);
    case DType::kF8E5M2: return Fp8ToDouble(*p, false);
    case DType::kI64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::kI32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kI16: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case DType::kI8: return static_cast<int8_t>(*p);
    case DType::kU8: return *p;
    case DType::kBool: return *p != 0;
  }
  return 0;
}

struct TensorDiff {
  std::string name;
  uint64_t elements = 0;
  uint64_t differing = 0;   // bitwise
  uint64_t nan_differing = 0;  // of those, pairs where either side is NaN
  double max_abs_diff = 0;  // over the other differing pairs
  int64_t first_index = -1; // row-major index of the first differing element
};

// "" when the two metadata texts are the same JSON document (or the same text); else where they
// first differ: "key 'lr': A 0.1, B 0.2", "key 'x' only in A", or both texts when not JSON.
std::string DescribeJsonDifference(const std::string& a, const std::string& b) {
  if (a == b) return "";
  const nlohmann::json ja = nlohmann::json::parse(a.empty() ? "null" : a, nullptr, false);
  const nlohmann::json jb = nlohmann::json::parse(b.empty() ? "null" : b, nullptr, false);
  auto shorten = [](std::string v) { return v.size() > 80 ? v.substr(0, 77) + "..." : v; };
  if (ja.is_discarded() || jb.is_discarded())
    return "A is '" + shorten(a) + "', B is '" + shorten(b) + "'";
  if (ja == jb) return "";
  const nlohmann::json patch = nlohmann::json::diff(ja, jb);
  if (patch.empty()) return "";
  const nlohmann::json& first = patch[0];
  const std::string path = first.value("path", "");
  const std::string where = path.empty() ? "the document" : "'" + path + "'";
  const std::string op = first.value("op", "");
  if (op == "add") return where + " only in B";
  if (op == "remove") return where + " only in A";
  const nlohmann::json::json_pointer pointer(path);
  return where + ": A " + shorten(ja.at(pointer).dump()) + ", B " + shorten(jb.at(pointer).dump()) +
         (patch.size() > 1 ? " (and " + std::to_string(patch.size() - 1) + " more)" : "");
}

int RunDiff(const DiffArgs& d) {
  constexpr const char* kCommand = "diff";
  Result<uint64_t> budget = OptionalByteSize(d.memory_budget, "--memory-budget");
  if (!budget.ok()) return ReportFailure(kCommand, budget.status(), d.json);
  SourceOptions so;
  if (d.step >= 0) so.step = static_cast<uint64_t>(d.step);
  so.memory_budget = *budget;
  Result<std::unique_ptr<TensorSource>> sa = OpenTensorSource(d.a, so);
  if (!sa.ok()) return ReportFailure(kCommand, sa.status(), d.json);
  Result<std::unique_ptr<TensorSource>> sb = OpenTensorSource(d.b, so);
  if (!sb.ok()) return ReportFailure(kCommand, sb.status(), d.json);
  TensorSource& A = **sa;
  TensorSource& B = **sb;
  std::map<std::string, size_t> in_b;
  for (size_t i = 0; i < B.tensors().size(); ++i) in_b[B.tensors()[i].name] = i;
  std::set<std::string> in_a;
  std::vector<std::string> missing_in_a, missing_in_b;
  std::vector<nlohmann::json> mismatched;
  std::vector<TensorDiff> differing;
  uint64_t identical = 0, total = 0;
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t i = 0; i < A.tensors().size(); ++i) {
    const SourceTensor& ta = A.tensors()[i];
    in_a.insert(ta.name);
    auto it = in_b.find(ta.name);
    if (it == in_b.end()) {
      missing_in_b.push_back(ta.name);
      continue;
    }
    const SourceTensor& tb = B.tensors()[it->second];
    if (ta.dtype != tb.dtype || ta.shape != tb.shape) {
      mismatched.push_back({{"name", ta.name},
                            {"a", {{"dtype", std::string(DTypeName(ta.dtype))}, {"shape", ta.shape}}},
                            {"b", {{"dtype", std::string(DTypeName(tb.dtype))}, {"shape", tb.shape}}}});
      continue;
    }
    pairs.emplace_back(i, it->second);
    total += ta.num_bytes();
  }
  for (const SourceTensor& tb : B.tensors())
    if (!in_a.count(tb.name)) missing_in_a.push_back(tb.name);

  Progress progress(kCommand, total, d.json);
  const uint64_t slab_bytes = std::max<uint64_t>(*budget / 2, 1ull << 20);
  std::vector<uint8_t> ba, bb;
  for (const auto& [ia, ib] : pairs) {
    const SourceTensor& t = A.tensors()[ia];
    const size_t elem = DTypeSize(t.dtype);
    TensorDiff td;
    td.name = t.name;
    td.elements = static_cast<uint64_t>(t.num_elements());
    const TensorRegion whole = TensorRegion::Whole(t);
    const int64_t slab = std::max<int64_t>(1, static_cast<int64_t>(slab_bytes / elem));
    progress.SetDetail(t.name);
    for (int64_t at = 0; at < whole.num_elements();) {
      const int64_t n = std::min(slab, whole.num_elements() - at);
      ba.resize(static_cast<size_t>(n) * elem);
      bb.resize(static_cast<size_t>(n) * elem);
      const TensorRegion sub{whole.offsets, whole.shape, at, at + n};
      Status s = A.Read(ia, sub, ba.data());
      if (s.ok()) s = B.Read(ib, sub, bb.data());
      if (!s.ok()) return ReportFailure(kCommand, s.Annotate("tensor '" + t.name + "'"), d.json);
      if (std::memcmp(ba.data(), bb.data(), ba.size()) != 0) {
        for (int64_t k = 0; k < n; ++k) {
          const uint8_t* pa = ba.data() + k * elem;
          const uint8_t* pb = bb.data() + k * elem;
          if (std::memcmp(pa, pb, elem) == 0) continue;
          if (td.first_index < 0) td.first_index = at + k;
          ++td.differing;
          const double va = ElementValue(t.dtype, pa), vb = ElementValue(t.dtype, pb);
          if (std::isnan(va) || std::isnan(vb)) ++td.nan_differing;
          else td.max_abs_diff = std::max(td.max_abs_diff, std::fabs(va - vb));
        }
      }
      progress.Add(static_cast<uint64_t>(n) * elem);
      at += n;
    }
    if (td.differing == 0) ++identical;
    else differing.push_back(td);
  }

  // Per-rank objects and metadata.
  std::vector<std::string> objects_differing;
  std::map<std::pair<uint32_t, std::string>, size_t> obj_b;
  for (size_t i = 0; i < B.objects().size(); ++i) obj_b[{B.objects()[i].rank, B.objects()[i].name}] = i;
  std::set<std::pair<uint32_t, std::string>> obj_seen;
  for (size_t i = 0; i < A.objects().size(); ++i) {
    const SourceObject& o = A.objects()[i];
    const std::string label = "rank " + std::to_string(o.rank) + " '" + o.name + "'";
    obj_seen.insert({o.rank, o.name});
    auto it = obj_b.find({o.rank, o.name});
    if (it == obj_b.end()) {
      objects_differing.push_back(label + " missing in B");
      continue;
    }
    Result<std::string> x = A.ReadObject(i), y = B.ReadObject(it->second);
    if (!x.ok()) return ReportFailure(kCommand, x.status(), d.json);
    if (!y.ok()) return ReportFailure(kCommand, y.status(), d.json);
    if (*x != *y) objects_differing.push_back(label + " differs");
  }
  for (const SourceObject& o : B.objects())
    if (!obj_seen.count({o.rank, o.name}))
      objects_differing.push_back("rank " + std::to_string(o.rank) + " '" + o.name + "' missing in A");
  // Metadata is JSON: the same document written with other spacing or key order is the same.
  const std::string metadata_difference = DescribeJsonDifference(A.metadata_json(), B.metadata_json());
  const bool metadata_differs = !metadata_difference.empty();

  const bool same = missing_in_a.empty() && missing_in_b.empty() && mismatched.empty() && differing.empty() &&
                    objects_differing.empty() && !metadata_differs;
  // How far apart the differing tensors are, for the summary: two runs that drifted by rounding
  // differ everywhere by little, a corrupted or wrong tensor by much.
  const TensorDiff* largest = nullptr;
  uint64_t elements_differing = 0;
  for (const TensorDiff& td : differing) {
    elements_differing += td.differing;
    if (largest == nullptr || td.max_abs_diff > largest->max_abs_diff) largest = &td;
  }
  if (d.json) {
    nlohmann::json diffs = nlohmann::json::array();
    for (const TensorDiff& td : differing)
      diffs.push_back({{"name", td.name}, {"elements", td.elements}, {"elements_differing", td.differing},
                       {"nan_differing", td.nan_differing}, {"max_abs_diff", td.max_abs_diff},
                       {"first_index", td.first_index}});
    PrintJson({{"ok", true}, {"command", kCommand}, {"a", A.description()}, {"b", B.description()},
               {"identical", same}, {"tensors_compared", pairs.size()}, {"tensors_identical", identical},
               {"bytes_compared", total}, {"differing", diffs}, {"missing_in_a", missing_in_a},
               {"missing_in_b", missing_in_b}, {"mismatched", mismatched}, {"objects_differing", objects_differing},
               {"metadata_differs", metadata_differs}, {"metadata_difference", metadata_difference},
               {"elements_differing", elements_differing},
               {"largest_difference", largest == nullptr ? nlohmann::json(nullptr)
                                                         : nlohmann::json{{"name", largest->name},
                                                                          {"max_abs_diff", largest->max_abs_diff}}}});
  } else {
    for (const std::string& n : missing_in_b) std::cout << "only in A: '" << n << "'\n";
    for (const std::string& n : missing_in_a) std::cout << "only in B: '" << n << "'\n";
    for (const nlohmann::json& m : mismatched)
      std::cout << "'" << m["name"].get<std::string>() << "': A is " << m["a"]["dtype"].get<std::string>() << " "
                << m["a"]["shape"].dump() << ", B is " << m["b"]["dtype"].get<std::string>() << " "
                << m["b"]["shape"].dump() << "\n";
    for (const TensorDiff& td : differing) {
      std::cout << "'" << td.name << "': " << td.differing << " of " << td.elements << " elements differ, max |a-b| "
                << td.max_abs_diff;
      if (td.nan_differing) std::cout << " (" << td.nan_differing << " with NaN)";
      std::cout << ", first at index " << td.first_index << "\n";
    }
    for (const std::string& o : objects_differing) std::cout << "object " << o << "\n";
    if (metadata_differs) std::cout << "metadata differs: " << metadata_difference << "\n";
    std::cout << (same ? "identical" : "different") << ": " << identical << " of " << pairs.size()
              << " common tensors identical (" << FormatByteSize(total) << " compared), " << missing_in_b.size()
              << " only in A, " << missing_in_a.size() << " only in B, " << mismatched.size()
              << " with another dtype or shape, " << objects_differing.size() << " per-rank object(s) differing, "
              << (metadata_differs ? "metadata differing" : "metadata identical") << "\n";
    if (largest != nullptr)
      std::cout << "  the " << differing.size() << " differing tensor(s) differ in " << elements_differing
                << " element(s), by at most " << largest->max_abs_diff << " (in '" << largest->name
                << "'): the values themselves differ, not their layout\n";
  }
  return same ? kExitOk : kExitFailed;
}

}  // namespace

void AddConvertCommands(CLI::App& root, std::vector<Command>* commands) {
  auto conv = std::make_shared<ConvertArgs>();
  CLI::App* c = root.add_subcommand(
      "convert", "Convert a checkpoint, HDF5 file or safetensors file/directory to hdf5, safetensors or lifeline");
  c->add_option("src", conv->src, "Checkpoint directory, .h5 file, .safetensors file or directory")->required();
  c->add_option("--to", conv->to, "hdf5 | safetensors | lifeline")->required();
  c->add_option("out", conv->out, "Output: .h5 file; .safetensors file or directory; checkpoint directory")->required();
  AddConvertOptions(c, conv.get());
  c->add_option("--deflate", conv->deflate, "hdf5: gzip level, 1 (fast) to 9 (small); 0, the default, stores uncompressed")->check(CLI::Range(0, 9));
  c->add_option("--max-shard-size", conv->max_shard_size,
                "safetensors: split into files of at most this size, with model.safetensors.index.json");
  c->add_option("--rename", conv->rename,
                "PATTERN=REPLACEMENT: a tensor whose whole name matches the regular expression is written as "
                "REPLACEMENT ($1.. its groups); repeatable, the first matching rule decides, unmatched names are kept; "
                "applied after --select")
      ->allow_extra_args(false);
  c->add_option("--rename-file", conv->rename_file,
                "A file of --rename rules, one a line, '#' comments; tried after the --rename options");
  c->add_option("--dtype", conv->dtype,
                "bf16 | f16 | f32 | f64: cast every floating tensor to it (round to nearest even); integers and bool "
                "are kept");
  AddLifelineTargetOptions(c, conv.get());
  commands->push_back({c, [conv] { return RunConvert(*conv, "convert", conv->to); }});

  auto resh = std::make_shared<ConvertArgs>();
  CLI::App* r = root.add_subcommand(
      "reshard", "Write a checkpoint's step again with the fragments of another layout (--ranks, --tp, --dp)");
  r->add_option("src", resh->src, "Checkpoint directory")->required();
  r->add_option("--to", resh->out, "Target checkpoint directory")->required();
  AddConvertOptions(r, resh.get());
  AddLifelineTargetOptions(r, resh.get());
  commands->push_back({r, [resh] { return RunConvert(*resh, "reshard", "lifeline"); }});

  auto ls = std::make_shared<LsArgs>();
  CLI::App* l = root.add_subcommand("ls", "List the checkpoints of a directory, on disk and in this node's memory tier");
  l->add_option("dir", ls->dir, "Checkpoint directory")->required();
  l->add_flag("--json", ls->json, "Print one JSON object on stdout");
  commands->push_back({l, [ls] { return RunLs(*ls); }});

  auto gc = std::make_shared<GcArgs>();
  CLI::App* g = root.add_subcommand(
      "gc", "Remove old checkpoints: keep the newest K complete ones, drop partial steps older than the newest");
  g->add_option("dir", gc->dir, "Checkpoint directory")->required();
  g->add_option("--keep", gc->keep, "Complete checkpoints to keep (0 keeps all, removing only stale partial steps)")
      ->required()
      ->check(CLI::NonNegativeNumber);
  g->add_flag("--partial", gc->partial,
              "Also remove partial steps newer than the newest loadable one; refused while a job is saving "
              "here (it holds the directory's lifeline.lock)");
  g->add_flag("--force", gc->force, "With --partial: remove them even while a job is saving here (its saves fail)");
  g->add_flag("--no-verify", gc->no_verify,
              "Count a step toward --keep when its metadata is sound, without reading its data checksums");
  g->add_flag("--dry-run", gc->dry_run, "Only list what would be removed");
  g->add_flag("--json", gc->json, "Print one JSON object on stdout");
  commands->push_back({g, [gc] { return RunGc(*gc); }});

  CLI::App* tier = root.add_subcommand("tier", "This node's memory tiers: list them, free what nobody can load");
  tier->require_subcommand(1);
  auto tier_ls = std::make_shared<TierArgs>();
  CLI::App* tl = tier->add_subcommand(
      "ls", "Every memory-tier root of this user on this node: its directory, whether that still exists, "
            "whether a job uses it, its steps and memory");
  tl->add_flag("--json", tier_ls->json, "Print one JSON object on stdout");
  commands->push_back({tl, [tier_ls] { return RunTierLs(*tier_ls); }});
  auto tier_gc = std::make_shared<TierArgs>();
  CLI::App* tg = tier->add_subcommand(
      "gc", "Free memory-tier roots of directories that are gone or re-created, and snapshots deleted from "
            "the disk; roots a running job uses are never touched");
  tg->add_flag("--all", tier_gc->all,
               "Also free snapshots still offered (a crashed job's resume point: its relaunch reads the disk)");
  tg->add_flag("--dry-run", tier_gc->dry_run, "Only list what would be freed");
  tg->add_flag("--json", tier_gc->json, "Print one JSON object on stdout");
  commands->push_back({tg, [tier_gc] { return RunTierGc(*tier_gc); }});

  auto diff = std::make_shared<DiffArgs>();
  CLI::App* d = root.add_subcommand(
      "diff", "Compare the tensors, per-rank objects and metadata of two checkpoints or files (exit 1 if they differ)");
  d->add_option("a", diff->a, "Checkpoint directory, .h5 or safetensors")->required();
  d->add_option("b", diff->b, "Checkpoint directory, .h5 or safetensors")->required();
  d->add_option("--step", diff->step, "Step of checkpoint sources (default: the newest complete)")
      ->check(CLI::NonNegativeNumber);
  d->add_option("--memory-budget", diff->memory_budget, "Bytes of tensor data in memory at once (default 256MiB)");
  d->add_flag("--json", diff->json, "Print one JSON object on stdout");
  commands->push_back({d, [diff] { return RunDiff(*diff); }});
}

}  // namespace lifeline::cli
