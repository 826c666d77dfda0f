#include "lifeline/internal/synthetic_model.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

namespace lifeline {
namespace synthetic_model_test {

// Global row-major indexes of a shard's elements, in buffer order, computed the slow obvious way.
std::vector<uint64_t> NaiveGlobalIndexes(const TensorShard& s) {
  std::vector<uint64_t> out;
  const size_t nd = s.shape.size();
  for (int64_t p = s.flat_begin; p < s.flat_end; ++p) {
    int64_t rest = p;
    uint64_t global = 0;
    uint64_t stride = 1;
    for (size_t k = nd; k-- > 0;) {
      const int64_t c = rest % s.shape[k];
      rest /= s.shape[k];
      global += static_cast<uint64_t>(s.offsets[k] + c) * stride;
      stride *= static_cast<uint64_t>(s.global_shape[k]);
    }
    out.push_back(global);
  }
  return out;
}

uint64_t ReferenceMix(std::string_view name, uint64_t i) {
  uint64_t z = XXH3_64bits(name.data(), name.size()) + i * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float HalfToFloat(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  if (e == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  return sign * std::ldexp(1.0f + mant / 1024.0f, e - 15);
}

// The value the header documents, as a double, for floating dtypes.
double ReferenceFloat(std::string_view name, uint64_t i) {
  const int k = static_cast<int>(ReferenceMix(name, i) % 255) - 127;
  return k / 4.0;
}

struct LayoutCase {
  uint32_t tp;
  uint32_t dp;
};

// For every tensor: replicas of one piece cover the same region with indexes 0..count-1, and the
// pieces (one per replica group) cover every element exactly once.
void ExpectWriteOnceCover(const ModelShape& shape, const ParallelLayout& layout) {
  SCOPED_TRACE("tp=" + std::to_string(layout.tp) + " dp=" + std::to_string(layout.dp) +
               " hidden=" + std::to_string(shape.hidden));
  const std::vector<ModelTensor> tensors = ModelTensors(shape);
  using RegionKey = std::tuple<std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t>;
  std::map<std::string, std::map<RegionKey, std::vector<TensorShard>>> groups;
  for (uint32_t r = 0; r < layout.world_size(); ++r) {
    for (const TensorShard& s : RankShards(tensors, layout, r)) {
      EXPECT_GT(s.num_elements(), 0) << s.name;
      groups[s.name][RegionKey{s.offsets, s.shape, s.flat_begin, s.flat_end}].push_back(s);
    }
  }
  ASSERT_EQ(groups.size(), tensors.size());
  for (const ModelTensor& t : tensors) {
    SCOPED_TRACE(t.name);
    int64_t volume = 1;
    for (int64_t x : t.shape) volume *= x;
    std::vector<int> cover(static_cast<size_t>(volume), 0);
    for (const auto& [key, replicas] : groups[t.name]) {
      std::set<uint32_t> indexes;
      for (const TensorShard& s : replicas) {
        EXPECT_EQ(s.replica_count, replicas.size());
        EXPECT_EQ(s.dtype, t.dtype);
        EXPECT_EQ(s.global_shape, t.shape);
        indexes.insert(s.replica_index);
      }
      EXPECT_EQ(indexes.size(), replicas.size());
      EXPECT_EQ(*indexes.rbegin(), replicas.size() - 1);
      for (uint64_t g : NaiveGlobalIndexes(replicas[0])) ++cover[g];
    }
    for (int64_t i = 0; i < volume; ++i) ASSERT_EQ(cover[i], 1) << "element " << i;
  }
}

TEST(SyntheticModelTest, EveryElementIsWrittenExactlyOnce) {
  const LayoutCase cases[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {3, 1}, {3, 2}, {2, 3}, {4, 2}, {5, 3}, {7, 1}};
  for (int64_t hidden : {8, 10, 7}) {
    for (const LayoutCase& c : cases) ExpectWriteOnceCover(ModelShape{hidden, 2}, ParallelLayout{c.tp, c.dp});
  }
}

TEST(SyntheticModelTest, MoreRanksThanRowsLeavesSomeRanksWithoutAPiece) {
  const ModelShape shape{2, 1};  // router.tokens has 2 rows
  ExpectWriteOnceCover(shape, ParallelLayout{3, 2});
  const std::vector<ModelTensor> tensors = ModelTensors(shape);
  bool found = false;
  for (const TensorShard& s : RankShards(tensors, ParallelLayout{3, 2}, 2)) found |= s.name == "layers.0.router.tokens";
  EXPECT_FALSE(found);
}

TEST(SyntheticModelTest, UnevenSplitsGiveTheFirstRanksOneMore) {
  EXPECT_EQ(EvenSplit(10, 3, 0), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(EvenSplit(10, 3, 1), (std::pair<int64_t, int64_t>{4, 7}));
  EXPECT_EQ(EvenSplit(10, 3, 2), (std::pair<int64_t, int64_t>{7, 10}));
  EXPECT_EQ(EvenSplit(2, 3, 2), (std::pair<int64_t, int64_t>{2, 2}));

  // H = 1024, T = 3: qkv's 3072 rows split evenly, proj's 1024 columns as 342/341/341.
  const ModelShape shape{1024, 1};
  const std::vector<ModelTensor> tensors = ModelTensors(shape);
  const ParallelLayout layout{3, 1};
  std::vector<int64_t> qkv_rows, proj_cols;
  for (uint32_t r = 0; r < 3; ++r) {
    for (const TensorShard& s : RankShards(tensors, layout, r)) {
      if (s.name == "layers.0.attn.qkv.weight") qkv_rows.push_back(s.shape[0]);
      if (s.name == "layers.0.attn.proj.weight") proj_cols.push_back(s.shape[1]);
    }
  }
  EXPECT_EQ(qkv_rows, (std::vector<int64_t>{1024, 1024, 1024}));
  EXPECT_EQ(proj_cols, (std::vector<int64_t>{342, 341, 341}));
}

TEST(SyntheticModelTest, RankOrderIsDataParallelMajor) {
  // r = d * T + t: rank 5 of T=2, P=3 is t=1, d=2.
  const std::vector<ModelTensor> tensors = ModelTensors(ModelShape{8, 1});
  for (const TensorShard& s : RankShards(tensors, ParallelLayout{2, 3}, 5)) {
    if (s.name == "layers.0.attn.qkv.weight") {
      EXPECT_EQ(s.offsets, (std::vector<int64_t>{12, 0}));
      EXPECT_EQ(s.replica_index, 2u);
      EXPECT_EQ(s.replica_count, 3u);
    }
    if (s.name == "layers.0.norm.weight" || s.name == "step") {
      EXPECT_EQ(s.replica_index, 5u);
      EXPECT_EQ(s.replica_count, 6u);
    }
    if (s.name == "optim.layers.0.mlp.fc2.weight.exp_avg") {
      // fc2 is [8, 32]; TP box 1 is columns 16..31 (128 elements), DP part 2 of 3 is [86, 128).
      EXPECT_EQ(s.offsets, (std::vector<int64_t>{0, 16}));
      EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 16}));
      EXPECT_EQ(s.flat_begin, 86);
      EXPECT_EQ(s.flat_end, 128);
      EXPECT_EQ(s.replica_count, 1u);
    }
  }
}

TEST(SyntheticModelTest, TensorListAndSize) {
  const ModelShape shape{16, 3};
  const std::vector<ModelTensor> tensors = ModelTensors(shape);
  EXPECT_EQ(tensors.size(), 3u * 18 + 1);
  uint64_t total = 0;
  std::set<std::string> names;
  for (const ModelTensor& t : tensors) {
    total += t.num_bytes();
    names.insert(t.name);
  }
  EXPECT_EQ(names.size(), tensors.size());
  EXPECT_EQ(total, ModelBytes(shape));
  EXPECT_EQ(LayerBytes(16), 168u * 256 + 12 * 16);
  EXPECT_TRUE(names.count("optim.layers.2.attn.qkv.weight.exp_avg_sq"));
  EXPECT_TRUE(names.count("layers.1.router.tokens"));
  EXPECT_EQ(tensors.back().name, "step");
  EXPECT_TRUE(tensors.back().shape.empty());
}

TEST(SyntheticModelTest, ChooseModelShape) {
  // 2 GiB at H = 1024 (168 MiB + 12 KiB per layer): 12 layers.
  auto big = ChooseModelShape(2ull << 30, 1024);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->hidden, 1024);
  EXPECT_EQ(big->layers, 12);
  // 256 MiB is less than two layers at 1024: H halves to 512 (42 MiB per layer), 6 layers.
  auto mid = ChooseModelShape(256ull << 20, 1024);
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->hidden, 512);
  EXPECT_EQ(mid->layers, 6);
  // Tiny requests stop halving at 64 and keep one layer.
  auto tiny = ChooseModelShape(1000, 1024);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->hidden, 64);
  EXPECT_EQ(tiny->layers, 1);
  // A hidden size below the floor is kept as given.
  auto small = ChooseModelShape(1, 40);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->hidden, 40);
  EXPECT_FALSE(ChooseModelShape(1, 0).ok());
}

