// The NCCL profiler plugin ABI, versions 4, 5 and 6: the structs NCCL passes to a profiler plugin
// and the function tables it looks up in it, declared here from NCCL's plugin documentation
// (ext-profiler/README.md) and the per-version headers NCCL publishes for plugin authors
// (ext-profiler/example/nccl/profiler_v4.h, profiler_v5.h, and src/include/plugin/profiler/
// profiler_v6.h), because NCCL installs none of them. Only the layout matters: every struct below
// must match NCCL's field for field, and the static_asserts at the end pin each offset we read
// (x86-64 and aarch64 Linux, LP64).
//
// Which NCCL looks for which table (NCCL dlopens the plugin, then dlsyms the newest name it knows,
// falling back to older ones):
//   ncclProfiler_v4  the newest table of NCCL 2.27 (v4 added the KernelCh GPU timers and the
//                    communicator arguments of init)
//   ncclProfiler_v5  NCCL 2.28 (libnccl 2.28.9 knows v1..v5: its strings name getNcclProfiler_v5
//                    and nothing newer); adds the API events (GroupApi, CollApi, P2pApi,
//                    KernelLaunch), a 64-bit type field, and moves commId before the mask in init
//   ncclProfiler_v6  NCCL 2.29; v5 plus the copy-engine collective events (CeColl, CeSync, CeBatch)
//
// Everything is in namespace lifeline::nccl_abi so that this header and NCCL's own nccl.h can meet
// in one translation unit; the exported tables themselves are extern "C" (plugin.cc).
#ifndef LIFELINE_AGENT_NCCL_NCCL_PROFILER_ABI_H_
#define LIFELINE_AGENT_NCCL_NCCL_PROFILER_ABI_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace lifeline::nccl_abi {

// nccl.h's result codes (a C enum: an int in registers and in memory).
enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

// NCCL's debug logger, handed to init: prints only when NCCL_DEBUG asks for the level.
enum ncclDebugLogLevel : int {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5,
};
inline constexpr unsigned long kNcclLogInit = 0x1;  // the NCCL_INIT subsystem flag
using ncclDebugLogger_t = void (*)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                   const char* fmt, ...);

// Event types: bits of the activation mask init returns, and the `type` of a descriptor.
enum : uint64_t {
  ncclProfileGroup = 1u << 0,         // a group of operations launched together
  ncclProfileColl = 1u << 1,          // a collective, from launch (start) to enqueued (stop)
  ncclProfileP2p = 1u << 2,           // a send or a receive
  ncclProfileProxyOp = 1u << 3,       // the proxy thread's work for one channel and peer (child of Coll/P2p)
  ncclProfileProxyStep = 1u << 4,     // one network transfer of a ProxyOp (child of ProxyOp)
  ncclProfileProxyCtrl = 1u << 5,     // the proxy thread's own state
  ncclProfileKernelCh = 1u << 6,      // the kernel's work on one channel (child of Coll/P2p)
  ncclProfileNetPlugin = 1u << 7,     // defined by the network plugin
  ncclProfileGroupApi = 1u << 8,      // v5+: ncclGroupStart..End as the user called it
  ncclProfileCollApi = 1u << 9,       // v5+: the collective API call
  ncclProfileP2pApi = 1u << 10,       // v5+: the send/recv API call
  ncclProfileKernelLaunch = 1u << 11, // v5+: the kernel launch
  ncclProfileCeColl = 1u << 12,       // v6: a collective run by the copy engines
  ncclProfileCeSync = 1u << 13,       // v6: a copy-engine synchronisation (child of CeColl)
  ncclProfileCeBatch = 1u << 14,      // v6: a batch of copy-engine copies (child of CeColl)
};

