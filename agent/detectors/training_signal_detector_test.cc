// TrainingSignalDetector on synthetic training runs: clean noisy series (a decaying loss, a
// learning-rate warm-up then cosine decay, a flat loss, heavy-tailed gradient norms) raise nothing;
// spikes, NaNs and replicas that disagree are found and named with their rank and step.
#include "agent/detectors/training_signal_detector.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/detectors/detector_test_kit.h"
#include "agent/detectors/event_simulator.h"
#include "agent/supervisor.h"

namespace lifeline::agent {
namespace training_signal_detector_test {

using namespace simulation;
using trace::Event;
using trace::EventType;

constexpr double kNaNValue = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A job of `world` ranks reporting training signals one step every 100 ms, polled after each step
// as the agent would (ranks' events in a shuffled order within a poll).
class SignalJob {
 public:
  explicit SignalJob(int world, TrainingSignalConfig config = {}, int rank_base = 0)
      : detector_(config), driver_({&detector_}, world, rank_base), world_(world) {}

  void Report(int rank, uint64_t step, double value, uint32_t id = trace::kLossScalar) {
    Event e;
    e.time_ns = now_;
    e.type = EventType::kScalar;
    e.comm = id;
    e.step = step;
    std::memcpy(&e.aux, &value, sizeof(value));
    driver_.Observe(rank, e);
  }
  void Name(int rank, uint32_t id, const std::string& name) {
    Event e;
    e.time_ns = now_;
    e.type = EventType::kScalarName;
    e.comm = id;
    char bytes[32] = {};
    std::memcpy(bytes, name.data(), name.size());
    std::memcpy(reinterpret_cast<char*>(&e) + offsetof(Event, seq), bytes, sizeof(bytes));
    driver_.Observe(rank, e);
  }
  // Steps [from, to): each rank reports loss(rank, step) and grad_norm(rank, step) (either
  // function may be empty: not reported), then a poll.
  void Run(uint64_t from, uint64_t to, const std::function<double(int, uint64_t)>& loss,
           const std::function<double(int, uint64_t)>& grad_norm) {
    for (uint64_t k = from; k < to; ++k) {
      now_ += 100 * kMs;
      for (int r = 0; r < world_; ++r) {
        if (loss) Report(r, k, loss(r, k), trace::kLossScalar);
        if (grad_norm) Report(r, k, grad_norm(r, k), trace::kGradNormScalar);
      }
      Poll();
    }
  }
  void Observe(int rank, const Event& e) { driver_.Observe(rank, e); }
  void Poll() {
    std::vector<Anomaly> found;
    driver_.Poll(now_, &found);
    all_.insert(all_.end(), found.begin(), found.end());
  }
  void Advance(uint64_t ns) {
    now_ += ns;
    Poll();
  }
  void Relaunch() { driver_.ResetAll(world_); }
  void Exit(int rank) { driver_.Exit(rank, 0, /*expected=*/false, now_, &all_); }

  std::vector<Anomaly> OfKind(const std::string& kind) const {
    std::vector<Anomaly> out;
    for (const Anomaly& a : all_)
      if (a.kind == kind) out.push_back(a);
    return out;
  }
  const std::vector<Anomaly>& all() const { return all_; }
  const TrainingSignalDetector& detector() const { return detector_; }

 private:
  TrainingSignalDetector detector_;
  Driver driver_;
  int world_;
  uint64_t now_ = 1 * kSec;
  std::vector<Anomaly> all_;
};

// A training run's signals: the loss decays towards `floor` with per-rank batch noise; the
// gradient norm follows the learning rate (linear warm-up, then cosine decay) with log-normal
// noise and is the same on every rank (it is all-reduced).
struct CleanRun {
  uint64_t seed = 3;
  double loss_noise = 0.03;      // relative, per rank and step
  double norm_noise = 0.15;      // log-normal sigma, shared by the ranks
  uint64_t warmup = 200;         // learning-rate warm-up steps
  uint64_t steps = 3000;
  double blip_probability = 0;   // a harmless 1.8x gradient-norm blip now and then

