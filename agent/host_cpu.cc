#include "agent/host_cpu.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

namespace lifeline::agent {
namespace {

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// How far `a` (a straggler) trails its peers, by the basis it was judged on; a huge value when the
// evidence does not say (never host noise then).
double StragglerExcess(const nlohmann::json& e) {
  const bool compute = e.value("basis", "") == "compute";
  const char* own = compute ? "compute_median_seconds" : "lateness_median_seconds";
  const char* peers = compute ? "peers_compute_median_seconds" : "peers_lateness_median_seconds";
  if (!e.contains(own) || !e[own].is_number() || !e.contains(peers) || !e[peers].is_number()) return 1e9;
  return e[own].get<double>() - e[peers].get<double>();
}

}  // namespace

std::string HostCpu::Describe() const {
  char buf[96];
  if (pressure_percent >= 0) {
    std::snprintf(buf, sizeof(buf), "cpu pressure %.0f%% (some avg10)", pressure_percent);
  } else {
    std::snprintf(buf, sizeof(buf), "load %.1f per cpu", load_per_cpu);
  }
  return buf;
}

HostCpu ParseHostCpu(const std::string& pressure, const std::string& loadavg, int cpus) {
  HostCpu h;
  const size_t at = pressure.find("some avg10=");
  if (at != std::string::npos) h.pressure_percent = std::strtod(pressure.c_str() + at + 11, nullptr);
  h.load_per_cpu = std::strtod(loadavg.c_str(), nullptr) / (cpus > 0 ? cpus : 1);
  h.saturated = h.pressure_percent >= 0 ? h.pressure_percent >= 30 : h.load_per_cpu >= 1.5;
  return h;
}

HostCpu SampleHostCpu() {
  return ParseHostCpu(ReadSmallFile("/proc/pressure/cpu"), ReadSmallFile("/proc/loadavg"),
                      static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

namespace {

// Whether every lagging rank's saves persisted within kHostNoiseLagFactor x the interval between
// saves (the checkpoint detector's per-rank evidence).
bool PersistenceWithinHostNoise(const nlohmann::json& per_rank) {
  if (!per_rank.is_object() || per_rank.empty()) return false;
  for (const auto& [rank, e] : per_rank.items()) {
    const double interval = e.value("interval_seconds", 0.0);
    const nlohmann::json persist = e.value("persist_seconds", nlohmann::json::array());
    if (!(interval > 0) || !persist.is_array() || persist.empty()) return false;
    for (const nlohmann::json& p : persist)
      if (!p.is_number() || p.get<double>() >= kHostNoiseLagFactor * interval) return false;
  }
  return true;
}

}  // namespace

std::vector<Anomaly> TakeHostNoise(const HostCpu& host, std::vector<Anomaly>* anomalies) {
  std::vector<Anomaly> taken;
  if (!host.saturated) return taken;
  std::vector<Anomaly> kept;
  for (Anomaly& a : *anomalies) {
    bool noise = false;
    if (a.kind == "slow_collective") {
      noise = a.ranks.empty();
    } else if (a.kind == "straggler") {
      noise = true;
      const nlohmann::json& per_rank = a.evidence.value("per_rank", nlohmann::json::object());
      for (int r : a.ranks) {
        const std::string key = std::to_string(r);
        if (!per_rank.contains(key) || StragglerExcess(per_rank[key]) >= kHostNoiseSeconds) noise = false;
      }
    } else if (a.kind == "checkpoint" && a.evidence.contains("lag_factor") && a.evidence.contains("per_rank")) {
      noise = PersistenceWithinHostNoise(a.evidence["per_rank"]) && !a.ranks.empty();
    }
    (noise ? taken : kept).push_back(std::move(a));
  }
  *anomalies = std::move(kept);
  return taken;
}

}  // namespace lifeline::agent
