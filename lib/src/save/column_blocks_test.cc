// Column blocks (CheckpointerOptions::column_blocks): shards split along columns stored as blocks
// of whole columns. What is planned (blocks, the partial rows of a ZeRO piece kept packed, shards
// too small or not split left alone), the bytes each block holds, and what a user notices: a load
// at another tensor-parallel degree gets every element right and reads about the bytes it needs,
// where the row-major layout reads twice as much.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/checksum.h"
#include "formats/geometry.h"
#include "lib/src/env/aligned_buffer.h"
#include "lib/src/save/copy_engine.h"
#include "lib/src/save/rank_data.h"
#include "lib/src/save/save_job.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace column_blocks_test {

constexpr int64_t kRows = 256;
constexpr int64_t kCols = 2048;  // f32: 8 KiB rows

float ValueAt(int64_t row, int64_t col) { return static_cast<float>(row * kCols + col); }

// Columns [c0, c0 + n) of every row of the global tensor, row-major: what a rank holding that
// column split keeps in memory.
std::vector<float> Columns(int64_t c0, int64_t n) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(kRows * n));
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = c0; c < c0 + n; ++c) out.push_back(ValueAt(r, c));
  return out;
}

SaveRequest OneShard(TensorShard s) {
  SaveRequest r;
  r.tensors.push_back(std::move(s));
  return r;
}

TEST(ColumnBlocksPlanTest, AColumnSplitShardIsStoredAsBlocksOfWholeColumnsHoldingTheirBytes) {
  std::vector<float> half = Columns(kCols / 2, kCols / 2);  // 1024 columns: 4 KiB a row
  const SaveRequest req =
      OneShard(TensorShard::Box("w", DType::kF32, {kRows, kCols}, {0, kCols / 2}, {kRows, kCols / 2}, half.data()));

  Result<RankSavePlan> rows = PlanRankSave(req, 1 << 20, true, /*column_blocks=*/false);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(1u, rows->fragments.size());

  Result<RankSavePlan> plan = PlanRankSave(req, 1 << 20, true, /*column_blocks=*/true);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(16u, plan->fragments.size());  // 4 KiB rows: 16 blocks of 256 bytes a row
  for (size_t b = 0; b < plan->fragments.size(); ++b) {
    const PlannedFragment& f = plan->fragments[b];
    const int64_t c0 = kCols / 2 + static_cast<int64_t>(b) * 64;
    EXPECT_EQ(format::RegionOfBox({0, c0}, {kRows, 64}), f.region) << "block " << b;
    std::vector<float> bytes(kRows * 64);
    CopyFragmentBytes(f, 0, bytes.size() * sizeof(float), reinterpret_cast<uint8_t*>(bytes.data()));
    EXPECT_EQ(Columns(c0, 64), bytes) << "block " << b;
    // A piece starting mid-row (a chunk edge) gathers from the right place too.
    std::vector<float> tail(10);
    CopyFragmentBytes(f, (3 * 64 + 60) * sizeof(float), tail.size() * sizeof(float), reinterpret_cast<uint8_t*>(tail.data()));
    EXPECT_EQ(ValueAt(3, c0 + 60), tail[0]);
    EXPECT_EQ(ValueAt(4, c0 + 5), tail[9]);
  }
}

TEST(ColumnBlocksPlanTest, AZeroPieceKeepsItsPartialRowsPackedAndBlocksTheWholeOnes) {
  std::vector<float> half = Columns(0, kCols / 2);
  const int64_t begin = 100, end = kRows * (kCols / 2) - 50;  // starts and ends inside a row
  const SaveRequest req = OneShard(TensorShard::BoxFlat("w", DType::kF32, {kRows, kCols}, {0, 0}, {kRows, kCols / 2},
                                                        begin, end, half.data() + begin));
  Result<RankSavePlan> plan = PlanRankSave(req, 1 << 20, true, /*column_blocks=*/true);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(18u, plan->fragments.size());
  const format::Region box = format::RegionOfBox({0, 0}, {kRows, kCols / 2});
  EXPECT_EQ(format::SubRegion(box, begin, kCols / 2), plan->fragments.front().region);
  EXPECT_EQ(format::SubRegion(box, (kRows - 1) * (kCols / 2), end), plan->fragments.back().region);
  EXPECT_EQ(format::RegionOfBox({1, 64}, {kRows - 2, 64}), plan->fragments[2].region);
  int64_t elements = 0;
  for (const PlannedFragment& f : plan->fragments) elements += f.region.num_elements();
  EXPECT_EQ(end - begin, elements);  // every element once
  std::vector<float> block(64);
  CopyFragmentBytes(plan->fragments[2], 0, block.size() * sizeof(float), reinterpret_cast<uint8_t*>(block.data()));
  EXPECT_EQ(ValueAt(1, 64), block[0]);
  EXPECT_EQ(ValueAt(1, 127), block[63]);
}

