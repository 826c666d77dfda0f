// The copy engine: a snapshot's bytes land in the staging image unchanged, and each piece's
// checksum is the format's (XXH3-64, seed 0) of those bytes, whichever kernel the CPU gets.
#include "lib/src/save/copy_engine.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/checksum.h"
#include "lib/src/env/aligned_buffer.h"
#include "lib/src/save/save_job.h"
#include "lib/src/save/save_plan.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
#if defined(__x86_64__)
namespace internal {
// copy_kernel_avx2.cc
uint64_t CopyAndHashAvx2(uint8_t* dst, const uint8_t* src, uint64_t n);
void GatherBandAndHashAvx2(const uint8_t* const* sources, uint8_t* const* dsts, size_t count, uint64_t stride,
                           uint64_t run, uint64_t offset, uint64_t n, uint64_t* checksums);
}  // namespace internal
#endif

namespace copy_engine_test {

// Sizes around the kernels' edges: the 16-byte and 32-byte heads, the 64- and 128-byte loops, the
// 4 KiB streaming threshold and the 16 KiB cache step.
const uint64_t kSizes[] = {0, 1, 15, 16, 31, 33, 63, 64, 127, 129, 4095, 4096, 4097, 16383, 16384, 16385,
                           100003, (1 << 20) + 13};

using Kernel = uint64_t (*)(uint8_t*, const uint8_t*, uint64_t);

// Copies with `kernel` at every size and several misalignments of both ends; expects the bytes
// copied exactly (and nothing written past the end) and the format's checksum returned.
void ExpectCopiesAndHashesLikeTheFormat(Kernel kernel) {
  const uint64_t max = kSizes[sizeof(kSizes) / sizeof(kSizes[0]) - 1];
  const std::string src = test::PatternBytes(max + 64, 3);
  std::vector<uint8_t> dst(max + 128);
  for (uint64_t n : kSizes) {
    for (size_t src_shift : {0, 1, 7}) {
      for (size_t dst_shift : {0, 3, 16, 31}) {
        std::memset(dst.data(), 0xEE, dst.size());
        const uint8_t* s = reinterpret_cast<const uint8_t*>(src.data()) + src_shift;
        const uint64_t got = kernel(dst.data() + dst_shift, s, n);
        ASSERT_EQ(format::Checksum64(s, n), got) << "n=" << n << " src+" << src_shift << " dst+" << dst_shift;
        ASSERT_EQ(0, std::memcmp(dst.data() + dst_shift, s, n)) << "n=" << n << " dst+" << dst_shift;
        ASSERT_EQ(0xEE, dst[dst_shift + n]) << "wrote past the end, n=" << n;
        if (dst_shift > 0) {
          ASSERT_EQ(0xEE, dst[dst_shift - 1]) << "wrote before the start, n=" << n;
        }
      }
    }
  }
}

TEST(CopyEngineTest, CopyAndHashCopiesExactlyAndReturnsTheFormatsChecksum) {
  ExpectCopiesAndHashesLikeTheFormat(&CopyAndHash);
}

#if defined(__x86_64__)
TEST(CopyEngineTest, Avx2KernelAgreesWithTheFormatsChecksum) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "this CPU has no AVX2";
  ExpectCopiesAndHashesLikeTheFormat(&internal::CopyAndHashAvx2);
}
#endif

using BandKernel = void (*)(const uint8_t* const*, uint8_t* const*, size_t, uint64_t, uint64_t, uint64_t, uint64_t,
                            uint64_t*);

