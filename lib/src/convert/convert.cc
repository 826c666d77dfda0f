#include "lib/src/convert/convert.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "formats/geometry.h"
#include "formats/index_codec.h"
#include "formats/safetensors.h"
#include "lib/src/env/aligned_buffer.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/save/checkpoint_writer.h"
#include "lib/src/save/commit.h"
#include "lib/src/save/rank_objects.h"
#include "lib/src/save/save_job.h"
#include "lib/src/save/rank_data.h"
#include "lifeline/env.h"
#include "lib/src/convert/hdf5_file.h"
#include "lib/src/convert/tensor_mapping.h"
#include "lib/src/convert/tensor_source.h"

namespace lifeline {
namespace {

constexpr uint64_t kMinBudget = 1ull << 20;

std::vector<int64_t> Zeros(size_t n) { return std::vector<int64_t>(n, 0); }

format::Region WholeRegion(const SourceTensor& t) { return format::RegionOfBox(Zeros(t.shape.size()), t.shape); }

Env* EnvOf(const ConvertOptions& o) { return Env::OrDefault(o.env); }

// "convert-<pid>-<hex ns>": unique among the runs of this machine, like the CLI's run ids.
std::string NewConvertRunId() {
  const uint64_t ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  char buf[64];
  std::snprintf(buf, sizeof(buf), "convert-%d-%" PRIx64, static_cast<int>(::getpid()), ns);
  return buf;
}

// Streams `region` of tensor `t` in slabs of at most `slab_bytes`; fn(first element of the slab
// within the region, slab bytes, slab length in elements).
template <typename Fn>
Status ForEachSlab(TensorSource& source, size_t t, const format::Region& region, uint64_t slab_bytes,
                   std::vector<uint8_t>* buf, const ConvertOptions& o, Fn&& fn) {
  const SourceTensor& info = source.tensors()[t];
  const size_t elem = DTypeSize(info.dtype);
  const int64_t total = region.num_elements();
  const int64_t slab = std::max<int64_t>(1, static_cast<int64_t>(slab_bytes / elem));
  for (int64_t at = 0; at < total;) {
    const int64_t n = std::min(slab, total - at);
    buf->resize(static_cast<size_t>(n) * elem);
    LL_RETURN_IF_ERROR(source.Read(t, ToTensorRegion(format::SubRegion(region, at, at + n)), buf->data())
                           .Annotate("reading tensor '" + info.name + "' of " + source.description()));
    LL_RETURN_IF_ERROR(fn(at, buf->data(), n));
    if (o.progress) o.progress(info.name, static_cast<uint64_t>(n) * elem);
    at += n;
  }
  return Status::OK();
}

std::string TempSuffix() { return ".tmp-" + NewConvertRunId(); }

Status CheckOutputFree(Env* env, const std::string& path, bool force) {
  // The entry itself (a link, even a dangling one, counts as existing).
  if (env->GetEntryType(path).ok() && !force)
    return Status::AlreadyExists(path, "exists; remove it or pass --force to replace it");
  return Status::OK();
}

Status SyncParentDir(Env* env, const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  return env->SyncDir(dir);
}


// ---- HDF5 ---------------------------------------------------------------------------------------

// Whether `name` (a tensor's or a per-rank object's) is among those --select keeps: all when
// `prefixes` is empty, else the names starting with one of them.
bool Selected(const std::string& name, const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) return true;
  for (const std::string& p : prefixes)
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

Status WriteHdf5(TensorSource& source, Hdf5File& f, const std::vector<size_t>& selected, const ConvertOptions& o,
                 uint64_t slab_bytes, ConvertReport* report) {
  LL_RETURN_IF_ERROR(f.SetStringAttribute("/", "lifeline_format", "lifeline-hdf5/1"));
  if (source.step()) LL_RETURN_IF_ERROR(f.SetStringAttribute("/", "lifeline_step", std::to_string(*source.step())));
  if (source.saved_world_size() > 0)
    LL_RETURN_IF_ERROR(
        f.SetStringAttribute("/", "lifeline_saved_world_size", std::to_string(source.saved_world_size())));
  const std::string& meta = source.metadata_json();
  if (!meta.empty() && meta.find('\0') == std::string::npos) {
    LL_RETURN_IF_ERROR(f.SetStringAttribute("/", "lifeline_metadata", meta));
    const nlohmann::json j = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.key().empty() || it.key().rfind("lifeline_", 0) == 0 || it.key().find('\0') != std::string::npos)
          continue;
        const std::string value = it->is_string() ? it->get<std::string>() : it->dump();
        if (value.find('\0') == std::string::npos) LL_RETURN_IF_ERROR(f.SetStringAttribute("/", it.key(), value));
      }
    }
  }
  DatasetOptions dopt;
  dopt.deflate_level = o.deflate_level;
  std::vector<uint8_t> buf;
  for (size_t t : selected) {
    const SourceTensor& info = source.tensors()[t];
    const std::string ds = "tensors/" + Hdf5DatasetName(info.name);
    LL_RETURN_IF_ERROR(f.CreateDataset(ds, info.dtype, info.shape, dopt));
    LL_RETURN_IF_ERROR(f.SetStringAttribute(ds, "lifeline_name", info.name));
    const format::Region whole = WholeRegion(info);
    LL_RETURN_IF_ERROR(ForEachSlab(source, t, whole, slab_bytes, &buf, o,
                                   [&](int64_t at, const uint8_t* data, int64_t n) {
                                     return f.WriteRegion(ds, whole.offsets, whole.shape, at, at + n, data);
                                   }));
    report->tensors++;
    report->bytes += info.num_bytes();
  }
  for (size_t i = 0; i < source.objects().size(); ++i) {
    const SourceObject& obj = source.objects()[i];
    if (!Selected(obj.name, o.select)) continue;  // --select model. leaves the optimizer's objects out too
    LL_ASSIGN_OR_RETURN(std::string bytes, source.ReadObject(i));
    const std::string ds = "objects/rank" + std::to_string(obj.rank) + "/" + Hdf5DatasetName(obj.name);
    LL_RETURN_IF_ERROR(f.WriteBytes(ds, bytes));
    LL_RETURN_IF_ERROR(f.SetStringAttribute(ds, "lifeline_name", obj.name));
    report->objects++;
  }
  return Status::OK();
}