TEST(ColumnBlocksPlanTest, ShardsThatAreNotColumnSplitsOrAreSmallStayWhole) {
  std::vector<float> rows(kRows / 2 * kCols);
  std::vector<float> small(16 * 512);
  for (const SaveRequest& req :
       {OneShard(TensorShard::Box("rows", DType::kF32, {kRows, kCols}, {0, 0}, {kRows / 2, kCols}, rows.data())),
        OneShard(TensorShard::Box("small", DType::kF32, {16, 1024}, {0, 0}, {16, 512}, small.data())),
        OneShard(TensorShard::Whole("vector", DType::kF32, {kCols}, rows.data()))}) {
    Result<RankSavePlan> plan = PlanRankSave(req, 1 << 20, true, /*column_blocks=*/true);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(1u, plan->fragments.size()) << req.tensors[0].name;
    EXPECT_FALSE(plan->fragments[0].strided()) << req.tensors[0].name;
  }
}

// The snapshot copies the blocks of a shard together: chunk k of each of its equal blocks makes one
// band (read row by row once), the narrower last block goes alone, and every chunk lands where the
// index says with the checksum of its bytes.
TEST(ColumnBlocksCopyTest, TheEqualBlocksOfAShardAreCopiedInBandsOfOneChunkEach) {
  constexpr int64_t kCut = 1000;  // 1048 columns: 16 blocks, 15 of 66 and one of 58
  std::vector<float> right = Columns(kCut, kCols - kCut);
  SaveRequest req = OneShard(
      TensorShard::Box("w", DType::kF32, {kRows, kCols}, {0, kCut}, {kRows, kCols - kCut}, right.data()));
  req.objects.emplace_back("rng", std::string(40, 'r'));
  Result<RankSavePlan> plan = PlanRankSave(req, 1 << 20, true, /*column_blocks=*/true);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(16u, plan->fragments.size());

  auto job = std::make_shared<internal::SaveJob>(1, nullptr, "/ckpt");
  job->plan = std::make_shared<const RankSavePlan>(std::move(*plan));
  job->objects = req.objects;
  job->write_options.chunk_bytes = 16 << 10;
  job->layout = LayoutImage(*job->plan, job->objects);
  job->index = RawImageIndex(*job->plan, job->objects, "", job->layout, job->write_options);
  job->block_bytes = 4096;
  job->bytes_total = job->layout.bytes;
  AlignedBuffer image(AlignUp(job->layout.bytes, 4096));
  job->image = image.data();
  internal::PlanPieces(*job, req);
  job->InitCounters(req.tensors.size());

  // 15 blocks of 66 columns (67,584 bytes: 5 chunks of 16 KiB, the last partial) in 5 bands of 15;
  // the last block's 4 chunks (59,392 bytes) alone; then the object.
  ASSERT_EQ(15u * 5 + 4 + 1, job->pieces.size());
  for (size_t k = 0; k < 5; ++k) {
    const internal::CopyPiece& first = job->pieces[k * 15];
    EXPECT_EQ(15u, first.band) << "band " << k;
    for (size_t b = 1; b < 15; ++b) {
      const internal::CopyPiece& p = job->pieces[k * 15 + b];
      EXPECT_EQ(0u, p.band);
      EXPECT_EQ(first.source_offset, p.source_offset);
      EXPECT_EQ(first.length, p.length);
      EXPECT_EQ(job->index.fragments[b].first_chunk + k, p.target);
    }
  }
  for (size_t i = 75; i < job->pieces.size(); ++i) EXPECT_EQ(1u, job->pieces[i].band) << "piece " << i;

  {
    CopyEngine engine(2, 0);
    engine.Submit(job);
    ASSERT_TRUE(job->WaitSnapshot().ok());
  }
  for (size_t i = 0; i < job->plan->fragments.size(); ++i) {
    const format::FragmentInfo& f = job->index.fragments[i];
    const uint64_t bytes = static_cast<uint64_t>(job->plan->fragments[i].region.num_elements()) * sizeof(float);
    std::vector<uint8_t> want(bytes);
    CopyFragmentBytes(job->plan->fragments[i], 0, bytes, want.data());
    ASSERT_EQ(0, std::memcmp(want.data(), image.data() + job->layout.fragment_offset[i], bytes)) << "block " << i;
    for (uint64_t k = 0; k < f.num_chunks; ++k) {
      const format::ChunkInfo& c = job->index.chunks[f.first_chunk + k];
      EXPECT_EQ(format::Checksum64(want.data() + k * job->write_options.chunk_bytes, c.stored_length), c.checksum)
          << "block " << i << " chunk " << k;
    }
  }
  EXPECT_EQ(format::Checksum64(req.objects[0].second), job->index.objects[0].checksum);
}