// Bands of `count` blocks of `run` bytes a row in rows of `stride` bytes (each block's runs start
// `run` bytes after the previous block's), copied from several offsets (inside a row too) and
// lengths (ending inside a row too) to destinations of every alignment: each block's bytes are
// those GatherRuns takes, nothing is written around them, and each checksum is the format's.
void ExpectBandsCopiedLikeGatherRuns(BandKernel kernel) {
  struct Shape {
    size_t count;
    uint64_t run, stride;
  };
  for (const Shape& shape : {Shape{16, 256, 4096}, Shape{3, 342, 1026 + 64}, Shape{1, 100, 300}, Shape{20, 64, 1280},
                             Shape{2, 4096, 8192}}) {
    const uint64_t rows = 97;
    const std::string src = test::PatternBytes(rows * shape.stride + 64, 5);
    const uint64_t block_bytes = rows * shape.run;
    for (uint64_t offset : {uint64_t{0}, shape.run / 2, 3 * shape.run, 3 * shape.run + 7}) {
      for (uint64_t n : {uint64_t{1}, shape.run, 5 * shape.run + 13, block_bytes - offset}) {
        if (offset + n > block_bytes) continue;
        for (size_t dst_shift : {0, 5, 32}) {
          std::vector<std::vector<uint8_t>> dst(shape.count, std::vector<uint8_t>(n + 64, 0xEE));
          std::vector<const uint8_t*> sources;
          std::vector<uint8_t*> dsts;
          for (size_t b = 0; b < shape.count; ++b) {
            sources.push_back(reinterpret_cast<const uint8_t*>(src.data()) + 16 + b * shape.run);
            dsts.push_back(dst[b].data() + dst_shift);
          }
          std::vector<uint64_t> checksums(shape.count, 0);
          kernel(sources.data(), dsts.data(), shape.count, shape.stride, shape.run, offset, n, checksums.data());
          for (size_t b = 0; b < shape.count; ++b) {
            std::vector<uint8_t> want(n);
            GatherRuns(sources[b], shape.stride, shape.run, offset, n, want.data());
            const std::string where = "run " + std::to_string(shape.run) + " block " + std::to_string(b) +
                                      " offset " + std::to_string(offset) + " n " + std::to_string(n) + " dst+" +
                                      std::to_string(dst_shift);
            ASSERT_EQ(0, std::memcmp(want.data(), dsts[b], n)) << where;
            ASSERT_EQ(format::Checksum64(want.data(), n), checksums[b]) << where;
            ASSERT_EQ(0xEE, dst[b][dst_shift + n]) << "wrote past the end, " << where;
            if (dst_shift > 0) ASSERT_EQ(0xEE, dst[b][dst_shift - 1]) << "wrote before the start, " << where;
          }
        }
      }
    }
  }
}

TEST(CopyEngineTest, GatherBandAndHashCopiesEachBlockAsGatherRunsDoesWithTheFormatsChecksum) {
  ExpectBandsCopiedLikeGatherRuns(&GatherBandAndHash);
}

#if defined(__x86_64__)
TEST(CopyEngineTest, Avx2BandKernelAgreesWithGatherRunsAndTheFormatsChecksum) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "this CPU has no AVX2";
  ExpectBandsCopiedLikeGatherRuns(&internal::GatherBandAndHashAvx2);
}
#endif

// A job of `n` bytes copied from `source` in `chunk`-byte pieces of one tensor.
std::shared_ptr<internal::SaveJob> MakeJob(uint64_t step, const std::string& source, uint64_t chunk, uint8_t* image) {
  auto job = std::make_shared<internal::SaveJob>(step, nullptr, "/ckpt");
  job->image = image;
  job->block_bytes = 4096;
  job->layout.bytes = source.size();
  job->bytes_total = source.size();
  for (uint64_t at = 0, k = 0; at < source.size(); at += chunk, ++k) {
    internal::CopyPiece p;
    p.source = reinterpret_cast<const uint8_t*>(source.data()) + at;
    p.image_offset = at;
    p.length = std::min<uint64_t>(chunk, source.size() - at);
    p.target = k;
    job->pieces.push_back(p);
    job->index.chunks.emplace_back();
  }
  job->InitCounters(1);
  return job;
}

TEST(CopyEngineTest, JobsAreCopiedWholeWithEveryChunksChecksumInTheIndex) {
  const uint64_t kBytes = 300000, kChunk = 4096 * 3 + 8;
  const std::string a = test::PatternBytes(kBytes, 1), b = test::PatternBytes(kBytes / 2, 2);
  AlignedBuffer image_a(kBytes), image_b(kBytes);
  auto job_a = MakeJob(1, a, kChunk, image_a.data());
  auto job_b = MakeJob(2, b, kChunk, image_b.data());
  auto empty = MakeJob(3, "", kChunk, nullptr);
  {
    CopyEngine engine(3, 0);
    EXPECT_EQ(3u, engine.threads());
    engine.Submit(job_a);
    engine.Submit(empty);
    engine.Submit(job_b);
    ASSERT_TRUE(job_a->WaitSnapshot().ok());
    ASSERT_TRUE(empty->WaitSnapshot().ok());
    ASSERT_TRUE(job_b->WaitSnapshot().ok());
  }
  EXPECT_TRUE(job_a->TensorCopied(0));
  EXPECT_TRUE(job_a->WaitCopiedThrough(kBytes));
  EXPECT_EQ(0, std::memcmp(image_a.data(), a.data(), a.size()));
  EXPECT_EQ(0, std::memcmp(image_b.data(), b.data(), b.size()));
  for (const auto* job : {job_a.get(), job_b.get()}) {
    const std::string& src = job == job_a.get() ? a : b;
    ASSERT_EQ(job->pieces.size(), job->index.chunks.size());
    for (size_t k = 0; k < job->pieces.size(); ++k)
      EXPECT_EQ(format::Checksum64(src.data() + job->pieces[k].image_offset, job->pieces[k].length),
                job->index.chunks[k].checksum)
          << "step " << job->step << " chunk " << k;
  }
}

}  // namespace copy_engine_test
}  // namespace lifeline
