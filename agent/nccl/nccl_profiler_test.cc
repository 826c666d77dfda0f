// The NCCL profiler plugin driven the way NCCL drives it: the built libnccl-profiler-lifeline.so is
// dlopened, its ncclProfiler_v4/_v5/_v6 tables are looked up, and each version's descriptors are
// fed to them; the events that reach this process's trace ring (created here as the agent creates
// it) are checked for op, bytes, comm and seq, and for ending only once an operation's last child
// has stopped.
#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <iterator>
#include <thread>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "agent/nccl/nccl_profiler.h"
#include "agent/nccl/nccl_profiler_abi.h"
#include "lifeline/internal/trace_ring.h"
#include "lifeline/trace.h"

extern char** environ;

namespace lifeline::nccl_profiler {
namespace nccl_profiler_test {

using namespace nccl_abi;  // NOLINT
using trace::Event;
using trace::EventType;
using trace::Op;

constexpr char kNoAgentMarker[] = "LIFELINE_NCCL_TEST_NO_AGENT";

// The agent's side: a ring for rank 0, named in the environment before anything traces.
class AgentRing : public ::testing::Environment {
 public:
  void SetUp() override {
    if (std::getenv(kNoAgentMarker) != nullptr) {
      unsetenv("LIFELINE_AGENT");
      return;
    }
    char tmpl[] = "/tmp/lifeline-nccl-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto ring = trace::TraceRing::Create(trace::RingPath(dir_, 0), 0, 1 << 15);
    ASSERT_TRUE(ring.ok()) << ring.status().ToString();
    ring_ = std::move(*ring);
    setenv("LIFELINE_AGENT", dir_.c_str(), 1);
    setenv("RANK", "0", 1);
  }
  void TearDown() override {
    ring_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  static std::vector<Event> Drain() {
    std::vector<Event> out;
    if (ring_ != nullptr) ring_->Drain(&out);
    return out;
  }

 private:
  std::string dir_;
  static std::unique_ptr<trace::TraceRing> ring_;
};
std::unique_ptr<trace::TraceRing> AgentRing::ring_;
[[maybe_unused]] ::testing::Environment* const g_ring = ::testing::AddGlobalTestEnvironment(new AgentRing);

// The plugin, loaded as NCCL loads it.
void* Plugin() {
  static void* handle = dlopen(LIFELINE_NCCL_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  return handle;
}
template <typename T>
T* LookUp(const char* name) {
  return Plugin() == nullptr ? nullptr : static_cast<T*>(dlsym(Plugin(), name));
}

// One version's table, driven through what every version has.
class Api {
 public:
  virtual ~Api() = default;
  virtual int version() const = 0;
  virtual void* Init(uint64_t hash, const char* name, int nranks, int rank, int* mask) = 0;
  virtual void* Coll(void* ctx, const char* func, size_t count, const char* dtype, uint8_t channels,
                     uint64_t nccl_seq = 0) = 0;
  virtual void* P2p(void* ctx, const char* func, size_t count, const char* dtype, int peer, uint8_t channels) = 0;
  // A child or any other event of `type` with `parent` as parentObj.
  virtual void* Child(void* ctx, uint64_t type, void* parent) = 0;
  virtual void KernelStopState(void* handle) = 0;
  virtual void Stop(void* handle) = 0;
  virtual void Finalize(void* ctx) = 0;
};

template <typename Table, typename Descr, typename StateArgs>
class VersionApi : public Api {
 public:
  VersionApi(int version, const char* symbol) : version_(version), table_(Table_(symbol)) {}
  int version() const override { return version_; }
  bool loaded() const { return table_ != nullptr; }

  void* Init(uint64_t hash, const char* name, int nranks, int rank, int* mask) override {
    void* ctx = nullptr;
    ncclResult_t r;
    if constexpr (std::is_same_v<Table, ncclProfiler_v4_t>) {
      r = table_->init(&ctx, mask, name, hash, 1, nranks, rank, nullptr);
    } else {
      r = table_->init(&ctx, hash, mask, name, 1, nranks, rank, nullptr);
    }
    EXPECT_EQ(r, ncclSuccess);
    return ctx;
  }
  void* Coll(void* ctx, const char* func, size_t count, const char* dtype, uint8_t channels,
             uint64_t nccl_seq = 0) override {
    Descr d{};
    d.type = ncclProfileColl;
    d.coll.seqNumber = nccl_seq;
    d.coll.func = func;
    d.coll.count = count;
    d.coll.datatype = dtype;
    d.coll.nChannels = channels;
    d.coll.nWarps = 8;
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
    return Start(ctx, &d);
  }
  void* P2p(void* ctx, const char* func, size_t count, const char* dtype, int peer, uint8_t channels) override {
    Descr d{};
    d.type = ncclProfileP2p;
    d.p2p.func = func;
    d.p2p.count = count;
    d.p2p.datatype = dtype;
    d.p2p.peer = peer;
    d.p2p.nChannels = channels;
    return Start(ctx, &d);
  }
  void* Child(void* ctx, uint64_t type, void* parent) override {
    Descr d{};
    d.type = static_cast<decltype(d.type)>(type);
    d.parentObj = parent;
    if (type == ncclProfileKernelCh) d.kernelCh.pTimer = 1234;
    if (type == ncclProfileProxyOp) d.proxyOp.nSteps = 4;
    return Start(ctx, &d);
  }
  void KernelStopState(void* handle) override {
    StateArgs a{};
    a.kernelCh.pTimer = 5678;
    EXPECT_EQ(table_->recordEventState(handle, ncclProfilerKernelChStop, &a), ncclSuccess);
  }
  void Stop(void* handle) override { EXPECT_EQ(table_->stopEvent(handle), ncclSuccess); }
  void Finalize(void* ctx) override { EXPECT_EQ(table_->finalize(ctx), ncclSuccess); }

  Table* table() { return table_; }
  void* Start(void* ctx, Descr* d) {
    void* handle = reinterpret_cast<void*>(0xdead);  // the plugin must always write it
    EXPECT_EQ(table_->startEvent(ctx, &handle, d), ncclSuccess);
    EXPECT_NE(handle, reinterpret_cast<void*>(0xdead));
    return handle;
  }

 private:
  static Table* Table_(const char* symbol) { return LookUp<Table>(symbol); }
  int version_;
  Table* table_;
};

using V4 = VersionApi<ncclProfiler_v4_t, ncclProfilerEventDescr_v4_t, ncclProfilerEventStateArgs_v4_t>;
using V5 = VersionApi<ncclProfiler_v5_t, ncclProfilerEventDescr_v5_t, ncclProfilerEventStateArgs_v5_t>;
using V6 = VersionApi<ncclProfiler_v6_t, ncclProfilerEventDescr_v6_t, ncclProfilerEventStateArgs_v6_t>;

std::unique_ptr<Api> MakeApi(int version) {
  switch (version) {
    case 4: return std::make_unique<V4>(4, "ncclProfiler_v4");
    case 5: return std::make_unique<V5>(5, "ncclProfiler_v5");
    default: return std::make_unique<V6>(6, "ncclProfiler_v6");
  }
}

std::vector<Event> OfType(const std::vector<Event>& events, EventType type) {
  std::vector<Event> out;
  for (const Event& e : events)
    if (e.type == type) out.push_back(e);
  return out;
}

constexpr uint64_t kHash = 0x1234abcd5678ef01ull;

class NcclProfilerTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ASSERT_NE(Plugin(), nullptr) << dlerror();
    api_ = MakeApi(GetParam());
    unsetenv("LIFELINE_NCCL_PROFILER_SLOTS");
    AgentRing::Drain();
  }
  void TearDown() override {
    for (void* ctx : contexts_) api_->Finalize(ctx);
    unsetenv("LIFELINE_NCCL_PROFILER_SLOTS");
  }
  void* NewContext(uint64_t hash = kHash, int nranks = 4, int rank = 1) {
    int mask = -1;
    void* ctx = api_->Init(hash, "trainer", nranks, rank, &mask);
    EXPECT_NE(ctx, nullptr);
    uint64_t want = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileKernelCh;
    if (api_->version() == 6) want |= ncclProfileCeColl;
    EXPECT_EQ(static_cast<uint64_t>(mask), want) << "v" << api_->version();
    contexts_.push_back(ctx);
    return ctx;
  }
  void FinalizeNow(void* ctx) {
    api_->Finalize(ctx);
    contexts_.erase(std::find(contexts_.begin(), contexts_.end(), ctx));
  }
  // A KernelCh child's end as NCCL reports it: the state with the GPU stop time, then the stop.
  void StopKernel(void* child) {
    api_->KernelStopState(child);
    api_->Stop(child);
  }