  double Lr(uint64_t k) const {
    if (k < warmup) return static_cast<double>(k + 1) / static_cast<double>(warmup);
    const double progress = static_cast<double>(k - warmup) / static_cast<double>(steps - warmup);
    return 0.1 + 0.45 * (1 + std::cos(M_PI * progress));
  }
  double Loss(int rank, uint64_t k) const {
    std::mt19937_64 g(seed * 1000003 + k * 131 + static_cast<uint64_t>(rank));
    std::normal_distribution<double> n(0, 1);
    const double level = 2.0 + 8.0 * std::exp(-static_cast<double>(k) / 300.0);
    return level * (1 + loss_noise * n(g));
  }
  double GradNorm(uint64_t k) const {
    std::mt19937_64 g(seed * 7919 + k);
    std::normal_distribution<double> n(0, 1);
    std::uniform_real_distribution<double> u(0, 1);
    double norm = (0.4 + Lr(k)) * std::exp(norm_noise * n(g));
    if (u(g) < blip_probability) norm *= 1.8;
    return norm;
  }
};

TEST(TrainingSignalDetectorTest, CleanNoisyRunsRaiseNothing) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    CleanRun run;
    run.seed = seed;
    run.blip_probability = 0.01;
    SignalJob job(4);
    job.Run(0, run.steps, [&](int r, uint64_t k) { return run.Loss(r, k); },
            [&](int, uint64_t k) { return run.GradNorm(k); });
    EXPECT_TRUE(job.all().empty()) << "seed " << seed << ": " << Describe(job.all());
    EXPECT_EQ(job.detector().values(), 4 * 2 * run.steps);
  }
}

TEST(TrainingSignalDetectorTest, AFlatLossAndAConstantNormRaiseNothing) {
  SignalJob job(2);
  std::mt19937_64 g(5);
  std::normal_distribution<double> n(0, 1);
  job.Run(0, 2000, [&](int, uint64_t) { return 0.6931 + 1e-4 * n(g); }, [](int, uint64_t) { return 1.0; });
  EXPECT_TRUE(job.all().empty()) << Describe(job.all());
}

// The learning rate jumps (a step schedule, a warm restart): the norm falls to a lower level, or
// climbs smoothly to a higher one over a few hundred steps; neither is a spike.
TEST(TrainingSignalDetectorTest, LearningRateScheduleChangesRaiseNothing) {
  SignalJob job(2);
  auto norm = [&](int, uint64_t k) {  // the same on both ranks: it is all-reduced
    std::mt19937_64 g(11 + k);
    std::normal_distribution<double> n(0, 1);
    double level = k < 1000 ? 2.0 : k < 2000 ? 0.4 : 0.4 + 1.6 * std::min(1.0, (k - 2000) / 300.0);
    return level * std::exp(0.1 * n(g));
  };
  job.Run(0, 3000, nullptr, norm);
  EXPECT_TRUE(job.all().empty()) << Describe(job.all());
}

TEST(TrainingSignalDetectorTest, ALossSpikeOnOneRankIsNamedWithItsStepAndEvidence) {
  CleanRun run;
  SignalJob job(4);
  job.Run(0, run.steps,
          [&](int r, uint64_t k) { return run.Loss(r, k) * (r == 2 && k == 1500 ? 3.0 : 1.0); },
          [&](int, uint64_t k) { return run.GradNorm(k); });
  const std::vector<Anomaly> spikes = job.OfKind("spike");
  ASSERT_EQ(job.all().size(), 1u) << Describe(job.all());
  const Anomaly& a = spikes.at(0);
  EXPECT_EQ(a.ranks, std::vector<int>{2});
  EXPECT_EQ(a.step, 1500u);
  EXPECT_EQ(a.evidence["scalar"], "loss");
  EXPECT_GT(a.evidence["max_z"].get<double>(), 20);
  EXPECT_NEAR(a.evidence["median"].get<double>(), 2.0 + 8.0 * std::exp(-5.0), 0.1);
  EXPECT_EQ(a.evidence["window"], 100);
  EXPECT_NE(a.message.find("loss spike at step 1500 on rank 2"), std::string::npos) << a.message;
}

