// The progress summary a node publishes for the job-wide view: what it says of a timeline, that it
// survives its own encoding, that it refuses what is not one and every value the encoder would not
// write (formats/SPEC.md §17), and that summaries of only what changed, merged by the leader, give
// the view whole summaries would.
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

// A timeline of one rank (global rank 8) on communicator 3 whose collectives 1..n ended, each
// begun at 100 ms x seq, posted 1 ms and ended 5 ms later.
void EndCollectives(Timeline* t, uint64_t from, uint64_t to) {
  for (uint64_t seq = from; seq <= to; ++seq) {
    t->Apply(0, Coll(EventType::kCollectiveBegin, 100 * seq, seq, 3));
    t->Apply(0, Coll(EventType::kCollectivePosted, 100 * seq + 1, seq, 3));
    t->Apply(0, Coll(EventType::kCollectiveEnd, 100 * seq + 5, seq, 3));
  }
}

TEST(ProgressTest, BinarySummaryIsSmallAndEveryCutOrStrayByteOfItIsCorruption) {
  Timeline t;
  t.Reset(1, /*rank_base=*/8);
  EndCollectives(&t, 1, 40);
  const std::vector<RankProgress> p = SummarizeProgress(t, /*node=*/1, 4100 * kMs);
  ASSERT_EQ(p[0].recent.size(), kSamplesPerComm);
  const std::string bytes = EncodeProgress(p, 1'000'000, /*number=*/5, /*base=*/4);
  // 32 collectives of 6 numbers: about 10 bytes each (the JSON of §17.1 took about 34).
  EXPECT_LT(bytes.size(), 32u * 11 + 40) << bytes.size();
  EXPECT_GT(EncodeProgressJson(p, 1'000'000).size(), bytes.size() * 3) << bytes.size();
  EXPECT_EQ(SummaryNumber(bytes), 5u);
  auto whole = DecodeSummary(bytes, "summary of node n", 1'000'000);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->number, 5u);
  EXPECT_EQ(whole->base, 4u);
  ASSERT_EQ(whole->ranks.size(), 1u);
  ASSERT_EQ(whole->ranks[0].recent.size(), kSamplesPerComm);
  EXPECT_EQ(whole->ranks[0].recent.front().seq, 9u);
  EXPECT_NEAR(whole->ranks[0].recent.back().end_ago, 4.100 - 4.005, 1e-9);
  EXPECT_NEAR(whole->ranks[0].recent.back().posted_ago, 4.100 - 4.001, 1e-9);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto r = DecodeSummary(bytes.substr(0, cut), "summary of node n", 0);
    ASSERT_FALSE(r.ok()) << "accepted the first " << cut << " bytes";
    EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
    EXPECT_NE(r.status().ToString().find("summary of node n"), std::string::npos) << r.status().ToString();
  }
  EXPECT_FALSE(DecodeSummary(bytes + '\0', "n", 0).ok());
  // A count beyond what the bytes left could hold is refused before anything is allocated for it.
  std::string huge("LLS\x02\x01\x00\x01", 7);
  huge += std::string("\xff\xff\xff\xff\x0f", 5);
  auto r = DecodeSummary(huge, "n", 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("ranks"), std::string::npos) << r.status().ToString();
  // Values the encoder would not write: alive 2, an op beyond 16 bits, a varint of 11 bytes.
  const std::string head("LLS\x02\x01\x00\x01\x01", 8);  // number 1, base 0, t 1, one rank
  const std::string rank("\x00\x00\x01\x01\x00", 5);       // rank 0, node 0, alive, step -1, silent 0
  ASSERT_TRUE(DecodeSummary(head + rank + std::string("\x00\x00", 2), "n", 0).ok());
  for (const std::string& bad : {head + std::string("\x00\x00\x02\x01\x00\x00\x00", 7),
                                 head + rank + std::string("\x01\x00\x00\x01\x00\x80\x80\x04\x00\x00", 10),
                                 std::string("LLS\x02\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x00\x01\x00", 17)}) {
    auto b = DecodeSummary(bad, "n", 0);
    EXPECT_FALSE(b.ok()) << testing::PrintToString(bad);
  }
}

