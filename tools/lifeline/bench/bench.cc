// lifeline bench save | load | train | index | compress: N ranks, run as threads of this process,
// save or load the synthetic model (lifeline/internal/synthetic_model.h) through one Checkpointer
// each, exactly as the ranks of a training job would, cooperating only through the file system.
// `bench train` is in train.cc, `bench index` in index.cc, `bench compress` in compress.cc,
// `bench trace` in trace.cc, `bench replicate` in replicate.cc, `bench gpu` in gpu.cc.
//
// save: every rank builds and fills its shards, then --iterations saves of steps s, s+1, ... run
// one after the other through the same Checkpointers, whose staging slots are reused as in
// steady-state training. In each, every rank calls Save, then WaitSnapshot, then WaitPersisted,
// and rank 0's ticket WaitCommitted; the time runs from the moment all ranks are released until
// the step is committed. Between saves only the `step` tensor, the objects and the metadata
// change, so the newest step loads and checks with `bench load`. Figures are the median of the
// saves that reuse a staging slot (from save slots+1 on, as the first `slots` saves each fill a
// fresh one; with fewer iterations, of those after the first): the steady state. The first save
// (cold arena) is reported separately.
//
// Retention (--keep-last, default 1) is applied by the bench between saves, outside the timing,
// rather than by the Checkpointers: the library runs it on the persist thread before it reports a
// save persisted, so removing the previous checkpoint (slow on a file system mounted with
// `discard`) would be counted as saving this one. retention_ms says what it took. Before each save
// and each disk baseline the file system is synced (outside the timing), so that none pays for the
// writeback or block freeing of what ran before it.
//
// Baselines, never run during a save:
//   limit    before the saves and again after them (the better of the two counts): the same bytes
//            written raw, one file per rank, with io_uring (the library's I/O engine; its
//            thread-pool fallback where io_uring is refused, named in limit_engine): preallocated
//            O_DIRECT files, 8 MiB blocks, 16 in flight per file, then fdatasync, as fio measures
//            a device, from the same kind of memory as the staging arena (registered, huge pages
//            where available). No copy, no checksum, no index: the most a save could reach.
//   memcpy   after the saves: every rank's state copied into a warm destination (a staging slot of
//            its own, written once before) by as many threads as the copy engine used, in the same
//            4 MiB pieces: with memcpy (the better of two passes), and with the snapshot's
//            copy-and-hash kernel.
//   buffered after the saves: the same bytes written with plain write() calls of 8 MiB and one
//            fsync into a scratch file in the same directory, the way torch.save-style writers go
//            through the page cache.
// --no-baseline skips them. Scratch files are deleted in every case.
//
// load: the model's shape comes from the checkpoint's metadata; every rank allocates the targets
// of its layout before the clock starts; the time runs until every Load returned. Then every
// element is compared with the value function (outside the timing), and the per-rank objects of
// rank r mod W are checked, W being the world size of the job that saved them (tp x dp of the
// metadata, which `lifeline reshard` and `convert` keep). Exit 1 when the load fails or anything differs.
//
// --json fields. save: bytes (unique tensor bytes written per save, replicas counted once),
// bytes_on_disk (of the last step), iterations, steady_iterations (how many the medians cover),
// first_step, last_step, seconds (Save to committed), gbps (bytes / seconds / 1e9),
// save_return_ms (longest time a rank spent inside Save), stall_ms (max over ranks of the ticket's
// stall_seconds: time the caller was blocked in Save and WaitSnapshot), snapshot_ms and persist_ms
// (max over ranks, from Save), copy_gbps (the ranks' bytes_total / snapshot time: the copy into
// the arena, all ranks together), persist_gbps (bytes / persist time), staged, memory_tier;
// first_seconds, first_gbps, first_stall_ms, first_snapshot_ms, first_persist_ms (the first save,
// cold arena); per_iteration (the same figures for every save); bytes_total and bytes_stored (all
// ranks, last save) and compression_ratio (bytes_total / bytes_stored, when a codec is on); codec,
// copy_threads, staging_slots, staging_budget_bytes, keep_last, retention_ms (median time to
// remove older checkpoints between saves, counted in no other figure). Baselines: limit_seconds
// and limit_gbps (the better of limit_gbps_before and limit_gbps_after), limit_engine,
// ratio_to_limit (gbps / limit_gbps), memcpy_threads, memcpy_gbps, copy_hash_gbps (the kernel
// alone), copy_ratio_to_memcpy (copy_gbps / memcpy_gbps; absent when the snapshot was streamed
// rather than staged), baseline_seconds and baseline_gbps (buffered), speedup_vs_buffered
// (baseline_seconds / seconds). Also prepare_seconds (opening, filling and, unless --cold,
// Checkpointer::PrepareStaging; not timed), ranks, tp,
// dp, step (the last), hidden, layers, tensors, dir, direct_io.
// load: --iterations loads (default 3), each from a cold page cache (the data files' pages dropped
// with posix_fadvise(DONTNEED), mincore checking that none stayed; only where some did, the whole
// machine's cache through /proc/sys/vm/drop_caches where writable), each followed by the read limit: the step's
// data files read whole, raw (io_uring, O_DIRECT, into prefaulted registered huge-page buffers, one
// reader per file up to 8), cold too, with each of two settings (8 MiB x 16 and 1 MiB x 64 in
// flight per reader), the better counting. Figures are medians over the iterations.
// JSON: bytes (total bytes of all ranks' targets, replicas counted on every rank that holds one),
// unique_bytes, bytes_read (from storage by one load, alignment slack included),
// read_amplification (bytes_read / bytes), seconds, gbps (bytes / seconds / 1e9), read_gbps
// (bytes_read / seconds / 1e9: what lifeline took from the disk per second), limit_bytes (the data
// files' size), limit_gbps (limit_bytes / the limit's time), ratio_to_limit (read_gbps /
// limit_gbps: bytes from disk per second against bytes from disk per second), limit_engine,
// limit_block_bytes and limit_depth (the setting that won most often), limit_readers, iterations,
// per_iteration, cold_cache, cache_drop ("drop_caches", "fadvise" or "none") and
// cache_drop_problem (when the cache could not be emptied), mismatches (elements), objects_checked,
// object_mismatches (of one load, the worst), saved_world_size, ranks, tp, dp, step, hidden, layers.
// --no-baseline skips the limit.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/inspect.h"
#include "lifeline/internal/copy_kernel.h"
#include "lifeline/internal/io_pump.h"
#include "lifeline/internal/shared_memory.h"
#include "lifeline/internal/synthetic_model.h"
#include "tools/lifeline/bench/bench.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {

double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

namespace {

constexpr uint64_t kBaselineWriteBytes = 8ull << 20;
constexpr unsigned kLimitDepth = 16;

// Memory of the staging arena's kind, as an anonymous staging slot has it: whole 2 MiB granules,
// backed by transparent huge pages where the kernel gives them.
Result<MappedRegion> SlotMemory(uint64_t bytes) {
  constexpr uint64_t kGranule = 2ull << 20;
  return MappedRegion::Anonymous((std::max<uint64_t>(bytes, 1) + kGranule - 1) / kGranule * kGranule,
                                 /*huge_pages=*/true);
}

struct CommonOptions {
  std::string dir;
  uint32_t ranks = 0;
  uint32_t tp = 0;  // 0: not given
  uint32_t dp = 0;
  int64_t step = -1;
  int64_t hidden = kDefaultHidden;
  CLI::Option* hidden_option = nullptr;
  std::string chunk_size;  // empty: the library's default
  unsigned queue_depth = 0;  // 0: the library's default
  bool buffered_io = false;
  bool json = false;
};

struct SaveOptions : CommonOptions {
  std::string state_bytes = "2GiB";
  // The tensor-count axis: > 0 saves a model of this many small tensors per rank (a mixture of
  // experts' many expert weights and their optimizer state) instead of the transformer of
  // --state-bytes, each holding --tensor-bytes on every rank.
  uint64_t many_tensors = 0;
  std::string tensor_bytes = "4KiB";
  bool no_baseline = false;
  unsigned iterations = 4;
  uint32_t keep_last = 1;
  bool cold = false;
  BenchSaveTuning tuning;
};

// `count` f32 tensors "experts.<i>.weight", each split by rows over the tensor-parallel ranks so
// that every rank holds `bytes_per_rank` of each (a copy per data-parallel rank), then the `step`
// every rank holds: the tensor-count axis of `bench save`.
std::vector<ModelTensor> ManyTensors(uint64_t count, uint64_t bytes_per_rank, const ParallelLayout& layout) {
  const int64_t elements = std::max<int64_t>(1, static_cast<int64_t>(bytes_per_rank / DTypeSize(DType::kF32)));
  const int64_t cols = std::min<int64_t>(elements, 64);
  const int64_t rows = std::max<int64_t>(1, elements / cols) * layout.tp;
  std::vector<ModelTensor> out;
  out.reserve(count + 1);
  for (uint64_t i = 0; i < count; ++i)
    out.push_back({"experts." + std::to_string(i) + ".weight", DType::kF32, {rows, cols},
                   Placement::kTensorParallelDim0});
  out.push_back({kStepTensorName, DType::kI64, {}, Placement::kWholeOnEveryRank});
  return out;
}

Result<ParallelLayout> ResolveLayout(const CommonOptions& o) { return lifeline::ResolveLayout(o.ranks, o.tp, o.dp); }

Result<CheckpointerOptions> MakeCheckpointerOptions(const CommonOptions& o, uint32_t world_size,
                                                    const std::string& run_id) {
  CheckpointerOptions c;
  c.directory = o.dir;
  c.world_size = world_size;
  c.run_id = run_id;
  c.direct_io = !o.buffered_io;
  if (!o.chunk_size.empty()) {
    auto chunk = ParseByteSize(o.chunk_size);
    if (!chunk.ok()) return chunk.status().Annotate("--chunk-size");
    c.chunk_bytes = *chunk;
  }
  if (o.queue_depth > 0) c.queue_depth = o.queue_depth;
  return c;
}

std::string Ranks(uint32_t n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); }