// A gradient-norm spike is every rank's (the norm is all-reduced): one anomaly names them all.
TEST(TrainingSignalDetectorTest, AGradNormSpikeIsOneAnomalyForTheStep) {
  CleanRun run;
  SignalJob job(4);
  job.Run(0, run.steps, [&](int r, uint64_t k) { return run.Loss(r, k); },
          [&](int, uint64_t k) { return run.GradNorm(k) * (k == 2000 ? 10.0 : 1.0); });
  ASSERT_EQ(job.all().size(), 1u) << Describe(job.all());
  EXPECT_EQ(job.all()[0].kind, "spike");
  EXPECT_EQ(job.all()[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(job.all()[0].step, 2000u);
  EXPECT_EQ(job.all()[0].evidence["scalar"], "grad_norm");
}

// A loss that climbs and stays up (divergence) scores less than a single-value spike, but is
// confirmed by spike_confirm high values in a row; it is named at its first step, once.
TEST(TrainingSignalDetectorTest, ASustainedRiseIsConfirmedAndReportedOnce) {
  CleanRun run;
  SignalJob job(2);
  job.Run(0, 1200, [&](int r, uint64_t k) { return run.Loss(r, k) * (k >= 1000 && k < 1040 ? 1.6 : 1.0); },
          nullptr);
  ASSERT_EQ(job.all().size(), 1u) << Describe(job.all());  // both ranks, one step: one anomaly
  const Anomaly& a = job.all()[0];
  EXPECT_EQ(a.kind, "spike");
  EXPECT_EQ(a.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(a.step, 1000u);
  EXPECT_EQ(a.evidence["steps"].size(), 3u);
  EXPECT_EQ(a.evidence["per_rank"].size(), 2u);
  EXPECT_LT(a.evidence["max_z"].get<double>(), 20);
  // Too few high values in a row: nothing.
  SignalJob short_run(1);
  short_run.Run(0, 1200, [&](int r, uint64_t k) { return run.Loss(r, k) * (k == 1000 || k == 1001 ? 1.6 : 1.0); },
                nullptr);
  EXPECT_TRUE(short_run.all().empty()) << Describe(short_run.all());
}

// No verdict in the first warmup_steps values of a series. A relaunch (a restart, a rollback)
// resuming from a checkpoint keeps what the series saw before it: a spike replayed right after the
// resume is judged again (a poisoned batch comes back after a rollback); a relaunch resuming
// within the warm-up is still in it.
TEST(TrainingSignalDetectorTest, WarmUpOnceAndARelaunchKeepsTheStepsBeforeItsResume) {
  CleanRun run;
  SignalJob job(2);
  auto spiky = [&](uint64_t at) {
    return [&run, at](int r, uint64_t k) { return run.Loss(r, k) * (k == at ? 5.0 : 1.0); };
  };
  job.Run(0, 300, spiky(30), nullptr);  // within the warm-up
  EXPECT_TRUE(job.all().empty()) << Describe(job.all());
  job.Run(300, 320, spiky(310), nullptr);
  ASSERT_EQ(job.all().size(), 1u) << Describe(job.all());
  EXPECT_EQ(job.all()[0].step, 310u);
  // The rollback to the checkpoint of step 300: the spike at 310 comes back, and is named again.
  job.Relaunch();
  job.Run(301, 320, spiky(310), nullptr);
  ASSERT_EQ(job.all().size(), 2u) << Describe(job.all());
  EXPECT_EQ(job.all()[1].step, 310u);
  // The same within a process, and without the spike nothing more.
  job.Run(301, 400, spiky(trace::kNoStep), nullptr);
  EXPECT_EQ(job.all().size(), 2u) << Describe(job.all());
  // The rollback to the checkpoint of step 309, the spike at 310 being the last step reached: it
  // comes back at the relaunch's first step, and is named again.
  job.Run(400, 410, spiky(trace::kNoStep), nullptr);
  job.Run(410, 411, spiky(410), nullptr);
  const size_t before = job.all().size();
  job.Relaunch();
  job.Run(410, 420, spiky(410), nullptr);
  ASSERT_EQ(job.all().size(), before + 1) << Describe(job.all());
  EXPECT_EQ(job.all().back().step, 410u);
  // A relaunch from step 20, within the warm-up: step 40 has 40 values before it, of the 50 needed.
  job.Relaunch();
  job.Run(21, 60, spiky(40), nullptr);
  EXPECT_EQ(job.all().size(), before + 1) << Describe(job.all());
}

// Issue 53's first case: one rank's loss becomes NaN at step k; the all-reduce spreads NaN to
// every rank's gradient norm at k and everything after. One anomaly names that rank and step.
TEST(TrainingSignalDetectorTest, ANaNLossOnOneRankIsNamedOnceWithItsStep) {
  CleanRun run;
  SignalJob job(4);
  const uint64_t k = 37;  // within warm-up: a non-finite value needs none
  job.Run(0, 100, [&](int r, uint64_t s) { return (r == 1 && s >= k) || s > k ? kNaNValue : run.Loss(r, s); },
          [&](int, uint64_t s) { return s >= k ? kNaNValue : run.GradNorm(s); });
  const std::vector<Anomaly> found = job.OfKind("non_finite");
  ASSERT_EQ(job.all().size(), 1u) << Describe(job.all());
  const Anomaly& a = found.at(0);
  EXPECT_EQ(a.ranks, std::vector<int>{1});
  EXPECT_EQ(a.step, k);
  EXPECT_TRUE(a.evidence["rank_own_value"].get<bool>());
  EXPECT_NE(a.message.find("loss is NaN on rank 1"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("grad_norm is NaN on ranks 0,1,2,3"), std::string::npos) << a.message;
}

// The loss stays finite, the gradient norm does not: every rank shares it, so every rank is
// named and the message says the culprit is not told. The rank's own global numbers are used.
TEST(TrainingSignalDetectorTest, ANonFiniteNormAloneNamesTheGroupAndSaysSo) {
  CleanRun run;
  SignalJob job(2, {}, /*rank_base=*/6);
  job.Run(0, 100, [&](int r, uint64_t s) { return run.Loss(r, s); },
          [&](int, uint64_t s) { return s == 60 ? kInf : run.GradNorm(s); });
  ASSERT_EQ(job.all().size(), 1u) << Describe(job.all());
  EXPECT_EQ(job.all()[0].ranks, (std::vector<int>{6, 7}));
  EXPECT_EQ(job.all()[0].step, 60u);
  EXPECT_NE(job.all()[0].message.find("not told"), std::string::npos) << job.all()[0].message;
}

// With a loss scaler, a skipped step has an infinite norm: non_finite_in_a_row tolerates a few.
TEST(TrainingSignalDetectorTest, OverflowsOfALossScalerAreToleratedInARowUpToTheSetting) {
  TrainingSignalConfig c;
  c.non_finite_in_a_row = 3;
  CleanRun run;
  SignalJob job(2, c);
  job.Run(0, 400, nullptr, [&](int, uint64_t s) {
    return (s >= 5 && s < 7) || s == 100 || (s >= 200 && s < 202) ? kInf : run.GradNorm(s);
  });
  EXPECT_TRUE(job.all().empty()) << Describe(job.all());
  job.Run(400, 500, nullptr, [&](int, uint64_t s) { return s >= 450 ? kInf : run.GradNorm(s); });
  ASSERT_EQ(job.all().size(), 1u) << Describe(job.all());
  EXPECT_EQ(job.all()[0].kind, "non_finite");
  EXPECT_EQ(job.all()[0].step, 452u);  // the third in a row
}

// A value identical by construction (the all-reduced gradient norm) differs on one rank by one
// bit: that rank is named against the majority, once per episode.
TEST(TrainingSignalDetectorTest, AReplicaWhoseNormDiffersByOneBitIsNamed) {
  CleanRun run;
  SignalJob job(4);
  auto norm = [&](int r, uint64_t s) {
    double v = run.GradNorm(s);
    if (r == 3 && (s == 700 || s == 701 || s == 900)) v = std::nextafter(v, kInf);
    return v;
  };
  job.Run(0, 1000, nullptr, norm);
  const std::vector<Anomaly> found = job.OfKind("disagreement");
  ASSERT_EQ(job.all().size(), 2u) << Describe(job.all());  // 700 (701 is the same episode), 900
  EXPECT_EQ(found[0].ranks, std::vector<int>{3});
  EXPECT_EQ(found[0].step, 700u);
  EXPECT_EQ(found[0].evidence["scalar"], "grad_norm");
  EXPECT_EQ(found[0].evidence["ranks_compared"], 4);
  EXPECT_EQ(found[0].evidence["majority"].get<double>(), run.GradNorm(700));
  EXPECT_NE(found[0].evidence["bits"]["3"], found[0].evidence["bits"]["0"]);
  EXPECT_NE(found[0].message.find("rank 3"), std::string::npos) << found[0].message;
  EXPECT_EQ(found[1].step, 900u);
}

TEST(TrainingSignalDetectorTest, TwoReplicasThatDisagreeAreBothNamedWithoutAMajority) {
  SignalJob job(2);
  job.Run(0, 10, nullptr, [](int r, uint64_t s) { return s == 4 && r == 1 ? 1.5 : 1.25; });
  ASSERT_EQ(job.all().size(), 1u) << Describe(job.all());
  EXPECT_EQ(job.all()[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_TRUE(job.all()[0].evidence["majority"].is_null());
  EXPECT_NE(job.all()[0].message.find("no majority"), std::string::npos);
}

// Replica groups: pipeline stages whose norms are not all-reduced across stages differ by design.
TEST(TrainingSignalDetectorTest, ReplicaGroupsAreComparedWithinThemselvesOnly) {
  auto per_stage = [](int r, uint64_t s) { return (r < 2 ? 1.0 : 2.0) + 1e-3 * static_cast<double>(s % 7); };
  TrainingSignalConfig staged;
  staged.replica_group_size = 2;
  SignalJob job(4, staged);
  job.Run(0, 200, nullptr, per_stage);
  EXPECT_TRUE(job.all().empty()) << Describe(job.all());
  SignalJob whole(4);  // one group of all ranks: two against two
  whole.Run(0, 10, nullptr, per_stage);
  ASSERT_EQ(whole.all().size(), 1u) << Describe(whole.all());
  EXPECT_EQ(whole.all()[0].kind, "disagreement");
  TrainingSignalConfig off;
  off.replicated.clear();
  SignalJob none(4, off);
  none.Run(0, 10, nullptr, per_stage);
  EXPECT_TRUE(none.all().empty()) << Describe(none.all());
}

// A scalar of the script's own, known by the name its rank gave its id; ids never named are not
// judged; a watched user scalar spikes like the loss.
TEST(TrainingSignalDetectorTest, UserScalarsAreMatchedByName) {
  TrainingSignalConfig c;
  c.watched = {"loss", "grad_norm", "moe/router_z"};
  c.replicated = {"grad_norm", "loss/global"};
  SignalJob job(2, c);
  job.Name(0, 2, "moe/router_z");
  job.Name(1, 5, "moe/router_z");  // another id for the same name on rank 1
  job.Name(0, 3, "loss/global");
  job.Name(1, 2, "loss/global");
  std::mt19937_64 g(1);
  std::normal_distribution<double> n(0, 1);
  for (uint64_t k = 0; k < 300; ++k) {
    const double z = 1 + 0.05 * n(g);
    job.Report(0, k, k == 250 ? 9.0 : z, 2);
    job.Report(1, k, z, 5);
    job.Report(0, k, 3.0 - 0.001 * static_cast<double>(k), 3);
    job.Report(1, k, k == 120 ? 7.0 : 3.0 - 0.001 * static_cast<double>(k), 2);
    job.Report(1, k, 1.0, 9);  // never named
    job.Advance(100 * kMs);
  }
  ASSERT_EQ(job.all().size(), 2u) << Describe(job.all());
  EXPECT_EQ(job.all()[0].kind, "disagreement");
  EXPECT_EQ(job.all()[0].step, 120u);
  EXPECT_EQ(job.all()[0].evidence["scalar"], "loss/global");
  EXPECT_EQ(job.all()[1].kind, "spike");
  EXPECT_EQ(job.all()[1].ranks, std::vector<int>{0});
  EXPECT_EQ(job.all()[1].evidence["scalar"], "moe/router_z");
  EXPECT_EQ(job.detector().unnamed_values(), 300u);
}

// A step is judged once every live rank reported a later one: a rank that stops reporting (it
// died, or hangs) holds the verdict only hold_seconds; a dead rank none.
TEST(TrainingSignalDetectorTest, AVerdictWaitsForTheStepsValuesAtMostHoldSeconds) {
  SignalJob job(2);
  job.Run(0, 5, [](int r, uint64_t s) { return r == 1 && s == 4 ? kNaNValue : 1.0; }, nullptr);
  job.Report(0, 5, 1.0);  // rank 1 says nothing more
  job.Advance(1 * kSec);
  EXPECT_TRUE(job.all().empty()) << "judged before rank 1's later steps or the hold";
  job.Advance(5 * kSec);
  ASSERT_EQ(job.all().size(), 1u) << Describe(job.all());
  EXPECT_EQ(job.all()[0].ranks, std::vector<int>{1});

  SignalJob dies(2);
  dies.Run(0, 5, [](int r, uint64_t s) { return r == 0 && s == 4 ? kNaNValue : 1.0; }, nullptr);
  dies.Exit(1);
  dies.Exit(0);
  dies.Advance(10 * kMs);
  ASSERT_EQ(dies.all().size(), 1u) << Describe(dies.all());
  EXPECT_EQ(dies.all()[0].ranks, std::vector<int>{0});
}

// What a ring may hold but no rank writes: names of bad bytes, ids out of range, a value with
// no step. Nothing is judged of them, and nothing breaks.
TEST(TrainingSignalDetectorTest, EventsNoRankWritesAreIgnored) {
  SignalJob job(1);
  Event e;
  e.type = EventType::kScalarName;
  e.comm = 2;
  e.seq = 0x2222222222222222ull;  // '"' characters
  job.Observe(0, e);
  job.Report(0, 0, 1.0, 2);
  Event huge = e;
  huge.comm = 1u << 31;
  huge.seq = 0x61;  // "a"
  job.Observe(0, huge);
  job.Report(0, trace::kNoStep, kNaNValue, trace::kLossScalar);
  job.Advance(10 * kSec);
  EXPECT_TRUE(job.all().empty()) << Describe(job.all());
  EXPECT_EQ(job.detector().unnamed_values(), 1u);
}


// The Supervisor runs the detector as it runs the others (so lifeline-agent and lifeline-sim do):
// the anomaly is raised with its kind's policy (log by default; restart where configured, the
// hook for a rollback) and an events-log record naming the rank and the step.
TEST(TrainingSignalDetectorTest, TheSupervisorRaisesItWithItsKindsPolicy) {
  for (const Action action : {Action::kLog, Action::kRestart}) {
    AgentConfig config;
    config.nproc = 2;
    config.command = {"train"};
    config.policy["non_finite"] = action;
    QuietSurroundings around;
    Supervisor supervisor(config, &around);
    SupervisedLaunch launch;
    launch.world = 2;
    launch.now_ns = 1 * kSec;
    supervisor.Launched(launch);
    std::vector<RaisedAnomaly> raised;
    std::optional<Anomaly> restart;
    for (uint64_t k = 0; k < 20; ++k) {
      for (int r = 0; r < 2; ++r) {
        Event e;
        e.time_ns = (2 + k) * kSec;
        e.type = EventType::kScalar;
        e.comm = trace::kLossScalar;
        e.step = k;
        const double v = r == 0 && k == 12 ? kInf : 1.0;
        std::memcpy(&e.aux, &v, sizeof(v));
        supervisor.Observe(r, e);
      }
      PollInput in;
      in.now_ns = (2 + k) * kSec + 5 * kMs;
      PollDecision d = supervisor.Poll(in);
      raised.insert(raised.end(), d.raised.begin(), d.raised.end());
      if (d.restart && !restart) restart = d.restart;
    }
    ASSERT_EQ(raised.size(), 1u);
    EXPECT_EQ(raised[0].action, action);
    EXPECT_EQ(raised[0].record["kind"], "non_finite");
    EXPECT_EQ(raised[0].record["step"], 12);
    EXPECT_EQ(raised[0].record["ranks"], nlohmann::json::array({0}));
    EXPECT_EQ(raised[0].record["policy"], ActionName(action));
    EXPECT_EQ(restart.has_value(), action == Action::kRestart);
  }
}

}  // namespace training_signal_detector_test
}  // namespace lifeline::agent