  std::unique_ptr<Api> api_;
  std::vector<void*> contexts_;
};

INSTANTIATE_TEST_SUITE_P(AbiVersions, NcclProfilerTest, ::testing::Values(4, 5, 6),
                         [](const ::testing::TestParamInfo<int>& p) { return "v" + std::to_string(p.param); });

TEST(NcclProfilerExports, TheThreeInterfaceVersionsNamedLifeline) {
  void* lib = Plugin();
  ASSERT_NE(lib, nullptr) << dlerror();
  for (const char* name : {"ncclProfiler_v4", "ncclProfiler_v5", "ncclProfiler_v6"}) {
    // Every table starts with the name, then five function pointers.
    auto* table = static_cast<const ncclProfiler_v5_t*>(dlsym(lib, name));
    ASSERT_NE(table, nullptr) << name << ": " << dlerror();
    EXPECT_STREQ(table->name, "lifeline") << name;
    EXPECT_NE(table->init, nullptr);
    EXPECT_NE(table->startEvent, nullptr);
    EXPECT_NE(table->stopEvent, nullptr);
    EXPECT_NE(table->recordEventState, nullptr);
    EXPECT_NE(table->finalize, nullptr);
  }
  // Nothing else leaks out of the plugin: the core's functions are hidden.
  EXPECT_EQ(dlsym(lib, "_ZN8lifeline13nccl_profiler4StopEPv"), nullptr);
}

TEST_P(NcclProfilerTest, CollectiveEndsWhenItsLastChildStopsAfterTheEnqueue) {
  void* ctx = NewContext();
  void* coll = api_->Coll(ctx, "AllReduce", 1024, "ncclFloat32", 2, /*nccl_seq=*/0);
  ASSERT_NE(coll, nullptr);
  std::vector<Event> events = AgentRing::Drain();
  ASSERT_EQ(events.size(), 1u);
  const Event begin = events[0];
  EXPECT_EQ(begin.type, EventType::kCollectiveBegin);
  EXPECT_EQ(begin.op, Op::kAllReduce);
  EXPECT_EQ(begin.bytes, 4096u);
  EXPECT_EQ(begin.comm, CommId(kHash, "trainer"));
  EXPECT_NE(begin.comm, 0u) << "0 is the agent's world comm";
  EXPECT_EQ(begin.seq, 1u);
  EXPECT_NE(begin.time_ns, 0u);

  // The proxy thread starts the kernel-channel and proxy children; NCCL then stops the collective
  // (enqueued), and the children finish in any order.
  void* k0 = api_->Child(ctx, ncclProfileKernelCh, coll);
  void* k1 = api_->Child(ctx, ncclProfileKernelCh, coll);
  void* proxy = api_->Child(ctx, ncclProfileProxyOp, coll);
  ASSERT_NE(k0, nullptr);
  ASSERT_NE(k1, nullptr);
  ASSERT_NE(proxy, nullptr);
  api_->Stop(coll);
  EXPECT_TRUE(AgentRing::Drain().empty()) << "enqueued is not completed";
  StopKernel(k1);
  EXPECT_TRUE(AgentRing::Drain().empty()) << "one channel of two done";
  StopKernel(k0);
  EXPECT_TRUE(AgentRing::Drain().empty()) << "the proxy op is still running";
  api_->Stop(proxy);
  events = AgentRing::Drain();
  ASSERT_EQ(events.size(), 1u);
  const Event& end = events[0];
  EXPECT_EQ(end.type, EventType::kCollectiveEnd);
  EXPECT_EQ(end.op, Op::kAllReduce);
  EXPECT_EQ(end.comm, begin.comm);
  EXPECT_EQ(end.seq, 1u);
  EXPECT_EQ(end.bytes, 4096u);
  EXPECT_EQ(end.aux, 0u) << "completion came from the children";
  EXPECT_GE(end.time_ns, begin.time_ns);
  EXPECT_EQ(end.duration_ns, end.time_ns - begin.time_ns);
}

TEST_P(NcclProfilerTest, ChildrenFinishingBeforeTheEnqueueStopEndItThereButOnlyWithAllChannels) {
  void* ctx = NewContext();
  void* a = api_->Coll(ctx, "ReduceScatter", 100, "ncclBfloat16", 2);
  void* k0 = api_->Child(ctx, ncclProfileKernelCh, a);
  void* k1 = api_->Child(ctx, ncclProfileKernelCh, a);
  StopKernel(k0);
  StopKernel(k1);
  EXPECT_EQ(OfType(AgentRing::Drain(), EventType::kCollectiveEnd).size(), 0u) << "not stopped (enqueued) yet";
  api_->Stop(a);
  std::vector<Event> ends = OfType(AgentRing::Drain(), EventType::kCollectiveEnd);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].op, Op::kReduceScatter);
  EXPECT_EQ(ends[0].bytes, 200u);
  EXPECT_EQ(ends[0].aux, 0u);