TEST(SyntheticModelTest, ValuesFollowTheDocumentedFunctionExactly) {
  const std::string name = "layers.3.mlp.fc1.weight";
  const uint64_t seed = TensorSeed(name);
  const int64_t n = 2000;
  const uint64_t first = 123456789;
  std::vector<double> f64(n);
  std::vector<float> f32(n);
  std::vector<uint16_t> bf16(n), f16(n);
  std::vector<int64_t> i64(n);
  std::vector<uint8_t> b(n), u8(n);
  GenerateValues(seed, DType::kF64, first, n, f64.data());
  GenerateValues(seed, DType::kF32, first, n, f32.data());
  GenerateValues(seed, DType::kBF16, first, n, bf16.data());
  GenerateValues(seed, DType::kF16, first, n, f16.data());
  GenerateValues(seed, DType::kI64, first, n, i64.data());
  GenerateValues(seed, DType::kBool, first, n, b.data());
  GenerateValues(seed, DType::kU8, first, n, u8.data());
  std::set<double> distinct;
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t m = ReferenceMix(name, first + j);
    const double v = ReferenceFloat(name, first + j);
    distinct.insert(v);
    ASSERT_EQ(f64[j], v);
    ASSERT_EQ(f32[j], static_cast<float>(v));
    ASSERT_EQ(std::bit_cast<float>(uint32_t{bf16[j]} << 16), static_cast<float>(v)) << j;
    ASSERT_EQ(HalfToFloat(f16[j]), static_cast<float>(v)) << j;
    ASSERT_EQ(i64[j], static_cast<int64_t>(m));
    ASSERT_EQ(b[j], m & 1);
    ASSERT_EQ(u8[j], m & 0xFF);
  }
  EXPECT_GT(distinct.size(), 200u);  // the whole range -31.75..31.75 shows up
  EXPECT_EQ(CountMismatches(seed, DType::kBF16, first, n, bf16.data()), 0u);
  bf16[7] ^= 1;
  f32[0] = -f32[0] + 1;
  EXPECT_EQ(CountMismatches(seed, DType::kBF16, first, n, bf16.data()), 1u);
  EXPECT_EQ(CountMismatches(seed, DType::kF32, first, n, f32.data()), 1u);
  // Another tensor name gives other values.
  EXPECT_GT(CountMismatches(TensorSeed("other"), DType::kI64, first, n, i64.data()), 1990u);
}

