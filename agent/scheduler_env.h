// What the scheduler that started lifeline-agent says about the job, read from its environment:
// Slurm's SLURM_* variables (an agent started by `srun --ntasks-per-node=1` inside an allocation),
// or torchrun's PET_* variables (Kubeflow's PyTorchJob operator, a JobSet's pods, or anyone who
// configures torchrun through its environment). The agent's settings are layered: defaults, then
// these, then the --config file, then the command line; each layer sets only what it names.
//
// Slurm:    node count SLURM_STEP_NUM_NODES (the step's) or SLURM_NNODES, node rank SLURM_NODEID,
//           node name SLURMD_NODENAME, the allocation's hosts SLURM_JOB_NODELIST (expanded), the
//           rendezvous id "slurm-<SLURM_JOB_ID>-<SLURM_RESTART_COUNT>" (a requeued job meets afresh,
//           and resumes from its checkpoint), the job id SLURM_JOB_ID.
// torchrun: PET_NNODES (N or MIN:MAX), PET_NPROC_PER_NODE (a number, or auto/gpu/cpu),
//           PET_NODE_RANK, PET_RDZV_ENDPOINT, PET_RDZV_ID, PET_RDZV_BACKEND (etcd or etcd-v2: the
//           only store the agents meet in), PET_MASTER_ADDR, PET_MASTER_PORT, PET_MAX_RESTARTS,
//           PET_STANDALONE, PET_RDZV_CONF (its join_timeout and last_call_timeout, in seconds).
// A PET_* variable whose flag is on the command line is not read (the caller's lookup hides it):
// they are torchrun's flags' defaults.
// When both are present (torchrun's variables inside a Slurm job), each PET_* variable wins over
// what Slurm's say about the same setting: it was set for the agent on purpose.
#ifndef LIFELINE_AGENT_SCHEDULER_ENV_H_
#define LIFELINE_AGENT_SCHEDULER_ENV_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agent/config.h"
#include "lifeline/status.h"

namespace lifeline::agent {

// Reads one variable; nullptr when unset. The process environment by default (tests pass a map).
using EnvLookup = std::function<const char*(const char*)>;

struct SchedulerJob {
  std::vector<std::string> schedulers;  // "slurm", "torchrun": whose variables were found
  std::optional<uint32_t> min_nodes, max_nodes;
  std::optional<int> node_rank;
  std::optional<uint32_t> nproc;
  std::optional<uint32_t> max_restarts;
  std::optional<uint32_t> master_port;
  std::string master_addr;
  std::string rdzv_endpoint;
  std::string rdzv_id;
  std::string node_name;
  std::string job_id;
  bool standalone = false;           // PET_STANDALONE: one node, no rendezvous
  std::optional<double> join_timeout_seconds, last_call_seconds;  // PET_RDZV_CONF
  std::vector<std::string> hosts;    // Slurm's allocation, expanded, in its order
  std::optional<uint32_t> requeues;  // SLURM_RESTART_COUNT
  // For the events log: every variable read, with its value.
  std::vector<std::pair<std::string, std::string>> read;
};

// The scheduler's view of the job. InvalidArgument naming the variable and its value when one is
// malformed, or when the environment asks for what the agent cannot do (a rendezvous backend other
// than etcd; several agents per node under Slurm; a multi-node Slurm job started outside srun).
Result<SchedulerJob> ReadSchedulerEnv(const EnvLookup& lookup);

// Applies `job` to `config` (the layer between the defaults and the --config file).
void ApplySchedulerJob(const SchedulerJob& job, AgentConfig* config);

// Expands a Slurm host list ("node[01-03,7],gpu-a,rack[1-2]-n[1-2]") into names, in order.
// InvalidArgument naming the text on an unbalanced bracket, a bad range, or more than 100,000 names.
Result<std::vector<std::string>> ExpandHostList(const std::string& text);

// The number of local ranks for torchrun's --nproc-per-node values "auto" and "gpu" (the GPUs of
// this machine: /dev/nvidia0.. ; "auto" falls back to 1 without GPUs) and "cpu" (the usable CPUs);
// a decimal number as itself. InvalidArgument naming `what` otherwise, or for "gpu" without GPUs.
Result<uint32_t> ParseNprocPerNode(const std::string& value, const std::string& what);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_SCHEDULER_ENV_H_
