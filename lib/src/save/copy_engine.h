// The threads that copy snapshots into the staging arena. Jobs are served in the order they were
// submitted; every thread works on the oldest job until all its pieces are claimed. A piece is
// copied in cache-sized steps and hashed right after each step, while it is still in cache, so the
// checksum costs no second pass over memory. A band of column blocks is copied as one piece of
// work, reading its rows once (GatherBandAndHash).
//
// Thread safety: Submit may be called from any thread.
#ifndef LIFELINE_SRC_COPY_ENGINE_H_
#define LIFELINE_SRC_COPY_ENGINE_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lib/src/save/save_job.h"
#include "lifeline/internal/copy_kernel.h"  // CopyAndHash

namespace lifeline {

// The copy of a band (save_job.h, CopyPiece::band): bytes [offset, offset + n) of the packed runs
// of `count` column blocks of one shard, block b's runs `run` bytes long, one every `stride`
// bytes from sources[b], copied to dsts[b] and hashed into checksums[b] (the format's XXH3-64).
// The shard is read row by row, once, in order, each row's runs going to their blocks, so a band
// costs what a straight copy of its bytes does rather than `count` strided passes (the AVX2
// variant where the CPU has it). Thread-safe; no destination may overlap a source or another.
void GatherBandAndHash(const uint8_t* const* sources, uint8_t* const* dsts, size_t count, uint64_t stride,
                       uint64_t run, uint64_t offset, uint64_t n, uint64_t* checksums);

class CopyEngine {
 public:
  // The threads run `nice_levels` below their creator's priority (see thread_priority.h).
  CopyEngine(unsigned threads, int nice_levels);
  // Finishes every submitted job first.
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  void Submit(std::shared_ptr<internal::SaveJob> job);
  unsigned threads() const { return static_cast<unsigned>(threads_.size()); }

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable work_;
  std::deque<std::shared_ptr<internal::SaveJob>> jobs_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                                // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_COPY_ENGINE_H_
