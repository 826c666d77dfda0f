// The detectors on synthetic event streams: a small simulator of N ranks running steps with one
// allreduce each (compute jitter from a seeded RNG, checkpoints every K steps), with faults
// injected, delivered to the detectors the way the agent does (every 10 ms, per rank in order,
// ranks in a shuffled order), then Poll.
#include "agent/detectors.h"

#include <algorithm>
#include <csignal>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lifeline/status.h"

namespace lifeline::agent {
namespace {

using trace::Event;
using trace::EventType;
using trace::Op;

constexpr uint64_t kMs = 1000000;
constexpr uint64_t kSec = 1000000000;

uint64_t Ns(double seconds) { return static_cast<uint64_t>(seconds * 1e9); }

// How a stream stops short.
enum class Stall {
  kNone,
  kNeverJoins,  // stall_rank records StepBegin(stall_step) and nothing more; with collectives the
                // others begin and post that step's collective and wait in it forever
  kNeverPosts,  // everyone begins that step's collective, stall_rank does not post, nobody ends
};

struct Sim {
  int ranks = 4;
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
  std::function<double(int step)> op_seconds;                  // replaces `op` when set
  std::function<double(int rank, int step)> persist_seconds;   // < 0: never persisted
  std::function<bool(int rank, int step)> checkpoint_fails;    // kCheckpointFailed (IOError)
  Stall stall = Stall::kNone;
  int stall_rank = -1;
  int stall_step = -1;
};

// Per rank, its events in recording order.
using Stream = std::vector<std::vector<Event>>;

Event Ev(EventType type, uint64_t t, uint64_t step) {
  Event e;
  e.type = type;
  e.time_ns = t;
  e.step = step;
  return e;
}

Event Coll(EventType type, uint64_t t, uint64_t step, uint64_t seq, Op op = Op::kOther) {
  Event e = Ev(type, t, step);
  e.seq = seq;
  e.op = op;
  e.comm = 0;
  return e;
}

Stream Generate(const Sim& s) {
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
        t[r] = done + 0.0002 * uniform(rng);
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

uint64_t LastTime(const Stream& stream) {
  uint64_t last = 0;
  for (const auto& events : stream)
    if (!events.empty()) last = std::max(last, events.back().time_ns);
  return last;
}

// Feeds a stream to detectors as the agent does, and keeps what they report.
class Driver {
 public:
  explicit Driver(std::vector<Detector*> detectors, int world, uint64_t seed = 7)
      : detectors_(std::move(detectors)), rng_(seed) {
    for (Detector* d : detectors_) d->Reset(world);
    Load(Stream(world));
  }
  explicit Driver(std::vector<std::unique_ptr<Detector>>* owned, int world, uint64_t seed = 7)
      : Driver(Raw(owned), world, seed) {}

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
          for (Detector* d : detectors_) d->Observe(r, events[cursor_[r]]);
          ++cursor_[r];
        }
      }
      std::vector<Anomaly> found;
      for (Detector* d : detectors_) d->Poll(now_, &found);
      if (on_poll) on_poll(now_, found);
      all_.insert(all_.end(), found.begin(), found.end());
    }
  }
  void Exit(int rank, int wait_status, bool expected) {
    for (Detector* d : detectors_) d->RankExited(rank, wait_status, expected, now_, &all_);
  }
  void ResetAll(int world) {
    for (Detector* d : detectors_) d->Reset(world);
  }
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
  std::mt19937 rng_;
  Stream stream_;
  std::vector<size_t> cursor_;
  uint64_t now_ = 0;
  std::vector<Anomaly> all_;
};

std::string Describe(const std::vector<Anomaly>& anomalies) {
  std::string s;
  for (const Anomaly& a : anomalies) s += "\n  [" + a.kind + "] " + a.message + " " + a.evidence.dump();
  return s;
}

AgentConfig Config(int nproc) {
  AgentConfig c;
  c.nproc = static_cast<uint32_t>(nproc);
  return c;
}

