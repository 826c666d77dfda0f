// The agent's decisions as a pure function of what came in: one poll pass takes the ranks' trace
// events (Observe), their processes' exits, what the round's watcher saw in etcd (a multi-node
// job) and the time, and says what goes out: the anomalies named and what their policy does,
// failures held as possible echoes of another node's and let go as such, whether to restart, to
// follow the round another node opened, or that the ranks are done; and the events-log records of
// it all. It owns the launch's Timeline, the detectors, the leader's job-wide view, the echo hold,
// the folding of an alarm's consequences, and the restart budget, back-off and start-up-failure rule.
//
// It has no clock, launcher, socket or etcd of its own. The time comes in with each poll; the few
// things it must ask of the world while deciding (the host's CPU pressure, the failures the round's
// nodes reported in etcd) it asks through Surroundings, and only when a decision needs them, so a
// quiet poll costs no system call. lifeline-agent (Agent::Run) drives it with the real clock,
// launcher and etcd; lifeline-sim drives one per simulated node on a virtual clock;
// supervisor_test.cc drives it with synthetic streams. All three run this code, never a copy.
//
// Thread safety: none; one thread drives an instance (the agent's loop, a simulated node), and the
// Surroundings it is given are called from that thread.
#ifndef LIFELINE_AGENT_SUPERVISOR_H_
#define LIFELINE_AGENT_SUPERVISOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/config.h"
#include "agent/detector.h"
#include "agent/detectors/job_digest_detector.h"
#include "agent/detectors/job_signal_detector.h"
#include "agent/detectors/replica_digest_detector.h"
#include "agent/detectors/training_signal_detector.h"
#include "agent/host_cpu.h"
#include "agent/job_view.h"
#include "agent/progress.h"
#include "agent/rendezvous.h"
#include "agent/rollback.h"
#include "agent/time_ledger.h"
#include "agent/timeline.h"
#include "lifeline/status.h"
#include "lifeline/trace.h"

