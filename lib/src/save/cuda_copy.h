// The CUDA side of snapshots and loads: device-to-host copies of device tensors into pinned host
// staging on a dedicated stream per device, ordered after the work queued on the producer's
// stream; fences that order a training stream after those copies on the GPU; host-to-device copies
// for loads. Built with the CUDA runtime when the toolkit was found (LIFELINE_CUDA AUTO/ON);
// otherwise every call fails with NotSupported naming the build option, and nothing else changes.
// No CUDA call is made until a device tensor is saved or loaded, so a CUDA-enabled library runs on
// machines without a GPU or a driver.
//
// Thread safety: CopyStream is used by one thread at a time (Checkpointer::Save); a Fence may be
// waited on from any thread.
#ifndef LIFELINE_SRC_CUDA_COPY_H_
#define LIFELINE_SRC_CUDA_COPY_H_

#include <cstddef>
#include <memory>

#include "lifeline/status.h"

namespace lifeline::cuda {

// True when this library was built with CUDA.
bool Built();
// CUDA devices visible to this process; 0 when none, without a driver, or not built with CUDA.
int DeviceCount();

// An event recorded on a copy stream after some copies. Destroying it releases the event.
class Fence {
 public:
  virtual ~Fence() = default;
  // Blocks the calling thread until the copies before the fence have finished.
  virtual Status Synchronize() = 0;
  // Makes `stream` (a cudaStream_t; nullptr is the legacy default stream) wait on the GPU for the
  // copies before the fence; the calling thread does not wait.
  virtual Status OrderStream(void* stream) = 0;
};

class CopyStream {
 public:
  // A non-blocking stream on device `device`. NotSupported without CUDA; InvalidArgument when the
  // device does not exist.
  static Result<std::unique_ptr<CopyStream>> Create(int device);
  virtual ~CopyStream() = default;

  virtual int device() const = 0;
  // Orders the copies queued next after everything queued so far on `producer` (cudaStream_t;
  // nullptr: the legacy default stream).
  virtual Status WaitFor(void* producer) = 0;
  // Queues a copy of n bytes from device memory `src` to host memory `dst`.
  virtual Status CopyToHost(void* dst, const void* src, size_t n) = 0;
  // A fence after every copy queued so far.
  virtual Result<std::shared_ptr<Fence>> Record() = 0;
};

// Page-locks [p, p + n) for the device's DMA engines (cudaHostRegister), so copies into it run at
// full speed and asynchronously. Safe to call again on memory already registered.
Status PinHostMemory(void* p, size_t n);
void UnpinHostMemory(void* p);

// Copies n bytes from host `src` to device memory `dst` on `device` and waits for the copy.
Status CopyToDevice(int device, void* dst, const void* src, size_t n);

}  // namespace lifeline::cuda

#endif  // LIFELINE_SRC_CUDA_COPY_H_
