// Synthetic event streams for the detectors' tests: a small simulator of N ranks running steps
// with one allreduce each (compute jitter from a seeded RNG, checkpoints every K steps), with
// faults injected, and a Driver that delivers them the way the agent does (every 10 ms, per rank
// in order, ranks in a shuffled order, each event applied once to a Timeline and handed to the
// detectors), then polls. Test support only: header-only, included by the detector tests.
#ifndef LIFELINE_AGENT_DETECTORS_EVENT_SIMULATOR_H_
#define LIFELINE_AGENT_DETECTORS_EVENT_SIMULATOR_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "agent/detector.h"
#include "agent/timeline.h"
#include "lifeline/status.h"

namespace lifeline::agent::simulation {

using trace::Event;
using trace::EventType;
using trace::Op;

inline constexpr uint64_t kMs = 1000000;
inline constexpr uint64_t kSec = 1000000000;

inline uint64_t Ns(double seconds) { return static_cast<uint64_t>(seconds * 1e9); }

// How a stream stops short.
enum class Stall {
  kNone,
  kNeverJoins,  // stall_rank records StepBegin(stall_step) and nothing more; with collectives the
                // others begin and post that step's collective and wait in it forever
  kNeverPosts,  // everyone begins that step's collective, stall_rank does not post, nobody ends
};

struct Sim {
  int ranks = 4;
  int rank_base = 0;  // the global rank of local rank 0: this node's share of a larger job
  int steps = 100;
  uint64_t seed = 1;
  uint64_t start_ns = 1 * kSec;
  double compute = 0.050;
  double compute_sigma = 0.002;
  double spike_probability = 0;  // per rank and step: compute gets spike_seconds more
  double spike_seconds = 0.030;
  bool collectives = true;
  double op = 0.005;  // once the last rank has posted
  double op_sigma = 0.0003;
  double post = 0.0002;  // CollectiveBegin to CollectivePosted
  double update = 0.003;
  int checkpoint_every = 0;  // steps; 0: none
  double persist = 0.3;      // Save to persisted
  bool process_exit = false;  // ProcessExit after the last step
  // Faults.
  std::function<double(int rank, int step)> extra_compute;
  std::function<double(int rank, int step)> extra_post;
  // Seconds a rank leaves the collective after it completed: a host slow to run it again (a rank
  // that slept waiting for a late peer, on a machine with fewer cores than ranks).
  std::function<double(int rank, int step)> extra_end;
  std::function<double(int step)> op_seconds;                  // replaces `op` when set
  std::function<double(int rank, int step)> persist_seconds;   // < 0: never persisted
  std::function<bool(int rank, int step)> checkpoint_fails;    // kCheckpointFailed (IOError)
  Stall stall = Stall::kNone;
  int stall_rank = -1;
  int stall_step = -1;
};

// Per rank, its events in recording order.
using Stream = std::vector<std::vector<Event>>;

inline Event Ev(EventType type, uint64_t t, uint64_t step) {
  Event e;
  e.type = type;
  e.time_ns = t;
  e.step = step;
  return e;
}

inline Event Coll(EventType type, uint64_t t, uint64_t step, uint64_t seq, Op op = Op::kOther) {
  Event e = Ev(type, t, step);
  e.seq = seq;
  e.op = op;
  e.comm = 0;
  return e;
}

inline Stream Generate(const Sim& s) {
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<double> normal(0, 1);
  std::uniform_real_distribution<double> uniform(0, 1);
  Stream out(s.ranks);
  std::vector<double> t(s.ranks);
  for (int r = 0; r < s.ranks; ++r) t[r] = s.start_ns / 1e9 + 0.001 * uniform(rng);
  std::vector<bool> stopped(s.ranks, false);
  uint64_t seq = 0;
  for (int k = 0; k < s.steps; ++k) {
    const bool stall_here = s.stall != Stall::kNone && k == s.stall_step;
    std::vector<double> begin(s.ranks), posted(s.ranks);
    for (int r = 0; r < s.ranks; ++r) {
      if (stopped[r]) continue;
      out[r].push_back(Ev(EventType::kStepBegin, Ns(t[r]), k));
      double c = s.compute + s.compute_sigma * normal(rng);
      if (uniform(rng) < s.spike_probability) c += s.spike_seconds;
      if (s.extra_compute) c += s.extra_compute(r, k);
      begin[r] = t[r] + std::max(c, 0.001);
      posted[r] = begin[r] + s.post + (s.extra_post ? s.extra_post(r, k) : 0.0);
    }
    if (stall_here && s.stall == Stall::kNeverJoins) stopped[s.stall_rank] = true;
    if (!s.collectives) {
      for (int r = 0; r < s.ranks; ++r) t[r] = begin[r];
    } else {
      ++seq;
      if (stall_here) {
        for (int r = 0; r < s.ranks; ++r) {
          if (stopped[r]) continue;
          out[r].push_back(Coll(EventType::kCollectiveBegin, Ns(begin[r]), k, seq, Op::kAllReduce));
          if (!(s.stall == Stall::kNeverPosts && r == s.stall_rank))
            out[r].push_back(Coll(EventType::kCollectivePosted, Ns(posted[r]), k, seq));
        }
        break;
      }
      double last_posted = 0;
      for (int r = 0; r < s.ranks; ++r) last_posted = std::max(last_posted, posted[r]);
      const double op = s.op_seconds ? s.op_seconds(k) : s.op;
      const double done = last_posted + std::max(op + s.op_sigma * normal(rng), 0.0001);
      for (int r = 0; r < s.ranks; ++r) {
        out[r].push_back(Coll(EventType::kCollectiveBegin, Ns(begin[r]), k, seq, Op::kAllReduce));
        out[r].push_back(Coll(EventType::kCollectivePosted, Ns(posted[r]), k, seq));
        t[r] = done + 0.0002 * uniform(rng) + (s.extra_end ? s.extra_end(r, k) : 0.0);
        out[r].push_back(Coll(EventType::kCollectiveEnd, Ns(t[r]), k, seq));
      }
    }
    for (int r = 0; r < s.ranks; ++r) {
      if (stopped[r]) continue;
      t[r] += s.update + 0.0002 * uniform(rng);
      if (s.checkpoint_every > 0 && (k + 1) % s.checkpoint_every == 0) {
        out[r].push_back(Ev(EventType::kCheckpointBegin, Ns(t[r]), k));
        if (s.checkpoint_fails && s.checkpoint_fails(r, k)) {
          Event f = Ev(EventType::kCheckpointFailed, Ns(t[r] + 0.01), k);
          f.aux = static_cast<uint64_t>(StatusCode::kIOError);
          out[r].push_back(f);
        } else {
          const double p = s.persist_seconds ? s.persist_seconds(r, k) : s.persist;
          if (p >= 0) {
            Event e = Ev(EventType::kCheckpointPersisted, Ns(t[r] + p), k);
            e.duration_ns = Ns(p);
            out[r].push_back(e);
          }
        }
        t[r] += 0.002;  // the snapshot copy blocks briefly
      }
      out[r].push_back(Ev(EventType::kStepEnd, Ns(t[r]), k));
    }
  }
  for (int r = 0; r < s.ranks; ++r) {
    if (s.process_exit && !stopped[r]) out[r].push_back(Ev(EventType::kProcessExit, Ns(t[r] + 0.001), s.steps - 1));
    // The persist thread records out of step with the training thread; the ring is in time order.
    std::stable_sort(out[r].begin(), out[r].end(),
                     [](const Event& a, const Event& b) { return a.time_ns < b.time_ns; });
  }
  return out;
}

inline uint64_t LastTime(const Stream& stream) {
  uint64_t last = 0;
  for (const auto& events : stream)
    if (!events.empty()) last = std::max(last, events.back().time_ns);
  return last;
}

// Feeds a stream to a timeline and the detectors reading it as the agent does (each event applied
// once, then handed to every detector), and keeps what they report.
class Driver {
 public:
  // `world` local ranks, the job's ranks `rank_base`.. (see Timeline::Reset).
  explicit Driver(std::vector<Detector*> detectors, int world, int rank_base = 0, uint64_t seed = 7)
      : detectors_(std::move(detectors)), rng_(seed) {
    ResetAll(world, rank_base);
    Load(Stream(world));
  }
  explicit Driver(std::vector<std::unique_ptr<Detector>>* owned, int world, int rank_base = 0, uint64_t seed = 7)
      : Driver(Raw(owned), world, rank_base, seed) {}

