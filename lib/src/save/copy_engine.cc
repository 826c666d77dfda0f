#include "lib/src/save/copy_engine.h"

#include "lib/src/env/thread_priority.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "formats/checksum.h"

namespace lifeline {
namespace internal {
#if defined(LIFELINE_AVX2_KERNEL)
// copy_kernel_avx2.cc
uint64_t CopyAndHashAvx2(uint8_t* dst, const uint8_t* src, uint64_t n);
void GatherBandAndHashAvx2(const uint8_t* const* sources, uint8_t* const* dsts, size_t count, uint64_t stride,
                           uint64_t run, uint64_t offset, uint64_t n, uint64_t* checksums);
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

void GatherBandAndHash(const uint8_t* const* sources, uint8_t* const* dsts, size_t count, uint64_t stride,
                       uint64_t run, uint64_t offset, uint64_t n, uint64_t* checksums) {
#if defined(LIFELINE_AVX2_KERNEL)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return internal::GatherBandAndHashAvx2(sources, dsts, count, stride, run, offset, n, checksums);
#endif
  std::vector<std::unique_ptr<format::StreamingChecksum>> hashers;
  for (size_t b = 0; b < count; ++b) hashers.push_back(std::make_unique<format::StreamingChecksum>());
  uint64_t in_row = offset % run;
  uint64_t row_start = offset / run * stride;
  for (uint64_t done = 0; done < n; row_start += stride, in_row = 0) {
    const uint64_t take = std::min(n - done, run - in_row);
    for (size_t b = 0; b < count; ++b) {
      const uint8_t* s = sources[b] + row_start + in_row;
      std::memcpy(dsts[b] + done, s, take);
      hashers[b]->Update(s, take);
    }
    done += take;
  }
  for (size_t b = 0; b < count; ++b) checksums[b] = hashers[b]->Digest();
}

namespace {

// The column-block pieces of the band that starts at piece `first` (one piece when it is alone),
// copied in one pass over their rows; nothing is read when the job is cancelled, and every piece
// is reported done.
void CopyBand(internal::SaveJob& job, size_t first) {
  const internal::CopyPiece& p = job.piece(first);
  const size_t count = p.band;
  std::array<const uint8_t*, internal::kMaxBandPieces> sources{};
  std::array<uint8_t*, internal::kMaxBandPieces> dsts{};
  std::array<uint64_t, internal::kMaxBandPieces> checksums{};
  if (!job.cancelled()) {
    for (size_t b = 0; b < count; ++b) {
      sources[b] = job.piece(first + b).source;
      dsts[b] = job.image + job.piece(first + b).image_offset;
    }
    GatherBandAndHash(sources.data(), dsts.data(), count, p.source_stride, p.run_bytes, p.source_offset, p.length,
                      checksums.data());
  }
  for (size_t b = 0; b < count; ++b) job.PieceDone(first + b, checksums[b]);
}

}  // namespace

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
      if (p.verify) {  // a replica's copy of a part another replica writes: hashed, never copied
        job->PieceDone(*i, job->cancelled() ? 0 : format::Checksum64(p.source, p.length));
        continue;
      }
      if (p.source_stride != 0) {  // column blocks (host memory only): a band, or a block alone
        CopyBand(*job, *i);
        continue;
      }
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
        checksum = CopyAndHash(job->image + p.image_offset, p.source, p.length);
      }
      job->PieceDone(*i, checksum);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!jobs_.empty() && jobs_.front() == job) jobs_.pop_front();
  }
}

}  // namespace lifeline