// ---- safetensors --------------------------------------------------------------------------------

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The "__metadata__" of the first shard (see tensor_source.h); other shards get "format" only.
Result<std::map<std::string, std::string>> SafetensorsMetadata(TensorSource& source,
                                                               const std::vector<std::string>& select) {
  std::map<std::string, std::string> md;
  const std::string& meta = source.metadata_json();
  bool copied = false;
  if (!meta.empty()) {
    const nlohmann::json j = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) {
      bool all_strings = true;
      for (auto it = j.begin(); it != j.end(); ++it)
        if (!it->is_string() || it.key().rfind("lifeline_", 0) == 0) all_strings = false;
      if (all_strings) {
        for (auto it = j.begin(); it != j.end(); ++it) md[it.key()] = it->get<std::string>();
        copied = true;
      }
    }
    if (!copied) md["lifeline_metadata"] = meta;
  }
  if (!md.count("format")) md["format"] = "pt";
  if (source.step()) md["lifeline_step"] = std::to_string(*source.step());
  for (size_t i = 0; i < source.objects().size(); ++i) {
    const SourceObject& obj = source.objects()[i];
    if (!Selected(obj.name, select)) continue;  // --select model. leaves the optimizer's objects out too
    LL_ASSIGN_OR_RETURN(std::string bytes, source.ReadObject(i));
    md[std::string(kObjectKeyPrefix) + std::to_string(obj.rank) + "." + obj.name] = Base64Encode(bytes);
  }
  return md;
}

struct PendingFile {
  std::string tmp;
  std::string final_path;
};