// What one rank thread reports back.
struct RankOutcome {
  Status status;
  double finished = 0;  // NowSeconds() when its Load returned
  uint64_t target_bytes = 0;
  uint64_t bytes_read = 0;
  uint64_t mismatches = 0;
  uint64_t objects_checked = 0;
  uint64_t object_mismatches = 0;
};

// Rank `r` of a simulated job: its checkpointer opened with `base` as that rank, and its tensors
// for `step` (holding the step's values when `fill`).
Status OpenSimulatedRank(const CheckpointerOptions& base, const std::vector<ModelTensor>& tensors,
                         const ParallelLayout& layout, uint32_t r, uint64_t step, bool fill,
                         std::unique_ptr<Checkpointer>* ckpt, RankState* state) {
  CheckpointerOptions options = base;
  options.rank = r;
  LL_ASSIGN_OR_RETURN(*ckpt, Checkpointer::Open(options));
  LL_ASSIGN_OR_RETURN(*state, RankState::Build(tensors, layout, r, step, fill));
  return Status::OK();
}

Status FirstFailure(const std::vector<RankOutcome>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (!outcomes[r].status.ok()) return outcomes[r].status.Annotate("rank " + std::to_string(r));
  }
  return Status::OK();
}

// Writes `bytes` bytes into a scratch file of `dir` with buffered write() calls of 8 MiB, then
// fsync; returns the seconds taken. The file is removed in every case.
Result<double> BufferedWriteBaseline(const std::string& dir, uint64_t bytes) {
  const std::string path = dir + "/.lifeline-bench-baseline-" + std::to_string(::getpid());
  std::vector<uint8_t> buffer(kBaselineWriteBytes);
  GenerateValues(TensorSeed(path), DType::kU8, 0, static_cast<int64_t>(buffer.size()), buffer.data());
  const double t0 = NowSeconds();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, path);
  Status status;
  uint64_t done = 0;
  while (done < bytes && status.ok()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), bytes - done));
    size_t put = 0;
    while (put < n) {
      const ssize_t w = ::write(fd, buffer.data() + put, n - put);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        status = Status::FromErrno(errno, path);
        break;
      }
      put += static_cast<size_t>(w);
    }
    done += put;
  }
  if (status.ok() && ::fsync(fd) != 0) status = Status::FromErrno(errno, path);
  if (::close(fd) != 0 && status.ok()) status = Status::FromErrno(errno, path);
  const double seconds = NowSeconds() - t0;
  ::unlink(path.c_str());
  if (!status.ok()) return status.Annotate("buffered-write baseline");
  return seconds;
}

// Commits the file system holding `dir` (syncfs), outside any timing, so that a measurement does
// not pay for the writeback or the block freeing (discards, on a file system mounted with
// `discard`) of what ran before it.
void QuiesceFileSystem(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::syncfs(fd);
  ::close(fd);
}

struct WriteLimit {
  double seconds = 0;
  std::string engine;  // of the I/O queue: "io_uring", or "threads" where io_uring is refused
};

// The device's limit, measured the way fio does (sequential, direct, deep queue) with the I/O
// engine the library uses: `bytes` split over `writers` threads, each streaming its share into its
// own preallocated O_DIRECT file in 8 MiB blocks, 16 in flight, then fdatasync. No copy, no
// checksum, no index: what a save could take at best.
Result<WriteLimit> DirectWriteLimit(const std::string& dir, uint64_t bytes, uint32_t writers, bool direct_io) {
  Env* env = Env::Default();
  const uint64_t share = (bytes / writers + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
  std::vector<Status> results(writers);
  std::vector<std::string> engines(writers);
  auto path_of = [&](uint32_t w) {
    return dir + "/.lifeline-bench-direct-" + std::to_string(::getpid()) + "-" + std::to_string(w);
  };
  std::latch go(1);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < writers; ++w) {
    threads.emplace_back([&, w] {
      const std::string path = path_of(w);
      auto run = [&]() -> Status {
        // The blocks are the memory a save writes from: a staging slot (huge pages where the kernel
        // gives them, so a block is a few large segments), registered with the queue when allowed.
        // From 4 KiB pages a device with few segments per request would see small requests, and
        // the limit would be the memory's, not the device's.
        Result<MappedRegion> reserved = SlotMemory(kLimitDepth * kBaselineWriteBytes);
        if (!reserved.ok()) return reserved.status().Annotate(path);
        MappedRegion blocks = std::move(reserved).value();
        std::memset(blocks.data(), 0x5a, kLimitDepth * kBaselineWriteBytes);
        FileOptions fopt;
        fopt.direct_io = direct_io;
        // Set up before the clock starts, as fio does.
        LL_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue, env->NewIoQueue(IoQueueOptions{kLimitDepth, 4}));
        engines[w] = queue->engine();
        const int buffer_index = queue->RegisterBuffers({{blocks.data(), blocks.size()}}).ok() ? 0 : -1;
        go.wait();
        LL_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path, fopt));
        Status st = file->Allocate(share);
        uint64_t offset = 0;
        size_t next_block = 0;
        {
          IoPump pump(queue.get());
          pump.Fail(st);
          while (pump.status().ok() && offset < share) {
            IoRequest req;
            req.kind = IoRequest::Kind::kWrite;
            req.writer = file.get();
            req.offset = offset;
            req.buffer = blocks.data() + (next_block++ % kLimitDepth) * kBaselineWriteBytes;
            req.buffer_index = buffer_index;
            req.length = static_cast<size_t>(std::min<uint64_t>(kBaselineWriteBytes, share - offset));
            pump.Submit(req).IgnoreError();  // kept in pump.status()
            offset += req.length;
          }
          st = pump.Drain();  // whatever is in flight lands before the blocks are freed
        }
        if (st.ok()) st = file->Sync();
        Status closed = file->Close();
        if (st.ok()) st = closed;
        return st;
      };
      results[w] = run();
    });
  }
  const double t0 = NowSeconds();
  go.count_down();
  for (std::thread& t : threads) t.join();
  WriteLimit limit;
  limit.seconds = NowSeconds() - t0;
  // Outside the timing: on a file system mounted with `discard`, freeing blocks takes a while.
  for (uint32_t w = 0; w < writers; ++w) env->RemoveFile(path_of(w)).IgnoreError();
  for (const Status& st : results)
    if (!st.ok()) return st.Annotate("direct-write limit");
  limit.engine = engines.empty() ? "" : engines[0];
  return limit;
}

struct MemoryCopyFigures {
  unsigned threads = 0;
  double memcpy_seconds = 0;
  double copy_hash_seconds = 0;
};

