// BuildManifest: rank indexes merged into the manifest, and the rank sets it refuses.
#include "formats/index_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "formats/index_test_kit.h"

namespace lifeline::format {
namespace index_merge_test {

using ::testing::HasSubstr;

// ---- BuildManifest ----

// Three ranks splitting "w" [6, 4] by rows, "b" [4] written whole by rank 1, "m" [10] flat-split
// between ranks 0 and 2.
std::vector<CheckpointIndex> ThreeRanks() {
  std::vector<CheckpointIndex> out;
  for (uint32_t r = 0; r < 3; ++r) {
    IndexBuilder b(r, 3, 16);
    const uint32_t w = b.Tensor("w", DType::kF32, {6, 4});
    b.Fragment(w, BoxRegion({2 * r, 0}, {2, 4}));
    if (r == 1) b.Fragment(b.Tensor("b", DType::kBF16, {4}), BoxRegion({0}, {4}));
    if (r != 1) b.Fragment(b.Tensor("m", DType::kF32, {10}), FlatRegion({10}, r == 0 ? 0 : 6, r == 0 ? 6 : 10));
    b.Object("rng", 8 + r);
    b.index().metadata_json = "{\"rank\": " + std::to_string(r) + "}";
    out.push_back(b.index());
  }
  return out;
}

TEST(BuildManifestTest, MergesRanksInAnyOrder) {
  std::vector<CheckpointIndex> ranks = ThreeRanks();
  const std::vector<CheckpointIndex> original = ranks;
  std::swap(ranks[0], ranks[2]);
  Result<CheckpointIndex> m = BuildManifest(ranks);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->kind, IndexKind::kManifest);
  EXPECT_EQ(m->rank, kManifestRank);
  EXPECT_EQ(m->world_size, 3u);
  EXPECT_EQ(m->step, 1200u);
  EXPECT_EQ(m->run_id, "job-7:restart-0");
  EXPECT_EQ(m->metadata_json, "{\"rank\": 0}");
  EXPECT_EQ(m->created_unix_ns, 1700000000123456789ull + 2);
  ASSERT_EQ(m->tensors.size(), 3u);
  EXPECT_EQ(m->tensors[0].name, "w");
  EXPECT_EQ(m->tensors[1].name, "m");  // first seen at rank 0
  EXPECT_EQ(m->tensors[2].name, "b");
  ASSERT_EQ(m->files.size(), 3u);
  ASSERT_EQ(m->objects.size(), 3u);
  size_t chunks = 0, fragments = 0;
  for (const CheckpointIndex& idx : original) {
    chunks += idx.chunks.size();
    fragments += idx.fragments.size();
  }
  EXPECT_EQ(m->chunks.size(), chunks);
  ASSERT_EQ(m->fragments.size(), fragments);

  // Every manifest record, followed through its renumbered references, says what the rank said.
  // Fragments are grouped by tensor (manifest order), in rank order within a tensor, and chunks
  // follow their fragments.
  for (uint32_t r = 0; r < 3; ++r) {
    const CheckpointIndex& idx = original[r];
    EXPECT_EQ(m->files[r], idx.files[0]);
    EXPECT_EQ(m->objects[r].name, "rng");
    EXPECT_EQ(m->objects[r].rank, r);
    EXPECT_EQ(m->files[m->objects[r].file], idx.files[0]);
  }
  size_t next = 0;
  uint64_t next_chunk = 0;
  for (uint32_t t = 0; t < m->tensors.size(); ++t) {
    for (uint32_t r = 0; r < 3; ++r) {
      const CheckpointIndex& idx = original[r];
      for (const FragmentInfo& fr : idx.fragments) {
        if (idx.tensors[fr.tensor].name != m->tensors[t].name) continue;
        const FragmentInfo& out = m->fragments[next++];
        EXPECT_EQ(out.tensor, t);
        EXPECT_EQ(out.first_chunk, next_chunk);
        next_chunk += out.num_chunks;
        EXPECT_EQ(m->tensors[out.tensor], idx.tensors[fr.tensor]);
        EXPECT_EQ(m->files[out.file], idx.files[fr.file]);
        EXPECT_EQ(out.region, fr.region);
        EXPECT_EQ(out.offset, fr.offset);
        ASSERT_EQ(out.num_chunks, fr.num_chunks);
        for (uint64_t k = 0; k < fr.num_chunks; ++k)
          EXPECT_EQ(m->chunks[out.first_chunk + k], idx.chunks[fr.first_chunk + k]);
      }
    }
  }
  EXPECT_EQ(next, fragments);
  ExpectRoundTrip(*m);
}

TEST(BuildManifestTest, SingleRank) {
  IndexBuilder b(0, 1);
  b.Fragment(b.Tensor("x", DType::kI8, {5}), BoxRegion({0}, {5}));
  Result<CheckpointIndex> m = BuildManifest({b.index()});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->fragments.size(), 1u);
}