TEST(SyntheticModelTest, EveryQuarterStepIsExactInEveryFloatType) {
  // Sweep enough indexes that all 255 values of k / 4 appear, and check the 16-bit encodings
  // decode back to exactly the same number.
  const uint64_t seed = TensorSeed("sweep");
  const int64_t n = 20000;
  std::vector<uint16_t> bf16(n), f16(n);
  GenerateValues(seed, DType::kBF16, 0, n, bf16.data());
  GenerateValues(seed, DType::kF16, 0, n, f16.data());
  std::set<float> seen;
  for (int64_t j = 0; j < n; ++j) {
    const float want = static_cast<float>(ReferenceFloat("sweep", j));
    ASSERT_EQ(std::bit_cast<float>(uint32_t{bf16[j]} << 16), want);
    ASSERT_EQ(HalfToFloat(f16[j]), want);
    seen.insert(want);
  }
  EXPECT_EQ(seen.size(), 255u);
}

TEST(SyntheticModelTest, FilledShardsMatchTheReferenceAndVerify) {
  const ModelShape shape{10, 1};
  const std::vector<ModelTensor> tensors = ModelTensors(shape);
  const ParallelLayout layout{3, 2};
  for (uint32_t r = 0; r < layout.world_size(); ++r) {
    auto state = RankState::Build(tensors, layout, r, 77, /*fill=*/true);
    ASSERT_TRUE(state.ok());
    EXPECT_EQ(state->CountMismatches(77), 0u);
    EXPECT_GT(state->CountMismatches(78), 0u);  // the step tensor differs
    for (const TensorShard& s : state->shards()) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data) % 4096, 0u);
      if (s.name == "step") {
        int64_t v;
        std::memcpy(&v, s.data, 8);
        EXPECT_EQ(v, 77);
        continue;
      }
      const std::vector<uint64_t> globals = NaiveGlobalIndexes(s);
      for (size_t j = 0; j < globals.size(); ++j) {
        const uint64_t m = ReferenceMix(s.name, globals[j]);
        const double v = ReferenceFloat(s.name, globals[j]);
        switch (s.dtype) {
          case DType::kF32:
            ASSERT_EQ(static_cast<const float*>(s.data)[j], static_cast<float>(v)) << s.name << " " << j;
            break;
          case DType::kBF16:
            ASSERT_EQ(std::bit_cast<float>(uint32_t{static_cast<const uint16_t*>(s.data)[j]} << 16),
                      static_cast<float>(v))
                << s.name << " " << j;
            break;
          case DType::kF16:
            ASSERT_EQ(HalfToFloat(static_cast<const uint16_t*>(s.data)[j]), static_cast<float>(v)) << s.name;
            break;
          case DType::kI64:
            ASSERT_EQ(static_cast<const int64_t*>(s.data)[j], static_cast<int64_t>(m)) << s.name;
            break;
          default:
            FAIL() << "unexpected dtype in " << s.name;
        }
      }
    }
  }
}

