// lifeline-agent: the per-node sidecar.
//
//   lifeline-agent run --nproc N [--config agent.yaml] [--hang-timeout S] [--max-restarts R]
//                      [--events-log FILE] [--run-dir DIR] [--metrics-addr HOST:PORT]
//                      [--nnodes MIN[:MAX] --rdzv-endpoint HOST:PORT --rdzv-id ID ...]
//                      [--no-python-tracing] -- CMD ARGS...
//   lifeline-agent ctl SOCKET [status|dump|metrics|help|readmit NODE]
//
// Flags (torchrun's spellings too: --nproc_per_node, --node_rank, --rdzv_endpoint, ...) override
// the YAML file, which overrides what the scheduler's environment says (Slurm's SLURM_*, torchrun's
// PET_*: agent/scheduler_env.h), which overrides the defaults (agent/config.h).
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "agent/agent.h"
#include "agent/config.h"
#include "agent/control_socket.h"
#include "agent/rendezvous.h"
#include "agent/scheduler_env.h"

namespace {

constexpr int kUsage = 2;

int RunCommand(lifeline::agent::AgentConfig config) {
  if (lifeline::Status s = lifeline::agent::ValidateAgentConfig(config); !s.ok()) {
    std::cerr << "lifeline-agent: " << s.ToString() << std::endl;
    return kUsage;
  }
  lifeline::agent::Agent agent(std::move(config));
  return agent.Run();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lifeline-agent: launches and supervises the local ranks of a training job, detects dead ranks, "
               "hangs, stragglers and slow collectives, names the culprit rank and restarts the job"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lifeline-agent " LIFELINE_VERSION);

  CLI::App* run = app.add_subcommand("run", "Launch N local ranks of CMD and supervise them");
  std::string config_path, events_log, run_dir, metrics_addr;
  double hang_timeout = 0;
  uint32_t max_restarts = 0;
  uint32_t master_port = 0;
  std::vector<std::string> command;
  std::string nproc_text;
  CLI::Option* nproc_opt = run->add_option("--nproc,--nproc-per-node,--nproc_per_node", nproc_text,
                                           "Local ranks to launch on each node: 1..1024, auto (the GPUs, else 1), "
                                           "gpu or cpu (default 1, or PET_NPROC_PER_NODE)");
  std::string nnodes, rdzv_endpoint, rdzv_id, rdzv_backend, node_host, node_name, master_addr;
  int node_rank = -1;
  CLI::Option* nnodes_opt = run->add_option("--nnodes", nnodes,
                                            "MIN[:MAX] nodes of the job (default 1, or SLURM_NNODES, or PET_NNODES); "
                                            "more than one needs --rdzv-endpoint");
  CLI::Option* endpoint_opt = run->add_option("--rdzv-endpoint,--rdzv_endpoint", rdzv_endpoint,
                                              "etcd HOST:PORT where the nodes' agents meet (etcd v3 API)");
  CLI::Option* id_opt = run->add_option("--rdzv-id,--rdzv_id", rdzv_id,
                                        "The job's id in etcd, the same on every node (default under Slurm: "
                                        "slurm-JOBID-REQUEUES)");
  CLI::Option* backend_opt = run->add_option("--rdzv-backend,--rdzv_backend", rdzv_backend, "etcd or etcd-v2 (torchrun's flag; the agents meet in etcd)");
  CLI::Option* node_rank_opt =
      run->add_option("--node-rank,--node_rank", node_rank,
                      "This node's place (GROUP_RANK); default: SLURM_NODEID, PET_NODE_RANK, or in the order nodes join")
          ->check(CLI::Range(0, 100000));
  CLI::Option* host_opt = run->add_option("--node-host", node_host,
                                          "This node's address as the other nodes reach it (default: its hostname)");
  CLI::Option* name_opt = run->add_option("--node-name", node_name,
                                          "This node's lasting name, by which its failures are remembered (default: "
                                          "SLURMD_NODENAME, else the node's address)");
  bool standby = false;
  run->add_flag("--standby", standby,
                "A spare node: joins every round, is placed only where a node is missing or excluded as bad");
  bool standalone = false;
  CLI::Option* standalone_opt = run->add_flag("--standalone", standalone, "One node, no rendezvous (torchrun's flag)");
  CLI::Option* master_addr_opt = run->add_option("--master-addr,--master_addr", master_addr,
                                                 "MASTER_ADDR for the ranks of a single-node job (default 127.0.0.1)");
  run->add_option("--config", config_path, "YAML file with any of the agent's settings (see the README)");
  CLI::Option* metrics_opt = run->add_option("--metrics-addr", metrics_addr, "Serve Prometheus metrics on HOST:PORT");
  CLI::Option* hang_opt =
      run->add_option("--hang-timeout", hang_timeout, "Floor of the adaptive hang timeout, seconds (default 60)")
          ->check(CLI::PositiveNumber);
  CLI::Option* restarts_opt =
      run->add_option("--max-restarts,--max_restarts", max_restarts, "Restart budget (default 3)")->check(CLI::NonNegativeNumber);
  CLI::Option* port_opt =
      run->add_option("--master-port,--master_port", master_port, "MASTER_PORT for the ranks (default 29500; 0 picks a free port "
                                                    "for every launch)")
          ->check(CLI::Range(0, 65535));
  CLI::Option* log_opt = run->add_option("--events-log", events_log, "Append anomalies and actions as JSON lines here");
  std::string checkpoint_dir;
  CLI::Option* ckpt_opt = run->add_option("--checkpoint-dir", checkpoint_dir,
                                          "The ranks' checkpoint directory: every launch resumes all ranks from the "
                                          "same step, the newest complete one on disk or in memory "
                                          "(LIFELINE_RESUME_STEP; default: the directory the ranks report)");
  CLI::Option* dir_opt = run->add_option("--run-dir", run_dir,
                                         "Directory for the trace rings, dumps and the control socket (default: a "
                                         "private one under $XDG_RUNTIME_DIR or /tmp, removed at exit)");
  bool no_python_tracing = false;
  run->add_flag("--no-python-tracing", no_python_tracing,
                "Do not trace Python ranks' steps (optimizer.step) and torch.distributed collectives "
                "automatically (python_tracing: false in the YAML file)");
  bool no_prestart = false;
  run->add_flag("--no-prestart", no_prestart,
                "Start every relaunched rank afresh, not in a spare Python interpreter started ahead with "
                "the script's imports done (restart.prestart: false in the YAML file)");
  run->add_option("command", command, "The rank's command, after --")->required();

  CLI::App* ctl = app.add_subcommand("ctl", "Ask a running agent over its control socket");
  std::string socket_path, request = "status";
  std::vector<std::string> request_args;
  ctl->add_option("socket", socket_path, "The agent's control socket (RUN_DIR/control.sock)")->required();
  ctl->add_option("request", request, "status (default), dump, metrics, help, or readmit NODE (a multi-node job: "
                                      "take back a node excluded as bad)");
  ctl->add_option("args", request_args, "The request's arguments");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsage;
  }

