// The progress summary a node publishes for the job-wide view: what it says of a timeline, that it
// survives its own encoding, and that it refuses what is not one and every value the encoder
// would not write (formats/SPEC.md §17).
#include "agent/progress.h"

#include <gtest/gtest.h>

namespace lifeline::agent {
namespace progress_test {

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

// Each was accepted once, read as something else: a time whose age overflowed int64 (or a fraction
// converted to one out of range), a boolean or a fraction for an integer, a rank or communicator
// id cut to its type, a negative node, a negative age (which the leader's view turns into a time in
// nanoseconds), an op beyond trace::Op's 16 bits, a list where an object belongs.
TEST(ProgressTest, ValuesTheEncoderWouldNotWriteAreCorruption) {
  for (const char* bad : {
           R"({"t":-9223372036854775807,"r":[]})",
           R"({"t":1e300,"r":[]})",
           R"({"t":1125899906842625,"r":[]})",
           R"({"t":1,"r":[[0,0,true,-1,0,{}]]})",
           R"({"t":1,"r":[[0,0,2,-1,0,{}]]})",
           R"({"t":1,"r":[[4294967296,0,1,-1,0,{}]]})",
           R"({"t":1,"r":[[0,-1,1,-1,0,{}]]})",
           R"({"t":1,"r":[[0,0,1,-1,-5,{}]]})",
           R"({"t":1,"r":[[0,0,1,-1,1.5,{}]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{"4294967296":[1,-1,0,0,0]}]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{"-1":[1,-1,0,0,0]}]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{"07":[1,-1,0,0,0]}]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{"7x":[1,-1,0,0,0]}]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{"7":[-1,-1,0,0,0]}]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{"7":[1,3,0,70000,5]}]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{"7":[1,3,0,1,-5]}]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,[[1,-1,0,0,0]]]]})",
           R"({"t":1,"r":{"a":[0,0,1,-1,0,{}]}})",
           R"({"t":1,"r":[[0,0,1,-1,0,{},[[0,1,0,-5,-1,0]]]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{},[[0,1,0,5,-2,6]]]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{},[[-1,1,0,5,-1,6]]]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{},[[0,1,65536,5,-1,6]]]]})",
           R"({"t":1,"r":[[0,0,1,-1,0,{},{"a":[0,1,0,5,-1,6]}]]})",
       }) {
    auto r = DecodeProgress(bad, "progress/n", 2);
    if (r.ok()) {
      ADD_FAILURE() << "accepted " << bad;
      continue;
    }
    EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  }
}

// What a reader accepts beyond the encoder's own output: other keys, more elements than it knows,
// the older rank entry of six elements, any negative step or open seq as "none", no open_ms for a
// communicator with nothing open, the largest times.
TEST(ProgressTest, ReadsWhatItCanAndIgnoresWhatItDoesNotKnow) {
  auto r = DecodeProgress(R"({"t":1125899906842624,"v":2,"r":[[3,1,0,-77,1125899906842624,)"
                          R"({"0":[5,-9,1,4],"4294967295":[18446744073709551615,6,1,65535,1125899906842624,"x"]},)"
                          R"([[4294967295,18446744073709551615,65535,1125899906842624,-1,1125899906842624,"x"]],"x"],)"
                          R"([4,1,1,2,0,{}]]})",
                          "progress/n", 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  const RankProgress& p = (*r)[0];
  EXPECT_EQ(p.rank, 3);
  EXPECT_FALSE(p.alive);
  EXPECT_EQ(p.step, -1);
  EXPECT_EQ(p.comms.at(0).open, -1);
  EXPECT_EQ(p.comms.at(0).open_seconds, 0);
  EXPECT_EQ(p.comms.at(4294967295u).begun, UINT64_MAX);
  EXPECT_EQ(p.comms.at(4294967295u).op, 65535);
  ASSERT_EQ(p.recent.size(), 1u);
  EXPECT_EQ(p.recent[0].posted_ago, -1);
  EXPECT_DOUBLE_EQ(p.recent[0].end_ago, 1125899906.842624);
  EXPECT_EQ((*r)[1].step, 2);
  EXPECT_TRUE((*r)[1].recent.empty());
}

}  // namespace progress_test
}  // namespace lifeline::agent