namespace lifeline::agent {

// What a Supervisor asks of the world around it while it decides. lifeline-agent answers from
// /proc and etcd (Rendezvous's methods of the same names), lifeline-sim from its simulated etcd and
// hosts, tests from a script. The etcd questions are asked in multi-node rounds only.
class Surroundings {
 public:
  virtual ~Surroundings() = default;
  // This host's CPU load (agent/host_cpu.h): asked when an anomaly a saturated host could explain
  // (a straggler, a slow collective, a checkpoint lag) came up.
  virtual HostCpu SampleHostCpu() = 0;
  // A rank of this node failed at `unix_ms` in `round` (etcd keeps the earliest report per node).
  virtual Status ReportFailure(uint64_t round, uint64_t unix_ms) = 0;
  // Whether another node of `round` reported a failure before this node's of `unix_ms`.
  virtual Result<bool> FailedEarlierElsewhere(uint64_t round, uint64_t unix_ms) = 0;
  // Of `nodes`, those that reported no failure in `round` and did not finish.
  virtual Result<std::vector<std::string>> NodesWithoutFailure(uint64_t round, const std::vector<std::string>& nodes) = 0;
  // Whether the directory the ranks checkpoint into is known (--checkpoint-dir, or the one their
  // Checkpointer reported): asked when an anomaly's policy is rollback, which needs its listing.
  virtual bool CheckpointDirKnown() { return true; }
};

// A rank's process ended, as the launcher reaped it.
struct RankExit {
  int rank = 0;         // local index
  int wait_status = 0;  // as waitpid reports it
};

// A rank's process as the launcher left it after stopping the ranks.
struct RankEnd {
  int wait_status = 0;
  std::string last_line;  // the last non-empty line it wrote
};

// One launch of the ranks, as the Supervisor is told of it.
struct SupervisedLaunch {
  int world = 0;            // local ranks
  int rank_base = 0;        // the global rank of local rank 0
  uint32_t restart = 0;     // restarts of the job before this launch (a multi-node job: the round)
  uint64_t now_ns = 0;      // when the ranks were started
  std::optional<RoundPlan> plan;  // a multi-node job: the round they run in
};

// What came in since the last poll.
struct PollInput {
  uint64_t now_ns = 0;     // CLOCK_MONOTONIC (lifeline-sim: its virtual clock)
  int64_t unix_ms = 0;     // the wall clock: failure reports and progress summaries carry it
  std::vector<RankExit> exits;  // ranks reaped since the last poll
  // A multi-node job: what the round's watcher saw since the last poll (Rendezvous::TakeNews),
  // given at every poll; nullptr in a single-node job.
  const RendezvousNews* news = nullptr;
};

// An anomaly the poll names: the agent counts it, logs `record` and does what `action` says.
struct RaisedAnomaly {
  Anomaly anomaly;
  Action action = Action::kLog;  // its kind's policy
  nlohmann::json record;         // its events-log line ("kind", ..., "policy")
};

// What goes out of a poll. The agent writes `records`, then the raised anomalies' records, in that
// order; its own lines (time, job and restart number) are stamped by it.
struct PollDecision {
  std::vector<RaisedAnomaly> raised;
  // Other events-log lines, in order: failures let go as echoes ("echo"), anomalies a saturated
  // host explains ("not_paged"), consequences folded into an earlier alarm ("folded").
  std::vector<nlohmann::json> records;
  std::vector<Anomaly> echoes;  // the failures taken for echoes of another node's (in `records` too)
  // The first raised anomaly whose policy restarts or rolls back: stop the ranks, then PlanRestart
  // (PlanRollback when `rollback`).
  std::optional<Anomaly> restart;
  bool rollback = false;  // `restart`'s policy is rollback
  // Another node moved the job to a new round: stop the ranks and join it. `raised` then holds
  // only this node's own failures found meanwhile, named but not acted on (that restart covers
  // them), and `restart` is empty.
  bool round_moved = false;
  std::string job_ended;  // ...or the job ended on another node, for this reason: stop, exit non-zero
  std::optional<std::string> progress;  // a multi-node job: this node's summary, to publish
  // The leader's questions to the nodes (Rendezvous::AskDigests): which ranks' digests it wants
  // shard by shard, their folds having differed from their replicas'.
  std::vector<DigestQuery> digest_queries;
  bool ranks_done = false;  // every rank has exited and no failure is held: see Conclude
  // Local ranks stuck in their exit (exit_hang, in `raised`): stop them; the job ends with the
  // others' status.
  std::vector<int> stop_ranks;
  // A restart's cost, settled in this poll (its "time_lost" record is in `records`).
  std::optional<RestartCost> restart_cost;
};

// After the ranks were stopped for a restart: relaunch after `backoff_seconds`, or give up.
struct RestartPlan {
  std::string give_up;        // why not to relaunch; "" to relaunch
  bool job_wide = false;      // the give-up is the job's (its budget is spent): every node ends
  bool incurable = false;     // nothing but the operator can fix it: a requeue would fail alike
  double backoff_seconds = 0;
};

// After the ranks were stopped for a rollback: the restart's plan (give-up, back-off) and the
// rollback's (where to resume, what data to skip, the evidence).
struct RollbackPlan {
  RestartPlan restart;
  RollbackDecision decision;
};

// How the job ended once every rank exited with nothing to restart.
struct JobEnd {
  bool finished = false;  // the job ran to its end (a multi-node job's keys in etcd go)
  std::string give_up;    // why it ended badly: a failed rank, or a final state not saved; "" if it did not
};

// lifeline-sim's measure of what a poll costs: told when each costly part of a poll begins and
// ends (the agent sets none).
class PollMeter {
 public:
  enum class Part {
    kDetectors,  // exits and the detectors' Poll
    kSummary,    // this node's progress summary (SummarizeProgress, EncodeProgress)
    kJobView,    // the leader's read of every summary (DecodeProgress, JobView::Update)
  };
  virtual ~PollMeter() = default;
  virtual void Enter(Part part) = 0;
  virtual void Leave(Part part) = 0;
};

// A multi-node job's non-finite value spread by the all-reduce (Supervisor::HoldSpread): how long
// the leader waits for the node whose rank's own value went bad to act, and how much longer the
// other nodes wait for the leader.
inline constexpr double kSpreadHoldSeconds = 2;
inline constexpr double kSpreadBackupSeconds = 8;

// How often a node of a multi-node job hands its progress summary to the round's watcher.
inline constexpr double kProgressPublishSeconds = 0.5;
// How many of its newest summaries a node remembers what they carried: the leader's acknowledgement
// (RendezvousNews::progress_acked) lags a send or two behind.
inline constexpr size_t kSummariesRemembered = 8;

class Supervisor {
 public:
  // `config`: the detectors' settings, the policies, the restart budget and back-off, the lease and
  // failure grace of a multi-node job. `around` outlives this. `node_id`: this node's id in etcd
  // (a multi-node job; "" otherwise).
  Supervisor(const AgentConfig& config, Surroundings* around, std::string node_id = "",
             double publish_seconds = kProgressPublishSeconds);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // A new launch: the timeline, the detectors and the launch's memory (ranks named, exits, a held
  // failure) start afresh; a multi-node launch's job-wide view starts on its round's world.
  void Launched(const SupervisedLaunch& launch);