  // Two channels expected, one finished before the stop: the End waits for the second, which
  // NCCL's proxy thread may start only after the stop.
  void* b = api_->Coll(ctx, "AllGather", 64, "ncclInt8", 2);
  void* b0 = api_->Child(ctx, ncclProfileKernelCh, b);
  StopKernel(b0);
  api_->Stop(b);
  EXPECT_EQ(OfType(AgentRing::Drain(), EventType::kCollectiveEnd).size(), 0u);
  void* b1 = api_->Child(ctx, ncclProfileKernelCh, b);
  StopKernel(b1);
  ends = OfType(AgentRing::Drain(), EventType::kCollectiveEnd);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].op, Op::kAllGather);
  EXPECT_EQ(ends[0].seq, 2u);
  EXPECT_EQ(ends[0].aux, 0u);
}

TEST_P(NcclProfilerTest, CollectiveWithoutChildrenEndsAtTheEnqueueMarkedEnqueueOnly) {
  void* ctx = NewContext();
  // nChannels 0: NCCL announces no kernel channels (e.g. a symmetric-memory kernel in 2.28).
  void* c = api_->Coll(ctx, "Broadcast", 4096, "ncclInt8", 0);
  ASSERT_NE(c, nullptr);
  api_->Stop(c);
  std::vector<Event> events = AgentRing::Drain();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].type, EventType::kCollectiveBegin);
  EXPECT_EQ(events[1].type, EventType::kCollectiveEnd);
  EXPECT_EQ(events[1].op, Op::kBroadcast);
  EXPECT_EQ(events[1].bytes, 4096u);
  EXPECT_EQ(events[1].aux, kAuxEnqueueOnly);
  // A child NCCL reports after that finds its parent retired and gets no handle.
  EXPECT_EQ(api_->Child(ctx, ncclProfileKernelCh, c), nullptr);
  EXPECT_TRUE(AgentRing::Drain().empty());
}

