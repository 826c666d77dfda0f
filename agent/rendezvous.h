// How the agents of a multi-node job meet and act together through etcd (agent/etcd/).
//
// Everything lives under /lifeline/<job>/ in etcd:
//   round                    the current round (generation), a decimal number; round R is the
//                            R-th restart of the job, so the restart budget is job-wide
//   rounds/R/nodes/<node>    one entry per agent that joined round R, held by the agent's lease:
//                            its address, ranks, a free port, and where it could resume from
//   rounds/R/plan            written once when round R closes: the nodes in group-rank order,
//                            MASTER_ADDR/MASTER_PORT, the resume step, the launch id
//   rounds/R/failures/<node> when a rank of the node first failed in round R (unix ms, leased)
//   give_up                  why the job ended (a spent budget, a relaunch that cannot help)
//   node_failures/<name>/R   a node (by its lasting name) whose ranks caused round R's restart:
//                            when, the cause and the ranks (kept with the job, not leased)
//   readmitted/<name>        an operator took the node back (unix ms): earlier failures do not count
//   rounds/R/rollback        round R is a rollback (written before the round is opened): resume
//                            before a step, decided by one agent (agent/rollback.h)
//   skip_steps               the steps whose data the job skips (every rollback's, JSON [[a,b],...])
//   rounds/R/digest_queries/<step>  the leader asks for ranks' snapshot digests shard by shard
//                            (JSON {"step":S,"ranks":[...]}, leased: agent/detectors/job_digest_detector.h)
// A round closes when MAX nodes joined, or (a restart's round) when every place of the previous
// round is filled again, or when at least MIN did and no other joined for the last-call time.
// One agent closes it: the round's closer (rounds/R/closer, leased: the first agent to join, or
// the first after the closer's lease ran out), which alone follows the round's entries; the
// others follow only the plan. Global ranks go node by node: nodes that asked for a --node-rank
// first, in that order, then the others in the order they joined.
// Bad nodes are left out: a node whose ranks caused `exclude_after` restarts within the window, or
// `exclude_after_sdc` of them by sdc_suspect (a machine that corrupts data), is excluded while the
// other nodes make MIN; a node bad by the first rule is kept rather than the job stopped, one that
// corrupts data never is: without it too few nodes remain and the closer ends the job (give_up).
// A rollback's round (rounds/R/rollback) resumes from the newest step before its bound that every
// node offers (complete on every node, never a suspect step); its plan carries the bound and the
// job's skip_steps, the same for every node's ranks. spares (--standby) are placed only to fill the places
// of the previous round (the first round: MIN) that the other nodes leave empty. The plan names
// the excluded nodes and the unplaced spares. A node not placed waits for the next round, and
// leaves when the job ends (its placed nodes all finished, or it gave up). A restart decided on any node moves `round` on (compare-and-swap, so two nodes
// deciding at once open one round); every agent sees it, stops its ranks and joins the new round.
// An agent that dies stops renewing its lease; its entry vanishes and the round's leader reports
// the node lost. The last agent to leave removes the job's keys.
//
// The round's leader (rounds/R/leader, leased: the node of group rank 0, or another one when that
// node is gone) follows the round's entries, reads every node's progress summary about once a
// second and runs the job-wide detectors (agent/detectors/job_hang_detector.h).
//
// etcd carries membership, not traffic (issue 36): each agent learns of changes through one watch
// stream (agent/etcd/etcd_mirror.h) of the few keys its part needs: every agent the round and the
// give-up, then the plan and the closer of the round it joins, then its round's leader; the closer
// and the leader the round's entries too. What etcd does grows with the changes to the job (joins, plans, restarts), not with nodes x
// time; the one steady cost is each agent's lease renewal, every lease/3. `watch: false` polls the
// same keys every poll_seconds instead (for a proxy that does not pass streams).
//
// A background thread renews the lease and turns what the mirror holds into news; the agent's
// loop reads that news without blocking. The mirror is read afresh after etcd refused a renewal
// (gone, then back) or no longer had the lease, and every 10 s while a join waits; a renewal that
// was only late (etcd busy) is not followed by a read of everything on top of the busy etcd.
//
// Thread safety: the public methods are called from one thread (the agent's); the watcher runs
// alone on its own.
#ifndef LIFELINE_AGENT_RENDEZVOUS_H_
#define LIFELINE_AGENT_RENDEZVOUS_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/etcd/etcd_client.h"
#include "agent/etcd/etcd_mirror.h"
#include "agent/progress.h"
#include "agent/resume.h"
#include "agent/summary_stream.h"
#include "lifeline/status.h"

