// lifeline._lifeline: the Python extension under the `lifeline` package.
//
// A thin layer over the C++ API. It knows nothing about torch: the Python side (lifeline/_state.py)
// walks the state, and hands this module plain descriptions of memory (a dtype name, shapes, and
// the address of the tensor's first element). The tensors themselves are never copied or pickled
// here: the Checkpointer reads them in place, in the background, which is why every ticket keeps a
// reference to the Python objects that own that memory until its snapshot is complete.
//
// Every call that may block (Save under the "wait" policy, every Wait*, Load, Flush, close)
// releases the GIL, so other Python threads (a data loader, a heartbeat) keep running.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/convert.h"
#include "lifeline/dtype.h"
#include "lifeline/env.h"
#include "lifeline/status.h"
#include "lifeline/trace.h"

namespace py = pybind11;

namespace lifeline::python {
namespace {

// lifeline.Error, created at import. Carries `code` ("IOError", "NotFound", ...) besides the message.
PyObject* g_error = nullptr;

[[noreturn]] void Raise(const Status& s) {
  py::object err = py::reinterpret_borrow<py::object>(g_error)(py::str(s.ToString()));
  err.attr("code") = py::str(StatusCodeName(s.code()));
  PyErr_SetObject(g_error, err.ptr());
  throw py::error_already_set();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

// Runs `call` (which returns a Status) with the GIL released, so other Python threads run while
// the library waits or does I/O.
template <typename F>
Status WithoutGil(F&& call) {
  py::gil_scoped_release release;
  return call();
}

// One tensor as the Python side describes it:
// (name, dtype, global_shape, offsets, shape, flat_begin, flat_end, replica_index, replica_count, address,
//  device (-1: host memory), producer stream (a cudaStream_t as an integer; 0: the default stream))
using TensorSpec = std::tuple<std::string, std::string, std::vector<int64_t>, std::vector<int64_t>,
                              std::vector<int64_t>, int64_t, int64_t, uint32_t, uint32_t, uintptr_t, int, uintptr_t>;

std::vector<TensorShard> ToShards(const std::vector<TensorSpec>& specs) {
  std::vector<TensorShard> out;
  out.reserve(specs.size());
  for (const TensorSpec& s : specs) {
    const std::string& dtype_name = std::get<1>(s);
    std::optional<DType> dtype = ParseDType(dtype_name);
    if (!dtype) {
      throw py::value_error("tensor " + std::get<0>(s) + ": dtype " + dtype_name + " is not one Lifeline stores");
    }
    TensorShard t;
    t.name = std::get<0>(s);
    t.dtype = *dtype;
    t.global_shape = std::get<2>(s);
    t.offsets = std::get<3>(s);
    t.shape = std::get<4>(s);
    t.flat_begin = std::get<5>(s);
    t.flat_end = std::get<6>(s);
    t.replica_index = std::get<7>(s);
    t.replica_count = std::get<8>(s);
    t.data = reinterpret_cast<void*>(std::get<9>(s));
    t.device = std::get<10>(s);
    t.stream = reinterpret_cast<void*>(std::get<11>(s));
    out.push_back(std::move(t));
  }
  return out;
}

SaveRequest ToSaveRequest(const std::vector<TensorSpec>& specs,
                          const std::vector<std::pair<std::string, py::bytes>>& objects,
                          const std::string& metadata_json) {
  SaveRequest req;
  req.tensors = ToShards(specs);
  for (const auto& [name, value] : objects) req.objects.emplace_back(name, std::string(value));
  req.metadata_json = metadata_json;
  return req;
}

py::dict ProgressDict(const SaveProgress& p) {
  py::dict d;
  d["step"] = p.step;
  d["phase"] = SavePhaseName(p.phase);
  d["error"] = p.status.ok() ? py::object(py::none()) : py::object(py::str(p.status.ToString()));
  d["bytes_total"] = p.bytes_total;
  d["bytes_copied"] = p.bytes_copied;
  d["bytes_stored"] = p.bytes_stored;
  d["stall_seconds"] = p.stall_seconds;
  const SaveStallBreakdown& b = p.stall_breakdown;
  py::dict parts;
  parts["plan"] = b.plan_seconds;
  parts["slot"] = b.slot_seconds;
  parts["stage"] = b.stage_seconds;
  parts["submit"] = b.submit_seconds;
  parts["wait"] = b.wait_seconds;
  d["stall_breakdown_seconds"] = parts;
  d["snapshot_seconds"] = p.snapshot_seconds;
  d["persist_seconds"] = p.persist_seconds;
  d["staged"] = p.staged;
  d["memory_tier"] = p.memory_tier;
  d["memory_tier_note"] = p.memory_tier_note.empty() ? py::object(py::none()) : py::object(py::str(p.memory_tier_note));
  return d;
}

py::dict InfoDict(const CheckpointInfo& i) {
  py::dict d;
  d["step"] = i.step;
  d["complete"] = i.complete;
  d["world_size"] = i.world_size;
  d["ranks_present"] = i.ranks_present;
  d["bytes"] = i.bytes;
  d["created_unix_ns"] = i.created_unix_ns;
  d["directory"] = i.directory;
  d["problem"] = i.problem;
  return d;
}

// A save in flight. Holds the Python objects whose memory the save reads until its snapshot is
// complete; after that they are let go, so the caller's tensors are not kept alive by old tickets.
class Ticket {
 public:
  Ticket(SaveTicket ticket, py::object keepalive) : ticket_(std::move(ticket)), keepalive_(std::move(keepalive)) {}

  uint64_t step() const { return ticket_.step(); }

  void WaitSnapshot() {
    Status s;
    {
      py::gil_scoped_release release;
      s = ticket_.WaitSnapshot();
    }
    // Copied, failed or skipped: in every case the library no longer reads the tensors.
    keepalive_ = py::none();
    Check(s);
  }
  void WaitTensor(size_t i) {
    Check(WithoutGil([&] { return ticket_.WaitTensor(i); }));
  }
  bool TensorCopied(size_t i) const { return ticket_.TensorCopied(i); }
  // Orders CUDA stream `stream` after this save's device copies; the CPU does not wait.
  void FenceOn(uintptr_t stream) { Check(ticket_.FenceOn(reinterpret_cast<void*>(stream))); }
  void WaitPersisted() {
    WaitSnapshot();
    Check(WithoutGil([&] { return ticket_.WaitPersisted(); }));
  }
  void WaitCommitted(double timeout_seconds) {
    WaitPersisted();
    Check(WithoutGil([&] { return ticket_.WaitCommitted(timeout_seconds); }));
  }
  py::dict Progress() const { return ProgressDict(ticket_.Progress()); }
  // True once the library no longer reads the caller's memory (releases it then, without blocking).
  bool SnapshotDone() {
    const SavePhase phase = ticket_.Progress().phase;
    const bool done = phase != SavePhase::kCopying;
    if (done) keepalive_ = py::none();
    return done;
  }

 private:
  SaveTicket ticket_;
  py::object keepalive_;
};

// The `codec=` option: None or a codec name (ParseSaveCodec).
SaveCodec CodecOption(const py::handle& v) {
  const std::string name = v.is_none() ? "" : py::cast<std::string>(v);
  Result<SaveCodec> codec = ParseSaveCodec(name);
  if (!codec.ok()) throw py::value_error("codec=" + name + ": expected None, 'zstd' or 'zstd-bytegroup'");
  return *codec;
}

// Reads the keyword options of lifeline.Checkpointer(...) into CheckpointerOptions; an unknown
// name or a value of the wrong type is a TypeError/ValueError naming the option.
CheckpointerOptions ParseOptions(const std::string& directory, uint32_t rank, uint32_t world_size,
                                 const py::dict& kwargs, bool* fault_injection) {
  CheckpointerOptions o;
  o.directory = directory;
  o.rank = rank;
  o.world_size = world_size;
  *fault_injection = false;
  for (const auto& item : kwargs) {
    const std::string key = py::cast<std::string>(item.first);
    py::handle v = item.second;
    try {
      if (key == "run_id") o.run_id = py::cast<std::string>(v);
      else if (key == "resume_step") o.resume_step = py::isinstance<py::str>(v) ? py::cast<std::string>(v) : std::to_string(py::cast<uint64_t>(v));
      else if (key == "keep_last") o.keep_last = py::cast<uint32_t>(v);
      else if (key == "chunk_bytes") o.chunk_bytes = py::cast<uint64_t>(v);
      else if (key == "write_block_bytes") o.write_block_bytes = py::cast<uint64_t>(v);
      else if (key == "save_memory_budget") o.save_memory_budget = py::cast<uint64_t>(v);
      else if (key == "load_memory_budget") o.load_memory_budget = py::cast<uint64_t>(v);
      else if (key == "queue_depth") o.queue_depth = py::cast<unsigned>(v);
      else if (key == "direct_io") o.direct_io = py::cast<bool>(v);
      else if (key == "replica_split_bytes") o.replica_split_bytes = py::cast<uint64_t>(v);
      else if (key == "column_blocks") o.column_blocks = py::cast<bool>(v);
      else if (key == "staging_budget_bytes") o.staging_budget_bytes = py::cast<uint64_t>(v);
      else if (key == "staging_slots") o.staging_slots = py::cast<unsigned>(v);
      else if (key == "copy_threads") o.copy_threads = py::cast<unsigned>(v);
      else if (key == "background_nice") o.background_nice = py::cast<int>(v);
      else if (key == "memory_tier") o.memory_tier = py::cast<bool>(v);
      else if (key == "memory_tier_directory") o.memory_tier_directory = py::cast<std::string>(v);
      else if (key == "memory_tier_cleanup_on_close") o.memory_tier_cleanup_on_close = py::cast<bool>(v);
      else if (key == "load_only") o.load_only = py::cast<bool>(v);
      else if (key == "codec_level") o.codec_level = py::cast<int>(v);
      else if (key == "register_buffers") o.register_buffers = py::cast<bool>(v);
      else if (key == "drain_directory") o.drain_directory = py::cast<std::string>(v);
      else if (key == "drain_keep_last") o.drain_keep_last = py::cast<uint32_t>(v);
      else if (key == "fault_injection") *fault_injection = py::cast<bool>(v);
      else if (key == "codec") o.codec = CodecOption(v);
      else if (key == "busy_policy") {
        const std::string name = py::cast<std::string>(v);
        if (name == "wait") o.busy_policy = BusyPolicy::kWait;
        else if (name == "skip") o.busy_policy = BusyPolicy::kSkip;
        else throw py::value_error("busy_policy=" + name + ": expected 'wait' or 'skip'");
      } else {
        throw py::type_error("Checkpointer() got an unknown option '" + key + "'");
      }
    } catch (const py::cast_error&) {
      throw py::type_error("Checkpointer() option '" + key + "' has the wrong type (" +
                           py::cast<std::string>(py::str(py::type::of(v).attr("__name__"))) + ")");
    }
  }
  return o;
}

// The `rename=` option: "PATTERN=REPLACEMENT", or a list of those or of (pattern, replacement)
// pairs, in order (ParseRenameRule). A string that does not parse is a ValueError quoting it; a
// pair's bad pattern is convert()'s InvalidArgument.
std::vector<RenameRule> RenameOption(const py::handle& v) {
  std::vector<py::handle> items;
  if (py::isinstance<py::str>(v)) items.push_back(v);
  else for (py::handle item : py::iter(v)) items.push_back(item);
  std::vector<RenameRule> rules;
  for (py::handle item : items) {
    if (py::isinstance<py::str>(item)) {
      Result<RenameRule> rule = ParseRenameRule(py::cast<std::string>(item));
      if (!rule.ok()) throw py::value_error("rename=: " + rule.status().message());
      rules.push_back(std::move(rule).value());
    } else {
      // Taken as given (the pattern may hold '='); convert() checks it with the others.
      auto [pattern, replacement] = py::cast<std::pair<std::string, std::string>>(item);
      rules.push_back(RenameRule{pattern, replacement});
    }
  }
  return rules;
}

// The `dtype=` option: a dtype name ("bf16", "bfloat16") or a torch dtype (torch.bfloat16).
DType DTypeOption(const py::handle& v) {
  std::string name = py::cast<std::string>(py::str(v));
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  std::optional<DType> t = ParseDType(name);
  if (!t) throw py::value_error("dtype=" + name + ": expected 'bf16', 'f16', 'f32' or 'f64' (or a torch dtype)");
  return *t;
}

// lifeline.convert(): the keyword options of lifeline/convert.h's ConvertOptions and SourceOptions,
// as the CLI names them. An unknown name is a TypeError, a bad value a ValueError naming it.
// rename_file's rules follow rename's, as the CLI orders --rename and --rename-file.
void ParseConvertOptions(const py::dict& kwargs, SourceOptions* so, ConvertOptions* co) {
  std::vector<RenameRule> file_rules;
  for (const auto& item : kwargs) {
    const std::string key = py::cast<std::string>(item.first);
    py::handle v = item.second;
    try {
      if (v.is_none()) continue;  // None leaves the default
      if (key == "step") so->step = py::cast<uint64_t>(v);
      else if (key == "memory_budget") so->memory_budget = co->memory_budget = py::cast<uint64_t>(v);
      else if (key == "select") co->select = py::isinstance<py::str>(v) ? std::vector<std::string>{py::cast<std::string>(v)}
                                                                       : py::cast<std::vector<std::string>>(v);
      else if (key == "force") co->force = py::cast<bool>(v);
      else if (key == "deflate") co->deflate_level = py::cast<int>(v);
      else if (key == "max_shard_bytes") co->max_shard_bytes = py::cast<uint64_t>(v);
      else if (key == "out_step") co->step = py::cast<uint64_t>(v);
      else if (key == "ranks") co->ranks = py::cast<uint32_t>(v);
      else if (key == "tp") co->tp = py::cast<uint32_t>(v);
      else if (key == "dp") co->dp = py::cast<uint32_t>(v);
      else if (key == "codec_level") co->codec_level = py::cast<int>(v);
      else if (key == "direct_io") co->direct_io = py::cast<bool>(v);
      else if (key == "codec") co->codec = CodecOption(v);
      else if (key == "rename") co->rename = RenameOption(v);
      else if (key == "rename_file") {
        const std::string path = py::cast<std::string>(py::module_::import("os").attr("fspath")(v));
        Result<std::string> text = ReadFileToString(Env::Default(), path, 16ull << 20);
        if (!text.ok()) Raise(text.status().Annotate("rename_file"));
        Result<std::vector<RenameRule>> rules = ParseRenameRules(*text, path);
        if (!rules.ok()) Raise(rules.status());
        file_rules = std::move(rules).value();
      } else if (key == "dtype") co->dtype = DTypeOption(v);
      else {
        throw py::type_error("convert() got an unknown option '" + key + "'");
      }
    } catch (const py::cast_error&) {
      throw py::type_error("convert() option '" + key + "' has the wrong type (" +
                           py::cast<std::string>(py::str(py::type::of(v).attr("__name__"))) + ")");
    }
  }
  co->rename.insert(co->rename.end(), file_rules.begin(), file_rules.end());
}

// What convert() reports of the tensors --rename and --dtype changed (ConvertReport).
py::list ExportTensorList(const std::vector<ExportTensor>& tensors) {
  py::list out;
  for (const ExportTensor& e : tensors) {
    py::dict d;
    d["source_name"] = e.source_name;
    d["name"] = e.name;
    d["source_dtype"] = std::string(DTypeName(e.source_dtype));
    d["dtype"] = std::string(DTypeName(e.dtype));
    out.append(d);
  }
  return out;
}

std::unique_ptr<TensorSource> OpenSource(const std::string& path, const SourceOptions& options) {
  std::unique_ptr<TensorSource> source;
  Check(WithoutGil([&]() -> Status {
    Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource(path, options);
    if (!opened.ok()) return opened.status();
    source = std::move(opened).value();
    return Status::OK();
  }));
  return source;
}

py::dict DescribeSource(const TensorSource& source) {
  py::list tensors, objects;
  for (const SourceTensor& t : source.tensors()) {
    py::dict d;
    d["name"] = t.name;
    d["dtype"] = std::string(DTypeName(t.dtype));
    d["shape"] = py::tuple(py::cast(t.shape));
    tensors.append(d);
  }
  for (const SourceObject& o : source.objects()) {
    py::dict d;
    d["rank"] = o.rank;
    d["name"] = o.name;
    objects.append(d);
  }
  py::dict out;
  out["format"] = std::string(SourceKindName(source.kind()));
  out["description"] = source.description();
  out["step"] = source.step() ? py::cast(*source.step()) : py::none();
  out["saved_world_size"] = source.saved_world_size();
  out["metadata"] = source.metadata_json();
  out["tensors"] = tensors;
  out["objects"] = objects;
  return out;
}

// True when the directory or the memory tier holds a complete checkpoint (errors count as "yes",
// so that they surface through the load's own error).
bool AnyCompleteCheckpoint(Checkpointer& c) {
  Result<std::optional<uint64_t>> latest = c.LatestStep();
  if (!latest.ok() || latest->has_value()) return true;
  Result<std::vector<CheckpointInfo>> tier = c.ListMemoryTier();
  if (!tier.ok()) return true;
  for (const CheckpointInfo& i : *tier) {
    if (i.complete) return true;
  }
  return false;
}

class PyCheckpointer {
 public:
  PyCheckpointer(const std::string& directory, uint32_t rank, uint32_t world_size, const py::dict& kwargs) {
    bool fault_injection = false;
    CheckpointerOptions options = ParseOptions(directory, rank, world_size, kwargs, &fault_injection);
    if (fault_injection) {
      faults_ = std::make_unique<FaultInjectionEnv>(Env::Routing());
      options.env = faults_.get();
    }
    Result<std::unique_ptr<Checkpointer>> c = [&] {
      py::gil_scoped_release release;
      return Checkpointer::Open(std::move(options));
    }();
    if (!c.ok()) Raise(c.status());
    impl_ = std::move(*c);
  }

  // Destroyed without close() (garbage, or the interpreter ending on an exception): not an orderly
  // end, so the memory tier keeps this rank's snapshots for the relaunch.
  ~PyCheckpointer() {
    if (impl_) impl_->KeepMemoryTierOnClose();
    py::gil_scoped_release release;
    impl_.reset();
  }

  Checkpointer& impl() {
    if (!impl_) Raise(Status::FailedPrecondition("checkpointer", "used after close()"));
    return *impl_;
  }

  // The tensors are kept for SaveAgain.
  Ticket Save(uint64_t step, const std::vector<TensorSpec>& specs,
              const std::vector<std::pair<std::string, py::bytes>>& objects, const std::string& metadata_json,
              py::object keepalive) {
    SaveRequest req = ToSaveRequest(specs, objects, metadata_json);
    Ticket t = SaveRequestNow(step, req, std::move(keepalive));
    last_tensors_ = std::move(req.tensors);
    return t;
  }

  // Save with the tensors of the last Save (the Python side checked that they are the same tensors
  // at the same addresses): no conversion of thousands of descriptions per save.
  Ticket SaveAgain(uint64_t step, const std::vector<std::pair<std::string, py::bytes>>& objects,
                   const std::string& metadata_json, py::object keepalive) {
    SaveRequest req = ToSaveRequest({}, objects, metadata_json);
    std::swap(req.tensors, last_tensors_);
    struct Restore {
      std::vector<TensorShard>& to;
      std::vector<TensorShard>& from;
      ~Restore() { std::swap(to, from); }
    } restore{last_tensors_, req.tensors};
    return SaveRequestNow(step, req, std::move(keepalive));
  }

  Ticket SaveRequestNow(uint64_t step, const SaveRequest& req, py::object keepalive) {
    Checkpointer& c = impl();
    SaveTicket t;
    {
      py::gil_scoped_release release;
      t = c.Save(step, req);
    }
    return Ticket(std::move(t), std::move(keepalive));
  }

  void PrepareStaging(const std::vector<TensorSpec>& specs,
                      const std::vector<std::pair<std::string, py::bytes>>& objects, const std::string& metadata_json) {
    SaveRequest req = ToSaveRequest(specs, objects, metadata_json);
    Checkpointer& c = impl();
    Check(WithoutGil([&] { return c.PrepareStaging(req); }));
  }

  // None when `step` is None and there is no complete checkpoint at all (a fresh start); every
  // other failure raises, a tensor missing from an existing checkpoint included.
  std::optional<py::dict> Load(std::optional<uint64_t> step, const std::vector<TensorSpec>& specs,
                               std::optional<uint32_t> objects_of_rank) {
    LoadRequest req;
    req.tensors = ToShards(specs);
    req.objects_of_rank = objects_of_rank;
    Checkpointer& c = impl();
    bool none_at_all = false;
    Result<LoadResult> r = [&] {
      py::gil_scoped_release release;
      Result<LoadResult> result = c.Load(step, req);
      // A launch the agent started fresh (resume step "none") starts fresh on every rank.
      if (!result.ok() && result.status().IsNotFound() && !step)
        none_at_all = c.options().resume_step == "none" || !AnyCompleteCheckpoint(c);
      return result;
    }();
    if (none_at_all) return std::nullopt;
    if (!r.ok()) Raise(r.status());
    py::dict d;
    d["step"] = r->step;
    d["saved_world_size"] = r->saved_world_size;
    py::list objects;
    for (const auto& [name, value] : r->objects) objects.append(py::make_tuple(name, py::bytes(value)));
    d["objects"] = objects;
    d["metadata_json"] = r->metadata_json;
    d["bytes_read"] = r->bytes_read;
    d["bytes_scattered"] = r->bytes_scattered;
    d["from_memory_tier"] = r->from_memory_tier;
    py::list skipped;
    for (const SkippedCheckpoint& s : r->skipped) {
      py::dict e;
      e["step"] = s.step;
      e["location"] = s.location;
      e["reason"] = s.reason;
      skipped.append(e);
    }
    d["skipped"] = skipped;
    return d;
  }

  py::list List(bool memory_tier) {
    Checkpointer& c = impl();
    Result<std::vector<CheckpointInfo>> r = [&] {
      py::gil_scoped_release release;
      return memory_tier ? c.ListMemoryTier() : c.List();
    }();
    if (!r.ok()) Raise(r.status());
    py::list out;
    for (const CheckpointInfo& i : *r) out.append(InfoDict(i));
    return out;
  }

  std::optional<uint64_t> LatestStep() {
    Checkpointer& c = impl();
    Result<std::optional<uint64_t>> r = [&] {
      py::gil_scoped_release release;
      return c.LatestStep();
    }();
    if (!r.ok()) Raise(r.status());
    return *r;
  }

  void Flush() {
    Checkpointer& c = impl();
    Check(WithoutGil([&] { return c.Flush(); }));
  }

  void CollectGarbage() {
    Checkpointer& c = impl();
    Check(WithoutGil([&] { return c.CollectGarbage(); }));
  }

  void WaitForCommit(uint64_t step, double timeout_seconds) {
    Checkpointer& c = impl();
    Check(WithoutGil([&] { return c.WaitForCommit(step, timeout_seconds); }));
  }

  // Waits for every save to be persisted, then releases everything. Idempotent.
  void Close(bool keep_memory_tier) {
    if (impl_ && keep_memory_tier) impl_->KeepMemoryTierOnClose();
    std::unique_ptr<Checkpointer> c = std::move(impl_);
    py::gil_scoped_release release;
    c.reset();
  }
  bool closed() const { return impl_ == nullptr; }

  std::string MemoryTierDirectory() { return impl().memory_tier_directory(); }
  // The launch's resume step as Open resolved it ("" when Load(latest) is not pinned).
  std::string ResumeStep() { return impl().options().resume_step; }

  void InjectFaults(int64_t fail_writes_after_bytes, bool fail_syncs, bool fail_renames, const std::string& paths) {
    if (!faults_) {
      Raise(Status::FailedPrecondition("inject_faults", "the Checkpointer was not opened with fault_injection=True"));
    }
    faults_->RestrictToPathsContaining(paths);
    faults_->FailWritesAfterBytes(fail_writes_after_bytes);
    faults_->FailSyncs(fail_syncs);
    faults_->FailRenames(fail_renames);
  }

 private:
  std::unique_ptr<FaultInjectionEnv> faults_;  // outlives impl_ (declared first, destroyed last)
  std::unique_ptr<Checkpointer> impl_;
  std::vector<TensorShard> last_tensors_;  // of the last Save, for SaveAgain
};

trace::Op ParseOp(const std::string& name) { return trace::OpFromName(name); }

// Whether the tensor leaves of a state, `pairs` ((path, leaf) tuples), are the objects `leaves` of
// an earlier save with their memory where it was: for each, the tensor it reads (kinds[i]: 0 the
// leaf, 1 its .tensor (a lifeline.Shard), 2 its ._local_tensor (a DTensor)) has data_ptr()
// addresses[i]. The per-save check of lifeline.Checkpointer.save (_SavedTensors), in C: thousands
// of attribute reads and calls cost a tenth of what they do in Python.
bool LeavesUnmoved(const py::list& pairs, const py::list& leaves, const std::vector<uint8_t>& kinds,
                   const std::vector<uintptr_t>& addresses) {
  const size_t n = static_cast<size_t>(PyList_GET_SIZE(pairs.ptr()));
  if (n != static_cast<size_t>(PyList_GET_SIZE(leaves.ptr())) || n != kinds.size() || n != addresses.size())
    return false;
  static PyObject* const kTensor = PyUnicode_InternFromString("tensor");
  static PyObject* const kLocal = PyUnicode_InternFromString("_local_tensor");
  static PyObject* const kDataPtr = PyUnicode_InternFromString("data_ptr");
  for (size_t i = 0; i < n; ++i) {
    PyObject* pair = PyList_GET_ITEM(pairs.ptr(), i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) return false;
    PyObject* leaf = PyTuple_GET_ITEM(pair, 1);
    if (leaf != PyList_GET_ITEM(leaves.ptr(), i)) return false;
    py::object probe = kinds[i] == 0 ? py::reinterpret_borrow<py::object>(leaf)
                                     : py::reinterpret_steal<py::object>(
                                           PyObject_GetAttr(leaf, kinds[i] == 1 ? kTensor : kLocal));
    if (!probe) {
      PyErr_Clear();
      return false;
    }
    py::object address = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(probe.ptr(), kDataPtr));
    if (!address) {
      PyErr_Clear();
      return false;
    }
    if (PyLong_AsSize_t(address.ptr()) != addresses[i]) {
      PyErr_Clear();
      return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace lifeline::python

PYBIND11_MODULE(_lifeline, m) {
  using namespace lifeline;
  using namespace lifeline::python;
  m.doc() = "Lifeline's C++ core; use the `lifeline` package instead.";

  g_error = PyErr_NewExceptionWithDoc(
      "lifeline.Error",
      "A Lifeline operation failed. `code` names the kind (IOError, NotFound, Corruption, InvalidArgument, "
      "AlreadyExists, Unavailable, NotInCheckpoint, ...); the message names the file, tensor, rank or step.",
      PyExc_RuntimeError, nullptr);
  if (g_error == nullptr) throw py::error_already_set();
  m.attr("Error") = py::handle(g_error);

  py::class_<Ticket>(m, "Ticket")
      .def_property_readonly("step", &Ticket::step)
      .def("wait_snapshot", &Ticket::WaitSnapshot)
      .def("wait_tensor", &Ticket::WaitTensor)
      .def("tensor_copied", &Ticket::TensorCopied)
      .def("fence_on", &Ticket::FenceOn)
      .def("wait_persisted", &Ticket::WaitPersisted)
      .def("wait_committed", &Ticket::WaitCommitted)
      .def("progress", &Ticket::Progress)
      .def("snapshot_done", &Ticket::SnapshotDone);

  py::class_<PyCheckpointer>(m, "Checkpointer")
      .def(py::init<const std::string&, uint32_t, uint32_t, const py::dict&>())
      .def("save", &PyCheckpointer::Save)
      .def("save_again", &PyCheckpointer::SaveAgain)
      .def("prepare_staging", &PyCheckpointer::PrepareStaging)
      .def("load", &PyCheckpointer::Load)
      .def("list", &PyCheckpointer::List)
      .def("latest_step", &PyCheckpointer::LatestStep)
      .def("flush", &PyCheckpointer::Flush)
      .def("collect_garbage", &PyCheckpointer::CollectGarbage)
      .def("wait_for_commit", &PyCheckpointer::WaitForCommit)
      .def("close", &PyCheckpointer::Close, py::arg("keep_memory_tier") = false)
      .def_property_readonly("closed", &PyCheckpointer::closed)
      .def_property_readonly("memory_tier_directory", &PyCheckpointer::MemoryTierDirectory)
      .def_property_readonly("resume_step", &PyCheckpointer::ResumeStep)
      .def("inject_faults", &PyCheckpointer::InjectFaults);

  // Conversion (lifeline/convert.h); lifeline.convert() and lifeline.describe_source() wrap these.
  m.def("describe_source", [](const std::string& path, py::dict kwargs) {
    SourceOptions so;
    ConvertOptions unused;
    ParseConvertOptions(kwargs, &so, &unused);
    return DescribeSource(*OpenSource(path, so));
  }, py::arg("path"), py::arg("options") = py::dict());
  m.def("convert", [](const std::string& src, const std::string& dst, const std::string& to, py::dict kwargs) {
    SourceOptions so;
    ConvertOptions co;
    ParseConvertOptions(kwargs, &so, &co);
    Result<ConvertFormat> format = ParseConvertFormat(to);
    if (!format.ok()) throw py::value_error("to=" + to + ": expected 'hdf5', 'safetensors' or 'lifeline'");
    std::unique_ptr<TensorSource> source = OpenSource(src, so);
    if (so.step && source->kind() != SourceKind::kCheckpoint)
      Raise(Status::InvalidArgument("step", "applies to a checkpoint directory, not " + source->description()));
    ConvertReport report;
    Check(WithoutGil([&]() -> Status {
      Result<ConvertReport> r = Convert(*source, *format, dst, co);
      if (!r.ok()) return r.status();
      report = std::move(r).value();
      return Status::OK();
    }));
    py::dict out;
    out["source"] = source->description();
    out["source_format"] = std::string(SourceKindName(source->kind()));
    out["format"] = to;
    out["tensors"] = report.tensors;
    out["objects"] = report.objects;
    out["bytes"] = report.bytes;
    out["outputs"] = report.outputs;
    out["renamed"] = ExportTensorList(report.renamed);
    out["cast"] = ExportTensorList(report.cast);
    if (*format == ConvertFormat::kLifeline) {
      out["step"] = report.step;
      out["ranks"] = report.ranks;
      out["tp"] = report.tp;
      out["dp"] = report.dp;
      out["placement"] = report.placement;
    }
    return out;
  }, py::arg("src"), py::arg("dst"), py::arg("to"), py::arg("options") = py::dict());

  // The load fallback rule (ClassifyLoadFailure) for an Error's code: "mismatch" (stop: the caller
  // asked for what the checkpoint lacks), "damage" (try an older step) or "other" (stop). The
  // job-wide agreement of lifeline.Checkpointer.load applies it to the codes its ranks report.
  m.def("load_failure", [](const std::string& code) -> const char* {
    for (int c = 0; c <= static_cast<int>(StatusCode::kNotInCheckpoint); ++c) {
      if (code != StatusCodeName(static_cast<StatusCode>(c))) continue;
      switch (ClassifyLoadFailure(static_cast<StatusCode>(c))) {
        case LoadFailure::kMismatch: return "mismatch";
        case LoadFailure::kDamage: return "damage";
        case LoadFailure::kOther: return "other";
      }
    }
    return "other";
  });

  m.def("dtype_size", [](const std::string& name) -> size_t {
    std::optional<DType> t = ParseDType(name);
    return t ? DTypeSize(*t) : 0;
  });

  // Tracing: thin wrappers; every one returns at once when no agent is present.
  m.def("cuda_built", [] { return CudaCopyEngineBuilt(); });
  m.def("leaves_unmoved", &LeavesUnmoved);
  m.def("trace_active", [] { return trace::Active(); });
  m.def("trace_step_begin", [](uint64_t step) { trace::StepBegin(step); });
  m.def("trace_step_end", [](uint64_t step) { trace::StepEnd(step); });
  // seq 0: the library numbers the collective (communicators 0..255); others are numbered by the caller.
  m.def("trace_collective_begin", [](const std::string& op, uint64_t bytes, uint32_t comm, uint64_t seq) {
    return trace::CollectiveBegin(ParseOp(op), bytes, comm, seq);
  }, py::arg("op"), py::arg("nbytes"), py::arg("comm"), py::arg("seq") = 0);
  m.def("trace_collective_posted", [](uint64_t seq, uint32_t comm) { trace::CollectivePosted(seq, comm); });
  m.def("trace_collective_end", [](uint64_t seq, uint32_t comm) { trace::CollectiveEnd(seq, comm); });
  m.def("trace_heartbeat", [] { trace::Heartbeat(); });
  m.def("trace_process_start", [](std::optional<uint64_t> step, const std::string& source, double load_seconds) {
    const trace::ResumeSource where = source == "memory" ? trace::ResumeSource::kMemoryTier
                                      : source == "disk" ? trace::ResumeSource::kDisk
                                                         : trace::ResumeSource::kUnknown;
    trace::ProcessStart(step ? *step : trace::kNoStep, where,
                        load_seconds > 0 ? static_cast<uint64_t>(load_seconds * 1e9) : 0);
  }, py::arg("step"), py::arg("source") = "", py::arg("load_seconds") = 0.0);
  m.def("trace_process_exit", [] { trace::ProcessExit(); });
  m.def("trace_dropped", [] { return trace::Dropped(); });
  m.def("trace_register_scalar", [](const std::string& name) {
    Result<uint32_t> id = trace::RegisterScalar(name);
    Check(id.status());
    return *id;
  });
  // step None (or kNoStep): the step the process is in.
  m.def("trace_scalar", [](uint32_t id, double value, uint64_t step) { trace::ReportScalar(id, value, step); },
        py::arg("id"), py::arg("value"), py::arg("step") = trace::kNoStep);
  m.def("trace_dump", [](const std::string& path, uint64_t max_events) {
    Check(trace::DumpRecent(path, max_events));
  });
}