  // One trace event of local rank `rank`, in the order the rank recorded it: applied to the
  // timeline once and handed to the detectors. The change is the caller's to pass on (metrics).
  TimelineChange Observe(int rank, const trace::Event& event);
  // Events of `rank` were lost (its ring was full) at `now_ns`: its watch restarts from now.
  void MarkGap(int rank, uint64_t now_ns);

  // One poll pass over what came in (see PollInput, PollDecision).
  PollDecision Poll(const PollInput& in);

  // After the ranks were stopped for `reason` (PollDecision::restart) at `now_ns`: whether to
  // relaunch, and after what back-off: none when the failed launch ran (every rank began a step,
  // or it lived a minute), else backoff_initial x multiplier^(n-1) for the n-th such failure in a
  // row, at most backoff_max. A command that failed before its first step the same way at two
  // launches in a row gives up (a relaunch cannot help); so does a spent budget. `ends`: per local rank, as the
  // launcher left it. Relaunching is the caller's, with SupervisedLaunch::restart one more.
  RestartPlan PlanRestart(const Anomaly& reason, uint64_t now_ns, const std::vector<RankEnd>& ends);
  // After the ranks were stopped for a rollback (PollDecision::rollback) at `now_ns`, with the steps
  // the job can resume from (`listing`, any order): the newest checkpoint before the anomaly's
  // step, the data to skip, or a give-up (RollbackLedger::Decide: the same checkpoint rolled back to
  // rollback.max_per_checkpoint times already), then the restart budget and back-off as PlanRestart.
  // An sdc_suspect is counted against its ranks' node: at rollback.sdc_per_node the decision names
  // the node to take out (RollbackDecision::node_out), and a single-node job gives up naming it and
  // the ranks. In a multi-node job the nodes resume from the step their next round agrees on, below
  // the checkpoint chosen here (agent.cc passes it as the round's RoundRollback).
  RollbackPlan PlanRollback(const Anomaly& reason, uint64_t now_ns, const std::vector<RankEnd>& ends,
                            const std::vector<ResumableStep>& listing);
  // The steps whose data a launch resuming from `resume_step` skips (LIFELINE_SKIP_STEPS).
  std::vector<StepRange> SkipSteps(std::optional<uint64_t> resume_step) const { return rollbacks_.SkipAfter(resume_step); }
  // Ranges other agents of the job decided (a multi-node round's plan carries the job's): skipped
  // from now on as this agent's own, so that every node tells its ranks the same.
  void AdoptSkipSteps(const std::vector<StepRange>& ranges) { rollbacks_.Adopt(ranges); }
  // Every range decided or adopted: what a rollback's round carries to the other nodes.
  const std::vector<StepRange>& AllSkipSteps() const { return rollbacks_.skips(); }
  // Whether the current launch ran: every rank began a step, or it lived a minute.
  bool LaunchRan(uint64_t now_ns) const;
  // The ranks were stopped at `now_ns` because another node moved the job to a new round (no
  // PlanRestart here): for the time-lost account.
  void StoppedForRound(uint64_t now_ns);

