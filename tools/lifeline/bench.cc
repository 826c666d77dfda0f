// lifeline bench save | load: N ranks, run as threads of this process, save or load the synthetic
// model (synthetic_model.h) through one Checkpointer each, exactly as the ranks of a training job
// would, cooperating only through the file system.
//
// save: every rank builds and fills its shards before the clock starts; the time runs from the
// moment all ranks are released until every Save returned and the step is committed. Unless
// --no-baseline, the same number of bytes is then written with plain buffered write() calls of
// 8 MiB and one fsync into a scratch file in the same directory (deleted afterwards), the way
// torch.save-style writers go through the page cache; the ratio of the two times is the speedup.
// Then the same bytes are written raw by one thread per rank with the library's I/O engine
// (preallocated O_DIRECT files, 8 MiB blocks, 16 in flight, fdatasync): the device's ceiling, and
// fraction_of_raw_direct says how much of it the save reached.
//
// load: the model's shape comes from the checkpoint's metadata; every rank allocates the targets
// of its layout before the clock starts; the time runs until every Load returned. Then every
// element is compared with the value function (outside the timing), and the per-rank objects of
// rank r mod saved-world-size are checked. Exit 1 when the load fails or anything differs.
//
// --json fields. save: bytes (unique tensor bytes written, replicas counted once), bytes_on_disk,
// seconds, gbps (bytes / seconds / 1e9), baseline_seconds, baseline_gbps, speedup_vs_buffered
// (baseline_seconds / seconds), raw_direct_seconds, raw_direct_gbps, fraction_of_raw_direct
// (raw_direct_seconds / seconds), prepare_seconds (opening and filling, not timed), ranks, tp, dp,
// step, hidden, layers, tensors, dir, direct_io. load: bytes (total bytes of all ranks' targets,
// replicas counted on every rank that holds one), unique_bytes, bytes_read (from storage,
// alignment slack included), seconds, gbps (bytes / seconds / 1e9), mismatches (elements),
// objects_checked, object_mismatches, saved_world_size, ranks, tp, dp, step, hidden, layers.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
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

#include "lib/src/aligned_buffer.h"
#include "lib/src/checkpoint_reader.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"
#include "tools/lifeline/synthetic_model.h"

namespace lifeline::cli {
namespace {

constexpr uint64_t kBaselineWriteBytes = 8ull << 20;
constexpr double kCommitTimeoutSeconds = 120;

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
  bool no_baseline = false;
};

// Resolves (--ranks, --tp, --dp) into a layout; InvalidArgument when they disagree.
Result<ParallelLayout> ResolveLayout(const CommonOptions& o) {
  if (o.ranks == 0) return Status::InvalidArgument("--ranks must be at least 1");
  ParallelLayout l;
  if (o.tp == 0 && o.dp == 0) {
    l.tp = o.ranks;
    l.dp = 1;
  } else if (o.dp == 0) {
    if (o.ranks % o.tp != 0) {
      return Status::InvalidArgument("--tp " + std::to_string(o.tp) + " does not divide --ranks " + std::to_string(o.ranks));
    }
    l.tp = o.tp;
    l.dp = o.ranks / o.tp;
  } else if (o.tp == 0) {
    if (o.ranks % o.dp != 0) {
      return Status::InvalidArgument("--dp " + std::to_string(o.dp) + " does not divide --ranks " + std::to_string(o.ranks));
    }
    l.dp = o.dp;
    l.tp = o.ranks / o.dp;
  } else {
    l.tp = o.tp;
    l.dp = o.dp;
  }
  if (uint64_t{l.tp} * l.dp != o.ranks) {
    return Status::InvalidArgument("--tp " + std::to_string(l.tp) + " x --dp " + std::to_string(l.dp) + " = " +
                                   std::to_string(uint64_t{l.tp} * l.dp) + " ranks, but --ranks is " +
                                   std::to_string(o.ranks));
  }
  return l;
}

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

double Gbps(uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }

std::string Ranks(uint32_t n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); }

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

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