HangConfig FastHang() {
  HangConfig h;
  h.floor_seconds = 2;
  h.cap_seconds = 30;
  h.multiplier = 10;
  h.window = 64;
  return h;
}

// The first time a collective of the stall began, over the ranks that began it.
uint64_t FirstBeginOf(const Stream& stream, uint64_t seq) {
  uint64_t first = ~uint64_t{0};
  for (const auto& events : stream)
    for (const Event& e : events)
      if (e.type == EventType::kCollectiveBegin && e.seq == seq) first = std::min(first, e.time_ns);
  return first;
}

// ---------------------------------------------------------------------------------------------

TEST(DetectorsTest, CleanJitteryStreamRaisesNothing) {
  Sim sim;
  sim.ranks = 4;
  sim.steps = 1000;
  sim.seed = 42;
  sim.spike_probability = 0.02;
  sim.checkpoint_every = 50;
  sim.persist = 1.0;
  sim.process_exit = true;
  const Stream stream = Generate(sim);
  auto detectors = MakeDetectors(Config(4));
  ASSERT_EQ(detectors.size(), 5u);
  Driver driver(&detectors, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 5 * kSec);
  for (int r = 0; r < 4; ++r) driver.Exit(r, 0, /*expected=*/false);  // finished: exit 0
  driver.RunUntil(driver.now() + 2 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

TEST(DetectorsTest, MakeDetectorsGivesOneOfEachKind) {
  auto detectors = MakeDetectors(Config(2));
  std::vector<std::string> kinds;
  for (auto& d : detectors) kinds.push_back(d->kind());
  EXPECT_EQ(kinds, (std::vector<std::string>{"dead", "hang", "straggler", "slow_collective", "checkpoint"}));
}

// ---------------------------------------------------------------------------------------------
// dead

TEST(DeadRankDetectorTest, SigkillNamesRankSignalAndStep) {
  Sim sim;
  sim.steps = 100;
  sim.stall = Stall::kNeverJoins;  // rank 1 stops recording in step 70: it was killed there
  sim.stall_rank = 1;
  sim.stall_step = 70;
  const Stream stream = Generate(sim);
  auto detectors = MakeDetectors(Config(4));
  Driver driver(&detectors, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 50 * kMs);
  driver.Exit(1, SIGKILL, /*expected=*/false);

  const auto dead = driver.OfKind("dead");
  ASSERT_EQ(dead.size(), 1u) << Describe(driver.all());
  EXPECT_EQ(dead[0].ranks, std::vector<int>{1});
  EXPECT_EQ(dead[0].step, 70u);
  EXPECT_EQ(dead[0].evidence["signal"], SIGKILL);
  EXPECT_EQ(dead[0].evidence["signal_name"], "SIGKILL");
  EXPECT_EQ(dead[0].message, "rank 1 died (SIGKILL) at step 70");
  EXPECT_EQ(dead[0].detected_ns, driver.now());

  // The same death reported twice by the agent is still one anomaly.
  driver.Exit(1, SIGKILL, false);
  EXPECT_EQ(driver.OfKind("dead").size(), 1u);
}

TEST(DeadRankDetectorTest, NonZeroExitCodeFiresZeroAndExpectedDoNot) {
  DeadRankDetector dead;
  dead.Reset(4);
  dead.Observe(2, Ev(EventType::kStepBegin, 1 * kSec, 12));
  std::vector<Anomaly> out;
  dead.RankExited(0, 0, /*expected=*/false, 2 * kSec, &out);            // finished early
  dead.RankExited(1, SIGTERM, /*expected=*/true, 2 * kSec, &out);       // the agent stopping it
  dead.RankExited(3, 3 << 8, /*expected=*/true, 2 * kSec, &out);
  EXPECT_TRUE(out.empty()) << Describe(out);
  dead.RankExited(2, 3 << 8, /*expected=*/false, 2 * kSec, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>{2});
  EXPECT_EQ(out[0].evidence["exit_code"], 3);
  EXPECT_EQ(out[0].step, 12u);
  EXPECT_EQ(out[0].message, "rank 2 exited with status 3 at step 12");
}

TEST(DetectorsTest, ExpectedExitsRaiseNothingFromAnyDetector) {
  Sim sim;
  sim.steps = 40;
  const Stream stream = Generate(sim);
  auto detectors = MakeDetectors(Config(4));
  Driver driver(&detectors, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) / 2);  // mid-step, collectives open
  for (int r = 0; r < 4; ++r) driver.Exit(r, r % 2 ? SIGKILL : SIGTERM, /*expected=*/true);
  driver.RunUntil(driver.now() + 120 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

// ---------------------------------------------------------------------------------------------
// hang

TEST(HangDetectorTest, RankThatNeverJoinsIsNamedAfterTheFloorAndNotBefore) {
  Sim sim;
  sim.steps = 200;
  sim.stall = Stall::kNeverJoins;
  sim.stall_rank = 2;
  sim.stall_step = 110;  // allreduce #111
  const Stream stream = Generate(sim);
  const uint64_t t0 = FirstBeginOf(stream, 111);
  HangDetector hang(FastHang());
  Driver driver({&hang}, 4);
  driver.Load(stream);
  uint64_t fired_at = 0;
  driver.RunUntil(t0 + 60 * kSec, [&](uint64_t now, const std::vector<Anomaly>& found) {
    if (!found.empty() && fired_at == 0) fired_at = now;
  });
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());  // once per stall
  const Anomaly& a = driver.all()[0];
  EXPECT_GT(fired_at, t0 + 2 * kSec);
  EXPECT_LE(fired_at, t0 + 2 * kSec + 20 * kMs);
  EXPECT_EQ(a.kind, "hang");
  EXPECT_EQ(a.ranks, std::vector<int>{2});
  EXPECT_EQ(a.seq, 111u);
  EXPECT_EQ(a.comm, 0u);
  EXPECT_EQ(a.op, "allreduce");
  EXPECT_EQ(a.step, 110u);
  EXPECT_EQ(a.evidence["waiting_ranks"], (std::vector<int>{0, 1, 3}));
  EXPECT_DOUBLE_EQ(a.evidence["timeout_seconds"].get<double>(), 2.0);  // jittery ms history: the floor
  EXPECT_GT(a.evidence["waited_seconds"].get<double>(), 2.0);
  EXPECT_GT(a.evidence["history_size"].get<int>(), 0);
  EXPECT_EQ(a.message.rfind("rank 2 never joined allreduce #111 (comm 0) at step 110; ranks 0,1,3 waited 2.", 0), 0u)
      << a.message;
}

TEST(HangDetectorTest, AllJoinedButOneNeverPosted) {
  Sim sim;
  sim.steps = 50;
  sim.stall = Stall::kNeverPosts;
  sim.stall_rank = 1;
  sim.stall_step = 30;
  const Stream stream = Generate(sim);
  HangDetector hang(FastHang());
  Driver driver({&hang}, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 10 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{1});
  EXPECT_EQ(driver.all()[0].seq, 31u);
  EXPECT_EQ(driver.all()[0].evidence["waiting_ranks"], (std::vector<int>{0, 2, 3}));
}

TEST(HangDetectorTest, StepStuckWithNoCollectiveNamesTheRankBehind) {
  Sim sim;
  sim.collectives = false;
  sim.steps = 300;  // the others go on for ~15 s
  sim.stall = Stall::kNeverJoins;
  sim.stall_rank = 2;
  sim.stall_step = 40;
  const Stream stream = Generate(sim);
  uint64_t t0 = 0;
  for (const Event& e : stream[2])
    if (e.type == EventType::kStepBegin && e.step == 40) t0 = e.time_ns;
  ASSERT_NE(t0, 0u);
  HangDetector hang(FastHang());
  Driver driver({&hang}, 4);
  driver.Load(stream);
  uint64_t fired_at = 0;
  driver.RunUntil(LastTime(stream) + 10 * kSec, [&](uint64_t now, const std::vector<Anomaly>& found) {
    if (!found.empty() && fired_at == 0) fired_at = now;
  });
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_GT(fired_at, t0 + 2 * kSec);
  EXPECT_LE(fired_at, t0 + 2 * kSec + 20 * kMs);
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{2});
  EXPECT_EQ(driver.all()[0].step, 40u);
  EXPECT_FALSE(driver.all()[0].seq.has_value());
}

TEST(HangDetectorTest, AllAtOneStepNamesTheSilentRank) {
  HangDetector hang(FastHang());
  hang.Reset(4);
  for (int r = 0; r < 4; ++r) hang.Observe(r, Ev(EventType::kStepBegin, 1 * kSec + r * kMs, 5));
  std::vector<Anomaly> out;
  for (uint64_t now = 1 * kSec + 100 * kMs; now < 10 * kSec; now += 100 * kMs) {
    for (int r : {0, 1, 3}) hang.Observe(r, Ev(EventType::kHeartbeat, now - 50 * kMs, 5));
    hang.Poll(now, &out);
  }
  ASSERT_EQ(out.size(), 1u) << Describe(out);
  EXPECT_EQ(out[0].ranks, std::vector<int>{2});
  EXPECT_EQ(out[0].step, 5u);
  EXPECT_EQ(out[0].evidence["waiting_ranks"], (std::vector<int>{0, 1, 3}));
}

TEST(HangDetectorTest, FirstSlowCollectiveWaitsForTheFloor) {
  HangDetector hang(FastHang());
  hang.Reset(4);
  std::vector<Anomaly> out;
  for (int r = 0; r < 4; ++r) {
    hang.Observe(r, Ev(EventType::kStepBegin, 1 * kSec, 0));
    hang.Observe(r, Coll(EventType::kCollectiveBegin, 1 * kSec + kMs, 0, 1, Op::kAllReduce));
  }
  // Communicator setup: the first allreduce takes 1.9 s, under the 2 s floor.
  for (uint64_t now = 1 * kSec; now <= 2900 * kMs; now += 10 * kMs) hang.Poll(now, &out);
  for (int r = 0; r < 4; ++r) {
    hang.Observe(r, Coll(EventType::kCollectiveEnd, 2901 * kMs, 0, 1));
    hang.Observe(r, Ev(EventType::kStepEnd, 2905 * kMs, 0));
  }
  for (uint64_t now = 2910 * kMs; now <= 4 * kSec; now += 10 * kMs) hang.Poll(now, &out);
  EXPECT_TRUE(out.empty()) << Describe(out);
}

TEST(HangDetectorTest, TimeoutAdaptsToLongCollectives) {
  Sim sim;
  sim.steps = 30;
  sim.op = 0.5;  // collectives routinely take half a second: timeout 10 x ~0.5 s
  sim.stall = Stall::kNeverJoins;
  sim.stall_rank = 0;
  sim.stall_step = 20;
  const Stream stream = Generate(sim);
  const uint64_t t0 = FirstBeginOf(stream, 21);
  HangDetector hang(FastHang());
  Driver driver({&hang}, 4);
  driver.Load(stream);
  uint64_t fired_at = 0;
  driver.RunUntil(t0 + 30 * kSec, [&](uint64_t now, const std::vector<Anomaly>& found) {
    if (!found.empty() && fired_at == 0) fired_at = now;
  });
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const double timeout = driver.all()[0].evidence["timeout_seconds"].get<double>();
  EXPECT_GT(timeout, 5.0);
  EXPECT_LT(timeout, 6.0);
  EXPECT_GT(fired_at, t0 + Ns(timeout));
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{0});
}