TEST(SyntheticModelTest, LoadTargetsStartWithNoMatchingElement) {
  const std::vector<ModelTensor> tensors = ModelTensors(ModelShape{8, 1});
  auto state = RankState::Build(tensors, ParallelLayout{2, 1}, 1, 5, /*fill=*/false);
  ASSERT_TRUE(state.ok());
  uint64_t elements = 0;
  for (const TensorShard& s : state->shards()) elements += static_cast<uint64_t>(s.num_elements());
  EXPECT_EQ(state->CountMismatches(5), elements);
  uint64_t bytes = 0;
  for (const TensorShard& s : state->shards()) bytes += s.num_bytes();
  EXPECT_EQ(state->bytes(), bytes);
}

TEST(SyntheticModelTest, ForEachRunCoversFlatRangesAcrossRows) {
  // A flat range starting and ending mid-row of a 3-d box.
  TensorShard s = TensorShard::BoxFlat("t", DType::kF32, {4, 5, 6}, {1, 1, 2}, {3, 3, 4}, 5, 31, nullptr);
  std::vector<uint64_t> got;
  int64_t expect_buffer = 0;
  ForEachRun(s, [&](uint64_t global, int64_t buffer, int64_t n) {
    EXPECT_EQ(buffer, expect_buffer);
    EXPECT_GT(n, 0);
    for (int64_t j = 0; j < n; ++j) got.push_back(global + j);
    expect_buffer += n;
  });
  EXPECT_EQ(got, NaiveGlobalIndexes(s));

  TensorShard scalar = TensorShard::Box("s", DType::kI64, {}, {}, {}, nullptr);
  int runs = 0;
  ForEachRun(scalar, [&](uint64_t global, int64_t buffer, int64_t n) {
    EXPECT_EQ(global, 0u);
    EXPECT_EQ(n, 1);
    ++runs;
  });
  EXPECT_EQ(runs, 1);
}

