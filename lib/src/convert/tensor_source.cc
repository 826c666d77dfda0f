#include "lib/src/convert/tensor_source.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "formats/geometry.h"
#include "formats/safetensors.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/rank_objects.h"
#include "lifeline/env.h"
#include "lib/src/convert/hdf5_file.h"
#include "lib/src/convert/safetensors_file.h"

namespace lifeline {

int64_t SourceTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

uint64_t SourceTensor::num_bytes() const { return static_cast<uint64_t>(num_elements()) * DTypeSize(dtype); }

TensorRegion TensorRegion::Whole(const SourceTensor& tensor) {
  return TensorRegion{std::vector<int64_t>(tensor.shape.size(), 0), tensor.shape, 0, tensor.num_elements()};
}

format::Region ToFormatRegion(const TensorRegion& region) {
  return format::Region{region.offsets, region.shape, region.flat_begin, region.flat_end};
}

TensorRegion ToTensorRegion(const format::Region& region) {
  return TensorRegion{region.offsets, region.shape, region.flat_begin, region.flat_end};
}

Status TensorSource::Read(size_t tensor, const TensorRegion& region, void* dst) {
  LL_RETURN_IF_ERROR(ReadRegion(tensor, region, dst));
  const SourceTensor& t = tensors_.at(tensor);
  if (t.dtype != DType::kBool) return Status::OK();
  const auto* bytes = static_cast<const uint8_t*>(dst);
  const int64_t n = region.num_elements();
  for (int64_t k = 0; k < n; ++k) {
    if (bytes[k] <= 1) continue;
    // The element's coordinates in the tensor, from its row-major position in the region's box.
    std::vector<int64_t> coord(region.shape.size());
    int64_t rest = region.flat_begin + k, global = 0;
    for (size_t d = coord.size(); d-- > 0;) {
      coord[d] = region.offsets[d] + (region.shape[d] > 0 ? rest % region.shape[d] : 0);
      rest = region.shape[d] > 0 ? rest / region.shape[d] : 0;
    }
    std::string where;
    for (size_t d = 0; d < coord.size(); ++d) {
      global = global * t.shape[d] + coord[d];
      where += (d == 0 ? "" : ", ") + std::to_string(coord[d]);
    }
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02x", bytes[k]);
    return Status::Corruption(description_, "bool tensor '" + t.name + "' holds byte " + hex + " at element " +
                                                std::to_string(global) + " [" + where + "] (byte offset " +
                                                std::to_string(global) + " of its data); a bool must be 0 or 1");
  }
  return Status::OK();
}

std::string_view SourceKindName(SourceKind kind) {
  switch (kind) {
    case SourceKind::kCheckpoint: return "lifeline";
    case SourceKind::kHdf5: return "hdf5";
    case SourceKind::kSafetensors: return "safetensors";
  }
  return "?";
}

// ---- names and base64 ---------------------------------------------------------------------------

std::string Hdf5DatasetName(std::string_view name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '/') {
      out += "%2F";
    } else if (c == '%') {
      out += "%25";
    } else if (c == '.' && i == 0) {
      out += "%2E";  // "." and ".." are not dataset names
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string Hdf5NameFromDataset(std::string_view dataset_name) {
  std::string out;
  for (size_t i = 0; i < dataset_name.size(); ++i) {
    if (dataset_name[i] == '%' && i + 2 < dataset_name.size() + 0 && i + 2 <= dataset_name.size() - 1) {
      const std::string_view code = dataset_name.substr(i + 1, 2);
      if (code == "2F") { out.push_back('/'); i += 2; continue; }
      if (code == "25") { out.push_back('%'); i += 2; continue; }
      if (code == "2E") { out.push_back('.'); i += 2; continue; }
    }
    out.push_back(dataset_name[i]);
  }
  return out;
}

namespace {

// Files the user named (a safetensors or HDF5 input, or the files of a directory the user named)
// may be links; files inside a checkpoint never are followed (the Env's default).
FileOptions UserInput() {
  FileOptions o;
  o.follow_symlinks = true;
  return o;
}

}  // namespace

Result<std::unique_ptr<RandomAccessFile>> OpenUserFile(Env* env, const std::string& path) {
  // Refused before the open: opening a FIFO for reading would block.
  LL_ASSIGN_OR_RETURN(const EntryType type, env->GetEntryType(path));
  if (type == EntryType::kDirectory || type == EntryType::kOther ||
      (type == EntryType::kSymlink && env->IsDirectory(path)))
    return Status::InvalidArgument(path, "not a regular file");
  if (type == EntryType::kSymlink) {
    // What the link points to is not known without opening it (GetEntryType does not follow
    // links). A FIFO or a device has size 0: such a target, like an empty file, holds no format
    // and is refused unopened.
    LL_ASSIGN_OR_RETURN(const uint64_t size, env->GetFileSize(path));
    if (size == 0) return Status::InvalidArgument(path, "links to an empty file or to one that is not a regular file");
  }
  return env->NewRandomAccessFile(path, UserInput());
}

namespace {

Status ValidateName(std::string_view name, const std::string& what) {
  if (name.empty() || name.size() > format::kMaxNameBytes || name.find('\0') != std::string_view::npos)
    return Status::Corruption(what, "name must be 1 to 4096 bytes without NUL");
  return Status::OK();
}

// ---- a Lifeline checkpoint ------------------------------------------------------------------------

class CheckpointSource final : public TensorSource {
 public:
  CheckpointSource() : TensorSource(SourceKind::kCheckpoint) {}

  static Result<std::unique_ptr<TensorSource>> Open(Env* env, const std::string& dir, const SourceOptions& options) {
    ReaderOptions ro;
    ro.memory_budget = std::max<uint64_t>(options.memory_budget, 16ull << 20);
    LL_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(env, dir, options.step, ro));
    auto src = std::make_unique<CheckpointSource>();
    const format::CheckpointIndex& m = reader->manifest();
    src->description_ = "checkpoint " + dir + " step " + std::to_string(m.step);
    for (const format::TensorInfo& t : m.tensors) src->tensors_.push_back(SourceTensor{t.name, t.dtype, t.shape});
    for (const format::ObjectInfo& o : m.objects) {
      RankedObjectName saved = SavedObjectOf(o, m.world_size);
      src->objects_.push_back(SourceObject{saved.rank, std::move(saved.name)});
    }
    src->metadata_json_ = m.metadata_json;
    src->step_ = m.step;
    src->saved_world_size_ = m.world_size;
    src->reader_ = std::move(reader);
    return std::unique_ptr<TensorSource>(std::move(src));
  }

  Status ReadRegion(size_t tensor, const TensorRegion& region, void* dst) override {
    const SourceTensor& t = tensors_.at(tensor);
    TensorShard target = TensorShard::BoxFlat(t.name, t.dtype, t.shape, region.offsets, region.shape,
                                              region.flat_begin, region.flat_end, dst);
    if (target.num_elements() == 0) return Status::OK();
    Result<LoadStats> r = reader_->Load({target});
    return r.ok() ? Status::OK() : r.status();
  }

  Result<std::string> ReadObject(size_t object) override {
    return reader_->ReadObject(reader_->manifest().objects.at(object));
  }

 private:
  std::unique_ptr<CheckpointReader> reader_;
};

// ---- HDF5 ---------------------------------------------------------------------------------------

class Hdf5Source final : public TensorSource {
 public:
  static Result<std::unique_ptr<TensorSource>> Open(Env* env, const std::string& path) {
    if ((env != Env::Default() && env != Env::Routing()) || IsObjectStorePath(path))
      return Status::NotSupported(path, "HDF5 input needs the POSIX Env (libhdf5 reads its files itself)");
    LL_ASSIGN_OR_RETURN(Hdf5File file, Hdf5File::OpenReadOnly(path));
    auto src = std::make_unique<Hdf5Source>(std::move(file));
    LL_RETURN_IF_ERROR(src->Scan());
    return std::unique_ptr<TensorSource>(std::move(src));
  }

  explicit Hdf5Source(Hdf5File file) : TensorSource(SourceKind::kHdf5), file_(std::move(file)) {}

  Status ReadRegion(size_t tensor, const TensorRegion& region, void* dst) override {
    if (region.num_elements() == 0) return Status::OK();
    return file_.ReadRegion(datasets_.at(tensor), region.offsets, region.shape, region.flat_begin, region.flat_end, dst);
  }

  Result<std::string> ReadObject(size_t object) override { return file_.ReadBytes(object_datasets_.at(object)); }

 private:
  Status Scan() {
    const std::string& path = file_.path();
    description_ = "HDF5 file " + path;
    LL_ASSIGN_OR_RETURN(std::optional<std::string> format_attr, file_.GetStringAttribute("/", "lifeline_format"));
    const bool ours = format_attr.has_value();
    if (ours && *format_attr != "lifeline-hdf5/1")
      return Status::NotSupported(path, "lifeline_format '" + *format_attr + "' (this tool reads lifeline-hdf5/1)");
    std::set<std::string> names;
    auto add_name = [&](const std::string& name, const std::string& dataset) -> Status {
      LL_RETURN_IF_ERROR(ValidateName(name, path + ", dataset '" + dataset + "'"));
      if (!names.insert(name).second)
        return Status::Corruption(path, "two datasets hold tensor '" + name + "' (second: '" + dataset + "')");
      return Status::OK();
    };
    if (ours) {
      LL_ASSIGN_OR_RETURN(std::optional<std::string> step, file_.GetStringAttribute("/", "lifeline_step"));
      if (step.has_value()) {
        errno = 0;
        char* end = nullptr;
        const unsigned long long v = std::strtoull(step->c_str(), &end, 10);
        if (step->empty() || *end != '\0' || errno != 0 || (*step)[0] == '-')
          return Status::Corruption(path, "attribute lifeline_step '" + *step + "' is not a step number");
        step_ = v;
      }
      LL_ASSIGN_OR_RETURN(std::optional<std::string> world, file_.GetStringAttribute("/", "lifeline_saved_world_size"));
      if (world.has_value()) saved_world_size_ = static_cast<uint32_t>(std::strtoul(world->c_str(), nullptr, 10));
      LL_ASSIGN_OR_RETURN(std::optional<std::string> meta, file_.GetStringAttribute("/", "lifeline_metadata"));
      if (meta.has_value()) metadata_json_ = *meta;
    }
    Result<std::vector<std::string>> listed = file_.ListDatasets(ours ? "tensors" : "/");
    if (!listed.ok() && !(ours && listed.status().IsNotFound())) return listed.status();
    const std::vector<std::string> datasets = listed.ok() ? *listed : std::vector<std::string>{};
    for (const std::string& ds : datasets) {
      LL_ASSIGN_OR_RETURN(DatasetInfo info, file_.Describe(ds));
      std::string name;
      if (ours) {
        LL_ASSIGN_OR_RETURN(std::optional<std::string> attr, file_.GetStringAttribute(ds, "lifeline_name"));
        name = attr.has_value() ? *attr : Hdf5NameFromDataset(ds.substr(std::string("tensors/").size()));
      } else {
        name = ds;
      }
      LL_RETURN_IF_ERROR(add_name(name, ds));
      tensors_.push_back(SourceTensor{name, info.dtype, info.shape});
      datasets_.push_back(ds);
    }
    if (ours) {
      Result<std::vector<std::string>> objs = file_.ListDatasets("objects");
      if (!objs.ok() && !objs.status().IsNotFound()) return objs.status();
      if (objs.ok()) {
        std::set<std::pair<uint32_t, std::string>> seen;
        for (const std::string& ds : *objs) {
          // objects/rank<R>/<name>
          const std::string rest = ds.substr(std::string("objects/").size());
          const size_t slash = rest.find('/');
          uint32_t rank = 0;
          if (slash == std::string::npos || rest.compare(0, 4, "rank") != 0 || slash == 4 || slash > 11 ||
              rest.find_first_not_of("0123456789", 4) != slash)
            return Status::Corruption(path, "dataset '" + ds + "' is not objects/rank<R>/<name>");
          rank = static_cast<uint32_t>(std::strtoul(rest.substr(4, slash - 4).c_str(), nullptr, 10));
          if (rank >= format::kMaxWorldSize) return Status::Corruption(path, "dataset '" + ds + "': rank out of range");
          LL_ASSIGN_OR_RETURN(std::optional<std::string> attr, file_.GetStringAttribute(ds, "lifeline_name"));
          std::string name = attr.has_value() ? *attr : Hdf5NameFromDataset(rest.substr(slash + 1));
          LL_RETURN_IF_ERROR(ValidateName(name, path + ", dataset '" + ds + "'"));
          if (!seen.insert({rank, name}).second)
            return Status::Corruption(path, "object '" + name + "' of rank " + std::to_string(rank) + " twice");
          objects_.push_back(SourceObject{rank, name});
          object_datasets_.push_back(ds);
        }
      }
    }
    return Status::OK();
  }

  Hdf5File file_;
  std::vector<std::string> datasets_;
  std::vector<std::string> object_datasets_;
};

// ---- safetensors --------------------------------------------------------------------------------

class SafetensorsSource final : public TensorSource {
 public:
  SafetensorsSource() : TensorSource(SourceKind::kSafetensors) {}

  // `files`: the shard files in order; `expected`: tensor -> file from an index (empty: none).
  static Result<std::unique_ptr<TensorSource>> Open(Env* env, const std::string& what,
                                                    const std::vector<std::string>& files,
                                                    const std::map<std::string, std::string>& expected) {
    auto src = std::make_unique<SafetensorsSource>();
    src->description_ = "safetensors " + what;
    std::map<std::string, std::string> file_of;
    std::map<std::string, std::string> metadata;
    for (const std::string& path : files) {
      // Opened once: the header is read through the same file the tensors are read from.
      LL_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, OpenUserFile(env, path));
      LL_ASSIGN_OR_RETURN(format::SafetensorsHeader header, ReadSafetensorsHeader(*file));
      src->files_.push_back(std::move(file));
      const size_t file_index = src->files_.size() - 1;
      if (metadata.empty()) metadata = header.metadata;
      for (const format::SafetensorsEntry& e : header.tensors) {
        if (!file_of.emplace(e.name, path).second)
          return Status::Corruption(path, "tensor '" + e.name + "' is also in " + file_of[e.name]);
        if (!expected.empty()) {
          auto it = expected.find(e.name);
          if (it == expected.end() || path.size() < it->second.size() ||
              path.compare(path.size() - it->second.size(), it->second.size(), it->second) != 0)
            return Status::Corruption(path, "tensor '" + e.name + "' is not listed in the index for this file");
        }
        src->tensors_.push_back(SourceTensor{e.name, e.dtype, e.shape});
        src->where_.push_back(Where{file_index, header.data_offset + e.begin});
      }
    }
    for (const auto& [name, file] : expected)
      if (!file_of.count(name)) return Status::Corruption(what, "the index lists tensor '" + name + "' in " + file + ", which does not hold it");
    LL_RETURN_IF_ERROR(src->ApplyMetadata(metadata));
    return std::unique_ptr<TensorSource>(std::move(src));
  }

  Status ReadRegion(size_t tensor, const TensorRegion& tensor_region, void* dst) override {
    const SourceTensor& t = tensors_.at(tensor);
    const format::Region region = ToFormatRegion(tensor_region);
    LL_RETURN_IF_ERROR(format::ValidateRegion(region, t.shape, "tensor '" + t.name + "'", /*untrusted=*/false));
    if (region.num_elements() == 0) return Status::OK();
    const Where& w = where_.at(tensor);
    const size_t elem = DTypeSize(t.dtype);
    std::vector<format::Box> boxes;
    format::DecomposeRegion(region, &boxes);
    // Each box is a run of whole rows of its innermost extent; read row runs contiguous in the file.
    auto* out = static_cast<uint8_t*>(dst);
    const size_t nd = t.shape.size();
    std::vector<int64_t> stride(nd, 1);
    for (size_t k = nd; k-- > 1;) stride[k - 1] = stride[k] * t.shape[k];
    for (const format::Box& b : boxes) {
      // Iterate over all coordinates of the box's leading dimensions; the last is one contiguous run.
      if (nd == 0) {
        LL_RETURN_IF_ERROR(files_[w.file]->ReadAt(w.offset, out, elem));
        out += elem;
        continue;
      }
      int64_t rows = 1;
      for (size_t k = 0; k + 1 < nd; ++k) rows *= b.extent[k];
      const uint64_t run = static_cast<uint64_t>(b.extent[nd - 1]) * elem;
      std::vector<int64_t> c(nd, 0);
      for (int64_t r = 0; r < rows; ++r) {
        int64_t flat = 0;
        for (size_t k = 0; k < nd; ++k) flat += (b.lo[k] + c[k]) * stride[k];
        LL_RETURN_IF_ERROR(files_[w.file]->ReadAt(w.offset + static_cast<uint64_t>(flat) * elem, out, run));
        out += run;
        for (size_t k = nd - 1; k-- > 0;) {
          if (++c[k] < b.extent[k]) break;
          c[k] = 0;
        }
      }
    }
    return Status::OK();
  }

  Result<std::string> ReadObject(size_t object) override { return object_bytes_.at(object); }

 private:
  struct Where {
    size_t file;
    uint64_t offset;  // absolute offset of the tensor's first byte
  };

  Status ApplyMetadata(const std::map<std::string, std::string>& metadata) {
    nlohmann::ordered_json user = nlohmann::ordered_json::object();
    bool has_lifeline_metadata = false;
    for (const auto& [key, value] : metadata) {
      if (key == "lifeline_metadata") {
        metadata_json_ = value;
        has_lifeline_metadata = true;
      } else if (key == "lifeline_step") {
        char* end = nullptr;
        errno = 0;
        const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno != 0 || value[0] == '-')
          return Status::Corruption(description_, "lifeline_step '" + value + "' is not a step number");
        step_ = v;
      } else if (key == "lifeline_saved_world_size") {
        saved_world_size_ = static_cast<uint32_t>(std::strtoul(value.c_str(), nullptr, 10));
      } else if (key.rfind(kObjectKeyPrefix, 0) == 0) {
        // lifeline_object.<rank>.<name>
        const std::string rest = key.substr(std::strlen(kObjectKeyPrefix));
        const size_t dot = rest.find('.');
        if (dot == std::string::npos || dot == 0 || dot > 7 || rest.find_first_not_of("0123456789") != dot)
          return Status::Corruption(description_, "metadata key '" + key + "' is not lifeline_object.<rank>.<name>");
        const uint32_t rank = static_cast<uint32_t>(std::strtoul(rest.substr(0, dot).c_str(), nullptr, 10));
        const std::string name = rest.substr(dot + 1);
        LL_RETURN_IF_ERROR(ValidateName(name, description_ + ", metadata key '" + key + "'"));
        Result<std::string> bytes = Base64Decode(value);
        if (!bytes.ok()) return bytes.status().Annotate(description_ + ", metadata key '" + key + "'");
        objects_.push_back(SourceObject{rank, name});
        object_bytes_.push_back(std::move(bytes).value());
      } else {
        user[key] = value;
      }
    }
    if (!has_lifeline_metadata && !user.empty()) metadata_json_ = user.dump();
    return Status::OK();
  }

  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  std::vector<Where> where_;
  std::vector<std::string> object_bytes_;
};

