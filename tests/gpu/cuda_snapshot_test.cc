// Device tensors through a Checkpointer (ctest label `gpu`): snapshots of CUDA memory are exactly
// the values at Save, ordered after the producer's kernels; FenceOn orders the optimizer's kernels
// after the copy without the CPU waiting; loads fill device targets. Skipped, saying so, where no
// CUDA device is visible; the last test runs everywhere and checks the error without a device.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/save/cuda_copy.h"
#include "lifeline/checkpoint.h"
#include "tests/gpu/kernels.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {
namespace {

constexpr long long kSlow = 200'000'000;  // ~0.1 s of spinning at GPU clocks: a slow kernel

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

class CudaSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::DeviceCount() == 0) GTEST_SKIP() << "SKIP: no CUDA device visible (cudaGetDeviceCount is 0)";
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    for (void* p : allocations_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  uint32_t* DeviceBuffer(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(uint32_t)), cudaSuccess);
    allocations_.push_back(p);
    return static_cast<uint32_t*>(p);
  }

  std::vector<uint32_t> ToHost(const uint32_t* d, size_t n) {
    std::vector<uint32_t> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

  static size_t Mismatches(const std::vector<uint32_t>& v, uint32_t seed) {
    size_t bad = 0;
    for (size_t i = 0; i < v.size(); ++i) bad += v[i] != FillValue(seed, i);
    return bad;
  }

  CheckpointerOptions Options(const TempDir& dir) {
    CheckpointerOptions o;
    o.directory = dir.Sub("ckpt");
    o.run_id = "gpu-test";
    o.staging_budget_bytes = 256ull << 20;
    return o;
  }

  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
};

TEST_F(CudaSnapshotTest, DeviceTensorsSnapshotAfterTheirProducerAndLoadBackIntoDevices) {
  TempDir dir;
  auto ckpt = Checkpointer::Open(Options(dir));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  // Odd sizes spanning several 4 MiB chunks, produced by a slow kernel still running at Save.
  const size_t n_a = (9u << 20) / 4 + 3, n_b = 1001;
  uint32_t* a = DeviceBuffer(n_a);
  uint32_t* b = DeviceBuffer(n_b);
  LaunchFill(a, n_a, 7, kSlow, stream_);
  LaunchFill(b, n_b, 8, 0, stream_);
  std::vector<uint32_t> host_c(777);
  for (size_t i = 0; i < host_c.size(); ++i) host_c[i] = FillValue(9, i);
  SaveRequest req;
  req.tensors.push_back(TensorShard::Whole("a", DType::kI32, {static_cast<int64_t>(n_a)}, a).OnDevice(0, stream_));
  req.tensors.push_back(TensorShard::Whole("b", DType::kI32, {static_cast<int64_t>(n_b)}, b).OnDevice(0, stream_));
  req.tensors.push_back(TensorShard::Whole("c", DType::kI32, {static_cast<int64_t>(host_c.size())}, host_c.data()));
  SaveTicket t = (*ckpt)->Save(5, req);
  ASSERT_TRUE(t.WaitCommitted(60).ok()) << t.Progress().status.ToString();

  uint32_t* a2 = DeviceBuffer(n_a);
  uint32_t* b2 = DeviceBuffer(n_b);
  CUDA_OK(cudaMemset(a2, 0, n_a * 4));
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("a", DType::kI32, {static_cast<int64_t>(n_a)}, a2).OnDevice(0));
  load.tensors.push_back(TensorShard::Whole("b", DType::kI32, {static_cast<int64_t>(n_b)}, b2).OnDevice(0));
  std::vector<uint32_t> c2(host_c.size());
  load.tensors.push_back(TensorShard::Whole("c", DType::kI32, {static_cast<int64_t>(c2.size())}, c2.data()));
  auto r = (*ckpt)->Load(5, load);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Mismatches(ToHost(a2, n_a), 7), 0u);
  EXPECT_EQ(Mismatches(ToHost(b2, n_b), 8), 0u);
  EXPECT_EQ(c2, host_c);
  // A slice of a device tensor into a host target: any layout, as for host saves.
  std::vector<uint32_t> piece(100);
  LoadRequest slice;
  slice.tensors.push_back(TensorShard::Box("a", DType::kI32, {static_cast<int64_t>(n_a)}, {5000}, {100}, piece.data()));
  ASSERT_TRUE((*ckpt)->Load(5, slice).ok());
  for (size_t i = 0; i < piece.size(); ++i) ASSERT_EQ(piece[i], FillValue(7, 5000 + i));
}