  if (ctl->parsed()) {
    for (const std::string& a : request_args) request += " " + a;
    auto reply = lifeline::agent::ControlRequest(socket_path, request, 5.0);
    if (!reply.ok()) {
      std::cerr << "lifeline-agent ctl: " << reply.status().ToString() << std::endl;
      return 1;
    }
    std::cout << *reply << std::endl;
    return reply->rfind("error", 0) == 0 || reply->find("\"error\"") != std::string::npos ? 1 : 0;
  }

  lifeline::agent::AgentConfig config;
  // The scheduler's word first: the file and the flags override it.
  // torchrun's variables are its flags' defaults: one whose flag was given is not read at all (a
  // bad value there must not stop an agent told otherwise).
  const std::map<std::string, const CLI::Option*> flag_of = {
      {"PET_NNODES", nnodes_opt},          {"PET_NPROC_PER_NODE", nproc_opt}, {"PET_NODE_RANK", node_rank_opt},
      {"PET_RDZV_ENDPOINT", endpoint_opt}, {"PET_RDZV_ID", id_opt},          {"PET_RDZV_BACKEND", backend_opt},
      {"PET_MASTER_ADDR", master_addr_opt}, {"PET_MASTER_PORT", port_opt},   {"PET_MAX_RESTARTS", restarts_opt},
      {"PET_STANDALONE", standalone_opt}};
  lifeline::Result<lifeline::agent::SchedulerJob> scheduled =
      lifeline::agent::ReadSchedulerEnv([&flag_of](const char* name) -> const char* {
        const auto it = flag_of.find(name);
        if (it != flag_of.end() && it->second->count() > 0) return nullptr;
        return std::getenv(name);
      });
  if (!scheduled.ok()) {
    std::cerr << "lifeline-agent: " << scheduled.status().ToString() << std::endl;
    return kUsage;
  }
  lifeline::agent::ApplySchedulerJob(*scheduled, &config);
  if (!config_path.empty()) {
    if (lifeline::Status s = lifeline::agent::LoadAgentConfig(config_path, &config); !s.ok()) {
      std::cerr << "lifeline-agent: " << s.ToString() << std::endl;
      return kUsage;
    }
  }
  if (nproc_opt->count() > 0) {
    lifeline::Result<uint32_t> n = lifeline::agent::ParseNprocPerNode(nproc_text, "--nproc-per-node " + nproc_text);
    if (!n.ok()) {
      std::cerr << "lifeline-agent: " << n.status().ToString() << std::endl;
      return kUsage;
    }
    config.nproc = *n;
  }
  if (!rdzv_backend.empty() && rdzv_backend != "etcd" && rdzv_backend != "etcd-v2") {
    std::cerr << "lifeline-agent: --rdzv-backend " << rdzv_backend
              << ": the agents meet in etcd (its v3 API): use etcd and --rdzv-endpoint HOST:PORT of an etcd" << std::endl;
    return kUsage;
  }
  if (nnodes_opt->count() > 0) {
    if (lifeline::Status s = lifeline::agent::ParseNodeRange(nnodes, &config.rendezvous.min_nodes,
                                                             &config.rendezvous.max_nodes);
        !s.ok()) {
      std::cerr << "lifeline-agent: " << s.ToString() << std::endl;
      return kUsage;
    }
  }
  if (endpoint_opt->count() > 0) config.rendezvous.endpoint = rdzv_endpoint;
  if (id_opt->count() > 0) config.rendezvous.id = rdzv_id;
  if (node_rank_opt->count() > 0) config.rendezvous.node_rank = node_rank;
  if (host_opt->count() > 0) config.rendezvous.host = node_host;
  if (name_opt->count() > 0) config.rendezvous.node_name = node_name;
  if (standby) config.rendezvous.standby = true;
  if (master_addr_opt->count() > 0) config.master_addr = master_addr;
  if (standalone) {  // torchrun's: one node, whatever the environment said
    config.rendezvous.endpoint.clear();
    config.rendezvous.min_nodes = config.rendezvous.max_nodes = 1;
    config.rendezvous.node_rank = -1;
  }
  if (hang_opt->count() > 0) config.hang.floor_seconds = hang_timeout;
  if (restarts_opt->count() > 0) config.restart.max_restarts = max_restarts;
  if (port_opt->count() > 0) config.master_port = master_port;
  if (log_opt->count() > 0) config.events_log = events_log;
  if (dir_opt->count() > 0) config.run_dir = run_dir;
  if (ckpt_opt->count() > 0) config.checkpoint_dir = checkpoint_dir;
  if (metrics_opt->count() > 0) config.metrics_addr = metrics_addr;
  if (no_python_tracing) config.python_tracing = false;
  if (no_prestart) config.restart.prestart = false;
  config.command = command;
  if (!scheduled->schedulers.empty()) {
    config.scheduler = scheduled->schedulers.front();
    for (size_t k = 1; k < scheduled->schedulers.size(); ++k) config.scheduler += "+" + scheduled->schedulers[k];
  }
  config.scheduler_env = scheduled->read;
  config.allocation_hosts = scheduled->hosts;
  config.requeues = scheduled->requeues.value_or(0);
  return RunCommand(std::move(config));
}
