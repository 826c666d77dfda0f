// The three function tables NCCL looks up in libnccl-profiler-lifeline.so. Each version reads its
// own descriptor layout into the common Descriptor and calls the core (nccl_profiler.cc); they
// differ in:
//   v4  type is 8 bits wide; init(context, mask, commName, commHash, nNodes, nranks, rank, log).
//   v5  type is 64 bits wide; init(context, commId, mask, commName, nNodes, nranks, rank, log);
//       the descriptor union gains the API events (ignored here) and coll/p2p.parentGroup.
//   v6  v5 plus copy-engine collectives: ceColl is followed like a Coll without kernel children.
// Every function returns ncclSuccess; nothing here dereferences a pointer NCCL may leave null
// without checking it.
#include <type_traits>

#include "agent/nccl/nccl_profiler.h"
#include "agent/nccl/nccl_profiler_abi.h"

namespace lifeline::nccl_profiler {
namespace {

using namespace nccl_abi;  // NOLINT: the ABI's own names read best unqualified here

template <typename D>
Descriptor Translate(const D& d) {
  Descriptor out;
  out.parent = d.parentObj;
  const uint64_t type = d.type;
  if (type == ncclProfileColl) {
    out.kind = Kind::kColl;
    out.func = d.coll.func;
    out.datatype = d.coll.datatype;
    out.count = d.coll.count;
    out.channels = d.coll.nChannels;
  } else if (type == ncclProfileP2p) {
    out.kind = Kind::kP2p;
    out.func = d.p2p.func;
    out.datatype = d.p2p.datatype;
    out.count = d.p2p.count;
    out.peer = d.p2p.peer;
    out.channels = d.p2p.nChannels;
  } else if (type == ncclProfileKernelCh) {
    out.kind = Kind::kKernelCh;
  } else if (type == ncclProfileProxyOp) {
    out.kind = Kind::kProxyOp;
  } else if constexpr (std::is_same_v<D, ncclProfilerEventDescr_v6_t>) {
    if (type == ncclProfileCeColl) {
      out.kind = Kind::kCeColl;
      out.func = d.ceColl.func;
      out.datatype = d.ceColl.datatype;
      out.count = d.ceColl.count;
    }
  }
  return out;
}

template <typename D>
ncclResult_t StartEvent(void* context, void** handle, D* descriptor) noexcept {
  if (handle == nullptr) return ncclSuccess;
  *handle = descriptor != nullptr ? Start(context, Translate(*descriptor)) : nullptr;
  return ncclSuccess;
}

ncclResult_t StopEvent(void* handle) noexcept {
  Stop(handle);
  return ncclSuccess;
}

// No state is needed: a KernelCh's stop follows its ncclProfilerKernelChStop state, and the GPU
// timestamps it carries are on a clock the agent does not share.
template <typename Args>
ncclResult_t RecordEventState(void*, ncclProfilerEventState_t, Args*) noexcept {
  return ncclSuccess;
}

ncclResult_t FinalizeContext(void* context) noexcept {
  Finalize(context);
  return ncclSuccess;
}

ncclResult_t InitV4(void** context, int* mask, const char* comm_name, uint64_t comm_hash, int /*nNodes*/, int nranks,
                    int rank, ncclDebugLogger_t logfn) noexcept {
  void* c = Init(comm_hash, comm_name, nranks, rank, mask, 0, logfn, 4);
  if (context != nullptr) *context = c;
  return ncclSuccess;
}

ncclResult_t InitV5(void** context, uint64_t comm_id, int* mask, const char* comm_name, int /*nNodes*/, int nranks,
                    int rank, ncclDebugLogger_t logfn) noexcept {
  void* c = Init(comm_id, comm_name, nranks, rank, mask, 0, logfn, 5);
  if (context != nullptr) *context = c;
  return ncclSuccess;
}

ncclResult_t InitV6(void** context, uint64_t comm_id, int* mask, const char* comm_name, int /*nNodes*/, int nranks,
                    int rank, ncclDebugLogger_t logfn) noexcept {
  void* c = Init(comm_id, comm_name, nranks, rank, mask, ncclProfileCeColl, logfn, 6);
  if (context != nullptr) *context = c;
  return ncclSuccess;
}

}  // namespace
}  // namespace lifeline::nccl_profiler

// The exported tables (the only symbols the library exports; everything else is hidden).
#define LIFELINE_EXPORT __attribute__((visibility("default")))
extern "C" {

LIFELINE_EXPORT lifeline::nccl_abi::ncclProfiler_v6_t ncclProfiler_v6 = {
    "lifeline",
    lifeline::nccl_profiler::InitV6,
    lifeline::nccl_profiler::StartEvent<lifeline::nccl_abi::ncclProfilerEventDescr_v6_t>,
    lifeline::nccl_profiler::StopEvent,
    lifeline::nccl_profiler::RecordEventState<lifeline::nccl_abi::ncclProfilerEventStateArgs_v6_t>,
    lifeline::nccl_profiler::FinalizeContext,
};

LIFELINE_EXPORT lifeline::nccl_abi::ncclProfiler_v5_t ncclProfiler_v5 = {
    "lifeline",
    lifeline::nccl_profiler::InitV5,
    lifeline::nccl_profiler::StartEvent<lifeline::nccl_abi::ncclProfilerEventDescr_v5_t>,
    lifeline::nccl_profiler::StopEvent,
    lifeline::nccl_profiler::RecordEventState<lifeline::nccl_abi::ncclProfilerEventStateArgs_v5_t>,
    lifeline::nccl_profiler::FinalizeContext,
};

LIFELINE_EXPORT lifeline::nccl_abi::ncclProfiler_v4_t ncclProfiler_v4 = {
    "lifeline",
    lifeline::nccl_profiler::InitV4,
    lifeline::nccl_profiler::StartEvent<lifeline::nccl_abi::ncclProfilerEventDescr_v4_t>,
    lifeline::nccl_profiler::StopEvent,
    lifeline::nccl_profiler::RecordEventState<lifeline::nccl_abi::ncclProfilerEventStateArgs_v4_t>,
    lifeline::nccl_profiler::FinalizeContext,
};

}  // extern "C"