TEST_F(CudaSnapshotTest, AKernelQueuedAfterTheFenceNeverLeaksIntoTheSnapshot) {
  TempDir dir;
  auto ckpt = Checkpointer::Open(Options(dir));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  const size_t n = (32u << 20) / 4;  // 32 MiB
  uint32_t* w = DeviceBuffer(n);
  for (uint32_t step = 1; step <= 3; ++step) {
    LaunchFill(w, n, step, kSlow, stream_);  // the state at this step, produced by a slow kernel
    SaveRequest req;
    req.tensors.push_back(TensorShard::Whole("w", DType::kI32, {static_cast<int64_t>(n)}, w).OnDevice(0, stream_));
    const auto t0 = std::chrono::steady_clock::now();
    SaveTicket t = (*ckpt)->Save(step, req);
    ASSERT_TRUE(t.FenceOn(stream_).ok());
    const double stall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // The "optimizer": overwrites every element at once, on the same stream, right after the fence.
    LaunchFill(w, n, 100 + step, 0, stream_);
    ASSERT_TRUE(t.WaitCommitted(60).ok()) << t.Progress().status.ToString();
    std::printf("step %u: Save + FenceOn returned in %.3f ms while the producer kernel still ran\n", step, stall_ms);
  }
  CUDA_OK(cudaStreamSynchronize(stream_));
  EXPECT_EQ(Mismatches(ToHost(w, n), 103), 0u) << "the optimizer's kernel ran";
  for (uint32_t step = 1; step <= 3; ++step) {
    std::vector<uint32_t> back(n);
    LoadRequest load;
    load.tensors.push_back(TensorShard::Whole("w", DType::kI32, {static_cast<int64_t>(n)}, back.data()));
    ASSERT_TRUE((*ckpt)->Load(step, load).ok());
    EXPECT_EQ(Mismatches(back, step), 0u) << "step " << step << " holds values from after its Save";
  }
}

// Runs everywhere: without a device (or without CUDA in the build) a device shard fails its save
// with a message saying why, and the Checkpointer goes on saving host state.
TEST(CudaUnavailableTest, ADeviceShardWithoutADeviceFailsClearlyAndHostSavesGoOn) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present; the other tests cover it";
  TempDir dir;
  CheckpointerOptions o;
  o.directory = dir.Sub("ckpt");
  o.run_id = "no-gpu";
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok());
  std::vector<uint32_t> fake(16, 1);
  SaveRequest req;
  req.tensors.push_back(TensorShard::Whole("w", DType::kI32, {16}, fake.data()).OnDevice(0));
  SaveTicket t = (*ckpt)->Save(1, req);
  Status s = t.WaitSnapshot();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find(cuda::Built() ? "CUDA device 0" : "without CUDA"), std::string::npos) << s.ToString();
  EXPECT_FALSE(t.FenceOn(nullptr).ok());
  // Host state still saves, and loads; a device target of it fails naming the tensor.
  SaveRequest host;
  host.tensors.push_back(TensorShard::Whole("w", DType::kI32, {16}, fake.data()));
  ASSERT_TRUE((*ckpt)->Save(2, host).WaitCommitted(30).ok());
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("w", DType::kI32, {16}, fake.data()).OnDevice(0));
  auto r = (*ckpt)->Load(std::nullopt, load);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("tensor 'w'"), std::string::npos) << r.status().ToString();
  load.tensors[0].device = -1;
  EXPECT_TRUE((*ckpt)->Load(std::nullopt, load).ok());
}

}  // namespace
}  // namespace lifeline::testing
