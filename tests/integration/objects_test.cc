// Per-rank objects survive a conversion to a smaller world: a 4-rank save converted to 2 ranks (as
// `lifeline convert` writes it: objects of ranks 2 and 3 folded into ranks 0 and 1) and then to 1
// rank still gives every saving rank its own objects back, whoever loads them and with whatever
// world size. A rank the saving job never had gets none; the reserved folded names cannot be saved.
#include <map>

#include <gtest/gtest.h>

#include "formats/index_codec.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/commit.h"
#include "lib/src/save/rank_objects.h"
#include "lib/src/save/rank_data.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {
namespace objects_test {

constexpr uint64_t kStep = 100;
constexpr uint64_t kSalt = 11;

CheckpointerOptions Options(const std::string& dir, uint32_t rank, uint32_t world) {
  CheckpointerOptions o;
  o.directory = dir;
  o.run_id = "objects-test";
  o.rank = rank;
  o.world_size = world;
  o.chunk_bytes = 4096;
  o.write_block_bytes = 64 << 10;
  o.direct_io = false;
  return o;
}

std::map<std::string, std::string> AsMap(const std::vector<std::pair<std::string, std::string>>& v) {
  return std::map<std::string, std::string>(v.begin(), v.end());
}

std::map<std::string, std::string> SavedObjects(uint32_t rank) {
  RankState none;
  return AsMap(RequestOf(none, rank, kSalt).objects);
}

// Rewrites the checkpoint of step kStep under `from` for `world` ranks under `to`, the way
// `lifeline convert --to lifeline` does: whole tensors replicated over the new ranks, every object
// back to its saving rank (SavedObjectOf) and folded for the new world (FoldObject).
void Convert(const std::string& from, const std::string& to, uint32_t world) {
  Env* env = Env::Default();
  auto reader = CheckpointReader::Open(env, from, kStep, ReaderOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const format::CheckpointIndex& m = (*reader)->manifest();
  std::vector<std::vector<uint8_t>> data;
  for (const format::TensorInfo& t : m.tensors) {
    int64_t n = 1;
    for (int64_t e : t.shape) n *= e;
    data.emplace_back(static_cast<size_t>(n) * DTypeSize(t.dtype));
  }
  std::vector<TensorShard> whole;
  for (size_t i = 0; i < m.tensors.size(); ++i)
    whole.push_back(TensorShard::Whole(m.tensors[i].name, m.tensors[i].dtype, m.tensors[i].shape,
                                       data[i].empty() ? nullptr : data[i].data()));
  auto loaded = (*reader)->Load(whole);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::vector<std::vector<std::pair<std::string, std::string>>> objects(world);
  for (const format::ObjectInfo& o : m.objects) {
    const RankedObjectName saved = SavedObjectOf(o, m.world_size);
    auto stored = FoldObject(saved.rank, saved.name, world);
    ASSERT_TRUE(stored.ok()) << stored.status().ToString();
    auto bytes = (*reader)->ReadObject(o);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    objects[stored->rank].emplace_back(stored->name, *bytes);
  }
  ASSERT_TRUE(CreateDirDurably(env, to).ok());
  RankWriteOptions w;
  w.step = kStep;
  w.world_size = world;
  w.run_id = "objects-test-convert";
  w.run_hash = RunHash(w.run_id);
  w.direct_io = false;
  for (uint32_t r = 0; r < world; ++r) {
    SaveRequest request;
    for (const TensorShard& t : whole) request.tensors.push_back(TensorShard(t).Replica(r, world));
    auto plan = PlanRankSave(request, CheckpointerOptions().replica_split_bytes);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    auto step_dir = PrepareStepDir(env, to, kStep, w.run_hash, r, world);
    ASSERT_TRUE(step_dir.ok()) << step_dir.status().ToString();
    w.rank = r;
    auto index = WriteRankData(env, *step_dir, *plan, objects[r], r == 0 ? m.metadata_json : "", w);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    auto encoded = format::EncodeIndex(*index);
    ASSERT_TRUE(encoded.ok());
    auto committed = PublishRankIndex(env, to, kStep, w.run_hash, r, world, *encoded, false, 0);
    ASSERT_TRUE(committed.ok()) << committed.status().ToString();
    EXPECT_EQ(*committed, r + 1 == world);
  }
}

class ObjectsAcrossWorldSizesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<Status> saved =
        SaveAllRanks(Options(saved_.path(), 0, 4), StandardTensors(kSalt), TpDpLayout(2, 2), kStep, kSalt, true);
    ASSERT_TRUE(AllOk(saved)) << Describe(saved);
    ASSERT_NO_FATAL_FAILURE(Convert(saved_.path(), two_.path(), 2));
  }

