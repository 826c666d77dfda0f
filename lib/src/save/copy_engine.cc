#include "lib/src/save/copy_engine.h"

#include "lib/src/env/thread_priority.h"

#include <algorithm>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "formats/checksum.h"

namespace lifeline {
namespace internal {
#if defined(LIFELINE_AVX2_KERNEL)
uint64_t CopyAndHashAvx2(uint8_t* dst, const uint8_t* src, uint64_t n);  // copy_kernel_avx2.cc
#endif
}  // namespace internal

namespace {

// Copies with streaming (non-temporal) stores: the staging arena is read next by the disk's DMA,
// not by this core, so writing around the cache saves the read-for-ownership of every destination
// line and leaves the cache to the source, which the checksum reads right after.
void StreamCopy(uint8_t* dst, const uint8_t* src, uint64_t n) {
#if defined(__SSE2__)
  if (n >= 4096) {
    const uint64_t head = (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15;
    std::memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    uint64_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, n - i);
    _mm_sfence();  // streaming stores are weakly ordered: complete them before the piece is published
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace

uint64_t CopyAndHash(uint8_t* dst, const uint8_t* src, uint64_t n) {
#if defined(LIFELINE_AVX2_KERNEL)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return internal::CopyAndHashAvx2(dst, src, n);
#endif
  constexpr uint64_t kStep = 16 << 10;  // stays in L1 between the copy and the checksum
  format::StreamingChecksum hasher;
  for (uint64_t done = 0; done < n;) {
    const uint64_t take = std::min(kStep, n - done);
    StreamCopy(dst + done, src + done, take);
    // The source's bytes, still in cache; they equal the copy's because the caller does not
    // mutate the state before the snapshot completes (the contract of SaveTicket::WaitSnapshot).
    hasher.Update(src + done, take);
    done += take;
  }
  return hasher.Digest();
}

CopyEngine::CopyEngine(unsigned threads, int nice_levels) {
  threads = std::max(1u, threads);
  for (unsigned i = 0; i < threads; ++i)
    threads_.emplace_back([this, nice_levels] {
      LowerCallingThreadPriority(nice_levels);
      Run();
    });
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
  // One thread is woken here and each woken thread wakes the next (Run): waking them all at once
  // from the training thread lets one take that thread's core on a small machine, inside Save's
  // stall (2 cores, 2 copy threads: Save's "submit" part took 0.5-2.1 ms, 0.03 ms with one woken here).
  work_.notify_one();
}

void CopyEngine::Run() {
  for (;;) {
    std::shared_ptr<internal::SaveJob> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left
      job = jobs_.front();
      if (job->num_pieces() == 0) {
        jobs_.pop_front();
        lock.unlock();
        job->CompleteEmptyCopy();
        continue;
      }
    }
    work_.notify_one();  // the next thread joins this job (and wakes the one after it)
    for (std::optional<size_t> i; (i = job->ClaimPiece());) {
      const internal::CopyPiece& p = job->piece(*i);
      uint64_t checksum = 0;
      if (p.device) {
        // The device's copy engine has written (or is writing) the bytes into the image: wait for
        // it, even for a cancelled job (the slot must not be reused under a DMA write), then
        // checksum them where they landed.
        Status s = job->WaitDeviceCopies();
        if (!s.ok()) {
          job->Fail(s.Annotate("snapshot of step " + std::to_string(job->step)));
        } else if (!job->cancelled()) {
          checksum = format::Checksum64(job->image + p.image_offset, p.length);
        }
      } else if (!job->cancelled()) {
        uint8_t* dst = job->image + p.image_offset;
        if (p.source_stride == 0) {
          checksum = CopyAndHash(dst, p.source, p.length);
        } else {  // a piece of a column block: gathered, then hashed while still in cache
          GatherRuns(p.source, p.source_stride, p.run_bytes, p.source_offset, p.length, dst);
          checksum = format::Checksum64(dst, p.length);
        }
      }
      job->PieceDone(*i, checksum);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!jobs_.empty() && jobs_.front() == job) jobs_.pop_front();
  }
}

}  // namespace lifeline
