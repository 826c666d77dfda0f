#include "agent/progress.h"

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
    }
    out.push_back(std::move(p));
  }
  return out;
}

int64_t UnixMillisNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string EncodeProgress(const std::vector<RankProgress>& ranks, int64_t unix_ms) {
  nlohmann::json out = nlohmann::json::array();
  for (const RankProgress& p : ranks) {
    nlohmann::json comms = nlohmann::json::object();
    for (const auto& [comm, c] : p.comms)
      comms[std::to_string(comm)] = {c.begun, c.open, c.posted ? 1 : 0, c.op, static_cast<int64_t>(c.open_seconds * 1000)};
    out.push_back({p.rank, p.node, p.alive ? 1 : 0, p.step, static_cast<int64_t>(p.silent_seconds * 1000), comms});
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
      for (const auto& [comm, c] : r.at(5).items()) {
        CommProgress cp;
        cp.begun = c.at(0).get<uint64_t>();
        cp.open = c.at(1).get<int64_t>();
        cp.posted = c.at(2).get<int>() != 0;
        cp.op = c.at(3).get<int>();
        cp.open_seconds = cp.open >= 0 ? c.at(4).get<int64_t>() * 1e-3 + transit : 0;
        p.comms[static_cast<uint32_t>(std::stoul(comm))] = cp;
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