TEST_P(NcclProfilerTest, SequenceCountsEveryCollectiveOfTheCommunicatorFromOne) {
  void* ctx = NewContext();
  // NCCL's own seqNumber counts per function; the trace needs one count per communicator.
  const struct {
    const char* func;
    uint64_t nccl_seq;
    Op op;
  } calls[] = {{"AllReduce", 0, Op::kAllReduce},
               {"AllGather", 0, Op::kAllGather},
               {"AllReduce", 1, Op::kAllReduce},
               {"AlltoAll", 0, Op::kAllToAll},
               {"Reduce", 0, Op::kReduce},
               {"Gather", 0, Op::kOther}};
  for (const auto& call : calls) api_->Stop(api_->Coll(ctx, call.func, 8, "ncclFloat64", 0, call.nccl_seq));
  std::vector<Event> begins = OfType(AgentRing::Drain(), EventType::kCollectiveBegin);
  ASSERT_EQ(begins.size(), std::size(calls));
  for (size_t i = 0; i < begins.size(); ++i) {
    EXPECT_EQ(begins[i].seq, i + 1);
    EXPECT_EQ(begins[i].op, calls[i].op) << calls[i].func;
    EXPECT_EQ(begins[i].bytes, 64u);
    EXPECT_EQ(begins[i].comm, begins[0].comm);
  }
  // Another communicator counts on its own, under its own id; the same communicator seen from
  // another rank (same commHash) has the same id.
  void* other = NewContext(kHash + 1, 4, 1);
  void* peer_rank = NewContext(kHash, 4, 3);
  api_->Stop(api_->Coll(other, "AllReduce", 1, "ncclInt32", 0));
  api_->Stop(api_->Coll(peer_rank, "AllReduce", 1, "ncclInt32", 0));
  std::vector<Event> more = OfType(AgentRing::Drain(), EventType::kCollectiveBegin);
  ASSERT_EQ(more.size(), 2u);
  EXPECT_EQ(more[0].seq, 1u);
  EXPECT_NE(more[0].comm, begins[0].comm);
  EXPECT_EQ(more[1].seq, 1u);
  EXPECT_EQ(more[1].comm, begins[0].comm);
}

