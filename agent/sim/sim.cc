#include "agent/sim/sim.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <deque>
#include <map>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "agent/detectors/evidence.h"
#include "agent/progress.h"
#include "agent/rendezvous.h"
#include "agent/summary_stream.h"
#include "agent/supervisor.h"
#include "lifeline/trace.h"

namespace lifeline::agent::sim {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr int64_t kEpochMs = 1'760'000'000'000;  // the simulated wall clock starts here

uint64_t Ns(double seconds) { return static_cast<uint64_t>(std::llround(seconds * 1e9)); }

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string NodeId(int group) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "node-%04d", group);  // string order is group order
  return buf;
}

std::string RankText(const std::vector<int>& ranks) {
  if (ranks.empty()) return "no rank";
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  if (ranks.size() > 4) return s + std::to_string(ranks.front()) + ".." + std::to_string(ranks.back());
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

// The ranks: their steps and collectives as trace events, generated a step at a time for the
// whole job (the collective couples them), with the drill's faults.
class SimulatedRanks {
 public:
  SimulatedRanks(const SimConfig& c, const Drill& d)
      : c_(c), d_(d), per_node_(c.ranks / c.nodes), rng_(SplitMix(d.seed)), events_(c.ranks), t_(c.ranks),
        stopped_(c.ranks, false), exit_at_(c.ranks, kNever), wait_status_(c.ranks, 0), lost_at_(c.nodes, kNever),
        onset_(d.faults.size(), kNever) {
    std::uniform_real_distribution<double> u(0, 0.001);
    for (double& t : t_) t = 1.0 + u(rng_);
  }

  // Steps until every running rank has events through `until`, the last step, or a stall.
  void GenerateThrough(double until) {
    while (!blocked_ && step_ < d_.steps && Frontier() < until) Step();
  }
  bool done() const { return blocked_ || step_ >= d_.steps; }
  // When the job stopped for good (a collective that cannot end), else kNever.
  double blocked_at() const { return blocked_at_; }
  double last_event() const { return last_event_; }

  std::deque<trace::Event>& events(int rank) { return events_[rank]; }
  double exit_at(int rank) const { return exit_at_[rank]; }
  int wait_status(int rank) const { return wait_status_[rank]; }
  double lost_at(int node) const { return lost_at_[node]; }
  double onset(size_t fault) const { return onset_[fault]; }

 private:
  double Frontier() const {
    double f = kNever;
    for (int r = 0; r < c_.ranks; ++r)
      if (!stopped_[r]) f = std::min(f, t_[r]);
    return f;
  }
  double Normal() { return normal_(rng_); }
  double Uniform() { return uniform_(rng_); }
  int NodeOf(int rank) const { return rank / per_node_; }

  void Emit(int rank, trace::EventType type, double t, uint64_t seq = 0) {
    if (t >= lost_at_[NodeOf(rank)]) return;  // the node is gone: nothing more from its ranks
    trace::Event e;
    e.type = type;
    e.time_ns = Ns(t);
    e.step = static_cast<uint64_t>(step_);
    if (type == trace::EventType::kCollectiveBegin || type == trace::EventType::kCollectivePosted ||
        type == trace::EventType::kCollectiveEnd) {
      e.seq = seq;
      e.comm = 0;
      e.op = trace::Op::kAllReduce;
    }
    events_[rank].push_back(e);
    last_event_ = std::max(last_event_, t);
  }

  void Step() {
    const int k = step_;
    const int n = c_.ranks;
    std::vector<double> begin(n, kNever), posted(n, kNever);
    std::vector<double> step_begin = t_;
    // The op's time for this collective (the ring's time once every part is in).
    double op = c_.op_seconds * std::exp(c_.op_sigma * Normal());
    if (Uniform() < c_.congestion_probability) op *= 1.2 + 0.6 * Uniform();
    // Nodes lost in this step: at a point of the node's first rank's compute.
    for (size_t i = 0; i < d_.faults.size(); ++i) {
      const Fault& f = d_.faults[i];
      if (f.kind != FaultKind::kNodeLoss || f.step != k) continue;
      const int node = NodeOf(f.rank);
      double first = kNever;
      for (int r = node * per_node_; r < (node + 1) * per_node_; ++r) first = std::min(first, t_[r]);
      lost_at_[node] = first + f.at_fraction * c_.compute_seconds;
      onset_[i] = lost_at_[node];
    }
    bool stall = false;
    for (int r = 0; r < n; ++r) {
      if (stopped_[r]) continue;
      Emit(r, trace::EventType::kStepBegin, t_[r]);
      double compute = c_.compute_seconds * std::exp(c_.compute_sigma * Normal());
      if (Uniform() < c_.spike_probability)
        compute += c_.spike_min_seconds + (c_.spike_max_seconds - c_.spike_min_seconds) * Uniform();
      double extra_post = 0;
      bool stops = false;
      for (size_t i = 0; i < d_.faults.size(); ++i) {
        const Fault& f = d_.faults[i];
        const bool mine = f.kind == FaultKind::kNodeLoss ? NodeOf(f.rank) == NodeOf(r) : f.rank == r;
        if (!mine) continue;
        if (f.kind == FaultKind::kStraggler && k >= f.step) {
          compute *= f.factor;
          if (k == f.step) onset_[i] = std::min(onset_[i], step_begin[r]);
        } else if (f.kind == FaultKind::kSlowLink && k >= f.step) {
          extra_post += (f.factor - 1) * op;
          if (k == f.step) onset_[i] = std::min(onset_[i], t_[r] + compute);
        } else if (f.kind == FaultKind::kHang && k == f.step) {
          stops = true;  // alive, in its step, never begins the collective
        } else if (f.kind == FaultKind::kCrash && k == f.step) {
          stops = true;
          exit_at_[r] = t_[r] + f.at_fraction * compute;
          wait_status_[r] = f.wait_status;
          onset_[i] = exit_at_[r];
        } else if (f.kind == FaultKind::kNodeLoss && k == f.step) {
          stops = true;
        }
      }
      if (stops) {
        stopped_[r] = true;
        stall = true;
        continue;
      }
      begin[r] = t_[r] + compute;
      posted[r] = begin[r] + c_.post_seconds + extra_post;
    }
    const uint64_t seq = ++seq_;
    for (int r = 0; r < n; ++r) {
      if (stopped_[r]) continue;
      Emit(r, trace::EventType::kCollectiveBegin, begin[r], seq);
      Emit(r, trace::EventType::kCollectivePosted, posted[r], seq);
    }
    // Echoes of this step's crashes: peers failing in the collective the crashed rank never joins.
    for (const Fault& f : d_.faults) {
      if (f.kind != FaultKind::kCrash || f.step != k) continue;
      for (int e : f.echo_ranks) {
        if (e < 0 || e >= n || stopped_[e] || exit_at_[e] != kNever) continue;
        exit_at_[e] = std::max(exit_at_[f.rank], posted[e]) + f.echo_after_seconds;
        wait_status_[e] = 1 << 8;
      }
    }
    if (stall) {
      // The others wait in it for ever: the hang's onset is when the first of them began it.
      double first = kNever;
      for (int r = 0; r < n; ++r) first = std::min(first, begin[r]);
      for (size_t i = 0; i < d_.faults.size(); ++i)
        if (d_.faults[i].kind == FaultKind::kHang && d_.faults[i].step == k) onset_[i] = first;
      blocked_ = true;
      blocked_at_ = first;
      for (int node = 0; node < c_.nodes; ++node) blocked_at_ = std::min(blocked_at_, lost_at_[node]);
      for (int r = 0; r < n; ++r) blocked_at_ = std::min(blocked_at_, exit_at_[r]);
      ++step_;
      return;
    }
    int last = 0;
    for (int r = 0; r < n; ++r)
      if (posted[r] > posted[last]) last = r;
    const double done = posted[last] + op;
    for (int r = 0; r < n; ++r) {
      // Ring-like: the result reaches the ranks in ring order from the last to post.
      const double end = done + c_.ring_spread_seconds * static_cast<double>((r - last + n) % n) / n;
      Emit(r, trace::EventType::kCollectiveEnd, end, seq);
      const double step_end = end + c_.update_seconds * std::exp(0.1 * Normal());
      Emit(r, trace::EventType::kStepEnd, step_end);
      t_[r] = step_end + 0.0001;
    }
    ++step_;
  }

  const SimConfig& c_;
  const Drill& d_;
  const int per_node_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0, 1};
  std::uniform_real_distribution<double> uniform_{0, 1};
  std::vector<std::deque<trace::Event>> events_;
  std::vector<double> t_;  // per rank: its next StepBegin
  std::vector<bool> stopped_;
  std::vector<double> exit_at_;
  std::vector<int> wait_status_;
  std::vector<double> lost_at_;  // per node
  std::vector<double> onset_;    // per fault
  int step_ = 0;
  uint64_t seq_ = 0;
  bool blocked_ = false;
  double blocked_at_ = kNever;
  double last_event_ = 0;
};

