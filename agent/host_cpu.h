// How busy this host's CPUs are, so that the agent does not page for the host: on a host whose
// CPUs are saturated (other jobs, a build, a noisy neighbour), a rank a few milliseconds late into
// its collectives, or a communicator a little slower as a whole, is what any runnable process
// waiting for a core looks like, not a fault of the job.
//
// The measure is the kernel's pressure stall information (/proc/pressure/cpu, "some avg10": the
// share of the last 10 s in which at least one runnable task waited for a CPU); on kernels without
// it, the 1-minute load average per CPU.
//
// Thread safety: the functions share no state.
#ifndef LIFELINE_AGENT_HOST_CPU_H_
#define LIFELINE_AGENT_HOST_CPU_H_

#include <string>
#include <vector>

#include "agent/detector.h"

namespace lifeline::agent {

struct HostCpu {
  double pressure_percent = -1;  // PSI cpu some avg10; -1 when the kernel has none
  double load_per_cpu = 0;       // 1-minute load average / online CPUs
  bool saturated = false;        // pressure >= 30 %, or without PSI load per CPU >= 1.5

  // "cpu pressure 45% (some avg10)" or "load 3.1 per cpu".
  std::string Describe() const;
};

HostCpu SampleHostCpu();
// From the texts of /proc/pressure/cpu (empty: none) and /proc/loadavg, with `cpus` online.
HostCpu ParseHostCpu(const std::string& pressure, const std::string& loadavg, int cpus);

// A lateness or slowdown under this is within what a runnable process waits for a core on a
// saturated host (the CFS scheduler's latency target is 24 ms with many tasks).
inline constexpr double kHostNoiseSeconds = 0.025;

// Persistence lagging the saves by less than this factor of the interval between them: on a
// saturated host the persist threads wait for cores as the ranks do.
inline constexpr double kHostNoiseLagFactor = 2.0;

// Of `anomalies`, takes out those a saturated host explains: a straggler whose every culprit is
// less than kHostNoiseSeconds behind its peers, a slow_collective that names no rank (the whole
// communicator slower, the host's CPUs being what all its members share), and a checkpoint lag
// whose every save persisted within kHostNoiseLagFactor x the interval between saves (never a
// failed save). They are returned, to be logged but not raised. Nothing is taken when the host is
// not saturated.
std::vector<Anomaly> TakeHostNoise(const HostCpu& host, std::vector<Anomaly>* anomalies);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_HOST_CPU_H_
