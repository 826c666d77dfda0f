// GPU check of the NCCL profiler plugin: real NCCL, loaded with NCCL_PROFILER_PLUGIN=lifeline,
// traces into a ring this program creates as lifeline-agent does (LIFELINE_AGENT, RANK=0), and the
// ring must then hold a CollectiveBegin and a CollectiveEnd for every operation, with at least some
// completions inferred from NCCL's kernel-channel events rather than from the enqueue.
//
// Workload: with two or more GPUs, an allreduce loop on a two-rank communicator (both ranks in this
// process, ncclCommInitAll). With one GPU, NCCL runs a one-rank collective as a local copy that
// bypasses its planner and so the profiler (ncclLaunchOneRank), and refuses two ranks on one
// device; the loop then also sends to and receives from itself, which NCCL does plan, and the
// check is on those send/recv events (the allreduce loop still runs, and must produce nothing odd).
//
//   nccl_allreduce_check [PLUGIN]   (PLUGIN: NCCL_PROFILER_PLUGIN when that is unset)
// Exit status: 0 pass, 1 fail, 77 skip ("SKIP: no CUDA device").
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "agent/nccl/nccl_profiler.h"
#include "lifeline/internal/trace_ring.h"
#include "lifeline/trace.h"

namespace {

using lifeline::trace::Event;
using lifeline::trace::EventType;
using lifeline::trace::Op;

constexpr int kIterations = 20;
constexpr size_t kCount = 1 << 20;  // floats per rank

#define CHECK_CUDA(call)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "FAIL: %s: %s\n", #call, cudaGetErrorString(e_));                     \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)
#define CHECK_NCCL(call)                                                                         \
  do {                                                                                           \
    ncclResult_t r_ = (call);                                                                    \
    if (r_ != ncclSuccess) {                                                                     \
      std::fprintf(stderr, "FAIL: %s: %s\n", #call, ncclGetErrorString(r_));                     \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

struct Key {
  uint32_t comm;
  uint64_t seq;
  Op op;
  bool operator<(const Key& o) const { return std::tie(comm, seq, op) < std::tie(o.comm, o.seq, o.op); }
};

int Run(const std::string& dir, lifeline::trace::TraceRing& ring) {
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  const int nranks = devices >= 2 ? 2 : 1;
  int version = 0;
  CHECK_NCCL(ncclGetVersion(&version));
  std::printf("NCCL %d, %d device(s), %d rank(s), plugin %s, ring in %s\n", version, devices, nranks,
              std::getenv("NCCL_PROFILER_PLUGIN"), dir.c_str());

  std::vector<ncclComm_t> comms(nranks);
  std::vector<int> devs = {0, 1};
  CHECK_NCCL(ncclCommInitAll(comms.data(), nranks, devs.data()));
  std::vector<float*> send(nranks), recv(nranks);
  std::vector<cudaStream_t> streams(nranks);
  for (int r = 0; r < nranks; ++r) {
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaMalloc(&send[r], kCount * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&recv[r], kCount * sizeof(float)));
    CHECK_CUDA(cudaMemset(send[r], 0, kCount * sizeof(float)));
    CHECK_CUDA(cudaStreamCreate(&streams[r]));
  }
  for (int it = 0; it < kIterations; ++it) {
    CHECK_NCCL(ncclGroupStart());
    for (int r = 0; r < nranks; ++r)
      CHECK_NCCL(ncclAllReduce(send[r], recv[r], kCount, ncclFloat, ncclSum, comms[r], streams[r]));
    CHECK_NCCL(ncclGroupEnd());
    if (nranks == 1) {
      CHECK_NCCL(ncclGroupStart());
      CHECK_NCCL(ncclSend(send[0], kCount, ncclFloat, 0, comms[0], streams[0]));
      CHECK_NCCL(ncclRecv(recv[0], kCount, ncclFloat, 0, comms[0], streams[0]));
      CHECK_NCCL(ncclGroupEnd());
    }
  }
  for (int r = 0; r < nranks; ++r) {
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaStreamSynchronize(streams[r]));
  }

  // NCCL's proxy thread reports the kernels' completion shortly after the GPU: poll for the Ends.
  std::vector<Event> events;
  std::map<Key, int> open;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    std::vector<Event> batch;
    ring.Drain(&batch);
    for (const Event& e : batch) {
      events.push_back(e);
      if (e.type == EventType::kCollectiveBegin) ++open[{e.comm, e.seq, e.op}];
      if (e.type == EventType::kCollectiveEnd && --open[{e.comm, e.seq, e.op}] == 0) open.erase({e.comm, e.seq, e.op});
    }
    const bool all_ended = !events.empty() && open.empty();
    if (all_ended || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < nranks; ++r) {
    CHECK_NCCL(ncclCommDestroy(comms[r]));
    cudaFree(send[r]);
    cudaFree(recv[r]);
    cudaStreamDestroy(streams[r]);
  }

  std::map<Op, int> begins, ends;
  int inferred = 0, enqueue_only = 0, by_successor = 0;
  for (const Event& e : events) {
    if (e.type == EventType::kCollectiveBegin) ++begins[e.op];
    if (e.type != EventType::kCollectiveEnd) continue;
    ++ends[e.op];
    if (e.aux & lifeline::nccl_profiler::kAuxEnqueueOnly) {
      ++enqueue_only;
    } else if (e.aux & lifeline::nccl_profiler::kAuxClosedBySuccessor) {
      ++by_successor;
    } else {
      ++inferred;
    }
  }
  for (const auto& [op, n] : begins)
    std::printf("  %-10s %d begun, %d ended\n", lifeline::trace::OpName(op), n, ends[op]);
  std::printf("  ends: %d from kernel/proxy completion, %d enqueue-only, %d closed by a successor\n", inferred,
              enqueue_only, by_successor);

  bool ok = true;
  auto fail = [&ok](const std::string& why) {
    std::printf("FAIL: %s\n", why.c_str());
    ok = false;
  };
  if (events.empty()) {
    fail("no events reached the ring: did NCCL load the plugin? (rerun with NCCL_DEBUG=INFO "
         "NCCL_DEBUG_SUBSYS=INIT,ENV)");
    return 1;
  }
  if (!open.empty())
    fail(std::to_string(open.size()) + " operation(s) begun and never ended, first comm " +
         std::to_string(open.begin()->first.comm) + " seq " + std::to_string(open.begin()->first.seq));
  if (nranks >= 2) {
    if (begins[Op::kAllReduce] != nranks * kIterations)
      fail("expected " + std::to_string(nranks * kIterations) + " allreduce begins, got " +
           std::to_string(begins[Op::kAllReduce]));
    for (const Event& e : events)
      if (e.op == Op::kAllReduce && e.bytes != kCount * sizeof(float)) {
        fail("allreduce with " + std::to_string(e.bytes) + " bytes");
        break;
      }
  } else {
    std::printf("  (one GPU: NCCL runs one-rank collectives without its planner, so the allreduces produce no "
                "profiler events; the self send/recv does)\n");
    if (begins[Op::kAllReduce] != 0) fail("allreduce events from a one-rank communicator");
    if (begins[Op::kSend] != kIterations || begins[Op::kRecv] != kIterations)
      fail("expected " + std::to_string(kIterations) + " send and recv begins");
  }
  if (inferred == 0) fail("no completion was inferred from NCCL's kernel-channel or proxy events");
  if (ok) std::printf("PASS\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "none visible");
    return 77;
  }
  char tmpl[] = "/tmp/lifeline-nccl-gpu-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("FAIL: mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  auto ring = lifeline::trace::TraceRing::Create(lifeline::trace::RingPath(dir, 0), 0, 1 << 16);
  if (!ring.ok()) {
    std::printf("FAIL: %s\n", ring.status().ToString().c_str());
    return 1;
  }
  // As lifeline-agent launches a rank; before NCCL (and with it the plugin) first traces.
  setenv("LIFELINE_AGENT", dir.c_str(), 1);
  setenv("RANK", "0", 1);
  if (std::getenv("NCCL_PROFILER_PLUGIN") == nullptr) {
    if (argc < 2) {
      std::printf("FAIL: NCCL_PROFILER_PLUGIN is unset and no plugin path was given\n");
      return 1;
    }
    setenv("NCCL_PROFILER_PLUGIN", argv[1], 1);
  }
  const int status = Run(dir, **ring);
  ring->reset();
  std::filesystem::remove_all(dir);
  return status;
}
