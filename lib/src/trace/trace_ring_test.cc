// The trace ring: order, bounded memory (drops counted, never a wait), several producers, a
// consumer that survives a hostile header; and the tracing API end to end in a child process
// that finds the agent's ring through its environment.
#include "lifeline/internal/trace_ring.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "lifeline/trace.h"

namespace lifeline::trace {
namespace trace_ring_test {

// Waits for a forked child; it exits 0 when every check it made held, else with the number of the
// one that failed.
::testing::AssertionResult ExitedCleanly(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return ::testing::AssertionFailure() << "waitpid failed";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the child ended with wait status " << status;
}

class RingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lifeline-ring-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

Event Ev(EventType type, uint64_t step, uint64_t seq = 0) {
  Event e;
  e.time_ns = MonotonicNanos();
  e.type = type;
  e.step = step;
  e.seq = seq;
  return e;
}

TEST_F(RingTest, DeliversEventsInOrderAndDropsWhenFullWithoutWaiting) {
  auto ring = TraceRing::Create(RingPath(dir_, 3), 3, 100);  // rounded up to 128
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  TraceRing& r = **ring;
  EXPECT_EQ(r.capacity(), 128u);
  EXPECT_EQ(r.header()->rank, 3);
  for (uint64_t i = 0; i < 200; ++i) r.Push(Ev(EventType::kStepBegin, i));
  EXPECT_EQ(r.header()->dropped.load(), 72u);
  std::vector<Event> out;
  EXPECT_EQ(r.Drain(&out), 128u);
  for (uint64_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i].step, i);
  // Freed slots take new events; the order goes on.
  out.clear();
  for (uint64_t i = 500; i < 600; ++i) ASSERT_TRUE(r.Push(Ev(EventType::kStepEnd, i)));
  EXPECT_EQ(r.Drain(&out), 100u);
  EXPECT_EQ(out.front().step, 500u);
  EXPECT_EQ(out.back().step, 599u);
  EXPECT_EQ(out.back().type, EventType::kStepEnd);
  EXPECT_EQ(r.Drain(&out), 0u);
}

TEST_F(RingTest, ManyProducersLoseNothingTheyWereToldWasRecorded) {
  auto ring = TraceRing::Create(RingPath(dir_, 0), 0, 1024);
  ASSERT_TRUE(ring.ok());
  TraceRing& r = **ring;
  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 50000;
  std::atomic<uint64_t> accepted{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < kThreads; ++t)
    producers.emplace_back([&, t] {
      for (uint64_t i = 0; i < kPerThread; ++i) {
        Event e = Ev(EventType::kHeartbeat, i, static_cast<uint64_t>(t));
        if (r.Push(e)) accepted.fetch_add(1);
      }
    });
  std::vector<Event> got;
  std::atomic<bool> done{false};
  std::thread consumer([&] {
    while (!done.load()) r.Drain(&got);
    r.Drain(&got);
  });
  for (auto& p : producers) p.join();
  done.store(true);
  consumer.join();
  EXPECT_EQ(got.size(), accepted.load());
  EXPECT_EQ(got.size() + r.header()->dropped.load(), kThreads * kPerThread);
  // Each producer's events arrive in the order it recorded them.
  std::vector<int64_t> last(kThreads, -1);
  for (const Event& e : got) {
    ASSERT_LT(e.seq, static_cast<uint64_t>(kThreads));
    ASSERT_GT(static_cast<int64_t>(e.step), last[e.seq]) << "producer " << e.seq;
    last[e.seq] = static_cast<int64_t>(e.step);
  }
}

TEST_F(RingTest, RecentReturnsTheNewestEventsOldestFirstEvenAfterTheyWereConsumed) {
  auto ring = TraceRing::Create(RingPath(dir_, 1), 1, 64);
  ASSERT_TRUE(ring.ok());
  TraceRing& r = **ring;
  for (uint64_t i = 0; i < 40; ++i) r.Push(Ev(EventType::kStepBegin, i));
  std::vector<Event> drained;
  r.Drain(&drained);
  for (uint64_t i = 40; i < 50; ++i) r.Push(Ev(EventType::kStepBegin, i));
  Event recent[16];
  ASSERT_EQ(r.Recent(recent, 16), 16u);
  for (uint64_t i = 0; i < 16; ++i) EXPECT_EQ(recent[i].step, 34 + i);
  Event all[128];
  EXPECT_EQ(r.Recent(all, 128), 50u);
  EXPECT_EQ(all[0].step, 0u);
}

TEST_F(RingTest, OpenRejectsWhatIsNotAValidRing) {
  const std::string path = RingPath(dir_, 0);
  {
    std::ofstream f(path, std::ios::binary);
    f << "short";
  }
  auto short_file = TraceRing::Open(path);
  ASSERT_FALSE(short_file.ok());
  EXPECT_NE(short_file.status().ToString().find(path), std::string::npos);

  ASSERT_TRUE(TraceRing::Create(path, 0, 64).ok());
  std::filesystem::resize_file(path, kRingHeaderBytes + 10 * sizeof(Event));  // capacity says 64
  auto truncated = TraceRing::Open(path);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().ToString().find("capacity"), std::string::npos) << truncated.status().ToString();