// Copies every rank's state into a destination of the same size with as many threads as the copy
// engine runs for that rank, claiming `piece`-byte pieces in turn as the engine does: with memcpy
// (the faster of two passes), and with the snapshot's copy-and-hash kernel. The destination is a staging slot of its
// own (the arena's kind of memory), written once before the timed passes, as a reused slot is.
Result<MemoryCopyFigures> MemoryCopyBaseline(const std::vector<RankState>& states, unsigned copy_threads,
                                             uint64_t piece) {
  struct Piece {
    const uint8_t* source;
    uint64_t offset;
    uint64_t length;
  };
  const size_t world = states.size();
  std::vector<std::vector<Piece>> pieces(world);
  std::vector<MappedRegion> destinations;
  std::vector<unsigned> threads_of(world);
  MemoryCopyFigures figures;
  for (size_t r = 0; r < world; ++r) {
    uint64_t at = 0;
    for (const TensorShard& shard : states[r].shards()) {
      const auto* base = static_cast<const uint8_t*>(shard.data);
      for (uint64_t done = 0, n = shard.num_bytes(); done < n; done += piece) {
        const uint64_t len = std::min(piece, n - done);
        pieces[r].push_back({base + done, at, len});
        at += len;
      }
    }
    Result<MappedRegion> destination = SlotMemory(at);
    if (!destination.ok()) return destination.status().Annotate("memcpy baseline");
    destinations.push_back(std::move(destination).value());
    threads_of[r] = static_cast<unsigned>(std::clamp<size_t>(pieces[r].size(), 1, copy_threads));
    figures.threads += threads_of[r];
  }
  std::atomic<uint64_t> sink{0};
  auto pass = [&](bool hash) {
    std::unique_ptr<std::atomic<size_t>[]> next(new std::atomic<size_t>[world]);
    for (size_t r = 0; r < world; ++r) next[r].store(0);
    std::latch go(1);
    std::vector<std::thread> threads;
    for (size_t r = 0; r < world; ++r) {
      for (unsigned t = 0; t < threads_of[r]; ++t) {
        threads.emplace_back([&, r] {
          go.wait();
          uint8_t* dst = destinations[r].data();
          uint64_t local = 0;
          for (size_t i; (i = next[r].fetch_add(1, std::memory_order_relaxed)) < pieces[r].size();) {
            const Piece& p = pieces[r][i];
            if (hash) {
              local ^= CopyAndHash(dst + p.offset, p.source, p.length);
            } else {
              std::memcpy(dst + p.offset, p.source, p.length);
            }
          }
          sink.fetch_xor(local, std::memory_order_relaxed);
        });
      }
    }
    const double t0 = NowSeconds();
    go.count_down();
    for (std::thread& t : threads) t.join();
    return NowSeconds() - t0;
  };
  pass(/*hash=*/false);  // faults the destination in
  figures.memcpy_seconds = pass(/*hash=*/false);
  figures.copy_hash_seconds = pass(/*hash=*/true);
  figures.memcpy_seconds = std::min(figures.memcpy_seconds, pass(/*hash=*/false));
  return figures;
}

// The figures of one save, all ranks together.
struct SaveFigures {
  uint64_t step = 0;
  double seconds = 0;         // release to committed
  double save_return = 0;     // longest time inside Save
  double stall = 0;           // max over ranks of the ticket's stall_seconds
  double snapshot = 0;        // max over ranks
  double persist = 0;         // max over ranks
  // Where the time inside Save went (SaveStallBreakdown), max over ranks: the per-tensor parts.
  double plan = 0;
  double stage = 0;
  double submit = 0;
  uint64_t bytes_total = 0;   // all ranks
  uint64_t bytes_stored = 0;  // all ranks
  bool staged = true;
  bool memory_tier = true;
  double copy_gbps() const { return Gbps(bytes_total, snapshot); }
};

// Element-wise median of the figures (step and flags of the last one).
SaveFigures MedianFigures(const std::vector<SaveFigures>& all) {
  SaveFigures m = all.back();
  auto median = [&](double SaveFigures::*field) {
    std::vector<double> v;
    for (const SaveFigures& f : all) v.push_back(f.*field);
    return Median(std::move(v));
  };
  m.seconds = median(&SaveFigures::seconds);
  m.save_return = median(&SaveFigures::save_return);
  m.stall = median(&SaveFigures::stall);
  m.snapshot = median(&SaveFigures::snapshot);
  m.persist = median(&SaveFigures::persist);
  m.plan = median(&SaveFigures::plan);
  m.stage = median(&SaveFigures::stage);
  m.submit = median(&SaveFigures::submit);
  return m;
}

nlohmann::json FiguresJson(const SaveFigures& f, uint64_t bytes) {
  return {{"step", f.step},
          {"seconds", f.seconds},
          {"gbps", Gbps(bytes, f.seconds)},
          {"save_return_ms", f.save_return * 1e3},
          {"stall_ms", f.stall * 1e3},
          {"snapshot_ms", f.snapshot * 1e3},
          {"persist_ms", f.persist * 1e3},
          {"plan_ms", f.plan * 1e3},
          {"stage_ms", f.stage * 1e3},
          {"submit_ms", f.submit * 1e3},
          {"copy_gbps", f.copy_gbps()},
          {"staged", f.staged},
          {"memory_tier", f.memory_tier}};
}

// The `step` tensor holds the step number (synthetic_model.h); every rank has it.
void SetStepTensor(const RankState& state, uint64_t step) {
  for (const TensorShard& shard : state.shards()) {
    if (shard.name == kStepTensorName && shard.data != nullptr) std::memcpy(shard.data, &step, sizeof(step));
  }
}

