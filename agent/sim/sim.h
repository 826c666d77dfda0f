// lifeline-sim: the agent's real detectors driven by a simulated job of many ranks on many nodes,
// with faults injected, to measure whether they name the right rank and the right kind, how
// often they raise a false alarm, and how long they take (issue 22, "lifeline-sim").
//
// What is real and what is simulated. Real (the agent's own code, called as the agent calls it):
// each node's agent is a Supervisor (agent/supervisor.h), the very class Agent::Run drives, with
// its Timeline, detectors, progress summaries, the leader's JobView, the echo hold, node_lost and
// the policies, polled every poll interval with the node's events, its ranks' exits and its
// watcher's news, as Agent::Run polls it; the summaries (only what the leader has not had) go
// through EncodeProgress, DecodeSummary and the leader's SummaryMerger as on their way to it. Simulated, on a virtual clock (nothing sleeps): the ranks (steps
// with lognormal compute jitter and rare spikes, one allreduce over the world per step completing
// ring-like), the processes' exits as waitpid reports them, the control plane as Rendezvous::Watch
// sees it (leases renewed every lease/3, the watcher's loop every 0.25 s, summaries sent straight
// to the leader once a second, the leader's election and its look for lost nodes: a lease gone, or
// a node silent for two summaries' time that a probe does not reach in 0.5 s) and etcd as the
// Supervisor asks it (the failure reports of rounds/R/failures/), and hosts whose CPUs are never
// saturated. With SignalModel on, the ranks also report their training signals and snapshot
// digests, which each node's Supervisor judges with its own detectors (issue 53's cross-rank
// checks: within the node's ranks; nothing of them goes to the leader). A drill ends at the first
// restart; nothing is relaunched.
//
// Thread safety: RunDrill is safe to call concurrently for different drills (nothing shared).
#ifndef LIFELINE_AGENT_SIM_SIM_H_
#define LIFELINE_AGENT_SIM_SIM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/config.h"
#include "agent/detector.h"
#include "agent/time_ledger.h"

