#include "agent/metrics.h"

#include <netdb.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "agent/launcher.h"

#ifndef LIFELINE_VERSION
#define LIFELINE_VERSION "unknown"
#endif

namespace lifeline::agent {
namespace {

using prometheus::Histogram;

// Bucket bounds for durations, in seconds.
Histogram::BucketBoundaries Decades(double from, double to) {
  Histogram::BucketBoundaries b;
  for (double d = from; d <= to * 1.0001; d *= 10) {
    b.push_back(d);
    if (d * 3 <= to * 1.0001) b.push_back(d * 3);
  }
  return b;
}

const Histogram::BucketBoundaries& StallBuckets() {  // 10 us .. 100 s
  static const auto* b = new Histogram::BucketBoundaries(Decades(1e-5, 100));
  return *b;
}
const Histogram::BucketBoundaries& CollectiveBuckets() {  // 10 us .. 10 min
  static const auto* b = [] {
    auto v = new Histogram::BucketBoundaries(Decades(1e-5, 300));
    v->push_back(600);
    return v;
  }();
  return *b;
}
const Histogram::BucketBoundaries& StepBuckets() {  // 1 ms .. 10 min
  static const auto* b = [] {
    auto v = new Histogram::BucketBoundaries(Decades(1e-3, 300));
    v->push_back(600);
    return v;
  }();
  return *b;
}
const Histogram::BucketBoundaries& PersistBuckets() {  // 10 ms .. 1 h
  static const auto* b = [] {
    auto v = new Histogram::BucketBoundaries(Decades(1e-2, 1000));
    v->push_back(3600);
    return v;
  }();
  return *b;
}

std::string Exposition(const prometheus::Registry& registry) {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry.Collect());
}

double UnixSeconds() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

const std::vector<MetricFamilyInfo>& MetricFamilies() {
  static const std::vector<MetricFamilyInfo> kFamilies = {
      {"lifeline_build_info", "gauge", "version", "Always 1; the agent's version in a label"},
      {"lifeline_ranks_alive", "gauge", "", "Local ranks running now"},
      {"lifeline_restarts_total", "counter", "", "Restarts of the local ranks by the agent"},
      {"lifeline_anomalies_total", "counter", "kind, rank",
       "Anomalies detected, by kind (dead, hang, straggler, slow_collective, checkpoint, node_lost, non_finite, "
       "spike, disagreement, sdc_suspect) and culprit rank, global in a multi-node job (\"none\" when no rank stands out)"},
      {"lifeline_step_duration_seconds", "histogram", "rank", "Step durations, StepBegin to StepEnd"},
      {"lifeline_steps_total", "counter", "rank", "Steps completed"},
      {"lifeline_step", "gauge", "rank", "The step each rank began last (-1: none yet)"},
      {"lifeline_collective_duration_seconds", "histogram", "op",
       "Collective durations on each rank, CollectiveBegin to CollectiveEnd"},
      {"lifeline_collective_lateness_seconds", "gauge", "rank",
       "How late each rank enters collectives against the median rank (moving average; 0 is on time)"},
      {"lifeline_checkpoint_stall_seconds", "histogram", "", "Time a rank's training loop was blocked by a save"},
      {"lifeline_checkpoint_persist_seconds", "histogram", "", "Save to durable on disk, per rank"},
      {"lifeline_checkpoint_bytes_total", "counter", "", "Bytes persisted by checkpoints, all ranks"},
      {"lifeline_checkpoint_failures_total", "counter", "", "Failed or refused saves, all ranks"},
      {"lifeline_checkpoint_load_fallbacks_total", "counter", "location",
       "Checkpoints a load passed over (damaged or unusable) for an older one, by where they were (memory, disk)"},
      {"lifeline_checkpoint_last_committed_step", "gauge", "", "Newest committed checkpoint step (-1: none yet)"},
      {"lifeline_checkpoint_last_committed_timestamp_seconds", "gauge", "",
       "Unix time the newest checkpoint was committed (0: none yet)"},
      {"lifeline_loss", "gauge", "",
       "The newest training loss reported (lifeline.report), by the lowest-numbered local rank reporting it; NaN "
       "until one is"},
      {"lifeline_grad_norm", "gauge", "",
       "The newest global gradient norm reported (clip_grad_norm_ under the agent, or lifeline.report), by the "
       "lowest-numbered local rank reporting it; NaN until one is"},
      {"lifeline_training_signals_total", "counter", "",
       "Training-signal values (loss, gradient norm, the scripts' own scalars) received from the local ranks"},
      {"lifeline_trace_events_dropped_total", "counter", "rank",
       "Trace events a rank could not record because its ring was full"},
      {"lifeline_node_info", "gauge", "node, group_rank",
       "Always 1: the agent's node (its id in a multi-node job, the hostname on one node) and its place (GROUP_RANK) in the current round"},
      {"lifeline_nodes", "gauge", "", "Nodes in the job's current round, as this agent's plan has it (1 on a single-node job)"},
      {"lifeline_round", "gauge", "",
       "The job's round: the restart generation every node of the job shares, LIFELINE_RESTART of its ranks"},
      {"lifeline_round_leader", "gauge", "",
       "1 while this node leads its round (runs the job-wide hang, straggler and slow-collective detectors), else 0; "
       "0 on a single-node job"},
      {"lifeline_replication_lag_seconds", "gauge", "",
       "How long the newest step this node's ranks published in its memory tier has waited to be replicated to its "
       "peer nodes (0: replicated)"},
      {"lifeline_replicated_step", "gauge", "", "Newest step of this node's ranks held in every peer node's memory (-1: none)"},
      {"lifeline_replication_bytes_total", "counter", "direction",
       "Snapshot bytes replicated between nodes' memory, sent to the peers or received from one"},
      {"lifeline_replication_failures_total", "counter", "", "Replication streams that failed (the next pass retries)"},
      {"lifeline_replicas_over_budget_total", "counter", "",
       "Replicas from a peer refused because they did not fit this node's memory budget (not replicated)"},
      {"lifeline_ettr", "gauge", "",
       "Effective training time ratio since the first launch: productive training time over wall time"},
      {"lifeline_wall_seconds_total", "counter", "", "Wall time since the first launch of the ranks"},
      {"lifeline_productive_seconds_total", "counter", "",
       "Time the ranks spent stepping, less the steps they computed again after restarts"},
      {"lifeline_time_lost_seconds_total", "counter", "phase",
       "Time restarts cost, by phase: detection, stop, backoff, relaunch, load, redo (steps computed again)"},
      {"lifeline_steps_redone_total", "counter", "", "Steps computed again after restarts (since the checkpoint resumed from)"},
      {"lifeline_restarts_by_cause_total", "counter", "cause, node",
       "Restarts this agent decided, by the anomaly's kind and the node of the culprit rank"},
      {"lifeline_rollbacks_total", "counter", "",
       "Relaunches from the newest checkpoint before a non_finite, spike or sdc_suspect anomaly (policy rollback); "
       "each is a restart too"},
      {"lifeline_sdc_nodes_out_total", "counter", "",
       "Nodes this agent took out of the job for holding corrupted replicas again (rollback.sdc_per_node "
       "sdc_suspects on one node): excluded from the next rounds of a multi-node job, or a single-node job stopped"},
      {"lifeline_rollback_skipped_steps_total", "counter", "",
       "Steps whose data relaunched ranks were told to skip after a rollback (rollback.skip_data)"},
      {"lifeline_nodes_excluded", "gauge", "", "Nodes the current round left out as bad (multi-node jobs)"},
      {"lifeline_etcd_reachable", "gauge", "",
       "1 when etcd answered the agent's last poll, 0 when not (training goes on; job-wide verdicts and restarts "
       "wait); 1 on a single-node job, which uses no etcd"},
  };
  return kFamilies;
}

struct AgentMetrics::RankState {
  double lateness = 0;
  bool lateness_seen = false;
  uint64_t dropped = 0;
};

AgentMetrics::AgentMetrics(const std::string& job, int world, const std::string& node) : registry_(std::make_shared<prometheus::Registry>()), job_(job) {
  auto help = [](const char* name) {
    for (const MetricFamilyInfo& f : MetricFamilies())
      if (std::string(f.name) == name) return std::string(f.help);
    return std::string();
  };
  auto counter = [&](const char* name) {
    return &prometheus::BuildCounter().Name(name).Help(help(name)).Register(*registry_);
  };
  auto gauge = [&](const char* name) {
    return &prometheus::BuildGauge().Name(name).Help(help(name)).Register(*registry_);
  };
  auto histogram = [&](const char* name) {
    return &prometheus::BuildHistogram().Name(name).Help(help(name)).Register(*registry_);
  };
  build_info_ = gauge("lifeline_build_info");
  build_info_->Add({{"version", LIFELINE_VERSION}}).Set(1);
  alive_ = gauge("lifeline_ranks_alive");
  alive_->Add({}).Set(0);
  restarts_ = counter("lifeline_restarts_total");
  restarts_->Add({});
  anomalies_ = counter("lifeline_anomalies_total");
  step_duration_ = histogram("lifeline_step_duration_seconds");
  steps_ = counter("lifeline_steps_total");
  step_ = gauge("lifeline_step");
  collective_duration_ = histogram("lifeline_collective_duration_seconds");
  for (int op = 0; op <= static_cast<int>(trace::Op::kBarrier); ++op)  // a fixed, small label set
    collective_duration_->Add({{"op", trace::OpName(static_cast<trace::Op>(op))}}, CollectiveBuckets());
  lateness_ = gauge("lifeline_collective_lateness_seconds");
  stall_ = histogram("lifeline_checkpoint_stall_seconds");
  stall_->Add({}, StallBuckets());
  persist_ = histogram("lifeline_checkpoint_persist_seconds");
  persist_->Add({}, PersistBuckets());
  ckpt_bytes_ = counter("lifeline_checkpoint_bytes_total");
  ckpt_bytes_->Add({});
  ckpt_failures_ = counter("lifeline_checkpoint_failures_total");
  ckpt_failures_->Add({});
  load_fallbacks_ = counter("lifeline_checkpoint_load_fallbacks_total");
  load_fallbacks_->Add({{"location", "memory"}});
  load_fallbacks_->Add({{"location", "disk"}});
  last_committed_ = gauge("lifeline_checkpoint_last_committed_step");
  last_committed_->Add({}).Set(-1);
  last_committed_time_ = gauge("lifeline_checkpoint_last_committed_timestamp_seconds");
  last_committed_time_->Add({}).Set(0);
  dropped_ = counter("lifeline_trace_events_dropped_total");
  loss_ = &gauge("lifeline_loss")->Add({});
  loss_->Set(std::numeric_limits<double>::quiet_NaN());
  grad_norm_ = &gauge("lifeline_grad_norm")->Add({});
  grad_norm_->Set(std::numeric_limits<double>::quiet_NaN());
  signals_ = &counter("lifeline_training_signals_total")->Add({});
  node_info_ = gauge("lifeline_node_info");
  nodes_ = &gauge("lifeline_nodes")->Add({});
  round_ = &gauge("lifeline_round")->Add({});
  leader_ = &gauge("lifeline_round_leader")->Add({});
  etcd_reachable_ = &gauge("lifeline_etcd_reachable")->Add({});
  etcd_reachable_->Set(1);
  replication_lag_ = &gauge("lifeline_replication_lag_seconds")->Add({});
  replicated_step_ = &gauge("lifeline_replicated_step")->Add({});
  replicated_step_->Set(-1);
  auto* bytes = counter("lifeline_replication_bytes_total");
  replication_sent_ = &bytes->Add({{"direction", "sent"}});
  replication_received_ = &bytes->Add({{"direction", "received"}});
  replication_failures_ = &counter("lifeline_replication_failures_total")->Add({});
  replicas_over_budget_ = &counter("lifeline_replicas_over_budget_total")->Add({});
  ettr_ = &gauge("lifeline_ettr")->Add({});
  ettr_->Set(1);
  wall_ = &counter("lifeline_wall_seconds_total")->Add({});
  productive_ = &counter("lifeline_productive_seconds_total")->Add({});
  time_lost_ = counter("lifeline_time_lost_seconds_total");
  for (const char* phase : kLostPhases) time_lost_->Add({{"phase", phase}});
  steps_redone_ = &counter("lifeline_steps_redone_total")->Add({});
  restarts_by_cause_ = counter("lifeline_restarts_by_cause_total");
  // The causes a restart has, on this node, from the start: a rate() over them is defined before
  // the first restart (other nodes' series appear when this agent restarts the job for them).
  for (const char* cause : {"dead", "hang", "node_lost"})
    restarts_by_cause_->Add({{"cause", cause}, {"node", node.empty() ? "unknown" : node}});
  rollbacks_ = &counter("lifeline_rollbacks_total")->Add({});
  rollback_skipped_steps_ = &counter("lifeline_rollback_skipped_steps_total")->Add({});
  sdc_nodes_out_ = &counter("lifeline_sdc_nodes_out_total")->Add({});
  nodes_excluded_ = &gauge("lifeline_nodes_excluded")->Add({});
  JoinedRound(HostName(), 0);  // one node
  // Every kind appears from the start, so a rate() over it is defined before the first anomaly.
  for (const char* kind : {"dead", "hang", "straggler", "slow_collective", "checkpoint", "node_lost", "non_finite",
                           "spike", "disagreement", "sdc_suspect"})
    anomalies_->Add({{"kind", kind}, {"rank", "none"}});
  Launched(world);
}

AgentMetrics::~AgentMetrics() = default;

namespace {

// A listening socket on "HOST:PORT" (the first address HOST resolves to), or an error that says
// what is wrong with the address.
Result<int> ListenOn(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return Status::InvalidArgument("metrics address " + address, "expected HOST:PORT");
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return Status::InvalidArgument("metrics address " + address, std::string("cannot resolve it: ") + gai_strerror(rc));
  const int fd = socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC, found->ai_protocol);
  if (fd < 0) {
    const int err = errno;
    freeaddrinfo(found);
    return Status::FromErrno(err, "metrics address " + address);
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // a restarted agent rebinds at once
  Status result;
  if (bind(fd, found->ai_addr, found->ai_addrlen) != 0) {
    const int err = errno;
    if (err == EADDRINUSE) {
      result = Status::Unavailable("address " + address + " is in use", "choose another --metrics-addr");
    } else if (err == EADDRNOTAVAIL) {
      result = Status::InvalidArgument("address " + address, "is not an address of this machine");
    } else if (err == EACCES) {
      result = Status::FailedPrecondition("address " + address, "binding this port needs privileges");
    } else {
      result = Status::FromErrno(err, "metrics address " + address);
    }
  } else if (listen(fd, SOMAXCONN) != 0) {
    result = Status::FromErrno(errno, "metrics address " + address);
  }
  freeaddrinfo(found);
  if (!result.ok()) {
    close(fd);
    return result;
  }
  return fd;
}

}  // namespace

Status AgentMetrics::Serve(const std::string& address, const net::HttpServerOptions& options) {
  LL_ASSIGN_OR_RETURN(const int fd, ListenOn(address));
  // The registry is safe to collect from the server's thread while the agent updates it.
  net::HttpResource metrics{"/metrics", "text/plain; version=0.0.4; charset=utf-8",
                            [registry = registry_] { return Exposition(*registry); }};
  LL_ASSIGN_OR_RETURN(server_, net::HttpServer::Start(fd, std::move(metrics), options));
  return Status::OK();
}

void AgentMetrics::Launched(int world, int rank_base) {
  // Series are by global rank: a node that takes other ranks in a new round gets new series.
  const bool moved = rank_base != rank_base_;
  rank_base_ = rank_base;
  for (int r = moved ? 0 : static_cast<int>(ranks_.size()); r < world; ++r) {
    const std::string rank = Label(r);
    step_duration_->Add({{"rank", rank}}, StepBuckets());
    steps_->Add({{"rank", rank}});
    step_->Add({{"rank", rank}}).Set(-1);
    lateness_->Add({{"rank", rank}}).Set(0);
    dropped_->Add({{"rank", rank}});
  }
  ranks_.clear();
  for (int r = 0; r < world; ++r) ranks_.push_back(std::make_unique<RankState>());
  signal_rank_[0] = signal_rank_[1] = std::numeric_limits<int>::max();
  alive_->Add({}).Set(world);
}

void AgentMetrics::TimeAccount(const TimeLedger& ledger, uint64_t now_ns) {
  if (!ledger.started()) return;
  ettr_->Set(ledger.ettr(now_ns));
  // Counters only go up: what the ledger says minus what was counted. Productive time can fall
  // back when a restart settles its redone steps; the counter then waits for it to catch up.
  const double wall = ledger.wall_seconds(now_ns), productive = ledger.productive_seconds();
  if (wall > wall_->Value()) wall_->Increment(wall - wall_->Value());
  if (productive > productive_->Value()) productive_->Increment(productive - productive_->Value());
}

void AgentMetrics::RestartCost(const agent::RestartCost& cost) {
  const double phases[] = {cost.detection_seconds, cost.stop_seconds,    cost.backoff_seconds,
                           cost.relaunch_seconds,  cost.load_seconds,    cost.redo_seconds};
  for (size_t k = 0; k < std::size(kLostPhases); ++k)
    time_lost_->Add({{"phase", kLostPhases[k]}}).Increment(std::max(0.0, phases[k]));
  steps_redone_->Increment(static_cast<double>(cost.steps_redone));
}

void AgentMetrics::RestartCause(const std::string& cause, const std::string& node) {
  restarts_by_cause_->Add({{"cause", cause}, {"node", node.empty() ? "unknown" : node}}).Increment();
}

void AgentMetrics::RolledBack(uint64_t skipped_steps) {
  rollbacks_->Increment();
  rollback_skipped_steps_->Increment(static_cast<double>(skipped_steps));
}

void AgentMetrics::NodesExcluded(int n) { nodes_excluded_->Set(n); }

void AgentMetrics::SdcNodeOut() { sdc_nodes_out_->Increment(); }

void AgentMetrics::RankExited(const Timeline& timeline) { alive_->Add({}).Set(timeline.alive_count()); }

void AgentMetrics::RingDropped(int rank, uint64_t total) {
  if (rank < 0 || static_cast<size_t>(rank) >= ranks_.size()) return;
  RankState& s = *ranks_[rank];
  if (total > s.dropped) dropped_->Add({{"rank", Label(rank)}}).Increment(static_cast<double>(total - s.dropped));
  s.dropped = total;
}

void AgentMetrics::JoinedRound(const std::string& node, int group_rank, int nodes, uint64_t round) {
  if (node_series_ != nullptr) node_info_->Remove(node_series_);
  node_series_ = &node_info_->Add({{"node", node}, {"group_rank", std::to_string(group_rank)}});
  node_series_->Set(1);
  nodes_->Set(nodes);
  round_->Set(static_cast<double>(round));
}

void AgentMetrics::Rendezvous(bool leader, bool etcd_reachable) {
  leader_->Set(leader ? 1 : 0);
  etcd_reachable_->Set(etcd_reachable ? 1 : 0);
}

void AgentMetrics::Replication(const replication::ReplicationStats& s) {
  replication_lag_->Set(s.lag_seconds);
  replicated_step_->Set(s.replicated_step ? static_cast<double>(*s.replicated_step) : -1);
  // The service's totals are cumulative; the counters move by what is new.
  if (s.bytes_sent > replication_seen_.bytes_sent) replication_sent_->Increment(static_cast<double>(s.bytes_sent - replication_seen_.bytes_sent));
  if (s.bytes_received > replication_seen_.bytes_received)
    replication_received_->Increment(static_cast<double>(s.bytes_received - replication_seen_.bytes_received));
  if (s.failures > replication_seen_.failures) replication_failures_->Increment(static_cast<double>(s.failures - replication_seen_.failures));
  if (s.over_budget > replication_seen_.over_budget)
    replicas_over_budget_->Increment(static_cast<double>(s.over_budget - replication_seen_.over_budget));
  replication_seen_ = s;
}

void AgentMetrics::SetRound(uint64_t round) { round_->Set(static_cast<double>(round)); }

void AgentMetrics::Restarted() { restarts_->Add({}).Increment(); }

void AgentMetrics::Anomaly(const std::string& kind, const std::vector<int>& ranks) {
  if (ranks.empty()) anomalies_->Add({{"kind", kind}, {"rank", "none"}}).Increment();
  for (int r : ranks) anomalies_->Add({{"kind", kind}, {"rank", std::to_string(r)}}).Increment();
}

void AgentMetrics::Observe(const Timeline& timeline, const TimelineChange& c) {
  const int rank = c.rank;
  if (rank < 0 || static_cast<size_t>(rank) >= ranks_.size()) return;
  const trace::Event& e = *c.event;
  const std::string r = Label(rank);
  const double seconds = static_cast<double>(e.duration_ns) * 1e-9;
  switch (e.type) {
    case trace::EventType::kStepBegin:
      step_->Add({{"rank", r}}).Set(static_cast<double>(e.step));
      break;
    case trace::EventType::kStepEnd:
      if (c.step_closed_ns) {
        step_duration_->Add({{"rank", r}}, StepBuckets()).Observe(static_cast<double>(*c.step_closed_ns) * 1e-9);
        steps_->Add({{"rank", r}}).Increment();
      }
      break;
    case trace::EventType::kCollectiveBegin: {
      // Every rank of the job has entered it (the last one just did): each rank's lateness.
      const int world = std::min(static_cast<int>(ranks_.size()), timeline.world());
      if (c.first_begin && c.record != nullptr && c.record->begun == world) {
        const std::vector<uint64_t>& begins = c.record->begin_ns;
        std::vector<uint64_t> sorted(begins.begin(), begins.begin() + world);
        std::sort(sorted.begin(), sorted.end());
        const uint64_t median = sorted[sorted.size() / 2];
        for (int i = 0; i < world; ++i) {
          RankState& rs = *ranks_[i];
          const double late = (static_cast<double>(begins[i]) - static_cast<double>(median)) * 1e-9;
          rs.lateness = rs.lateness_seen ? 0.9 * rs.lateness + 0.1 * late : late;
          rs.lateness_seen = true;
          lateness_->Add({{"rank", Label(i)}}).Set(rs.lateness);
        }
      }
      break;
    }
    case trace::EventType::kCollectiveEnd:
      if (c.collective_closed && e.time_ns >= c.collective_closed->begin_ns)
        collective_duration_->Add({{"op", trace::OpName(c.collective_closed->op)}}, CollectiveBuckets())
            .Observe(static_cast<double>(e.time_ns - c.collective_closed->begin_ns) * 1e-9);
      break;
    case trace::EventType::kCheckpointCopied:
      stall_->Add({}, StallBuckets()).Observe(static_cast<double>(e.aux) * 1e-9);
      break;
    case trace::EventType::kCheckpointPersisted:
      persist_->Add({}, PersistBuckets()).Observe(seconds);
      ckpt_bytes_->Add({}).Increment(static_cast<double>(e.aux));
      break;
    case trace::EventType::kCheckpointCommitted:
      if (last_committed_step_ == trace::kNoStep || e.step > last_committed_step_) {
        last_committed_step_ = e.step;
        last_committed_->Add({}).Set(static_cast<double>(e.step));
        last_committed_time_->Add({}).Set(UnixSeconds());
      }
      break;
    case trace::EventType::kCheckpointFailed:
      ckpt_failures_->Add({}).Increment();
      break;
    case trace::EventType::kCheckpointFallback:
      load_fallbacks_->Add({{"location", e.aux == 1 ? "memory" : "disk"}}).Increment();
      break;
    case trace::EventType::kScalar:
      signals_->Increment();
      // One series per job, not per rank: the loss and the norm of the lowest local rank reporting.
      if (e.comm == trace::kLossScalar || e.comm == trace::kGradNormScalar) {
        int& reporter = signal_rank_[e.comm];
        if (rank <= reporter) {
          reporter = rank;
          (e.comm == trace::kLossScalar ? loss_ : grad_norm_)->Set(trace::ScalarValue(e));
        }
      }
      break;
    default:
      break;
  }
}

std::string AgentMetrics::Render() const { return Exposition(*registry_); }

}  // namespace lifeline::agent