int RunSave(const SaveOptions& o) {
  const char* kCommand = "bench save";
  auto layout = ResolveLayout(o);
  if (!layout.ok()) return ReportFailure(kCommand, layout.status(), o.json);
  if (o.iterations == 0) {
    return ReportFailure(kCommand, Status::InvalidArgument("--iterations must be at least 1"), o.json);
  }
  auto state_bytes = ParseByteSize(o.state_bytes);
  if (!state_bytes.ok()) return ReportFailure(kCommand, state_bytes.status().Annotate("--state-bytes"), o.json);
  auto shape = ChooseModelShape(*state_bytes, o.hidden);
  if (!shape.ok()) return ReportFailure(kCommand, shape.status(), o.json);
  const uint64_t first_step = o.step >= 0 ? static_cast<uint64_t>(o.step) : 100;
  const uint32_t world = layout->world_size();
  auto base_options = MakeCheckpointerOptions(o, world, NewRunId());
  if (!base_options.ok()) return ReportFailure(kCommand, base_options.status(), o.json);
  if (Status s = ApplyBenchSaveTuning(o.tuning, &*base_options); !s.ok()) return ReportFailure(kCommand, s, o.json);
  // Retention is applied by the bench between saves, outside the timing (see the header).
  base_options->keep_last = 0;
  const unsigned iterations = o.iterations;
  // A save older than the newest complete step would be removed by retention as soon as it commits.
  if (Env::Default()->IsDirectory(o.dir)) {
    auto existing = ScanCheckpointDirectory(o.dir);
    if (!existing.ok()) return ReportFailure(kCommand, existing.status(), o.json);
    for (const CheckpointInfo& c : *existing) {
      if (c.complete && c.step >= first_step) {
        return ReportFailure(kCommand,
                             Status::AlreadyExists(o.dir, "holds step " + std::to_string(c.step) +
                                                              "; pick a --step above it or another --dir"),
                             o.json);
      }
    }
  }

  std::vector<ModelTensor> tensors;
  uint64_t unique_bytes = 0;
  if (o.many_tensors > 0) {
    auto per_tensor = ParseByteSize(o.tensor_bytes);
    if (!per_tensor.ok()) return ReportFailure(kCommand, per_tensor.status().Annotate("--tensor-bytes"), o.json);
    tensors = ManyTensors(o.many_tensors, *per_tensor, *layout);
    for (const ModelTensor& t : tensors)
      unique_bytes += t.num_bytes();  // each written once: the TP boxes' replicas and `step`
  } else {
    tensors = ModelTensors(*shape);
    unique_bytes = ModelBytes(*shape);
  }
  // The many-tensor model is described by its own metadata (`bench load` reads only the transformer).
  auto metadata = [&](uint64_t step) {
    if (o.many_tensors == 0) return ModelMetadataJson(*shape, *layout, step);
    return nlohmann::json{{"model", "lifeline-many-tensors"}, {"tensors", o.many_tensors}, {"tp", layout->tp},
                          {"dp", layout->dp}, {"step", step}}
        .dump();
  };

  // The limit is measured before the saves and again after them: this kind of disk slows down for
  // a while after blocks are freed, and retention frees some during the saves.
  std::optional<WriteLimit> limit_before;
  if (!o.no_baseline) {
    if (Status s = Env::Default()->CreateDir(o.dir); !s.ok()) return ReportFailure(kCommand, s, o.json);
    QuiesceFileSystem(o.dir);
    auto l = DirectWriteLimit(o.dir, unique_bytes, world, base_options->direct_io);
    if (!l.ok()) return ReportFailure(kCommand, l.status(), o.json);
    limit_before = *l;
  }

  // The main thread and every rank meet twice per save: at the release and once the rank's part is
  // persisted. Rank 0's ticket is then waited on for the commit by the main thread.
  std::barrier sync(static_cast<std::ptrdiff_t>(world) + 1);
  std::atomic<bool> failed{false};
  std::vector<Status> rank_status(world);
  std::vector<std::vector<double>> in_save(world, std::vector<double>(iterations));
  std::vector<std::vector<SaveProgress>> progress(world, std::vector<SaveProgress>(iterations));
  std::vector<SaveTicket> rank0_tickets(iterations);
  std::vector<std::unique_ptr<Checkpointer>> checkpointers(world);
  std::vector<RankState> states(world);

  const double prepare_start = NowSeconds();
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Status& status = rank_status[r];
      status = OpenSimulatedRank(*base_options, tensors, *layout, r, first_step, /*fill=*/true, &checkpointers[r],
                                 &states[r]);
      if (status.ok() && !o.cold) {  // as a job does at start-up: staging slots reserved and faulted in
        SaveRequest request;
        request.tensors = states[r].shards();
        request.objects = {{"rng", RngObject(r, first_step)}, {"dataloader", DataloaderObject(r, first_step)}};
        request.metadata_json = metadata(first_step);
        if (Status s = checkpointers[r]->PrepareStaging(request); !s.ok() && s.code() != StatusCode::kFailedPrecondition)
          status = s;  // FailedPrecondition: larger than a slot, the saves stream
      }
      if (!status.ok()) failed.store(true);
      for (unsigned it = 0; it < iterations; ++it) {
        const uint64_t step = first_step + it;
        SaveRequest request;
        if (status.ok()) {
          SetStepTensor(states[r], step);
          request.tensors = states[r].shards();
          request.objects = {{"rng", RngObject(r, step)}, {"dataloader", DataloaderObject(r, step)}};
          request.metadata_json = metadata(step);
        }
        sync.arrive_and_wait();  // released
        if (status.ok() && !failed.load()) {
          const double t0 = NowSeconds();
          SaveTicket ticket = checkpointers[r]->Save(step, request);
          in_save[r][it] = NowSeconds() - t0;
          Status st = ticket.WaitSnapshot();
          if (st.ok()) st = ticket.WaitPersisted();
          progress[r][it] = ticket.Progress();
          if (r == 0) rank0_tickets[it] = ticket;
          if (!st.ok()) {
            status = st;
            failed.store(true);
          }
        }
        sync.arrive_and_wait();  // persisted (or failed)
      }
    });
  }

  Status commit_failure;
  std::vector<SaveFigures> figures;
  std::vector<double> retention_seconds;
  double prepare_seconds = 0;
  auto apply_retention = [&] {
    if (o.keep_last == 0 || failed.load()) return;
    const double t0 = NowSeconds();
    // What the Checkpointers' own retention would do (see the header): keep_last loadable by their
    // metadata, partial steps of other launches stale.
    RetentionOptions retention;
    retention.keep_last = o.keep_last;
    retention.verify = false;
    retention.saving_run_id = base_options->run_id;
    Status s = ApplyRetention(o.dir, retention);
    retention_seconds.push_back(NowSeconds() - t0);
    if (!s.ok() && commit_failure.ok()) commit_failure = s.Annotate("retention between saves");
  };
  for (unsigned it = 0; it < iterations; ++it) {
    if (it > 0) apply_retention();
    QuiesceFileSystem(o.dir);  // nor the writeback or block freeing of what ran before
    sync.arrive_and_wait();
    const double t0 = NowSeconds();
    if (it == 0) prepare_seconds = t0 - prepare_start;
    sync.arrive_and_wait();
    if (!failed.load()) {
      commit_failure = rank0_tickets[it].WaitCommitted(kCommitTimeoutSeconds);
      if (!commit_failure.ok()) failed.store(true);
    }
    SaveFigures f;
    f.step = first_step + it;
    f.seconds = NowSeconds() - t0;
    for (uint32_t r = 0; r < world; ++r) {
      const SaveProgress& p = progress[r][it];
      f.save_return = std::max(f.save_return, in_save[r][it]);
      f.stall = std::max(f.stall, p.stall_seconds);
      f.snapshot = std::max(f.snapshot, p.snapshot_seconds);
      f.persist = std::max(f.persist, p.persist_seconds);
      f.plan = std::max(f.plan, p.stall_breakdown.plan_seconds);
      f.stage = std::max(f.stage, p.stall_breakdown.stage_seconds);
      f.submit = std::max(f.submit, p.stall_breakdown.submit_seconds);
      f.bytes_total += p.bytes_total;
      f.bytes_stored += p.bytes_stored;
      f.staged = f.staged && p.staged;
      f.memory_tier = f.memory_tier && p.memory_tier;
    }
    figures.push_back(f);
  }
  for (std::thread& t : threads) t.join();
  const size_t states_tensors_per_rank = states.empty() ? 0 : states[0].shards().size();
  apply_retention();

  Status failure;
  for (uint32_t r = 0; r < world && failure.ok(); ++r)
    if (!rank_status[r].ok()) failure = rank_status[r].Annotate("rank " + std::to_string(r));
  if (failure.ok()) failure = commit_failure;
  if (!failure.ok()) {
    if (failure.IsAlreadyExists()) failure = Status::AlreadyExists(failure.message(), "pick another --step or --dir");
    return ReportFailure(kCommand, failure, o.json);
  }
  const uint64_t last_step = first_step + iterations - 1;
  uint64_t bytes_on_disk = 0;
  if (auto steps = checkpointers[0]->List(); steps.ok()) {
    for (const CheckpointInfo& c : *steps) {
      if (c.step == last_step) bytes_on_disk = c.bytes;
    }
  }
  const CheckpointerOptions used = checkpointers[0]->options();
  checkpointers.clear();  // every save is persisted: this only stops their threads

  // Steady state: the saves that reuse a staging slot (the first `slots` saves each fill a fresh
  // one); with too few iterations for that, those after the first.
  const SaveFigures& first = figures.front();
  const unsigned warm_from = std::min<unsigned>(used.staging_slots, iterations - 1);
  const SaveFigures steady =
      iterations > 1 ? MedianFigures(std::vector<SaveFigures>(figures.begin() + warm_from, figures.end())) : first;
  const unsigned steady_iterations = iterations > 1 ? iterations - warm_from : 1;

  std::optional<MemoryCopyFigures> memory;
  std::optional<double> baseline_seconds;
  std::optional<WriteLimit> limit;
  if (!o.no_baseline) {
    auto m = MemoryCopyBaseline(states, used.copy_threads,
                                used.chunk_bytes != 0 ? used.chunk_bytes : DefaultChunkBytes(used.codec));
    if (!m.ok()) return ReportFailure(kCommand, m.status(), o.json);
    memory = *m;
    states.clear();  // give the memory back before the disk baselines run
    QuiesceFileSystem(o.dir);
    auto b = BufferedWriteBaseline(o.dir, unique_bytes);
    if (!b.ok()) return ReportFailure(kCommand, b.status(), o.json);
    baseline_seconds = *b;
    QuiesceFileSystem(o.dir);
    auto l = DirectWriteLimit(o.dir, unique_bytes, world, used.direct_io);
    if (!l.ok()) return ReportFailure(kCommand, l.status(), o.json);
    limit = *l;
  }
  // The device's best in this run.
  const double limit_seconds = limit ? std::min(limit->seconds, limit_before->seconds) : 0;

  const double gbps = Gbps(unique_bytes, steady.seconds);
  const bool coded = used.codec != SaveCodec::kNone;
  const double compression_ratio =
      steady.bytes_stored > 0 ? static_cast<double>(steady.bytes_total) / static_cast<double>(steady.bytes_stored) : 0;
  const double memcpy_gbps = memory ? Gbps(steady.bytes_total, memory->memcpy_seconds) : 0;
  const double copy_hash_gbps = memory ? Gbps(steady.bytes_total, memory->copy_hash_seconds) : 0;
  const double limit_gbps = limit ? Gbps(unique_bytes, limit_seconds) : 0;
  if (o.json) {
    nlohmann::json j = {{"ok", true},
                        {"command", kCommand},
                        {"dir", o.dir},
                        {"step", last_step},
                        {"first_step", first_step},
                        {"last_step", last_step},
                        {"iterations", iterations},
                        {"steady_iterations", steady_iterations},
                        {"ranks", world},
                        {"tp", layout->tp},
                        {"dp", layout->dp},
                        {"hidden", shape->hidden},
                        {"layers", shape->layers},
                        {"tensors", tensors.size()},
                        {"tensors_per_rank", states_tensors_per_rank},
                        {"bytes", unique_bytes},
                        {"bytes_on_disk", bytes_on_disk},
                        {"seconds", steady.seconds},
                        {"gbps", gbps},
                        {"save_return_ms", steady.save_return * 1e3},
                        {"stall_ms", steady.stall * 1e3},
                        {"snapshot_ms", steady.snapshot * 1e3},
                        {"persist_ms", steady.persist * 1e3},
                        {"copy_gbps", steady.copy_gbps()},
                        {"persist_gbps", Gbps(unique_bytes, steady.persist)},
                        {"staged", steady.staged},
                        {"memory_tier", steady.memory_tier},
                        {"first_seconds", first.seconds},
                        {"first_gbps", Gbps(unique_bytes, first.seconds)},
                        {"first_stall_ms", first.stall * 1e3},
                        {"first_snapshot_ms", first.snapshot * 1e3},
                        {"first_persist_ms", first.persist * 1e3},
                        {"bytes_total", steady.bytes_total},
                        {"bytes_stored", steady.bytes_stored},
                        {"codec", SaveCodecName(used.codec)},
                        {"column_blocks", used.column_blocks},
                        {"copy_threads", used.copy_threads},
                        {"staging_slots", used.staging_slots},
                        {"staging_budget_bytes", used.staging_budget_bytes},
                        {"keep_last", o.keep_last},
                        {"retention_ms", Median(retention_seconds) * 1e3},
                        {"prepare_seconds", prepare_seconds},
                        {"direct_io", used.direct_io}};
    nlohmann::json per_iteration = nlohmann::json::array();
    for (const SaveFigures& f : figures) per_iteration.push_back(FiguresJson(f, unique_bytes));
    j["per_iteration"] = std::move(per_iteration);
    if (coded) j["compression_ratio"] = compression_ratio;
    if (memory) {
      j["memcpy_threads"] = memory->threads;
      j["memcpy_gbps"] = memcpy_gbps;
      j["copy_hash_gbps"] = copy_hash_gbps;
      // A streamed snapshot is not a copy: its "snapshot" is the write to disk.
      if (steady.staged) j["copy_ratio_to_memcpy"] = memcpy_gbps > 0 ? steady.copy_gbps() / memcpy_gbps : 0;
      j["baseline_seconds"] = *baseline_seconds;
      j["baseline_gbps"] = Gbps(unique_bytes, *baseline_seconds);
      j["speedup_vs_buffered"] = *baseline_seconds / steady.seconds;
      j["limit_seconds"] = limit_seconds;
      j["limit_gbps"] = limit_gbps;
      j["limit_gbps_before"] = Gbps(unique_bytes, limit_before->seconds);
      j["limit_gbps_after"] = Gbps(unique_bytes, limit->seconds);
      j["limit_engine"] = limit->engine;
      j["ratio_to_limit"] = limit_gbps > 0 ? gbps / limit_gbps : 0;
    }
    PrintJson(j);
  } else {
    const std::string which = steady_iterations > 1
                                  ? "median of saves " + std::to_string(warm_from + 1) + "-" + std::to_string(iterations)
                                  : "save " + std::to_string(iterations);
    std::cout << "saved steps " << first_step << ".." << last_step << " of the synthetic model ("
              << (o.many_tensors > 0 ? std::string("many small tensors")
                                     : "hidden " + std::to_string(shape->hidden) + ", " +
                                           std::to_string(shape->layers) + " layers")
              << ", " << tensors.size() << " tensors, " << states_tensors_per_rank << " on rank 0) from "
              << Ranks(world) << " (tp "
              << layout->tp << " x dp " << layout->dp << ") into " << o.dir << "\n"
              << "  codec " << SaveCodecName(used.codec) << ", " << used.copy_threads << " copy threads per rank, "
              << used.staging_slots << " staging slots" << (used.memory_tier ? ", memory tier" : "")
              << (steady.staged ? "" : "; NOT STAGED (streamed: too large for a slot)") << "\n"
              << "  lifeline save (" << which << ")  " << FormatByteSize(unique_bytes) << " in "
              << Fixed(steady.seconds, 3) << " s = " << Fixed(gbps, 2) << " GB/s, Save to committed ("
              << FormatByteSize(bytes_on_disk) << " on disk";
    if (coded) std::cout << ", compression " << Fixed(compression_ratio, 2) << "x";
    std::cout << ")\n"
              << "    Save returned in       " << Fixed(steady.save_return * 1e3, 2) << " ms\n"
              << "    caller blocked (stall) " << Fixed(steady.stall * 1e3, 1) << " ms (first save "
              << Fixed(first.stall * 1e3, 1) << " ms)\n"
              << (steady.staged ? "    snapshot copied        " : "    snapshot streamed      ")
              << Fixed(steady.snapshot * 1e3, 1) << " ms = " << Fixed(steady.copy_gbps(), 2) << " GB/s (first save "
              << Fixed(first.snapshot * 1e3, 1) << " ms)\n"
              << "    persisted              " << Fixed(steady.persist * 1e3, 1) << " ms (first save "
              << Fixed(first.persist * 1e3, 1) << " ms)\n";
    if (memory) {
      std::cout << "  memcpy, same bytes       " << Fixed(memcpy_gbps, 2) << " GB/s on " << memory->threads
                << " threads (copy+hash kernel " << Fixed(copy_hash_gbps, 2) << " GB/s)";
      if (steady.staged) {
        std::cout << "; the snapshot copies at " << Fixed(100.0 * steady.copy_gbps() / memcpy_gbps, 0)
                  << "% of memcpy";
      }
      std::cout << "\n"
                << "  buffered write + fsync   " << FormatByteSize(unique_bytes) << " in " << Fixed(*baseline_seconds, 3)
                << " s = " << Fixed(Gbps(unique_bytes, *baseline_seconds), 2) << " GB/s; speedup vs buffered "
                << Fixed(*baseline_seconds / steady.seconds, 2) << "x\n"
                << "  limit: raw O_DIRECT      " << FormatByteSize(unique_bytes) << " in " << Fixed(limit_seconds, 3)
                << " s = " << Fixed(limit_gbps, 2) << " GB/s, the better of before ("
                << Fixed(Gbps(unique_bytes, limit_before->seconds), 2) << ") and after ("
                << Fixed(Gbps(unique_bytes, limit->seconds), 2) << ") the saves (" << limit->engine << ", 8 MiB blocks, " << kLimitDepth << " in flight per rank); lifeline reaches "
                << Fixed(100.0 * gbps / limit_gbps, 0) << "% of it\n";
    }
  }
  return kExitOk;
}