// One node's agent: its Supervisor (the agent's own decisions: timeline, detectors, job-wide view,
// echo hold, policies), polled as Agent::Run polls it, and what its etcd watcher holds.
struct NodeAgent {
  int group = 0;
  std::string id;
  int base = 0;
  bool gone = false;   // lost with its ranks
  bool moved = false;  // saw the round move (or moved it): its part of the drill is over
  double moved_at = kNever;  // when: from then on Agent::Run stops its ranks for the next round
  double skew_ms = 0;  // its wall clock against true time
  double started = 0;  // its agent's first poll: the agents' loops are not in phase with each other
  std::unique_ptr<Surroundings> around;
  std::unique_ptr<Supervisor> supervisor;
  std::vector<bool> reaped;
  // The watcher's side (Rendezvous::Watch).
  double next_watch = 0, last_renewal = 0, last_progress = 0;
  std::string progress_out;
  bool leader = false;
  double leader_missing_since = -1;
  bool leader_seen = false;  // a leader was there in this round (one gone is replaced at once)
  double leading_since = 0;  // when this node began to lead
  std::vector<std::string> reported_lost;
  // The leader's look at the summary streams: per node, since when it has been probed (-1: not).
  std::vector<double> probing;
  // News for the agent (RendezvousNews), taken at its next poll.
  bool news_leader = false;
  bool news_moved = false;
  std::vector<EtcdKeyValue> news_progress;
  std::vector<std::string> news_lost;
  std::map<std::string, std::string> news_lost_how;      // those found by their summary stream...
  std::map<std::string, double> news_lost_silent;        // ...and how long the leader heard nothing of them
  // Its newest summary the leader has, and which leader that was (-1: none; a new leader has none).
  uint64_t acked = 0;
  int acked_by = -1;
};

class JobSimulation {
 public:
  JobSimulation(const SimConfig& c, const Drill& d) : c_(c), d_(d), ranks_(c, d), per_node_(c.ranks / c.nodes) {
    std::mt19937_64 rng(SplitMix(d.seed ^ 0x5eed));
    std::normal_distribution<double> normal(0, 1);
    std::uniform_real_distribution<double> uniform(0, 1);
    node_config_ = c.agent;
    node_config_.nproc = static_cast<uint32_t>(per_node_);
    plan_.world_size = static_cast<uint32_t>(c.ranks);
    for (int g = 0; g < c.nodes; ++g) {
      RoundNode node;
      node.id = NodeId(g);
      node.host = "host-" + std::to_string(g);
      node.nproc = static_cast<uint32_t>(per_node_);
      plan_.nodes.push_back(std::move(node));
    }
    nodes_.resize(c.nodes);
    for (int g = 0; g < c.nodes; ++g) {
      NodeAgent& n = nodes_[g];
      n.group = g;
      n.id = NodeId(g);
      n.base = g * per_node_;
      n.skew_ms = c.clock_skew_ms * normal(rng);
      n.around = std::make_unique<SimulatedSurroundings>(this, g);
      n.supervisor = std::make_unique<Supervisor>(node_config_, n.around.get(), n.id, c.publish_seconds);
      n.supervisor->set_meter(&meter_);
      // As Agent::Launch: the node's ranks, named globally, in round 0 of the job.
      SupervisedLaunch launch;
      launch.world = per_node_;
      launch.rank_base = n.base;
      launch.now_ns = Ns(1.0);
      launch.plan = plan_;
      launch.plan->group_rank = g;
      launch.plan->rank_base = static_cast<uint32_t>(n.base);
      n.supervisor->Launched(launch);
      n.reaped.assign(per_node_, false);
      // The agents' loops and watchers are not in phase with each other.
      n.started = 1.0 - c.publish_seconds * uniform(rng);
      n.next_watch = 1.0 + c.watch_seconds * uniform(rng);
      n.last_renewal = n.next_watch - c.watch_seconds;
      n.last_progress = n.next_watch - c.progress_seconds * uniform(rng);
      n.probing.assign(c.nodes, -1);
    }
    progress_.assign(c.nodes, {});
    summary_at_.assign(c.nodes, 1.0);
    failures_.assign(c.nodes, -1);
  }

