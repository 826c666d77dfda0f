// lifeline bench train: what checkpointing costs a training loop, measured on a synthetic one.
//
// Each of R ranks (threads) holds --state-bytes / R of f32 state: tensors of 1024-float rows, rank
// r holding row block r of each. A step is
//   compute  reads the state and writes none of it: with --compute read (default), sums it for as
//            many bytes as took --compute-ms when calibrated before the runs (so a copy competing
//            for the CPU or memory shows up as a longer step); with --compute idle, sleeps
//            --compute-ms (an accelerator doing the work, the CPU left free);
//   update   adds 1 to every float (the optimizer step: it must not reach a checkpoint in flight);
// and the ranks meet at the end of every step, as an all-reduce would make them. The loop runs
// --steps steps twice in the same run: without checkpoints (the baseline), then with a checkpoint
// at the start of every step k with k % --ckpt-every == 0 and k > 0, holding the state after k
// updates of that run:
//   lazy  Save before compute, WaitSnapshot before the update;
//   sync  Save then WaitPersisted before compute: a blocking save, what torch.save-style
//         checkpointing costs.
// A checkpoint's stall is the time the loop spent blocked inside the library for it (Save and the
// wait), the maximum over ranks. After the loop every save is waited for, and the last checkpoint
// is loaded back tensor by tensor and compared with the state as it was at its Save: a write that
// raced the snapshot would show as a mismatch.
//
// The checkpoints go to a fresh directory train-<run id> under --dir, removed at the end unless
// --keep. Retention keeps --keep-last (default 1) complete checkpoints.
//
// Unless --cold, each rank calls Checkpointer::PrepareStaging before the runs (timed: prepare_ms).
//
// --json fields: mode, compute, ranks, state_bytes (all ranks), steps, ckpt_every, checkpoints,
// compute_ms (asked), compute_ms_baseline and compute_ms_with_checkpoints (mean compute phase),
// update_ms_baseline and update_ms_with_checkpoints (mean update), baseline_seconds and seconds
// (the loop without and with checkpoints), step_overhead_pct (100 * (seconds / baseline_seconds -
// 1)), stall_ms_median, stall_ms_max, library_stall_ms_max (the tickets' stall_seconds),
// stall_breakdown_ms_median (plan, slot, stage, submit, wait: SaveStallBreakdown of the rank that
// stalled longest, medians over the checkpoints),
// snapshot_ms_median and persist_ms_median (from Save), final_wait_ms (after the loop until the last
// checkpoint is committed), per_checkpoint (step, stall_ms, stall_breakdown_ms, save_return_ms (the part inside Save),
// library_stall_ms, snapshot_ms, persist_ms, staged), step_ms_baseline and
// step_ms_with_checkpoints (every step), verified, verified_step, mismatches,
// loaded_from_memory_tier, prepared, prepare_ms, codec, copy_threads, staging_slots, dir.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/internal/shared_memory.h"
#include "tools/lifeline/bench/bench.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

constexpr int64_t kColumns = 1024;         // floats per row
constexpr int64_t kRowsPerTensor = 16384;  // 64 MiB per rank's piece of a tensor
struct TrainOptions {
  std::string dir;
  std::string state_bytes = "1GiB";
  double compute_ms = 1000;
  uint32_t steps = 8;
  uint32_t ckpt_every = 2;
  std::string mode = "lazy";
  std::string compute = "read";
  uint32_t ranks = 1;
  // none: each rank its own piece; digest / plain: the ranks are data-parallel replicas of the same
  // tensors, with replica digests (CheckpointerOptions::replica_digests kOn) or without (kOff).
  std::string replicas = "none";
  uint32_t keep_last = 1;
  bool keep = false;
  bool cold = false;
  bool json = false;
  BenchSaveTuning tuning;
};

