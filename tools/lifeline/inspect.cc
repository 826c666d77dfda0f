// lifeline inspect DIR [--step S] [--fragments] [--json]: what checkpoints a root holds (complete
// or partial, and why), and the contents of one of them: tensors, per-rank objects, files,
// metadata, and with --fragments where every stored piece of every tensor lies (file, byte offset,
// stored length, codec, region).
//
// Exit status: 0 when the listing worked and, if a step was asked for (or one is complete), it
// was described; 1 when the root cannot be read, holds no checkpoint, or the chosen step cannot
// be opened.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/inspect.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/metadata_text.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

struct InspectOptions : StepArgs {
  bool fragments = false;
};

std::string RegionText(const FragmentDescription& f) {
  return "offsets " + ShapeText(f.region_offsets) + " shape " + ShapeText(f.region_shape) + " elements [" +
         std::to_string(f.flat_begin) + ", " + std::to_string(f.flat_end) + ")";
}

nlohmann::json FragmentsJson(const CheckpointDescription& d) {
  nlohmann::json out = nlohmann::json::array();
  for (const FragmentDescription& f : d.fragments) {
    out.push_back({{"tensor", f.tensor},
                   {"file", f.file},
                   {"offset", f.offset},
                   {"stored_length", f.stored_length},
                   {"chunks", f.chunks},
                   {"codec", f.codec},
                   {"region",
                    {{"offsets", f.region_offsets},
                     {"shape", f.region_shape},
                     {"flat_begin", f.flat_begin},
                     {"flat_end", f.flat_end}}}});
  }
  return out;
}

nlohmann::json MetadataAsJson(const std::string& text) {
  if (text.empty()) return nullptr;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return text;  // not JSON after all: show it as a string
  return j;
}

nlohmann::json StepsJson(const std::vector<CheckpointInfo>& steps) {
  nlohmann::json out = nlohmann::json::array();
  for (const CheckpointInfo& c : steps) {
    nlohmann::json j = {{"step", c.step},
                        {"complete", c.complete},
                        {"invalid", c.invalid},
                        {"world_size", c.world_size},
                        {"ranks_present", c.ranks_present},
                        {"bytes", c.bytes},
                        {"created_unix_ns", c.created_unix_ns},
                        {"directory", c.directory}};
    if (!c.complete) j["problem"] = c.problem;
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::json StepDetailJson(const CheckpointDescription& d) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorDescription& t : d.tensors) {
    tensors.push_back({{"name", t.name},
                       {"dtype", std::string(DTypeName(t.dtype))},
                       {"shape", t.shape},
                       {"fragments", t.fragments},
                       {"bytes", t.bytes},
                       {"stored_bytes", t.stored_bytes}});
  }
  nlohmann::json objects = nlohmann::json::array();
  for (const ObjectDescription& o : d.objects) {
    objects.push_back({{"name", o.name}, {"rank", o.rank}, {"length", o.length}});
  }
  nlohmann::json files = nlohmann::json::array();
  for (const FileDescription& f : d.files) files.push_back({{"name", f.name}, {"rank", f.rank}, {"size", f.size}});
  return {{"step", d.step},
          {"directory", d.directory},
          {"run_id", d.run_id},
          {"world_size", d.world_size},
          {"chunk_bytes", d.chunk_bytes},
          {"created_unix_ns", d.created_unix_ns},
          {"created", FormatUnixNanos(d.created_unix_ns)},
          {"tensor_bytes", d.tensor_bytes()},
          {"fragments", d.fragments.size()},
          {"chunks", d.chunks},
          {"tensors", std::move(tensors)},
          {"objects", std::move(objects)},
          {"files", std::move(files)},
          {"metadata", MetadataAsJson(d.metadata_json)}};
}

// Left-aligned columns wide enough for every cell.
void PrintTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line = " ";
    for (size_t c = 0; c < row.size(); ++c) {
      line += ' ';
      line += row[c];
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 1, ' ');
    }
    std::cout << line << '\n';
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
}

void PrintSteps(const std::string& dir, const std::vector<CheckpointInfo>& steps) {
  std::cout << "Checkpoints in " << dir << " (newest first):\n";
  std::vector<std::vector<std::string>> rows;
  for (const CheckpointInfo& c : steps) {
    rows.push_back({std::to_string(c.step), c.complete ? "complete" : c.invalid ? "invalid" : "partial",
                    std::to_string(c.ranks_present) + "/" + std::to_string(c.world_size), FormatByteSize(c.bytes),
                    FormatUnixNanos(c.created_unix_ns), c.complete ? "" : c.problem});
  }
  PrintTable({"STEP", "STATE", "RANKS", "SIZE", "CREATED", "PROBLEM"}, rows);
}

