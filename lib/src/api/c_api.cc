#include "lifeline/c_api.h"

#include <algorithm>
#include <new>
#include <string>

#include "lifeline/checkpoint.h"
#include "lifeline/trace.h"

struct lifeline_checkpointer {
  std::unique_ptr<lifeline::Checkpointer> impl;
  lifeline::LoadResult last_load;
};

struct lifeline_ticket {
  lifeline::SaveTicket impl;
};

namespace {

thread_local std::string g_last_error;

int Fail(const lifeline::Status& s) {
  g_last_error = s.ToString();
  return static_cast<int>(s.code());
}

int Done(const lifeline::Status& s) {
  if (s.ok()) return LIFELINE_OK;
  return Fail(s);
}

lifeline::Result<lifeline::TensorShard> ToShard(const lifeline_tensor& t, size_t i) {
  if (t.name == nullptr || t.ndim < 0 || (t.ndim > 0 && t.global_shape == nullptr))
    return lifeline::Status::InvalidArgument("tensor #" + std::to_string(i), "name and global_shape are required");
  lifeline::TensorShard s;
  s.name = t.name;
  s.dtype = static_cast<lifeline::DType>(t.dtype);
  s.global_shape.assign(t.global_shape, t.global_shape + t.ndim);
  s.offsets = t.offsets ? std::vector<int64_t>(t.offsets, t.offsets + t.ndim) : std::vector<int64_t>(t.ndim, 0);
  s.shape = t.shape ? std::vector<int64_t>(t.shape, t.shape + t.ndim) : s.global_shape;
  int64_t volume = 1;
  for (int64_t e : s.shape) volume *= e;
  s.flat_begin = t.flat_begin;
  s.flat_end = t.flat_end < 0 ? volume : t.flat_end;
  s.replica_index = t.replica_count > 1 ? t.replica_index : 0;
  s.replica_count = t.replica_count > 1 ? t.replica_count : 1;
  s.data = t.data;
  return s;
}

lifeline::Result<std::vector<lifeline::TensorShard>> ToShards(const lifeline_tensor* tensors, size_t n) {
  if (n > 0 && tensors == nullptr) return lifeline::Status::InvalidArgument("tensors is NULL");
  std::vector<lifeline::TensorShard> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto s = ToShard(tensors[i], i);
    if (!s.ok()) return s.status();
    out.push_back(std::move(*s));
  }
  return out;
}

}  // namespace