TEST(SyntheticModelTest, ObjectsAndMetadata) {
  EXPECT_EQ(RngObject(3, 100).size(), 32u);
  EXPECT_EQ(RngObject(3, 100), RngObject(3, 100));
  EXPECT_NE(RngObject(3, 100), RngObject(4, 100));
  EXPECT_NE(RngObject(3, 100), RngObject(3, 101));
  const nlohmann::json dl = nlohmann::json::parse(DataloaderObject(3, 100));
  EXPECT_EQ(dl["rank"], 3);
  EXPECT_EQ(dl["position"], 100003);

  const std::string meta = ModelMetadataJson(ModelShape{512, 6}, ParallelLayout{2, 2}, 100);
  const nlohmann::json j = nlohmann::json::parse(meta);
  EXPECT_EQ(j["model"], "lifeline-synthetic");
  EXPECT_EQ(j["tp"], 2);
  auto parsed = ParseModelMetadata(meta);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->hidden, 512);
  EXPECT_EQ(parsed->layers, 6);
  EXPECT_FALSE(ParseModelMetadata("").ok());
  EXPECT_FALSE(ParseModelMetadata("{\"model\":\"gpt\"}").ok());
  EXPECT_FALSE(ParseModelMetadata("{\"model\":\"lifeline-synthetic\",\"hidden\":512}").ok());
  EXPECT_FALSE(ParseModelMetadata("[1,2").ok());
}

// Metadata is untrusted: a claim of an absurd model is refused by name, before anything is
// allocated for it (it used to end in std::bad_alloc).
TEST(SyntheticModelTest, MetadataClaimingAHugeModelIsRefusedByField) {
  Result<ModelShape> layers =
      ParseModelMetadata(R"({"model":"lifeline-synthetic","hidden":64,"layers":100000000,"tp":1,"dp":1})");
  ASSERT_FALSE(layers.ok());
  EXPECT_TRUE(layers.status().code() == StatusCode::kInvalidArgument);
  EXPECT_NE(layers.status().ToString().find("\"layers\" is 100000000"), std::string::npos) << layers.status().ToString();
  Result<ModelShape> hidden =
      ParseModelMetadata(R"({"model":"lifeline-synthetic","hidden":18446744073709551615,"layers":1})");
  ASSERT_FALSE(hidden.ok());
  EXPECT_NE(hidden.status().ToString().find("\"hidden\""), std::string::npos) << hidden.status().ToString();
  EXPECT_TRUE(ParseModelMetadata(ModelMetadataJson(ModelShape{kMaxHidden, kMaxLayers}, ParallelLayout{}, 1)).ok());
  EXPECT_FALSE(ChooseModelShape(uint64_t{1} << 62, 64).ok());
}

TEST(SyntheticModelTest, CheckModelTensorsNamesTheFieldThatDisagrees) {
  const std::vector<ModelTensor> stored = ModelTensors(ModelShape{64, 2});
  EXPECT_TRUE(CheckModelTensors(ModelShape{64, 2}, stored).ok());
  const Status layers = CheckModelTensors(ModelShape{64, 65536}, stored);
  EXPECT_TRUE(layers.code() == StatusCode::kInvalidArgument);
  EXPECT_NE(layers.ToString().find("\"layers\""), std::string::npos) << layers.ToString();
  EXPECT_NE(layers.ToString().find("37 tensors"), std::string::npos) << layers.ToString();
  const Status hidden = CheckModelTensors(ModelShape{128, 2}, stored);
  EXPECT_TRUE(hidden.code() == StatusCode::kInvalidArgument);
  EXPECT_NE(hidden.ToString().find("\"hidden\" is 128"), std::string::npos) << hidden.ToString();
}

}  // namespace synthetic_model_test
}  // namespace lifeline