TEST(ProgressTest, SummaryOfOnlyWhatChangedMergedGivesTheWholeWindow) {
  Timeline t;
  t.Reset(1, /*rank_base=*/8);
  EndCollectives(&t, 1, 20);
  // The first summary: all 20; the second follows it and carries 21..30 only.
  const std::vector<RankProgress> first = SummarizeProgress(t, 1, 2100 * kMs);
  ASSERT_EQ(first[0].recent.size(), 20u);
  SampleCursor cursor;
  AdvanceCursor(first, &cursor);
  EXPECT_EQ(cursor.at({3u, 8}), 20u);
  EndCollectives(&t, 21, 30);
  const std::vector<RankProgress> second = SummarizeProgress(t, 1, 3100 * kMs, &cursor);
  ASSERT_EQ(second[0].recent.size(), 10u);
  EXPECT_EQ(second[0].recent.front().seq, 21u);
  EXPECT_EQ(second[0].comms.at(3).begun, 30u);  // the rank's state is whole in each

  // The leader reads the first at 2.1 s + 0.2 s, the second 0.3 s after it was written.
  SummaryMerger merger;
  merger.Merge("summary of node n", *DecodeSummary(EncodeProgress(first, 2100, 1, 0), "n", 2300), 2300);
  merger.Merge("summary of node n", *DecodeSummary(EncodeProgress(second, 3100, 2, 1), "n", 3400), 3400);
  merger.Merge("summary of node n", *DecodeSummary(EncodeProgress(second, 3100, 2, 1), "n", 3400), 3400);  // again: no effect
  std::vector<RankProgress> view;
  merger.View(/*now_unix_ms=*/3500, &view);
  const std::vector<RankProgress> whole = SummarizeProgress(t, 1, 3500 * kMs);  // all of it, at the view's time
  ASSERT_EQ(view.size(), 1u);
  ASSERT_EQ(view[0].recent.size(), kSamplesPerComm - 2);  // 30 collectives ended: all of them
  ASSERT_EQ(whole[0].recent.size(), view[0].recent.size());
  for (size_t k = 0; k < whole[0].recent.size(); ++k) {
    EXPECT_EQ(view[0].recent[k].seq, whole[0].recent[k].seq);
    EXPECT_NEAR(view[0].recent[k].begin_ago, whole[0].recent[k].begin_ago, 2e-6);
    EXPECT_NEAR(view[0].recent[k].posted_ago, whole[0].recent[k].posted_ago, 2e-6);
    EXPECT_NEAR(view[0].recent[k].end_ago, whole[0].recent[k].end_ago, 2e-6);
  }
  EXPECT_NEAR(view[0].summary_age_seconds, 0.4, 1e-9);  // the second, written at 3.1 s
  EXPECT_NEAR(view[0].silent_seconds, whole[0].silent_seconds, 1e-3);
  EXPECT_EQ(merger.gaps(), 0u);

  // More than a window later: the oldest fall out, the newest kSamplesPerComm stay.
  SampleCursor after_second = cursor;
  AdvanceCursor(second, &after_second);
  EndCollectives(&t, 31, 45);
  const std::vector<RankProgress> third = SummarizeProgress(t, 1, 4600 * kMs, &after_second);
  merger.Merge("summary of node n", *DecodeSummary(EncodeProgress(third, 4600, 3, 2), "n", 4600), 4600);
  merger.View(4600, &view);
  ASSERT_EQ(view[0].recent.size(), kSamplesPerComm);
  EXPECT_EQ(view[0].recent.front().seq, 45u - kSamplesPerComm + 1);
  EXPECT_EQ(view[0].recent.back().seq, 45u);

  // A summary that follows one the leader never merged (the sender's connection was replaced):
  // counted as a gap; a whole one (base 0) then replaces what the leader held.
  merger.Merge("summary of node n", *DecodeSummary(EncodeProgress(third, 4700, 9, 7), "n", 4700), 4700);
  EXPECT_EQ(merger.gaps(), 1u);
  merger.Merge("summary of node n", *DecodeSummary(EncodeProgress(first, 4800, 1, 0), "n", 4800), 4800);
  merger.View(4800, &view);
  EXPECT_EQ(view[0].recent.size(), 20u);
  // Nodes are kept apart by name.
  merger.Merge("summary of node m", *DecodeSummary(EncodeProgress(first, 4800, 1, 0), "m", 4800), 4800);
  merger.View(4800, &view);
  EXPECT_EQ(view.size(), 2u);
  EXPECT_EQ(merger.nodes(), 2u);
}

