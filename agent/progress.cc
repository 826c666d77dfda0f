#include "agent/progress.h"

#include <cstdlib>

#include <algorithm>
#include <chrono>

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

Result<std::vector<RankProgress>> DecodeProgress(std::string_view text, const std::string& what, int64_t now_unix_ms) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(what, "not a progress summary of lifeline-agent");
  std::vector<RankProgress> out;
  try {
    const double transit = std::max<int64_t>(0, now_unix_ms - j.at("t").get<int64_t>()) * 1e-3;
    for (const nlohmann::json& r : j.at("r")) {
      RankProgress p;
      p.rank = r.at(0).get<int>();
      p.node = r.at(1).get<int>();
      p.alive = r.at(2).get<int>() != 0;
      p.step = r.at(3).get<int64_t>();
      p.silent_seconds = r.at(4).get<int64_t>() * 1e-3 + transit;
      p.summary_age_seconds = transit;
      for (const auto& [comm, c] : r.at(5).items()) {
        CommProgress cp;
        cp.begun = c.at(0).get<uint64_t>();
        cp.open = c.at(1).get<int64_t>();
        cp.posted = c.at(2).get<int>() != 0;
        cp.op = c.at(3).get<int>();
        cp.open_seconds = cp.open >= 0 ? c.at(4).get<int64_t>() * 1e-3 + transit : 0;
        p.comms[static_cast<uint32_t>(std::stoul(comm))] = cp;
      }
      if (r.size() > 6) {
        for (const nlohmann::json& x : r.at(6)) {
          CollectiveSample s;
          s.comm = x.at(0).get<uint32_t>();
          s.seq = x.at(1).get<uint64_t>();
          s.op = x.at(2).get<int>();
          s.begin_ago = x.at(3).get<int64_t>() * 1e-6 + transit;
          const int64_t posted = x.at(4).get<int64_t>();
          s.posted_ago = posted < 0 ? -1 : posted * 1e-6 + transit;
          s.end_ago = x.at(5).get<int64_t>() * 1e-6 + transit;
          p.recent.push_back(s);
        }
      }
      if (p.rank < 0) return Status::Corruption(what, "a negative rank");
      out.push_back(std::move(p));
    }
  } catch (const std::exception& e) {
    return Status::Corruption(what, std::string("not a progress summary of lifeline-agent: ") + e.what());
  }
  return out;
}

}  // namespace lifeline::agent
