// The per-rank object rule across world sizes: folding for a smaller world, reading back the
// saving rank and name, and the reserved names that keep the two forms apart.
#include "lib/src/save/rank_objects.h"

#include <gtest/gtest.h>

namespace lifeline {
namespace rank_objects_test {

format::ObjectInfo Obj(uint32_t rank, std::string name) {
  format::ObjectInfo o;
  o.rank = rank;
  o.name = std::move(name);
  return o;
}

TEST(RankObjectsTest, ReservedNames) {
  EXPECT_TRUE(IsReservedObjectName("rank0/rng"));
  EXPECT_TRUE(IsReservedObjectName("rank12/a/b"));
  EXPECT_TRUE(IsReservedObjectName("rank007/x"));
  EXPECT_FALSE(IsReservedObjectName("rank/x"));
  EXPECT_FALSE(IsReservedObjectName("rank5"));
  EXPECT_FALSE(IsReservedObjectName("rank5x/y"));
  EXPECT_FALSE(IsReservedObjectName("rng"));
  EXPECT_FALSE(IsReservedObjectName("my/rank5/x"));
}

TEST(RankObjectsTest, FoldKeepsRanksThatExistAndFoldsTheOthers) {
  Result<RankedObjectName> same = FoldObject(1, "rng", 2);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(same->rank, 1u);
  EXPECT_EQ(same->name, "rng");
  Result<RankedObjectName> folded = FoldObject(3, "rng", 2);
  ASSERT_TRUE(folded.ok()) << folded.status().ToString();
  EXPECT_EQ(folded->rank, 1u);
  EXPECT_EQ(folded->name, "rank3/rng");
}

TEST(RankObjectsTest, FoldRefusesReservedAndOversizedNames) {
  Result<RankedObjectName> r = FoldObject(0, "rank5/rng", 4);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().code() == StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().ToString().find("rank5/rng"), std::string::npos) << r.status().ToString();
  EXPECT_FALSE(FoldObject(5, std::string(format::kMaxNameBytes, 'x'), 4).ok());
  EXPECT_TRUE(FoldObject(1, std::string(format::kMaxNameBytes, 'x'), 4).ok());  // not folded
  EXPECT_FALSE(FoldObject(0, "rng", 0).ok());
}

TEST(RankObjectsTest, SavedObjectOfReadsTheFoldBack) {
  for (uint32_t world : {1u, 2u, 3u}) {
    for (uint32_t saved = 0; saved < 8; ++saved) {
      Result<RankedObjectName> stored = FoldObject(saved, "dataloader", world);
      ASSERT_TRUE(stored.ok());
      const RankedObjectName back = SavedObjectOf(Obj(stored->rank, stored->name), world);
      EXPECT_EQ(back.rank, saved) << "world " << world;
      EXPECT_EQ(back.name, "dataloader");
    }
  }
}

TEST(RankObjectsTest, SavedObjectOfLeavesEntriesNoFoldCouldHaveWritten) {
  // Held by the wrong rank, a rank inside the world, a non-canonical number: not folds.
  EXPECT_EQ(SavedObjectOf(Obj(0, "rank3/x"), 2).rank, 0u);
  EXPECT_EQ(SavedObjectOf(Obj(1, "rank1/x"), 2).name, "rank1/x");
  EXPECT_EQ(SavedObjectOf(Obj(1, "rank03/x"), 2).rank, 1u);
  EXPECT_EQ(SavedObjectOf(Obj(1, "rank3/"), 2).rank, 1u);
}

TEST(RankObjectsTest, ObjectsSavedByFindsDirectAndFoldedEntries) {
  format::CheckpointIndex m;
  m.world_size = 2;
  m.objects = {Obj(0, "rng"), Obj(0, "rank2/rng"), Obj(1, "rng"), Obj(1, "rank3/rng"), Obj(0, "rank4/rng")};
  auto names = [&](uint32_t r) {
    std::vector<std::string> out;
    for (const RankObjectRef& ref : ObjectsSavedBy(m, r)) out.push_back(ref.name + "@" + ref.object->name);
    return out;
  };
  EXPECT_EQ(names(0), std::vector<std::string>{"rng@rng"});
  EXPECT_EQ(names(1), std::vector<std::string>{"rng@rng"});
  EXPECT_EQ(names(2), std::vector<std::string>{"rng@rank2/rng"});
  EXPECT_EQ(names(3), std::vector<std::string>{"rng@rank3/rng"});
  EXPECT_EQ(names(4), std::vector<std::string>{"rng@rank4/rng"});
  EXPECT_TRUE(names(6).empty());  // a rank the saving job never had
}

}  // namespace rank_objects_test
}  // namespace lifeline