// The device's ceiling as Lifeline's own I/O engine reaches it: `bytes` split over `writers`
// threads, each streaming its share into its own preallocated O_DIRECT file in 8 MiB blocks, 16 in
// flight, then fdatasync. No copy, no checksum, no index: what a save could take at best.
Result<double> DirectWriteBaseline(const std::string& dir, uint64_t bytes, uint32_t writers, bool direct_io) {
  Env* env = Env::Default();
  constexpr unsigned kDepth = 16;
  const uint64_t share = (bytes / writers + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
  std::vector<Status> results(writers);
  std::latch go(1);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < writers; ++w) {
    threads.emplace_back([&, w] {
      const std::string path = dir + "/.lifeline-bench-direct-" + std::to_string(::getpid()) + "-" + std::to_string(w);
      auto run = [&]() -> Status {
        std::vector<AlignedBuffer> blocks;
        for (unsigned i = 0; i < kDepth; ++i) {
          blocks.emplace_back(kBaselineWriteBytes);
          if (blocks.back().data() == nullptr) return Status::ResourceExhausted(path, "cannot allocate write blocks");
          std::memset(blocks.back().data(), 0x5a, kBaselineWriteBytes);
        }
        FileOptions fopt;
        fopt.direct_io = direct_io;
        go.wait();
        Status st;
        {
          LL_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path, fopt));
          LL_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue, env->NewIoQueue(IoQueueOptions{kDepth, 4}));
          st = file->Allocate(share);
          std::vector<IoCompletion> done;
          uint64_t offset = 0;
          size_t next_block = 0;
          while (st.ok() && (offset < share || queue->in_flight() > 0)) {
            while (st.ok() && offset < share && queue->in_flight() < kDepth) {
              IoRequest req;
              req.kind = IoRequest::Kind::kWrite;
              req.writer = file.get();
              req.offset = offset;
              req.buffer = blocks[next_block++ % kDepth].data();
              req.length = static_cast<size_t>(std::min<uint64_t>(kBaselineWriteBytes, share - offset));
              st = queue->Submit(req);
              offset += req.length;
            }
            done.clear();
            if (st.ok() && queue->in_flight() > 0) st = queue->Reap(1, &done);
            for (const IoCompletion& c : done)
              if (st.ok()) st = c.status;
          }
          if (st.ok()) st = file->Sync();
          Status closed = file->Close();
          if (st.ok()) st = closed;
        }
        return st;
      };
      results[w] = run();
      env->RemoveFile(path).IgnoreError();
    });
  }
  const double t0 = NowSeconds();
  go.count_down();
  for (std::thread& t : threads) t.join();
  const double seconds = NowSeconds() - t0;
  for (const Status& st : results)
    if (!st.ok()) return st.Annotate("direct-write baseline");
  return seconds;
}

std::string NewRunId() {
  const uint64_t ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  char buf[64];
  std::snprintf(buf, sizeof(buf), "bench-%d-%" PRIx64, static_cast<int>(::getpid()), ns);
  return buf;
}

