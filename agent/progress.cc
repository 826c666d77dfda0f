#include "agent/progress.h"

#include <cstdlib>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace lifeline::agent {

std::vector<RankProgress> SummarizeProgress(const Timeline& timeline, int node, uint64_t now_ns) {
  std::vector<RankProgress> out;
  for (int r = 0; r < timeline.world(); ++r) {
    const RankTimeline& v = timeline.rank(r);
    RankProgress p;
    p.rank = timeline.GlobalRank(r);
    p.node = node;
    p.alive = v.alive;
    p.step = v.step == trace::kNoStep ? -1 : static_cast<int64_t>(v.step);
    p.silent_seconds = v.last_event_ns != 0 && now_ns > v.last_event_ns ? (now_ns - v.last_event_ns) * 1e-9 : 0;
    for (const auto& [comm, seq] : v.last_begun) {
      CommProgress c;
      c.begun = seq;
      const auto open = v.open.find(comm);
      if (open != v.open.end() && !open->second.empty()) {
        const auto& [oldest, o] = *open->second.begin();
        c.open = static_cast<int64_t>(oldest);
        c.posted = o.posted;
        c.op = static_cast<int>(o.op);
        c.open_seconds = now_ns > o.begin_ns ? (now_ns - o.begin_ns) * 1e-9 : 0;
      }
      p.comms[comm] = c;
      // Its newest ended collectives on this communicator.
      const std::map<uint64_t, CollectiveRecord>* records = timeline.Collectives(comm);
      if (records == nullptr) continue;
      std::vector<CollectiveSample> samples;
      for (auto it = records->rbegin(); it != records->rend() && samples.size() < kSamplesPerComm; ++it) {
        const CollectiveRecord& rec = it->second;
        const size_t i = static_cast<size_t>(r);
        if (i >= rec.end_ns.size() || rec.end_ns[i] == 0 || rec.begin_ns[i] == 0) continue;
        auto ago = [&](uint64_t t) { return now_ns > t ? (now_ns - t) * 1e-9 : 0.0; };
        CollectiveSample s;
        s.comm = comm;
        s.seq = it->first;
        s.op = static_cast<int>(rec.op);
        s.begin_ago = ago(rec.begin_ns[i]);
        s.posted_ago = rec.posted_ns[i] != 0 ? ago(rec.posted_ns[i]) : -1;
        s.end_ago = ago(rec.end_ns[i]);
        samples.push_back(s);
      }
      p.recent.insert(p.recent.end(), samples.rbegin(), samples.rend());
    }
    out.push_back(std::move(p));
  }
  return out;
}

int64_t UnixMillisNow() {
  // LIFELINE_TEST_CLOCK_OFFSET_MS shifts this agent's wall clock, as a node whose clock is off
  // would have it (the skew tests; read once).
  static const int64_t offset = [] {
    const char* v = std::getenv("LIFELINE_TEST_CLOCK_OFFSET_MS");
    return v != nullptr ? std::strtoll(v, nullptr, 10) : int64_t{0};
  }();
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
             .count() +
         offset;
}

std::string EncodeProgress(const std::vector<RankProgress>& ranks, int64_t unix_ms) {
  nlohmann::json out = nlohmann::json::array();
  for (const RankProgress& p : ranks) {
    nlohmann::json comms = nlohmann::json::object();
    for (const auto& [comm, c] : p.comms)
      comms[std::to_string(comm)] = {c.begun, c.open, c.posted ? 1 : 0, c.op, static_cast<int64_t>(c.open_seconds * 1000)};
    nlohmann::json recent = nlohmann::json::array();
    auto us = [](double s) { return s < 0 ? int64_t{-1} : static_cast<int64_t>(s * 1e6); };
    for (const CollectiveSample& s : p.recent)
      recent.push_back({s.comm, s.seq, s.op, us(s.begin_ago), us(s.posted_ago), us(s.end_ago)});
    out.push_back(
        {p.rank, p.node, p.alive ? 1 : 0, p.step, static_cast<int64_t>(p.silent_seconds * 1000), comms, recent});
  }
  return nlohmann::json({{"t", unix_ms}, {"r", out}}).dump();
}