Status WriteSafetensorsFile(TensorSource& source, const std::vector<size_t>& tensors,
                            const std::map<std::string, std::string>& metadata, const PendingFile& file,
                            uint64_t slab_bytes, const ConvertOptions& o) {
  std::vector<format::SafetensorsEntry> entries;
  for (size_t t : tensors) {
    const SourceTensor& info = source.tensors()[t];
    entries.push_back(format::SafetensorsEntry{info.name, info.dtype, info.shape, 0, 0});
  }
  LL_ASSIGN_OR_RETURN(entries, format::LayOutSafetensors(std::move(entries)));
  LL_ASSIGN_OR_RETURN(std::string prefix, format::BuildSafetensorsPrefix(entries, metadata));
  LL_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, EnvOf(o)->NewWritableFile(file.tmp, FileOptions{}));
  auto body = [&]() -> Status {
    LL_RETURN_IF_ERROR(out->WriteAt(0, prefix.data(), prefix.size()));
    std::vector<uint8_t> buf;
    for (size_t k = 0; k < tensors.size(); ++k) {
      const SourceTensor& info = source.tensors()[tensors[k]];
      const uint64_t base = prefix.size() + entries[k].begin;
      const size_t elem = DTypeSize(info.dtype);
      LL_RETURN_IF_ERROR(ForEachSlab(source, tensors[k], WholeRegion(info), slab_bytes, &buf, o,
                                     [&](int64_t at, const uint8_t* data, int64_t n) {
                                       return out->WriteAt(base + static_cast<uint64_t>(at) * elem, data,
                                                           static_cast<uint64_t>(n) * elem);
                                     }));
    }
    return out->Sync();
  };
  Status s = body();
  Status c = out->Close();
  return s.ok() ? c : s;
}

// ---- lifeline -----------------------------------------------------------------------------------


bool IsSyntheticModel(const std::vector<SourceTensor>& tensors, const std::string& metadata_json,
                      std::vector<ModelTensor>* model) {
  Result<ModelShape> shape = ParseModelMetadata(metadata_json);
  if (!shape.ok() || ModelTensorCount(*shape) != tensors.size()) return false;
  std::vector<ModelTensor> stored;
  for (const SourceTensor& t : tensors) stored.push_back(ModelTensor{t.name, t.dtype, t.shape});
  if (!CheckModelTensors(*shape, stored).ok()) return false;
  *model = ModelTensors(*shape);
  return true;
}

}  // namespace

std::vector<size_t> SelectTensors(const TensorSource& source, const std::vector<std::string>& prefixes) {
  std::vector<size_t> out;
  for (size_t i = 0; i < source.tensors().size(); ++i)
    if (Selected(source.tensors()[i].name, prefixes)) out.push_back(i);
  return out;
}

std::vector<TensorShard> TargetShards(const std::vector<SourceTensor>& tensors, const std::string& metadata_json,
                                      const ParallelLayout& layout, uint32_t rank, bool* synthetic) {
  std::vector<ModelTensor> model;
  *synthetic = IsSyntheticModel(tensors, metadata_json, &model);
  if (*synthetic) {
    // The same order as the source, so the checkpoint lists its tensors as the source does.
    std::vector<TensorShard> shards = RankShards(model, layout, rank);
    std::map<std::string, size_t> order;
    for (size_t i = 0; i < tensors.size(); ++i) order[tensors[i].name] = i;
    std::stable_sort(shards.begin(), shards.end(),
                     [&](const TensorShard& a, const TensorShard& b) { return order[a.name] < order[b.name]; });
    return shards;
  }
  const uint32_t t_index = rank % layout.tp, d_index = rank / layout.tp;
  std::vector<TensorShard> shards;
  for (const SourceTensor& t : tensors) {
    if (!t.shape.empty() && layout.tp > 1 && t.shape[0] >= static_cast<int64_t>(layout.tp)) {
      const auto [begin, end] = EvenSplit(t.shape[0], layout.tp, t_index);
      std::vector<int64_t> offsets = Zeros(t.shape.size()), box = t.shape;
      offsets[0] = begin;
      box[0] = end - begin;
      shards.push_back(TensorShard::Box(t.name, t.dtype, t.shape, offsets, box, nullptr).Replica(d_index, layout.dp));
    } else {
      shards.push_back(TensorShard::Whole(t.name, t.dtype, t.shape, nullptr).Replica(rank, layout.world_size()));
    }
  }
  return shards;
}

Result<ConvertReport> ExportHdf5(TensorSource& source, const std::string& out, const ConvertOptions& o) {
  if (o.deflate_level < 0 || o.deflate_level > 9) return Status::InvalidArgument("--deflate must be 0 to 9");
  Env* env = EnvOf(o);
  if ((env != Env::Default() && env != Env::Routing()) || IsObjectStorePath(out))
    return Status::NotSupported(out, "HDF5 output needs the POSIX Env (libhdf5 writes its files itself)");
  LL_RETURN_IF_ERROR(CheckOutputFree(env, out, o.force));
  const std::vector<size_t> selected = SelectTensors(source, o.select);
  const std::string tmp = out + TempSuffix();
  ConvertReport report;
  Status s;
  {
    Result<Hdf5File> f = Hdf5File::Create(tmp);
    if (!f.ok()) return f.status();
    s = WriteHdf5(source, *f, selected, o, std::max(o.memory_budget, kMinBudget), &report);
    Status c = f->Close();
    if (s.ok()) s = c;
  }
  if (s.ok()) s = env->RenameFile(tmp, out);
  if (s.ok()) s = SyncParentDir(env, out);
  if (!s.ok()) {
    env->RemoveFile(tmp).IgnoreError();
    return s.Annotate("exporting " + source.description() + " to " + out);
  }
  report.outputs.push_back(out);
  return report;
}

