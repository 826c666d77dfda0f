// The job-wide hang verdict over every node's progress summary: the rank that holds a collective
// up is named wherever it runs.
#include "agent/detectors/job_hang_detector.h"

#include <gtest/gtest.h>

namespace lifeline::agent {
namespace job_hang_detector_test {

constexpr uint64_t kS = 1000000000;

// Rank `rank` on `node` at seq `begun` of comm `comm`, still in `open` (-1: not in any).
RankProgress Rank(int rank, int node, uint64_t begun, int64_t open, bool posted = true, uint32_t comm = 0) {
  RankProgress p;
  p.rank = rank;
  p.node = node;
  p.comms[comm] = CommProgress{begun, open, posted, static_cast<int>(trace::Op::kAllReduce)};
  return p;
}

TEST(JobHangDetectorTest, NamesTheRankOnAnotherNodeThatNeverJoined) {
  JobHangDetector d(5.0);
  // Node 0's ranks 0 and 1 and node 1's rank 2 wait in allreduce #110; rank 3 stopped at #109.
  const std::vector<RankProgress> job = {Rank(0, 0, 110, 110), Rank(1, 0, 110, 110), Rank(2, 1, 110, 110),
                                         Rank(3, 1, 109, -1)};
  std::vector<Anomaly> out;
  d.Poll(job, 100 * kS, &out);
  d.Poll(job, 105 * kS, &out);
  EXPECT_TRUE(out.empty()) << "not before the timeout";
  d.Poll(job, 105 * kS + 1, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, "hang");
  EXPECT_EQ(out[0].ranks, std::vector<int>({3}));
  EXPECT_EQ(out[0].seq, 110u);
  EXPECT_EQ(out[0].comm, 0u);
  EXPECT_EQ(out[0].evidence["verdict"], "never_joined");
  EXPECT_EQ(out[0].evidence["waiting_ranks"], nlohmann::json::array({0, 1, 2}));
  EXPECT_EQ(out[0].message.rfind("rank 3 never joined allreduce #110 (comm 0); ranks 0,1,2 waited 5.0 s", 0), 0u)
      << out[0].message;
  d.Poll(job, 200 * kS, &out);
  EXPECT_EQ(out.size(), 1u) << "one report per collective";
}

// A node that vanished leaves its last summary in etcd until its lease runs out: its ranks look as
// if they never joined the next collective. While their summary is stale the verdict is held, for
// the lease to name the node lost; a node whose summaries keep coming is judged at once, and one
// stale for longer than the hold is judged after all.
TEST(JobHangDetectorTest, CulpritsWhoseSummaryStoppedComingAreLeftToTheirLease) {
  JobHangDetector d(5.0, /*stale_hold_seconds=*/12.0);
  std::vector<RankProgress> job = {Rank(0, 0, 110, 110), Rank(1, 0, 110, 110), Rank(2, 1, 109, -1),
                                   Rank(3, 1, 109, -1)};
  std::vector<Anomaly> out;
  for (int s = 0; s <= 11; ++s) {
    job[2].summary_age_seconds = job[3].summary_age_seconds = s;  // node 1 published nothing since
    d.Poll(job, (100 + s) * kS, &out);
  }
  EXPECT_TRUE(out.empty()) << "a node gone quiet was called hung before its lease could run out";
  job[2].summary_age_seconds = job[3].summary_age_seconds = 12.5;
  d.Poll(job, 112 * kS + kS / 2, &out);
  ASSERT_EQ(out.size(), 1u) << "held beyond the hold";
  EXPECT_EQ(out[0].ranks, std::vector<int>({2, 3}));

  JobHangDetector fresh(5.0, 12.0);
  out.clear();
  job[2].summary_age_seconds = job[3].summary_age_seconds = 1.0;  // node 1's agent still publishes
  fresh.Poll(job, 100 * kS, &out);
  fresh.Poll(job, 105 * kS + 1, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>({2, 3}));
}

// Issue 32, item 10: node 1's ranks ended allreduce #110 on their side and their machine went;
// node 0's ranks wait in it, every member having joined, and were blamed ("no rank stands out")
// before node 1's lease ran out. A stale member holds the verdict as a stale culprit does.
TEST(JobHangDetectorTest, WaitingRanksAreNotBlamedWhileAMemberSummaryStoppedComing) {
  JobHangDetector d(5.0, /*stale_hold_seconds=*/12.0);
  std::vector<RankProgress> job = {Rank(0, 0, 110, 110), Rank(1, 0, 110, 110), Rank(2, 1, 110, -1),
                                   Rank(3, 1, 110, -1)};
  std::vector<Anomaly> out;
  for (int s = 0; s <= 11; ++s) {
    job[2].summary_age_seconds = job[3].summary_age_seconds = s;
    d.Poll(job, (100 + s) * kS, &out);
  }
  EXPECT_TRUE(out.empty()) << out[0].message;
  job[2].summary_age_seconds = job[3].summary_age_seconds = 12.5;
  d.Poll(job, 112 * kS + kS / 2, &out);
  ASSERT_EQ(out.size(), 1u) << "judged once the hold is over";
  EXPECT_EQ(out[0].ranks, std::vector<int>({0, 1}));
}

// A node that went before its first summary reached the leader: its ranks were not members at all,
// and the ranks waiting for them were "every member joined". They are the world's members still.
TEST(JobHangDetectorTest, RanksNeverReadAreMembersOfTheWorld) {
  JobHangDetector d(5.0, /*stale_hold_seconds=*/12.0);
  d.Reset(4);
  const std::vector<RankProgress> job = {Rank(0, 0, 110, 110), Rank(1, 0, 110, 110)};
  std::vector<Anomaly> out;
  for (int s = 0; s <= 11; ++s) d.Poll(job, (100 + s) * kS, &out);
  EXPECT_TRUE(out.empty()) << out[0].message;
  d.Poll(job, 112 * kS + kS / 2, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>({2, 3}));
  EXPECT_EQ(out[0].evidence["verdict"], "never_joined");
}

TEST(JobHangDetectorTest, TheRanksOwnTimeInTheCollectiveCountsNotOnlyWhenTheLeaderSawIt) {
  JobHangDetector d(5.0);
  std::vector<RankProgress> job = {Rank(0, 0, 110, 110), Rank(1, 1, 109, -1)};
  job[0].comms[0].open_seconds = 5.5;  // in it for 5.5 s when the leader first reads the summary
  std::vector<Anomaly> out;
  d.Poll(job, 100 * kS, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>({1}));
  EXPECT_NEAR(out[0].evidence["waited_seconds"].get<double>(), 5.5, 1e-9);
}

TEST(JobHangDetectorTest, AFrontThatMovesIsNoHangAndDeadRanksAreNotMembers) {
  JobHangDetector d(5.0);
  std::vector<Anomaly> out;
  for (uint64_t k = 0; k < 20; ++k) {
    std::vector<RankProgress> job = {Rank(0, 0, 10 + k, static_cast<int64_t>(10 + k)), Rank(1, 1, 9 + k, -1)};
    d.Poll(job, k * 4 * kS, &out);  // the laggard keeps up, one collective behind
  }
  EXPECT_TRUE(out.empty());
  std::vector<RankProgress> job = {Rank(0, 0, 50, 50), Rank(1, 1, 49, -1)};
  job[1].alive = false;  // a dead rank is the dead-rank detector's
  d.Poll(job, 200 * kS, &out);
  d.Poll(job, 300 * kS, &out);
  EXPECT_TRUE(out.empty());
}

TEST(JobHangDetectorTest, NamesTheRankThatNeverPostedAndOtherwiseNoOne) {
  JobHangDetector d(5.0);
  std::vector<Anomaly> out;
  const std::vector<RankProgress> unposted = {Rank(0, 0, 8, 8), Rank(1, 0, 8, 8), Rank(2, 1, 8, 8, false)};
  d.Poll(unposted, 0, &out);
  d.Poll(unposted, 6 * kS, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>({2}));
  EXPECT_EQ(out[0].evidence["verdict"], "never_posted");

  JobHangDetector all(5.0);
  out.clear();
  const std::vector<RankProgress> stuck = {Rank(0, 0, 8, 8), Rank(1, 1, 8, 8)};
  all.Poll(stuck, 0, &out);
  all.Poll(stuck, 6 * kS, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>({0, 1}));
  EXPECT_EQ(out[0].evidence["verdict"], "all_joined");
  EXPECT_NE(out[0].message.find("no rank stands out"), std::string::npos);
}

TEST(JobHangDetectorTest, ASubgroupsMembersAreTheRanksThatReportIt) {
  JobHangDetector d(5.0);
  std::vector<Anomaly> out;
  // Comm 7 is ranks 2 and 3 (on two nodes); ranks 0 and 1 never use it and are not to blame.
  std::vector<RankProgress> job = {Rank(0, 0, 40, -1), Rank(1, 0, 40, -1), Rank(2, 1, 40, -1), Rank(3, 2, 40, -1)};
  job[2].comms[7] = CommProgress{3, 3, true, 0};
  job[3].comms[7] = CommProgress{2, -1, true, 0};
  d.Poll(job, 0, &out);
  d.Poll(job, 6 * kS, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].comm, 7u);
  EXPECT_EQ(out[0].ranks, std::vector<int>({3}));
}


// A node whose lease ran out is no longer read: its ranks vanish from the summaries while everyone
// else waits in the collective they never joined. That is not "every member joined, no rank stands
// out" naming the whole job (node_lost names the node): the missing ranks are still members, held
// like a summary that stopped coming, and named only if they outlive the hold.
TEST(JobHangDetectorTest, RanksMissingFromTheReadAreMembersNotEveryoneElse) {
  JobHangDetector d(5.0, /*stale_hold_seconds=*/12.0);
  std::vector<RankProgress> job = {Rank(0, 0, 110, 110), Rank(1, 0, 110, 110), Rank(2, 1, 109, -1),
                                   Rank(3, 1, 109, -1)};
  std::vector<Anomaly> out;
  for (int s = 0; s <= 9; ++s) {
    job[2].summary_age_seconds = job[3].summary_age_seconds = s;  // node 1 published nothing since
    d.Poll(job, (100 + s) * kS, &out);
  }
  const std::vector<RankProgress> left = {job[0], job[1]};  // node 1's lease ran out
  d.Poll(left, 110 * kS, &out);
  d.Poll(left, 111 * kS, &out);
  EXPECT_TRUE(out.empty()) << out[0].message;
  d.Poll(left, 113 * kS, &out);  // node 1's last summary is 13 s old: beyond the hold
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].ranks, std::vector<int>({2, 3}));
  EXPECT_EQ(out[0].evidence["verdict"], "never_joined");

  // Missing from one read with a fresh summary before: not known to have joined either.
  JobHangDetector fresh(5.0, 12.0);
  out.clear();
  job[2].summary_age_seconds = job[3].summary_age_seconds = 0.5;
  fresh.Poll(job, 100 * kS, &out);
  fresh.Poll(left, 106 * kS, &out);
  EXPECT_TRUE(out.empty()) << out[0].message;
}

}  // namespace job_hang_detector_test
}  // namespace lifeline::agent
