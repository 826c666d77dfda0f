// lifeline-agent: launches the local ranks, drains their trace rings into the Supervisor (each
// event applied once), feeds it the ranks' exits and the round's news, and carries out what it
// decides (agent/supervisor.h): writes the events log and the metrics, asks for dumps, stops,
// relaunches or gives up, talks to etcd; and serves its control socket. The decisions are the
// Supervisor's; the processes, sockets, logs and metrics are this class's. One thread; every wait
// is bounded by the poll interval. See agent/README.md.
#ifndef LIFELINE_AGENT_AGENT_H_
#define LIFELINE_AGENT_AGENT_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/config.h"
#include "agent/launcher.h"
#include "agent/prestart.h"
#include "agent/rendezvous.h"
#include "agent/replication/replication_service.h"
#include "agent/resume.h"
#include "agent/supervisor.h"
#include "lifeline/internal/trace_ring.h"

namespace lifeline::agent {

class ControlSocket;
class AgentMetrics;

// lifeline-agent's exit codes. A batch system's requeue (Slurm's --requeue with RequeueExit=3, or
// the batch script requeueing itself) should follow kExitRequeue only: the job failed in a way a
// fresh allocation can fix.
inline constexpr int kExitFinished = 0;  // every rank finished normally
inline constexpr int kExitFailed = 1;    // failed, and a requeue would fail the same way (a bug in the
                                         // command, the same failure on every node)
inline constexpr int kExitUsage = 2;     // could not start: bad flags or configuration, etcd unreachable
inline constexpr int kExitRequeue = 3;   // the restart budget was spent on faults of the machines (ranks
                                         // killed from outside, hangs, lost or bad nodes): a requeue
                                         // onto other nodes may succeed. 128+N: the agent got signal N.

class Agent {
 public:
  explicit Agent(AgentConfig config);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs the job to its end; the exit code is one of the above.
  int Run();

  // The control socket's answer to one request ("status", "dump", "metrics", "help").
  std::string HandleControl(const std::string& request);

 private:
  Status Setup();
  Status Launch();
  // FailedPrecondition naming the other job when --checkpoint-dir is being saved into by a job
  // other than this one (its save lock: lifeline/inspect.h, CheckNoOtherJobSaving): refused before any
  // rank starts.
  Status CheckCheckpointDirFree() const;
  // Says once per launch when ranks start fresh although the launch resumes from a step.
  void CheckResumeStep();
  // Says once per launch when the ranks' memory tier is not the one this agent replicates.
  void CheckRanksMemoryTier(bool last_look = false);
  void DrainRings(uint64_t now);
  // One poll: what came in (exits, the round's news) to the Supervisor, its records into the log.
  PollDecision Poll(uint64_t now);
  // Counts, logs and says the anomalies the Supervisor named, and asks for the dumps their policy wants.
  void Act(const std::vector<RaisedAnomaly>& raised);
  void MarkSuspect(const Anomaly& a);
  void RequestDumps(const std::string& reason);
  // Names on stderr the files the ranks' dumps went to (their Python stacks, their last events).
  void SayDumps(const std::string& why);
  // What a stop by a signal leaves: the ranks stopped and the checkpoint a relaunch resumes from.
  void SayStopped(int ranks, int killed_after_grace);
  // Stops the ranks and relaunches them after the back-off; false when the Supervisor gives up.
  // `rollback`: from the newest checkpoint before the anomaly's step (PollDecision::rollback).
  bool Restart(const Anomaly& reason, uint64_t detected_ns, bool rollback = false);
  // A rollback's part of Restart, the ranks stopped: the plan, the events-log line, and the steps
  // after the chosen checkpoint removed; sets rollback_point_ for the relaunch.
  RestartPlan PlanRollback(const Anomaly& reason, const std::vector<RankEnd>& ends);
  // A multi-node job joined a rollback's round: clears the steps after the round's resume step
  // (this node's memory tier; the shared directory by group rank 0) and logs the round's rollback.
  void ClearAfterRollbackRound(const std::string& local_checkpoint_dir);
  // The checkpoint directory the ranks save into: --checkpoint-dir, else the one they reported.
  std::string CheckpointDir() const;
  // Carries out what a poll decided; the agent's exit code when it is done, nullopt to poll on.
  std::optional<int> CarryOut(const PollDecision& decision, uint64_t now);
  // Every rank exited with nothing to restart: says how the job ended; the exit code.
  int Finish();
  void CheckResumed(uint64_t now);
  void Log(nlohmann::json line);
  void Cleanup();
  // Multi-node: this launch's place in the job, from the round's plan (rendezvous.h).
  Status JoinRound(const std::string& checkpoint_dir);
  // The ranks' environment and resume step from that plan.
  void PlanEnvironment(std::map<std::string, std::string>* env, nlohmann::json* resume) const;
  // Multi-node, resuming from a step only some nodes hold in memory ("peer_memory"): the first
  // node holding it sends it to the nodes that lack it, which wait for it (bounded) before launching.
  void ShareResumeStep(const std::string& local_checkpoint_dir);
  // Multi-node: the replication service's figures into the metrics, and its news into the log.
  void ReadReplication();
  // Once the current launch ran: spares for the next, while restarts are left.
  void FillSpares(uint64_t now_ns);