// One rank's state. Element j of its piece of tensor t starts as ((j + 131 r + 17 t) mod 1021) -
// 510 and gains 1 per update: small integers, exact in f32, different in every tensor and rank.
class TrainState {
 public:
  static Result<TrainState> Build(uint64_t rows, uint32_t rank, uint32_t world, bool replicated = false) {
    TrainState s;
    s.rank_ = rank;
    for (int64_t done = 0, t = 0; done < static_cast<int64_t>(rows); ++t) {
      const int64_t n = std::min<int64_t>(kRowsPerTensor, static_cast<int64_t>(rows) - done);
      Result<MappedRegion> buffer = MappedRegion::Anonymous(static_cast<uint64_t>(n * kColumns * 4), false);
      if (!buffer.ok())
        return Status::ResourceExhausted("rank " + std::to_string(rank), "cannot allocate the training state");
      if (replicated) {
        s.shards_.push_back(
            TensorShard::Whole("params." + std::to_string(t), DType::kF32, {n, kColumns}, buffer->data()).Replica(rank, world));
      } else {
        s.shards_.push_back(TensorShard::Box("params." + std::to_string(t), DType::kF32, {n * world, kColumns},
                                             {n * rank, 0}, {n, kColumns}, buffer->data()));
      }
      s.buffers_.push_back(std::move(buffer).value());
      done += n;
    }
    for (size_t t = 0; t < s.shards_.size(); ++t) Fill(s.floats(t), s.count(t), s.Seed(t), 0);
    return s;
  }

  const std::vector<TensorShard>& shards() const { return shards_; }
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const TensorShard& s : shards_) n += s.num_bytes();
    return n;
  }

  // The compute phase: reads `bytes` of the state (cycling over it), writes none.
  uint64_t Read(uint64_t bytes) const {
    uint64_t sum = 0;
    while (bytes > 0 && !shards_.empty()) {
      for (const TensorShard& s : shards_) {
        const uint64_t n = std::min(bytes, s.num_bytes()) / 8;
        const auto* w = static_cast<const uint64_t*>(s.data);
        for (uint64_t i = 0; i < n; ++i) sum += w[i];
        bytes -= std::min(bytes, s.num_bytes());
        if (bytes == 0) break;
      }
    }
    return sum;
  }

  // The optimizer step.
  void Update() {
    for (size_t t = 0; t < shards_.size(); ++t) {
      float* p = floats(t);
      for (int64_t j = 0, n = count(t); j < n; ++j) p[j] += 1.0f;
    }
  }

  // Elements of `loaded` (the rank's piece of tensor t) that differ from the state after `updates`.
  uint64_t CountMismatches(size_t t, const float* loaded, uint64_t updates) const {
    uint64_t bad = 0;
    int v = static_cast<int>(Seed(t));
    const float add = static_cast<float>(updates);
    for (int64_t j = 0, n = count(t); j < n; ++j) {
      bad += loaded[j] != static_cast<float>(v - 510) + add;
      if (++v == 1021) v = 0;
    }
    return bad;
  }

 private:
  static void Fill(float* p, int64_t n, uint32_t seed, float add) {
    int v = static_cast<int>(seed);
    for (int64_t j = 0; j < n; ++j) {
      p[j] = static_cast<float>(v - 510) + add;
      if (++v == 1021) v = 0;
    }
  }
  uint32_t Seed(size_t t) const { return (131 * rank_ + 17 * static_cast<uint32_t>(t)) % 1021; }
  float* floats(size_t t) const { return static_cast<float*>(shards_[t].data); }
  int64_t count(size_t t) const { return shards_[t].num_elements(); }

  uint32_t rank_ = 0;
  std::vector<TensorShard> shards_;
  std::vector<MappedRegion> buffers_;  // page-aligned, as a framework's tensors are
};

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

std::string Ms(double seconds) { return Fixed(seconds * 1e3, 1) + " ms"; }

// One checkpoint as one rank saw it.
struct RankCheckpoint {
  uint64_t step = 0;
  double blocked = 0;  // in Save and the wait, measured by the loop
  double in_save = 0;  // of which in Save
  SaveTicket ticket;
};