  // The objects rank `rank` of a `world`-rank job gets from `dir`.
  static Result<std::map<std::string, std::string>> ObjectsLoaded(const std::string& dir, uint32_t rank,
                                                                  uint32_t world,
                                                                  std::optional<uint32_t> of_rank = std::nullopt) {
    LL_ASSIGN_OR_RETURN(std::unique_ptr<Checkpointer> ckpt, Checkpointer::Open(Options(dir, rank, world)));
    LoadRequest request;
    request.objects_of_rank = of_rank;
    LL_ASSIGN_OR_RETURN(LoadResult result, ckpt->Load(kStep, request));
    return AsMap(result.objects);
  }

  TempDir saved_, two_;
};

TEST_F(ObjectsAcrossWorldSizesTest, TwoRankCheckpointGivesEverySavingRankItsObjects) {
  for (uint32_t r = 0; r < 4; ++r) {
    SCOPED_TRACE("objects of saved rank " + std::to_string(r));
    auto got = ObjectsLoaded(two_.path(), 0, 2, r);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, SavedObjects(r));
  }
}

TEST_F(ObjectsAcrossWorldSizesTest, LoadsByThreeAndFourRanksGetTheirOwnObjects) {
  for (uint32_t world : {3u, 4u}) {
    for (uint32_t r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(world));
      auto got = ObjectsLoaded(two_.path(), r, world);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, SavedObjects(r));
    }
  }
}

TEST_F(ObjectsAcrossWorldSizesTest, ConvertingAgainKeepsTheSavingRanks) {
  TempDir one;
  ASSERT_NO_FATAL_FAILURE(Convert(two_.path(), one.path(), 1));
  for (uint32_t r = 0; r < 4; ++r) {
    SCOPED_TRACE("objects of saved rank " + std::to_string(r));
    auto got = ObjectsLoaded(one.path(), 0, 1, r);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, SavedObjects(r));
  }
  // And back up to 3 ranks: rank 3's objects fold into rank 0 again.
  TempDir three;
  ASSERT_NO_FATAL_FAILURE(Convert(one.path(), three.path(), 3));
  for (uint32_t r = 0; r < 4; ++r) {
    auto got = ObjectsLoaded(three.path(), r % 3, 3, r);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, SavedObjects(r)) << "objects of saved rank " << r;
  }
}

TEST_F(ObjectsAcrossWorldSizesTest, RankTheSavingJobNeverHadGetsNoObjects) {
  for (const std::string& dir : {saved_.path(), two_.path()}) {
    auto got = ObjectsLoaded(dir, 0, 2, 6);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(got->empty()) << dir;
    auto own = ObjectsLoaded(dir, 5, 6);  // a job grown to 6 ranks: rank 5 loads its tensors, no objects
    ASSERT_TRUE(own.ok()) << own.status().ToString();
    EXPECT_TRUE(own->empty()) << dir;
  }
}

TEST(ObjectNamesTest, SaveRefusesTheFoldedForm) {
  TempDir dir;
  auto ckpt = Checkpointer::Open(Options(dir.path(), 1, 4));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  SaveRequest request;
  request.objects.emplace_back("rank5/rng", "x");
  const Status s = (*ckpt)->Save(kStep, request).WaitPersisted();
  EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.ToString().find("rank5/rng"), std::string::npos) << s.ToString();
}

}  // namespace objects_test
}  // namespace lifeline::testing
