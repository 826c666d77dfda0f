#include "lib/src/save/cuda_copy.h"

#include <string>

#if defined(LIFELINE_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace lifeline::cuda {

#if defined(LIFELINE_HAVE_CUDA)

namespace {

Status CudaError(cudaError_t err, const std::string& what) {
  return Status::IOError(what, std::string("CUDA error ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// Runs `fn` with `device` current on the calling thread, then restores the previous device.
template <typename Fn>
Status OnDevice(int device, Fn&& fn) {
  int previous = 0;
  cudaError_t err = cudaGetDevice(&previous);
  if (err != cudaSuccess) return CudaError(err, "cudaGetDevice");
  if (previous != device && (err = cudaSetDevice(device)) != cudaSuccess)
    return CudaError(err, "cudaSetDevice(" + std::to_string(device) + ")");
  Status s = fn();
  if (previous != device) cudaSetDevice(previous);
  return s;
}

class CudaFence final : public Fence {
 public:
  CudaFence(int device, cudaEvent_t event) : device_(device), event_(event) {}
  ~CudaFence() override { cudaEventDestroy(event_); }

  Status Synchronize() override {
    const cudaError_t err = cudaEventSynchronize(event_);
    return err == cudaSuccess ? Status::OK() : CudaError(err, "waiting for the snapshot's device copies");
  }

  Status OrderStream(void* stream) override {
    const cudaError_t err = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0);
    return err == cudaSuccess ? Status::OK() : CudaError(err, "ordering a stream after the snapshot's device copies");
  }

 private:
  int device_;
  cudaEvent_t event_;
};

class CudaCopyStream final : public CopyStream {
 public:
  CudaCopyStream(int device, cudaStream_t stream, cudaEvent_t producer_done)
      : device_(device), stream_(stream), producer_done_(producer_done) {}
  ~CudaCopyStream() override {
    OnDevice(device_, [&] {
      cudaStreamSynchronize(stream_);
      cudaEventDestroy(producer_done_);
      cudaStreamDestroy(stream_);
      return Status::OK();
    }).IgnoreError();
  }

  int device() const override { return device_; }

  Status WaitFor(void* producer) override {
    return OnDevice(device_, [&] {
      cudaError_t err = cudaEventRecord(producer_done_, static_cast<cudaStream_t>(producer));
      if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, producer_done_, 0);
      return err == cudaSuccess ? Status::OK() : CudaError(err, "ordering the snapshot after the producer stream");
    });
  }

  Status CopyToHost(void* dst, const void* src, size_t n) override {
    return OnDevice(device_, [&] {
      const cudaError_t err = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_);
      return err == cudaSuccess ? Status::OK()
                                : CudaError(err, "copying " + std::to_string(n) + " bytes from device " +
                                                     std::to_string(device_));
    });
  }

  Result<std::shared_ptr<Fence>> Record() override {
    std::shared_ptr<Fence> fence;
    Status s = OnDevice(device_, [&] {
      cudaEvent_t event;
      cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (err != cudaSuccess) return CudaError(err, "cudaEventCreate");
      err = cudaEventRecord(event, stream_);
      if (err != cudaSuccess) {
        cudaEventDestroy(event);
        return CudaError(err, "cudaEventRecord");
      }
      fence = std::make_shared<CudaFence>(device_, event);
      return Status::OK();
    });
    if (!s.ok()) return s;
    return fence;
  }

 private:
  int device_;
  cudaStream_t stream_;
  cudaEvent_t producer_done_;
};

}  // namespace

bool Built() { return true; }

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

Result<std::unique_ptr<CopyStream>> CopyStream::Create(int device) {
  const int n = DeviceCount();
  if (device < 0 || device >= n)
    return Status::InvalidArgument("CUDA device " + std::to_string(device),
                                   "does not exist (" + std::to_string(n) + " device(s) visible)");
  std::unique_ptr<CopyStream> out;
  Status s = OnDevice(device, [&] {
    cudaStream_t stream;
    cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return CudaError(err, "cudaStreamCreate");
    cudaEvent_t event;
    err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      cudaStreamDestroy(stream);
      return CudaError(err, "cudaEventCreate");
    }
    out = std::make_unique<CudaCopyStream>(device, stream, event);
    return Status::OK();
  });
  if (!s.ok()) return s;
  return out;
}

Status PinHostMemory(void* p, size_t n) {
  const cudaError_t err = cudaHostRegister(p, n, cudaHostRegisterPortable);
  if (err == cudaSuccess) return Status::OK();
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();  // clear the runtime's last error: registering twice is fine
    return Status::OK();
  }
  cudaGetLastError();
  return CudaError(err, "pinning " + std::to_string(n) + " bytes of staging memory");
}

void UnpinHostMemory(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

Status CopyToDevice(int device, void* dst, const void* src, size_t n) {
  return OnDevice(device, [&] {
    const cudaError_t err = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
    return err == cudaSuccess ? Status::OK()
                              : CudaError(err, "copying " + std::to_string(n) + " bytes to device " + std::to_string(device));
  });
}

#else  // !LIFELINE_HAVE_CUDA

namespace {
Status NotBuilt() {
  return Status::NotSupported("device tensors", "this liblifeline was built without CUDA (LIFELINE_CUDA=OFF or no "
                                                "toolkit found at build time)");
}
}  // namespace

bool Built() { return false; }
int DeviceCount() { return 0; }
Result<std::unique_ptr<CopyStream>> CopyStream::Create(int) { return NotBuilt(); }
Status PinHostMemory(void*, size_t) { return NotBuilt(); }
void UnpinHostMemory(void*) {}
Status CopyToDevice(int, void*, const void*, size_t) { return NotBuilt(); }

#endif

}  // namespace lifeline::cuda
