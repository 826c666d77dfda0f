// libFuzzer target: arbitrary bytes as the training-signal events a trace ring may hold (formats/SPEC.md
// §15, kScalar and kScalarName), read by the agent: DecodeScalarName, FormatEventJson and the
// TrainingSignalDetector over a timeline of four ranks, polled as the agent polls. It must never
// crash or let an exception out; every anomaly names ranks of the job, ascending, and a step; its
// evidence serialises as JSON; a name the decoder accepts is one RegisterScalar takes.
//
// Input: records of 65 bytes: one byte (the rank, modulo 4; bit 7: poll after this event, 2 s
// later) and the 64 bytes of an event as the ring holds it. Seeds (tests/fuzz/corpus/training_signal/):
// a rank naming a scalar and reporting it, a NaN loss, a spike after warm-up, replicas disagreeing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "agent/detectors/training_signal_detector.h"
#include "agent/timeline.h"
#include "lifeline/internal/trace_ring.h"
#include "agent/detectors/replica_digest_detector.h"
#include "lifeline/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lifeline;
  constexpr int kWorld = 4;
  constexpr size_t kRecord = 1 + sizeof(trace::Event);
  agent::TrainingSignalConfig config;
  config.window = 5;        // verdicts within a short input
  config.warmup_steps = 3;
  config.spike_confirm = 2;
  config.watched.push_back("x");
  config.replicated.push_back("loss");
  config.replica_group_size = static_cast<uint32_t>(size % 3);
  agent::TrainingSignalDetector detector(config);
  agent::ReplicaDigestDetector digests(/*hold_seconds=*/5);  // replica_digest, replica_name (SPEC §15)
  digests.Reset(kWorld);
  agent::Timeline timeline;
  timeline.Reset(kWorld, /*rank_base=*/8);
  detector.Reset(kWorld);
  uint64_t now = 1'000'000'000;
  std::vector<agent::Anomaly> found;
  for (size_t at = 0; at + kRecord <= size; at += kRecord) {
    const int rank = data[at] % kWorld;
    trace::Event e;
    std::memcpy(&e, data + at + 1, sizeof(e));
    char line[512];
    const size_t n = trace::FormatEventJson(e, rank, line, sizeof(line));
    if (n >= sizeof(line) || std::strlen(line) != n) std::abort();
    Result<std::string> name = trace::DecodeScalarName(e);
    if (name.ok()) {
      Result<uint32_t> id = trace::RegisterScalar(*name);  // the same rules both ways (or the table is full)
      if (!id.ok() && id.status().code() != StatusCode::kResourceExhausted) std::abort();
    }
    const agent::TimelineChange change = timeline.Apply(rank, e);
    if (change.rank >= 0) detector.Observe(timeline, change);
    if (change.rank >= 0) digests.Observe(timeline, change);
    if ((data[at] & 0x80) != 0) {
      now += 2'000'000'000;
      detector.Poll(timeline, now, &found);
      digests.Poll(timeline, now, &found);
    }
  }
  detector.Poll(timeline, now + 3'600'000'000'000ull, &found);
  digests.Poll(timeline, now + 3'600'000'000'000ull, &found);
  for (const agent::Anomaly& a : found) {
    if (a.ranks.empty() || !a.step) std::abort();
    for (size_t i = 0; i < a.ranks.size(); ++i)
      if (a.ranks[i] < 8 || a.ranks[i] >= 8 + kWorld || (i > 0 && a.ranks[i] <= a.ranks[i - 1])) std::abort();
    const std::string text = a.evidence.dump();  // throws on bytes that are not UTF-8
    if (text.empty() || a.message.empty()) std::abort();
  }
  return 0;
}