TEST(HangDetectorTest, ResetForgetsTheOpenCollectivesOfThePreviousLaunch) {
  Sim sim;
  sim.steps = 60;
  sim.stall = Stall::kNeverJoins;
  sim.stall_rank = 3;
  sim.stall_step = 40;
  Stream stream = Generate(sim);
  const uint64_t t0 = FirstBeginOf(stream, 41);
  HangDetector hang(FastHang());
  Driver driver({&hang}, 4);
  driver.Load(stream);
  driver.RunUntil(t0 + 1 * kSec);
  EXPECT_TRUE(driver.all().empty());

  // Restart: a fresh launch whose first events come a little later.
  driver.ResetAll(4);
  driver.Load(Stream(4));
  driver.RunUntil(t0 + 30 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());

  // The new launch counts seqs from 1 again, and its own stall is reported.
  sim.start_ns = driver.now() + 100 * kMs;
  sim.stall_rank = 1;
  sim.stall_step = 10;
  stream = Generate(sim);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 5 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{1});
  EXPECT_EQ(driver.all()[0].seq, 11u);
}

TEST(HangDetectorTest, ExitedRankIsNeitherWaiterNorCulprit) {
  Sim sim;
  sim.steps = 60;
  sim.stall = Stall::kNeverJoins;
  sim.stall_rank = 2;
  sim.stall_step = 20;
  const Stream stream = Generate(sim);
  HangDetector hang(FastHang());
  Driver driver({&hang}, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 100 * kMs);
  driver.Exit(0, SIGKILL, /*expected=*/false);  // a waiter dies
  driver.RunUntil(LastTime(stream) + 5 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{2});
  EXPECT_EQ(driver.all()[0].evidence["waiting_ranks"], (std::vector<int>{1, 3}));
}