Result<ConvertReport> ExportSafetensors(TensorSource& source, const std::string& out, const ConvertOptions& o) {
  const std::vector<size_t> selected = SelectTensors(source, o.select);
  std::vector<uint64_t> sizes;
  for (size_t t : selected) sizes.push_back(source.tensors()[t].num_bytes());
  const bool single_file = EndsWith(out, ".safetensors");
  std::vector<std::vector<size_t>> plan = format::PlanSafetensorsShards(sizes, single_file ? 0 : o.max_shard_bytes);
  if (single_file && o.max_shard_bytes > 0)
    return Status::InvalidArgument("--max-shard-size", "needs a directory as output, not the file " + out);
  Env* env = EnvOf(o);
  std::vector<PendingFile> files;
  if (single_file) {
    LL_RETURN_IF_ERROR(CheckOutputFree(env, out, o.force));
    files.push_back(PendingFile{out + TempSuffix(), out});
  } else {
    LL_RETURN_IF_ERROR(env->CreateDir(out));
    // Shards of an earlier export would mix with these: refuse, or with --force remove them.
    LL_ASSIGN_OR_RETURN(std::vector<std::string> children, env->GetChildren(out));
    for (const std::string& c : children) {
      if (!(EndsWith(c, ".safetensors") || c == format::kSafetensorsIndexFileName)) continue;
      if (!o.force)
        return Status::AlreadyExists(JoinPath(out, c), "exists; remove it or pass --force to replace the export");
      LL_RETURN_IF_ERROR(env->RemoveFile(JoinPath(out, c)));
    }
    for (size_t i = 0; i < plan.size(); ++i) {
      const std::string final_path = JoinPath(out, format::SafetensorsShardName(i, plan.size()));
      files.push_back(PendingFile{final_path + TempSuffix(), final_path});
    }
  }
  using Metadata = std::map<std::string, std::string>;
  LL_ASSIGN_OR_RETURN(Metadata first_metadata, SafetensorsMetadata(source, o.select));
  const std::map<std::string, std::string> other_metadata = {{"format", first_metadata["format"]}};
  const uint64_t slab = std::max(o.memory_budget, kMinBudget);
  ConvertReport report;
  // On failure every file of this export goes, the ones already renamed too: a directory holding
  // some shards and no index would read as a smaller model. (Shards of an earlier export were
  // refused or removed above, so the final names are this export's.)
  std::vector<std::string> renamed;
  auto cleanup = [&](Status s) {
    for (const PendingFile& f : files) env->RemoveFile(f.tmp).IgnoreError();
    for (auto f = renamed.rbegin(); f != renamed.rend(); ++f) env->RemoveFile(*f).IgnoreError();  // the index first
    return s.Annotate("exporting " + source.description() + " to " + out);
  };
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (size_t i = 0; i < plan.size(); ++i) {
    std::vector<size_t> tensors;
    for (size_t k : plan[i]) {
      tensors.push_back(selected[k]);
      const SourceTensor& info = source.tensors()[selected[k]];
      weight_map.emplace_back(info.name, format::SafetensorsShardName(i, plan.size()));
      report.tensors++;
      report.bytes += info.num_bytes();
    }
    Status s = WriteSafetensorsFile(source, tensors, i == 0 ? first_metadata : other_metadata, files[i], slab, o);
    if (!s.ok()) return cleanup(s);
  }
  for (const PendingFile& f : files) {
    Status s = env->RenameFile(f.tmp, f.final_path);
    if (!s.ok()) return cleanup(s);
    if (!single_file) renamed.push_back(f.final_path);
    report.outputs.push_back(f.final_path);
  }
  if (!single_file && plan.size() > 1) {
    Result<std::string> index = format::BuildSafetensorsIndex(report.bytes, weight_map, {});
    if (!index.ok()) return cleanup(index.status());
    const std::string path = JoinPath(out, std::string(format::kSafetensorsIndexFileName));
    Status s = WriteFileAtomically(env, path, *index);
    if (!s.ok()) return cleanup(s);
    renamed.push_back(path);
    report.outputs.push_back(path);
  }
  Status s = env->SyncDir(single_file ? (out.rfind('/') == std::string::npos ? "." : out.substr(0, std::max<size_t>(1, out.rfind('/'))))
                                      : out);
  if (!s.ok()) return cleanup(s);
  report.objects = source.objects().size();
  return report;
}

