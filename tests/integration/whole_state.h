// Helpers shared by the asynchronous-save tests (tests/integration/async_save_test.cc) and the
// memory tier's (lib/src/tier/memory_tier_test.cc): one rank holding a whole state it may mutate, the
// options they save it with, and an Env whose data-file writes wait at a gate (a very slow disk).
#ifndef LIFELINE_TESTS_INTEGRATION_WHOLE_STATE_H_
#define LIFELINE_TESTS_INTEGRATION_WHOLE_STATE_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {

// A few multi-chunk tensors plus the usual dtype mix: enough bytes that copying takes a while.
inline std::vector<GlobalTensor> StateTensors(uint64_t salt) {
  std::vector<GlobalTensor> ts = StandardTensors(salt);
  ts.push_back(MakeTensor("big.a", DType::kF32, {512, 1024}, salt));   // 2 MiB
  ts.push_back(MakeTensor("big.b", DType::kBF16, {1000, 1031}, salt)); // odd size, ~2 MiB
  ts.push_back(MakeTensor("big.c", DType::kF64, {3, 77777}, salt));    // ~1.8 MiB
  return ts;
}

// One rank holding every tensor whole, in buffers it may mutate.
struct WholeState {
  std::vector<GlobalTensor> tensors;
  std::vector<std::vector<uint8_t>> live;  // what the "training loop" mutates

  explicit WholeState(uint64_t salt) : tensors(StateTensors(salt)) {
    for (const GlobalTensor& t : tensors) live.push_back(t.bytes);
  }
  SaveRequest Request() {
    SaveRequest req;
    for (size_t i = 0; i < tensors.size(); ++i)
      req.tensors.push_back(TensorShard::Whole(tensors[i].name, tensors[i].dtype, tensors[i].shape,
                                               live[i].empty() ? nullptr : live[i].data()));
    req.objects.emplace_back("rng", "rng-state");
    req.metadata_json = "{\"model\": \"test\"}";
    return req;
  }
  void Scribble(size_t i) {
    for (uint8_t& b : live[i]) b = static_cast<uint8_t>(b ^ 0x5A);
  }
  void ScribbleAll() {
    for (size_t i = 0; i < live.size(); ++i) Scribble(i);
  }
};

inline CheckpointerOptions BaseOptions(const std::string& dir) {
  CheckpointerOptions o;
  o.directory = dir;
  o.run_id = "async-test";
  o.chunk_bytes = 256 << 10;  // many pieces per tensor
  o.write_block_bytes = 1 << 20;
  return o;
}

inline std::string LoadAndCompare(Checkpointer* ckpt, std::optional<uint64_t> step, const std::vector<GlobalTensor>& want,
                           uint64_t* loaded_step = nullptr) {
  std::string diff;
  Result<uint64_t> got = LoadWholeAndCompare(ckpt, step, want, &diff);
  if (!got.ok()) return got.status().ToString();
  if (loaded_step != nullptr) *loaded_step = *got;
  return diff;
}

// Holds every write of data files until opened: a disk that is (very) slow.
class GatedEnv : public EnvWrapper {
 public:
  explicit GatedEnv(Env* target) : EnvWrapper(target) {}
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Blocks until a data write waits at the gate (a save is being persisted), or `seconds` passed:
  // whether one does.
  bool WaitUntilHeld(double seconds = 60) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return held_ > 0; });
  }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path, const FileOptions& options) override {
    LL_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, target()->NewWritableFile(path, options));
    if (path.find(".data") == std::string::npos) return file;
    return std::unique_ptr<WritableFile>(new Gated(this, std::move(file)));
  }

 private:
  // No fd(): queues call WriteAt, which waits for the gate.
  class Gated : public WritableFile {
   public:
    Gated(GatedEnv* env, std::unique_ptr<WritableFile> f) : env_(env), f_(std::move(f)) {}
    Status WriteAt(uint64_t offset, const void* src, size_t n) override {
      std::unique_lock<std::mutex> lock(env_->mu_);
      ++env_->held_;
      env_->cv_.notify_all();
      env_->cv_.wait(lock, [&] { return env_->open_; });
      --env_->held_;
      lock.unlock();
      return f_->WriteAt(offset, src, n);
    }
    Status Truncate(uint64_t size) override { return f_->Truncate(size); }
    Status Sync() override { return f_->Sync(); }
    Status Close() override { return f_->Close(); }
    const std::string& path() const override { return f_->path(); }
    bool direct() const override { return f_->direct(); }

   private:
    GatedEnv* env_;
    std::unique_ptr<WritableFile> f_;
  };

  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int held_ = 0;  // writes waiting at the gate
};

}  // namespace lifeline::testing

#endif  // LIFELINE_TESTS_INTEGRATION_WHOLE_STATE_H_
