// The writer: what a rank writes (requests checked, replicas written once between them), and the
// data file it writes, raw or compressed, from memory or through a FragmentReader, which the
// ordinary reader loads back byte for byte once the index is published.
#include "lib/src/save/rank_data.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/index_codec.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/commit.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace rank_data_test {

SaveRequest OneTensor(TensorShard s) {
  SaveRequest r;
  r.tensors.push_back(std::move(s));
  return r;
}

TEST(SaverPlanTest, MalformedRequestsAreRefusedNamingTheTensor) {
  float x[8] = {};
  auto empty_name = PlanRankSave(OneTensor(TensorShard::Whole("", DType::kF32, {8}, x)), 1 << 20);
  EXPECT_EQ(StatusCode::kInvalidArgument, empty_name.status().code());
  auto no_data = PlanRankSave(OneTensor(TensorShard::Whole("w", DType::kF32, {8}, nullptr)), 1 << 20);
  EXPECT_EQ(StatusCode::kInvalidArgument, no_data.status().code());
  EXPECT_NE(std::string::npos, no_data.status().ToString().find("w")) << no_data.status().ToString();
  TensorShard bad_replica = TensorShard::Whole("w", DType::kF32, {8}, x);
  bad_replica.Replica(2, 2);
  EXPECT_EQ(StatusCode::kInvalidArgument, PlanRankSave(OneTensor(bad_replica), 1 << 20).status().code());

  SaveRequest twice;
  twice.tensors.push_back(TensorShard::Flat("w", DType::kF32, {8}, 0, 4, x));
  twice.tensors.push_back(TensorShard::Flat("w", DType::kF16, {8}, 4, 8, x));
  auto mixed = PlanRankSave(twice, 1 << 20);
  EXPECT_EQ(StatusCode::kInvalidArgument, mixed.status().code()) << mixed.status().ToString();
  // Without data, a plan is still made when asked (conversion streams the bytes in later).
  EXPECT_TRUE(PlanRankSave(OneTensor(TensorShard::Whole("w", DType::kF32, {8}, nullptr)), 1 << 20,
                           /*require_data=*/false)
                  .ok());
}

// The elements of "w" that replica r of `count` plans to write, for a replicated tensor of n f32.
std::vector<int> WrittenBy(uint32_t r, uint32_t count, int64_t n, uint64_t split_bytes, std::vector<float>* data) {
  TensorShard s = TensorShard::Whole("w", DType::kF32, {n}, data->data());
  s.Replica(r, count);
  auto plan = PlanRankSave(OneTensor(s), split_bytes);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<int> hits(static_cast<size_t>(n), 0);
  if (!plan.ok()) return hits;
  for (const PlannedFragment& f : plan->fragments)
    for (int64_t i = f.region.flat_begin; i < f.region.flat_end; ++i) ++hits[static_cast<size_t>(i)];
  return hits;
}

TEST(SaverPlanTest, AReplicatedTensorIsWrittenExactlyOnceAcrossItsReplicas) {
  for (int64_t n : {10, 100000}) {  // below and above the split size
    std::vector<float> data(static_cast<size_t>(n), 1.0f);
    std::vector<int> total(static_cast<size_t>(n), 0);
    size_t writers = 0;
    for (uint32_t r = 0; r < 4; ++r) {
      const std::vector<int> hits = WrittenBy(r, 4, n, /*split_bytes=*/4096, &data);
      bool any = false;
      for (size_t i = 0; i < hits.size(); ++i) total[i] += hits[i], any |= hits[i] > 0;
      writers += any;
    }
    for (size_t i = 0; i < total.size(); ++i) ASSERT_EQ(1, total[i]) << "n=" << n << " element " << i;
    EXPECT_EQ(n * 4 > 4096 ? 4u : 1u, writers) << "n=" << n;  // large pieces are shared out
  }
}

class SaverWriteTest : public ::testing::TestWithParam<format::Codec> {
 protected:
  SaverWriteTest() : w_(6000), b_(300) {
    for (size_t i = 0; i < w_.size(); ++i) w_[i] = static_cast<float>(i % 97) * 0.125f;  // compressible
    for (size_t i = 0; i < b_.size(); ++i) b_[i] = static_cast<int64_t>(i * i);
  }

  RankWriteOptions Options() const {
    RankWriteOptions o = test::SmallRankWriteOptions("saver-test", 5);
    o.codec = GetParam();
    return o;
  }