// ---------------------------------------------------------------------------------------------
// straggler

void ExpectStragglerRank3(int ranks) {
  Sim sim;
  sim.ranks = ranks;
  sim.steps = 100;
  sim.seed = 100 + ranks;
  sim.extra_compute = [](int r, int k) { return r == 3 && k >= 30 ? 0.040 : 0.0; };
  const Stream stream = Generate(sim);
  auto detectors = MakeDetectors(Config(ranks));
  Driver driver(&detectors, ranks);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  // Only the straggler: its late arrival does not make the collective slow, nor does it hang.
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "straggler");
  EXPECT_EQ(a.ranks, std::vector<int>{3});
  ASSERT_TRUE(a.step.has_value());
  EXPECT_GE(*a.step, 30u + 13);  // 14 outliers (70% of a 20-entry window): steps 30..43
  EXPECT_LE(*a.step, 30u + 25);
  EXPECT_EQ(a.op, "allreduce");
  EXPECT_NEAR(a.evidence["compute_median_seconds"].get<double>() -
                  a.evidence["peers_compute_median_seconds"].get<double>(), 0.040, 0.005);
  EXPECT_NEAR(a.evidence["lateness_median_seconds"].get<double>(), 0.040, 0.005);
  EXPECT_GE(a.evidence["fraction"].get<double>(), 0.7);
  EXPECT_EQ(a.evidence["window"], 20);
  EXPECT_NE(a.message.find("rank 3"), std::string::npos) << a.message;
}