TEST(BuildManifestTest, RejectsInconsistentRankSets) {
  struct Case {
    const char* expect;
    void (*mutate)(std::vector<CheckpointIndex>*);
  } cases[] = {
      {"no rank indexes", [](std::vector<CheckpointIndex>* v) { v->clear(); }},
      {"rank index of rank 1 is missing", [](std::vector<CheckpointIndex>* v) { v->erase(v->begin() + 1); }},
      {"rank 2 appears twice", [](std::vector<CheckpointIndex>* v) { (*v)[1] = (*v)[2]; }},
      {"run id", [](std::vector<CheckpointIndex>* v) { (*v)[2].run_id = "other"; }},
      {"step 7", [](std::vector<CheckpointIndex>* v) { (*v)[1].step = 7; }},
      {"world size 4", [](std::vector<CheckpointIndex>* v) { (*v)[1].world_size = 4; }},
      {"chunk size 32", [](std::vector<CheckpointIndex>* v) { (*v)[2].chunk_bytes = 32; }},
      {"not a rank index",
       [](std::vector<CheckpointIndex>* v) {
         (*v)[0].kind = IndexKind::kManifest;
       }},
      {"tensor 'w': rank 2 declares i32 [6, 4] but rank 0 declares f32 [6, 4]",
       [](std::vector<CheckpointIndex>* v) { (*v)[2].tensors[0].dtype = DType::kI32; }},
      {"tensor 'w': rank 1 declares f32 [6, 5] but rank 0 declares f32 [6, 4]",
       [](std::vector<CheckpointIndex>* v) {
         (*v)[1].tensors[0].shape = {6, 5};
       }},
      {"tensor 'm': the ranks' fragments hold 6 elements but the tensor has 10 (part of it was saved by no rank",
       [](std::vector<CheckpointIndex>* v) {
         CheckpointIndex& r2 = (*v)[2];
         r2.fragments.pop_back();
         r2.chunks.resize(r2.fragments[0].num_chunks);
       }},
      {"tensor 'b': ranks 0 and 1 both stored overlapping pieces (4 elements stored twice, the same piece), so the "
       "checkpoint cannot be loaded. If these ranks hold data-parallel copies of it, mark them as replicas",
       [](std::vector<CheckpointIndex>* v) {
         CheckpointIndex& r0 = (*v)[0];
         IndexBuilder b(0, 3, 16);
         b.index() = r0;
         b.Fragment(b.Tensor("b", DType::kBF16, {4}), BoxRegion({0}, {4}));
         r0 = b.index();
       }},
      {"file '0123456789abcdef.r000000-of-000003.data' is listed by rank 0 and rank 1",
       [](std::vector<CheckpointIndex>* v) { (*v)[1].files[0].name = (*v)[0].files[0].name; }},
      {"rank index of rank 1: fragment 0 of tensor 'w'",
       [](std::vector<CheckpointIndex>* v) { (*v)[1].fragments[0].region.offsets[0] = 5; }},
  };
  for (const Case& c : cases) {
    std::vector<CheckpointIndex> ranks = ThreeRanks();
    c.mutate(&ranks);
    Result<CheckpointIndex> m = BuildManifest(ranks);
    ASSERT_FALSE(m.ok()) << c.expect;
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status().ToString();
    EXPECT_THAT(m.status().message(), HasSubstr(c.expect));
  }
}

TEST(BuildManifestTest, MergesOneMillionFragments) {
  // 16 ranks, each writing 65536 rows of a [1M, 2] tensor as one fragment per row.
  constexpr uint32_t kWorld = 16;
  constexpr int64_t kRowsPerRank = 1 << 16;
  std::vector<CheckpointIndex> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    CheckpointIndex idx;
    idx.rank = r;
    idx.world_size = kWorld;
    idx.run_id = "big";
    idx.chunk_bytes = 1 << 20;
    idx.tensors.push_back(TensorInfo{"emb", DType::kF32, {kRowsPerRank * kWorld, 2}});
    idx.files.push_back(FileInfo{"h.r" + std::to_string(r) + ".data", r, 4096 + 8 * kRowsPerRank});
    idx.fragments.resize(kRowsPerRank);
    idx.chunks.resize(kRowsPerRank, ChunkInfo{8, 1});
    for (int64_t i = 0; i < kRowsPerRank; ++i) {
      FragmentInfo& fr = idx.fragments[i];
      fr.region = BoxRegion({r * kRowsPerRank + i, 0}, {1, 2});
      fr.offset = 4096 + 8 * i;
      fr.first_chunk = i;
      fr.num_chunks = 1;
    }
    ranks.push_back(std::move(idx));
  }
  std::reverse(ranks.begin(), ranks.end());
  Result<CheckpointIndex> m = BuildManifest(std::move(ranks));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->fragments.size(), size_t{kRowsPerRank} * kWorld);
  EXPECT_EQ(m->fragments[kRowsPerRank].file, 1u);
  EXPECT_EQ(m->fragments[kRowsPerRank].first_chunk, uint64_t{kRowsPerRank});
  EXPECT_EQ(m->fragments[kRowsPerRank].region.offsets[0], kRowsPerRank);
  ExpectRoundTrip(*m);
}

}  // namespace index_merge_test
}  // namespace lifeline::format
