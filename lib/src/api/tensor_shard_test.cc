// TensorShard's constructors: each describes the piece of the global tensor a rank holds, so that
// pieces saved in one layout load back, byte for byte, in another.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace tensor_shard_test {

// A 6 x 4 f32 tensor whose element i holds i.
std::vector<float> Global() {
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return v;
}

CheckpointerOptions Options(Env* env, uint32_t rank, uint32_t world) {
  CheckpointerOptions o = test::InMemoryCheckpointerOptions(env, "tensor-shard-test", 64, rank, world);
  o.save_memory_budget = 64 << 10;
  return o;
}

// Saves step 1 with each rank holding `pieces[rank]`, then loads the whole tensor.
std::vector<float> SaveThenLoadWhole(const std::vector<TensorShard>& pieces) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  const uint32_t world = static_cast<uint32_t>(pieces.size());
  for (uint32_t r = 0; r < world; ++r) {
    auto ckpt = Checkpointer::Open(Options(env.get(), r, world));
    EXPECT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    if (!ckpt.ok()) return {};
    SaveRequest req;
    req.tensors.push_back(pieces[r]);
    Status s = (*ckpt)->Save(1, req).WaitPersisted();
    EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.ToString();
  }
  auto reader = Checkpointer::Open(Options(env.get(), 0, 1));
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return {};
  std::vector<float> out(24, -1.0f);
  LoadRequest load;
  load.tensors.push_back(TensorShard::Whole("w", DType::kF32, {6, 4}, out.data()));
  auto loaded = (*reader)->Load(1, load);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  return out;
}

TEST(TensorShardTest, ConstructorsDescribeTheirElements) {
  float x[24];
  EXPECT_EQ(24, TensorShard::Whole("w", DType::kF32, {6, 4}, x).num_elements());
  EXPECT_EQ(96u, TensorShard::Whole("w", DType::kF32, {6, 4}, x).num_bytes());
  const TensorShard box = TensorShard::Box("w", DType::kBF16, {6, 4}, {2, 0}, {3, 4}, x);
  EXPECT_EQ(12, box.num_elements());
  EXPECT_EQ(24u, box.num_bytes());
  EXPECT_EQ(std::vector<int64_t>({2, 0}), box.offsets);
  const TensorShard flat = TensorShard::Flat("w", DType::kF32, {6, 4}, 5, 17, x);
  EXPECT_EQ(12, flat.num_elements());
  EXPECT_EQ(std::vector<int64_t>({6, 4}), flat.shape);  // a flat range of the whole tensor
  EXPECT_EQ(std::vector<int64_t>({0, 0}), flat.offsets);
  EXPECT_EQ(0, TensorShard::Whole("empty", DType::kF32, {0, 4}, nullptr).num_elements());
  const TensorShard scalar = TensorShard::Whole("s", DType::kF64, {}, x);
  EXPECT_EQ(1, scalar.num_elements());
  TensorShard replica = TensorShard::Whole("w", DType::kF32, {6, 4}, x);
  replica.Replica(1, 3);
  EXPECT_EQ(1u, replica.replica_index);
  EXPECT_EQ(3u, replica.replica_count);
  EXPECT_EQ(-1, replica.device);  // host memory unless OnDevice says otherwise
}

TEST(TensorShardTest, RowBoxesOfTwoRanksLoadBackWhole) {
  const std::vector<float> g = Global();
  std::vector<float> top(g.begin(), g.begin() + 12), bottom(g.begin() + 12, g.end());
  EXPECT_EQ(g, SaveThenLoadWhole({TensorShard::Box("w", DType::kF32, {6, 4}, {0, 0}, {3, 4}, top.data()),
                                  TensorShard::Box("w", DType::kF32, {6, 4}, {3, 0}, {3, 4}, bottom.data())}));
}

TEST(TensorShardTest, ColumnBoxesOfTwoRanksLoadBackWhole) {
  const std::vector<float> g = Global();
  std::vector<float> left, right;  // columns 0-0 and 1-3, each row-major within its box
  for (int r = 0; r < 6; ++r) {
    left.push_back(g[r * 4]);
    for (int c = 1; c < 4; ++c) right.push_back(g[r * 4 + c]);
  }
  EXPECT_EQ(g, SaveThenLoadWhole({TensorShard::Box("w", DType::kF32, {6, 4}, {0, 0}, {6, 1}, left.data()),
                                  TensorShard::Box("w", DType::kF32, {6, 4}, {0, 1}, {6, 3}, right.data())}));
}

TEST(TensorShardTest, FlatRangesOfThreeRanksLoadBackWhole) {
  const std::vector<float> g = Global();
  std::vector<float> a(g.begin(), g.begin() + 5), b(g.begin() + 5, g.begin() + 17), c(g.begin() + 17, g.end());
  EXPECT_EQ(g, SaveThenLoadWhole({TensorShard::Flat("w", DType::kF32, {6, 4}, 0, 5, a.data()),
                                  TensorShard::Flat("w", DType::kF32, {6, 4}, 5, 17, b.data()),
                                  TensorShard::Flat("w", DType::kF32, {6, 4}, 17, 24, c.data())}));
}

TEST(TensorShardTest, BoxFlatRangesWithinRowBoxesLoadBackWhole) {
  const std::vector<float> g = Global();
  // Rows 0-2 cut at element 7 of the box, rows 3-5 whole.
  std::vector<float> a(g.begin(), g.begin() + 7), b(g.begin() + 7, g.begin() + 12), c(g.begin() + 12, g.end());
  EXPECT_EQ(g, SaveThenLoadWhole({TensorShard::BoxFlat("w", DType::kF32, {6, 4}, {0, 0}, {3, 4}, 0, 7, a.data()),
                                  TensorShard::BoxFlat("w", DType::kF32, {6, 4}, {0, 0}, {3, 4}, 7, 12, b.data()),
                                  TensorShard::BoxFlat("w", DType::kF32, {6, 4}, {3, 0}, {3, 4}, 0, 12, c.data())}));
}

}  // namespace tensor_shard_test
}  // namespace lifeline