int RunSave(const SaveOptions& o) {
  const char* kCommand = "bench save";
  auto layout = ResolveLayout(o);
  if (!layout.ok()) return ReportFailure(kCommand, layout.status(), o.json);
  auto state_bytes = ParseByteSize(o.state_bytes);
  if (!state_bytes.ok()) return ReportFailure(kCommand, state_bytes.status().Annotate("--state-bytes"), o.json);
  auto shape = ChooseModelShape(*state_bytes, o.hidden);
  if (!shape.ok()) return ReportFailure(kCommand, shape.status(), o.json);
  const uint64_t step = o.step >= 0 ? static_cast<uint64_t>(o.step) : 100;
  const uint32_t world = layout->world_size();
  auto base_options = MakeCheckpointerOptions(o, world, NewRunId());
  if (!base_options.ok()) return ReportFailure(kCommand, base_options.status(), o.json);

  const std::vector<ModelTensor> tensors = ModelTensors(*shape);
  const std::string metadata = ModelMetadataJson(*shape, *layout, step);
  const uint64_t unique_bytes = ModelBytes(*shape);

  const double prepare_start = NowSeconds();
  std::vector<RankOutcome> outcomes(world);
  std::vector<std::unique_ptr<Checkpointer>> checkpointers(world);
  std::vector<RankState> states(world);
  std::latch ready(world);
  std::latch go(1);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankOutcome& out = outcomes[r];
      CheckpointerOptions copt = *base_options;
      copt.rank = r;
      auto ckpt = Checkpointer::Open(copt);
      if (ckpt.ok()) {
        checkpointers[r] = std::move(ckpt).value();
        auto state = RankState::Build(tensors, *layout, r, step, /*fill=*/true);
        if (state.ok()) {
          states[r] = std::move(state).value();
          out.target_bytes = states[r].bytes();
        } else {
          out.status = state.status();
        }
      } else {
        out.status = ckpt.status();
      }
      SaveRequest request;
      if (out.status.ok()) {
        request.tensors = states[r].shards();
        request.objects = {{"rng", RngObject(r, step)}, {"dataloader", DataloaderObject(r, step)}};
        request.metadata_json = metadata;
      }
      ready.count_down();
      go.wait();
      if (out.status.ok()) out.status = checkpointers[r]->Save(step, request).WaitPersisted();
    });
  }
  ready.wait();
  const double t0 = NowSeconds();
  const double prepare_seconds = t0 - prepare_start;
  go.count_down();
  for (std::thread& t : threads) t.join();
  Status failure = FirstFailure(outcomes);
  if (failure.ok()) failure = checkpointers[0]->WaitForCommit(step, kCommitTimeoutSeconds);
  const double seconds = NowSeconds() - t0;
  states.clear();  // give the memory back before the baseline runs
  if (!failure.ok()) {
    if (failure.IsAlreadyExists()) failure = Status::AlreadyExists(failure.message(), "pick another --step or --dir");
    return ReportFailure(kCommand, failure, o.json);
  }

  uint64_t bytes_on_disk = 0;
  if (auto steps = checkpointers[0]->List(); steps.ok()) {
    for (const CheckpointInfo& c : *steps) {
      if (c.step == step) bytes_on_disk = c.bytes;
    }
  }
  checkpointers.clear();

  std::optional<double> baseline_seconds, raw_seconds;
  if (!o.no_baseline) {
    auto b = BufferedWriteBaseline(o.dir, unique_bytes);
    if (!b.ok()) return ReportFailure(kCommand, b.status(), o.json);
    baseline_seconds = *b;
    auto r = DirectWriteBaseline(o.dir, unique_bytes, world, base_options->direct_io);
    if (!r.ok()) return ReportFailure(kCommand, r.status(), o.json);
    raw_seconds = *r;
  }

  const double gbps = Gbps(unique_bytes, seconds);
  if (o.json) {
    nlohmann::json j = {{"ok", true},
                        {"command", kCommand},
                        {"dir", o.dir},
                        {"step", step},
                        {"ranks", world},
                        {"tp", layout->tp},
                        {"dp", layout->dp},
                        {"hidden", shape->hidden},
                        {"layers", shape->layers},
                        {"tensors", tensors.size()},
                        {"bytes", unique_bytes},
                        {"bytes_on_disk", bytes_on_disk},
                        {"seconds", seconds},
                        {"gbps", gbps},
                        {"prepare_seconds", prepare_seconds},
                        {"direct_io", base_options->direct_io}};
    if (baseline_seconds) {
      j["baseline_seconds"] = *baseline_seconds;
      j["baseline_gbps"] = Gbps(unique_bytes, *baseline_seconds);
      j["speedup_vs_buffered"] = *baseline_seconds / seconds;
      j["raw_direct_seconds"] = *raw_seconds;
      j["raw_direct_gbps"] = Gbps(unique_bytes, *raw_seconds);
      j["fraction_of_raw_direct"] = *raw_seconds / seconds;
    }
    PrintJson(j);
  } else {
    std::cout << "saved step " << step << " of the synthetic model (hidden " << shape->hidden << ", " << shape->layers
              << " layers, " << tensors.size() << " tensors) from " << Ranks(world) << " (tp " << layout->tp << " x dp "
              << layout->dp << ") into " << o.dir << "\n"
              << "  lifeline save            " << FormatByteSize(unique_bytes) << " in " << Fixed(seconds, 3)
              << " s = " << Fixed(gbps, 2) << " GB/s (" << FormatByteSize(bytes_on_disk) << " on disk)\n";
    if (baseline_seconds) {
      std::cout << "  buffered write + fsync   " << FormatByteSize(unique_bytes) << " in " << Fixed(*baseline_seconds, 3)
                << " s = " << Fixed(Gbps(unique_bytes, *baseline_seconds), 2) << " GB/s\n"
                << "  speedup vs buffered      " << Fixed(*baseline_seconds / seconds, 2) << "x\n"
                << "  raw O_DIRECT ceiling     " << FormatByteSize(unique_bytes) << " in " << Fixed(*raw_seconds, 3)
                << " s = " << Fixed(Gbps(unique_bytes, *raw_seconds), 2) << " GB/s (lifeline reaches "
                << Fixed(100.0 * *raw_seconds / seconds, 0) << "% of it)\n";
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

int RunLoad(const CommonOptions& o) {
  const char* kCommand = "bench load";
  auto layout = ResolveLayout(o);
  if (!layout.ok()) return ReportFailure(kCommand, layout.status(), o.json);
  const std::optional<uint64_t> want_step = o.step >= 0 ? std::optional<uint64_t>(o.step) : std::nullopt;
  uint64_t step = 0;
  uint32_t saved_world = 0;
  ModelShape shape;
  {
    auto reader = CheckpointReader::Open(Env::Default(), o.dir, want_step);
    if (!reader.ok()) return ReportFailure(kCommand, reader.status(), o.json);
    step = (*reader)->step();
    saved_world = (*reader)->manifest().world_size;
    auto parsed = ParseModelMetadata((*reader)->manifest().metadata_json);
    if (!parsed.ok()) return ReportFailure(kCommand, parsed.status().Annotate((*reader)->step_dir()), o.json);
    shape = *parsed;
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

  const double prepare_start = NowSeconds();
  std::vector<RankOutcome> outcomes(world);
  std::latch ready(world);
  std::latch go(1);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankOutcome& out = outcomes[r];
      CheckpointerOptions copt = *base_options;
      copt.rank = r;
      std::unique_ptr<Checkpointer> ckpt;
      RankState state;
      if (auto c = Checkpointer::Open(copt); c.ok()) {
        ckpt = std::move(c).value();
        if (auto s = RankState::Build(tensors, *layout, r, step, /*fill=*/false); s.ok()) {
          state = std::move(s).value();
          out.target_bytes = state.bytes();
        } else {
          out.status = s.status();
        }
      } else {
        out.status = c.status();
      }
      const uint32_t objects_rank = saved_world > 0 ? r % saved_world : r;
      LoadRequest request;
      request.tensors = state.shards();
      request.objects_of_rank = objects_rank;
      ready.count_down();
      go.wait();
      if (!out.status.ok()) return;
      auto result = ckpt->Load(step, request);
      out.finished = NowSeconds();
      if (!result.ok()) {
        out.status = result.status();
        return;
      }
      out.bytes_read = result->bytes_read;
      out.mismatches = state.CountMismatches(step);
      CheckObjects(*result, objects_rank, step, &out);
    });
  }
  ready.wait();
  const double t0 = NowSeconds();
  const double prepare_seconds = t0 - prepare_start;
  go.count_down();
  for (std::thread& t : threads) t.join();
  const Status failure = FirstFailure(outcomes);
  if (!failure.ok()) return ReportFailure(kCommand, failure, o.json);

  double finished = t0;
  uint64_t target_bytes = 0, bytes_read = 0, mismatches = 0, objects_checked = 0, object_mismatches = 0;
  for (const RankOutcome& out : outcomes) {
    finished = std::max(finished, out.finished);
    target_bytes += out.target_bytes;
    bytes_read += out.bytes_read;
    mismatches += out.mismatches;
    objects_checked += out.objects_checked;
    object_mismatches += out.object_mismatches;
  }
  const double seconds = finished - t0;
  const bool ok = mismatches == 0 && object_mismatches == 0;
  if (o.json) {
    PrintJson({{"ok", ok},
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
               {"seconds", seconds},
               {"gbps", Gbps(target_bytes, seconds)},
               {"mismatches", mismatches},
               {"objects_checked", objects_checked},
               {"object_mismatches", object_mismatches},
               {"prepare_seconds", prepare_seconds},
               {"direct_io", base_options->direct_io}});
  } else {
    std::cout << "loaded step " << step << " (saved by " << Ranks(saved_world) << ") into " << Ranks(world) << " (tp "
              << layout->tp << " x dp " << layout->dp << ")\n"
              << "  lifeline load            " << FormatByteSize(target_bytes) << " into targets ("
              << FormatByteSize(bytes_read) << " read) in " << Fixed(seconds, 3) << " s = "
              << Fixed(Gbps(target_bytes, seconds), 2) << " GB/s\n"
              << "  mismatched elements      " << mismatches << '\n'
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

void AddBenchCommands(CLI::App& root, std::vector<Command>* commands) {
  CLI::App* bench = root.add_subcommand("bench", "Measure saving and loading the synthetic model");
  bench->require_subcommand(1);
  AddBenchIndexCommand(bench, commands);

  auto save = std::make_shared<SaveOptions>();
  CLI::App* save_app = bench->add_subcommand(
      "save", "Save the synthetic model from N ranks (threads) and compare with buffered write()+fsync");
  AddCommonOptions(save_app, save.get());
  save_app->add_option("--step", save->step, "Step number to save (default 100)")->check(CLI::NonNegativeNumber);
  save_app->add_option("--state-bytes", save->state_bytes,
                       "Model state to save, e.g. 256MiB or 2G (default 2GiB); sets the layer count");
  save->hidden_option =
      save_app->add_option("--hidden", save->hidden,
                           "Hidden size H (default 1024; halved, not below 64, while --state-bytes is under two layers)")
          ->check(CLI::PositiveNumber);
  save_app->add_option("--chunk-size", save->chunk_size, "Checksum chunk size, e.g. 4MiB (default: the library's)");
  save_app->add_flag("--no-baseline", save->no_baseline, "Skip the buffered-write baseline");
  commands->push_back({save_app, [save] { return RunSave(*save); }});

  auto load = std::make_shared<CommonOptions>();
  CLI::App* load_app = bench->add_subcommand(
      "load", "Load a checkpoint of the synthetic model into M ranks of any layout and check every element");
  AddCommonOptions(load_app, load.get());
  load_app->add_option("--step", load->step, "Step to load (default: the newest complete one)")
      ->check(CLI::NonNegativeNumber);
  load->hidden_option =
      load_app->add_option("--hidden", load->hidden,
                           "Expected hidden size; the shape is read from the checkpoint, and a different one fails")
          ->check(CLI::PositiveNumber);
  commands->push_back({load_app, [load] { return RunLoad(*load); }});
}

}  // namespace lifeline::cli
