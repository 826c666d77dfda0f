// What every detector test does on top of the simulator (event_simulator.h): generate a stream from
// a Sim, hand it to a Driver for the detectors under test and poll past its end. SimDriver does that
// in one line, so a test states its scenario and its detectors and goes straight to what they
// report. Test support only: header-only, included by the detector tests.
#ifndef LIFELINE_AGENT_DETECTORS_DETECTOR_TEST_KIT_H_
#define LIFELINE_AGENT_DETECTORS_DETECTOR_TEST_KIT_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "agent/detector.h"
#include "agent/detectors/event_simulator.h"
#include "agent/supervisor.h"

namespace lifeline::agent::simulation {

// A Supervisor's surroundings where nothing happens: an idle host, no other node, no etcd.
class QuietSurroundings : public Surroundings {
 public:
  HostCpu SampleHostCpu() override { return {}; }
  Status ReportFailure(uint64_t, uint64_t) override { return Status::OK(); }
  Result<bool> FailedEarlierElsewhere(uint64_t, uint64_t) override { return false; }
  Result<std::vector<std::string>> NodesWithoutFailure(uint64_t, const std::vector<std::string>&) override {
    return std::vector<std::string>{};
  }
};

// `steps` steps in which `rank` stops short at `step` the way `stall` says; the rest as Sim has it.
inline Sim StalledSim(int steps, Stall stall, int rank, int step) {
  Sim sim;
  sim.steps = steps;
  sim.stall = stall;
  sim.stall_rank = rank;
  sim.stall_step = step;
  return sim;
}

// A Driver for sim.ranks ranks (the job's ranks sim.rank_base..), loaded with the stream `sim` generates and keeping it, so that a
// test can poll relative to its end (RunPast) or look into it (stream()).
class SimDriver : public Driver {
 public:
  // The agent's five detectors, as MakeDetectors gives them for sim.ranks ranks.
  explicit SimDriver(const Sim& sim) : SimDriver(sim, MakeDetectors(Config(sim.ranks))) {}
  // Detectors handed over, kept alive as long as this.
  SimDriver(const Sim& sim, std::vector<std::unique_ptr<Detector>> owned)
      : Driver(&owned, sim.ranks, sim.rank_base), owned_(std::move(owned)) {  // moving keeps the detectors where they are
    Play(sim);
  }
  // Detectors owned by the caller, which must outlive this.
  SimDriver(const Sim& sim, std::vector<Detector*> detectors)
      : Driver(std::move(detectors), sim.ranks, sim.rank_base) {
    Play(sim);
  }

  // Generates `sim`'s stream and loads it in place of the current one, to be played from now on.
  void Play(const Sim& sim) { Load(Generate(sim)); }
  // Driver::Load, remembering the stream for RunPast and stream().
  void Load(Stream stream) {
    stream_ = stream;
    Driver::Load(std::move(stream));
  }
  // Polls until `tail` after the stream's last event.
  void RunPast(uint64_t tail) { RunUntil(LastTime(stream_) + tail); }
  // Polls until `until`, as RunUntil; returns the time of the first poll that found an anomaly, 0
  // when none did.
  uint64_t FirstFoundBy(uint64_t until) {
    uint64_t first = 0;
    RunUntil(until, [&first](uint64_t now, const std::vector<Anomaly>& found) {
      if (!found.empty() && first == 0) first = now;
    });
    return first;
  }
  const Stream& stream() const { return stream_; }

 private:
  std::vector<std::unique_ptr<Detector>> owned_;
  Stream stream_;
};

}  // namespace lifeline::agent::simulation

#endif  // LIFELINE_AGENT_DETECTORS_DETECTOR_TEST_KIT_H_