  std::vector<char> garbage(kRingHeaderBytes + 64 * sizeof(Event), '\x5a');
  std::ofstream(path, std::ios::binary).write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  auto bad_magic = TraceRing::Open(path);
  ASSERT_FALSE(bad_magic.ok());
  EXPECT_NE(bad_magic.status().ToString().find("magic"), std::string::npos);
  EXPECT_FALSE(TraceRing::Open(dir_ + "/absent").ok());
}

TEST(TraceFormat, EventsFormatAsJsonLinesAndNeverOverflowTheBuffer) {
  Event e;
  e.time_ns = 123;
  e.type = EventType::kCollectiveBegin;
  e.op = Op::kAllReduce;
  e.comm = 2;
  e.seq = 184;
  e.step = 50;
  e.bytes = 4096;
  char buf[256];
  const size_t n = FormatEventJson(e, 7, buf, sizeof(buf));
  EXPECT_EQ(std::string(buf, n),
            "{\"t_ns\":123,\"rank\":7,\"type\":\"collective_begin\",\"step\":50,\"comm\":2,\"seq\":184,"
            "\"op\":\"allreduce\",\"bytes\":4096}");
  char tiny[10];
  const size_t m = FormatEventJson(e, 7, tiny, sizeof(tiny));
  EXPECT_LT(m, sizeof(tiny));
  EXPECT_EQ(std::strlen(tiny), m);
  EXPECT_EQ(OpFromName("all_reduce"), Op::kAllReduce);
  EXPECT_EQ(OpFromName("ReduceScatter"), Op::kReduceScatter);
  EXPECT_EQ(OpFromName("gossip"), Op::kOther);
}

// A scalar's value for a person, from the subnormals to the largest double (the exact bits beside it).
TEST(TraceFormat, ScalarValuesFormatOverTheWholeRangeOfDoubles) {
  const std::pair<double, const char*> cases[] = {
      {0.0, "\"value\":0,"},
      {-2.5, "\"value\":-2.5,"},
      {123456789012.0, "\"value\":1.23456789e11,"},
      {std::numeric_limits<double>::denorm_min(), "\"value\":4.94065646e-324,"},
      {std::numeric_limits<double>::max(), "\"value\":1.79769313e308,"},
      {-std::numeric_limits<double>::min(), "\"value\":-2.22507386e-308,"},
      {0.1, "\"value\":1e-1,"},
      {std::numeric_limits<double>::infinity(), "\"value\":\"inf\","},
  };
  for (const auto& [v, expected] : cases) {
    Event e;
    e.type = EventType::kScalar;
    e.step = 1;
    std::memcpy(&e.aux, &v, sizeof(v));
    char buf[256];
    const std::string line(buf, FormatEventJson(e, 0, buf, sizeof(buf)));
    EXPECT_NE(line.find(expected), std::string::npos) << line;
  }
}