TEST_P(NcclProfilerTest, PointToPointIsNumberedPerDirectedPairOnEitherSide) {
  void* rank1 = NewContext(kHash, 4, 1);
  void* rank2 = NewContext(kHash, 4, 2);
  // Rank 1 sends twice to rank 2 and receives once from it; rank 2 does the mirror image.
  void* s1 = api_->P2p(rank1, "Send", 256, "ncclFloat16", 2, 1);
  void* s2 = api_->P2p(rank1, "Send", 256, "ncclFloat16", 2, 1);
  void* r1 = api_->P2p(rank1, "Recv", 10, "ncclUint8", 2, 1);
  void* mirror_r1 = api_->P2p(rank2, "Recv", 256, "ncclFloat16", 1, 1);
  void* mirror_r2 = api_->P2p(rank2, "Recv", 256, "ncclFloat16", 1, 1);
  void* mirror_s1 = api_->P2p(rank2, "Send", 10, "ncclUint8", 1, 1);
  for (void* h : {s1, s2, r1, mirror_r1, mirror_r2, mirror_s1}) ASSERT_NE(h, nullptr);
  std::vector<Event> begins = AgentRing::Drain();
  ASSERT_EQ(begins.size(), 6u);
  const uint32_t one_to_two = PairCommId(kHash, "trainer", 1, 2);
  const uint32_t two_to_one = PairCommId(kHash, "trainer", 2, 1);
  EXPECT_NE(one_to_two, two_to_one);
  EXPECT_NE(one_to_two, CommId(kHash, "trainer"));
  const struct {
    Op op;
    uint32_t comm;
    uint64_t seq;
    uint64_t bytes;
  } want[] = {{Op::kSend, one_to_two, 1, 512}, {Op::kSend, one_to_two, 2, 512}, {Op::kRecv, two_to_one, 1, 10},
              {Op::kRecv, one_to_two, 1, 512}, {Op::kRecv, one_to_two, 2, 512}, {Op::kSend, two_to_one, 1, 10}};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(begins[i].type, EventType::kCollectiveBegin);
    EXPECT_EQ(begins[i].op, want[i].op) << i;
    EXPECT_EQ(begins[i].comm, want[i].comm) << i;
    EXPECT_EQ(begins[i].seq, want[i].seq) << i;
    EXPECT_EQ(begins[i].bytes, want[i].bytes) << i;
  }
  // A send completes when its kernel channel has, not when it is enqueued.
  void* k = api_->Child(rank1, ncclProfileKernelCh, s1);
  api_->Stop(s1);
  EXPECT_TRUE(AgentRing::Drain().empty());
  StopKernel(k);
  std::vector<Event> ends = AgentRing::Drain();
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].type, EventType::kCollectiveEnd);
  EXPECT_EQ(ends[0].op, Op::kSend);
  EXPECT_EQ(ends[0].comm, one_to_two);
  EXPECT_EQ(ends[0].seq, 1u);
  EXPECT_EQ(ends[0].aux, 0u);
  // Peers outside the communicator are not followed.
  EXPECT_EQ(api_->P2p(rank1, "Send", 1, "ncclInt8", 4, 1), nullptr);
  EXPECT_EQ(api_->P2p(rank1, "Recv", 1, "ncclInt8", -1, 1), nullptr);
}

TEST_P(NcclProfilerTest, LaterCompletionClosesAnOlderOperationWhoseChildrenNeverCame) {
  void* ctx = NewContext();
  void* first = api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 4);  // announces 4 channels
  void* k = api_->Child(ctx, ncclProfileKernelCh, first);
  StopKernel(k);  // ... but only one is ever reported
  api_->Stop(first);
  void* second = api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 1);
  api_->Stop(second);
  EXPECT_EQ(OfType(AgentRing::Drain(), EventType::kCollectiveEnd).size(), 0u);
  void* k2 = api_->Child(ctx, ncclProfileKernelCh, second);
  StopKernel(k2);
  std::vector<Event> ends = OfType(AgentRing::Drain(), EventType::kCollectiveEnd);
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[0].seq, 1u);
  EXPECT_EQ(ends[0].aux, kAuxClosedBySuccessor);
  EXPECT_EQ(ends[1].seq, 2u);
  EXPECT_EQ(ends[1].aux, 0u);
  // A straggling child of the closed collective neither crashes nor writes anything.
  EXPECT_EQ(api_->Child(ctx, ncclProfileKernelCh, first), nullptr);
  EXPECT_TRUE(AgentRing::Drain().empty());
}