// Two ranks save the tensor split in column halves; three load it split in column thirds. Returns
// the bytes the three loads read; every element is checked. `staging_bytes` below a shard's 1 MiB
// streams it to disk instead of staging a snapshot (the writer then gathers the blocks itself).
uint64_t SaveTwoLoadThree(bool column_blocks, uint64_t staging_bytes = 64 << 20) {
  test::TempDir dir("/var/tmp", "lifeline-column-blocks");
  uint64_t bytes_read = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    CheckpointerOptions o;
    o.directory = dir.path();
    o.run_id = column_blocks ? "blocks" : "rows";
    o.rank = r;
    o.world_size = 2;
    o.column_blocks = column_blocks;
    o.staging_budget_bytes = staging_bytes;
    auto ckpt = Checkpointer::Open(o);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    if (!ckpt.ok()) return 0;
    std::vector<float> half = Columns(r * kCols / 2, kCols / 2);
    SaveTicket t = (*ckpt)->Save(
        1, OneShard(TensorShard::Box("w", DType::kF32, {kRows, kCols}, {0, r * kCols / 2}, {kRows, kCols / 2},
                                     half.data())));
    EXPECT_TRUE(t.WaitPersisted().ok());
    EXPECT_TRUE((*ckpt)->Flush().ok());
  }
  for (uint32_t r = 0; r < 3; ++r) {
    const int64_t c0 = r * kCols / 3, c1 = (r + 1) * kCols / 3;
    CheckpointerOptions o;
    o.directory = dir.path();
    o.run_id = "loader";
    o.rank = r;
    o.world_size = 3;
    auto ckpt = Checkpointer::Open(o);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    if (!ckpt.ok()) return 0;
    std::vector<float> got(kRows * (c1 - c0), -1.0f);
    LoadRequest req;
    req.tensors.push_back(TensorShard::Box("w", DType::kF32, {kRows, kCols}, {0, c0}, {kRows, c1 - c0}, got.data()));
    Result<LoadResult> res = (*ckpt)->Load(1, req);
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    if (!res.ok()) return 0;
    EXPECT_EQ(Columns(c0, c1 - c0), got) << "rank " << r << (column_blocks ? " (column blocks)" : " (rows)");
    bytes_read += res->bytes_read;
  }
  return bytes_read;
}

TEST(ColumnBlocksLoadTest, ALoadAtAnotherColumnSplitReadsAboutTheBytesItNeeds) {
  const double needed = static_cast<double>(kRows * kCols * sizeof(float));
  const double rows = static_cast<double>(SaveTwoLoadThree(false)) / needed;
  const double blocks = static_cast<double>(SaveTwoLoadThree(true)) / needed;
  const double streamed = static_cast<double>(SaveTwoLoadThree(true, 256 << 10)) / needed;
  // Row by row, the middle rank reads both halves whole: 2x in all. In blocks of 64 columns, each
  // of the two cuts reads at most one block twice, plus alignment: at most 1.15x.
  EXPECT_GE(rows, 1.9) << "rows";
  EXPECT_LE(blocks, 1.15) << "column blocks";
  EXPECT_LE(streamed, 1.15) << "column blocks, streamed";
}

}  // namespace column_blocks_test
}  // namespace lifeline