Result<ConvertReport> ExportLifeline(TensorSource& source, const std::string& out, const ParallelLayout& layout,
                                     const ConvertOptions& o) {
  const std::vector<size_t> selected = SelectTensors(source, o.select);
  std::vector<SourceTensor> tensors;
  std::unordered_map<std::string, size_t> source_index;
  for (size_t t : selected) {
    tensors.push_back(source.tensors()[t]);
    source_index[source.tensors()[t].name] = t;
  }
  Env* env = EnvOf(o);
  const uint32_t world = layout.world_size();
  const uint64_t step = o.step.value_or(source.step().value_or(0));
  const std::string run_id = NewConvertRunId();
  const std::string run_hash = RunHash(run_id);
  LL_RETURN_IF_ERROR(CreateDirDurably(env, out));

  RankWriteOptions w;
  w.step = step;
  w.world_size = world;
  w.run_id = run_id;
  w.run_hash = run_hash;
  w.direct_io = o.direct_io;
  w.memory_budget = std::max<uint64_t>(o.memory_budget / 4, 2 * kDirectIoAlignment);
  w.write_block_bytes = std::min<uint64_t>(8ull << 20, AlignUp(std::max<uint64_t>(w.memory_budget / 4, kDirectIoAlignment), kDirectIoAlignment));
  w.codec = internal::StoredCodec(o.codec);
  if (o.codec_level != 0) w.codec_level = o.codec_level;
  const uint64_t slab_bytes = std::max<uint64_t>(o.memory_budget / 2, kMinBudget);

  // Objects of saved ranks beyond the new world are folded into the ranks it has (rank_objects.h),
  // so a smaller world loses none of them and Load still finds them by their saving rank.
  std::vector<std::vector<std::pair<std::string, std::string>>> objects(world);
  for (size_t i = 0; i < source.objects().size(); ++i) {
    const SourceObject& obj = source.objects()[i];
    Result<RankedObjectName> stored = FoldObject(obj.rank, obj.name, world);
    if (!stored.ok()) return stored.status().Annotate("converting " + source.description());
    LL_ASSIGN_OR_RETURN(std::string bytes, source.ReadObject(i));
    objects[stored->rank].emplace_back(std::move(stored->name), std::move(bytes));
  }

  ConvertReport report;
  report.step = step;
  report.ranks = world;
  report.tp = layout.tp;
  report.dp = layout.dp;
  report.tensors = tensors.size();
  report.objects = source.objects().size();
  std::vector<uint8_t> slab;
  for (uint32_t r = 0; r < world; ++r) {
    bool synthetic = false;
    SaveRequest request;
    request.tensors = TargetShards(tensors, source.metadata_json(), layout, r, &synthetic);
    report.placement = synthetic ? "synthetic model" : "generic";
    LL_ASSIGN_OR_RETURN(RankSavePlan plan, PlanRankSave(request, CheckpointerOptions().replica_split_bytes,
                                                        /*require_data=*/false));
    LL_ASSIGN_OR_RETURN(CheckpointWriter writer, CheckpointWriter::Begin(env, StepTarget{{out, run_hash, r, world}, step}));
    // One slab of the fragment being written, refilled as the writer asks for chunks past it.
    const PlannedFragment* cached = nullptr;
    int64_t cache_begin = 0, cache_end = 0;
    FragmentReader reader = [&](const PlannedFragment& pf, uint64_t raw_offset, uint64_t n, uint8_t* dst) -> Status {
      const format::TensorInfo& t = plan.tensors[pf.tensor];
      const size_t elem = DTypeSize(t.dtype);
      const int64_t e0 = static_cast<int64_t>(raw_offset / elem), e1 = static_cast<int64_t>((raw_offset + n) / elem);
      if (cached != &pf || e0 < cache_begin || e1 > cache_end) {
        const int64_t total = pf.region.num_elements();
        const int64_t len = std::max<int64_t>(e1 - e0, std::min<int64_t>(total - e0, slab_bytes / elem));
        slab.resize(static_cast<size_t>(len) * elem);
        LL_RETURN_IF_ERROR(source.Read(source_index.at(t.name), ToTensorRegion(format::SubRegion(pf.region, e0, e0 + len)),
                                       slab.data())
                               .Annotate("reading tensor '" + t.name + "' of " + source.description()));
        if (o.progress) o.progress(t.name, static_cast<uint64_t>(len) * elem);
        cached = &pf;
        cache_begin = e0;
        cache_end = e0 + len;
      }
      std::memcpy(dst, slab.data() + static_cast<size_t>(e0 - cache_begin) * elem, n);
      return Status::OK();
    };
    w.rank = r;
    LL_ASSIGN_OR_RETURN(format::CheckpointIndex index,
                        writer.WriteData(plan, objects[r], r == 0 ? source.metadata_json() : std::string(), w, reader));
    for (const format::FragmentInfo& f : index.fragments)
      report.bytes += static_cast<uint64_t>(f.region.num_elements()) * DTypeSize(index.tensors[f.tensor].dtype);
    LL_ASSIGN_OR_RETURN(PublishedIndex published, writer.Publish(index, CommitOptions{/*retention=*/false, 0}));
    const bool committed = published.committed;
    if (r + 1 == world && !committed)
      return Status::Corruption(out, "step " + std::to_string(step) + " did not commit after its last rank index");
    if (r + 1 == world) report.outputs.push_back(writer.step_dir());
  }
  return report;
}