// The API in a child whose environment names the ring: what the agent reads back, the dump on
// a signal, and the sequence numbers it counts per communicator. Hard links planted at both dumps'
// names (they are predictable: rank and pid) are replaced, the file outside left alone.
TEST_F(RingTest, TheTracingApiReachesTheAgentsRingAndDumpsOnSignal) {
  auto ring = TraceRing::Create(RingPath(dir_, 2), 2, 1024);
  ASSERT_TRUE(ring.ok());
  const std::string outside = dir_ + "/outside";
  std::ofstream(outside) << "keep me";
  ASSERT_EQ(link(outside.c_str(), (dir_ + "/explicit.jsonl").c_str()), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("LIFELINE_AGENT", dir_.c_str(), 1);
    setenv("RANK", "2", 1);
    if (!Active()) _exit(10);
    ProcessStart(kNoStep);
    StepBegin(7);
    const uint64_t a = CollectiveBegin(Op::kAllReduce, 1024);
    CollectivePosted(a);
    CollectiveEnd(a);
    const uint64_t b = CollectiveBegin(Op::kAllGather, 2048);
    const uint64_t c = CollectiveBegin(Op::kBroadcast, 8, /*comm=*/5);
    CollectiveEnd(b);
    CollectiveEnd(c, 5);
    Heartbeat();
    StepEnd(7);
    if (a != 1 || b != 2 || c != 1) _exit(11);
    if (link(outside.c_str(), (dir_ + "/dump.2." + std::to_string(getpid()) + ".jsonl").c_str()) != 0) _exit(13);
    raise(SIGUSR2);  // the agent's "dump" request
    if (!DumpRecent(dir_ + "/explicit.jsonl", 3).ok()) _exit(12);
    ProcessExit();
    _exit(0);
  }
  ASSERT_TRUE(ExitedCleanly(pid));

  std::vector<Event> got;
  (*ring)->Drain(&got);
  std::vector<std::string> types;
  for (const Event& e : got) types.push_back(EventTypeName(e.type));
  EXPECT_EQ(types, (std::vector<std::string>{"process_start", "step_begin", "collective_begin", "collective_posted",
                                             "collective_end", "collective_begin", "collective_begin", "collective_end",
                                             "collective_end", "heartbeat", "step_end", "process_exit"}));
  ASSERT_EQ(got.size(), 12u);
  EXPECT_EQ(got[0].aux, static_cast<uint64_t>(pid));
  EXPECT_EQ(got[2].step, 7u);  // collectives carry the current step
  EXPECT_EQ(got[2].op, Op::kAllReduce);
  EXPECT_EQ(got[2].bytes, 1024u);
  EXPECT_EQ(got[6].comm, 5u);
  for (size_t i = 1; i < got.size(); ++i) EXPECT_GE(got[i].time_ns, got[i - 1].time_ns);
  EXPECT_EQ((*ring)->header()->producer_pid, pid);
  EXPECT_EQ((*ring)->header()->dump_signal, SIGUSR2);

  std::ifstream dump(dir_ + "/dump.2." + std::to_string(pid) + ".jsonl");
  ASSERT_TRUE(dump.good()) << "no dump file written on SIGUSR2";
  std::vector<std::string> lines;
  for (std::string line; std::getline(dump, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 11u);  // everything recorded before the signal
  EXPECT_NE(lines[0].find("\"type\":\"process_start\""), std::string::npos) << lines[0];
  EXPECT_NE(lines[2].find("\"seq\":1,\"op\":\"allreduce\""), std::string::npos) << lines[2];
  EXPECT_NE(lines[10].find("\"type\":\"step_end\""), std::string::npos) << lines[10];
  std::ifstream explicit_dump(dir_ + "/explicit.jsonl");
  std::stringstream ss;
  ss << explicit_dump.rdbuf();
  const std::string text = ss.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3);
  std::ifstream kept(outside);
  std::string outside_text;
  std::getline(kept, outside_text);
  EXPECT_EQ(outside_text, "keep me") << "a dump wrote through a planted hard link";
}