bool HasHdf5Signature(Env* env, const std::string& path) {
  // The superblock may follow a user block of 512, 1024, 2048... bytes.
  static const unsigned char kSig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  Result<std::unique_ptr<RandomAccessFile>> file = OpenUserFile(env, path);
  if (!file.ok()) return false;
  const Result<uint64_t> size = (*file)->Size();
  unsigned char buf[8];
  for (uint64_t at = 0; size.ok() && at + 8 <= *size && at <= (1ull << 20); at = at == 0 ? 512 : at * 2) {
    if (!(*file)->ReadAt(at, buf, 8).ok()) return false;
    if (std::memcmp(buf, kSig, 8) == 0) return true;
  }
  return false;
}

}  // namespace

Result<std::unique_ptr<TensorSource>> OpenTensorSource(const std::string& path, const SourceOptions& options) {
  Env* env = Env::OrDefault(options.env);
  LL_ASSIGN_OR_RETURN(const EntryType type, env->GetEntryType(path));
  // A link the user names is followed (IsDirectory follows it).
  if (env->IsDirectory(path)) {
    LL_ASSIGN_OR_RETURN(std::vector<std::string> children, env->GetChildren(path));
    std::sort(children.begin(), children.end());
    bool has_steps = false;
    std::vector<std::string> shards;
    bool has_index = false;
    for (const std::string& c : children) {
      if (ParseStepDirName(c)) has_steps = true;
      if (c == format::kSafetensorsIndexFileName) has_index = true;
      if (c.size() > 12 && c.compare(c.size() - 12, 12, ".safetensors") == 0 && !IsTempFileName(c))
        shards.push_back(JoinPath(path, c));
    }
    if (has_steps && (has_index || !shards.empty()))
      return Status::InvalidArgument(path, "holds both checkpoint steps and safetensors files; name one of them");
    if (has_steps) return CheckpointSource::Open(env, path, options);
    if (has_index) {
      const std::string index_path = JoinPath(path, std::string(format::kSafetensorsIndexFileName));
      LL_ASSIGN_OR_RETURN(std::string text, ReadFileToString(env, index_path, 256ull << 20, UserInput()));
      LL_ASSIGN_OR_RETURN(format::SafetensorsIndex index, format::ParseSafetensorsIndex(text, index_path));
      std::vector<std::string> files;
      for (const std::string& f : index.files) files.push_back(JoinPath(path, f));
      std::map<std::string, std::string> expected(index.weight_map.begin(), index.weight_map.end());
      return SafetensorsSource::Open(env, path, files, expected);
    }
    if (!shards.empty()) return SafetensorsSource::Open(env, path, shards, {});
    if (env->FileExists(JoinPath(path, "lifeline.id")))
      return Status::NotFound(path, "no checkpoint step in this checkpoint directory");
    return Status::InvalidArgument(path, "is neither a Lifeline checkpoint directory (step-* directories) nor a "
                                         "directory of .safetensors files");
  }
  if (type == EntryType::kOther) return Status::InvalidArgument(path, "is not a regular file or a directory");
  if (HasHdf5Signature(env, path)) return Hdf5Source::Open(env, path);
  Result<std::unique_ptr<TensorSource>> st_source = SafetensorsSource::Open(env, path, {path}, {});
  if (st_source.ok()) return st_source;
  const bool named_safetensors = path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
  if (named_safetensors) return st_source.status();
  return Status::InvalidArgument(path, "is neither an HDF5 file nor a safetensors file (" +
                                           st_source.status().ToString() + ")");
}

}  // namespace lifeline
