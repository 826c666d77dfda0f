// The agent's Prometheus metrics, fed by the job's Timeline (agent/timeline.h: the ranks' trace
// events, applied once) and the agent's own actions,
// served over HTTP on --metrics-addr (the only port on the node that Lifeline opens: the library
// never does). Names follow Prometheus' conventions: lifeline_ prefix, base units (seconds,
// bytes), _total for counters; labels are bounded (rank, kind, op), never a step or tensor name.
#ifndef LIFELINE_AGENT_METRICS_H_
#define LIFELINE_AGENT_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agent/net/http_server.h"
#include "agent/replication/replication_service.h"
#include "agent/time_ledger.h"
#include "agent/timeline.h"
#include "lifeline/status.h"
#include "lifeline/trace.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace lifeline::agent {

// Every family the agent exports, with its type and help text: the README's table and the
// dashboard tests are checked against this list.
struct MetricFamilyInfo {
  const char* name;
  const char* type;  // "counter", "gauge", "histogram"
  const char* labels;
  const char* help;
};
const std::vector<MetricFamilyInfo>& MetricFamilies();

class AgentMetrics {
 public:
  // `node`: this node's name (--node-name), the restarts' node label for its own ranks.
  AgentMetrics(const std::string& job, int world, const std::string& node = "");
  ~AgentMetrics();

  // Starts serving /metrics on "HOST:PORT" (PORT 0: one the kernel picks, see port()), from a
  // thread of its own (agent/net/http_server.h; `options` bound what each client may take).
  // InvalidArgument, Unavailable or FailedPrecondition naming the address when it cannot listen
  // there.
  Status Serve(const std::string& address, const net::HttpServerOptions& options = {});
  // The port /metrics is served on; 0 before Serve.
  uint16_t port() const { return server_ == nullptr ? 0 : server_->port(); }

  // A new launch of `world` local ranks, global ranks `rank_base`.. (per-launch state such as
  // open steps is forgotten; counters go on). Rank labels are global ranks.
  void Launched(int world, int rank_base = 0);
  // A multi-node job's round `round` of `nodes` nodes placed this agent as `node`, GROUP_RANK
  // `group_rank`.
  void JoinedRound(const std::string& node, int group_rank, int nodes = 1, uint64_t round = 0);
  // Multi-node: whether this node leads its round (runs the job-wide detectors) and whether etcd
  // answered its last poll.
  void Rendezvous(bool leader, bool etcd_reachable);
  // Snapshot replication to the peer node (multi-node jobs).
  void Replication(const replication::ReplicationStats& stats);
  // A single-node job's round: its restarts so far.
  void SetRound(uint64_t round);
  // `change` was just applied to `timeline` (see Detector::Observe).
  void Observe(const Timeline& timeline, const TimelineChange& change);
  // A rank's exit was applied to `timeline`: the live-rank gauge follows it.
  void RankExited(const Timeline& timeline);
  // The ring's drop counter of `rank` (cumulative for the current launch).
  void RingDropped(int rank, uint64_t total);
  void Restarted();
  // The job's time account as `ledger` has it at `now_ns`: ETTR, wall and productive time.
  void TimeAccount(const TimeLedger& ledger, uint64_t now_ns);
  // A restart's cost, settled: time lost by phase and steps redone.
  void RestartCost(const agent::RestartCost& cost);
  // A restart this agent decided, for `cause` on a rank of node `node`.
  void RestartCause(const std::string& cause, const std::string& node);
  // A rollback this agent decided (a restart too: Restarted and RestartCause count it), whose
  // relaunch skips the data of `skipped_steps` steps.
  void RolledBack(uint64_t skipped_steps);
  void NodesExcluded(int n);
  // A node taken out for repeated sdc_suspects (RollbackDecision::node_out).
  void SdcNodeOut();
  void Anomaly(const std::string& kind, const std::vector<int>& ranks);
  // The text exposition of everything, as a scrape would get it (for tests and `ctl metrics`).
  std::string Render() const;

 private:
  struct RankState;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<net::HttpServer> server_;  // after registry_: stopped before it goes
  std::string job_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  int rank_base_ = 0;
  std::string Label(int local) const { return std::to_string(rank_base_ + local); }
  // Families.
  prometheus::Family<prometheus::Counter>* restarts_;
  prometheus::Gauge* nodes_;
  prometheus::Gauge* round_;
  prometheus::Gauge* leader_;
  prometheus::Gauge* etcd_reachable_;
  prometheus::Gauge* ettr_;
  prometheus::Counter* wall_;
  prometheus::Counter* productive_;
  prometheus::Family<prometheus::Counter>* time_lost_;
  prometheus::Counter* steps_redone_;
  prometheus::Family<prometheus::Counter>* restarts_by_cause_;
  prometheus::Counter* rollbacks_;
  prometheus::Counter* rollback_skipped_steps_;
  prometheus::Counter* sdc_nodes_out_;
  prometheus::Gauge* nodes_excluded_;
  prometheus::Gauge* replication_lag_;
  prometheus::Gauge* replicated_step_;
  prometheus::Counter* replication_sent_;
  prometheus::Counter* replication_received_;
  prometheus::Counter* replication_failures_;
  prometheus::Counter* replicas_over_budget_;
  replication::ReplicationStats replication_seen_;
  prometheus::Family<prometheus::Counter>* anomalies_;
  prometheus::Family<prometheus::Histogram>* step_duration_;
  prometheus::Family<prometheus::Counter>* steps_;
  prometheus::Family<prometheus::Gauge>* step_;
  prometheus::Family<prometheus::Histogram>* collective_duration_;
  prometheus::Family<prometheus::Gauge>* lateness_;
  prometheus::Family<prometheus::Histogram>* stall_;
  prometheus::Family<prometheus::Histogram>* persist_;
  prometheus::Family<prometheus::Counter>* ckpt_bytes_;
  prometheus::Family<prometheus::Counter>* ckpt_failures_;
  prometheus::Family<prometheus::Counter>* load_fallbacks_;
  prometheus::Family<prometheus::Gauge>* last_committed_;
  prometheus::Family<prometheus::Gauge>* last_committed_time_;
  prometheus::Family<prometheus::Gauge>* alive_;
  prometheus::Family<prometheus::Counter>* dropped_;
  prometheus::Gauge* loss_;
  prometheus::Gauge* grad_norm_;
  prometheus::Counter* signals_;
  int signal_rank_[2] = {0, 0};  // the local rank whose loss and norm the gauges show (the lowest reporting)
  prometheus::Family<prometheus::Gauge>* build_info_;
  prometheus::Family<prometheus::Gauge>* node_info_;
  prometheus::Gauge* node_series_ = nullptr;
  uint64_t last_committed_step_ = trace::kNoStep;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_METRICS_H_