  void Load(Stream stream) {
    stream_ = std::move(stream);
    cursor_.assign(stream_.size(), 0);
  }
  // Polls every 10 ms until `until`; `on_poll` sees each poll's time and its anomalies.
  void RunUntil(uint64_t until, const std::function<void(uint64_t, const std::vector<Anomaly>&)>& on_poll = {}) {
    while (now_ + 10 * kMs <= until) {
      now_ += 10 * kMs;
      std::vector<int> order(stream_.size());
      for (size_t r = 0; r < order.size(); ++r) order[r] = static_cast<int>(r);
      std::shuffle(order.begin(), order.end(), rng_);
      for (int r : order) {
        auto& events = stream_[r];
        while (cursor_[r] < events.size() && events[cursor_[r]].time_ns <= now_) {
          Observe(r, events[cursor_[r]]);
          ++cursor_[r];
        }
      }
      std::vector<Anomaly> found;
      Poll(now_, &found);
      if (on_poll) on_poll(now_, found);
      all_.insert(all_.end(), found.begin(), found.end());
    }
  }
  void Exit(int rank, int wait_status, bool expected) { Exit(rank, wait_status, expected, now_, &all_); }
  void ResetAll(int world, int rank_base = 0) {
    timeline_.Reset(world, rank_base);
    for (Detector* d : detectors_) d->Reset(world);
  }
  // By hand: one event, one exit, one poll.
  void Observe(int rank, const Event& event) {
    const TimelineChange change = timeline_.Apply(rank, event);
    if (change.rank < 0) return;
    for (Detector* d : detectors_) d->Observe(timeline_, change);
  }
  void Exit(int rank, int wait_status, bool expected, uint64_t now, std::vector<Anomaly>* out) {
    timeline_.RankExited(rank);
    for (Detector* d : detectors_) d->RankExited(timeline_, rank, wait_status, expected, now, out);
  }
  void Poll(uint64_t now, std::vector<Anomaly>* out) {
    for (Detector* d : detectors_) d->Poll(timeline_, now, out);
  }
  const Timeline& timeline() const { return timeline_; }
  void SetNow(uint64_t now) { now_ = now; }
  uint64_t now() const { return now_; }
  const std::vector<Anomaly>& all() const { return all_; }
  std::vector<Anomaly> OfKind(const std::string& kind) const {
    std::vector<Anomaly> out;
    for (const Anomaly& a : all_)
      if (a.kind == kind) out.push_back(a);
    return out;
  }

