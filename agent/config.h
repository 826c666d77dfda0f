// Every knob of lifeline-agent, with its default. A YAML file (--config) sets any of them; the
// command line overrides the file. The YAML keys are the field names below, grouped as the
// structs are (see LoadAgentConfig and the README's agent.yaml example).
#ifndef LIFELINE_AGENT_CONFIG_H_
#define LIFELINE_AGENT_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lifeline/status.h"

namespace lifeline::agent {

// What the agent does about an anomaly of one kind. kRollback (non_finite, spike and sdc_suspect
// only): stop the ranks and relaunch them from the newest checkpoint taken before the anomaly's
// step (RollbackConfig).
enum class Action { kLog, kDump, kRestart, kRollback };
const char* ActionName(Action a);  // "log", "dump", "restart", "rollback"

// hang: a collective or step that does not finish within an adaptive timeout.
struct HangConfig {
  double floor_seconds = 60;   // never sooner (--hang-timeout)
  double cap_seconds = 1800;   // never later
  double multiplier = 10;      // timeout = clamp(multiplier x the longest recent duration, floor, cap)
  uint32_t window = 64;        // recent durations remembered per (comm, op) and for steps
};

// straggler: a rank consistently late into collectives, or slower in compute than its peers.
struct StragglerConfig {
  uint32_t window = 20;            // collectives (or steps) judged together
  double min_lateness_seconds = 0.010;  // below this nobody is a straggler, whatever the statistics
  double mad_threshold = 5;        // robust z-score: (x - median) / (1.4826 MAD) over the ranks
  double min_fraction = 0.7;       // share of the window in which the rank must be the outlier
  double cooldown_seconds = 60;    // the same rank is not reported again sooner
};

// slow_collective: an op on a communicator degrading against its own baseline.
struct SlowCollectiveConfig {
  uint32_t baseline_window = 50;   // first collectives of each (comm, op) make its baseline
  uint32_t recent_window = 10;     // compared with the baseline
  double factor = 2.0;             // recent median above factor x baseline median...
  double min_excess_seconds = 0.005;  // ...and above it by at least this much
  double cooldown_seconds = 60;
};

// checkpoint: persist failures, and persist lag growing past the checkpoint interval.
struct CheckpointConfig {
  double lag_factor = 1.0;        // Save-to-persisted longer than lag_factor x the interval between saves
  uint32_t lag_count = 3;         // ...for this many checkpoints in a row
  double lag_min_seconds = 0.25;  // ...each longer than the interval by at least this much: saves
                                  // a few ms behind a cadence of ms are queued, not at risk
  double cooldown_seconds = 300;
};

// non_finite, spike, disagreement: the training signals ranks report (lifeline.report, and
// clip_grad_norm_ under Python tracing), judged by agent/detectors/training_signal_detector.h.
struct TrainingSignalConfig {
  // Scalars judged for non-finite values and spikes, by name (ranks report "loss", "grad_norm" and
  // names of their own).
  std::vector<std::string> watched = {"loss", "grad_norm"};
  // A non-finite value of a watched scalar other than "loss" is an anomaly when it comes this many
  // times in a row on a rank: 1 for bf16 and fp32 training; mixed precision with a loss scaler
  // (torch.amp.GradScaler), whose skipped steps have an infinite gradient norm, wants more.
  uint32_t non_finite_in_a_row = 1;
  uint32_t window = 100;            // recent values per rank and scalar: the baseline's median and MAD
  // Values a series needs before any spike verdict: after a launch (a restart or a rollback is a
  // new launch) and after its step went back.
  uint32_t warmup_steps = 50;
  double spike_threshold = 6;          // robust z, (x - median) / (1.4826 MAD), passed...
  uint32_t spike_confirm = 3;          // ...by this many values in a row,
  double spike_single_threshold = 20;  // or by one value this high;
  double spike_min_rise = 0.3;         // and each such value above the median by this fraction of |median| at least
  double spread_floor = 0.01;          // the MAD is taken as at least this fraction of |median|
  // Scalars identical bit for bit on every rank of a replica group by construction (the global
  // gradient norm after its all-reduce in DDP and FSDP; the loss when the script all-reduces it):
  // a rank whose value differs from its group's is named. Empty: no comparison.
  std::vector<std::string> replicated = {"grad_norm"};
  // The replica groups, by global rank: 0, every rank of the job is one group; k, ranks
  // [i k, (i + 1) k) form group i (pipeline stages whose norms are not all-reduced across stages).
  uint32_t replica_group_size = 0;
  // A step's values across ranks are judged once every live rank reporting them has reported a
  // later step, or this long after the first of them came.
  double hold_seconds = 5;
};

// The rollback policy's settings (agent/rollback.h). A rollback is a restart from an older
// checkpoint: it spends the restart budget (RestartConfig::max_restarts) like any restart.
struct RollbackConfig {
  // Rollbacks to one checkpoint: one more, the same fault back after that many relaunches from it,
  // gives up (the data or the model is at fault deterministically; a relaunch cannot help).
  uint32_t max_per_checkpoint = 2;
  // Whether the relaunched ranks are told to skip the data of the steps rolled back
  // (LIFELINE_SKIP_STEPS, lifeline.skip_steps()): never; on_repeat, from the second rollback to a
  // checkpoint on (the first replays the same data: a transient fault does not come back, and the
  // job's data stays whole); always.
  enum class SkipData { kNever, kOnRepeat, kAlways };
  // (non_finite and spike only: an sdc_suspect's data is not at fault, it is never skipped.)
  SkipData skip_data = SkipData::kOnRepeat;
  // sdc_suspects naming ranks of one node (by its name, across launches) that take the node out:
  // at this many, a multi-node job leaves it out of the next rounds (the bad-node exclusion of
  // RendezvousSettings, spares taking its place); a single-node job, which cannot, gives up
  // naming the node and the ranks. 0: never. The default, 2, is the first repeat: one suspect
  // may be a cosmic ray, a second on the same machine is a defect.
  uint32_t sdc_per_node = 2;
};
const char* SkipDataName(RollbackConfig::SkipData s);  // "never", "on_repeat", "always"

struct RestartConfig {
  uint32_t max_restarts = 3;          // --max-restarts; then the agent exits non-zero with the reason
  double grace_seconds = 10;          // SIGTERM, then SIGKILL after this long
  // The wait before a relaunch: none after a launch that ran (every rank began a step, or it lived
  // a minute) and failed; for launches failing in a row before that, backoff_initial x
  // multiplier^(n-1) for the n-th, at most backoff_max.
  double backoff_initial_seconds = 1;
  double backoff_multiplier = 2;
  double backoff_max_seconds = 60;
  // --no-prestart: false. While a launch trains, start one spare interpreter per local rank for
  // the next launch, its script's imports done (agent/prestart.h); Python scripts only. They start
  // `prestart_after_seconds` after every rank began a step: not in the launch's own busy start-up,
  // and not at all for a job that ends or fails before then.
  bool prestart = true;
  double prestart_after_seconds = 10;
};

// Multi-node jobs: the agents meet and act together through etcd (agent/rendezvous.h).
struct RendezvousSettings {
  std::string endpoint;            // --rdzv-endpoint HOST:PORT of etcd; empty: a single-node job
  std::string id;                  // --rdzv-id: the job's id in etcd, shared by its agents
  uint32_t min_nodes = 1;          // --nnodes MIN[:MAX]
  uint32_t max_nodes = 1;
  int node_rank = -1;              // --node-rank; -1: in the order the nodes join
  std::string host;                // this node's address as the others reach it; empty: its hostname
  // The node's name, the same across its agents' lives (its failures are remembered by it): --node-name,
  // else Slurm's SLURMD_NODENAME, else `host`.
  std::string node_name;
  // --standby: a spare. It joins every round but is placed only where a node of the previous round
  // is missing (lost, or excluded as bad), or to make up MIN nodes.
  bool standby = false;
  // A node whose ranks failed (named dead, hung or exit_hang, or the node lost) in `exclude_after`
  // rounds within `exclude_window_seconds` is left out of the next rounds while the others (and
  // spares) still make MIN nodes; `lifeline-agent ctl SOCKET readmit NODE` takes it back. 0: never.
  uint32_t exclude_after = 2;
  double exclude_window_seconds = 3600;
  double lease_seconds = 10;       // an agent silent this long is taken for lost (node_lost)
  double last_call_seconds = 3;    // with MIN nodes in, how long a round waits for more (up to MAX)
  double join_timeout_seconds = 900;
  // How the agent follows etcd: one watch stream (etcd's load grows with the job's changes), or,
  // false, polls of the same keys every 0.25 s (for a proxy in between that does not pass streams).
  bool watch = true;
  // A rank of this node that exits with a status (or aborts) is held back this long before it is
  // acted on: it is often the echo of a failure on another node (its collective's connection
  // closed under it), and the node that failed first, by the failure times reported in etcd,
  // is the one that names its rank. A rank killed by another signal is acted on at once. 0: never.
  double failure_grace_seconds = 1;
};

// Multi-node jobs: each node's memory-tier snapshots are replicated to peer nodes' memory
// (agent/replication/), so that a step survives the loss of a node.
struct ReplicationConfig {
  bool enabled = true;
  double bandwidth_mb_per_second = 500;  // the sender's budget, 10^6 bytes per second (0: unlimited)
  uint32_t keep_last = 2;                // complete steps a node's tier keeps with the replicas
  double memory_budget_mb = 0;           // the node's tiers and replicas, 10^6 bytes (0: half of /dev/shm)
  // Placement (replication/replicator.h, ReplicaPeers): 0, a ring (each node's snapshots on the
  // next node); k >= 2, groups of k nodes, each node's snapshots on the k - 1 others of its group.
  uint32_t group_size = 0;
};

struct AgentConfig {
  uint32_t nproc = 1;                    // --nproc: local ranks
  std::vector<std::string> command;      // after "--"
  std::string metrics_addr;              // --metrics-addr HOST:PORT; empty: no HTTP listener
  std::string events_log;                // --events-log FILE; empty: stderr only
  std::string run_dir;                   // rings, dumps, control socket; empty: a private directory
                                         // under $XDG_RUNTIME_DIR or /tmp, removed at exit
  std::string job_id;                    // LIFELINE_JOB; empty: generated
  std::string checkpoint_dir;            // --checkpoint-dir: where the ranks checkpoint; the agent fixes
                                         // every launch's resume step from it (LIFELINE_RESUME_STEP).
                                         // Empty: the directory the ranks report (from the second launch on)
  std::string master_addr = "127.0.0.1";
  uint32_t master_port = 29500;          // 0: pick a free port
  uint64_t ring_events = 65536;          // per rank
  double poll_interval_seconds = 0.01;   // how often the rings are drained
  uint32_t dump_events = 1000;           // events per rank in a diagnostic dump
  // A rank still alive this long after every other local rank exited 0, with no event since, is
  // stuck in its exit (a collective library's teardown): named exit_hang and stopped; the job ends
  // with the others' status. Long enough for a last export by one rank; one that takes longer says
  // it is alive (lifeline.trace.heartbeat()). 0: never.
  double exit_hang_seconds = 300;
  // What the scheduler's environment said (agent/scheduler_env.h), for the events log: its name,
  // the variables read, the allocation's hosts and how often it was requeued.
  std::string scheduler;
  std::vector<std::pair<std::string, std::string>> scheduler_env;
  std::vector<std::string> allocation_hosts;
  uint32_t requeues = 0;
  // Python ranks trace their steps and collectives with no code change (a startup hook on their
  // PYTHONPATH; see lib/python/lifeline/_autotrace.py). --no-python-tracing turns it off.
  bool python_tracing = true;
  std::string python_step_from;          // LIFELINE_STEP_FROM for the ranks: "optimizer" (steps end at
                                         // optimizer.step()) or "none"; empty: theirs, else "optimizer"
  HangConfig hang;
  StragglerConfig straggler;
  SlowCollectiveConfig slow_collective;
  CheckpointConfig checkpoint;
  TrainingSignalConfig training_signals;
  RestartConfig restart;
  RollbackConfig rollback;
  RendezvousSettings rendezvous;
  ReplicationConfig replication;
  // Per anomaly kind ("dead", "hang", "straggler", "slow_collective", "checkpoint", "node_lost",
  // "non_finite", "spike", "disagreement", "sdc_suspect"). rollback is allowed for non_finite, spike
  // and sdc_suspect only: the others are faults of the machines or of one rank, which a rollback
  // to older state cannot cure. These three roll back by default: their damage is in the model
  // already (a NaN spreads through the all-reduce and the update; a spike's update is applied; a
  // corrupted replica feeds its gradients into every other's), so training on, or restarting from
  // the newest checkpoint that may hold it, keeps the damage; `log` keeps the detection without
  // the action.
  std::map<std::string, Action> policy = {{"dead", Action::kRestart},
                                          {"hang", Action::kRestart},
                                          {"straggler", Action::kLog},
                                          {"slow_collective", Action::kLog},
                                          {"checkpoint", Action::kLog},
                                          {"node_lost", Action::kRestart},
                                          {"non_finite", Action::kRollback},
                                          {"spike", Action::kRollback},
                                          {"disagreement", Action::kLog},
                                          {"sdc_suspect", Action::kRollback}};
};

// Reads the YAML file at `path` into `config` (fields absent from the file keep their values).
// InvalidArgument naming the file, the line and the key for an unknown key, a value of the wrong
// type or out of range, or an unknown action; NotFound when the file does not exist.
Status LoadAgentConfig(const std::string& path, AgentConfig* config);

// Checks the values (positive windows, floor <= cap, a command given...). InvalidArgument naming
// the field.
Status ValidateAgentConfig(const AgentConfig& config);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_CONFIG_H_