void PrintStepDetail(const CheckpointDescription& d) {
  std::cout << "\nStep " << d.step << " (" << d.directory << ")\n"
            << "  run id      " << d.run_id << '\n'
            << "  world size  " << d.world_size << '\n'
            << "  chunk size  " << FormatByteSize(d.chunk_bytes) << '\n'
            << "  created     " << FormatUnixNanos(d.created_unix_ns) << '\n'
            << "  tensors     " << d.tensors.size() << " tensors, " << FormatByteSize(d.tensor_bytes()) << " ("
            << FormatByteSize(d.stored_bytes()) << " stored) in " << d.fragments.size() << " fragments and "
            << d.chunks << " chunks\n"
            << "  metadata    ";
  const std::vector<std::string> metadata = MetadataLines(d.metadata_json);
  for (size_t i = 0; i < metadata.size(); ++i) std::cout << (i == 0 ? "" : "              ") << metadata[i] << '\n';

  std::cout << "\nTensors:\n";
  std::vector<std::vector<std::string>> rows;
  for (const TensorDescription& t : d.tensors) {
    rows.push_back({t.name, std::string(DTypeName(t.dtype)), ShapeText(t.shape), std::to_string(t.fragments),
                    FormatByteSize(t.bytes)});
  }
  PrintTable({"NAME", "DTYPE", "SHAPE", "FRAGMENTS", "BYTES"}, rows);

  std::cout << "\nPer-rank objects:\n";
  rows.clear();
  for (const ObjectDescription& o : d.objects) rows.push_back({std::to_string(o.rank), o.name, std::to_string(o.length)});
  if (rows.empty()) {
    std::cout << "  (none)\n";
  } else {
    PrintTable({"RANK", "NAME", "LENGTH"}, rows);
  }

  std::cout << "\nFiles:\n";
  rows.clear();
  for (const FileDescription& f : d.files) rows.push_back({f.name, std::to_string(f.rank), FormatByteSize(f.size)});
  PrintTable({"NAME", "RANK", "SIZE"}, rows);
}

void PrintFragments(const CheckpointDescription& d) {
  std::cout << "\nFragments:\n";
  std::vector<std::vector<std::string>> rows;
  rows.reserve(d.fragments.size());
  for (const FragmentDescription& f : d.fragments) {
    rows.push_back({f.tensor, f.file, std::to_string(f.offset), std::to_string(f.stored_length), f.codec,
                    RegionText(f)});
  }
  PrintTable({"TENSOR", "FILE", "OFFSET", "STORED", "CODEC", "REGION"}, rows);
}

int RunInspect(const InspectOptions& o) {
  auto steps = ScanCheckpointDirectory(o.dir);
  if (!steps.ok()) return ReportFailure("inspect", steps.status(), o.json);
  if (steps->empty()) {
    return ReportFailure("inspect", Status::NotFound(o.dir, "no checkpoint found in this directory"), o.json);
  }
  std::optional<uint64_t> step = o.chosen_step();
  if (!step) {
    for (const CheckpointInfo& c : *steps) {
      if (c.complete) {
        step = c.step;
        break;
      }
    }
  }
  std::optional<CheckpointDescription> described;
  Status open_status;
  if (step.has_value()) {
    auto r = DescribeCheckpoint(o.dir, step);
    if (r.ok()) {
      described = std::move(r).value();
    } else {
      open_status = r.status();
    }
  }

  if (o.json) {
    nlohmann::json j = {{"ok", open_status.ok()}, {"command", "inspect"}, {"root", o.dir}, {"steps", StepsJson(*steps)}};
    if (described) {
      j["checkpoint"] = StepDetailJson(*described);
      if (o.fragments) j["checkpoint"]["fragment_list"] = FragmentsJson(*described);
    }
    if (!open_status.ok()) j["error"] = open_status.ToString();
    PrintJson(j);
  } else {
    PrintSteps(o.dir, *steps);
    if (described) {
      PrintStepDetail(*described);
      if (o.fragments) PrintFragments(*described);
    } else if (!step.has_value()) {
      std::cout << "\nNo complete checkpoint: nothing here can be loaded.\n";
    }
  }
  if (!open_status.ok()) {
    std::cerr << "lifeline inspect: cannot open step " << *step << ": " << open_status.ToString() << std::endl;
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace

void AddInspectCommand(CLI::App& root, std::vector<Command>* commands) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* app = root.add_subcommand("inspect", "List the checkpoints of a directory and describe one of them");
  AddStepArgs(app, options.get(), "Step to describe");
  app->add_flag("--fragments", options->fragments,
                "Also list every fragment: tensor, file, byte offset, stored length, codec, region");
  commands->push_back({app, [options] { return RunInspect(*options); }});
}

}  // namespace lifeline::cli