namespace lifeline::agent {

struct RendezvousConfig {
  std::string endpoint;            // etcd HOST:PORT (--rdzv-endpoint)
  std::string job;                 // --rdzv-id
  uint32_t min_nodes = 1;          // --nnodes MIN[:MAX]
  uint32_t max_nodes = 1;
  uint32_t nproc_per_node = 1;
  int node_rank = -1;              // --node-rank; -1: in the order nodes join
  std::string host;                // this node's address as the others reach it (MASTER_ADDR)
  double lease_seconds = 10;       // an agent silent this long is taken for lost
  double last_call_seconds = 3;    // with MIN nodes in, how long a round waits for more
  double join_timeout_seconds = 900;
  bool watch = true;               // follow etcd by a watch stream; false: by polls every poll_seconds
  double poll_seconds = 0.25;      // the polls' interval (watch false)
  double progress_seconds = 1.0;   // how often a node publishes its progress, and the leader reads all
  uint32_t replica_port = 0;       // where this node's agent receives snapshot replicas (0: none)
  std::string node_name;           // the node's lasting name (failures are remembered by it); "": host
  bool standby = false;            // a spare (--standby)
  uint32_t exclude_after = 2;      // failures within the window that leave a node out (0: never)
  uint32_t exclude_after_sdc = 2;  // ...or sdc_suspects among them (RollbackConfig::sdc_per_node; 0: never)
  double exclude_window_seconds = 3600;
};

// A round that rolls the job back (Rendezvous::OpenNextRound): every node resumes from the newest
// step before `before` that every node can load.
struct RoundRollback {
  uint64_t before = 0;             // the resume step is below this one (0: from scratch)
  uint64_t anomaly_step = 0;       // where the fault was found, for the logs
  std::string anomaly;             // its kind
  std::vector<int> ranks;          // its ranks
  std::string by;                  // the deciding node's name
  std::vector<StepRange> skip;     // every step range the job skips, as the deciding node knows them
};

// A node the plan left out as bad.
struct ExcludedNode {
  std::string name;
  uint32_t failures = 0;     // restarts its ranks caused within the window
  std::string last_cause;    // the newest one's kind and ranks
  bool kept = false;         // excluded, but placed anyway: the others did not make MIN
  uint32_t sdc = 0;          // of `failures`, sdc_suspects: at exclude_after_sdc the node is never kept
};

struct RoundNode {
  std::string id;
  std::string host;
  uint32_t nproc = 0;
  int requested_rank = -1;
  uint32_t master_port = 0;
  uint32_t replica_port = 0;       // its agent's replica receiver (0: it takes none)
  uint32_t summary_port = 0;       // its agent's summary receiver (agent/summary_stream.h; 0: none)
  int64_t joined_revision = 0;
  std::string name;                // its lasting name ("" from an older agent: its host)
  bool standby = false;
  ResumeOffer resume;
  const std::string& Name() const { return name.empty() ? host : name; }
};

struct RoundPlan {
  uint64_t round = 0;
  std::vector<RoundNode> nodes;  // in group-rank order
  int group_rank = -1;           // this node's place; -1 when it is not in the round
  uint32_t world_size = 0;
  uint32_t rank_base = 0;        // this node's first global rank
  std::string master_addr;
  uint32_t master_port = 0;
  std::optional<uint64_t> resume_step;
  std::string resume_location;   // "memory" (in every node's tier), "peer_memory" (in some node's tier: the
                                 // others fetch it first), "disk", or "" (fresh start)
  std::string resume_note;       // why a newer step in some node's memory was passed over; "" if none was
  std::string checkpoint_dir;    // the ranks' checkpoint directory as the first node that knew it
                                 // said (shared storage: the same path everywhere); "" when unknown
  std::string launch_id;         // the same on every node of the round
  std::vector<ExcludedNode> excluded;  // nodes left out as bad (or kept, short of MIN)
  std::vector<std::string> spares;     // spares joined and not placed
  std::optional<RoundRollback> rollback;  // a rollback's round: what it resumes before, and who decided it
  std::vector<StepRange> skip_steps;   // the job's skipped step ranges as of this round (every rollback's)
  bool finished = false;         // Join: the job ended without this node (it was not placed)

