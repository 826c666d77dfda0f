#include "agent/detectors/evidence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

namespace lifeline::agent::detail {
namespace {

constexpr double kMadScale = 1.4826;       // MAD to standard deviation, for normal data
constexpr double kMadFloorSeconds = 1e-4;  // identical timings must not give an infinite z

double Mad(const std::vector<double>& v, double median) {
  std::vector<double> dev;
  dev.reserve(v.size());
  for (double x : v) dev.push_back(std::fabs(x - median));
  return Median(std::move(dev));
}

}  // namespace

double Seconds(uint64_t ns) { return static_cast<double>(ns) / 1e9; }
double SecondsBetween(uint64_t from, uint64_t to) { return to > from ? Seconds(to - from) : 0.0; }

uint64_t Nanos(double seconds) {
  if (!(seconds > 0)) return 0;
  if (seconds >= 1.8e10) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(seconds * 1e9);
}

double Median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return (lower + upper) / 2;
}

double RobustSigma(const std::vector<double>& v, double median) {
  return kMadScale * std::max(Mad(v, median), kMadFloorSeconds);
}

nlohmann::json Number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

std::string Fmt(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, x);
  return buf;
}

std::string Duration(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  return std::fabs(seconds) < 1 ? Fmt("%.1f ms", seconds * 1e3) : Fmt("%.1f s", seconds);
}

std::vector<int> GlobalRanks(const Timeline& timeline, const std::vector<int>& local) {
  std::vector<int> out;
  out.reserve(local.size());
  for (int r : local) out.push_back(timeline.GlobalRank(r));
  return out;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

std::string Ranks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + RankList(ranks);
}

std::string StepSuffix(uint64_t step) { return step == trace::kNoStep ? "" : " at step " + std::to_string(step); }

std::optional<uint64_t> KnownStep(uint64_t step) {
  return step == trace::kNoStep ? std::nullopt : std::optional<uint64_t>(step);
}

}  // namespace lifeline::agent::detail