namespace {

// A value outside what EncodeProgress writes (formats/SPEC.md §17); thrown by the readers below and
// caught with nlohmann's own exceptions.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Times and ages: at most 2^50 in their unit (ms or µs: 35 years in µs), so that no later sum,
// product or conversion to nanoseconds leaves its type.
constexpr int64_t kMaxTime = int64_t{1} << 50;

// The integer `j` (JSON's integers only: not a fraction, not a boolean), within [lo, hi].
int64_t Int(const nlohmann::json& j, int64_t lo, int64_t hi, const char* field) {
  if (!j.is_number_integer()) throw Refused(std::string(field) + " is not an integer");
  if (j.is_number_unsigned() ? j.get<uint64_t>() > static_cast<uint64_t>(hi)
                             : j.get<int64_t>() < lo || j.get<int64_t>() > hi)
    throw Refused(std::string(field) + " " + j.dump() + " is out of range");
  return j.get<int64_t>();
}

uint64_t Unsigned(const nlohmann::json& j, const char* field) {
  if (!j.is_number_unsigned()) throw Refused(std::string(field) + " is not an unsigned integer");
  return j.get<uint64_t>();
}

const nlohmann::json& Array(const nlohmann::json& j, size_t min_size, const char* field) {
  if (!j.is_array() || j.size() < min_size) throw Refused(std::string(field) + " is not an array of " +
                                                          std::to_string(min_size) + " or more");
  return j;
}

// A communicator id as the encoder spells it: decimal, no sign, no leading zero, within uint32.
uint32_t CommId(const std::string& key) {
  uint32_t id = 0;
  const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
  if (ec != std::errc() || end != key.data() + key.size() || key != std::to_string(id))
    throw Refused("communicator id \"" + key.substr(0, 32) + "\"");
  return id;
}

}  // namespace

Result<std::vector<RankProgress>> DecodeProgress(std::string_view text, const std::string& what, int64_t now_unix_ms) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(what, "not a progress summary of lifeline-agent");
  std::vector<RankProgress> out;
  try {
    const int64_t t = Int(j.at("t"), 0, kMaxTime, "t");
    const double transit = now_unix_ms > t ? static_cast<double>(now_unix_ms - t) * 1e-3 : 0;
    for (const nlohmann::json& r : Array(j.at("r"), 0, "r")) {
      Array(r, 6, "a rank");
      RankProgress p;
      p.rank = static_cast<int>(Int(r[0], 0, INT32_MAX, "rank"));
      p.node = static_cast<int>(Int(r[1], 0, INT32_MAX, "node"));
      p.alive = Int(r[2], 0, 1, "alive") != 0;
      p.step = std::max<int64_t>(-1, Int(r[3], INT64_MIN, INT64_MAX, "step"));  // negative: none
      p.silent_seconds = static_cast<double>(Int(r[4], 0, kMaxTime, "silent_ms")) * 1e-3 + transit;
      p.summary_age_seconds = transit;
      if (!r[5].is_object()) throw Refused("communicators are not an object");
      for (const auto& [comm, c] : r[5].items()) {
        Array(c, 4, "a communicator");
        CommProgress cp;
        cp.begun = Unsigned(c[0], "begun");
        cp.open = std::max<int64_t>(-1, Int(c[1], INT64_MIN, INT64_MAX, "open"));  // negative: none
        cp.posted = Int(c[2], 0, 1, "posted") != 0;
        cp.op = static_cast<int>(Int(c[3], 0, UINT16_MAX, "op"));
        cp.open_seconds = cp.open >= 0 ? static_cast<double>(Int(c.at(4), 0, kMaxTime, "open_ms")) * 1e-3 + transit : 0;
        p.comms[CommId(comm)] = cp;
      }
      if (r.size() > 6) {
        for (const nlohmann::json& x : Array(r[6], 0, "recent")) {
          Array(x, 6, "a collective");
          CollectiveSample s;
          s.comm = static_cast<uint32_t>(Int(x[0], 0, UINT32_MAX, "comm"));
          s.seq = Unsigned(x[1], "seq");
          s.op = static_cast<int>(Int(x[2], 0, UINT16_MAX, "op"));
          s.begin_ago = static_cast<double>(Int(x[3], 0, kMaxTime, "begin_us")) * 1e-6 + transit;
          const int64_t posted = Int(x[4], -1, kMaxTime, "posted_us");
          s.posted_ago = posted < 0 ? -1 : static_cast<double>(posted) * 1e-6 + transit;
          s.end_ago = static_cast<double>(Int(x[5], 0, kMaxTime, "end_us")) * 1e-6 + transit;
          p.recent.push_back(s);
        }
      }
      out.push_back(std::move(p));
    }
  } catch (const std::exception& e) {
    return Status::Corruption(what, std::string("not a progress summary of lifeline-agent: ") + e.what());
  }
  return out;
}

}  // namespace lifeline::agent
