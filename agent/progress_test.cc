// The progress summary a node publishes for the job-wide view: what it says of a timeline, and
// that it survives its own encoding and refuses what is not one.
#include "agent/progress.h"

#include <gtest/gtest.h>

namespace lifeline::agent {
namespace {

using trace::Event;
using trace::EventType;

constexpr uint64_t kMs = 1000000;

Event Coll(EventType type, uint64_t t_ms, uint64_t seq, uint32_t comm) {
  Event e;
  e.type = type;
  e.time_ns = t_ms * kMs;
  e.step = 7;
  e.seq = seq;
  e.comm = comm;
  e.op = trace::Op::kAllReduce;
  return e;
}

TEST(ProgressTest, SummarizesEachRanksFrontPerCommunicatorInGlobalRanks) {
  Timeline t;
  t.Reset(2, /*rank_base=*/4);
  Event step;
  step.type = EventType::kStepBegin;
  step.time_ns = 1 * kMs;
  step.step = 7;
  t.Apply(0, step);
  t.Apply(0, Coll(EventType::kCollectiveBegin, 10, 1, 0));
  t.Apply(0, Coll(EventType::kCollectiveEnd, 12, 1, 0));
  t.Apply(0, Coll(EventType::kCollectiveBegin, 20, 2, 0));
  t.Apply(0, Coll(EventType::kCollectivePosted, 21, 2, 0));
  t.Apply(1, Coll(EventType::kCollectiveBegin, 15, 1, 9));
  const std::vector<RankProgress> p = SummarizeProgress(t, /*node=*/2, 1000 * kMs);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].rank, 4);
  EXPECT_EQ(p[0].node, 2);
  EXPECT_EQ(p[0].step, 7);
  EXPECT_NEAR(p[0].silent_seconds, 0.979, 1e-9);
  ASSERT_EQ(p[0].comms.count(0), 1u);
  EXPECT_EQ(p[0].comms.at(0).begun, 2u);
  EXPECT_EQ(p[0].comms.at(0).open, 2);
  EXPECT_TRUE(p[0].comms.at(0).posted);
  EXPECT_EQ(p[1].rank, 5);
  EXPECT_EQ(p[1].step, -1);
  ASSERT_EQ(p[1].comms.count(9), 1u);
  EXPECT_EQ(p[1].comms.at(9).open, 1);
  EXPECT_FALSE(p[1].comms.at(9).posted);

  EXPECT_NEAR(p[0].comms.at(0).open_seconds, 0.980, 1e-9);
  const std::string text = EncodeProgress(p, /*unix_ms=*/1'000'000);
  EXPECT_LT(text.size(), 140u) << text;
  auto back = DecodeProgress(text, "summary", /*now_unix_ms=*/1'000'250);  // read 250 ms later
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].comms.at(0).begun, 2u);
  EXPECT_EQ((*back)[1].comms.at(9).open, 1);
  EXPECT_NEAR((*back)[0].silent_seconds, 0.979 + 0.25, 1e-9);
  EXPECT_NEAR((*back)[0].comms.at(0).open_seconds, 0.980 + 0.25, 1e-9);
}

TEST(ProgressTest, WhatIsNotASummaryIsCorruptionNamingIt) {
  for (const char* bad : {"", "[]", "{}", "{\"t\":1,\"r\":[[1]]}", "{\"t\":1,\"r\":[[0,0,1,-1,0,{\"x\":[1,2,3,4,5]}]]}",
                          "{\"t\":1,\"r\":[[\"a\",0,1,-1,0,{}]]}"}) {
    auto r = DecodeProgress(bad, "etcd key /lifeline/j/rounds/0/progress/n", 0);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
    EXPECT_NE(r.status().ToString().find("progress/n"), std::string::npos) << r.status().ToString();
  }
}

}  // namespace
}  // namespace lifeline::agent