// ---- the public entry points (lifeline/convert.h) -----------------------------------------------

std::string_view ConvertFormatName(ConvertFormat format) {
  switch (format) {
    case ConvertFormat::kHdf5: return "hdf5";
    case ConvertFormat::kSafetensors: return "safetensors";
    case ConvertFormat::kLifeline: return "lifeline";
  }
  return "?";
}

Result<ConvertFormat> ParseConvertFormat(std::string_view name) {
  for (ConvertFormat f : {ConvertFormat::kHdf5, ConvertFormat::kSafetensors, ConvertFormat::kLifeline})
    if (ConvertFormatName(f) == name) return f;
  return Status::InvalidArgument("--to", "'" + std::string(name) + "' is not hdf5, safetensors or lifeline");
}

namespace {

Result<ConvertReport> ConvertSelected(TensorSource& source, ConvertFormat to, const std::string& out,
                                      const ConvertOptions& options) {
  switch (to) {
    case ConvertFormat::kHdf5: return ExportHdf5(source, out, options);
    case ConvertFormat::kSafetensors: return ExportSafetensors(source, out, options);
    case ConvertFormat::kLifeline: {
      const uint32_t ranks = options.ranks != 0 ? options.ranks : std::max<uint32_t>(1, source.saved_world_size());
      LL_ASSIGN_OR_RETURN(ParallelLayout layout, ResolveLayout(ranks, options.tp, options.dp));
      return ExportLifeline(source, out, layout, options);
    }
  }
  return Status::InvalidArgument("convert", "unknown output format");
}

}  // namespace

Result<ConvertReport> Convert(TensorSource& source, ConvertFormat to, const std::string& out,
                              const ConvertOptions& options) {
  LL_ASSIGN_OR_RETURN(std::vector<ExportTensor> plan, PlanExportTensors(source, options));
  std::vector<ExportTensor> renamed, cast;
  for (const ExportTensor& e : plan) {
    if (e.renamed()) renamed.push_back(e);
    if (e.cast()) cast.push_back(e);
  }
  if (renamed.empty() && cast.empty()) return ConvertSelected(source, to, out, options);
  // The exporters read the planned tensors through the mapping; the selection is made already.
  // A cast's piece in the source dtype is the only memory added: a quarter of the budget at most.
  const uint64_t scratch = std::min<uint64_t>(std::max(options.memory_budget, kMinBudget) / 4, 16ull << 20);
  MappedTensorSource mapped(source, std::move(plan), scratch);
  ConvertOptions o = options;
  o.select.clear();
  LL_ASSIGN_OR_RETURN(ConvertReport report, ConvertSelected(mapped, to, out, o));
  report.renamed = std::move(renamed);
  report.cast = std::move(cast);
  return report;
}

}  // namespace lifeline