// Training signals: the fixed scalars by number, a user scalar's name said once before its first
// value, values bit for bit (NaN and infinity included) with the step they belong to, and names
// the agent refuses when a ring holds bytes no producer would write.
TEST_F(RingTest, ScalarsReachTheAgentWithTheirNamesAndExactBits) {
  auto ring = TraceRing::Create(RingPath(dir_, 0), 0, 256);
  ASSERT_TRUE(ring.ok());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("LIFELINE_AGENT", dir_.c_str(), 1);
    setenv("RANK", "0", 1);
    unsetenv("LOCAL_RANK");
    Result<uint32_t> loss = RegisterScalar("loss");
    Result<uint32_t> lr = RegisterScalar("lr/group.0");
    Result<uint32_t> again = RegisterScalar("lr/group.0");
    if (!loss.ok() || *loss != kLossScalar || !lr.ok() || *lr != kFirstUserScalar || !again.ok() || *again != *lr)
      _exit(10);
    if (RegisterScalar("").ok() || RegisterScalar("a b").ok() || RegisterScalar(std::string(33, 'x')).ok()) _exit(11);
    if (*RegisterScalar("grad_norm") != kGradNormScalar) _exit(12);
    StepBegin(41);
    ReportScalar(kLossScalar, 2.5);                                   // the current step
    ReportScalar(kGradNormScalar, std::numeric_limits<double>::quiet_NaN(), 40);  // read a step late
    ReportScalar(*lr, 3e-4);
    ReportScalar(*lr, -std::numeric_limits<double>::infinity());
    ReportScalar(999, 1.0);  // never registered: nothing
    _exit(0);
  }
  ASSERT_TRUE(ExitedCleanly(pid));
  std::vector<Event> got;
  (*ring)->Drain(&got);
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[1].type, EventType::kScalar);
  EXPECT_EQ(got[1].comm, kLossScalar);
  EXPECT_EQ(got[1].step, 41u);
  EXPECT_EQ(ScalarValue(got[1]), 2.5);
  EXPECT_EQ(got[2].comm, kGradNormScalar);
  EXPECT_EQ(got[2].step, 40u);
  EXPECT_TRUE(std::isnan(ScalarValue(got[2])));
  ASSERT_EQ(got[3].type, EventType::kScalarName);  // once, before the first value
  EXPECT_EQ(got[3].comm, kFirstUserScalar);
  Result<std::string> name = DecodeScalarName(got[3]);
  ASSERT_TRUE(name.ok()) << name.status().ToString();
  EXPECT_EQ(*name, "lr/group.0");
  EXPECT_EQ(got[4].type, EventType::kScalar);
  EXPECT_EQ(ScalarValue(got[4]), 3e-4);
  EXPECT_EQ(ScalarValue(got[5]), -std::numeric_limits<double>::infinity());

  char buf[256];
  std::string line(buf, FormatEventJson(got[1], 0, buf, sizeof(buf)));
  EXPECT_NE(line.find("\"type\":\"scalar\",\"step\":41,\"scalar\":0,\"value\":2.5,\"value_bits\":"), std::string::npos) << line;
  line.assign(buf, FormatEventJson(got[2], 0, buf, sizeof(buf)));
  EXPECT_NE(line.find("\"value\":\"nan\""), std::string::npos) << line;
  line.assign(buf, FormatEventJson(got[3], 0, buf, sizeof(buf)));
  EXPECT_NE(line.find("\"scalar\":2,\"name\":\"lr/group.0\"}"), std::string::npos) << line;
  line.assign(buf, FormatEventJson(got[4], 0, buf, sizeof(buf)));
  EXPECT_NE(line.find("\"value\":3e-4,"), std::string::npos) << line;

  // What a ring may hold but no producer writes: bytes after the name's end, characters outside
  // a name's, an empty name, another type.
  Event bad = got[3];
  reinterpret_cast<char*>(&bad)[offsetof(Event, seq) + 20] = 'x';
  EXPECT_FALSE(DecodeScalarName(bad).ok());
  bad = got[3];
  reinterpret_cast<char*>(&bad)[offsetof(Event, seq) + 1] = '"';
  EXPECT_FALSE(DecodeScalarName(bad).ok());
  line.assign(buf, FormatEventJson(bad, 0, buf, sizeof(buf)));
  EXPECT_NE(line.find("\"name\":\"l?/group.0\""), std::string::npos) << line;
  bad.seq = bad.bytes = bad.duration_ns = bad.aux = 0;
  EXPECT_FALSE(DecodeScalarName(bad).ok());
  EXPECT_FALSE(DecodeScalarName(got[1]).ok());
}

// A spare interpreter the agent started ahead of a relaunch (LIFELINE_PRESTART=1, no RANK yet)
// records nothing and decides nothing until it is handed its rank; then it traces into that
// rank's ring, as a rank started afresh would.
TEST_F(RingTest, ASpareWithoutItsRankYetTracesOnceHandedOne) {
  auto ring = TraceRing::Create(RingPath(dir_, 1), 1, 64);
  ASSERT_TRUE(ring.ok());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("LIFELINE_AGENT", dir_.c_str(), 1);
    setenv("LIFELINE_PRESTART", "1", 1);
    unsetenv("RANK");
    unsetenv("LOCAL_RANK");
    if (Active()) _exit(10);
    StepBegin(3);  // before its rank: dropped, not written to any ring
    setenv("RANK", "5", 1);
    setenv("LOCAL_RANK", "1", 1);
    unsetenv("LIFELINE_PRESTART");
    if (!Active()) _exit(11);
    StepBegin(4);
    _exit(0);
  }
  ASSERT_TRUE(ExitedCleanly(pid));
  std::vector<Event> got;
  (*ring)->Drain(&got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].type, EventType::kStepBegin);
  EXPECT_EQ(got[0].step, 4u);
  EXPECT_EQ((*ring)->header()->producer_pid, pid);
}

TEST(TraceInactive, WithoutAnAgentNothingIsRecorded) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    unsetenv("LIFELINE_AGENT");
    if (Active()) _exit(10);
    StepBegin(1);
    if (CollectiveBegin(Op::kAllReduce, 8) != 0) _exit(11);
    if (DumpRecent("/tmp/never-written").ok()) _exit(12);
    if (Dropped() != 0) _exit(13);
    _exit(0);
  }
  EXPECT_TRUE(ExitedCleanly(pid));
}

TEST(TraceInactive, AnAgentDirectoryWithoutARingLeavesTracingOff) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("LIFELINE_AGENT", "/nonexistent/agent", 1);
    setenv("RANK", "0", 1);
    if (Active()) _exit(10);
    StepBegin(1);
    _exit(0);
  }
  EXPECT_TRUE(ExitedCleanly(pid));
}

}  // namespace trace_ring_test
}  // namespace lifeline::trace