  SaveRequest Request(bool with_data) {
    SaveRequest r;
    r.tensors.push_back(TensorShard::Whole("w", DType::kF32, {60, 100}, with_data ? w_.data() : nullptr));
    r.tensors.push_back(TensorShard::Whole("b", DType::kI64, {300}, with_data ? b_.data() : nullptr));
    return r;
  }

  // Writes step 5 of `root` from `plan`, publishes its index and loads both tensors back.
  void WriteAndLoadBack(const std::string& root, const RankSavePlan& plan, const FragmentReader& reader) {
    const RankWriteOptions o = Options();
    Result<std::string> dir = PrepareStepDir(env_.get(), root, o.step, o.run_hash, 0, 1);
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    auto index = WriteRankData(env_.get(), *dir, plan, {{"rng", "state"}}, "{\"k\": 1}", o, reader);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    auto encoded = format::EncodeIndex(*index);
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    auto committed = PublishRankIndex(env_.get(), root, o.step, o.run_hash, 0, 1, *encoded, false, 0);
    ASSERT_TRUE(committed.ok()) << committed.status().ToString();
    EXPECT_TRUE(*committed);

    auto r = CheckpointReader::Open(env_.get(), root, o.step);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Status verified = (*r)->Verify(nullptr);
    EXPECT_TRUE(verified.ok()) << verified.ToString();
    std::vector<float> w(w_.size(), -1.0f);
    std::vector<int64_t> b(b_.size(), -1);
    auto loaded = (*r)->Load({TensorShard::Whole("w", DType::kF32, {60, 100}, w.data()),
                              TensorShard::Whole("b", DType::kI64, {300}, b.data())});
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_EQ(w_, w);
    EXPECT_EQ(b_, b);
    if (GetParam() != format::Codec::kNone) {
      EXPECT_LT(index->files[0].size, (w_.size() * 4 + b_.size() * 8)) << "the codec did not compress";
    }
  }

  std::unique_ptr<MemEnv> env_ = NewMemEnv();
  std::vector<float> w_;
  std::vector<int64_t> b_;
};

TEST_P(SaverWriteTest, ADataFileWrittenFromMemoryLoadsBackByteForByte) {
  auto plan = PlanRankSave(Request(true), 1 << 20);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  WriteAndLoadBack("/ckpt", *plan, nullptr);
}

TEST_P(SaverWriteTest, ADataFileStreamedThroughAFragmentReaderLoadsBackByteForByte) {
  auto plan = PlanRankSave(Request(false), 1 << 20, /*require_data=*/false);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  uint64_t next = 0;
  uint32_t current = ~0u;
  FragmentReader reader = [&](const PlannedFragment& f, uint64_t raw_offset, uint64_t n, uint8_t* dst) {
    if (f.request_index != current) current = f.request_index, next = 0;
    EXPECT_EQ(next, raw_offset) << "ranges come in file order, consecutively";
    next = raw_offset + n;
    const uint8_t* src = f.request_index == 0 ? reinterpret_cast<const uint8_t*>(w_.data())
                                              : reinterpret_cast<const uint8_t*>(b_.data());
    std::memcpy(dst, src + raw_offset, n);
    return Status::OK();
  };
  WriteAndLoadBack("/ckpt", *plan, reader);
}

TEST_P(SaverWriteTest, AFragmentReadersErrorFailsTheWriteAndCommitsNothing) {
  auto plan = PlanRankSave(Request(false), 1 << 20, /*require_data=*/false);
  ASSERT_TRUE(plan.ok());
  const RankWriteOptions o = Options();
  Result<std::string> dir = PrepareStepDir(env_.get(), "/ckpt", o.step, o.run_hash, 0, 1);
  ASSERT_TRUE(dir.ok());
  auto index = WriteRankData(env_.get(), *dir, *plan, {}, "", o,
                             [](const PlannedFragment&, uint64_t, uint64_t, uint8_t*) {
                               return Status::IOError("source.h5", "read failed");
                             });
  ASSERT_FALSE(index.ok());
  EXPECT_NE(std::string::npos, index.status().ToString().find("source.h5")) << index.status().ToString();
  EXPECT_FALSE(CheckpointReader::Open(env_.get(), "/ckpt", o.step).ok());
}

INSTANTIATE_TEST_SUITE_P(Codecs, SaverWriteTest,
                         ::testing::Values(format::Codec::kNone, format::Codec::kZstd, format::Codec::kZstdByteGroup));

}  // namespace rank_data_test
}  // namespace lifeline