  DrillResult Run() {
    DrillResult out;
    out.drill = d_;
    const double tick = c_.poll_seconds;
    // Each agent's first poll, before the ranks' first events (it publishes its first summary).
    for (NodeAgent& n : nodes_) PollNode(n, n.started, &out);
    double now = 1.0;
    for (;;) {
      now += tick;
      ranks_.GenerateThrough(now + 1.0);
      for (NodeAgent& n : nodes_)
        if (!n.gone && ranks_.lost_at(n.group) <= now) n.gone = true;
      for (NodeAgent& n : nodes_)
        while (!n.gone && !n.moved && n.next_watch <= now) {
          Watch(n, n.next_watch);
          n.next_watch += c_.watch_seconds;
        }
      bool any = false;
      for (NodeAgent& n : nodes_) {
        if (n.gone || n.moved) continue;
        PollNode(n, now, &out);
        any = any || !n.moved;
      }
      if (!any) break;  // every agent left the round
      if (ranks_.done() && ranks_.blocked_at() == kNever && now > ranks_.last_event() + 3 * c_.progress_seconds) break;
      if (now > ranks_.blocked_at() + c_.give_up_seconds) break;
    }
    out.simulated_seconds = now - 1.0;
    out.node_events = node_events_;
    out.node_cpu_seconds = meter_.cpu_seconds[0];
    out.summary_ranks = summary_ranks_;
    out.summary_cpu_seconds = meter_.cpu_seconds[1];
    out.view_reads = meter_.view_reads;
    out.view_samples = view_samples_;
    out.summary_bytes = summary_bytes_;
    out.view_cpu_seconds = meter_.cpu_seconds[2];
    out.echoes = echoes_;
    Score(&out);
    Recover(now, &out);
    return out;
  }

  // The restart the drill ended with, carried through on the node that decided it as
  // Agent::Restart does (stop, back-off, relaunch, load, the first step again), for its time-lost
  // account; with no restart, the account of the run as it stands.
  void Recover(double now, DrillResult* out) {
    if (restart_node_ < 0) {
      const TimeLedger& ledger = nodes_[0].supervisor->ledger();
      out->ettr = ledger.ettr(Ns(now));
      out->wall_seconds = ledger.wall_seconds(Ns(now));
      return;
    }
    NodeAgent& n = nodes_[restart_node_];
    double t = restart_at_ + c_.stop_seconds;
    std::vector<RankEnd> ends;
    for (int local = 0; local < per_node_; ++local) ends.push_back({ranks_.wait_status(n.base + local), ""});
    // The newest step its ranks began: the next launch resumes from the checkpoint before it.
    uint64_t interrupted = 0;
    for (const RankTimeline& v : n.supervisor->timeline().ranks())
      if (v.step != trace::kNoStep) interrupted = std::max(interrupted, v.step);
    const RestartPlan plan = n.supervisor->PlanRestart(restart_reason_, Ns(t), ends);
    if (!plan.give_up.empty()) return;
    t += plan.backoff_seconds + c_.relaunch_seconds;
    SupervisedLaunch launch;
    launch.world = per_node_;
    launch.rank_base = n.base;
    launch.restart = 1;
    launch.now_ns = Ns(t);
    launch.plan = plan_;
    launch.plan->round = 1;
    launch.plan->group_rank = n.group;
    launch.plan->rank_base = static_cast<uint32_t>(n.base);
    n.supervisor->Launched(launch);
    // Every rank loads the newest checkpoint before the interrupted step and steps on from it.
    const uint64_t every = static_cast<uint64_t>(std::max(1, c_.checkpoint_every));
    const uint64_t checkpoint = interrupted / every * every;
    t += c_.load_seconds;
    for (int local = 0; local < per_node_; ++local) {
      trace::Event start;
      start.type = trace::EventType::kProcessStart;
      start.time_ns = Ns(t);
      start.step = checkpoint;
      start.duration_ns = Ns(c_.load_seconds);
      n.supervisor->Observe(local, start);
      trace::Event begin;
      begin.type = trace::EventType::kStepBegin;
      begin.time_ns = Ns(t + 0.001);
      begin.step = checkpoint + 1;
      n.supervisor->Observe(local, begin);
    }
    PollInput in;
    in.now_ns = Ns(t + 0.002);
    in.unix_ms = UnixMs(n, t + 0.002);
    RendezvousNews quiet;
    in.news = &quiet;
    const PollDecision settled = n.supervisor->Poll(in);
    out->restart_cost = settled.restart_cost;
    const TimeLedger& ledger = n.supervisor->ledger();
    out->ettr = ledger.ettr(in.now_ns);
    out->wall_seconds = ledger.wall_seconds(in.now_ns);
  }

 private:
  int64_t UnixMs(const NodeAgent& n, double t) const {
    return kEpochMs + static_cast<int64_t>(std::floor(t * 1000 + n.skew_ms));
  }
  bool LeaseAlive(int group, double t) const {
    const NodeAgent& n = nodes_[group];
    return t < n.last_renewal + c_.agent.rendezvous.lease_seconds;
  }