// Checks the per-rank objects a load returned against what rank `saved_rank` saved.
void CheckObjects(const LoadResult& result, uint32_t saved_rank, uint64_t step, RankOutcome* out) {
  const std::pair<std::string, std::string> expected[] = {{"rng", RngObject(saved_rank, step)},
                                                          {"dataloader", DataloaderObject(saved_rank, step)}};
  for (const auto& [name, bytes] : expected) {
    ++out->objects_checked;
    auto it = std::find_if(result.objects.begin(), result.objects.end(),
                           [&name](const auto& kv) { return kv.first == name; });
    if (it == result.objects.end() || it->second != bytes) ++out->object_mismatches;
  }
}

// How the page cache was emptied of the data files before a measured read.
struct CacheDrop {
  std::string method;           // "drop_caches" (the whole page cache), "fadvise" (the files' pages), "none"
  uint64_t resident_bytes = 0;  // of the files, still cached afterwards (mincore)
  std::string problem;          // why the cache could not be dropped; empty when it was
  bool cold() const { return problem.empty() && resident_bytes == 0; }
};

// Bytes of the files now in the page cache (mincore over a read-only mapping of each).
uint64_t ResidentBytes(const std::vector<std::string>& paths) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t total = 0;
  std::vector<unsigned char> resident;
  for (const std::string& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      const size_t bytes = static_cast<size_t>(st.st_size);
      void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        resident.assign((bytes + page - 1) / page, 0);
        if (::mincore(map, bytes, resident.data()) == 0) {
          for (unsigned char r : resident) total += (r & 1) ? page : 0;
        }
        ::munmap(map, bytes);
      }
    }
    ::close(fd);
  }
  return total;
}