// States passed to recordEventState. One enum for all versions (values are stable); a version
// passes only the states it knows.
enum ncclProfilerEventState_t : int {
  ncclProfilerProxyOpSendPosted = 0,  // 0..7: proxy-op states of v1..v3, unused since v4
  ncclProfilerProxyOpSendRemFifoWait = 1,
  ncclProfilerProxyOpSendTransmitted = 2,
  ncclProfilerProxyOpSendDone = 3,
  ncclProfilerProxyOpRecvPosted = 4,
  ncclProfilerProxyOpRecvReceived = 5,
  ncclProfilerProxyOpRecvTransmitted = 6,
  ncclProfilerProxyOpRecvDone = 7,
  ncclProfilerProxyStepSendGPUWait = 8,
  ncclProfilerProxyStepSendWait = 9,
  ncclProfilerProxyStepRecvWait = 10,
  ncclProfilerProxyStepRecvFlushWait = 11,
  ncclProfilerProxyStepRecvGPUWait = 12,
  ncclProfilerProxyCtrlIdle = 13,
  ncclProfilerProxyCtrlActive = 14,
  ncclProfilerProxyCtrlSleep = 15,
  ncclProfilerProxyCtrlWakeup = 16,
  ncclProfilerProxyCtrlAppend = 17,
  ncclProfilerProxyCtrlAppendEnd = 18,
  ncclProfilerProxyOpInProgress_v4 = 19,
  ncclProfilerProxyStepSendPeerWait_v4 = 20,
  ncclProfilerNetPluginUpdate = 21,
  ncclProfilerKernelChStop = 22,        // a KernelCh's GPU stop time (args.kernelCh.pTimer); stop follows
  ncclProfilerGroupStartApiStop = 23,   // v5+
  ncclProfilerGroupEndApiStart = 24,    // v5+
  ncclProfilerCeCollStart = 25,         // v6 ...
  ncclProfilerCeCollComplete = 26,
  ncclProfilerCeSyncStart = 27,
  ncclProfilerCeSyncComplete = 28,
  ncclProfilerCeBatchStart = 29,
  ncclProfilerCeBatchComplete = 30,
};

// ---- version 4 -------------------------------------------------------------------------------

struct ncclProfilerEventDescr_v4_t {
  uint8_t type;     // one ncclProfile* bit
  void* parentObj;  // the parent's handle as this plugin returned it (Coll: the Group)
  int rank;         // the rank in the communicator
  union {
    struct {
      uint64_t seqNumber;  // NCCL's count of this function on this communicator (per func, from 0)
      const char* func;    // "AllReduce", "AllGather", ... (ncclFuncToString)
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;  // "ncclFloat32", ... (ncclDatatypeToString)
      uint8_t nChannels;     // the channels it runs on: one KernelCh child each
      uint8_t nWarps;
      const char* algo;
      const char* proto;
    } coll;
    struct {
      const char* func;  // "Send" or "Recv"
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;  // GPU globaltimer at the channel's start
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
};

union ncclProfilerEventStateArgs_v4_t {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
};

struct ncclProfiler_v4_t {
  const char* name;
  ncclResult_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v4_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_v4_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};

// ---- version 5 -------------------------------------------------------------------------------

struct ncclProfilerEventDescr_v5_t {
  uint64_t type;    // one ncclProfile* bit (64 bits wide since v5)
  void* parentObj;  // Coll: the CollApi event; P2p: the P2pApi event; children: the Coll/P2p
  int rank;
  union {
    struct {
      bool graphCaptured;  // an int in NCCL 2.28's first v5 header; same size and offsets
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;  // the Group event, which v4 passed as parentObj
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
  };
};

// Same members as v4's (NCCL later added a kernelStep member of the same shape as kernelCh).
union ncclProfilerEventStateArgs_v5_t {
  struct {
    size_t transSize;
  } proxyStep;
  struct {
    int appendedProxyOps;
  } proxyCtrl;
  struct {
    void* data;
  } netPlugin;
  struct {
    uint64_t pTimer;
  } kernelCh;
};

struct ncclProfiler_v5_t {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v5_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_v5_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};

// ---- version 6 -------------------------------------------------------------------------------

// v5's descriptor with three copy-engine members added to the union; none of them is larger than
// `coll`, so every v5 offset and the size are unchanged. (Later NCCL also added a 32-byte
// kernelStep member, which changes nothing either.)
struct ncclProfilerEventDescr_v6_t {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
    struct {
      void* stream;
    } kernelLaunch;
    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;
      const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
      uint8_t nChannels;
      void* parentGroup;
    } p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      uint8_t channelId;
      uint64_t pTimer;
    } kernelCh;
    struct {
      int64_t id;
      void* data;
    } netPlugin;
    struct {
      uint64_t seqNumber;  // the communicator's count of copy-engine collectives
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
      const char* syncStrategy;  // "MC" (multicast) or "UC" (unicast)
      bool intraBatchSync;
      uint32_t batchSize;
      uint32_t numBatches;
      uint32_t ceSeqNum;
      void* stream;
    } ceColl;
    struct {
      bool isComplete;
      int nRanks;
    } ceCollSync;
    struct {
      int numOps;
      size_t totalBytes;
      bool useIntraSync;
    } ceCollBatch;
  };
};

