// libFuzzer target: arbitrary bytes as a node's progress summary as the leader receives it (formats/SPEC.md
// §17, binary or JSON) into DecodeProgress. It must never crash or let an exception out; whatever it accepts must
// lie within the spec's bounds (no negative rank, node or age, an op of 16 bits), and encode again
// to a summary it reads back the same: every integer equal, every age within the unit it is
// written in.
//
// Seeds (tests/fuzz/corpus/progress_summary/): a binary summary of two ranks (one that follows
// another, an open collective, ended ones with and without a post), and JSON ones (§17.1) as the
// agents wrote them for a small timeline (two ranks, an open collective, ended ones with and without
// a post), an empty summary and a rank of the older six-element form.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "agent/progress.h"

namespace {

using lifeline::agent::CollectiveSample;
using lifeline::agent::CommProgress;
using lifeline::agent::RankProgress;

bool Age(double s) { return std::isfinite(s) && s >= 0; }

bool Near(double a, double b, double unit) { return std::abs(a - b) <= unit + 1e-9 * std::abs(a); }

void CheckBounds(const std::vector<RankProgress>& ranks) {
  for (const RankProgress& p : ranks) {
    if (p.rank < 0 || p.node < 0 || p.step < -1 || !Age(p.silent_seconds) || !Age(p.summary_age_seconds)) std::abort();
    for (const auto& [comm, c] : p.comms)
      if (c.open < -1 || c.op < 0 || c.op > 65535 || !Age(c.open_seconds) || (c.open < 0 && c.open_seconds != 0))
        std::abort();
    for (const CollectiveSample& s : p.recent)
      if (s.op < 0 || s.op > 65535 || !Age(s.begin_ago) || !Age(s.end_ago) || !(s.posted_ago == -1 || Age(s.posted_ago)))
        std::abort();
  }
}

void CheckSame(const std::vector<RankProgress>& a, const std::vector<RankProgress>& b) {
  if (a.size() != b.size()) std::abort();
  for (size_t i = 0; i < a.size(); ++i) {
    const RankProgress &x = a[i], &y = b[i];
    if (x.rank != y.rank || x.node != y.node || x.alive != y.alive || x.step != y.step ||
        !Near(x.silent_seconds, y.silent_seconds, 1e-3) || x.comms.size() != y.comms.size() ||
        x.recent.size() != y.recent.size())
      std::abort();
    for (const auto& [comm, c] : x.comms) {
      auto it = y.comms.find(comm);
      if (it == y.comms.end()) std::abort();
      const CommProgress& d = it->second;
      if (c.begun != d.begun || c.open != d.open || c.posted != d.posted || c.op != d.op ||
          !Near(c.open_seconds, d.open_seconds, 1e-3))
        std::abort();
    }
    for (size_t k = 0; k < x.recent.size(); ++k) {
      const CollectiveSample &s = x.recent[k], &t = y.recent[k];
      if (s.comm != t.comm || s.seq != t.seq || s.op != t.op || !Near(s.begin_ago, t.begin_ago, 1e-6) ||
          !Near(s.end_ago, t.end_ago, 1e-6) || (s.posted_ago < 0) != (t.posted_ago < 0) ||
          !Near(s.posted_ago, t.posted_ago, 1e-6))
        std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lifeline::agent::DecodeProgress;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // Read 1.5 s after it was written, as a leader reads; then as of its own time (no transit), which
  // its encoding must give back.
  const auto late = DecodeProgress(text, "fuzz", 1'700'000'001'500);
  if (late.ok()) CheckBounds(*late);
  const auto ranks = DecodeProgress(text, "fuzz", 0);
  if (ranks.ok() != late.ok()) std::abort();
  if (!ranks.ok()) return 0;
  CheckBounds(*ranks);
  const auto again = DecodeProgress(lifeline::agent::EncodeProgress(*ranks, 0), "fuzz", 0);
  if (!again.ok()) std::abort();
  CheckSame(*ranks, *again);
  // A version 3 summary's digest folds and details: within their bounds, and encoded again to the
  // same bytes' meaning.
  const auto frame = lifeline::agent::DecodeSummary(text, "fuzz", 0);
  if (!frame.ok()) std::abort();
  for (const auto& f : frame->folds)
    if (f.rank < 0 || f.shards == 0 || f.expect < 2) std::abort();
  for (const auto& d : frame->details) {
    if (d.rank < 0) std::abort();
    for (const auto& e : d.shards)
      if (e.replicas < 2 || e.name.size() > 4096) std::abort();
  }
  for (const auto& v : frame->values)
    if (v.scalar.empty() || v.scalar.size() > 256 || v.group < 0) std::abort();
  const std::string bytes = lifeline::agent::EncodeSummary(*frame);
  const auto back = lifeline::agent::DecodeSummary(bytes, "fuzz", 0);
  if (!back.ok() || back->folds.size() != frame->folds.size() || back->details.size() != frame->details.size() ||
      back->values.size() != frame->values.size())
    std::abort();
  for (size_t k = 0; k < frame->values.size(); ++k) {
    const auto &x = frame->values[k], &y = back->values[k];
    if (x.scalar != y.scalar || x.group != y.group || x.step != y.step || x.bits != y.bits) std::abort();
  }
  for (size_t k = 0; k < frame->folds.size(); ++k) {
    const auto &x = frame->folds[k], &y = back->folds[k];
    if (x.rank != y.rank || x.step != y.step || x.keyset != y.keyset || x.digest != y.digest || x.shards != y.shards ||
        x.expect != y.expect)
      std::abort();
  }
  for (size_t k = 0; k < frame->details.size(); ++k) {
    const auto &x = frame->details[k], &y = back->details[k];
    if (x.rank != y.rank || x.step != y.step || x.shards.size() != y.shards.size()) std::abort();
    for (size_t j = 0; j < x.shards.size(); ++j) {
      const auto &a = x.shards[j], &b = y.shards[j];
      if (a.key != b.key || a.digest != b.digest || a.replicas != b.replicas || a.bytes != b.bytes ||
          a.tensor_offset != b.tensor_offset || a.name != b.name)
        std::abort();
    }
  }
  return 0;
}
