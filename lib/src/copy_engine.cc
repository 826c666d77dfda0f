#include "lib/src/copy_engine.h"

#include <algorithm>
#include <cstring>

#include "formats/checksum.h"

namespace lifeline {

uint64_t CopyAndHash(uint8_t* dst, const uint8_t* src, uint64_t n) {
  constexpr uint64_t kStep = 256 << 10;  // fits in L2 next to its source
  format::StreamingChecksum hasher;
  for (uint64_t done = 0; done < n;) {
    const uint64_t take = std::min(kStep, n - done);
    std::memcpy(dst + done, src + done, take);
    hasher.Update(dst + done, take);
    done += take;
  }
  return hasher.Digest();
}

CopyEngine::CopyEngine(unsigned threads) {
  threads = std::max(1u, threads);
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

CopyEngine::~CopyEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void CopyEngine::Submit(std::shared_ptr<internal::SaveJob> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
  }
  work_.notify_all();
}

void CopyEngine::Run() {
  for (;;) {
    std::shared_ptr<internal::SaveJob> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left
      job = jobs_.front();
      if (job->pieces.empty()) {
        jobs_.pop_front();
        lock.unlock();
        job->CompleteEmptyCopy();
        continue;
      }
    }
    for (std::optional<size_t> i; (i = job->ClaimPiece());) {
      const internal::CopyPiece& p = job->pieces[*i];
      uint64_t checksum = 0;
      if (!job->cancelled()) checksum = CopyAndHash(job->image + p.image_offset, p.source, p.length);
      job->PieceDone(*i, checksum);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!jobs_.empty() && jobs_.front() == job) jobs_.pop_front();
  }
}

}  // namespace lifeline