// Drops the files' pages from the page cache: posix_fadvise(DONTNEED) on each (allowed to anyone
// who can open them), and counts with mincore the bytes still cached. Only when some stayed (pages
// mapped by another process, a file system that ignores the advice) is the whole machine's page
// cache dropped, through /proc/sys/vm/drop_caches where writable (root outside a container), and
// counted again: that drop costs every other process on the machine its cached files, so it is the
// last resort, not the rule. A drop that did not happen is reported rather than assumed. A cache
// below the guest (a virtual disk's host) is out of reach.
CacheDrop DropPageCache(const std::vector<std::string>& paths) {
  CacheDrop drop;
  std::string unopened, not_advised;  // the last file that could not be opened, or advised
  for (const std::string& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      unopened = path + ": " + std::strerror(errno);
      continue;
    }
    if (const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); rc != 0)
      not_advised = path + ": posix_fadvise(DONTNEED): " + std::strerror(rc);
    ::close(fd);
  }
  const bool advised = unopened.empty() && not_advised.empty();
  drop.method = advised ? "fadvise" : "none";
  drop.resident_bytes = ResidentBytes(paths);
  if (!advised || drop.resident_bytes > 0) {
    if (const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC); fd >= 0) {
      if (::write(fd, "1", 1) == 1) {
        drop.method = "drop_caches";
        drop.resident_bytes = ResidentBytes(paths);
        not_advised.clear();  // the whole cache went: the advice no longer matters
      }
      ::close(fd);
    }
  }
  drop.problem = !unopened.empty() ? unopened : not_advised;
  if (drop.problem.empty() && drop.resident_bytes > 0)
    drop.problem = FormatByteSize(drop.resident_bytes) + " of the data files stayed in the page cache";
  return drop;
}

// One way of reading the data files raw for the read limit.
struct ReadLimitSetting {
  uint64_t block_bytes;
  unsigned depth;  // requests in flight per reader thread
};
// The settings tried; the best counts. Readers: one thread per data file (at most
// kMaxLimitReaders, each then streaming several files in turn).
constexpr ReadLimitSetting kReadLimitSettings[] = {{8ull << 20, 16}, {1ull << 20, 64}};
constexpr uint32_t kMaxLimitReaders = 8;

struct ReadLimit {
  double seconds = 0;
  std::string engine;
};

// The device's read limit for these files, measured as fio would (sequential, O_DIRECT, deep
// queue) with the library's I/O engine: the whole of every file, `setting.block_bytes` per
// request, `setting.depth` in flight per reader, into registered buffers of the staging arena's
// kind. No checksum, no copy, no planning: what a load of these bytes could take at best.
Result<ReadLimit> DirectReadLimit(const std::vector<FileDescription>& files, const std::string& step_dir,
                                  const ReadLimitSetting& setting, bool direct_io) {
  Env* env = Env::Default();
  const uint32_t readers = std::clamp<uint32_t>(static_cast<uint32_t>(files.size()), 1, kMaxLimitReaders);
  std::vector<Status> results(readers);
  std::vector<std::string> engines(readers);
  std::latch ready(readers);
  std::latch go(1);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < readers; ++w) {
    threads.emplace_back([&, w] {
      bool arrived = false;
      auto run = [&]() -> Status {
        // No more blocks than this reader has requests to make: small files need no 128 MiB of
        // prefaulted buffers (which cost more than their reads).
        uint64_t requests = 0;
        for (size_t f = w; f < files.size(); f += readers)
          requests += (files[f].size + setting.block_bytes - 1) / setting.block_bytes;
        const unsigned depth = static_cast<unsigned>(std::clamp<uint64_t>(requests, 1, setting.depth));
        const uint64_t region_bytes = depth * setting.block_bytes;
        LL_ASSIGN_OR_RETURN(MappedRegion blocks, SlotMemory(region_bytes));
        blocks.Prefault();
        LL_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue, env->NewIoQueue(IoQueueOptions{depth, 4}));
        engines[w] = queue->engine();
        const int buffer_index = queue->RegisterBuffers({{blocks.data(), blocks.size()}}).ok() ? 0 : -1;
        FileOptions fopt;
        fopt.direct_io = direct_io;
        std::vector<std::unique_ptr<RandomAccessFile>> mine;
        std::vector<uint64_t> sizes;
        for (size_t f = w; f < files.size(); f += readers) {
          LL_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                              env->NewRandomAccessFile(JoinPath(step_dir, files[f].name), fopt));
          mine.push_back(std::move(file));
          sizes.push_back(files[f].size);
        }
        ready.count_down();
        arrived = true;
        go.wait();
        std::vector<size_t> free_blocks;
        for (size_t b = 0; b < depth; ++b) free_blocks.push_back(b);
        IoPump pump(queue.get(), [&](const IoCompletion& c) { free_blocks.push_back(static_cast<size_t>(c.tag)); });
        size_t file = 0;
        uint64_t offset = 0;
        while (pump.status().ok() && file < mine.size()) {
          if (offset >= sizes[file]) {
            ++file;
            offset = 0;
            continue;
          }
          if (free_blocks.empty()) {
            pump.WaitSome().IgnoreError();  // kept in pump.status()
            continue;
          }
          IoRequest req;
          req.kind = IoRequest::Kind::kRead;
          req.reader = mine[file].get();
          req.offset = offset;
          req.tag = free_blocks.back();
          free_blocks.pop_back();
          req.buffer = blocks.data() + req.tag * setting.block_bytes;
          req.buffer_index = buffer_index;
          req.length = static_cast<size_t>(std::min<uint64_t>(setting.block_bytes, sizes[file] - offset));
          pump.Submit(req).IgnoreError();
          offset += req.length;
        }
        // Whatever is still in flight after an error lands before the blocks are freed.
        Status st = pump.Drain();
        return st;
      };
      results[w] = run();
      if (!arrived) ready.count_down();
    });
  }
  ready.wait();
  const double t0 = NowSeconds();
  go.count_down();
  for (std::thread& t : threads) t.join();
  ReadLimit limit;
  limit.seconds = NowSeconds() - t0;
  for (const Status& st : results)
    if (!st.ok()) return st.Annotate("direct-read limit");
  limit.engine = engines[0];
  return limit;
}

struct LoadOptions : CommonOptions {
  unsigned iterations = 3;
  bool no_baseline = false;
};

// One measured load (all ranks) and the read limit measured right after it.
struct LoadIteration {
  double seconds = 0;
  uint64_t bytes_read = 0;
  double limit_seconds = 0;  // the best setting's; 0 without a baseline
  size_t limit_setting = 0;  // index into kReadLimitSettings
  CacheDrop cache;           // before the load
};