TEST_P(NcclProfilerTest, FullSlotPoolDropsOperationsAndRecoversWhenTheyRetire) {
  setenv("LIFELINE_NCCL_PROFILER_SLOTS", "3", 1);
  void* ctx = NewContext();
  std::vector<void*> handles;
  for (int i = 0; i < 5; ++i) handles.push_back(api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 1));
  EXPECT_NE(handles[0], nullptr);
  EXPECT_NE(handles[2], nullptr);
  EXPECT_EQ(handles[3], nullptr) << "three slots, all in use";
  EXPECT_EQ(handles[4], nullptr);
  // NCCL passes the null handle on as the children's parent; they get none either.
  EXPECT_EQ(api_->Child(ctx, ncclProfileKernelCh, handles[3]), nullptr);
  std::vector<Event> begins = OfType(AgentRing::Drain(), EventType::kCollectiveBegin);
  ASSERT_EQ(begins.size(), 3u);
  EXPECT_EQ(begins[2].seq, 3u);
  for (int i = 0; i < 3; ++i) {
    void* k = api_->Child(ctx, ncclProfileKernelCh, handles[i]);
    api_->Stop(handles[i]);
    StopKernel(k);
  }
  EXPECT_EQ(OfType(AgentRing::Drain(), EventType::kCollectiveEnd).size(), 3u);
  // The dropped collectives still took their numbers, so this rank stays in step with its peers.
  void* again = api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 0);
  ASSERT_NE(again, nullptr);
  api_->Stop(again);
  std::vector<Event> events = AgentRing::Drain();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].seq, 6u);
  EXPECT_EQ(events[1].type, EventType::kCollectiveEnd);
}

TEST_P(NcclProfilerTest, FinalizeReleasesTheContextWithOperationsStillOpen) {
  setenv("LIFELINE_NCCL_PROFILER_SLOTS", "2", 1);
  void* ctx = NewContext();
  void* a = api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 2);
  void* b = api_->P2p(ctx, "Send", 1, "ncclFloat32", 0, 1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(api_->Child(ctx, ncclProfileKernelCh, a), nullptr);
  EXPECT_EQ(api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 2), nullptr) << "pool full";
  FinalizeNow(ctx);  // an aborted communicator: nothing completed, nothing to write
  EXPECT_EQ(OfType(AgentRing::Drain(), EventType::kCollectiveEnd).size(), 0u);
  // A new communicator gets fresh slots (and the sanitizer build checks nothing leaked).
  void* next = NewContext();
  void* c = api_->Coll(next, "AllReduce", 1, "ncclFloat32", 0);
  void* d = api_->Coll(next, "AllReduce", 1, "ncclFloat32", 0);
  EXPECT_NE(c, nullptr);
  EXPECT_NE(d, nullptr);
  api_->Stop(c);
  api_->Stop(d);
  EXPECT_EQ(OfType(AgentRing::Drain(), EventType::kCollectiveEnd).size(), 2u);
}

