// How anomalies spell their numbers: what a person reads in the events log and on stderr.
#include "agent/detectors/evidence.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

namespace lifeline::agent::detail {
namespace evidence_test {

TEST(EvidenceTest, DurationsInMillisecondsBelowASecond) {
  EXPECT_EQ(Duration(0.0402), "40.2 ms");
  EXPECT_EQ(Duration(5.24), "5.2 s");
  EXPECT_EQ(Duration(kNaN), "?");
}

TEST(EvidenceTest, RanksAndSteps) {
  EXPECT_EQ(Ranks({2}), "rank 2");
  EXPECT_EQ(Ranks({0, 1, 3}), "ranks 0,1,3");
  EXPECT_EQ(StepSuffix(7), " at step 7");
  EXPECT_EQ(StepSuffix(trace::kNoStep), "");
  EXPECT_FALSE(KnownStep(trace::kNoStep).has_value());
}

TEST(EvidenceTest, GlobalRanksOfANodeOfALargerJob) {
  Timeline t;
  t.Reset(4, /*rank_base=*/8);
  EXPECT_EQ(GlobalRanks(t, {0, 2, 3}), (std::vector<int>{8, 10, 11}));
  EXPECT_EQ(Ranks(GlobalRanks(t, {1})), "rank 9");
  EXPECT_TRUE(GlobalRanks(t, {}).empty());
}

TEST(EvidenceTest, MedianAndRobustSigma) {
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(Median({4, 1, 2, 3}), 2.5);
  EXPECT_TRUE(std::isnan(Median({})));
  // Identical timings: the MAD floor keeps the spread finite.
  EXPECT_GT(RobustSigma({1, 1, 1}, 1), 0);
  EXPECT_TRUE(Number(kNaN).is_null());
}

}  // namespace evidence_test
}  // namespace lifeline::agent::detail