using ncclProfilerEventStateArgs_v6_t = ncclProfilerEventStateArgs_v5_t;  // v6 adds no state arguments

struct ncclProfiler_v6_t {
  const char* name;
  ncclResult_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                       int nranks, int rank, ncclDebugLogger_t logfn);
  ncclResult_t (*startEvent)(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* eDescr);
  ncclResult_t (*stopEvent)(void* eHandle);
  ncclResult_t (*recordEventState)(void* eHandle, ncclProfilerEventState_t eState,
                                   ncclProfilerEventStateArgs_v6_t* eStateArgs);
  ncclResult_t (*finalize)(void* context);
};

// ---- layout checks (LP64): the offsets this plugin reads, as NCCL's C headers lay them out -----

static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8 && sizeof(int) == 4 && sizeof(pid_t) == 4,
              "the NCCL profiler ABI is declared for LP64 Linux");
static_assert(sizeof(ncclResult_t) == 4 && sizeof(ncclProfilerEventState_t) == 4, "C enums are ints");

#define LIFELINE_ABI_AT(T, member, off) static_assert(offsetof(T, member) == (off), #T "." #member)
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, parentObj, 8);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, rank, 16);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, coll.seqNumber, 24);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, coll.func, 32);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, coll.count, 56);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, coll.datatype, 72);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, coll.nChannels, 80);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, coll.proto, 96);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, p2p.datatype, 40);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, p2p.count, 48);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, p2p.peer, 56);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, p2p.nChannels, 60);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v4_t, kernelCh.pTimer, 32);
static_assert(sizeof(ncclProfilerEventDescr_v4_t) == 104, "v4 descriptor size");

LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, parentObj, 8);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, rank, 16);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, coll.func, 32);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, coll.count, 56);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, coll.datatype, 72);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, coll.nChannels, 80);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, coll.parentGroup, 104);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, p2p.peer, 56);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, p2p.nChannels, 60);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, p2p.parentGroup, 64);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v5_t, collApi.graphCaptured, 64);
static_assert(sizeof(ncclProfilerEventDescr_v5_t) == 112, "v5 descriptor size");

LIFELINE_ABI_AT(ncclProfilerEventDescr_v6_t, coll.nChannels, 80);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v6_t, p2p.nChannels, 60);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v6_t, ceColl.seqNumber, 24);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v6_t, ceColl.func, 32);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v6_t, ceColl.count, 56);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v6_t, ceColl.datatype, 72);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v6_t, ceColl.intraBatchSync, 88);
LIFELINE_ABI_AT(ncclProfilerEventDescr_v6_t, ceColl.stream, 104);
static_assert(sizeof(ncclProfilerEventDescr_v6_t) == 112, "v6 descriptor size (v5's, unchanged)");
static_assert(sizeof(ncclProfilerEventStateArgs_v4_t) == 8 && sizeof(ncclProfilerEventStateArgs_v5_t) == 8,
              "state arguments are one 8-byte member");

LIFELINE_ABI_AT(ncclProfiler_v4_t, init, 8);
LIFELINE_ABI_AT(ncclProfiler_v4_t, finalize, 40);
LIFELINE_ABI_AT(ncclProfiler_v5_t, finalize, 40);
LIFELINE_ABI_AT(ncclProfiler_v6_t, finalize, 40);
#undef LIFELINE_ABI_AT

}  // namespace lifeline::nccl_abi

#endif  // LIFELINE_AGENT_NCCL_NCCL_PROFILER_ABI_H_