  AgentConfig config_;
  bool owns_run_dir_ = false;
  std::string ring_dir_;
  const std::string launch_nonce_ = NewLaunchNonce();  // LIFELINE_LAUNCH_ID: unique to this agent process
  FILE* events_log_ = nullptr;
  std::unique_ptr<ControlSocket> control_;
  std::unique_ptr<AgentMetrics> metrics_;
  std::unique_ptr<Launcher> launcher_;
  // Spare interpreters for the next launch (agent/prestart.h): null when the command is not a
  // Python script, restart.prestart is off, or no restart is left.
  std::unique_ptr<SparePool> spares_;
  std::map<std::string, std::string> spare_env_;  // their environment: the launch's, less its rank
  bool spares_off_said_ = false;
  uint64_t launch_ran_ns_ = 0;  // when every rank of the current launch had begun a step (0: not yet)
  std::vector<std::unique_ptr<trace::TraceRing>> rings_;
  std::unique_ptr<Surroundings> surroundings_;  // what the Supervisor asks: /proc and etcd
  std::unique_ptr<Supervisor> supervisor_;      // every decision about the ranks
  std::vector<trace::Event> scratch_;
  uint32_t restarts_ = 0;
  std::optional<uint64_t> restart_detected_ns_;  // set until the relaunched job resumes
  uint64_t anomalies_ = 0;
  std::string give_up_reason_;
  // Multi-node jobs only.
  std::unique_ptr<Rendezvous> rdzv_;
  std::optional<RoundPlan> plan_;  // the round this node's ranks run in
  uint32_t rank_base_ = 0;         // global rank of local rank 0
  std::vector<uint64_t> ring_dropped_;  // per local rank: its ring's drop count when last seen
  std::optional<ResumePoint> rollback_point_;  // set by a rollback for the next launch: its resume step
  // A multi-node job: the rollback this node decided, for the next round to carry (OpenNextRound).
  std::optional<RoundRollback> pending_rollback_;
  std::optional<uint64_t> resume_step_;  // the step this launch resumes from (nullopt: a fresh start)
  std::string resume_dir_;               // ...in this directory
  bool mismatch_said_ = false;           // a rank starting fresh against it was reported
  bool tier_checked_ = false;            // the ranks' memory tier was compared with the agent's
  uint64_t tier_looked_ns_ = 0;          // when the ranks' report was last looked for
  bool finished_ = false;          // every local rank ended normally
  bool ended_unplaced_ = false;    // the job ended while this node waited unplaced (a spare, excluded)
  bool requeue_may_help_ = false;  // the job gave up on faults of the machines (kExitRequeue)
  std::unique_ptr<replication::ReplicationService> replication_;
  std::string resume_source_;  // where the current launch resumes from: memory, peer_memory, disk, ""
  std::optional<uint64_t> logged_replicated_step_;
  uint64_t logged_replication_failures_ = 0;
  std::string logged_replication_error_;
  bool logged_over_budget_ = false;
  uint64_t started_ns_ = 0;        // when Run began (0: not running)
};

// ISO 8601 UTC with milliseconds, e.g. "2026-11-22T21:47:03.512Z".
std::string IsoTimeNow();

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_AGENT_H_
