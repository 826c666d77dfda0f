// What the `lifeline bench` subcommands share (tools/lifeline/bench/): each file adds one or two of
// them under `bench`, which bench.cc creates. Benches use the public API (lifeline/*.h) and, where
// they time an internal component alone, the declared internal interface (lifeline/internal/).
// A benchmark is not a test: figures are printed, compared as ratios within one run, never asserted.
#ifndef LIFELINE_TOOLS_LIFELINE_BENCH_BENCH_H_
#define LIFELINE_TOOLS_LIFELINE_BENCH_BENCH_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "lifeline/checkpoint.h"
#include "lifeline/status.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {

// `v` with `digits` decimals, as the benches print figures.
inline std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// Adds `bench index` under the `bench` command (index.cc).
void AddBenchIndexCommand(CLI::App* bench, std::vector<Command>* commands);
// plan.cc
void AddBenchPlanCommand(CLI::App* bench, std::vector<Command>* commands);
// Adds `bench compress` under the `bench` command (compress.cc).
void AddBenchCompressCommand(CLI::App* bench, std::vector<Command>* commands);
// Adds `bench train` under the `bench` command (train.cc).
void AddBenchTrainCommand(CLI::App* bench, std::vector<Command>* commands);
// Adds `bench trace` under the `bench` command (trace.cc).
void AddBenchTraceCommand(CLI::App* bench, std::vector<Command>* commands);
// Adds `bench replicate` under the `bench` command (replicate.cc).
void AddBenchReplicateCommand(CLI::App* bench, std::vector<Command>* commands);
// Adds `bench gpu` under the `bench` command (gpu.cc; built with the CUDA copy engine only).
void AddBenchGpuCommand(CLI::App* bench, std::vector<Command>* commands);

// How `bench save` and `bench train` tune their Checkpointers, as typed on the command line
// (bench.cc). Zero or empty leaves the library's default.
struct BenchSaveTuning {
  std::string codec = "none";   // none | zstd | zstd-bytegroup
  int codec_level = 0;
  bool memory_tier = false;
  unsigned copy_threads = 0;
  std::string staging_budget;   // a byte size, e.g. 8GiB
  unsigned slots = 0;
  bool no_register_buffers = false;
  bool column_blocks = CheckpointerOptions{}.column_blocks;
};
// Adds --codec, --codec-level, --memory-tier, --copy-threads, --staging-budget, --slots,
// --no-register-buffers and --[no-]column-blocks to `app`.
void AddBenchSaveTuningOptions(CLI::App* app, BenchSaveTuning* tuning);
// Applies `tuning` to `options`; InvalidArgument naming the option when a value is not valid.
Status ApplyBenchSaveTuning(const BenchSaveTuning& tuning, CheckpointerOptions* options);
// How long a bench waits for one save to commit before it calls the save failed.
constexpr double kCommitTimeoutSeconds = 120;
// Bytes per second in GB/s (0 for no time).
double Gbps(uint64_t bytes, double seconds);
// The median of `v` (the mean of the middle two for an even count; 0 for none).
double Median(std::vector<double> v);
// A run id no earlier run of this machine used ("<prefix>-<pid>-<hex ns>").
std::string NewRunId(std::string_view prefix = "bench");

}  // namespace lifeline::cli

#endif  // LIFELINE_TOOLS_LIFELINE_BENCH_BENCH_H_