  // Rendezvous::Watch, one iteration at `t`.
  void Watch(NodeAgent& n, double t) {
    if (t - n.last_renewal >= c_.agent.rendezvous.lease_seconds / 3) n.last_renewal = t;
    bool progress_tick = false;
    if (t - n.last_progress >= c_.progress_seconds) {
      progress_tick = true;
      n.last_progress = t;
      if (!n.progress_out.empty() && leader_ >= 0) {  // straight to the leader (agent/summary_stream.h)
        uint64_t base = 0;  // as Rendezvous::Watch: one that follows a summary another leader had is not whole
        const uint64_t number = SummaryNumber(n.progress_out, &base);
        n.acked = base == 0 || n.acked_by == leader_ ? number : 0;
        n.acked_by = leader_;
        summary_bytes_ += n.progress_out.size();
        std::vector<std::string>& pending = progress_[n.group];
        if (pending.size() >= kMaxPendingSummaries) pending.erase(pending.begin());
        pending.push_back(std::move(n.progress_out));
        summary_at_[n.group] = t;
      }
      n.progress_out.clear();
    }
    const bool leader = n.leader;
    // The read: round, leader, nodes present (keys of live leases), and the summaries for the leader.
    const bool leader_present = leader_ >= 0 && LeaseAlive(leader_, t);
    const bool i_am_leader = leader_present && leader_ == n.group;
    if (!leader_present) {
      if (n.leader_missing_since < 0) n.leader_missing_since = t;
      if (n.group == 0 || n.leader_seen || t - n.leader_missing_since >= c_.agent.rendezvous.lease_seconds) leader_ = n.group;
    } else {
      n.leader_missing_since = -1;
      n.leader_seen = true;
    }
    if (restart_at_ <= t) n.news_moved = true;
    if (i_am_leader && !n.leader) n.leading_since = t;
    n.leader = i_am_leader;
    n.news_leader = i_am_leader;
    if (leader && progress_tick) {  // appended to what the agent has not taken (none: it polls often)
      for (int g = 0; g < c_.nodes; ++g) {
        for (std::string& frame : progress_[g]) n.news_progress.push_back({"summary of node " + nodes_[g].id, std::move(frame)});
        progress_[g].clear();
      }
    }
    // Lost nodes are the leader's to find (Rendezvous::Watch): a lease gone, or, first, a node that
    // sent no summary for twice the summaries' interval and does not answer a probe within 0.5 s
    // (FindLostByStream; a machine gone without closing its connection: the slower case).
    if (!leader) return;
    const double quiet = 2 * c_.progress_seconds;
    for (int g = 0; g < c_.nodes; ++g) {
      if (g == n.group) continue;
      const bool lease_gone = !LeaseAlive(g, t);
      bool by_stream = false;
      if (t - summary_at_[g] > quiet && t - n.leading_since > quiet + 1) {
        if (n.probing[g] < 0) n.probing[g] = t;
        by_stream = nodes_[g].gone && t - n.probing[g] >= 0.5;
      } else {
        n.probing[g] = -1;
      }
      if (!lease_gone && !by_stream) continue;
      const std::string& id = nodes_[g].id;
      if (std::count(n.reported_lost.begin(), n.reported_lost.end(), id)) continue;
      n.reported_lost.push_back(id);
      n.news_lost.push_back(id);
      if (!lease_gone) {  // as the Rendezvous says it: how, and the silence it measured
        n.news_lost_how[id] = "it sent the leader no summary for " + detail::Duration(t - summary_at_[g]) +
                              ", and its agent did not accept a connection (simulated)";
        n.news_lost_silent[id] = t - summary_at_[g];
      }
    }
  }

  // One pass of Agent::Run's loop on node `n` at `t`: the ranks' events drained into its
  // Supervisor (DrainRings), the exits reaped (Launcher::Reap), the watcher's news
  // (Rendezvous::TakeNews), then the Supervisor's poll; its decision carried out as far as the
  // drill goes: a summary handed to the watcher, anomalies raised, a restart opening the next round.
  void PollNode(NodeAgent& n, double t, DrillResult* out) {
    now_ = t;
    const uint64_t now = Ns(t);
    PollInput in;
    in.now_ns = now;
    in.unix_ms = UnixMs(n, t);
    for (int local = 0; local < per_node_; ++local) {
      if (n.reaped[local] || ranks_.exit_at(n.base + local) > t) continue;
      n.reaped[local] = true;
      in.exits.push_back({local, ranks_.wait_status(n.base + local)});
    }
    RendezvousNews news;
    news.leader = n.news_leader;
    if (n.news_moved) news.round = 1;
    news.progress = std::move(n.news_progress);
    news.progress_acked = n.acked_by == leader_ ? n.acked : 0;
    news.lost_nodes = std::move(n.news_lost);
    news.lost_how = std::move(n.news_lost_how);
    news.lost_silent_seconds = std::move(n.news_lost_silent);
    n.news_progress.clear();
    n.news_lost.clear();
    n.news_lost_how.clear();
    n.news_lost_silent.clear();
    in.news = &news;
    meter_.BeginDrain();
    for (int local = 0; local < per_node_; ++local) {
      std::deque<trace::Event>& q = ranks_.events(n.base + local);
      while (!q.empty() && q.front().time_ns <= now) {
        n.supervisor->Observe(local, q.front());
        ++node_events_;
        q.pop_front();
      }
    }
    const uint64_t reads = meter_.view_reads;
    PollDecision decision = n.supervisor->Poll(in);
    if (meter_.view_reads != reads) CountNewSamples(n.supervisor->job_progress());
    if (decision.progress) {
      n.progress_out = std::move(*decision.progress);
      summary_ranks_ += static_cast<uint64_t>(per_node_);
    }
    for (const Anomaly& e : decision.echoes) echoes_.insert(echoes_.end(), e.ranks.begin(), e.ranks.end());
    for (RaisedAnomaly& r : decision.raised) out->raised.push_back(Raised{std::move(r.anomaly), n.group, t});
    // A restart opens the next round (Agent::Restart); a round moved elsewhere is joined: either
    // way Agent::Run stops this node's ranks from here on.
    if (decision.restart && restart_at_ == kNever) {
      restart_at_ = t;
      restart_node_ = n.group;
      restart_reason_ = *decision.restart;
    }
    if (decision.restart || decision.round_moved || !decision.job_ended.empty()) {
      n.moved = true;
      n.moved_at = t;
    }
  }

  void CountNewSamples(const std::vector<RankProgress>& job) {
    if (newest_seen_.empty()) newest_seen_.assign(c_.ranks, 0);
    for (const RankProgress& p : job)
      for (const CollectiveSample& s : p.recent)
        if (s.comm == 0 && p.rank >= 0 && p.rank < c_.ranks && s.seq > newest_seen_[p.rank]) {
          newest_seen_[p.rank] = s.seq;
          ++view_samples_;
        }
  }