TEST(StragglerDetectorTest, SlowComputeRankAmongFour) { ExpectStragglerRank3(4); }
TEST(StragglerDetectorTest, SlowComputeRankAmongEight) { ExpectStragglerRank3(8); }

TEST(StragglerDetectorTest, TwoRanksUseTheAbsoluteRule) {
  Sim sim;
  sim.ranks = 2;
  sim.steps = 80;
  sim.extra_compute = [](int r, int k) { return r == 1 && k >= 20 ? 0.040 : 0.0; };
  const Stream stream = Generate(sim);
  StragglerDetector straggler(StragglerConfig{});
  Driver driver({&straggler}, 2);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_EQ(driver.all()[0].ranks, std::vector<int>{1});
  EXPECT_TRUE(driver.all()[0].evidence["z"].is_null());
}

TEST(StragglerDetectorTest, TwoRanksWithJitterStaySilent) {
  Sim sim;
  sim.ranks = 2;
  sim.steps = 500;
  sim.spike_probability = 0.02;
  StragglerDetector straggler(StragglerConfig{});
  Driver driver({&straggler}, 2);
  const Stream stream = Generate(sim);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

TEST(StragglerDetectorTest, CooldownThenReportedAgain) {
  StragglerConfig config;
  config.cooldown_seconds = 3;
  Sim sim;
  sim.steps = 150;  // ~9 s of straggling
  sim.extra_compute = [](int r, int k) { return r == 3 && k >= 30 ? 0.040 : 0.0; };
  const Stream stream = Generate(sim);
  StragglerDetector straggler(config);
  Driver driver({&straggler}, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  ASSERT_GE(driver.all().size(), 2u) << Describe(driver.all());
  for (size_t i = 1; i < driver.all().size(); ++i) {
    EXPECT_EQ(driver.all()[i].ranks, std::vector<int>{3});
    EXPECT_GE(driver.all()[i].detected_ns - driver.all()[i - 1].detected_ns, 3 * kSec);
  }
}

// ---------------------------------------------------------------------------------------------
// slow_collective

TEST(SlowCollectiveDetectorTest, LatePosterInsideTheCollectiveIsNamed) {
  Sim sim;
  sim.steps = 100;
  sim.extra_post = [](int r, int k) { return r == 1 && k >= 60 ? 0.030 : 0.0; };
  const Stream stream = Generate(sim);
  auto detectors = MakeDetectors(Config(4));
  Driver driver(&detectors, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  // Everyone began on time: no straggler.
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "slow_collective");
  EXPECT_EQ(a.ranks, std::vector<int>{1});
  EXPECT_EQ(a.op, "allreduce");
  EXPECT_EQ(a.comm, 0u);
  // Fired as soon as half of the 10 recent collectives were slow: the medians sit between.
  EXPECT_GT(a.evidence["posted_delay_median_seconds"]["1"].get<double>(), 0.010);
  EXPECT_LT(a.evidence["peers_posted_delay_median_seconds"].get<double>(), 0.001);
  EXPECT_NEAR(a.evidence["baseline_median_seconds"].get<double>(), 0.0053, 0.001);
  EXPECT_GT(a.evidence["recent_median_seconds"].get<double>(), 2 * 0.0053);
  ASSERT_TRUE(a.step.has_value());
  EXPECT_GE(*a.step, 64u);
  EXPECT_LE(*a.step, 70u);
  EXPECT_NE(a.message.find("rank 1 posts its part"), std::string::npos) << a.message;
}

TEST(SlowCollectiveDetectorTest, WholeCommunicatorSlowNamesNoRank) {
  Sim sim;
  sim.steps = 100;
  sim.op_seconds = [](int k) { return k >= 60 ? 0.020 : 0.005; };
  const Stream stream = Generate(sim);
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  Driver driver({&slow}, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  EXPECT_TRUE(driver.all()[0].ranks.empty());
  EXPECT_NE(driver.all()[0].message.find("whole communicator"), std::string::npos) << driver.all()[0].message;
}

TEST(SlowCollectiveDetectorTest, SmallSlowdownUnderTheFactorStaysSilent) {
  Sim sim;
  sim.steps = 200;
  sim.op_seconds = [](int k) { return k >= 60 ? 0.008 : 0.005; };  // x1.6 < x2
  const Stream stream = Generate(sim);
  SlowCollectiveDetector slow(SlowCollectiveConfig{});
  Driver driver({&slow}, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  EXPECT_TRUE(driver.all().empty()) << Describe(driver.all());
}

// ---------------------------------------------------------------------------------------------
// checkpoint

TEST(CheckpointDetectorTest, FailureNamesRankStepAndCode) {
  Sim sim;
  sim.steps = 120;
  sim.checkpoint_every = 25;
  sim.checkpoint_fails = [](int r, int k) { return r == 2 && k == 49; };
  const Stream stream = Generate(sim);
  auto detectors = MakeDetectors(Config(4));
  Driver driver(&detectors, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "checkpoint");
  EXPECT_EQ(a.ranks, std::vector<int>{2});
  EXPECT_EQ(a.step, 49u);
  EXPECT_EQ(a.evidence["status_code"], static_cast<int>(StatusCode::kIOError));
}

TEST(CheckpointDetectorTest, PersistLagOnOneRankIsNamedAfterLagCountInARow) {
  Sim sim;
  sim.steps = 300;
  sim.checkpoint_every = 20;  // ~1.2 s between saves
  sim.persist = 0.3;
  sim.persist_seconds = [](int r, int k) { return r == 1 && k >= 100 ? 2.5 : 0.3; };
  const Stream stream = Generate(sim);
  CheckpointDetector checkpoint(CheckpointConfig{});
  Driver driver({&checkpoint}, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());  // cooldown 300 s
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.ranks, std::vector<int>{1});
  EXPECT_NEAR(a.evidence["interval_seconds"].get<double>(), 1.2, 0.2);
  // Checkpoints of steps 119, 139, 159 lag. It fires once 159's save has been unpersisted for an
  // interval, before 139's persist (2.5 s) arrives: the last two are counted as still pending.
  ASSERT_EQ(a.evidence["persist_seconds"].size(), 3u);
  EXPECT_NEAR(a.evidence["persist_seconds"][0].get<double>(), 2.5, 0.01);
  EXPECT_GT(a.evidence["persist_seconds"][2].get<double>(), 1.1);
  EXPECT_EQ(a.evidence["unpersisted"], 2);
  ASSERT_TRUE(a.step.has_value());
  EXPECT_EQ(*a.step, 159u);
}

// A load that passed over a damaged checkpoint is a checkpoint anomaly naming the ranks, the step
// skipped and the step loaded instead: a fallback is never only a log line.
TEST(CheckpointDetectorTest, LoadFallbackIsAnAnomalyNamingRanksAndSteps) {
  CheckpointDetector checkpoint(CheckpointConfig{});
  Driver driver({&checkpoint}, 4);
  Stream stream(4);
  for (int r : {1, 3}) {
    Event e = Ev(EventType::kCheckpointFallback, 1 * kSec, 200);
    e.bytes = 100;  // the step loaded instead
    stream[r].push_back(e);
  }
  driver.Load(stream);
  driver.RunUntil(2 * kSec);
  ASSERT_EQ(driver.all().size(), 1u) << Describe(driver.all());
  const Anomaly& a = driver.all()[0];
  EXPECT_EQ(a.kind, "checkpoint");
  EXPECT_EQ(a.ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(a.step, 200u);
  EXPECT_EQ(a.evidence["skipped_step"], 200);
  EXPECT_EQ(a.evidence["loaded_step"], 100);
  EXPECT_EQ(a.evidence["location"], "disk");
  EXPECT_NE(a.message.find("loaded step 100"), std::string::npos) << a.message;
}

TEST(CheckpointDetectorTest, SavesThatNeverPersistCountInPoll) {
  Sim sim;
  sim.steps = 200;
  sim.checkpoint_every = 20;
  sim.persist_seconds = [](int r, int k) { return k >= 100 ? -1.0 : 0.3; };  // storage gone
  const Stream stream = Generate(sim);
  CheckpointDetector checkpoint(CheckpointConfig{});
  Driver driver({&checkpoint}, 4);
  driver.Load(stream);
  driver.RunUntil(LastTime(stream) + 1 * kSec);
  // Every rank, each once (ranks crossing the limit in the same poll share one anomaly).
  std::vector<int> named;
  for (const Anomaly& a : driver.all()) {
    named.insert(named.end(), a.ranks.begin(), a.ranks.end());
    EXPECT_EQ(a.evidence["unpersisted"], 3) << a.message;
  }
  std::sort(named.begin(), named.end());
  EXPECT_EQ(named, (std::vector<int>{0, 1, 2, 3})) << Describe(driver.all());
}

}  // namespace
}  // namespace lifeline::agent
