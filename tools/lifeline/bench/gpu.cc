// lifeline bench gpu: snapshots of device memory, against plain CUDA copies measured in the same run.
//
//   baseline   cudaMemcpy of --bytes from device to page-locked host memory (cudaHostAlloc): what
//              the PCIe/NVLink-C2C link gives one copy;
//   snapshot   a Checkpointer saving one device tensor of --bytes (staging pinned by the library),
//              Save -> WaitSnapshot (device copy + checksum of the staged bytes): the time until
//              the state may be mutated without a fence, and its bandwidth;
//   device     the library's device-to-host copy alone (Save -> FenceOn -> the fenced stream
//              drains), its bandwidth against the baseline;
//   stall      what the training thread spends in Save + FenceOn per snapshot (the zero-stall path:
//              the optimizer's kernels are then ordered after the copy on the GPU).
// Medians over --iterations saves (the first, which creates the copy stream and pins the slot, is
// reported apart). Needs a CUDA device; built only with the CUDA copy engine.
//
// --json fields: bytes, iterations, baseline_gbps, device_copy_gbps, ratio_to_memcpy,
// snapshot_gbps, snapshot_ms, stall_ms_median, stall_ms_max, first_stall_ms.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "lifeline/checkpoint.h"
#include "tools/lifeline/bench/bench.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

struct GpuOptions {
  std::string dir;
  std::string bytes = "1GiB";
  unsigned iterations = 5;
  int device = 0;
  bool json = false;
};

Status Cuda(cudaError_t err, const char* what) {
  return err == cudaSuccess ? Status::OK() : Status::IOError(what, cudaGetErrorString(err));
}

int RunGpu(const GpuOptions& o) {
  constexpr const char* kCommand = "bench gpu";
  Result<uint64_t> bytes = ParseByteSize(o.bytes);
  if (!bytes.ok() || *bytes < 4096 || *bytes % 4 != 0)
    return ReportFailure(kCommand, Status::InvalidArgument("--bytes", "a size of at least 4096, a multiple of 4"), o.json);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices <= o.device)
    return ReportFailure(kCommand, Status::NotSupported("bench gpu", "no CUDA device " + std::to_string(o.device)), o.json);
  Status s = Cuda(cudaSetDevice(o.device), "cudaSetDevice");
  void* dev = nullptr;
  void* pinned = nullptr;
  cudaStream_t stream = nullptr;
  if (s.ok()) s = Cuda(cudaMalloc(&dev, *bytes), "cudaMalloc");
  if (s.ok()) s = Cuda(cudaHostAlloc(&pinned, *bytes, cudaHostAllocDefault), "cudaHostAlloc");
  if (s.ok()) s = Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (s.ok()) s = Cuda(cudaMemset(dev, 0x5a, *bytes), "cudaMemset");
  auto cleanup = [&] {
    if (stream) cudaStreamDestroy(stream);
    if (pinned) cudaFreeHost(pinned);
    if (dev) cudaFree(dev);
  };
  if (!s.ok()) {
    cleanup();
    return ReportFailure(kCommand, s, o.json);
  }

  // Baseline: plain cudaMemcpy into pinned memory.
  std::vector<double> base;
  for (unsigned i = 0; i < o.iterations && s.ok(); ++i) {
    const double t0 = NowSeconds();
    s = Cuda(cudaMemcpy(pinned, dev, *bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    base.push_back(NowSeconds() - t0);
  }

  CheckpointerOptions co;
  co.directory = o.dir;
  co.run_id = NewRunId();
  co.staging_slots = 2;
  co.staging_budget_bytes = 2 * (*bytes + (16ull << 20));
  co.keep_last = 1;
  std::vector<double> stall, device_copy, snapshot;
  double first_stall = 0;
  if (s.ok()) {
    Result<std::unique_ptr<Checkpointer>> ckpt = Checkpointer::Open(co);
    if (!ckpt.ok()) s = ckpt.status();
    for (unsigned i = 0; s.ok() && i <= o.iterations; ++i) {
      SaveRequest req;
      req.tensors.push_back(TensorShard::Whole("w", DType::kU8, {static_cast<int64_t>(*bytes)}, dev).OnDevice(o.device, stream));
      const double t0 = NowSeconds();
      SaveTicket t = (*ckpt)->Save(1000 + i, req);
      s = t.FenceOn(stream);
      const double t1 = NowSeconds();
      if (s.ok()) s = Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      const double t2 = NowSeconds();
      if (s.ok()) s = t.WaitSnapshot();
      const double t3 = NowSeconds();
      if (s.ok()) s = t.WaitPersisted();
      if (i == 0) {
        first_stall = t1 - t0;
        continue;
      }
      stall.push_back(t1 - t0);
      device_copy.push_back(t2 - t0);
      snapshot.push_back(t3 - t0);
    }
  }
  cleanup();
  if (!s.ok()) return ReportFailure(kCommand, s, o.json);
  const double b = static_cast<double>(*bytes);
  const double base_gbps = b / Median(base) / 1e9;
  const double dev_gbps = b / Median(device_copy) / 1e9;
  const double snap_gbps = b / Median(snapshot) / 1e9;
  const double stall_max = *std::max_element(stall.begin(), stall.end());
  if (o.json) {
    PrintJson({{"ok", true}, {"command", kCommand}, {"bytes", *bytes}, {"iterations", o.iterations},
               {"baseline_gbps", base_gbps}, {"device_copy_gbps", dev_gbps}, {"ratio_to_memcpy", dev_gbps / base_gbps},
               {"snapshot_gbps", snap_gbps}, {"snapshot_ms", Median(snapshot) * 1e3},
               {"stall_ms_median", Median(stall) * 1e3}, {"stall_ms_max", stall_max * 1e3},
               {"first_stall_ms", first_stall * 1e3}});
  } else {
    std::cout << "bench gpu: " << FormatByteSize(*bytes) << " device tensor, " << o.iterations << " snapshots\n"
              << "  cudaMemcpy D2H into pinned memory  " << base_gbps << " GB/s (baseline)\n"
              << "  snapshot device copy              " << dev_gbps << " GB/s = " << dev_gbps / base_gbps
              << "x the baseline\n"
              << "  snapshot with checksums           " << snap_gbps << " GB/s (" << Median(snapshot) * 1e3 << " ms)\n"
              << "  Save + FenceOn on the caller      " << Median(stall) * 1e3 << " ms median, " << stall_max * 1e3
              << " ms max (first: " << first_stall * 1e3 << " ms)\n";
  }
  return kExitOk;
}

}  // namespace

void AddBenchGpuCommand(CLI::App* bench, std::vector<Command>* commands) {
  auto o = std::make_shared<GpuOptions>();
  CLI::App* app = bench->add_subcommand("gpu", "Device snapshots: D2H bandwidth against cudaMemcpy, stall with FenceOn");
  app->add_option("--dir", o->dir, "Checkpoint directory (scratch)")->required();
  app->add_option("--bytes", o->bytes, "Size of the device tensor (default 1GiB)");
  app->add_option("--iterations", o->iterations, "Measured snapshots (default 5)")->check(CLI::PositiveNumber);
  app->add_option("--device", o->device, "CUDA device ordinal (default 0)")->check(CLI::NonNegativeNumber);
  app->add_flag("--json", o->json, "Print one JSON object on stdout");
  commands->push_back(Command{app, [o] { return RunGpu(*o); }});
}

}  // namespace lifeline::cli