  // The global ranks of node `group` ("" when out of range).
  std::vector<int> RanksOf(int group) const;
};

// What the watcher saw since the agent last asked.
struct RendezvousNews {
  std::optional<uint64_t> round;          // the job moved to this round (past the agent's)
  bool leader = false;                    // this node runs the job-wide detectors of its round
  std::vector<EtcdKeyValue> progress;     // the leader's: the progress summaries that came, each
                                          // node's oldest first (key: "summary of node <id>")
  // The number of this node's newest summary the leader has (on the connection open now; the
  // leader: its own newest), 0: none. Not news but the state now: the next summary carries only
  // what came after that one (agent/progress.h).
  uint64_t progress_acked = 0;
  std::string give_up;                    // the job ended: why
  std::vector<std::string> lost_nodes;    // the leader's: nodes of its round found gone...
  std::map<std::string, std::string> lost_how;  // ...and how, for those not found by their lease
  // ...and, for those found by their summary stream, how long the leader had heard nothing of them
  // when it named them (since their newest summary, or their connection's close, whichever came
  // later): the detection as measured. Absent: found by the lease (the fault a lease before).
  std::map<std::string, double> lost_silent_seconds;
  bool etcd_unreachable = false;          // etcd did not answer the last poll
  // This node is cut off (issue 36, item 3): it has not renewed its lease for nearly its whole
  // time while the job reaches etcd (the leader says so, or the other nodes tell the leader), or
  // it reaches neither etcd nor the rest of the job. Why, once per round; "" otherwise.
  std::string isolated;
  // The leader's questions of its round (rounds/R/digest_queries/): which ranks' snapshot digests
  // it wants shard by shard (a node answers for its own ranks, once each, with its next summary).
  // Not news but the state now, as progress_acked.
  std::vector<DigestQuery> digest_queries;
  // Summary connections this node's receiver closed since the last news, each naming the peer and
  // the rule it broke (the agent logs them: a misconfigured or foreign sender is seen).
  std::vector<std::string> summary_errors;
};

class Rendezvous {
 public:
  // Connects (one request; Unavailable naming the endpoint when etcd does not answer), takes a
  // lease and starts the watcher.
  static Result<std::unique_ptr<Rendezvous>> Connect(RendezvousConfig config);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  const std::string& node_id() const { return node_id_; }
  // What this agent sent to etcd and received from it: requests, the mirror's reads and streams
  // (a stream counts as one request), with the events that came through them.
  EtcdTraffic traffic() const;
  uint64_t watch_events() const { return mirror_->events(); }
  // The summaries' bytes on the wire: sent to the leader, and received as the leader.
  uint64_t summary_bytes_sent() const { return sender_->wire_bytes(); }
  uint64_t summary_bytes_received() const { return summaries_->wire_bytes(); }
  const RendezvousConfig& config() const { return config_; }
  EtcdClient& client() { return *client_; }

  // Joins the job's current round (or the next one, when the current one closed without this
  // node) and waits until it closes. Aborted with the reason when the job gave up, or when `stop`
  // (polled) became true; Unavailable when too few nodes came within the join timeout.
  // `waiting` (when given) hears what the round waits for ("1 of at least 2 nodes joined round 3")
  // after 2 s without it forming, then every 10 s.
  // A node not placed (a spare, or excluded) waits on; when the job ends meanwhile, the plan comes
  // back with `finished` set and no place (group_rank -1).
  Result<RoundPlan> Join(const ResumeOffer& offer, const std::function<bool()>& stop = nullptr,
                         const std::function<void(const std::string&)>& waiting = nullptr);