extern "C" {

void lifeline_options_init(lifeline_options* o) {
  const lifeline::CheckpointerOptions d;
  *o = lifeline_options{};
  o->rank = d.rank;
  o->world_size = d.world_size;
  o->keep_last = d.keep_last;
  o->chunk_bytes = d.chunk_bytes;
  o->save_memory_budget = d.save_memory_budget;
  o->load_memory_budget = d.load_memory_budget;
  o->queue_depth = d.queue_depth;
  o->direct_io = d.direct_io ? 1 : 0;
  o->staging_budget_bytes = d.staging_budget_bytes;
  o->staging_slots = d.staging_slots;
  o->skip_when_busy = d.busy_policy == lifeline::BusyPolicy::kSkip ? 1 : 0;
  o->copy_threads = d.copy_threads;
  o->background_nice = d.background_nice;
  o->memory_tier = d.memory_tier ? 1 : 0;
  o->codec = static_cast<int32_t>(d.codec);
  o->drain_keep_last = d.drain_keep_last;
}

int lifeline_open(const lifeline_options* o, lifeline_checkpointer** out) {
  if (o == nullptr || out == nullptr || o->directory == nullptr)
    return Fail(lifeline::Status::InvalidArgument("lifeline_open: options, directory and out are required"));
  lifeline::CheckpointerOptions opt;
  opt.directory = o->directory;
  opt.rank = o->rank;
  opt.world_size = o->world_size;
  if (o->run_id != nullptr) opt.run_id = o->run_id;
  opt.keep_last = o->keep_last;
  if (o->chunk_bytes) opt.chunk_bytes = o->chunk_bytes;
  if (o->save_memory_budget) opt.save_memory_budget = o->save_memory_budget;
  if (o->load_memory_budget) opt.load_memory_budget = o->load_memory_budget;
  if (o->queue_depth) opt.queue_depth = o->queue_depth;
  opt.direct_io = o->direct_io != 0;
  if (o->staging_budget_bytes) opt.staging_budget_bytes = o->staging_budget_bytes;
  if (o->staging_slots) opt.staging_slots = o->staging_slots;
  opt.busy_policy = o->skip_when_busy ? lifeline::BusyPolicy::kSkip : lifeline::BusyPolicy::kWait;
  if (o->copy_threads) opt.copy_threads = o->copy_threads;
  if (o->background_nice != 0) opt.background_nice = std::max<int32_t>(0, o->background_nice);
  opt.memory_tier = o->memory_tier != 0;
  if (o->memory_tier_directory != nullptr) opt.memory_tier_directory = o->memory_tier_directory;
  if (o->codec < 0 || o->codec > 2)
    return Fail(lifeline::Status::InvalidArgument("lifeline_open", "codec must be 0, 1 or 2"));
  opt.codec = static_cast<lifeline::SaveCodec>(o->codec);
  if (o->drain_directory != nullptr) opt.drain_directory = o->drain_directory;
  opt.drain_keep_last = o->drain_keep_last;
  auto c = lifeline::Checkpointer::Open(std::move(opt));
  if (!c.ok()) return Fail(c.status());
  auto* handle = new (std::nothrow) lifeline_checkpointer;
  if (handle == nullptr) return Fail(lifeline::Status::ResourceExhausted("lifeline_open: out of memory"));
  handle->impl = std::move(*c);
  *out = handle;
  return LIFELINE_OK;
}

void lifeline_close(lifeline_checkpointer* c) { delete c; }

namespace {

lifeline::Result<lifeline::SaveRequest> ToRequest(const lifeline_tensor* tensors, size_t num_tensors,
                                                  const lifeline_object* objects, size_t num_objects,
                                                  const char* metadata_json) {
  auto shards = ToShards(tensors, num_tensors);
  if (!shards.ok()) return shards.status();
  lifeline::SaveRequest req;
  req.tensors = std::move(*shards);
  if (num_objects > 0 && objects == nullptr) return lifeline::Status::InvalidArgument("objects is NULL");
  for (size_t i = 0; i < num_objects; ++i) {
    if (objects[i].name == nullptr || (objects[i].size > 0 && objects[i].data == nullptr))
      return lifeline::Status::InvalidArgument("object #" + std::to_string(i), "name and data are required");
    req.objects.emplace_back(objects[i].name, std::string(static_cast<const char*>(objects[i].data), objects[i].size));
  }
  if (metadata_json != nullptr) req.metadata_json = metadata_json;
  return req;
}

int NullTicket(const char* where) {
  return Fail(lifeline::Status::InvalidArgument(where, "NULL ticket"));
}

}  // namespace

int lifeline_save(lifeline_checkpointer* c, uint64_t step, const lifeline_tensor* tensors, size_t num_tensors,
                  const lifeline_object* objects, size_t num_objects, const char* metadata_json) {
  if (c == nullptr) return Fail(lifeline::Status::InvalidArgument("lifeline_save: NULL checkpointer"));
  auto req = ToRequest(tensors, num_tensors, objects, num_objects, metadata_json);
  if (!req.ok()) return Fail(req.status());
  return Done(c->impl->Save(step, *req).WaitPersisted());
}

int lifeline_save_async(lifeline_checkpointer* c, uint64_t step, const lifeline_tensor* tensors, size_t num_tensors,
                        const lifeline_object* objects, size_t num_objects, const char* metadata_json,
                        lifeline_ticket** out) {
  if (c == nullptr || out == nullptr)
    return Fail(lifeline::Status::InvalidArgument("lifeline_save_async: NULL checkpointer or out"));
  auto req = ToRequest(tensors, num_tensors, objects, num_objects, metadata_json);
  if (!req.ok()) return Fail(req.status());
  auto* t = new (std::nothrow) lifeline_ticket;
  if (t == nullptr) return Fail(lifeline::Status::ResourceExhausted("lifeline_save_async: out of memory"));
  t->impl = c->impl->Save(step, *req);
  *out = t;
  return LIFELINE_OK;
}

int lifeline_ticket_wait_snapshot(lifeline_ticket* t) {
  return t == nullptr ? NullTicket("lifeline_ticket_wait_snapshot") : Done(t->impl.WaitSnapshot());
}

int lifeline_ticket_wait_tensor(lifeline_ticket* t, size_t index) {
  return t == nullptr ? NullTicket("lifeline_ticket_wait_tensor") : Done(t->impl.WaitTensor(index));
}

int lifeline_ticket_wait_persisted(lifeline_ticket* t) {
  return t == nullptr ? NullTicket("lifeline_ticket_wait_persisted") : Done(t->impl.WaitPersisted());
}

int lifeline_ticket_wait_committed(lifeline_ticket* t, double timeout_seconds) {
  return t == nullptr ? NullTicket("lifeline_ticket_wait_committed") : Done(t->impl.WaitCommitted(timeout_seconds));
}

void lifeline_ticket_progress(const lifeline_ticket* t, lifeline_save_progress* out) {
  if (out == nullptr) return;
  const lifeline::SaveProgress p = t != nullptr ? t->impl.Progress() : lifeline::SaveTicket().Progress();
  *out = lifeline_save_progress{};
  out->step = p.step;
  out->phase = static_cast<int32_t>(p.phase);
  out->code = static_cast<int32_t>(p.status.code());
  out->bytes_total = p.bytes_total;
  out->bytes_copied = p.bytes_copied;
  out->bytes_stored = p.bytes_stored;
  out->stall_seconds = p.stall_seconds;
  out->snapshot_seconds = p.snapshot_seconds;
  out->persist_seconds = p.persist_seconds;
}

void lifeline_ticket_free(lifeline_ticket* t) { delete t; }

int lifeline_prepare_staging(lifeline_checkpointer* c, const lifeline_tensor* tensors, size_t num_tensors,
                             const lifeline_object* objects, size_t num_objects) {
  if (c == nullptr) return Fail(lifeline::Status::InvalidArgument("lifeline_prepare_staging: NULL checkpointer"));
  auto req = ToRequest(tensors, num_tensors, objects, num_objects, nullptr);
  if (!req.ok()) return Fail(req.status());
  return Done(c->impl->PrepareStaging(*req));
}

int lifeline_flush(lifeline_checkpointer* c) {
  if (c == nullptr) return Fail(lifeline::Status::InvalidArgument("lifeline_flush: NULL checkpointer"));
  return Done(c->impl->Flush());
}

int lifeline_wait_for_commit(lifeline_checkpointer* c, uint64_t step, double timeout_seconds) {
  if (c == nullptr) return Fail(lifeline::Status::InvalidArgument("lifeline_wait_for_commit: NULL checkpointer"));
  return Done(c->impl->WaitForCommit(step, timeout_seconds));
}

int lifeline_load(lifeline_checkpointer* c, int64_t step, const lifeline_tensor* targets, size_t num_targets,
                  uint64_t* loaded_step) {
  if (c == nullptr) return Fail(lifeline::Status::InvalidArgument("lifeline_load: NULL checkpointer"));
  auto shards = ToShards(targets, num_targets);
  if (!shards.ok()) return Fail(shards.status());
  lifeline::LoadRequest req;
  req.tensors = std::move(*shards);
  auto r = c->impl->Load(step < 0 ? std::nullopt : std::optional<uint64_t>(static_cast<uint64_t>(step)), req);
  if (!r.ok()) return Fail(r.status());
  c->last_load = std::move(*r);
  if (loaded_step != nullptr) *loaded_step = c->last_load.step;
  return LIFELINE_OK;
}

int lifeline_loaded_object(lifeline_checkpointer* c, const char* name, const void** data, size_t* size) {
  if (c == nullptr || name == nullptr || data == nullptr || size == nullptr)
    return Fail(lifeline::Status::InvalidArgument("lifeline_loaded_object: NULL argument"));
  for (const auto& [n, bytes] : c->last_load.objects) {
    if (n == name) {
      *data = bytes.data();
      *size = bytes.size();
      return LIFELINE_OK;
    }
  }
  return Fail(lifeline::Status::NotFound(std::string("object '") + name + "'", "not in the last load"));
}

const char* lifeline_loaded_metadata(lifeline_checkpointer* c) {
  return c == nullptr ? "" : c->last_load.metadata_json.c_str();
}

int lifeline_latest_step(lifeline_checkpointer* c, uint64_t* step) {
  if (c == nullptr || step == nullptr) return Fail(lifeline::Status::InvalidArgument("lifeline_latest_step: NULL argument"));
  auto r = c->impl->LatestStep();
  if (!r.ok()) return Fail(r.status());
  if (!r->has_value()) return Fail(lifeline::Status::NotFound("no complete checkpoint"));
  *step = **r;
  return LIFELINE_OK;
}

const char* lifeline_last_error(void) { return g_last_error.c_str(); }

int lifeline_trace_active(void) { return lifeline::trace::Active() ? 1 : 0; }
void lifeline_trace_step_begin(uint64_t step) { lifeline::trace::StepBegin(step); }
void lifeline_trace_step_end(uint64_t step) { lifeline::trace::StepEnd(step); }
uint64_t lifeline_trace_collective_begin(int op, uint64_t bytes, uint32_t comm, uint64_t seq) {
  const auto o = op >= 0 && op <= static_cast<int>(lifeline::trace::Op::kBarrier) ? static_cast<lifeline::trace::Op>(op)
                                                                                  : lifeline::trace::Op::kOther;
  return lifeline::trace::CollectiveBegin(o, bytes, comm, seq);
}
void lifeline_trace_collective_posted(uint64_t seq, uint32_t comm) { lifeline::trace::CollectivePosted(seq, comm); }
void lifeline_trace_collective_end(uint64_t seq, uint32_t comm) { lifeline::trace::CollectiveEnd(seq, comm); }
void lifeline_trace_heartbeat(void) { lifeline::trace::Heartbeat(); }
void lifeline_trace_process_start(uint64_t resumed_step) { lifeline::trace::ProcessStart(resumed_step); }
void lifeline_trace_process_exit(void) { lifeline::trace::ProcessExit(); }
int64_t lifeline_trace_register_scalar(const char* name) {
  if (name == nullptr) {
    Fail(lifeline::Status::InvalidArgument("lifeline_trace_register_scalar: NULL name"));
    return -1;
  }
  lifeline::Result<uint32_t> id = lifeline::trace::RegisterScalar(name);
  if (!id.ok()) {
    Fail(id.status());
    return -1;
  }
  return *id;
}
void lifeline_trace_scalar(uint32_t id, double value, uint64_t step) { lifeline::trace::ReportScalar(id, value, step); }

}  // extern "C"