// One rank's record of both runs.
struct RankRecord {
  Status status;
  std::vector<double> compute[2], update[2];  // [0] baseline, [1] with checkpoints
  std::vector<RankCheckpoint> checkpoints;
  uint64_t mismatches = 0;
  bool from_memory_tier = false;
  double prepare_seconds = 0;  // Checkpointer::PrepareStaging, before the runs
  uint64_t sink = 0;
};

int RunTrain(const TrainOptions& o) {
  const char* kCommand = "bench train";
  const bool lazy = o.mode == "lazy";
  const bool idle = o.compute == "idle";
  auto state_bytes = ParseByteSize(o.state_bytes);
  if (!state_bytes.ok()) return ReportFailure(kCommand, state_bytes.status().Annotate("--state-bytes"), o.json);
  const uint64_t rows = *state_bytes / o.ranks / (kColumns * 4);
  if (rows == 0) {
    return ReportFailure(kCommand,
                         Status::InvalidArgument("--state-bytes", "less than one 4 KiB row per rank"), o.json);
  }
  if (o.steps <= o.ckpt_every) {
    return ReportFailure(kCommand,
                         Status::InvalidArgument("--steps " + std::to_string(o.steps) + " must exceed --ckpt-every " +
                                                 std::to_string(o.ckpt_every) + " for a checkpoint to be taken"),
                         o.json);
  }
  const std::string run_id = NewRunId();
  const std::string dir = o.dir + "/train-" + run_id;
  CheckpointerOptions base;
  base.directory = dir;
  base.world_size = o.ranks;
  base.run_id = run_id;
  base.keep_last = o.keep_last;
  base.replica_digests = o.replicas == "digest" ? CheckpointerOptions::ReplicaDigests::kOn : CheckpointerOptions::ReplicaDigests::kOff;
  if (Status s = ApplyBenchSaveTuning(o.tuning, &base); !s.ok()) return ReportFailure(kCommand, s, o.json);

  const uint32_t world = o.ranks;
  const uint32_t steps = o.steps;
  std::vector<RankRecord> records(world);
  std::vector<std::unique_ptr<Checkpointer>> checkpointers(world);
  std::atomic<bool> failed{false};
  // Barrier phases, in order: calibration start and end, then for each run its start and the end
  // of each of its steps, then the end of the final wait. Each completion notes the time.
  std::vector<double> marks;
  marks.reserve(2 * steps + 8);
  auto note = [&marks]() noexcept { marks.push_back(NowSeconds()); };
  std::barrier sync(static_cast<std::ptrdiff_t>(world), note);
  uint64_t last_step = 0;
  for (uint32_t k = 1; k < steps; ++k)
    if (k % o.ckpt_every == 0) last_step = k;

  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankRecord& rec = records[r];
      CheckpointerOptions copt = base;
      copt.rank = r;
      TrainState state;
      if (auto c = Checkpointer::Open(copt); c.ok()) {
        checkpointers[r] = std::move(c).value();
        if (auto s = TrainState::Build(rows, r, world, o.replicas != "none"); s.ok()) {
          state = std::move(s).value();
        } else {
          rec.status = s.status();
        }
      } else {
        rec.status = c.status();
      }
      // What a training job does once at start-up: reserve and fault in the staging slots, so the
      // first checkpoints do not pay for the kernel zeroing fresh pages (seconds per GiB on some VMs).
      if (rec.status.ok() && !o.cold) {
        SaveRequest req;
        req.tensors = state.shards();
        req.objects = {{"loop", "{\"rank\":" + std::to_string(r) + ",\"step\":0}"}};
        const double p0 = NowSeconds();
        if (Status s = checkpointers[r]->PrepareStaging(req); !s.ok() && s.code() != StatusCode::kFailedPrecondition)
          rec.status = s;  // FailedPrecondition: the state does not fit a slot and will be streamed
        rec.prepare_seconds = NowSeconds() - p0;
      }
      if (!rec.status.ok()) failed.store(true);

      // Calibration: how many bytes this rank reads in --compute-ms, all ranks reading at once.
      rec.sink += state.Read(state.bytes());
      sync.arrive_and_wait();
      const double c0 = NowSeconds();
      rec.sink += state.Read(state.bytes());
      const double read_seconds = std::max(NowSeconds() - c0, 1e-6);
      sync.arrive_and_wait();
      const uint64_t work = static_cast<uint64_t>(static_cast<double>(state.bytes()) / read_seconds *
                                                  o.compute_ms / 1e3);

      for (int run = 0; run < 2; ++run) {
        sync.arrive_and_wait();  // run starts
        for (uint32_t k = 0; k < steps; ++k) {
          const bool checkpoint = run == 1 && k > 0 && k % o.ckpt_every == 0 && rec.status.ok() && !failed.load();
          RankCheckpoint ckpt;
          Status st;
          if (checkpoint) {
            SaveRequest req;
            req.tensors = state.shards();
            req.objects = {{"loop", "{\"rank\":" + std::to_string(r) + ",\"step\":" + std::to_string(k) + "}"}};
            ckpt.step = k;
            const double t0 = NowSeconds();
            ckpt.ticket = checkpointers[r]->Save(k, req);
            ckpt.in_save = NowSeconds() - t0;
            if (!lazy) st = ckpt.ticket.WaitPersisted();
            ckpt.blocked += NowSeconds() - t0;
          }
          const double t1 = NowSeconds();
          if (idle) {
            std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.compute_ms));
          } else {
            rec.sink += state.Read(work);
          }
          const double t2 = NowSeconds();
          if (checkpoint && lazy) {
            st = ckpt.ticket.WaitSnapshot();
            ckpt.blocked += NowSeconds() - t2;
          }
          const double t3 = NowSeconds();
          state.Update();
          rec.compute[run].push_back(t2 - t1);
          rec.update[run].push_back(NowSeconds() - t3);
          if (checkpoint) rec.checkpoints.push_back(ckpt);
          if (!st.ok()) {
            rec.status = st.Annotate("step " + std::to_string(k));
            failed.store(true);
          }
          sync.arrive_and_wait();  // the all-reduce
        }
      }

      // Every save made durable, then the last one committed.
      for (const RankCheckpoint& c : rec.checkpoints) {
        Status st = c.ticket.WaitPersisted();
        if (st.ok() && r == 0 && &c == &rec.checkpoints.back()) st = c.ticket.WaitCommitted(kCommitTimeoutSeconds);
        if (!st.ok() && rec.status.ok()) {
          rec.status = st.Annotate("step " + std::to_string(c.step));
          failed.store(true);
        }
      }
      sync.arrive_and_wait();  // all persisted

      // The last checkpoint against the state at its Save: the baseline's updates plus its step.
      if (failed.load() || rec.checkpoints.empty()) return;
      const uint64_t expected_updates = steps + rec.checkpoints.back().step;
      Result<MappedRegion> scratch = MappedRegion::Anonymous(static_cast<uint64_t>(kRowsPerTensor * kColumns * 4), false);
      if (!scratch.ok()) {
        rec.status = Status::ResourceExhausted("rank " + std::to_string(r), "cannot allocate the load buffer");
        return;
      }
      for (size_t t = 0; t < state.shards().size(); ++t) {
        LoadRequest req;
        req.tensors.push_back(state.shards()[t]);
        req.tensors.back().data = scratch->data();
        auto loaded = checkpointers[r]->Load(rec.checkpoints.back().step, req);
        if (!loaded.ok()) {
          rec.status = loaded.status().Annotate("verifying");
          return;
        }
        rec.from_memory_tier = loaded->from_memory_tier;
        rec.mismatches += state.CountMismatches(t, reinterpret_cast<const float*>(scratch->data()), expected_updates);
      }
    });
  }
  for (std::thread& t : threads) t.join();

  Status failure;
  for (uint32_t r = 0; r < world && failure.ok(); ++r)
    if (!records[r].status.ok()) failure = records[r].status.Annotate("rank " + std::to_string(r));
  const CheckpointerOptions used = checkpointers[0] != nullptr ? checkpointers[0]->options() : base;
  checkpointers.clear();
  if (!o.keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  if (!failure.ok()) return ReportFailure(kCommand, failure, o.json);

  // marks: [0] calibration start, [1] its end, [2] baseline start, [3 .. 2+steps] its steps,
  // [3+steps] checkpointed run start, [4+steps .. 3+2 steps] its steps, [4+2 steps] all persisted.
  std::vector<double> step_ms[2];
  for (uint32_t k = 0; k < steps; ++k) {
    step_ms[0].push_back((marks[3 + k] - marks[2 + k]) * 1e3);
    step_ms[1].push_back((marks[4 + steps + k] - marks[3 + steps + k]) * 1e3);
  }
  const double baseline_seconds = marks[2 + steps] - marks[2];
  const double seconds = marks[3 + 2 * steps] - marks[3 + steps];
  const double final_wait = marks[4 + 2 * steps] - marks[3 + 2 * steps];

  std::vector<double> compute[2], update[2];
  uint64_t mismatches = 0;
  bool from_memory_tier = false;
  double prepare_seconds = 0;
  for (const RankRecord& rec : records) {
    for (int run = 0; run < 2; ++run) {
      compute[run].insert(compute[run].end(), rec.compute[run].begin(), rec.compute[run].end());
      update[run].insert(update[run].end(), rec.update[run].begin(), rec.update[run].end());
    }
    mismatches += rec.mismatches;
    from_memory_tier = from_memory_tier || rec.from_memory_tier;
    prepare_seconds = std::max(prepare_seconds, rec.prepare_seconds);
  }
  // Per checkpoint, the slowest rank: the others wait for it at the next all-reduce.
  const size_t n_ckpt = records[0].checkpoints.size();
  nlohmann::json per_checkpoint = nlohmann::json::array();
  std::vector<double> stalls, snapshots, persists;
  double library_stall_max = 0;
  bool all_staged = true;
  // The stall's parts (SaveStallBreakdown) of the rank that stalled longest, per checkpoint.
  constexpr const char* kParts[] = {"plan", "slot", "stage", "submit", "wait"};
  auto parts_of = [](const SaveStallBreakdown& b) {
    return std::vector<double>{b.plan_seconds * 1e3, b.slot_seconds * 1e3, b.stage_seconds * 1e3,
                               b.submit_seconds * 1e3, b.wait_seconds * 1e3};
  };
  std::vector<std::vector<double>> part_ms(std::size(kParts));
  for (size_t i = 0; i < n_ckpt; ++i) {
    double blocked = 0, in_save = 0, library_stall = 0, snapshot = 0, persist = 0;
    std::vector<double> parts(std::size(kParts), 0.0);
    bool staged = true;
    for (const RankRecord& rec : records) {
      const RankCheckpoint& c = rec.checkpoints[i];
      const SaveProgress p = c.ticket.Progress();
      if (c.blocked >= blocked) parts = parts_of(p.stall_breakdown);
      blocked = std::max(blocked, c.blocked);
      in_save = std::max(in_save, c.in_save);
      library_stall = std::max(library_stall, p.stall_seconds);
      snapshot = std::max(snapshot, p.snapshot_seconds);
      persist = std::max(persist, p.persist_seconds);
      staged = staged && p.staged;
    }
    stalls.push_back(blocked * 1e3);
    snapshots.push_back(snapshot * 1e3);
    persists.push_back(persist * 1e3);
    library_stall_max = std::max(library_stall_max, library_stall * 1e3);
    all_staged = all_staged && staged;
    nlohmann::json breakdown = nlohmann::json::object();
    for (size_t k = 0; k < parts.size(); ++k) {
      breakdown[kParts[k]] = parts[k];
      part_ms[k].push_back(parts[k]);
    }
    per_checkpoint.push_back({{"step", records[0].checkpoints[i].step},
                              {"stall_ms", blocked * 1e3},
                              {"stall_breakdown_ms", breakdown},
                              {"save_return_ms", in_save * 1e3},
                              {"library_stall_ms", library_stall * 1e3},
                              {"snapshot_ms", snapshot * 1e3},
                              {"persist_ms", persist * 1e3},
                              {"staged", staged}});
  }
  const double overhead_pct = baseline_seconds > 0 ? 100.0 * (seconds / baseline_seconds - 1.0) : 0;
  const bool verified = mismatches == 0;
  uint64_t total_bytes = uint64_t{world} * rows * kColumns * 4;
  const double stall_max = stalls.empty() ? 0 : *std::max_element(stalls.begin(), stalls.end());
  nlohmann::json breakdown_median = nlohmann::json::object();
  std::string breakdown_text;
  for (size_t k = 0; k < part_ms.size(); ++k) {
    breakdown_median[kParts[k]] = Median(part_ms[k]);
    breakdown_text += std::string(k == 0 ? "" : ", ") + kParts[k] + " " + Fixed(Median(part_ms[k]), 3) + " ms";
  }

  if (o.json) {
    nlohmann::json j = {{"ok", verified},
               {"command", kCommand},
               {"dir", dir},
               {"kept", o.keep},
               {"mode", o.mode},
               {"compute", o.compute},
               {"ranks", world},
               {"state_bytes", total_bytes},
               {"steps", steps},
               {"ckpt_every", o.ckpt_every},
               {"checkpoints", n_ckpt},
               {"compute_ms", o.compute_ms},
               {"compute_ms_baseline", Mean(compute[0]) * 1e3},
               {"compute_ms_with_checkpoints", Mean(compute[1]) * 1e3},
               {"update_ms_baseline", Mean(update[0]) * 1e3},
               {"update_ms_with_checkpoints", Mean(update[1]) * 1e3},
               {"baseline_seconds", baseline_seconds},
               {"seconds", seconds},
               {"step_overhead_pct", overhead_pct},
               {"stall_ms_median", Median(stalls)},
               {"stall_ms_max", stall_max},
               {"library_stall_ms_max", library_stall_max},
               {"stall_breakdown_ms_median", breakdown_median},
               {"snapshot_ms_median", Median(snapshots)},
               {"persist_ms_median", Median(persists)},
               {"staged", all_staged},
               {"final_wait_ms", final_wait * 1e3},
               {"prepared", !o.cold},
               {"prepare_ms", prepare_seconds * 1e3},
               {"per_checkpoint", per_checkpoint},
               {"step_ms_baseline", step_ms[0]},
               {"step_ms_with_checkpoints", step_ms[1]},
               {"verified", verified},
               {"verified_step", last_step},
               {"mismatches", mismatches},
               {"loaded_from_memory_tier", from_memory_tier},
               {"codec", o.tuning.codec},
               {"copy_threads", used.copy_threads},
               {"staging_slots", used.staging_slots}};
    if (!verified) {
      j["code"] = StatusCodeName(StatusCode::kCorruption);
      j["error"] = "step " + std::to_string(last_step) + " loaded, but " + std::to_string(mismatches) +
                   " elements differ from the state at its Save";
    }
    PrintJson(j);
  } else {
    std::cout << "training loop: " << world << (world == 1 ? " rank" : " ranks") << ", "
              << FormatByteSize(total_bytes) << " of f32 state, " << steps << " steps of " << o.compute_ms
              << " ms compute (" << o.compute << ") + update; " << o.mode << " checkpoint every " << o.ckpt_every
              << " steps (" << n_ckpt << " checkpoints" << (all_staged ? "" : ", NOT STAGED: streamed to disk")
              << ")\n"
              << "  without checkpoints    " << Ms(baseline_seconds) << " (compute " << Ms(Mean(compute[0]))
              << ", update " << Ms(Mean(update[0])) << " per step)\n"
              << "  with checkpoints       " << Ms(seconds) << " (compute " << Ms(Mean(compute[1])) << ", update "
              << Ms(Mean(update[1])) << " per step): overhead " << Fixed(overhead_pct, 1) << "%\n"
              << "  stall per checkpoint   median " << Ms(Median(stalls) / 1e3) << ", max " << Ms(stall_max / 1e3)
              << " (snapshot " << Ms(Median(snapshots) / 1e3) << ", persisted " << Ms(Median(persists) / 1e3)
              << " after Save, medians)\n"
              << "  the stall's parts      " << breakdown_text << " (medians, of the rank that stalled longest)\n"
              << "  after the loop         " << Ms(final_wait) << " until the last checkpoint was committed\n"
              << "  before the loop        "
              << (o.cold ? std::string("staging not prepared (--cold)")
                         : Ms(prepare_seconds) + " in PrepareStaging (staging slots reserved and faulted in)")
              << "\n"
              << "  step " << last_step << " loaded back     " << mismatches
              << " elements differ from the state at its Save" << (from_memory_tier ? " (from the memory tier)" : "")
              << "\n";
  }
  if (!verified) {
    std::cerr << "lifeline " << kCommand << ": step " << last_step << " loaded, but " << mismatches
              << " elements differ from the state at its Save" << std::endl;
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace

void AddBenchTrainCommand(CLI::App* bench, std::vector<Command>* commands) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* app = bench->add_subcommand(
      "train", "A synthetic training loop with and without checkpoints: stall per checkpoint and step overhead");
  app->add_option("--dir", o->dir, "Where to create the run's checkpoint directory (removed afterwards)")->required();
  app->add_option("--state-bytes", o->state_bytes, "Training state of all ranks, e.g. 2GiB (default 1GiB)");
  app->add_option("--compute-ms", o->compute_ms, "Compute phase per step in ms (default 1000)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--steps", o->steps, "Steps per run (default 8)")->check(CLI::PositiveNumber);
  app->add_option("--ckpt-every", o->ckpt_every, "Checkpoint every E steps (default 2)")->check(CLI::PositiveNumber);
  app->add_option("--mode", o->mode, "lazy (Save, WaitSnapshot before the update) or sync (Save + WaitPersisted)")
      ->check(CLI::IsMember({"lazy", "sync"}));
  app->add_option("--compute", o->compute,
                  "read: the compute phase reads the state (CPU-bound, calibrated to --compute-ms); idle: it sleeps "
                  "(an accelerator computes)")
      ->check(CLI::IsMember({"read", "idle"}));
  app->add_option("--ranks", o->ranks, "Ranks (threads) (default 1)")->check(CLI::PositiveNumber);
  app->add_option("--replicas", o->replicas,
                  "none: each rank saves its own piece (default); digest: the ranks are data-parallel replicas of "
                  "the same state, each digesting its copy at every snapshot (replica_digests on); plain: replicas, "
                  "digests off")
      ->check(CLI::IsMember({"none", "digest", "plain"}));
  app->add_option("--keep-last", o->keep_last, "Complete checkpoints kept (default 1; 0 keeps all)");
  app->add_flag("--keep", o->keep, "Keep the run's checkpoint directory");
  app->add_flag("--cold", o->cold,
                "Skip Checkpointer::PrepareStaging before the runs: the first checkpoints fault in their staging memory");
  AddBenchSaveTuningOptions(app, &o->tuning);
  app->add_flag("--json", o->json, "Print one JSON object on stdout");
  commands->push_back(Command{app, [o] { return RunTrain(*o); }});
}

}  // namespace lifeline::cli