  // The restart of round `round` was caused by ranks of the node named `node` (`cause`: the
  // anomaly's kind and ranks): remembered with the job, once per node and round.
  // `kind`: the anomaly's kind (sdc_suspect ones are counted apart too).
  Status RecordNodeFailure(uint64_t round, const std::string& node, const std::string& cause,
                           const std::string& kind = "");
  // Takes back a node excluded as bad: its failures until now no longer count.
  Status Readmit(const std::string& node);
  // The nodes the next round would leave out as bad, with their failures, as of now.
  Result<std::vector<ExcludedNode>> BadNodes();
  const std::string& node_name() const { return node_name_; }

  // Moves the job past `round` (a restart decided here): the round the job is in afterwards,
  // opened by this call or by another node's at the same time. While etcd does not answer it
  // waits, as long as a join would (join_timeout_seconds). With `rollback`, the next round is a
  // rollback: its key is written before the round moves (the first one written wins), and the
  // job's skip_steps become `rollback->skip`.
  Result<uint64_t> OpenNextRound(uint64_t round, const RoundRollback* rollback = nullptr);
  // Ends the job on every node with `reason` (kept in etcd until the last agent leaves).
  Status GiveUp(const std::string& reason);
  // Of `nodes` (of round `round`), those that reported no failure and did not finish: gone, or not
  // failed (yet).
  Result<std::vector<std::string>> NodesWithoutFailure(uint64_t round, const std::vector<std::string>& nodes);

  // A rank of this node failed at `unix_ms` (wall clock) in `round`: said in etcd
  // (rounds/R/failures/<node>, leased), so that a node whose ranks failed later, often because of
  // it (a peer's connection closed under them), can tell it was not first. Keeps the earliest.
  Status ReportFailure(uint64_t round, uint64_t unix_ms);
  // Whether another node reported a failure in `round` before this node did: by the order etcd
  // created the reports (one clock for all nodes, whatever their wall clocks say); by the times
  // they carry (before `unix_ms`, or at the same millisecond with a smaller node id) only when
  // this node's own report is not there.
  Result<bool> FailedEarlierElsewhere(uint64_t round, uint64_t unix_ms);

  // What changed since the last call; never blocks.
  RendezvousNews TakeNews();

  // This node's progress summary (agent/progress.h) for the round's leader; sent by the watcher
  // straight to the leader (agent/summary_stream.h) at most once per `progress_seconds`, never
  // blocking the caller.
  void PublishProgress(std::string summary);

  // The leader asks the nodes of `round` for the digests of `query.ranks` at `query.step`, shard by
  // shard (rounds/R/digest_queries/<step>, under this node's lease: the question goes with it).
  Status AskDigests(uint64_t round, const DigestQuery& query);

  // Leaves the job: says so when this node's ranks `finished` (so the others do not take it for
  // lost), ends the lease (this node's entries go) and, when no other agent is left, removes
  // every key of the job. Best effort.
  void Leave(bool finished);

 private:
  explicit Rendezvous(RendezvousConfig config, std::unique_ptr<EtcdClient> client, std::unique_ptr<EtcdMirror> mirror,
                      std::unique_ptr<SummaryReceiver> summaries);
  // Points the mirror at what this agent's part needs now (see the top). Called by Join and the
  // watcher after each changes that state: the state is read and the mirror pointed under
  // refocus_mu_, so the mirror ends on the newest state's ranges (read and pointed apart, a
  // watcher's read of the state before a Join's change could reach the mirror after the Join's,
  // leaving it without the round the Join waits on).
  void Refocus();
  std::mutex refocus_mu_;
  // The round's number as the mirror holds it (0 when absent); Corruption for a value not ours.
  Result<uint64_t> MirroredRound() const;
  std::string Key(const std::string& tail) const { return prefix_ + tail; }
  Result<uint64_t> CurrentRound();
  Status RenewOrRejoin(bool* regranted);  // *regranted: the lease had run out, and a new one holds the entry
  void Watch();
  Result<RoundPlan> ClosedPlan(uint64_t round, const std::string& text) const;
  // Closes `round` when its members make a job (see the top): `last_call` when no node joined for
  // the last-call time; `previous` the names of the previous round's nodes (empty: none).
  Status TryClose(uint64_t round, const std::vector<EtcdKeyValue>& members, bool last_call,
                  const std::vector<std::string>& previous);
  // Whether the job ended after `round` closed without this node: every node of its plan finished.
  Result<bool> EndedWithout(uint64_t round, size_t planned);

