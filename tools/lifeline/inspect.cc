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

#include "lib/src/checkpoint_reader.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

struct InspectOptions {
  std::string dir;
  int64_t step = -1;  // -1: newest complete
  bool fragments = false;
  bool json = false;
};

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t StoredLength(const format::CheckpointIndex& m, const format::FragmentInfo& f);

struct TensorSummary {
  uint64_t fragments = 0;
  uint64_t bytes = 0;         // raw bytes of its fragments
  uint64_t stored_bytes = 0;  // after the codec
};

std::vector<TensorSummary> SummarizeTensors(const format::CheckpointIndex& m) {
  std::vector<TensorSummary> out(m.tensors.size());
  for (const format::FragmentInfo& f : m.fragments) {
    if (f.tensor >= out.size()) continue;  // a reader that opened the manifest has validated this
    TensorSummary& t = out[f.tensor];
    ++t.fragments;
    t.bytes += static_cast<uint64_t>(f.region.num_elements()) * DTypeSize(m.tensors[f.tensor].dtype);
    t.stored_bytes += StoredLength(m, f);
  }
  return out;
}

const char* CodecName(format::Codec codec) {
  switch (codec) {
    case format::Codec::kNone: return "none";
    case format::Codec::kZstd: return "zstd";
    case format::Codec::kZstdByteGroup: return "zstd-bytegroup";
  }
  return "?";
}

std::string RegionText(const format::Region& r) {
  return "offsets " + ShapeText(r.offsets) + " shape " + ShapeText(r.shape) + " elements [" +
         std::to_string(r.flat_begin) + ", " + std::to_string(r.flat_end) + ")";
}

uint64_t StoredLength(const format::CheckpointIndex& m, const format::FragmentInfo& f) {
  uint64_t n = 0;
  for (uint64_t c = f.first_chunk; c < f.first_chunk + f.num_chunks && c < m.chunks.size(); ++c) {
    n += m.chunks[c].stored_length;
  }
  return n;
}

// Names that index into the manifest's tables; "?" for an index out of range.
std::string TensorName(const format::CheckpointIndex& m, uint32_t i) {
  return i < m.tensors.size() ? m.tensors[i].name : "?";
}
std::string FileName(const format::CheckpointIndex& m, uint32_t i) { return i < m.files.size() ? m.files[i].name : "?"; }

