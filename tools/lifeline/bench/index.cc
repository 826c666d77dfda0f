// lifeline bench index: the metadata path at scale. R ranks (threads) save T tiny tensors each,
// one fragment per tensor, so the checkpoint has R x T fragments; then, timed separately:
//   commit  reading, decoding and merging the R rank indexes into the manifest and encoding it
//           (what the completing rank does on top of its own save), with the format layer's
//           codec (formats/index_codec.h), and
//   open    what opening the committed step for a load costs before any data is read: listing it,
//           reading and decoding the manifest, checking its coverage (CheckCheckpointMetadata,
//           the same steps as a reader's open).
// The design asks that a checkpoint of a million fragments commits and opens in about a second.
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include <algorithm>
#include <string>

#include "formats/index_codec.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tools/lifeline/bench/bench.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

struct IndexBenchOptions {
  std::string dir;
  uint64_t fragments = 1000000;
  uint32_t ranks = 8;
  bool json = false;
};

int RunIndexBench(const IndexBenchOptions& o) {
  const char* kCommand = "bench index";
  const uint64_t per_rank = (o.fragments + o.ranks - 1) / o.ranks;
  const uint64_t step = 1;
  const std::string run_id = "bench-index-" + std::to_string(static_cast<uint64_t>(NowSeconds() * 1e9));
  std::vector<Status> results(o.ranks);
  std::vector<float> values(per_rank, 1.0f);

  const double t0 = NowSeconds();
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < o.ranks; ++r) {
    threads.emplace_back([&, r] {
      CheckpointerOptions opt;
      opt.directory = o.dir;
      opt.rank = r;
      opt.world_size = o.ranks;
      opt.run_id = run_id;
      auto ckpt = Checkpointer::Open(opt);
      if (!ckpt.ok()) {
        results[r] = ckpt.status();
        return;
      }
      // Tensor i is a vector of `ranks` elements; rank r holds element r.
      SaveRequest req;
      req.tensors.reserve(per_rank);
      const int64_t world = o.ranks;
      for (uint64_t i = 0; i < per_rank; ++i)
        req.tensors.push_back(TensorShard::Box("t." + std::to_string(i), DType::kF32, {world}, {int64_t{r}}, {1},
                                               &values[i]));
      results[r] = (*ckpt)->Save(step, req).WaitPersisted();
    });
  }
  for (std::thread& t : threads) t.join();
  const double save_seconds = NowSeconds() - t0;
  for (uint32_t r = 0; r < o.ranks; ++r)
    if (!results[r].ok()) return ReportFailure(kCommand, results[r].Annotate("rank " + std::to_string(r)), o.json);

  Env* env = Env::Default();
  // Outside the timing: which directory holds the step (the committing rank knows it).
  auto scanned = ScanCheckpointDirectory(o.dir);
  if (!scanned.ok()) return ReportFailure(kCommand, scanned.status(), o.json);
  auto info = std::find_if(scanned->begin(), scanned->end(), [&](const CheckpointInfo& c) { return c.step == step; });
  if (info == scanned->end() || !info->complete)
    return ReportFailure(kCommand, Status::NotFound(o.dir, "step " + std::to_string(step) + " is not complete"), o.json);
  auto merge = [&]() -> Result<format::CheckpointIndex> {
    LL_ASSIGN_OR_RETURN(std::vector<std::string> children, env->GetChildren(info->directory));
    std::vector<format::CheckpointIndex> indexes;
    for (const std::string& name : children) {
      if (name.size() < 6 || name.compare(name.size() - 6, 6, ".index") != 0) continue;
      const std::string path = JoinPath(info->directory, name);
      LL_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, path, format::kMaxIndexBytes));
      LL_ASSIGN_OR_RETURN(format::CheckpointIndex index, format::DecodeIndex(bytes, path));
      indexes.push_back(std::move(index));
    }
    return format::BuildManifest(std::move(indexes));
  };
  const double c0 = NowSeconds();
  auto manifest = merge();
  if (!manifest.ok()) return ReportFailure(kCommand, manifest.status(), o.json);
  auto encoded = format::EncodeIndex(*manifest);
  if (!encoded.ok()) return ReportFailure(kCommand, encoded.status(), o.json);
  const double commit_seconds = NowSeconds() - c0;
  const uint64_t fragments = manifest->fragments.size();

  const double o0 = NowSeconds();
  if (Status opened = CheckCheckpointMetadata(*info); !opened.ok()) return ReportFailure(kCommand, opened, o.json);
  const double open_seconds = NowSeconds() - o0;

  if (o.json) {
    PrintJson({{"ok", true},
               {"command", kCommand},
               {"dir", o.dir},
               {"ranks", o.ranks},
               {"fragments", fragments},
               {"manifest_bytes", encoded->size()},
               {"save_seconds", save_seconds},
               {"commit_seconds", commit_seconds},
               {"open_seconds", open_seconds}});
  } else {
    std::cout << fragments << " fragments from " << o.ranks << " ranks, manifest of " << encoded->size() << " bytes\n"
              << "  save (all ranks, incl. commit)  " << save_seconds << " s\n"
              << "  commit (merge + encode)         " << commit_seconds << " s\n"
              << "  open (read + decode manifest)   " << open_seconds << " s\n";
  }
  return kExitOk;
}

}  // namespace

void AddBenchIndexCommand(CLI::App* bench, std::vector<Command>* commands) {
  auto o = std::make_shared<IndexBenchOptions>();
  CLI::App* app = bench->add_subcommand("index", "Commit and open a checkpoint of many fragments (metadata at scale)");
  app->add_option("--dir", o->dir, "Checkpoint root directory (a fresh one)")->required();
  app->add_option("--fragments", o->fragments, "Fragments in all (default 1000000)")->check(CLI::PositiveNumber);
  app->add_option("--ranks", o->ranks, "Ranks (threads) writing them (default 8)")->check(CLI::PositiveNumber);
  app->add_flag("--json", o->json, "Print one JSON object on stdout");
  commands->push_back(Command{app, [o] { return RunIndexBench(*o); }});
}

}  // namespace lifeline::cli