  const RendezvousConfig config_;
  const std::unique_ptr<EtcdClient> client_;
  std::unique_ptr<EtcdClient> lease_client_;  // renewals, on a connection of their own: never behind a join's request
  const std::unique_ptr<EtcdMirror> mirror_;
  const std::unique_ptr<SummaryReceiver> summaries_;  // what the nodes send this one as the leader
  uint64_t summary_errors_seen_ = 0;                  // GUARDED_BY(mu_): the receiver's errors told
  const std::string prefix_;   // "/lifeline/<job>/"
  const std::string node_id_;  // host:pid:nonce
  const std::string node_name_;  // the lasting name (config_.node_name, else the host)

  std::atomic<int64_t> lease_{0};
  std::string node_entry_;      // this node's entry in the round it joined (re-put after a lost lease)
  std::string node_entry_key_;

  std::mutex mu_;
  bool stopping_ = false;                 // GUARDED_BY(mu_)
  uint64_t my_round_ = 0;                 // GUARDED_BY(mu_): the round of the last plan
  int my_group_ = -1;                     // GUARDED_BY(mu_): this node's group rank in it
  // GUARDED_BY(mu_): that plan's nodes, shared with the watcher's passes (copied, 2,048 ids four
  // times a second per agent were 16 million string copies a second in lifeline-etcd-load).
  std::shared_ptr<const std::vector<std::string>> my_nodes_ = std::make_shared<std::vector<std::string>>();
  std::map<std::string, std::pair<std::string, uint32_t>> summary_to_;  // GUARDED_BY(mu_): their summary ports (id -> host, port)
  bool in_round_ = false;                 // GUARDED_BY(mu_)
  std::optional<uint64_t> joining_;       // GUARDED_BY(mu_): the round Join is in, before its plan
  bool closer_ = false;                   // GUARDED_BY(mu_): this node closes the round it joins
  bool unplaced_ = false;                 // GUARDED_BY(mu_): that round closed without this node
  RendezvousNews news_;                   // GUARDED_BY(mu_)
  std::vector<std::string> reported_lost_;  // GUARDED_BY(mu_)
  std::string progress_out_;              // GUARDED_BY(mu_): the newest summary not yet published
  std::string own_summary_;               // GUARDED_BY(mu_): the leader's own newest summary
  bool leader_ = false;                   // GUARDED_BY(mu_): this node holds rounds/R/leader
  std::chrono::steady_clock::time_point leader_missing_since_{};  // the watcher's own
  std::optional<uint64_t> leader_seen_round_;  // the watcher's own: the round in which it saw a leader
  std::chrono::steady_clock::time_point leading_since_{};  // the watcher's own: when it began to lead its round
  // This node's newest summary the leader has: (the sender's connection it went on, 0: this node
  // leads; its number).
  std::pair<uint64_t, uint64_t> acked_{0, 0};  // GUARDED_BY(mu_)
  std::optional<uint64_t> connected_to_leader_round_;     // the watcher's own: the round whose leader it said hello to
  std::optional<uint64_t> isolated_round_;                // the watcher's own: the round it said it was cut off in
  // Whether this node is cut off (RendezvousNews::isolated): why, or "".
  std::string CutOff(uint64_t round, bool leader, size_t nodes, double since_renewal,
                     std::chrono::steady_clock::time_point last_leader_contact);
  std::map<std::string, std::chrono::steady_clock::time_point> probed_;  // the watcher's own: nodes probed, when
  // The leader's quick look for lost nodes (issue 36, item 3): `nodes` of round `round` whose
  // summary connection closed or went quiet, confirmed by a probe of their agent's port; each
  // with how it was found, and in `*silent` how long nothing was heard of it (RendezvousNews).
  std::map<std::string, std::string> FindLostByStream(uint64_t round, const std::vector<std::string>& nodes,
                                                      const std::set<std::string>& finished,
                                                      std::map<std::string, double>* silent);
  std::unique_ptr<SummarySender> sender_;  // the watcher's own
  std::thread watcher_;
};

// "MIN" or "MIN:MAX" (--nnodes) into min and max. InvalidArgument naming the text.
Status ParseNodeRange(const std::string& text, uint32_t* min_nodes, uint32_t* max_nodes);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_RENDEZVOUS_H_