int RunLoad(const LoadOptions& o) {
  const char* kCommand = "bench load";
  if (o.iterations == 0) {
    return ReportFailure(kCommand, Status::InvalidArgument("--iterations must be at least 1"), o.json);
  }
  auto layout = ResolveLayout(o);
  if (!layout.ok()) return ReportFailure(kCommand, layout.status(), o.json);
  const std::optional<uint64_t> want_step = o.step >= 0 ? std::optional<uint64_t>(o.step) : std::nullopt;
  uint64_t step = 0;
  uint32_t saved_world = 0;
  uint32_t objects_world = 0;
  ModelShape shape;
  std::string step_dir;
  std::vector<FileDescription> data_files;
  {
    auto described = DescribeCheckpoint(o.dir, want_step);
    if (!described.ok()) return ReportFailure(kCommand, described.status(), o.json);
    step = described->step;
    saved_world = described->world_size;
    step_dir = described->directory;
    data_files = described->files;
    // The objects were saved by the ranks of the job the metadata names; a resharded checkpoint
    // keeps them under those ranks.
    if (const uint32_t w = MetadataWorldSize(described->metadata_json); w != 0) objects_world = w;
    else objects_world = saved_world;
    auto parsed = ParseModelMetadata(described->metadata_json);
    if (!parsed.ok()) return ReportFailure(kCommand, parsed.status().Annotate(described->directory), o.json);
    shape = *parsed;
    // The targets are allocated from the metadata's description: it must be what the checkpoint holds.
    std::vector<ModelTensor> stored;
    for (const TensorDescription& t : described->tensors)
      stored.push_back(ModelTensor{t.name, t.dtype, t.shape});
    const Status matches = CheckModelTensors(shape, stored);
    if (!matches.ok()) return ReportFailure(kCommand, matches.Annotate(described->directory), o.json);
  }
  if (o.hidden_option != nullptr && o.hidden_option->count() > 0 && o.hidden != shape.hidden) {
    return ReportFailure(kCommand,
                         Status::InvalidArgument("--hidden " + std::to_string(o.hidden) + " but step " +
                                                 std::to_string(step) + " was saved with hidden " +
                                                 std::to_string(shape.hidden)),
                         o.json);
  }
  const uint32_t world = layout->world_size();
  auto base_options = MakeCheckpointerOptions(o, world, "");
  if (!base_options.ok()) return ReportFailure(kCommand, base_options.status(), o.json);
  const std::vector<ModelTensor> tensors = ModelTensors(shape);
  std::vector<std::string> data_paths;
  uint64_t data_file_bytes = 0;
  for (const FileDescription& f : data_files) {
    data_paths.push_back(JoinPath(step_dir, f.name));
    data_file_bytes += f.size;
  }

  // The rank threads live through every iteration; between two barriers the main thread empties
  // the page cache and measures the read limit while they wait.
  const double prepare_start = NowSeconds();
  std::vector<RankOutcome> outcomes(world);
  std::vector<std::vector<RankOutcome>> per_iteration(o.iterations, std::vector<RankOutcome>(world));
  std::latch ready(world);
  std::barrier start(world + 1), finish(world + 1);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Checkpointer> ckpt;
      RankState state;
      Status opened = OpenSimulatedRank(*base_options, tensors, *layout, r, step, /*fill=*/false, &ckpt, &state);
      const uint32_t objects_rank = objects_world > 0 ? r % objects_world : r;
      LoadRequest request;
      request.tensors = state.shards();
      request.objects_of_rank = objects_rank;
      outcomes[r].status = opened;
      ready.count_down();
      for (unsigned it = 0; it < o.iterations; ++it) {
        start.arrive_and_wait();
        if (stop.load()) break;
        RankOutcome& out = per_iteration[it][r];
        out.target_bytes = state.bytes();
        if (opened.ok()) {
          auto result = ckpt->Load(step, request);
          out.finished = NowSeconds();
          if (!result.ok()) {
            out.status = result.status();
          } else {
            out.bytes_read = result->bytes_read;
            // Outside the timing: the main thread waits for every rank's Load before this.
            out.mismatches = state.CountMismatches(step);
            CheckObjects(*result, objects_rank, step, &out);
          }
        } else {
          out.status = opened;
        }
        finish.arrive_and_wait();
      }
    });
  }
  ready.wait();
  const double prepare_seconds = NowSeconds() - prepare_start;
  std::vector<LoadIteration> iterations;
  Status failure = FirstFailure(outcomes);
  std::string limit_engine;
  unsigned started = 0;  // iterations the rank threads were released into
  for (unsigned it = 0; it < o.iterations && failure.ok(); ++it) {
    LoadIteration figures;
    figures.cache = DropPageCache(data_paths);
    const double t0 = NowSeconds();
    ++started;
    start.arrive_and_wait();
    finish.arrive_and_wait();
    failure = FirstFailure(per_iteration[it]);
    if (!failure.ok()) break;
    double finished = t0;
    for (const RankOutcome& out : per_iteration[it]) {
      finished = std::max(finished, out.finished);
      figures.bytes_read += out.bytes_read;
    }
    figures.seconds = finished - t0;
    if (!o.no_baseline) {
      for (size_t k = 0; k < std::size(kReadLimitSettings); ++k) {
        DropPageCache(data_paths);
        auto limit = DirectReadLimit(data_files, step_dir, kReadLimitSettings[k], base_options->direct_io);
        if (!limit.ok()) {
          failure = limit.status();
          break;
        }
        limit_engine = limit->engine;
        if (figures.limit_seconds == 0 || limit->seconds < figures.limit_seconds) {
          figures.limit_seconds = limit->seconds;
          figures.limit_setting = k;
        }
      }
    }
    iterations.push_back(figures);
  }
  if (started < o.iterations) {  // the ranks wait at the next start: release them to leave
    stop.store(true);
    start.arrive_and_wait();
  }
  for (std::thread& t : threads) t.join();
  if (!failure.ok()) return ReportFailure(kCommand, failure, o.json);

  uint64_t target_bytes = 0, mismatches = 0, objects_checked = 0, object_mismatches = 0;
  // Every load is checked; each figure is that of one load, the worst one.
  for (const std::vector<RankOutcome>& ranks : per_iteration) {
    uint64_t elements = 0, checked = 0, objects = 0;
    for (const RankOutcome& out : ranks) {
      elements += out.mismatches;
      checked += out.objects_checked;
      objects += out.object_mismatches;
    }
    mismatches = std::max(mismatches, elements);
    objects_checked = std::max(objects_checked, checked);
    object_mismatches = std::max(object_mismatches, objects);
  }
  for (const RankOutcome& out : per_iteration.back()) target_bytes += out.target_bytes;
  const uint64_t bytes_read = iterations.back().bytes_read;
  std::vector<double> seconds_all, read_gbps_all, limit_gbps_all;
  bool cold = true;
  std::string cache_method, cache_problem;
  for (const LoadIteration& f : iterations) {
    seconds_all.push_back(f.seconds);
    read_gbps_all.push_back(Gbps(f.bytes_read, f.seconds));
    if (!o.no_baseline) limit_gbps_all.push_back(Gbps(data_file_bytes, f.limit_seconds));
    cold = cold && f.cache.cold();
    cache_method = f.cache.method;
    if (!f.cache.problem.empty()) cache_problem = f.cache.problem;
  }
  const double seconds = Median(seconds_all);
  const double read_gbps = Median(read_gbps_all);
  const double limit_gbps = Median(limit_gbps_all);
  const double ratio = limit_gbps > 0 ? read_gbps / limit_gbps : 0;
  // The setting that won most often.
  std::vector<unsigned> wins(std::size(kReadLimitSettings), 0);
  for (const LoadIteration& f : iterations) ++wins[f.limit_setting];
  const ReadLimitSetting& best =
      kReadLimitSettings[std::max_element(wins.begin(), wins.end()) - wins.begin()];
  const bool ok = mismatches == 0 && object_mismatches == 0;
  if (o.json) {
    nlohmann::json j = {{"ok", ok},
                        {"command", kCommand},
                        {"dir", o.dir},
                        {"step", step},
                        {"ranks", world},
                        {"tp", layout->tp},
                        {"dp", layout->dp},
                        {"saved_world_size", saved_world},
                        {"hidden", shape.hidden},
                        {"layers", shape.layers},
                        {"bytes", target_bytes},
                        {"unique_bytes", ModelBytes(shape)},
                        {"bytes_read", bytes_read},
                        {"read_amplification", target_bytes > 0 ? static_cast<double>(bytes_read) / target_bytes : 0},
                        {"iterations", iterations.size()},
                        {"seconds", seconds},
                        {"gbps", Gbps(target_bytes, seconds)},
                        {"read_gbps", read_gbps},
                        {"mismatches", mismatches},
                        {"objects_checked", objects_checked},
                        {"object_mismatches", object_mismatches},
                        {"cold_cache", cold},
                        {"cache_drop", cache_method},
                        {"prepare_seconds", prepare_seconds},
                        {"direct_io", base_options->direct_io}};
    if (!cache_problem.empty()) j["cache_drop_problem"] = cache_problem;
    nlohmann::json each = nlohmann::json::array();
    for (const LoadIteration& f : iterations) {
      nlohmann::json e = {{"seconds", f.seconds},
                          {"gbps", Gbps(target_bytes, f.seconds)},
                          {"read_gbps", Gbps(f.bytes_read, f.seconds)},
                          {"cache_resident_bytes", f.cache.resident_bytes}};
      if (!o.no_baseline) e["limit_gbps"] = Gbps(data_file_bytes, f.limit_seconds);
      each.push_back(std::move(e));
    }
    j["per_iteration"] = std::move(each);
    if (!o.no_baseline) {
      j["limit_bytes"] = data_file_bytes;
      j["limit_gbps"] = limit_gbps;
      j["limit_engine"] = limit_engine;
      j["limit_block_bytes"] = best.block_bytes;
      j["limit_depth"] = best.depth;
      j["limit_readers"] = std::clamp<uint32_t>(static_cast<uint32_t>(data_files.size()), 1, kMaxLimitReaders);
      j["ratio_to_limit"] = ratio;
    }
    PrintJson(j);
  } else {
    const std::string which =
        iterations.size() > 1 ? "median of " + std::to_string(iterations.size()) + " loads" : "one load";
    std::cout << "loaded step " << step << " (saved by " << Ranks(saved_world) << ") into " << Ranks(world) << " (tp "
              << layout->tp << " x dp " << layout->dp << "), " << which << ", page cache "
              << (cold ? "dropped (" + cache_method + ") before each read" : "NOT dropped: " + cache_problem) << "\n"
              << "  lifeline load            " << FormatByteSize(target_bytes) << " into targets in "
              << Fixed(seconds, 3) << " s = " << Fixed(Gbps(target_bytes, seconds), 2) << " GB/s; "
              << FormatByteSize(bytes_read) << " read ("
              << Fixed(target_bytes > 0 ? static_cast<double>(bytes_read) / target_bytes : 0, 2)
              << "x the targets) = " << Fixed(read_gbps, 2) << " GB/s read\n";
    if (!o.no_baseline) {
      std::cout << "  limit: raw O_DIRECT read " << FormatByteSize(data_file_bytes) << " (the step's "
                << data_files.size() << " data files, whole) = " << Fixed(limit_gbps, 2) << " GB/s ("
                << limit_engine << ", the best of " << FormatByteSize(kReadLimitSettings[0].block_bytes) << " x "
                << kReadLimitSettings[0].depth << " and " << FormatByteSize(kReadLimitSettings[1].block_bytes)
                << " x " << kReadLimitSettings[1].depth << " in flight per reader, "
                << std::clamp<uint32_t>(static_cast<uint32_t>(data_files.size()), 1, kMaxLimitReaders)
                << " readers); lifeline reads at " << Fixed(100.0 * ratio, 0) << "% of it\n";
    }
    std::cout << "  mismatched elements      " << mismatches << '\n'
              << "  per-rank objects         " << objects_checked - object_mismatches << " of " << objects_checked
              << " as saved\n";
  }
  if (!ok) {
    std::cerr << "lifeline " << kCommand << ": step " << step << " loaded, but " << mismatches
              << " elements and " << object_mismatches << " per-rank objects differ from what was saved" << std::endl;
    return kExitFailed;
  }
  return kExitOk;
}

