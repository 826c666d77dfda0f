// The numbers and words of an anomaly, shared by the detectors: robust statistics over timings
// (median, MAD) and the spelling of durations, rank lists and steps in messages, so every
// detector says "rank 2", "40.2 ms" and " at step 7" the same way.
//
// Ranks: detectors work with the timeline's local indices, but an anomaly names the job's global
// ranks (its `ranks`, message and evidence), since that is what a person and the other nodes know.
// A detector converts once, with GlobalRanks or Timeline::GlobalRank, where it builds the anomaly;
// the helpers below spell whatever ranks they are given.
#ifndef LIFELINE_AGENT_DETECTORS_EVIDENCE_H_
#define LIFELINE_AGENT_DETECTORS_EVIDENCE_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/timeline.h"
#include "lifeline/trace.h"

namespace lifeline::agent::detail {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double Seconds(uint64_t ns);
double SecondsBetween(uint64_t from, uint64_t to);  // 0 when `to` is not after `from`
uint64_t Nanos(double seconds);                     // 0 for non-positive, saturating

double Median(std::vector<double> v);               // NaN when empty
// 1.4826 x MAD around `median` (a standard deviation for normal data), the MAD floored at 0.1 ms
// so identical timings do not divide by zero.
double RobustSigma(const std::vector<double>& v, double median);

// JSON has no NaN: an unknown number is null.
nlohmann::json Number(double x);
std::string Fmt(const char* format, double x);
std::string Duration(double seconds);               // "40.2 ms", "5.2 s", "?"
// `local` ranks of `timeline` as the job's ranks; ascending stays ascending.
std::vector<int> GlobalRanks(const Timeline& timeline, const std::vector<int>& local);
std::string RankList(const std::vector<int>& ranks);  // "0,1,3"
std::string Ranks(const std::vector<int>& ranks);     // "rank 2", "ranks 0,1,3"
std::string StepSuffix(uint64_t step);                // " at step 7", "" for kNoStep
std::optional<uint64_t> KnownStep(uint64_t step);     // nullopt for kNoStep

}  // namespace lifeline::agent::detail

#endif  // LIFELINE_AGENT_DETECTORS_EVIDENCE_H_