  void Score(DrillResult* out) const;

  // What a node's Supervisor asks, answered from the simulation: etcd's failure reports of the
  // round (leased: a lost node's go with its lease), and a host whose CPUs are never saturated.
  class SimulatedSurroundings final : public Surroundings {
   public:
    SimulatedSurroundings(JobSimulation* sim, int group) : sim_(sim), group_(group) {}
    HostCpu SampleHostCpu() override { return HostCpu{}; }
    Status ReportFailure(uint64_t /*round*/, uint64_t unix_ms) override {
      int64_t& first = sim_->failures_[group_];
      if (first < 0) first = static_cast<int64_t>(unix_ms);  // PutIfAbsent: the earliest stays
      return Status::OK();
    }
    // By the times the reports carry (the simulated etcd keeps no revisions).
    Result<bool> FailedEarlierElsewhere(uint64_t /*round*/, uint64_t unix_ms) override {
      const int64_t mine = static_cast<int64_t>(unix_ms);
      for (int g = 0; g < sim_->c_.nodes; ++g) {
        const int64_t at = sim_->failures_[g];
        if (g == group_ || at < 0 || !sim_->LeaseAlive(g, sim_->now_)) continue;
        if (at < mine || (at == mine && sim_->nodes_[g].id < sim_->nodes_[group_].id)) return true;
      }
      return false;
    }
    Result<std::vector<std::string>> NodesWithoutFailure(uint64_t /*round*/,
                                                         const std::vector<std::string>& nodes) override {
      std::vector<std::string> silent;
      for (const std::string& id : nodes) {
        const int g = GroupOf(id);
        if (g < 0 || sim_->failures_[g] < 0 || !sim_->LeaseAlive(g, sim_->now_)) silent.push_back(id);
      }
      return silent;
    }

   private:
    int GroupOf(const std::string& id) const {
      for (int g = 0; g < sim_->c_.nodes; ++g)
        if (sim_->nodes_[g].id == id) return g;
      return -1;
    }
    JobSimulation* const sim_;
    const int group_;
  };

  // The CPU of the Supervisors' polls, by part (PollMeter::Part), on this thread's clock. The
  // detectors' part runs from the start of the events' drain (Supervisor::Observe, the timeline and
  // the detectors) to the end of their Poll: one pair of clock reads (a system call each) per poll.
  struct CpuMeter final : public PollMeter {
    void BeginDrain() { entered = ThreadCpuSeconds(); }
    void Enter(Part part) override {
      if (part != Part::kDetectors) entered = ThreadCpuSeconds();
    }
    void Leave(Part part) override {
      cpu_seconds[static_cast<int>(part)] += ThreadCpuSeconds() - entered;
      if (part == Part::kJobView) ++view_reads;
    }
    double entered = 0;
    double cpu_seconds[3] = {0, 0, 0};  // detectors, summary, job view
    uint64_t view_reads = 0;
  };

  const SimConfig& c_;
  const Drill& d_;
  SimulatedRanks ranks_;
  const int per_node_;
  AgentConfig node_config_;
  RoundPlan plan_;
  std::vector<NodeAgent> nodes_;
  // etcd.
  std::vector<std::vector<std::string>> progress_;  // per node: its summaries the leader has not taken
  std::vector<double> summary_at_;     // ...and when it arrived
  std::vector<int64_t> failures_;      // per node: when its first rank failed (unix ms), -1: none
  int leader_ = -1;
  double restart_at_ = kNever;  // when a node opened the next round
  int restart_node_ = -1;       // ...which one, and why
  Anomaly restart_reason_;
  double now_ = 0;              // the simulation's clock
  // What the run cost and saw.
  CpuMeter meter_;
  uint64_t node_events_ = 0, summary_ranks_ = 0, view_samples_ = 0, summary_bytes_ = 0;
  std::vector<uint64_t> newest_seen_;
  std::vector<int> echoes_;
};