  // Whether a batch system's requeue may help a job that spent its restart budget, by the
  // restarts it decided: every failure was a fault of the machines (a node lost, a hang, a rank killed by
  // SIGKILL or SIGBUS from outside), or they all came from one node of a multi-node job.
  bool RequeueMayHelp() const;

  // Once PollDecision::ranks_done (and the last events observed): how the job ended.
  JobEnd Conclude() const;

  const Timeline& timeline() const { return timeline_; }
  // Wall time, productive time and each restart's cost (agent/time_ledger.h).
  const TimeLedger& ledger() const { return ledger_; }
  // The node the job's rank `global` runs on, by name ("" when unknown).
  std::string NodeOfRank(int global) const;
  uint64_t launched_ns() const { return launched_ns_; }
  // What the leader read of every node's summary at its last read of the job (empty when it read
  // none): lifeline-sim counts the collectives new to it.
  const std::vector<RankProgress>& job_progress() const { return job_progress_; }
  void set_meter(PollMeter* meter) { meter_ = meter; }

 private:
  struct HeldFailure {
    Anomaly anomaly;
    int64_t unix_ms = 0;    // when it was seen, as reported in etcd
    uint64_t since_ns = 0;  // held since
    uint64_t asked_ns = 0;  // when etcd was last asked about the other nodes' failures
  };

  bool MultiNode() const { return plan_.has_value() && plan_->nodes.size() > 1; }
  int LocalRank(int global) const { return global - rank_base_; }
  int WaitStatus(int global) const;
  void Enter(PollMeter::Part part) const {
    if (meter_ != nullptr) meter_->Enter(part);
  }
  void Leave(PollMeter::Part part) const {
    if (meter_ != nullptr) meter_->Leave(part);
  }
  // A multi-node job: this node's summary when due, the leader's job-wide view, lost nodes; sets
  // *moved when the job moved to another round or ended.
  void ReadRound(const PollInput& in, std::vector<Anomaly>* anomalies, bool* moved, PollDecision* out);
  // Reports this node's rank failures and holds back the ones that may echo a failure elsewhere
  // (RendezvousSettings::failure_grace_seconds), releasing them into `anomalies` unless another
  // node failed first; one held when the job `moved` is an echo.
  void HoldFailureEchoes(const PollInput& in, bool moved, std::vector<Anomaly>* anomalies, PollDecision* out);
  void LetGoAsEcho(Anomaly echo, const std::string& why, PollDecision* out);
  // Takes out of `anomalies` what a saturated host explains, as "not_paged" records.
  void ScreenHostNoise(std::vector<Anomaly>* anomalies, PollDecision* out);
  // Folds consequences of ranks already named, names the rest with their policy; the first that
  // restarts becomes the decision's restart when `may_restart`.
  void Name(std::vector<Anomaly>* anomalies, bool may_restart, PollDecision* out);
  // Where and how the ranks named by a "dead" anomaly failed, as the give-up says it when it comes
  // again ("before its first step the same way at two launches in a row (exit code 1, last line:
  // ...)", "at step 12 ..."); "" when it cannot say (a signal, another anomaly).
  std::string RepeatableFailure(const Anomaly& reason, uint64_t now_ns, const std::vector<RankEnd>& ends) const;
  // Why no relaunch can help when a rank exited on a checkpoint failure the library calls
  // FailedPrecondition; "" otherwise.
  std::string IncurableFailure(const std::vector<RankEnd>& ends) const;
  // Names ranks still alive exit_hang_seconds after every other rank exited 0, silent since.
  void FindExitHangs(uint64_t now_ns, std::vector<Anomaly>* anomalies, PollDecision* out);
  // The restart decided in this poll, into the ledger: when its fault happened.
  void RecordFault(const Anomaly& reason, uint64_t now_ns);