TEST_P(NcclProfilerTest, EventsItDoesNotFollowGetNoHandle) {
  void* ctx = NewContext();
  void* coll = api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 0);
  void* proxy = api_->Child(ctx, ncclProfileProxyOp, coll);
  ASSERT_NE(proxy, nullptr);
  ASSERT_EQ(OfType(AgentRing::Drain(), EventType::kCollectiveBegin).size(), 1u);
  // Group, proxy steps (children of a proxy op), proxy control, and v5's API events: NCCL starts
  // some of them whatever the mask says, as parents of what was asked for.
  std::vector<uint64_t> others = {ncclProfileGroup, ncclProfileProxyCtrl, ncclProfileNetPlugin};
  if (api_->version() >= 5) others.insert(others.end(), {ncclProfileGroupApi, ncclProfileCollApi, ncclProfileP2pApi,
                                                        ncclProfileKernelLaunch});
  for (uint64_t type : others) EXPECT_EQ(api_->Child(ctx, type, nullptr), nullptr) << type;
  EXPECT_EQ(api_->Child(ctx, ncclProfileProxyStep, proxy), nullptr);
  EXPECT_EQ(api_->Child(ctx, ncclProfileKernelCh, nullptr), nullptr);
  int on_stack = 0;
  EXPECT_EQ(api_->Child(ctx, ncclProfileKernelCh, &on_stack), nullptr) << "a parent that is not ours";
  // None of that disturbed the collective: it ends when its proxy op does.
  api_->Stop(coll);
  EXPECT_TRUE(AgentRing::Drain().empty());
  api_->Stop(proxy);
  std::vector<Event> events = AgentRing::Drain();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, EventType::kCollectiveEnd);
  EXPECT_EQ(events[0].aux, 0u);
}

TEST_P(NcclProfilerTest, RepeatedStopsAreIgnored) {
  void* ctx = NewContext();
  void* c = api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 1);
  void* k = api_->Child(ctx, ncclProfileKernelCh, c);
  api_->Stop(c);
  api_->Stop(c);  // before it completes
  StopKernel(k);
  api_->Stop(k);  // a child's, after it completed
  api_->Stop(c);  // after it retired
  std::vector<Event> events = AgentRing::Drain();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].type, EventType::kCollectiveEnd);
  EXPECT_EQ(events[1].aux, 0u);
  // Still on, and still counting.
  void* next = api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 0);
  ASSERT_NE(next, nullptr);
  api_->Stop(next);
  events = AgentRing::Drain();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].seq, 2u);
}

TEST_P(NcclProfilerTest, UserAndProxyThreadsConcurrently) {
  void* ctx = NewContext();
  constexpr int kOps = 3000;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<void*> queue;
  bool done = false;
  std::thread proxy([&] {
    for (;;) {
      void* op;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !queue.empty() || done; });
        if (queue.empty()) return;
        op = queue.front();
        queue.pop_front();
      }
      cv.notify_all();
      void* k0 = api_->Child(ctx, ncclProfileKernelCh, op);
      void* p = api_->Child(ctx, ncclProfileProxyOp, op);
      void* k1 = api_->Child(ctx, ncclProfileKernelCh, op);
      StopKernel(k0);
      api_->Stop(p);
      StopKernel(k1);
    }
  });
  for (int i = 0; i < kOps; ++i) {
    void* op = api_->Coll(ctx, "AllReduce", 1, "ncclFloat32", 2);
    if (op == nullptr) {
      ADD_FAILURE() << "no slot for operation " << i;
      break;
    }
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return queue.size() < 64; });
      queue.push_back(op);
    }
    cv.notify_all();
    api_->Stop(op);  // races with the proxy thread's children
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  proxy.join();
  std::vector<Event> events = AgentRing::Drain();
  std::vector<int> begun(kOps + 1, 0), ended(kOps + 1, 0);
  for (const Event& e : events) {
    ASSERT_GE(e.seq, 1u);
    ASSERT_LE(e.seq, static_cast<uint64_t>(kOps));
    if (e.type == EventType::kCollectiveBegin) ++begun[e.seq];
    if (e.type == EventType::kCollectiveEnd) {
      EXPECT_EQ(begun[e.seq], 1) << "End before Begin for seq " << e.seq;
      EXPECT_EQ(e.aux, 0u);
      ++ended[e.seq];
    }
  }
  for (int s = 1; s <= kOps; ++s) {
    ASSERT_EQ(begun[s], 1) << s;
    ASSERT_EQ(ended[s], 1) << s;
  }
}