void JobSimulation::Score(DrillResult* out) const {
  std::vector<std::set<int>> culprits(d_.faults.size());
  std::set<int> all;
  for (size_t i = 0; i < d_.faults.size(); ++i) {
    const Fault& f = d_.faults[i];
    FaultOutcome o;
    o.expected_kind = ExpectedKind(f.kind);
    if (f.kind == FaultKind::kNodeLoss) {
      o.culprits = plan_.RanksOf(f.rank / per_node_);
    } else {
      o.culprits = {f.rank};
    }
    o.onset_seconds = ranks_.onset(i);
    // A fault that begins after its node's agent left the round (it saw the restart for another
    // fault, or made it) falls on ranks the agent is already stopping (Agent::Run's StopAll: SIGTERM
    // within its poll): in a real job it would not happen, and no agent could name it. The simulated
    // ranks are not stopped, so the fault is still injected; it is set apart, not scored.
    const int node = f.rank / per_node_;
    o.preempted = node >= 0 && node < c_.nodes && nodes_[node].moved_at < o.onset_seconds;
    culprits[i].insert(o.culprits.begin(), o.culprits.end());
    all.insert(o.culprits.begin(), o.culprits.end());
    out->faults.push_back(o);
  }
  std::vector<std::set<int>> covered(d_.faults.size());
  std::string extra;
  for (const Raised& r : out->raised) {
    const Anomaly& a = r.anomaly;
    bool stray = false;
    for (int rank : a.ranks) stray = stray || !all.count(rank);
    bool kind_fits = false;
    for (size_t i = 0; i < d_.faults.size(); ++i) {
      if (a.kind != out->faults[i].expected_kind) continue;
      bool inside = !a.ranks.empty();
      for (int rank : a.ranks) inside = inside && culprits[i].count(rank);
      if (!inside) continue;
      kind_fits = true;
      covered[i].insert(a.ranks.begin(), a.ranks.end());
      if (!out->faults[i].named && covered[i].size() == culprits[i].size()) {
        out->faults[i].named = true;
        out->faults[i].latency_seconds = r.seconds - out->faults[i].onset_seconds;
      }
    }
    // A hang or straggler verdict naming several faulty ranks of the same kind at once.
    if (!kind_fits && !stray && !a.ranks.empty()) {
      std::set<int> same_kind;
      for (size_t i = 0; i < d_.faults.size(); ++i)
        if (a.kind == out->faults[i].expected_kind) same_kind.insert(culprits[i].begin(), culprits[i].end());
      bool inside = true;
      for (int rank : a.ranks) inside = inside && same_kind.count(rank);
      if (inside) {
        kind_fits = true;
        for (size_t i = 0; i < d_.faults.size(); ++i) {
          if (a.kind != out->faults[i].expected_kind) continue;
          for (int rank : a.ranks)
            if (culprits[i].count(rank)) covered[i].insert(rank);
          if (!out->faults[i].named && covered[i].size() == culprits[i].size()) {
            out->faults[i].named = true;
            out->faults[i].latency_seconds = r.seconds - out->faults[i].onset_seconds;
          }
        }
      }
    }
    if (d_.faults.empty()) {
      ++out->false_alarms;
    } else if (a.ranks.empty()) {
      ++out->unattributed;
    } else if (stray) {
      ++out->false_alarms;
    } else if (!kind_fits) {
      ++out->wrong_kind;
    } else {
      continue;
    }
    std::string message = a.message;
    if (message.size() > 160) message = message.substr(0, 157) + "...";
    extra += "; also " + a.kind + " naming " + RankText(a.ranks) + " (node " + std::to_string(r.node) + ", at " +
             std::to_string(r.seconds - (out->faults.empty() ? 0 : out->faults[0].onset_seconds)).substr(0, 5) +
             " s: " + message + ")";
  }
  bool all_named = true;
  std::string what;
  for (size_t i = 0; i < d_.faults.size(); ++i) {
    const Fault& f = d_.faults[i];
    const FaultOutcome& o = out->faults[i];
    all_named = all_named && (o.named || o.preempted);
    char buf[200];
    std::string kind = FaultName(f.kind);
    if (f.kind == FaultKind::kStraggler || f.kind == FaultKind::kSlowLink) {
      char x[16];
      std::snprintf(x, sizeof(x), " x%.2f", f.factor);
      kind += x;
    }
    if (o.named) {
      std::snprintf(buf, sizeof(buf), "%s of %s at step %d named %s after %.2f s", kind.c_str(),
                    RankText(o.culprits).c_str(), f.step, o.expected_kind.c_str(), o.latency_seconds);
    } else if (o.preempted) {
      std::snprintf(buf, sizeof(buf), "%s of %s at step %d came after its agent left the round (not scored)",
                    kind.c_str(), RankText(o.culprits).c_str(), f.step);
    } else {
      std::snprintf(buf, sizeof(buf), "%s of %s at step %d NOT named %s", kind.c_str(),
                    RankText(o.culprits).c_str(), f.step, o.expected_kind.c_str());
    }
    what += (what.empty() ? "" : "; ") + std::string(buf);
  }
  if (d_.faults.empty()) what = "clean run";
  if (!out->echoes.empty()) what += "; held as an echo: " + RankText(out->echoes);
  out->verdict = what + extra;
  out->correct = !d_.faults.empty() && all_named && out->false_alarms == 0 && out->wrong_kind == 0 &&
                 out->unattributed == 0;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
  return v[std::min(k, v.size() - 1)];
}

nlohmann::json Latency(const std::vector<double>& v) {
  if (v.empty()) return nullptr;
  auto r3 = [](double x) { return std::round(x * 1000) / 1000; };
  return {{"count", v.size()},
          {"p50", r3(Percentile(v, 0.50))},
          {"p90", r3(Percentile(v, 0.90))},
          {"p99", r3(Percentile(v, 0.99))},
          {"max", r3(Percentile(v, 1.0))}};
}

Fault RandomFault(FaultKind kind, int rank, int step, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0, 1);
  Fault f;
  f.kind = kind;
  f.rank = rank;
  f.step = step;
  f.at_fraction = 0.1 + 0.8 * u(rng);
  if (kind == FaultKind::kStraggler) f.factor = 1.5 + 1.5 * u(rng);
  if (kind == FaultKind::kSlowLink) f.factor = 2.5 + 2.5 * u(rng);
  if (kind == FaultKind::kCrash) {
    // As waitpid reports them: SIGKILL (the OOM killer), SIGSEGV with a core, exit 1 (a Python
    // exception), SIGABRT (a failed assertion, NCCL's abort).
    const int statuses[] = {SIGKILL, SIGSEGV | 0x80, 1 << 8, SIGABRT};
    f.wait_status = statuses[rng() % 4];
  }
  return f;
}

}  // namespace

const char* FaultName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kHang: return "hang";
    case FaultKind::kCrash: return "crash";
    case FaultKind::kNodeLoss: return "node_loss";
    case FaultKind::kStraggler: return "straggler";
    case FaultKind::kSlowLink: return "slow_link";
  }
  return "?";
}

const char* ExpectedKind(FaultKind kind) {
  switch (kind) {
    case FaultKind::kHang: return "hang";
    case FaultKind::kCrash: return "dead";
    case FaultKind::kNodeLoss: return "node_lost";
    case FaultKind::kStraggler: return "straggler";
    case FaultKind::kSlowLink: return "slow_collective";
  }
  return "?";
}

DrillResult RunDrill(const SimConfig& config, const Drill& drill) {
  JobSimulation sim(config, drill);
  return sim.Run();
}