// Version 3 carries the snapshots' digest folds, the details the leader asked for and the values
// of replicated signals after the ranks; a summary without them stays version 2; every cut of a version 3 one is Corruption.
TEST(ProgressTest, DigestFoldsAndDetailsTravelWithTheSummary) {
  RankProgress p;
  p.rank = 5;
  p.step = 40;
  DigestFold f;
  f.rank = 5;
  f.step = 40;
  f.keyset = 0x0123456789abcdefULL;
  f.digest = 0xfedcba9876543210ULL;
  f.shards = 72;
  f.expect = 128;
  DigestDetail d;
  d.rank = 5;
  d.step = 40;
  d.shards.push_back({0x11, 0x22, 128, 1 << 20, trace::kNoOffset, "layers.7.attention.wq.weight"});
  d.shards.push_back({0x33, 0x44, 2, 4096, 0, ""});
  const std::string v2 = EncodeProgress({p}, 1000, 3, 2);
  SummaryFrame sent;
  sent.number = 3;
  sent.base = 2;
  sent.unix_ms = 1000;
  sent.ranks = {p};
  sent.folds = {f};
  sent.details = {d};
  sent.values = {{"grad_norm", 0, 40, {{5, 0x4000000000000000ULL}, {6, 0x4000000000000001ULL}}}};
  const std::string v3 = EncodeSummary(sent);
  EXPECT_EQ(v2[3], '\x02');
  EXPECT_EQ(v3[3], '\x03');
  EXPECT_EQ(SummaryNumber(v3), 3u);
  Result<SummaryFrame> frame = DecodeSummary(v3, "node-1", 1000);
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  ASSERT_EQ(frame->ranks.size(), 1u);
  ASSERT_EQ(frame->folds.size(), 1u);
  EXPECT_EQ(frame->folds[0].keyset, f.keyset);
  EXPECT_EQ(frame->folds[0].digest, f.digest);
  EXPECT_EQ(frame->folds[0].shards, 72u);
  EXPECT_EQ(frame->folds[0].expect, 128u);
  ASSERT_EQ(frame->details.size(), 1u);
  ASSERT_EQ(frame->details[0].shards.size(), 2u);
  EXPECT_EQ(frame->details[0].shards[0].name, "layers.7.attention.wq.weight");
  EXPECT_EQ(frame->details[0].shards[0].tensor_offset, trace::kNoOffset);
  EXPECT_EQ(frame->details[0].shards[1].tensor_offset, 0u);
  EXPECT_EQ(frame->details[0].shards[1].bytes, 4096u);
  ASSERT_EQ(frame->values.size(), 1u);
  EXPECT_EQ(frame->values[0].scalar, "grad_norm");
  EXPECT_EQ(frame->values[0].step, 40u);
  EXPECT_EQ(frame->values[0].bits, sent.values[0].bits);
  SummaryFrame again = *frame;
  again.unix_ms = 1000;
  EXPECT_EQ(EncodeSummary(again), v3);
  for (size_t cut = 0; cut < v3.size(); ++cut)
    EXPECT_FALSE(DecodeSummary(v3.substr(0, cut), "node-1", 1000).ok()) << cut;
  EXPECT_FALSE(DecodeSummary(v3 + std::string(1, '\0'), "node-1", 1000).ok());
  const Status stray = DecodeSummary(v3 + "x", "summary of node-1", 1000).status();
  EXPECT_NE(stray.ToString().find("summary of node-1"), std::string::npos) << stray.ToString();
}

}  // namespace progress_test
}  // namespace lifeline::agent
