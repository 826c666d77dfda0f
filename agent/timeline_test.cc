// The Timeline: what the agent knows of each rank and each collective after applying the events
// its ranks recorded, the one model that detectors, metrics and `status` read.
#include "agent/timeline.h"

#include <vector>

#include <gtest/gtest.h>

namespace lifeline::agent {
namespace timeline_test {

using trace::Event;
using trace::EventType;
using trace::Op;

constexpr uint64_t kMs = 1000000;

Event Ev(EventType type, uint64_t t_ms, uint64_t step = trace::kNoStep) {
  Event e;
  e.type = type;
  e.time_ns = t_ms * kMs;
  e.step = step;
  return e;
}

Event Coll(EventType type, uint64_t t_ms, uint64_t seq, uint32_t comm = 0, Op op = Op::kAllReduce) {
  Event e = Ev(type, t_ms, 3);
  e.seq = seq;
  e.comm = comm;
  e.op = op;
  return e;
}

// The step a launch resumed at stays the first step it began, however far the rank has gone by the
// time the agent looks (the agent's "resumed" record; a fast step may end before its poll).
TEST(TimelineTest, TheFirstStepOfALaunchIsKeptAsTheRankStepsOn) {
  Timeline t;
  t.Reset(1);
  t.Apply(0, Ev(EventType::kProcessStart, 5, 40));
  for (uint64_t step = 41; step <= 43; ++step) {
    t.Apply(0, Ev(EventType::kStepBegin, 10 * step, step));
    t.Apply(0, Ev(EventType::kStepEnd, 10 * step + 5, step));
  }
  EXPECT_EQ(t.rank(0).first_step, 41u);
  EXPECT_EQ(t.rank(0).step, 43u);
  t.Reset(1);  // a new launch
  EXPECT_FALSE(t.rank(0).began_step);
  EXPECT_EQ(t.rank(0).first_step, trace::kNoStep);
}

TEST(TimelineTest, RankStateFollowsStepsAndLifecycle) {
  Timeline t;
  t.Reset(2);
  Event start = Ev(EventType::kProcessStart, 5, 40);
  t.Apply(0, start);
  t.Apply(0, Ev(EventType::kStepBegin, 10, 41));
  const RankTimeline& r = t.rank(0);
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.resumed_from, 40u);
  EXPECT_EQ(r.step, 41u);
  EXPECT_TRUE(r.step_open);
  EXPECT_TRUE(r.began_step);
  EXPECT_FALSE(t.rank(1).began_step);

  Event end = Ev(EventType::kStepEnd, 35, 41);
  const TimelineChange c = t.Apply(0, end);
  ASSERT_TRUE(c.step_closed_ns.has_value());
  EXPECT_EQ(*c.step_closed_ns, 25 * kMs);
  EXPECT_FALSE(r.step_open);
  t.Apply(0, Ev(EventType::kHeartbeat, 50));
  EXPECT_EQ(r.last_event_ns, 50 * kMs);
  EXPECT_EQ(r.events, 4u);

