// lifeline-sim: the agent's detectors on a simulated job of --ranks ranks on --nodes nodes, with
// --drills random faults and clean runs; prints what they named, how fast and at what CPU cost
// (agent/sim/sim.h), and with --plot draws accuracy and latency by fault kind (tools/sim_plot.py).
// --signals: drills of the cross-rank checks instead; --cross-rank-cost: what those checks cost a
// node's agent and one process holding every rank.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "agent/sim/sim.h"

namespace {

using lifeline::agent::sim::Drill;
using lifeline::agent::sim::DrillResult;
using lifeline::agent::sim::SimConfig;

// tools/sim_plot.py: $LIFELINE_SIM_PLOT, else beside the build tree (build/bin -> tools/), else
// in the source tree this binary was built from.
std::string FindPlotScript() {
  if (const char* p = std::getenv("LIFELINE_SIM_PLOT"); p != nullptr && *p != '\0') return p;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));
    const std::string candidate = dir + "/../../tools/sim_plot.py";
    if (access(candidate.c_str(), R_OK) == 0) return candidate;
  }
  return std::string(LIFELINE_SOURCE_DIR) + "/tools/sim_plot.py";
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lifeline-sim: the agent's real detectors (each node's, and the leader's job-wide view) driven by a "
               "simulated multi-node job with injected faults; reports accuracy, false alarms, detection latency "
               "and the detectors' CPU per event"};
  app.set_version_flag("--version", "lifeline-sim " LIFELINE_VERSION);
  SimConfig config;
  int drills = 100;
  int clean = -1;
  uint64_t seed = 0;
  bool seed_given = false;
  bool json = false;
  std::string plot;
  std::string json_out;
  unsigned threads = std::max(1u, std::min(2u, std::thread::hardware_concurrency()));
  bool verbose = false;
  config.agent.hang.floor_seconds = 5;
  app.add_option("--ranks", config.ranks, "Ranks of the job")->check(CLI::Range(2, 1 << 20));
  app.add_option("--nodes", config.nodes, "Nodes, each with ranks/nodes ranks and its own agent")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--drills", drills, "Random fault drills")->check(CLI::Range(0, 1000000));
  app.add_option("--clean", clean, "Clean runs (default: a tenth of the drills, at least 5)")
      ->check(CLI::Range(0, 1000000));
  app.add_option_function<uint64_t>("--seed", [&](uint64_t s) { seed = s, seed_given = true; },
                                    "Seed of the drills (default: random, printed)");
  app.add_flag("--json", json, "Print the report as JSON on stdout");
  app.add_option("--json-out", json_out, "Also write the JSON report to this file");
  app.add_option("--plot", plot, "Write a PNG of accuracy and latency by fault kind (tools/sim_plot.py)");
  app.add_option("--relaunch-seconds", config.relaunch_seconds,
                 "Time lost: a relaunch's interpreters, imports and process groups, seconds (assumed)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--load-seconds", config.load_seconds, "Time lost: the checkpoint load, seconds (assumed)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-every", config.checkpoint_every,
                 "Time lost: the ranks checkpoint every this many steps and resume from the newest")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--mtbf-seconds", config.mtbf_seconds,
                 "Time lost: the job fails once in this long on average (the ETTR it keeps at the drills' cost)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--hang-timeout", config.agent.hang.floor_seconds,
                 "The hang timeout's floor, seconds (the agent's --hang-timeout; the job-wide view's timeout)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lease-seconds", config.agent.rendezvous.lease_seconds,
                 "The agents' etcd lease (rendezvous.lease_seconds): a node is lost this long after it went")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--poll-seconds", config.poll_seconds, "The agents' poll interval (poll_interval_seconds)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "Drills run in parallel on this many threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_flag("-v,--verbose", verbose, "One line per drill on stderr");
  app.add_flag("--signals", config.signals.enabled,
               "Drills of the cross-rank checks instead (issue 53): the ranks report their loss and gradient norm "
               "every step and replica digests at every snapshot; faults: a rank's norm differs, a replica's digest "
               "differs, a NaN loss, a loss spike");
  app.add_option("--tp", config.signals.tp, "--signals: tensor-parallel ranks (fastest in the rank order)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--pp", config.signals.pp, "--signals: pipeline stages (slowest); DP is ranks / (TP PP)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--shards-per-rank", config.signals.shards_per_rank,
                 "--signals: replicated shards a rank digests at each snapshot")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--snapshot-every", config.signals.snapshot_every, "--signals: steps between snapshots")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  bool cost = false;
  int cost_steps = 400, cost_job_steps = 300;
  app.add_flag("--cross-rank-cost", cost,
               "Measure what the cross-rank checks cost one node's agent (its ranks' events through a Timeline and "
               "the two detectors) and a single process holding every rank of the job, before the drills");
  app.add_option("--cost-steps", cost_steps, "--cross-rank-cost: steps of the node's view (past the digests' hold)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--cost-job-steps", cost_job_steps, "--cross-rank-cost: steps of the job-wide view (0: skip it)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  std::vector<size_t> only;
  app.add_option("--only", only,
                 "Run only these drills of the seed's list, by the numbers the report's misses give (to reproduce "
                 "one; the rest are skipped and left out of the report)");
  CLI11_PARSE(app, argc, argv);
  if (config.ranks % config.nodes != 0) {
    std::cerr << "lifeline-sim: --ranks " << config.ranks << " is not a multiple of --nodes " << config.nodes
              << std::endl;
    return 2;
  }
  if ((config.signals.enabled || cost) && config.ranks % (config.signals.tp * config.signals.pp) != 0) {
    std::cerr << "lifeline-sim: --ranks " << config.ranks << " is not a multiple of --tp x --pp" << std::endl;
    return 2;
  }
  if (clean < 0) clean = std::max(5, drills / 10);
  if (!seed_given) seed = std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32);
  std::cerr << "lifeline-sim: " << config.ranks << " ranks on " << config.nodes << " nodes, " << drills
            << " drills and " << clean << " clean runs, seed " << seed << ", " << threads << " thread(s)" << std::endl;

  // Alone on the process (the heap it measures is every thread's).
  nlohmann::json cost_report;
  if (cost) {
    const int per_node = config.ranks / config.nodes;
    std::cerr << "lifeline-sim: the cross-rank checks' cost: one node's view (" << per_node << " ranks, " << cost_steps
              << " steps)" << std::endl;
    cost_report["node"] = lifeline::agent::sim::MeasureCrossRankCost(config, 0, per_node, cost_steps);
    if (cost_job_steps > 0) {
      std::cerr << "lifeline-sim: ...and one view of the whole job (" << config.ranks << " ranks, " << cost_job_steps
                << " steps)" << std::endl;
      cost_report["job"] = lifeline::agent::sim::MeasureCrossRankCost(config, 0, config.ranks, cost_job_steps);
    }
    std::cerr << "lifeline-sim: ...and the comparison across nodes: the nodes' folds, the leader's verdict" << std::endl;
    cost_report["across_nodes"] = lifeline::agent::sim::MeasureLeaderDigestCost(config, 5);
  }

  std::vector<Drill> list = lifeline::agent::sim::MakeDrills(config, drills, clean, seed);
  if (!only.empty()) {
    std::vector<Drill> picked;
    for (size_t i : only) {
      if (i >= list.size()) {
        std::cerr << "lifeline-sim: --only " << i << ": the seed's list has " << list.size() << " drills" << std::endl;
        return 2;
      }
      picked.push_back(list[i]);
    }
    list = std::move(picked);
  }
  std::vector<DrillResult> results(list.size());
  std::atomic<size_t> next{0};
  std::atomic<size_t> finished{0};
  const auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (size_t i = next++; i < list.size(); i = next++) {
      results[i] = lifeline::agent::sim::RunDrill(config, list[i]);
      const size_t done = ++finished;
      if (verbose)
        std::fprintf(stderr, "[%zu/%zu] drill %zu %s (seed %llu): %s -> %s\n", done, list.size(), i,
                     list[i].name.c_str(), static_cast<unsigned long long>(list[i].seed),
                     results[i].verdict.c_str(), results[i].correct || list[i].faults.empty() ? "ok" : "MISS");
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  nlohmann::json report = lifeline::agent::sim::Report(config, results, seed, wall);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  report["command"] = command;
  if (cost) report["cross_rank_cost"] = cost_report;
  if (!seed_given) report["command"] = command + " --seed " + std::to_string(seed);
  const std::string text = report.dump(2);
  if (json) {
    std::cout << text << std::endl;
  } else {
    std::printf("accuracy %.4f (%d of %d drills), false alarms %d, wrong kind %d, unattributed %d\n",
                report["accuracy"].get<double>(), report["correct"].get<int>(), report["drills"].get<int>(),
                report["false_alarms"].get<int>(), report["wrong_kind"].get<int>(), report["unattributed"].get<int>());
    if (config.signals.enabled)
      std::printf("non_finite raised on the NaN's spread (the all-reduced norm; 'the rank at fault is not told'): %d\n",
                  report["spread_anomalies"].get<int>());
    for (const auto& [kind, k] : report["by_kind"].items()) {
      std::printf("  %-12s %3d drills, accuracy %s", kind.c_str(), k["drills"].get<int>(),
                  k["accuracy"].is_null() ? "-" : std::to_string(k["accuracy"].get<double>()).c_str());
      if (k.contains("latency_seconds") && !k["latency_seconds"].is_null())
        std::printf(", latency p50 %.2f s p99 %.2f s max %.2f s", k["latency_seconds"]["p50"].get<double>(),
                    k["latency_seconds"]["p99"].get<double>(), k["latency_seconds"]["max"].get<double>());
      std::printf("\n");
    }
    for (const auto& m : report["misses"]) std::printf("  miss: %s\n", m.dump().c_str());
    const nlohmann::json& lost = report["time_lost"];
    std::printf("time lost: drills' ETTR %.4f; %zu restarts, %.2f s each on average (", lost["drills_ettr"].get<double>(),
                lost["restarts"].get<size_t>(), lost["mean_seconds_per_restart"].get<double>());
    const char* sep = "";
    for (const char* phase : lifeline::agent::kLostPhases) {
      std::printf("%s%s %.2f s", sep, phase, lost["mean_seconds_by_phase"][phase].get<double>());
      sep = ", ";
    }
    std::printf("); a job failing every %.0f s keeps ETTR %.4f\n", lost["mtbf_seconds"].get<double>(),
                lost["ettr_at_mtbf"].get<double>());
    std::printf("cpu: %s\n", report["cpu"].dump().c_str());
    for (const auto& [view, c] : cost_report.items()) {
      if (view == "across_nodes") {
        const nlohmann::json &n = c["node"], &l = c["leader"];
        std::printf("replicas across nodes: per snapshot a node folds its ranks' digests in %.0f ns and adds %.0f "
                    "bytes to its summary; the leader takes %.0f folds (%.0f bytes) and compares %zu groups a "
                    "snapshot in %.0f ns (%.1f ns a rank), at most %zu bytes held, %zu raised\n",
                    n["fold_cpu_ns_per_snapshot"].get<double>(), n["summary_bytes_per_snapshot"].get<double>(),
                    l["folds_per_snapshot"].get<double>(), l["bytes_in_per_snapshot"].get<double>(),
                    l["groups_compared"].get<size_t>() / std::max(1, c["snapshots"].get<int>()),
                    l["cpu_ns_per_snapshot"].get<double>(), l["ns_per_rank"].get<double>(),
                    l["heap_peak_bytes"].get<size_t>(), c["raised"].get<size_t>());
        continue;
      }
      std::printf("cross-rank checks, %s view of %d ranks (%d replicas of a shard of %d in it): per step %.0f ns "
                  "(%.1f ns a rank), per snapshot %.0f ns (%.1f ns a rank, %.1f ns a digest), %.6f cores, "
                  "at most %zu bytes held (%.0f a rank), %zu raised\n",
                  view.c_str(), c["view_ranks"].get<int>(), c["replicas_of_a_shard_in_view"].get<int>(),
                  c["replicas_of_a_shard_in_job"].get<int>(), c["per_step"]["cpu_ns"].get<double>(),
                  c["per_step"]["ns_per_rank"].get<double>(), c["per_snapshot"]["cpu_ns"].get<double>(),
                  c["per_snapshot"]["ns_per_rank"].get<double>(), c["per_snapshot"]["ns_per_digest"].get<double>(),
                  c["cores"].get<double>(), c["memory"]["snapshot_peak_bytes"].get<size_t>(),
                  c["memory"]["snapshot_peak_bytes_per_rank"].get<double>(), c["raised"].get<size_t>());
    }
  }
  std::string json_path = json_out;
  if (!json_out.empty() || !plot.empty()) {
    if (json_path.empty()) json_path = plot + ".json";
    std::ofstream f(json_path);
    f << text << "\n";
    if (!f) {
      std::cerr << "lifeline-sim: cannot write " << json_path << std::endl;
      return 1;
    }
  }
  if (!plot.empty()) {
    const char* py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    const std::string cmd = std::string(py) + " " + Quote(FindPlotScript()) + " " + Quote(json_path) + " " + Quote(plot);
    if (std::system(cmd.c_str()) != 0) {
      std::cerr << "lifeline-sim: the plot failed: " << cmd << std::endl;
      return 1;
    }
    std::cerr << "lifeline-sim: wrote " << plot << " (from " << json_path << ")" << std::endl;
  }
  return 0;
}