std::vector<Drill> MakeDrills(const SimConfig& config, int count, int clean, uint64_t seed) {
  std::mt19937_64 rng(SplitMix(seed));
  const int per_node = config.ranks / config.nodes;
  // Two ranks on different nodes.
  auto two_ranks = [&](int* a, int* b) {
    *a = static_cast<int>(rng() % config.ranks);
    do *b = static_cast<int>(rng() % config.ranks);
    while (config.nodes > 1 && *b / per_node == *a / per_node);
  };
  // A fault that stops the job comes 25 steps after one that slows it, so both can be judged.
  constexpr int kLater = 25;
  constexpr int kAfter = 60;  // steps run after a fault that only slows the job
  std::vector<Drill> out;
  for (int i = 0; i < count; ++i) {
    Drill d;
    d.seed = SplitMix(seed + 1000003ull * static_cast<uint64_t>(i + 1));
    // The slow-collective baseline is the first 50 collectives: faults come after it.
    const int step = 60 + static_cast<int>(rng() % 20);
    const int pick = static_cast<int>(rng() % 6);
    int a, b;
    two_ranks(&a, &b);
    if (pick < 5) {
      const FaultKind kind = static_cast<FaultKind>(pick);
      d.name = FaultName(kind);
      d.faults.push_back(RandomFault(kind, a, step, rng));
      const bool stops = kind == FaultKind::kHang || kind == FaultKind::kCrash || kind == FaultKind::kNodeLoss;
      d.steps = stops ? step + 1 : step + kAfter;
    } else {
      using K = FaultKind;
      static const std::pair<K, K> kPairs[] = {{K::kHang, K::kHang},           {K::kCrash, K::kCrash},
                                               {K::kStraggler, K::kStraggler}, {K::kStraggler, K::kSlowLink},
                                               {K::kStraggler, K::kHang},      {K::kSlowLink, K::kCrash},
                                               {K::kStraggler, K::kNodeLoss}};
      const auto [first, second] = kPairs[rng() % (sizeof(kPairs) / sizeof(kPairs[0]))];
      const bool slows_then_stops = (first == K::kStraggler || first == K::kSlowLink) &&
                                    (second == K::kHang || second == K::kCrash || second == K::kNodeLoss);
      d.name = std::string(FaultName(first)) + "+" + FaultName(second);
      d.faults.push_back(RandomFault(first, a, step, rng));
      d.faults.push_back(RandomFault(second, b, slows_then_stops ? step + kLater : step, rng));
      const bool stops = second == K::kHang || second == K::kCrash || second == K::kNodeLoss;
      d.steps = stops ? d.faults.back().step + 1 : step + kAfter;
    }
    out.push_back(std::move(d));
  }
  for (int i = 0; i < clean; ++i) {
    Drill d;
    d.name = "clean";
    d.seed = SplitMix(seed + 7777777ull * static_cast<uint64_t>(i + 1));
    d.steps = 60 + static_cast<int>(rng() % 20) + kAfter;
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

// The drills' ETTR, the mean restart's cost by phase, and the ETTR a job failing once per MTBF
// keeps at that cost: 1 - mean cost / MTBF (the restarts' cost only; start-up and checkpoints
// are the job's own).
nlohmann::json TimeLostReport(const SimConfig& config, double wall, double productive,
                              const std::map<std::string, double>& lost_by_phase,
                              const std::vector<double>& lost_per_restart) {
  const size_t n = lost_per_restart.size();
  nlohmann::json phases = nlohmann::json::object();
  double mean = 0;
  for (const char* phase : kLostPhases) {
    const double total = lost_by_phase.count(phase) ? lost_by_phase.at(phase) : 0.0;
    phases[phase] = n ? std::round(total / n * 1000) / 1000 : 0.0;
    mean += n ? total / n : 0.0;
  }
  return {{"drills_ettr", wall > 0 ? std::round(productive / wall * 10000) / 10000 : 1.0},
          {"restarts", n},
          {"mean_seconds_per_restart", std::round(mean * 1000) / 1000},
          {"mean_seconds_by_phase", phases},
          {"seconds_per_restart", Latency(lost_per_restart)},
          {"mtbf_seconds", config.mtbf_seconds},
          {"ettr_at_mtbf", config.mtbf_seconds > 0 ? std::round((1 - mean / config.mtbf_seconds) * 10000) / 10000 : 1.0},
          {"assumed",
           {{"stop_seconds", config.stop_seconds},
            {"relaunch_seconds", config.relaunch_seconds},
            {"load_seconds", config.load_seconds},
            {"checkpoint_every_steps", config.checkpoint_every}}}};
}

}  // namespace

nlohmann::json Report(const SimConfig& config, const std::vector<DrillResult>& results, uint64_t seed,
                      double wall_seconds) {
  int drills = 0, correct = 0, clean = 0, false_alarms = 0, wrong_kind = 0, unattributed = 0, preempted = 0;
  std::vector<double> latency;
  std::map<std::string, std::vector<double>> latency_by_fault;
  struct Tally {
    int drills = 0, correct = 0;
  };
  std::map<std::string, Tally> by_drill;
  nlohmann::json misses = nlohmann::json::array();
  uint64_t node_events = 0, summary_ranks = 0, view_reads = 0, view_samples = 0, summary_bytes = 0;
  double node_cpu = 0, summary_cpu = 0, view_cpu = 0, simulated = 0;
  // The time-lost account: the drills' ETTR (wall and productive time summed over them), and
  // each restart's cost by phase.
  double ettr_wall = 0, ettr_productive = 0;
  std::map<std::string, double> lost_by_phase;
  std::vector<double> lost_per_restart;
  for (size_t i = 0; i < results.size(); ++i) {
    const DrillResult& r = results[i];
    ettr_wall += r.wall_seconds;
    ettr_productive += r.ettr * r.wall_seconds;
    if (r.restart_cost) {
      const RestartCost& c = *r.restart_cost;
      const double phases[] = {c.detection_seconds, c.stop_seconds, c.backoff_seconds,
                               c.relaunch_seconds,  c.load_seconds, c.redo_seconds};
      for (size_t k = 0; k < std::size(kLostPhases); ++k) lost_by_phase[kLostPhases[k]] += phases[k];
      lost_per_restart.push_back(c.total_seconds());
    }
    node_events += r.node_events;
    node_cpu += r.node_cpu_seconds;
    summary_ranks += r.summary_ranks;
    summary_cpu += r.summary_cpu_seconds;
    view_reads += r.view_reads;
    view_samples += r.view_samples;
    view_cpu += r.view_cpu_seconds;
    summary_bytes += r.summary_bytes;
    simulated += r.simulated_seconds;
    false_alarms += r.false_alarms;
    wrong_kind += r.wrong_kind;
    unattributed += r.unattributed;
    if (r.drill.faults.empty()) {
      ++clean;
    } else {
      ++drills;
      const std::string group = r.drill.faults.size() > 1 ? "two_at_once" : r.drill.name;
      ++by_drill[group].drills;
      if (r.correct) {
        ++correct;
        ++by_drill[group].correct;
      }
      for (size_t k = 0; k < r.faults.size(); ++k) {
        if (r.faults[k].preempted && !r.faults[k].named) ++preempted;
        if (!r.faults[k].named) continue;
        latency.push_back(r.faults[k].latency_seconds);
        latency_by_fault[FaultName(r.drill.faults[k].kind)].push_back(r.faults[k].latency_seconds);
      }
    }
    if (!r.correct && !(r.drill.faults.empty() && r.false_alarms == 0) && misses.size() < 50)
      misses.push_back({{"drill", i}, {"name", r.drill.name}, {"seed", r.drill.seed}, {"what", r.verdict}});
  }
  nlohmann::json by_kind = nlohmann::json::object();
  for (const char* name : {"hang", "crash", "node_loss", "straggler", "slow_link", "two_at_once"}) {
    const Tally t = by_drill.count(name) ? by_drill.at(name) : Tally{};
    nlohmann::json k = {{"drills", t.drills},
                        {"correct", t.correct},
                        {"accuracy", t.drills ? nlohmann::json(static_cast<double>(t.correct) / t.drills) : nlohmann::json(nullptr)}};
    if (std::string(name) != "two_at_once")
      k["latency_seconds"] = Latency(latency_by_fault.count(name) ? latency_by_fault.at(name) : std::vector<double>{});
    by_kind[name] = k;
  }
  const double hang_goal = config.agent.hang.floor_seconds + 2;
  const double hang_max = latency_by_fault.count("hang") ? Percentile(latency_by_fault.at("hang"), 1.0) : 0;
  const double accuracy = drills ? static_cast<double>(correct) / drills : 0;
  const AgentConfig& a = config.agent;
  auto per_event = [](double cpu, uint64_t n) { return n ? std::round(cpu / n * 1e9 * 10) / 10 : 0.0; };
  nlohmann::json out = {
      {"seed", seed},
      {"ranks", config.ranks},
      {"nodes", config.nodes},
      {"drills", drills},
      {"clean_runs", clean},
      {"accuracy", accuracy},
      {"correct", correct},
      {"false_alarms", false_alarms},
      {"wrong_kind", wrong_kind},
      {"unattributed", unattributed},
      // Faults that began after their node's agent had left the round for another fault's restart
      // (its ranks being stopped): not scored (FaultOutcome::preempted).
      {"preempted_faults", preempted},
      {"latency_seconds", Latency(latency)},
      {"by_kind", by_kind},
      {"goals",
       {{"accuracy_at_least", 0.99},
        {"accuracy_met", accuracy >= 0.99},
        {"false_alarms_zero_met", false_alarms == 0},
        {"hang_latency_at_most_seconds", hang_goal},
        {"hang_latency_met", hang_max <= hang_goal}}},
      {"cpu",
       {{"node_detectors",
         {{"events", node_events}, {"cpu_seconds", node_cpu}, {"ns_per_event", per_event(node_cpu, node_events)}}},
        {"summaries",
         {{"rank_summaries", summary_ranks},
          {"cpu_seconds", summary_cpu},
          {"ns_per_rank_summary", per_event(summary_cpu, summary_ranks)}}},
        {"job_view",
         {{"reads", view_reads},
          {"new_collective_samples", view_samples},
          {"replayed_events", view_samples * 3},
          {"cpu_seconds", view_cpu},
          {"ms_per_read", view_reads ? std::round(view_cpu / view_reads * 1e3 * 100) / 100 : 0.0},
          {"ns_per_replayed_event", per_event(view_cpu, view_samples * 3)}}},
        // What one leader takes per second of the job: its view's CPU, and the summaries' bytes
        // coming in (as encoded; zstd on the wire makes them smaller).
        {"leader",
         {{"cpu_seconds_per_second", simulated > 0 ? std::round(view_cpu / simulated * 1e4) / 1e4 : 0.0},
          {"summary_bytes_per_second", simulated > 0 ? std::round(static_cast<double>(summary_bytes) / simulated) : 0.0},
          {"summary_bytes_per_rank_second",
           simulated > 0 ? std::round(static_cast<double>(summary_bytes) / simulated / config.ranks * 10) / 10 : 0.0}}}}},
      {"time_lost", TimeLostReport(config, ettr_wall, ettr_productive, lost_by_phase, lost_per_restart)},
      {"simulated_seconds", std::round(simulated * 10) / 10},
      {"wall_seconds", std::round(wall_seconds * 10) / 10},
      {"misses", misses},
      {"config",
       {{"hang", {{"floor_seconds", a.hang.floor_seconds}, {"cap_seconds", a.hang.cap_seconds},
                  {"multiplier", a.hang.multiplier}, {"window", a.hang.window}}},
        {"straggler", {{"window", a.straggler.window}, {"min_lateness_seconds", a.straggler.min_lateness_seconds},
                       {"mad_threshold", a.straggler.mad_threshold}, {"min_fraction", a.straggler.min_fraction},
                       {"cooldown_seconds", a.straggler.cooldown_seconds}}},
        {"slow_collective", {{"baseline_window", a.slow_collective.baseline_window},
                             {"recent_window", a.slow_collective.recent_window}, {"factor", a.slow_collective.factor},
                             {"min_excess_seconds", a.slow_collective.min_excess_seconds},
                             {"cooldown_seconds", a.slow_collective.cooldown_seconds}}},
        {"rendezvous", {{"lease_seconds", a.rendezvous.lease_seconds},
                        {"failure_grace_seconds", a.rendezvous.failure_grace_seconds},
                        {"watch_seconds", config.watch_seconds}, {"progress_seconds", config.progress_seconds},
                        {"publish_seconds", config.publish_seconds}}},
        {"poll_seconds", config.poll_seconds},
        {"workload",
         {{"compute_seconds", config.compute_seconds}, {"compute_sigma", config.compute_sigma},
          {"spike_probability", config.spike_probability},
          {"spike_seconds", {config.spike_min_seconds, config.spike_max_seconds}},
          {"op_seconds", config.op_seconds}, {"op_sigma", config.op_sigma},
          {"congestion_probability", config.congestion_probability}, {"post_seconds", config.post_seconds},
          {"ring_spread_seconds", config.ring_spread_seconds}, {"update_seconds", config.update_seconds},
          {"clock_skew_ms", config.clock_skew_ms}, {"straggler_factor", {1.5, 3.0}},
          {"slow_link_factor", {2.5, 5.0}}, {"give_up_seconds", config.give_up_seconds}}}}}};
  return out;
}

}  // namespace lifeline::agent::sim