 private:
  static std::vector<Detector*> Raw(std::vector<std::unique_ptr<Detector>>* owned) {
    std::vector<Detector*> out;
    for (auto& d : *owned) out.push_back(d.get());
    return out;
  }

  std::vector<Detector*> detectors_;
  Timeline timeline_;
  std::mt19937 rng_;
  Stream stream_;
  std::vector<size_t> cursor_;
  uint64_t now_ = 0;
  std::vector<Anomaly> all_;
};

inline std::string Describe(const std::vector<Anomaly>& anomalies) {
  std::string s;
  for (const Anomaly& a : anomalies) s += "\n  [" + a.kind + "] " + a.message + " " + a.evidence.dump();
  return s;
}

inline AgentConfig Config(int nproc) {
  AgentConfig c;
  c.nproc = static_cast<uint32_t>(nproc);
  return c;
}

inline HangConfig FastHang() {
  HangConfig h;
  h.floor_seconds = 2;
  h.cap_seconds = 30;
  h.multiplier = 10;
  h.window = 64;
  return h;
}

// The first time a collective of the stall began, over the ranks that began it.
inline uint64_t FirstBeginOf(const Stream& stream, uint64_t seq) {
  uint64_t first = ~uint64_t{0};
  for (const auto& events : stream)
    for (const Event& e : events)
      if (e.type == EventType::kCollectiveBegin && e.seq == seq) first = std::min(first, e.time_ns);
  return first;
}

}  // namespace lifeline::agent::simulation

#endif  // LIFELINE_AGENT_DETECTORS_EVENT_SIMULATOR_H_