  // A StepEnd with no step open closes nothing.
  EXPECT_FALSE(t.Apply(0, end).step_closed_ns.has_value());
  t.Apply(0, Ev(EventType::kProcessExit, 60));
  EXPECT_TRUE(r.finished);
  EXPECT_TRUE(r.alive);
  t.RankExited(0);
  EXPECT_FALSE(r.alive);
  EXPECT_EQ(t.alive_count(), 1);
}

TEST(TimelineTest, EventsOfRanksOutsideTheWorldAreIgnored) {
  Timeline t;
  t.Reset(2);
  EXPECT_EQ(t.Apply(2, Ev(EventType::kStepBegin, 1, 0)).rank, -1);
  EXPECT_EQ(t.Apply(-1, Ev(EventType::kStepBegin, 1, 0)).rank, -1);
  EXPECT_EQ(t.rank(0).events + t.rank(1).events, 0u);
}

TEST(TimelineTest, AnEndClosesItsCollectiveAndTheOlderOnesOfItsComm) {
  Timeline t;
  t.Reset(1);
  t.Apply(0, Coll(EventType::kCollectiveBegin, 1, 1));
  t.Apply(0, Coll(EventType::kCollectiveBegin, 2, 2));
  t.Apply(0, Coll(EventType::kCollectiveBegin, 3, 1, /*comm=*/7));
  t.Apply(0, Coll(EventType::kCollectiveBegin, 4, 3));
  t.Apply(0, Coll(EventType::kCollectivePosted, 5, 3));
  EXPECT_TRUE(t.rank(0).open.at(0).at(3).posted);
  EXPECT_EQ(t.rank(0).last_begun.at(0), 3u);

  const TimelineChange c = t.Apply(0, Coll(EventType::kCollectiveEnd, 9, 2));
  ASSERT_TRUE(c.collective_closed.has_value());
  EXPECT_EQ(c.collective_closed->begin_ns, 2 * kMs);
  EXPECT_EQ(c.collective_closed->op, Op::kAllReduce);
  // Seq 1's End was lost; seq 3 is still open, and so is comm 7's seq 1.
  std::vector<uint64_t> open;
  for (const auto& [seq, o] : t.rank(0).open.at(0)) open.push_back(seq);
  EXPECT_EQ(open, std::vector<uint64_t>{3});
  EXPECT_EQ(t.rank(0).open.at(7).size(), 1u);
  // An End of a collective never begun closes nothing.
  EXPECT_FALSE(t.Apply(0, Coll(EventType::kCollectiveEnd, 10, 99)).collective_closed.has_value());
}

// Issue 32, item 8: a rank whose events were lost (its ring was full) has stale open state: its
// begun collectives and step would look hung forever. MarkGap forgets them and counts its part of
// the collective records as ended, so only what is seen afterwards is judged.
TEST(TimelineTest, AGapForgetsWhatTheRankHadOpenAndItsNextEventsOpenAgain) {
  Timeline t;
  t.Reset(2);
  for (int r = 0; r < 2; ++r) {
    t.Apply(r, Ev(EventType::kStepBegin, 1, 3));
    t.Apply(r, Coll(EventType::kCollectiveBegin, 2, 1));
  }
  t.Apply(1, Coll(EventType::kCollectiveEnd, 3, 1));  // rank 0's End is among the lost events
  t.MarkGap(0, 5000 * kMs);
  EXPECT_TRUE(t.rank(0).open.empty());
  EXPECT_FALSE(t.rank(0).step_open);
  EXPECT_EQ(t.rank(0).last_event_ns, 5000 * kMs);
  EXPECT_EQ(t.Collectives(0)->at(1).end_ns[0], 5000 * kMs);
  EXPECT_TRUE(t.rank(1).step_open) << "another rank's state is its own";
  t.Apply(0, Ev(EventType::kStepBegin, 5001, 9));
  t.Apply(0, Coll(EventType::kCollectiveBegin, 5002, 40));
  EXPECT_TRUE(t.rank(0).step_open);
  EXPECT_EQ(t.rank(0).open.at(0).size(), 1u);
}

// Python ranks record an End when the user waits on the work, in any order: seq 1's End after
// seq 2's still names seq 1's begin, marked as closed early (hang history leaves it out).
TEST(TimelineTest, ALateEndStillFindsItsBegin) {
  Timeline t;
  t.Reset(1);
  t.Apply(0, Coll(EventType::kCollectiveBegin, 1, 1, 0, Op::kBroadcast));
  t.Apply(0, Coll(EventType::kCollectiveBegin, 2, 2));
  const TimelineChange second = t.Apply(0, Coll(EventType::kCollectiveEnd, 9, 2));
  EXPECT_FALSE(second.closed_early);
  EXPECT_TRUE(t.rank(0).open.at(0).empty());
  const TimelineChange first = t.Apply(0, Coll(EventType::kCollectiveEnd, 12, 1));
  ASSERT_TRUE(first.collective_closed.has_value());
  EXPECT_TRUE(first.closed_early);
  EXPECT_EQ(first.collective_closed->begin_ns, 1 * kMs);
  EXPECT_EQ(first.collective_closed->op, Op::kBroadcast);
  // Only once.
  EXPECT_FALSE(t.Apply(0, Coll(EventType::kCollectiveEnd, 13, 1)).collective_closed.has_value());
}

TEST(TimelineTest, EntryAndExitAcrossTheRanksAreReportedOnce) {
  Timeline t;
  t.Reset(3);
  EXPECT_FALSE(t.Apply(0, Coll(EventType::kCollectiveBegin, 10, 1)).entered_by_all);
  EXPECT_FALSE(t.Apply(1, Coll(EventType::kCollectiveBegin, 12, 1)).entered_by_all);
  const TimelineChange last = t.Apply(2, Coll(EventType::kCollectiveBegin, 40, 1));
  EXPECT_TRUE(last.entered_by_all);
  EXPECT_TRUE(last.first_begin);
  ASSERT_NE(last.record, nullptr);
  EXPECT_EQ(last.record->begin_ns, (std::vector<uint64_t>{10 * kMs, 12 * kMs, 40 * kMs}));
  EXPECT_EQ(last.record->begun, 3);
  EXPECT_EQ(last.record->op, Op::kAllReduce);

  t.Apply(0, Coll(EventType::kCollectivePosted, 41, 1));
  EXPECT_FALSE(t.Apply(0, Coll(EventType::kCollectiveEnd, 50, 1)).exited_by_all);
  EXPECT_FALSE(t.Apply(1, Coll(EventType::kCollectiveEnd, 50, 1)).exited_by_all);
  EXPECT_TRUE(t.Apply(2, Coll(EventType::kCollectiveEnd, 51, 1)).exited_by_all);
  // A late duplicate does not complete it again.
  EXPECT_FALSE(t.Apply(2, Coll(EventType::kCollectiveEnd, 52, 1)).exited_by_all);
  const CollectiveRecord& rec = t.Collectives(0)->at(1);
  EXPECT_EQ(rec.posted_ns[0], 41 * kMs);
  EXPECT_EQ(rec.posted_ns[1], 0u);
}

TEST(TimelineTest, AnExitedRankIsNotWaitedFor) {
  Timeline t;
  t.Reset(3);
  t.Apply(0, Coll(EventType::kCollectiveBegin, 10, 1));
  t.RankExited(2);
  EXPECT_TRUE(t.Apply(1, Coll(EventType::kCollectiveBegin, 11, 1)).entered_by_all);
}

TEST(TimelineTest, MembersOfACommAreTheRanksSeenOnIt) {
  Timeline t;
  t.Reset(4);
  EXPECT_EQ(t.Members(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(t.Members(5).empty());
  t.Apply(3, Coll(EventType::kCollectiveBegin, 1, 1, /*comm=*/5));
  t.Apply(1, Coll(EventType::kCollectiveBegin, 2, 1, /*comm=*/5));
  EXPECT_EQ(t.Members(5), (std::vector<int>{1, 3}));
  t.Reset(4);
  EXPECT_TRUE(t.Members(5).empty());
  EXPECT_EQ(t.Collectives(5), nullptr);
}

TEST(TimelineTest, OnlyTheNewestCollectivesOfACommAreKept) {
  Timeline t;
  t.Reset(2);
  for (uint64_t seq = 1; seq <= Timeline::kMaxSeqsPerComm + 10; ++seq)
    t.Apply(0, Coll(EventType::kCollectiveBegin, seq, seq));
  EXPECT_EQ(t.Collectives(0)->size(), Timeline::kMaxSeqsPerComm);
  EXPECT_EQ(t.Collectives(0)->begin()->first, 11u);
  EXPECT_EQ(t.rank(0).open.at(0).size(), Timeline::kMaxSeqsPerComm);
  // A collective older than every one kept is forgotten at once.
  EXPECT_EQ(t.Apply(1, Coll(EventType::kCollectiveBegin, 1000, 2)).record, nullptr);
}

TEST(TimelineTest, CheckpointSavesAndCommits) {
  Timeline t(/*saves_kept=*/3);
  t.Reset(1);
  t.Apply(0, Ev(EventType::kCheckpointBegin, 1000, 10));
  t.Apply(0, Ev(EventType::kCheckpointBegin, 2000, 20));
  t.Apply(0, Ev(EventType::kCheckpointPersisted, 2500, 10));
  Event failed = Ev(EventType::kCheckpointFailed, 2600, 20);
  t.Apply(0, failed);
  // A streamed save: persisted with no begin recorded, placed by its duration.
  Event streamed = Ev(EventType::kCheckpointPersisted, 4000, 30);
  streamed.duration_ns = 500 * kMs;
  t.Apply(0, streamed);
  const auto& saves = t.rank(0).saves;
  ASSERT_EQ(saves.size(), 2u);
  EXPECT_EQ(saves[0].step, 10u);
  EXPECT_EQ(saves[0].persisted_ns, 2500 * kMs);
  EXPECT_EQ(saves[0].interval_ns, 0u);
  EXPECT_EQ(saves[1].step, 30u);
  EXPECT_EQ(saves[1].begin_ns, 3500 * kMs);
  EXPECT_EQ(saves[1].interval_ns, 2500 * kMs);
  for (uint64_t step : {40, 50}) t.Apply(0, Ev(EventType::kCheckpointBegin, 4000 + step * 10, step));
  EXPECT_EQ(saves.size(), 3u);
  EXPECT_EQ(saves.front().step, 30u);

  t.Apply(0, Ev(EventType::kCheckpointCommitted, 5000, 30));
  t.Apply(0, Ev(EventType::kCheckpointCommitted, 5001, 10));
  EXPECT_EQ(t.rank(0).committed_step, 30u);
}

TEST(TimelineTest, RankBaseMapsLocalRanksToGlobalOnes) {
  Timeline t;
  t.Reset(2);
  EXPECT_EQ(t.rank_base(), 0);
  EXPECT_EQ(t.GlobalRank(1), 1);

  // The second node of a job with 4 ranks per node: its local ranks 0 and 1 are ranks 4 and 5.
  t.Reset(2, /*rank_base=*/4);
  EXPECT_EQ(t.world(), 2);
  EXPECT_EQ(t.rank_base(), 4);
  EXPECT_EQ(t.GlobalRank(0), 4);
  EXPECT_EQ(t.GlobalRank(1), 5);
  // Events are still applied by local index; the base only names the ranks.
  EXPECT_EQ(t.Apply(1, Ev(EventType::kStepBegin, 10, 1)).rank, 1);
  EXPECT_EQ(t.Apply(4, Ev(EventType::kStepBegin, 10, 1)).rank, -1);
  EXPECT_EQ(t.Members(0), (std::vector<int>{0, 1}));

  // A later launch on one node names its ranks from 0 again.
  t.Reset(2);
  EXPECT_EQ(t.GlobalRank(1), 1);
}

}  // namespace timeline_test
}  // namespace lifeline::agent