namespace lifeline::agent::sim {

enum class FaultKind {
  kHang,       // the rank begins a step and never begins its collective; it stays alive
  kCrash,      // the rank's process ends during a step (a signal or an exit status)
  kNodeLoss,   // the node's agent and ranks vanish at once; its etcd lease runs out
  kStraggler,  // the rank computes `factor` times slower from `step` on
  kSlowLink,   // the rank's part of every collective takes `factor` times the op's time from `step` on
  // Faults that stop nothing (SignalModel on; issue 53): what the cross-rank checks must name.
  kNormDiffers,    // the rank's gradient norm at `step` differs from the job's in its lowest bit
  kDigestDiffers,  // the rank's copy of one replicated shard differs at the first snapshot at or after `step`
  kNanLoss,        // the rank's loss is NaN at `step`; the all-reduce spreads it into every rank's norm,
                   // the update into every rank's later losses
  kLossSpike,      // the rank's loss is `factor` times its level for `spike_steps` steps from `step`
};
// "hang", "crash", "node_loss", "straggler", "slow_link", "norm_differs", "digest_differs",
// "nan_loss", "loss_spike"
const char* FaultName(FaultKind kind);
// The anomaly kind that names the fault: "hang", "dead", "node_lost", "straggler", "slow_collective",
// "disagreement", "sdc_suspect", "non_finite", "spike".
const char* ExpectedKind(FaultKind kind);
bool IsSignalFault(FaultKind kind);  // one of the four that stop nothing

struct Fault {
  FaultKind kind = FaultKind::kHang;
  int rank = 0;             // global; for kNodeLoss any rank of the node
  int step = 0;             // the step it happens in (or from)
  double factor = 1;        // kStraggler, kSlowLink
  int wait_status = 0;      // kCrash: as waitpid reports it
  double at_fraction = 0.5; // kCrash, kNodeLoss: how far into the step's compute
  // kCrash: peers it brings down, as gloo and NCCL do when a connection closes: each fails with
  // exit status 1 `echo_after_seconds` after the crash (or after it entered the collective the
  // crashed rank never joins, if later), inside that collective. They are no culprits: an anomaly
  // naming one is a false alarm. Random drills have none; tests set them.
  std::vector<int> echo_ranks;
  double echo_after_seconds = 0.05;
  int spike_steps = 3;      // kLossSpike
};

// The training signals and snapshot digests the simulated ranks report (issue 53), off unless
// `enabled`. The job's layout is TP x PP x DP in Megatron-LM's rank order (tensor-parallel rank
// fastest, then data-parallel, then pipeline stage): global rank = tp + TP (dp + DP pp), DP =
// ranks / (TP PP). Every step each rank reports its loss (its own batch's: a rank's value, noisy
// around a slowly decaying level) and the global gradient norm after its all-reduce (one value per
// step, bit-identical on every rank of the job: replica_group_size 0). Every `snapshot_every` steps
// each rank digests its copy of `shards_per_rank` replicated shards (the parameters of its (tp, pp)
// piece of the model; their DP replicas hold the same bytes), reported as trace::kReplicaDigest
// events once the snapshot's copy is done, before the next step's optimizer update.
struct SignalModel {
  bool enabled = false;
  int tp = 1, pp = 1;
  int shards_per_rank = 72;  // Llama 3 405B on PP 16: about 8 layers of 9 tensors per stage
  int snapshot_every = 10;   // steps
  double loss = 2.5, loss_noise = 0.05;     // the loss's level at step 0 and its relative noise per rank
  double grad_norm = 1.0, grad_norm_sigma = 0.2;  // the norm's median and log-normal sigma per step
};

struct Drill {
  std::string name;           // "hang", ..., "straggler+hang", "clean"
  std::vector<Fault> faults;  // none: a clean run
  int steps = 200;            // steps the ranks run unless a fault stops them
  uint64_t seed = 1;
  // After the ranks' last step, how long the agents are still polled (at least 3 summaries' time):
  // a digest comparison waits for replicas elsewhere (ReplicaDigestDetector's hold) this long.
  double tail_seconds = 0;
};

struct SimConfig {
  int ranks = 1024;
  int nodes = 128;
  AgentConfig agent;  // the detectors' settings and the policies (agent/config.h defaults)
  // The simulated job (seconds).
  double compute_seconds = 0.080;   // median per step
  double compute_sigma = 0.03;      // lognormal sigma of compute
  double spike_probability = 0.001; // per rank and step: a host hiccup...
  double spike_min_seconds = 0.020, spike_max_seconds = 0.080;  // ...of this much more compute
  double op_seconds = 0.015;        // allreduce once the last rank posted its part (median)
  double op_sigma = 0.10;           // lognormal sigma of the op
  double congestion_probability = 0.02;  // per collective: the op takes 1.2-1.8x
  double post_seconds = 0.0002;     // CollectiveBegin to CollectivePosted
  double ring_spread_seconds = 0.0005;   // ranks leave the ring this far apart at most
  double update_seconds = 0.005;    // optimizer update, after the collective
  double clock_skew_ms = 1.0;       // sigma of the nodes' wall clocks around true time (NTP)
  // The agent's loop and etcd, as agent.cc and rendezvous.cc pace them.
  double poll_seconds = 0.01;       // the agent's poll interval (config.poll_interval_seconds)
  double publish_seconds = 0.5;     // the agent hands its summary to the watcher this often
  double watch_seconds = 0.25;      // the watcher's loop (Rendezvous::Watch: 0.25 s; 0.1 s on the leader, modelled coarser)
  double progress_seconds = 1.0;    // RendezvousConfig::progress_seconds
  // After a fault that stops the job, how long to wait for a verdict before calling it missed.
  double give_up_seconds = 30;
  // The restart after the verdict, for the time-lost account (agent/time_ledger.h): how long the
  // agent takes to stop the ranks, the relaunch (interpreters, imports, process groups) and the
  // checkpoint load; the ranks checkpoint every `checkpoint_every` steps and resume from the newest.
  double stop_seconds = 0.5;
  double relaunch_seconds = 3.0;
  double load_seconds = 1.0;
  int checkpoint_every = 50;
  // A job of the simulated size fails once in this long on average (the largest published runs:
  // under two hours): the ETTR such a job keeps, given the time a restart costs in the drills.
  double mtbf_seconds = 7200;
  SignalModel signals;
};

// One anomaly as some agent raised it.
struct Raised {
  Anomaly anomaly;
  int node = 0;          // the group rank of the node whose agent raised it
  double seconds = 0;    // when, on the simulation's clock
};

struct FaultOutcome {
  std::string expected_kind;
  std::vector<int> culprits;
  double onset_seconds = 0;  // hang: the stalled collective's first begin; crash and node loss:
                             // the exit; straggler and slow link: the first slowed step
  bool named = false;        // the expected kind named every culprit
  bool preempted = false;    // it began after its node's agent had left the round (seen a restart
                             // for another fault): its ranks were being stopped, it is not scored
  double latency_seconds = -1;  // the first such anomaly after the onset; -1 when not named
};

struct DrillResult {
  Drill drill;
  bool correct = false;            // every fault named, and nothing else named
  std::vector<FaultOutcome> faults;
  std::vector<Raised> raised;      // every anomaly raised, in order
  int false_alarms = 0;            // anomalies naming a rank no fault touched (any in a clean run)
  // non_finite anomalies of a drill with a NaN loss that name the ranks holding only its spread (the
  // all-reduced norm every rank shares, the losses after the update), saying the rank at fault is
  // not told (their evidence's rank_own_value false): the nodes without the faulty rank raise them.
  int spread_anomalies = 0;
  int wrong_kind = 0;              // anomalies naming a faulty rank with another fault's kind
  int unattributed = 0;            // anomalies naming no rank
  std::vector<int> echoes;         // ranks whose failure was held and logged as an echo
  std::string verdict;             // a line for a person: what was named, what was missed
  double simulated_seconds = 0;
  // Detector CPU (this thread's CPU time) and what it was fed.
  uint64_t node_events = 0;        // events applied to the nodes' timelines
  double node_cpu_seconds = 0;     // Timeline::Apply, detectors' Observe/RankExited/Poll
  uint64_t summary_ranks = 0;      // rank summaries built and published
  double summary_cpu_seconds = 0;  // SummarizeProgress + EncodeProgress
  uint64_t view_reads = 0;         // leader reads of every summary
  uint64_t view_samples = 0;       // ended collectives new to the leader (what JobView replays, x3 events)
  double view_cpu_seconds = 0;     // DecodeSummary, SummaryMerger + JobView::Update
  uint64_t summary_bytes = 0;      // summaries delivered to the leader (before zstd)
  // The time-lost account of the node that decided the restart (or node 0's, with no restart):
  // wall time from the first launch to the relaunched ranks' first step, productive time, and the
  // restart's cost by phase.
  double ettr = 1;
  double wall_seconds = 0;
  std::optional<RestartCost> restart_cost;
};

// Runs one drill to its end: a restart decided by some agent (and seen by all), or the ranks'
// last step, or give_up_seconds after a fault that stopped the job.
DrillResult RunDrill(const SimConfig& config, const Drill& drill);

// `count` random drills (each kind, and two at once, equally likely) and `clean` clean runs, all
// from `seed`. With config.signals.enabled, the drills are of the four signal faults instead
// (equally likely); the digest drills and the clean runs are polled until a node's digest
// comparison waiting for replicas elsewhere has been judged (tail_seconds).
std::vector<Drill> MakeDrills(const SimConfig& config, int count, int clean, uint64_t seed);

// What the cross-rank checks (TrainingSignalDetector, ReplicaDigestDetector) cost an agent whose
// view holds `view_ranks` ranks of the job from rank `first_rank` on (8: one node's agent; the whole
// job: a single process comparing every rank, which the agent does not do), fed the events the
// simulated ranks of config.signals send for `steps` steps (a snapshot every snapshot_every), through
// a Timeline and the two real detectors, polled every config.poll_seconds. CPU is this thread's;
// memory is the heap the two detectors hold at their fullest (glibc's mallinfo2), once a step's
// and a snapshot's events are in and not yet judged. Clean: nothing is raised (counted).
nlohmann::json MeasureCrossRankCost(const SimConfig& config, int first_rank, int view_ranks, int steps);

// What the replica comparison across nodes costs (issue 53): every node folds its ranks' digests
// of a snapshot (ReplicaDigestDetector in folding mode) and sends the folds with its summary
// (EncodeProgress, version 3); the round's leader decodes every node's, and JobDigestDetector
// compares them. For `snapshots` clean snapshots of config.signals' job: per snapshot, one node's
// folding (its ranks' digest events in, TakeFolds out), the bytes a node's folds add to its summary,
// and the leader's CPU (decoding every node's folds, AddFold, Poll) and heap; groups compared.
nlohmann::json MeasureLeaderDigestCost(const SimConfig& config, int snapshots);

// The report: accuracy, false alarms, latency percentiles overall and per kind, CPU per event,
// the configuration.
nlohmann::json Report(const SimConfig& config, const std::vector<DrillResult>& results, uint64_t seed,
                      double wall_seconds);

}  // namespace lifeline::agent::sim

#endif  // LIFELINE_AGENT_SIM_SIM_H_