nlohmann::json FragmentsJson(const format::CheckpointIndex& m) {
  nlohmann::json out = nlohmann::json::array();
  for (const format::FragmentInfo& f : m.fragments) {
    out.push_back({{"tensor", TensorName(m, f.tensor)},
                   {"file", FileName(m, f.file)},
                   {"offset", f.offset},
                   {"stored_length", StoredLength(m, f)},
                   {"chunks", f.num_chunks},
                   {"codec", CodecName(f.codec)},
                   {"region",
                    {{"offsets", f.region.offsets},
                     {"shape", f.region.shape},
                     {"flat_begin", f.region.flat_begin},
                     {"flat_end", f.region.flat_end}}}});
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

nlohmann::json StepDetailJson(const CheckpointReader& reader) {
  const format::CheckpointIndex& m = reader.manifest();
  const std::vector<TensorSummary> sums = SummarizeTensors(m);
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t total = 0;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const format::TensorInfo& t = m.tensors[i];
    total += sums[i].bytes;
    tensors.push_back({{"name", t.name},
                       {"dtype", std::string(DTypeName(t.dtype))},
                       {"shape", t.shape},
                       {"fragments", sums[i].fragments},
                       {"bytes", sums[i].bytes},
                       {"stored_bytes", sums[i].stored_bytes}});
  }
  nlohmann::json objects = nlohmann::json::array();
  for (const format::ObjectInfo& o : m.objects) {
    objects.push_back({{"name", o.name}, {"rank", o.rank}, {"length", o.length}});
  }
  nlohmann::json files = nlohmann::json::array();
  for (const format::FileInfo& f : m.files) files.push_back({{"name", f.name}, {"rank", f.rank}, {"size", f.size}});
  return {{"step", m.step},
          {"directory", reader.step_dir()},
          {"run_id", m.run_id},
          {"world_size", m.world_size},
          {"chunk_bytes", m.chunk_bytes},
          {"created_unix_ns", m.created_unix_ns},
          {"created", FormatUnixNanos(m.created_unix_ns)},
          {"tensor_bytes", total},
          {"fragments", m.fragments.size()},
          {"chunks", m.chunks.size()},
          {"tensors", std::move(tensors)},
          {"objects", std::move(objects)},
          {"files", std::move(files)},
          {"metadata", MetadataAsJson(m.metadata_json)}};
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

void PrintStepDetail(const CheckpointReader& reader) {
  const format::CheckpointIndex& m = reader.manifest();
  const std::vector<TensorSummary> sums = SummarizeTensors(m);
  uint64_t total = 0, stored = 0;
  for (const TensorSummary& s : sums) {
    total += s.bytes;
    stored += s.stored_bytes;
  }
  std::cout << "\nStep " << m.step << " (" << reader.step_dir() << ")\n"
            << "  run id      " << m.run_id << '\n'
            << "  world size  " << m.world_size << '\n'
            << "  chunk size  " << FormatByteSize(m.chunk_bytes) << '\n'
            << "  created     " << FormatUnixNanos(m.created_unix_ns) << '\n'
            << "  tensors     " << m.tensors.size() << " tensors, " << FormatByteSize(total) << " ("
            << FormatByteSize(stored) << " stored) in " << m.fragments.size() << " fragments and "
            << m.chunks.size() << " chunks\n"
            << "  metadata    " << (m.metadata_json.empty() ? "(none)" : m.metadata_json) << '\n';

  std::cout << "\nTensors:\n";
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const format::TensorInfo& t = m.tensors[i];
    rows.push_back({t.name, std::string(DTypeName(t.dtype)), ShapeText(t.shape), std::to_string(sums[i].fragments),
                    FormatByteSize(sums[i].bytes)});
  }
  PrintTable({"NAME", "DTYPE", "SHAPE", "FRAGMENTS", "BYTES"}, rows);

  std::cout << "\nPer-rank objects:\n";
  rows.clear();
  for (const format::ObjectInfo& o : m.objects) rows.push_back({std::to_string(o.rank), o.name, std::to_string(o.length)});
  if (rows.empty()) {
    std::cout << "  (none)\n";
  } else {
    PrintTable({"RANK", "NAME", "LENGTH"}, rows);
  }

  std::cout << "\nFiles:\n";
  rows.clear();
  for (const format::FileInfo& f : m.files) rows.push_back({f.name, std::to_string(f.rank), FormatByteSize(f.size)});
  PrintTable({"NAME", "RANK", "SIZE"}, rows);
}

void PrintFragments(const format::CheckpointIndex& m) {
  std::cout << "\nFragments:\n";
  std::vector<std::vector<std::string>> rows;
  rows.reserve(m.fragments.size());
  for (const format::FragmentInfo& f : m.fragments) {
    rows.push_back({TensorName(m, f.tensor), FileName(m, f.file), std::to_string(f.offset),
                    std::to_string(StoredLength(m, f)), CodecName(f.codec), RegionText(f.region)});
  }
  PrintTable({"TENSOR", "FILE", "OFFSET", "STORED", "CODEC", "REGION"}, rows);
}

int RunInspect(const InspectOptions& o) {
  auto steps = ScanCheckpoints(Env::Default(), o.dir);
  if (!steps.ok()) return ReportFailure("inspect", steps.status(), o.json);
  if (steps->empty()) {
    return ReportFailure("inspect", Status::NotFound(o.dir, "no checkpoint found in this directory"), o.json);
  }
  std::optional<uint64_t> step;
  if (o.step >= 0) {
    step = static_cast<uint64_t>(o.step);
  } else {
    for (const CheckpointInfo& c : *steps) {
      if (c.complete) {
        step = c.step;
        break;
      }
    }
  }
  std::unique_ptr<CheckpointReader> reader;
  Status open_status;
  if (step.has_value()) {
    auto r = CheckpointReader::Open(Env::Default(), o.dir, step);
    if (r.ok()) {
      reader = std::move(r).value();
    } else {
      open_status = r.status();
    }
  }

  if (o.json) {
    nlohmann::json j = {{"ok", open_status.ok()}, {"command", "inspect"}, {"root", o.dir}, {"steps", StepsJson(*steps)}};
    if (reader) {
      j["checkpoint"] = StepDetailJson(*reader);
      if (o.fragments) j["checkpoint"]["fragment_list"] = FragmentsJson(reader->manifest());
    }
    if (!open_status.ok()) j["error"] = open_status.ToString();
    PrintJson(j);
  } else {
    PrintSteps(o.dir, *steps);
    if (reader) {
      PrintStepDetail(*reader);
      if (o.fragments) PrintFragments(reader->manifest());
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
  app->add_option("dir", options->dir, "Checkpoint root directory")->required();
  app->add_option("--step", options->step, "Step to describe (default: the newest complete one)")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--fragments", options->fragments,
                "Also list every fragment: tensor, file, byte offset, stored length, codec, region");
  app->add_flag("--json", options->json, "Print one JSON object on stdout");
  commands->push_back({app, [options] { return RunInspect(*options); }});
}

}  // namespace lifeline::cli
