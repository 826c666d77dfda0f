#include "agent/sim/sim.h"

#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "agent/detectors/evidence.h"
#include "agent/detectors/job_digest_detector.h"
#include "agent/detectors/replica_digest_detector.h"
#include "agent/detectors/training_signal_detector.h"
#include "agent/progress.h"
#include "agent/rendezvous.h"
#include "agent/summary_stream.h"
#include "agent/supervisor.h"
#include "agent/timeline.h"
#include "lifeline/trace.h"

namespace lifeline::agent::sim {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
// ReplicaDigestDetector's hold as MakeDetectors builds it (its default): how long a node's
// comparison waits for the replicas that report elsewhere.
constexpr double kDigestHoldSeconds = 30;
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

// A standard normal drawn from a hash of its coordinates: the signals' values, the same whoever
// asks (the simulated ranks, the cost measure) and never drawn from the ranks' own generator, so a
// drill without signals runs as before.
double HashNormal(uint64_t seed, uint64_t a, uint64_t b) {
  const uint64_t x = SplitMix(SplitMix(seed ^ (a * 0x9e3779b97f4a7c15ull)) ^ b);
  const double u1 = (static_cast<double>(x >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = (static_cast<double>(SplitMix(x) >> 11) + 0.5) * 0x1.0p-53;
  return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// The signals of a SignalModel job, fault-free.
struct SignalValues {
  const SignalModel& m;
  int ranks;
  uint64_t seed;
  int dp() const { return ranks / (m.tp * m.pp); }
  int Tp(int rank) const { return rank % m.tp; }
  int Pp(int rank) const { return rank / (m.tp * dp()); }
  // A rank's loss at `step`: its own batch's, around a level decaying by 40% over the first steps.
  double Loss(int rank, uint64_t step) const {
    const double level = m.loss * (0.6 + 0.4 * std::exp(-static_cast<double>(step) / 300));
    return level * (1 + m.loss_noise * HashNormal(seed, 2 + static_cast<uint64_t>(rank), step));
  }
  // The global gradient norm after its all-reduce: one value per step for the whole job.
  double GradNorm(uint64_t step) const { return m.grad_norm * std::exp(m.grad_norm_sigma * HashNormal(seed, 1, step)); }
  bool Snapshot(uint64_t step) const { return step > 0 && step % static_cast<uint64_t>(m.snapshot_every) == 0; }
  // Shard `j` of the (tp, pp) piece of the model a rank holds: the same key on its DP replicas.
  static uint64_t Key(int tp, int pp, int j) {
    return SplitMix(0x5a4d5ull ^ (static_cast<uint64_t>(tp) << 40) ^ (static_cast<uint64_t>(pp) << 20) ^
                    static_cast<uint64_t>(j));
  }
  static uint64_t Digest(uint64_t key, uint64_t step) { return SplitMix(key ^ (step * 0xd1b54a32d192ed03ull)); }
  // The digest event of shard `j` of `rank`'s snapshot of `step`.
  trace::Event DigestEvent(int rank, uint64_t step, int j, double t) const {
    trace::Event e;
    e.type = trace::EventType::kReplicaDigest;
    e.time_ns = Ns(t);
    e.step = step;
    e.seq = Key(Tp(rank), Pp(rank), j);
    e.comm = static_cast<uint32_t>(dp());
    e.bytes = 88'000'000;  // not judged; about a shard of 405 B bf16 parameters over TP 8 x PP 16 in 72
    e.duration_ns = trace::kNoOffset;
    e.aux = Digest(e.seq, step);
    return e;
  }
  static trace::Event ScalarEvent(uint32_t id, uint64_t step, double value, double t) {
    trace::Event e;
    e.type = trace::EventType::kScalar;
    e.time_ns = Ns(t);
    e.step = step;
    e.comm = id;
    std::memcpy(&e.aux, &value, sizeof(value));
    return e;
  }
};

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
        onset_(d.faults.size(), kNever), values_{c.signals, c.ranks, d.seed} {
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

  void EmitEvent(int rank, const trace::Event& e, double t) {
    if (t >= lost_at_[NodeOf(rank)]) return;
    events_[rank].push_back(e);
    last_event_ = std::max(last_event_, t);
  }

  // Rank `r`'s training signals of step k, reported as its step ends, with the drill's faults.
  void EmitSignals(int r, int k, double t) {
    const uint64_t step = static_cast<uint64_t>(k);
    double loss = values_.Loss(r, step);
    double norm = values_.GradNorm(step);
    uint64_t norm_flip = 0;
    for (size_t i = 0; i < d_.faults.size(); ++i) {
      const Fault& f = d_.faults[i];
      if (f.kind == FaultKind::kNanLoss && k >= f.step) {
        // The rank's NaN reaches every rank's norm through the all-reduce, and every loss after
        // the update.
        norm = std::numeric_limits<double>::quiet_NaN();
        if (k > f.step || f.rank == r) loss = std::numeric_limits<double>::quiet_NaN();
        if (k == f.step && f.rank == r) onset_[i] = std::min(onset_[i], t);
      } else if (f.kind == FaultKind::kLossSpike && f.rank == r && k >= f.step && k < f.step + f.spike_steps) {
        loss *= f.factor;
        if (k == f.step) onset_[i] = std::min(onset_[i], t);
      } else if (f.kind == FaultKind::kNormDiffers && f.rank == r && k == f.step) {
        norm_flip = 1;
        onset_[i] = std::min(onset_[i], t);
      }
    }
    trace::Event l = SignalValues::ScalarEvent(trace::kLossScalar, step, loss, t);
    trace::Event g = SignalValues::ScalarEvent(trace::kGradNormScalar, step, norm, t);
    g.aux ^= norm_flip;
    EmitEvent(r, l, t);
    EmitEvent(r, g, t);
  }

  // Rank `r`'s digests of the snapshot of step `s`, reported at `t` (its copy done, before the
  // next optimizer update), with the drill's faults.
  void EmitDigests(int r, int s, double t) {
    const uint64_t step = static_cast<uint64_t>(s);
    for (int j = 0; j < c_.signals.shards_per_rank; ++j) {
      trace::Event e = values_.DigestEvent(r, step, j, t);
      for (size_t i = 0; i < d_.faults.size(); ++i) {
        const Fault& f = d_.faults[i];
        if (f.kind != FaultKind::kDigestDiffers || f.rank != r || s < f.step || onset_[i] != kNever) continue;
        if (j != f.step % c_.signals.shards_per_rank) continue;
        e.aux ^= 0x0000100000000000ull;  // any flipped bit of the copy changes its digest
        onset_[i] = t;
      }
      EmitEvent(r, e, t);
    }
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
      if (c_.signals.enabled && k > 0 && values_.Snapshot(static_cast<uint64_t>(k - 1))) EmitDigests(r, k - 1, end);
      const double step_end = end + c_.update_seconds * std::exp(0.1 * Normal());
      Emit(r, trace::EventType::kStepEnd, step_end);
      if (c_.signals.enabled) EmitSignals(r, k, step_end);
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
  const SignalValues values_;
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
      if (ranks_.done() && ranks_.blocked_at() == kNever &&
          now > ranks_.last_event() + std::max(3 * c_.progress_seconds, d_.tail_seconds))
        break;
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
    news.digest_queries = digest_queries_;  // the round's questions, as etcd holds them
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
    // The leader's questions go into etcd (Rendezvous::AskDigests), seen by every node from its next poll.
    digest_queries_.insert(digest_queries_.end(), decision.digest_queries.begin(), decision.digest_queries.end());
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
  std::vector<DigestQuery> digest_queries_;  // the leader's, in the simulated etcd (rounds/R/digest_queries/)
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
  const bool nan_drill = std::any_of(d_.faults.begin(), d_.faults.end(),
                                     [](const Fault& f) { return f.kind == FaultKind::kNanLoss; });
  for (const Raised& r : out->raised) {
    const Anomaly& a = r.anomaly;
    if (nan_drill && a.kind == "non_finite" && a.evidence.is_object() && a.evidence.contains("rank_own_value") &&
        a.evidence["rank_own_value"] == false) {
      ++out->spread_anomalies;  // the NaN's spread, said as such: not a culprit named
      continue;
    }
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
  if (kind == FaultKind::kLossSpike) f.factor = 1.6 + 2.4 * u(rng);  // named at 3 in a row, or at once
  if (kind == FaultKind::kCrash) {
    // As waitpid reports them: SIGKILL (the OOM killer), SIGSEGV with a core, exit 1 (a Python
    // exception), SIGABRT (a failed assertion, NCCL's abort).
    const int statuses[] = {SIGKILL, SIGSEGV | 0x80, 1 << 8, SIGABRT};
    f.wait_status = statuses[rng() % 4];
  }
  return f;
}

// The signal faults' drills: one fault each on a random rank, after the spike detector's warm-up
// (50 values); the job runs on past the next snapshot, and the agents are polled until a node's
// digest comparison waiting for replicas elsewhere has judged (its hold).
std::vector<Drill> MakeSignalDrills(const SimConfig& config, int count, int clean, uint64_t seed,
                                    std::mt19937_64& rng) {
  const int every = std::max(1, config.signals.snapshot_every);
  const double tail = kDigestHoldSeconds + 2;
  std::vector<Drill> out;
  for (int i = 0; i < count; ++i) {
    Drill d;
    d.seed = SplitMix(seed + 1000003ull * static_cast<uint64_t>(i + 1));
    const int step = 60 + static_cast<int>(rng() % 20);
    const FaultKind kind =
        static_cast<FaultKind>(static_cast<int>(FaultKind::kNormDiffers) + static_cast<int>(rng() % 4));
    const int rank = static_cast<int>(rng() % config.ranks);
    d.name = FaultName(kind);
    d.faults.push_back(RandomFault(kind, rank, step, rng));
    d.steps = step + every + 10;
    if (kind == FaultKind::kDigestDiffers) d.tail_seconds = tail;
    out.push_back(std::move(d));
  }
  for (int i = 0; i < clean; ++i) {
    Drill d;
    d.name = "clean";
    d.seed = SplitMix(seed + 7777777ull * static_cast<uint64_t>(i + 1));
    d.steps = 60 + static_cast<int>(rng() % 20) + every + 10;
    d.tail_seconds = tail;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

const char* FaultName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kHang: return "hang";
    case FaultKind::kCrash: return "crash";
    case FaultKind::kNodeLoss: return "node_loss";
    case FaultKind::kStraggler: return "straggler";
    case FaultKind::kSlowLink: return "slow_link";
    case FaultKind::kNormDiffers: return "norm_differs";
    case FaultKind::kDigestDiffers: return "digest_differs";
    case FaultKind::kNanLoss: return "nan_loss";
    case FaultKind::kLossSpike: return "loss_spike";
  }
  return "?";
}

bool IsSignalFault(FaultKind kind) {
  return kind == FaultKind::kNormDiffers || kind == FaultKind::kDigestDiffers || kind == FaultKind::kNanLoss ||
         kind == FaultKind::kLossSpike;
}

const char* ExpectedKind(FaultKind kind) {
  switch (kind) {
    case FaultKind::kHang: return "hang";
    case FaultKind::kCrash: return "dead";
    case FaultKind::kNodeLoss: return "node_lost";
    case FaultKind::kStraggler: return "straggler";
    case FaultKind::kSlowLink: return "slow_collective";
    case FaultKind::kNormDiffers: return "disagreement";
    case FaultKind::kDigestDiffers: return "sdc_suspect";
    case FaultKind::kNanLoss: return "non_finite";
    case FaultKind::kLossSpike: return "spike";
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
  if (config.signals.enabled) return MakeSignalDrills(config, count, clean, seed, rng);
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
  int spread = 0;
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
    spread += r.spread_anomalies;
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
  std::vector<const char*> kinds = {"hang", "crash", "node_loss", "straggler", "slow_link", "two_at_once"};
  if (config.signals.enabled) kinds = {"norm_differs", "digest_differs", "nan_loss", "loss_spike"};
  for (const char* name : kinds) {
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
      {"spread_anomalies", spread},
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
  if (config.signals.enabled) {
    const SignalModel& m = config.signals;
    const TrainingSignalConfig& ts = a.training_signals;
    out["config"]["signals"] = {
        {"layout", {{"tp", m.tp}, {"pp", m.pp}, {"dp", config.ranks / (m.tp * m.pp)}, {"order", "tp, dp, pp (Megatron-LM)"}}},
        {"ranks_per_node", config.ranks / config.nodes},
        {"shards_per_rank", m.shards_per_rank},
        {"snapshot_every_steps", m.snapshot_every},
        {"loss", m.loss}, {"loss_noise", m.loss_noise},
        {"grad_norm", m.grad_norm}, {"grad_norm_sigma", m.grad_norm_sigma},
        {"loss_spike_factor", {1.6, 4.0}},
        {"training_signals", {{"replicated", ts.replicated}, {"replica_group_size", ts.replica_group_size},
                              {"hold_seconds", ts.hold_seconds}, {"warmup_steps", ts.warmup_steps},
                              {"spike_threshold", ts.spike_threshold}, {"spike_confirm", ts.spike_confirm}}},
        {"digest_hold_seconds", kDigestHoldSeconds}};
  }
  return out;
}

namespace {

// One pair of this thread's CPU clock reads (system calls), taken off every timed batch below:
// the median of many, since a batch of one node's few events costs about as much.
double ClockPairSeconds() {
  std::vector<double> pairs(2001);
  for (double& p : pairs) {
    const double a = ThreadCpuSeconds();
    p = ThreadCpuSeconds() - a;
  }
  std::nth_element(pairs.begin(), pairs.begin() + 1000, pairs.end());
  return pairs[1000];
}

// The heap in use, every arena (glibc).
size_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

}  // namespace

nlohmann::json MeasureCrossRankCost(const SimConfig& config, int first_rank, int view_ranks, int steps) {
  const SignalModel& m = config.signals;
  const SignalValues values{m, config.ranks, /*seed=*/1};
  const double step_seconds = config.compute_seconds + config.op_seconds + config.update_seconds;
  const int polls_per_step = std::max(1, static_cast<int>(std::lround(step_seconds / config.poll_seconds)));
  const double overhead = ClockPairSeconds();
  // The events of one step and of one snapshot, made before anything is measured.
  std::vector<trace::Event> scalars(2 * static_cast<size_t>(view_ranks));
  std::vector<trace::Event> digests(static_cast<size_t>(view_ranks) * static_cast<size_t>(m.shards_per_rank));
  std::vector<Anomaly> raised;
  raised.reserve(64);

  const size_t heap_before = HeapInUse();
  Timeline timeline;
  timeline.Reset(view_ranks, first_rank);
  TrainingSignalDetector signal_detector(config.agent.training_signals);
  ReplicaDigestDetector digest_detector;
  signal_detector.Reset(view_ranks);
  digest_detector.Reset(view_ranks);
  Detector* const both[] = {&signal_detector, &digest_detector};
  const size_t heap_base = HeapInUse();

  // As Supervisor::Observe: the timeline, then every detector (the other five ignore these events).
  auto feed = [&](const std::vector<trace::Event>& events, size_t per_rank) {
    const double t0 = ThreadCpuSeconds();
    for (size_t i = 0; i < events.size(); ++i) {
      const TimelineChange change = timeline.Apply(static_cast<int>(i / per_rank), events[i]);
      if (change.rank < 0) continue;
      for (Detector* d : both) d->Observe(timeline, change);
    }
    return std::max(0.0, ThreadCpuSeconds() - t0 - overhead);
  };
  auto poll = [&](Detector* d, uint64_t now) {
    const double t0 = ThreadCpuSeconds();
    d->Poll(timeline, now, &raised);
    return std::max(0.0, ThreadCpuSeconds() - t0 - overhead);
  };

  double signal_observe = 0, signal_poll = 0, digest_observe = 0, digest_poll = 0;
  size_t step_peak = 0, snapshot_peak = 0;
  uint64_t polls = 0, snapshots = 0;
  for (int k = 0; k < steps; ++k) {
    const uint64_t step = static_cast<uint64_t>(k);
    const double t = 1.0 + k * step_seconds;
    const double end = t + 0.95 * step_seconds;
    for (int local = 0; local < view_ranks; ++local) {
      const int r = first_rank + local;
      scalars[2 * local] = SignalValues::ScalarEvent(trace::kLossScalar, step, values.Loss(r, step), end);
      scalars[2 * local + 1] = SignalValues::ScalarEvent(trace::kGradNormScalar, step, values.GradNorm(step), end);
    }
    signal_observe += feed(scalars, 2);
    step_peak = std::max(step_peak, HeapInUse() - heap_base);
    if (k > 0 && values.Snapshot(step - 1)) {
      for (int local = 0; local < view_ranks; ++local)
        for (int j = 0; j < m.shards_per_rank; ++j)
          digests[static_cast<size_t>(local) * m.shards_per_rank + j] =
              values.DigestEvent(first_rank + local, step - 1, j, end - 0.01);
      digest_observe += feed(digests, static_cast<size_t>(m.shards_per_rank));
      snapshot_peak = std::max(snapshot_peak, HeapInUse() - heap_base);
      ++snapshots;
    }
    for (int p = 0; p < polls_per_step; ++p) {
      const uint64_t now = Ns(end + p * config.poll_seconds + 0.001);
      signal_poll += poll(&signal_detector, now);
      digest_poll += poll(&digest_detector, now);
      ++polls;
    }
  }
  const size_t heap_after = HeapInUse();
  // Replicas of a shard inside the view, and in the job.
  int replicas_in_view = 0;
  for (int local = 0; local < view_ranks; ++local)
    if (values.Tp(first_rank + local) == values.Tp(first_rank) &&
        values.Pp(first_rank + local) == values.Pp(first_rank))
      ++replicas_in_view;
  const double n = view_ranks;
  const double job_seconds = steps * step_seconds;
  auto ns = [](double seconds) { return std::round(seconds * 1e9 * 10) / 10; };
  const double per_step = (signal_observe + signal_poll) / std::max(1, steps);
  const double per_snapshot = snapshots ? (digest_observe + digest_poll) / static_cast<double>(snapshots) : 0.0;
  return {
      {"view_ranks", view_ranks},
      {"first_rank", first_rank},
      {"replicas_of_a_shard_in_view", replicas_in_view},
      {"replicas_of_a_shard_in_job", values.dp()},
      {"steps", steps},
      {"snapshots", snapshots},
      {"polls", polls},
      {"clock_pair_ns_subtracted", ns(overhead)},
      {"per_step",
       {{"cpu_ns", ns(per_step)},
        {"ns_per_rank", ns(per_step / n)},
        {"observe_ns_per_value", ns(signal_observe / (2.0 * n * std::max(1, steps)))},
        {"poll_ns", ns(signal_poll / static_cast<double>(std::max<uint64_t>(1, polls)))}}},
      {"per_snapshot",
       {{"digests", view_ranks * m.shards_per_rank},
        {"cpu_ns", ns(per_snapshot)},
        {"ns_per_rank", ns(per_snapshot / n)},
        {"ns_per_digest", ns(per_snapshot / (n * m.shards_per_rank))},
        {"observe_ns_per_digest",
         ns(snapshots ? digest_observe / (static_cast<double>(snapshots) * n * m.shards_per_rank) : 0.0)},
        {"poll_ns", ns(digest_poll / static_cast<double>(std::max<uint64_t>(1, polls)))},
        {"shards_compared", digest_detector.shards_compared()}}},
      {"cores", std::round((signal_observe + signal_poll + digest_observe + digest_poll) / job_seconds * 1e6) / 1e6},
      {"memory",
       {{"detectors_at_reset_bytes", heap_base - heap_before},
        {"step_peak_bytes", step_peak},
        {"snapshot_peak_bytes", snapshot_peak},
        {"snapshot_peak_bytes_per_rank", std::round(static_cast<double>(snapshot_peak) / n)},
        {"left_at_end_bytes", heap_after > heap_base ? heap_after - heap_base : 0}}},
      {"raised", raised.size()},
  };
}

nlohmann::json MeasureLeaderDigestCost(const SimConfig& config, int snapshots) {
  const SignalModel& m = config.signals;
  const SignalValues values{m, config.ranks, /*seed=*/1};
  const int per_node = config.ranks / config.nodes;
  const double overhead = ClockPairSeconds();
  std::vector<Anomaly> raised;
  std::vector<DigestQuery> queries;
  const size_t heap_before = HeapInUse();
  JobDigestDetector leader;
  size_t leader_peak = 0;
  double fold_cpu = 0, leader_cpu = 0;
  uint64_t node_summary_bytes = 0, folds_sent = 0;
  std::vector<std::string> summaries(static_cast<size_t>(config.nodes));
  for (int k = 0; k < snapshots; ++k) {
    const uint64_t step = static_cast<uint64_t>((k + 1) * m.snapshot_every);
    const double t = 1.0 + 10.0 * k;
    // Every node folds its ranks' digests (the node's own cost; node 0's is measured, the others'
    // are made alike), and writes its folds into a summary.
    for (int g = 0; g < config.nodes; ++g) {
      Timeline timeline;
      timeline.Reset(per_node, g * per_node);
      ReplicaDigestDetector folder;
      folder.Reset(per_node);
      folder.set_folding(true);
      const double t0 = ThreadCpuSeconds();
      for (int local = 0; local < per_node; ++local) {
        for (int j = 0; j < m.shards_per_rank; ++j) {
          const trace::Event e = values.DigestEvent(g * per_node + local, step, j, t);
          const TimelineChange change = timeline.Apply(local, e);
          if (change.rank >= 0) folder.Observe(timeline, change);
        }
      }
      const std::vector<DigestFold> folds = folder.TakeFolds(timeline, Ns(t + 2));
      if (g == 0) fold_cpu += std::max(0.0, ThreadCpuSeconds() - t0 - overhead);
      folds_sent += folds.size();
      SummaryFrame frame;
      frame.number = static_cast<uint64_t>(k + 1);
      frame.folds = folds;
      summaries[static_cast<size_t>(g)] = EncodeSummary(frame);
      if (g == 0) node_summary_bytes += summaries[0].size() - EncodeProgress({}, 0, static_cast<uint64_t>(k + 1)).size();
    }
    // The leader: every node's summary decoded, its folds taken, then one poll.
    const double t0 = ThreadCpuSeconds();
    for (int g = 0; g < config.nodes; ++g) {
      Result<SummaryFrame> frame = DecodeSummary(summaries[static_cast<size_t>(g)], NodeId(g), 0);
      if (!frame.ok()) continue;
      for (const DigestFold& f : frame->folds) leader.AddFold(NodeId(g), f, Ns(t + 2.5));
    }
    leader_peak = std::max(leader_peak, HeapInUse() - heap_before);
    leader.Poll(Ns(t + 2.5), &raised, &queries);
    leader_cpu += std::max(0.0, ThreadCpuSeconds() - t0 - overhead);
  }
  auto ns = [](double seconds) { return std::round(seconds * 1e9 * 10) / 10; };
  const double n = std::max(1, snapshots);
  return {
      {"ranks", config.ranks},
      {"nodes", config.nodes},
      {"snapshots", snapshots},
      {"shards_per_rank", m.shards_per_rank},
      {"node",
       {{"fold_cpu_ns_per_snapshot", ns(fold_cpu / n)},
        {"summary_bytes_per_snapshot", static_cast<double>(node_summary_bytes) / n}}},
      {"leader",
       {{"cpu_ns_per_snapshot", ns(leader_cpu / n)},
        {"ns_per_rank", ns(leader_cpu / n / config.ranks)},
        {"folds_per_snapshot", static_cast<double>(folds_sent) / n},
        {"bytes_in_per_snapshot", static_cast<double>(node_summary_bytes) / n * config.nodes},
        {"heap_peak_bytes", leader_peak},
        {"groups_compared", leader.groups_compared()}}},
      {"raised", raised.size()},
      {"queries", queries.size()},
  };
}

}  // namespace lifeline::agent::sim