TEST(NcclProfilerV6, CopyEngineCollectivesShareTheCommunicatorsCountAndEndAtTheEnqueue) {
  ASSERT_NE(Plugin(), nullptr) << dlerror();
  AgentRing::Drain();
  V6 api(6, "ncclProfiler_v6");
  int mask = 0;
  void* ctx = api.Init(kHash, "trainer", 8, 0, &mask);
  ASSERT_NE(ctx, nullptr);
  EXPECT_NE(mask & ncclProfileCeColl, 0);
  api.Stop(api.Coll(ctx, "AllReduce", 4, "ncclFloat32", 0));
  ncclProfilerEventDescr_v6_t d{};
  d.type = ncclProfileCeColl;
  d.ceColl.func = "AllGather";
  d.ceColl.count = 1000;
  d.ceColl.datatype = "ncclFloat16";
  d.ceColl.syncStrategy = "MC";
  void* ce = api.Start(ctx, &d);
  ASSERT_NE(ce, nullptr);
  api.Stop(ce);
  std::vector<Event> events = AgentRing::Drain();
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].type, EventType::kCollectiveBegin);
  EXPECT_EQ(events[2].op, Op::kAllGather);
  EXPECT_EQ(events[2].seq, 2u);
  EXPECT_EQ(events[2].bytes, 2000u);
  EXPECT_EQ(events[2].comm, events[0].comm);
  EXPECT_EQ(events[3].type, EventType::kCollectiveEnd);
  EXPECT_EQ(events[3].aux, kAuxEnqueueOnly);
  api.Finalize(ctx);
}

// An internal inconsistency turns the plugin off for the process with one line on stderr, zeroes
// NCCL's event mask, and leaves every later call harmless. Run in a child process: it is sticky.
TEST(NcclProfilerDeathTest, InconsistencyDisablesThePluginOnceAndSaysSo) {
  ASSERT_NE(Plugin(), nullptr) << dlerror();
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(
      {
        V6 api(6, "ncclProfiler_v6");
        int mask = 0;
        void* ctx = api.Init(kHash, "trainer", 2, 0, &mask);
        void* c = api.Coll(ctx, "AllReduce", 1, "ncclFloat32", 1);
        const bool was_on = mask != 0 && c != nullptr;
        // Not a handle the plugin issued: the low bits name no child kind.
        void* forged = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(c) | 7);
        api.table()->stopEvent(forged);
        api.table()->stopEvent(forged);  // already off: silent
        api.table()->stopEvent(c);
        void* after = reinterpret_cast<void*>(1);
        ncclProfilerEventDescr_v6_t d{};
        d.type = ncclProfileColl;
        d.coll.func = "AllReduce";
        api.table()->startEvent(ctx, &after, &d);
        int mask2 = 0;
        void* ctx2 = nullptr;
        api.table()->init(&ctx2, kHash, &mask2, "again", 1, 2, 0, nullptr);
        api.table()->finalize(ctx);
        std::exit(was_on && mask == 0 && after == nullptr && ctx2 == nullptr && mask2 == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "^lifeline nccl profiler: [^\n]*\n$");
  // A handle the plugin never issued is caught the same way.
  EXPECT_EXIT(
      {
        V5 api(5, "ncclProfiler_v5");
        alignas(64) static unsigned char fake[256] = {};
        api.table()->stopEvent(fake);
        api.table()->stopEvent(fake + 1);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "^lifeline nccl profiler: [^\n]*\n$");
}

// Without an agent (LIFELINE_AGENT unset) init asks NCCL for no events. Runs itself again in a
// fresh process, as tracing reads the environment once.
TEST(NcclProfilerNoAgent, InitAsksNcclForNothing) {
  if (std::getenv(kNoAgentMarker) == nullptr) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "LIFELINE_AGENT=", 15) != 0) env_strings.emplace_back(*e);
    env_strings.emplace_back(std::string(kNoAgentMarker) + "=1");
    std::vector<char*> envp;
    for (std::string& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string filter = "--gtest_filter=NcclProfilerNoAgent.InitAsksNcclForNothing";
    char self[] = "/proc/self/exe";
    char* argv[] = {self, filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, self, nullptr, nullptr, argv, envp.data()), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's checks failed (its output is above)";
    return;
  }
  ASSERT_EQ(std::getenv("LIFELINE_AGENT"), nullptr);
  ASSERT_NE(Plugin(), nullptr) << dlerror();
  for (int version : {4, 5, 6}) {
    std::unique_ptr<Api> api = MakeApi(version);
    int mask = -1;
    void* ctx = api->Init(kHash, "trainer", 2, 0, &mask);
    EXPECT_EQ(mask, 0) << "v" << version;
    EXPECT_EQ(ctx, nullptr) << "v" << version;
    EXPECT_EQ(api->Coll(ctx, "AllReduce", 1, "ncclFloat32", 1), nullptr);
    api->Finalize(ctx);
  }
}

}  // namespace nccl_profiler_test
}  // namespace lifeline::nccl_profiler