void AddCommonOptions(CLI::App* app, CommonOptions* o) {
  app->add_option("--dir", o->dir, "Checkpoint root directory")->required();
  app->add_option("--ranks", o->ranks, "Number of ranks (threads), = tp x dp")->required()->check(CLI::PositiveNumber);
  app->add_option("--tp", o->tp, "Tensor-parallel degree (default: --ranks, or --ranks / --dp)")
      ->check(CLI::PositiveNumber);
  app->add_option("--dp", o->dp, "Data-parallel degree (default: 1, or --ranks / --tp)")->check(CLI::PositiveNumber);
  app->add_option("--queue-depth", o->queue_depth, "I/O requests in flight per rank (default: the library's)")
      ->check(CLI::PositiveNumber);
  app->add_flag("--buffered-io", o->buffered_io, "Go through the page cache instead of O_DIRECT");
  app->add_flag("--json", o->json, "Print one JSON object on stdout");
}

}  // namespace

void AddBenchSaveTuningOptions(CLI::App* app, BenchSaveTuning* t) {
  app->add_option("--codec", t->codec, "Data-file codec: none, zstd or zstd-bytegroup (default none)")
      ->check(CLI::IsMember({"none", "zstd", "zstd-bytegroup"}));
  app->add_option("--codec-level", t->codec_level, "zstd level (default: the library's)")->check(CLI::Range(1, 22));
  app->add_flag("--memory-tier", t->memory_tier, "Stage snapshots in shared memory (the memory tier)");
  app->add_option("--copy-threads", t->copy_threads, "Threads copying each rank's snapshot (default: the library's)")
      ->check(CLI::Range(1, 64));
  app->add_option("--staging-budget", t->staging_budget,
                  "Host staging memory per rank, e.g. 8GiB (default: the library's); a snapshot larger than "
                  "budget / slots is streamed to disk instead");
  app->add_option("--slots", t->slots, "Staging slots per rank (default: the library's)")->check(CLI::Range(1, 16));
  app->add_flag("--no-register-buffers", t->no_register_buffers,
                "Do not register the staging slots with io_uring as fixed buffers");
  app->add_flag("--column-blocks,!--no-column-blocks", t->column_blocks,
                "Store shards split along columns as column blocks, or not (CheckpointerOptions::column_blocks; "
                "default: the library's, on)");
}

Status ApplyBenchSaveTuning(const BenchSaveTuning& t, CheckpointerOptions* c) {
  if (t.no_register_buffers) c->register_buffers = false;
  c->column_blocks = t.column_blocks;
  Result<SaveCodec> codec = ParseSaveCodec(t.codec);
  if (!codec.ok()) return codec.status().Annotate("--codec");
  c->codec = *codec;
  if (t.codec_level > 0) c->codec_level = t.codec_level;
  c->memory_tier = t.memory_tier;
  if (t.copy_threads > 0) c->copy_threads = t.copy_threads;
  if (t.slots > 0) c->staging_slots = t.slots;
  if (!t.staging_budget.empty()) {
    Result<uint64_t> budget = ParseByteSize(t.staging_budget);
    if (!budget.ok()) return budget.status().Annotate("--staging-budget");
    c->staging_budget_bytes = *budget;
  }
  return Status::OK();
}

std::string NewRunId(std::string_view prefix) {
  const uint64_t ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  char buf[64];
  std::snprintf(buf, sizeof(buf), "-%d-%" PRIx64, static_cast<int>(::getpid()), ns);
  return std::string(prefix) + buf;
}

void AddBenchCommands(CLI::App& root, std::vector<Command>* commands) {
  CLI::App* bench = root.add_subcommand("bench", "Measure saving and loading the synthetic model");
  bench->require_subcommand(1);
  AddBenchIndexCommand(bench, commands);
  AddBenchPlanCommand(bench, commands);
  AddBenchCompressCommand(bench, commands);
  AddBenchReplicateCommand(bench, commands);
  AddBenchTrainCommand(bench, commands);
  AddBenchTraceCommand(bench, commands);
#if defined(LIFELINE_HAVE_CUDA)
  AddBenchGpuCommand(bench, commands);
#endif

  auto save = std::make_shared<SaveOptions>();
  CLI::App* save_app = bench->add_subcommand(
      "save", "Save the synthetic model from N ranks (threads) with the asynchronous API; compare with memcpy, "
              "buffered write()+fsync and the raw O_DIRECT limit of the same bytes");
  AddCommonOptions(save_app, save.get());
  AddBenchSaveTuningOptions(save_app, &save->tuning);
  save_app->add_option("--step", save->step, "First step number to save (default 100)")->check(CLI::NonNegativeNumber);
  save_app->add_option("--iterations", save->iterations,
                       "Saves of steps s, s+1, ... through the same Checkpointers (default 4); figures are the "
                       "median of those that reuse a warm staging slot")
      ->check(CLI::PositiveNumber);
  save_app->add_option("--keep-last", save->keep_last,
                       "Complete checkpoints kept, older ones removed between saves outside the timing (default 1; "
                       "0 keeps all)");
  save_app->add_option("--state-bytes", save->state_bytes,
                       "Model state to save, e.g. 256MiB or 2G (default 2GiB); sets the layer count");
  save->hidden_option =
      save_app->add_option("--hidden", save->hidden,
                           "Hidden size H (default 1024; halved, not below 64, while --state-bytes is under two layers)")
          ->check(CLI::PositiveNumber);
  save_app->add_option("--chunk-size", save->chunk_size, "Checksum chunk size, e.g. 4MiB (default: the library's)");
  save_app->add_option("--tensors", save->many_tensors,
                       "The tensor-count axis: save N small tensors per rank (a mixture-of-experts-shaped state) "
                       "instead of the transformer of --state-bytes")
      ->check(CLI::PositiveNumber);
  save_app->add_option("--tensor-bytes", save->tensor_bytes,
                       "With --tensors: bytes of each tensor a rank holds (default 4KiB)");
  save_app->add_flag("--cold", save->cold,
                     "Skip Checkpointer::PrepareStaging before the saves: the first save into each slot faults in memory");
  save_app->add_flag("--no-baseline", save->no_baseline, "Skip the memcpy, buffered-write and O_DIRECT baselines");
  commands->push_back({save_app, [save] { return RunSave(*save); }});

  auto load = std::make_shared<LoadOptions>();
  CLI::App* load_app = bench->add_subcommand(
      "load", "Load a checkpoint of the synthetic model into M ranks of any layout and check every element");
  AddCommonOptions(load_app, load.get());
  load_app->add_option("--step", load->step, "Step to load (default: the newest complete one)")
      ->check(CLI::NonNegativeNumber);
  load->hidden_option =
      load_app->add_option("--hidden", load->hidden,
                           "Expected hidden size; the shape is read from the checkpoint, and a different one fails")
          ->check(CLI::PositiveNumber);
  load_app->add_option("--iterations", load->iterations,
                       "Loads measured, each from a cold page cache (default 3); figures are their medians")
      ->check(CLI::PositiveNumber);
  load_app->add_flag("--no-baseline", load->no_baseline, "Skip the raw O_DIRECT read limit");
  commands->push_back({load_app, [load] { return RunLoad(*load); }});
}

}  // namespace lifeline::cli