  const AgentConfig config_;
  Surroundings* const around_;
  const std::string node_id_;
  const uint64_t publish_ns_;
  PollMeter* meter_ = nullptr;
  std::vector<std::unique_ptr<Detector>> detectors_;
  // What the ranks of the current launch did: read by the detectors, the metrics and `status`. It
  // keeps enough saves per rank for the checkpoint detector's lag_count.
  Timeline timeline_;
  std::unique_ptr<JobView> job_view_;  // made when this node first leads a multi-node round
  std::vector<RankProgress> job_progress_;
  SummaryMerger merger_;  // the leader's: every node's summaries, merged
  // This node's summaries: the number of the newest, and of the last few what they carried up to
  // (a summary follows the newest of them the leader has: only what it has not been sent).
  uint64_t summary_number_ = 0;
  std::deque<std::pair<uint64_t, SampleCursor>> summary_cursors_;
  // Replica digests across nodes (a multi-node job): this node's folds and the details the leader
  // asked for, each numbered, kept until a summary the leader has carried them; per summary number
  // the newest entry it carried.
  struct DigestOut {
    uint64_t seq = 0;
    std::optional<DigestFold> fold;
    std::optional<DigestDetail> detail;
    std::optional<ValueReport> values;
  };
  void CollectDigests(const RendezvousNews& news, uint64_t now_ns);
  ReplicaDigestDetector* digests_ = nullptr;  // among detectors_
  TrainingSignalDetector* signals_ = nullptr;  // among detectors_
  std::unique_ptr<JobSignalDetector> job_signals_;  // the leader's
  std::deque<DigestOut> digest_out_;
  uint64_t digest_seq_ = 0;
  std::map<uint64_t, uint64_t> digest_cursors_;  // summary number -> the newest seq it carried
  std::set<std::pair<uint64_t, int>> answered_;  // (step, global rank) details sent
  std::unique_ptr<JobDigestDetector> job_digests_;  // the leader's
  // The current launch.
  int world_ = 0;
  int rank_base_ = 0;
  uint32_t restart_ = 0;
  uint64_t launched_ns_ = 0;
  std::optional<RoundPlan> plan_;
  std::vector<int> wait_status_;  // per local rank, once it exited (0 until then)
  std::vector<bool> exited_;      // per local rank
  std::vector<uint64_t> exited_ns_;   // per local rank: when its exit was seen (0: running)
  std::vector<bool> exit_hung_;       // per local rank: named exit_hang and being stopped
  TimeLedger ledger_;
  struct Fault {
    std::string node;
    bool machine = false;  // a fault of the machines, not of the command
  };
  std::vector<Fault> faults_;  // every restart this Supervisor decided, in order
  RollbackLedger rollbacks_;   // every rollback decided, per checkpoint, and the steps skipped
  bool multi_node_job_ = false;  // some launch ran on more than one node
  std::set<int> named_;  // global ranks named hung or dead in this launch
  std::optional<HeldFailure> held_;
  // A multi-node job: a non-finite value this node's ranks hold only because the all-reduce spread
  // it (non_finite, rank_own_value false) is another node's to act on: the node whose rank's own
  // value went bad (it acts at once), else the round's leader. Held here; let go when the round
  // moves, raised after kSpreadHoldSeconds (the leader) or kSpreadHoldSeconds + kSpreadBackupSeconds
  // (the others: the leader saw nothing) when it did not.
  struct HeldSpread {
    Anomaly anomaly;
    uint64_t since_ns = 0;
  };
  void HoldSpread(const PollInput& in, bool moved, std::vector<Anomaly>* anomalies, PollDecision* out);
  std::optional<HeldSpread> spread_;
  bool spread_raised_ = false;  // this launch's spread non_finite was held once: its later ones are consequences
  uint64_t published_ns_ = 0;  // when this node last published its summary (0: never)
  // How the previous launch failed when it failed before any step: the exit codes and last lines
  // of the ranks that died ("" otherwise). The same again means a relaunch cannot help.
  std::string repeated_failure_;  // RepeatableFailure of the previous launch
  // Launches that failed in a row before they ran (every rank stepping, or a minute): the back-off
  // grows with them; a launch that ran and failed is relaunched at once.
  uint32_t failed_in_a_row_ = 0;
  static constexpr uint64_t kRanSeconds = 60;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_SUPERVISOR_H_
