// The load planner: which chunks feed which target, and a clear error when the stored fragments
// do not cover a target.
#include "lifeline/internal/load_plan.h"

#include <gtest/gtest.h>

namespace lifeline {
namespace load_plan_test {

// A [4, 8] f32 tensor stored as two fragments of two rows each, chunks of 16 elements (2 rows).
format::CheckpointIndex TwoFragments(bool drop_second) {
  format::CheckpointIndex m;
  m.kind = format::IndexKind::kManifest;
  m.chunk_bytes = 64;
  m.files.push_back({"r0.data", 0, 0});
  m.tensors.push_back({"w", DType::kF32, {4, 8}});
  for (int64_t f = 0; f < (drop_second ? 1 : 2); ++f) {
    format::FragmentInfo frag;
    frag.tensor = 0;
    frag.region = format::Region{{2 * f, 0}, {2, 8}, 0, 16};
    frag.first_chunk = m.chunks.size();
    frag.num_chunks = 1;
    m.chunks.push_back({64, 0});
    m.fragments.push_back(frag);
  }
  return m;
}

TEST(LoadPlanTest, ATargetAcrossTwoFragmentsIsFedByBothChunks) {
  const format::CheckpointIndex m = TwoFragments(false);
  // Rows 1-2, columns 2-5.
  auto plan = PlanLoad(m, {LoadTarget{0, format::RegionOfBox({1, 2}, {2, 4})}}, "ckpt");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].chunk, 0u);
  EXPECT_EQ((*plan)[0].box, (format::Box{{1, 2}, {1, 4}}));
  EXPECT_EQ((*plan)[1].chunk, 1u);
  EXPECT_EQ((*plan)[1].box, (format::Box{{2, 2}, {1, 4}}));
}

TEST(LoadPlanTest, ATargetTheFragmentsDoNotCoverIsCorruptionNamingTensorAndRegion) {
  const format::CheckpointIndex m = TwoFragments(true);
  auto plan = PlanLoad(m, {LoadTarget{0, format::RegionOfBox({1, 0}, {2, 8})}}, "ckpt/step-1");
  ASSERT_FALSE(plan.ok());
  EXPECT_TRUE(plan.status().IsCorruption());
  const std::string why = plan.status().ToString();
  EXPECT_NE(why.find("ckpt/step-1"), std::string::npos) << why;
  EXPECT_NE(why.find("tensor 'w': the checkpoint holds 8 of the 16 elements"), std::string::npos) << why;
  EXPECT_NE(why.find("offsets [1, 0] shape [2, 8]"), std::string::npos) << why;
}

TEST(LoadPlanTest, ATargetNamingNoTensorIsRefused) {
  auto plan = PlanLoad(TwoFragments(false), {LoadTarget{3, format::RegionOfBox({0, 0}, {1, 1})}}, "ckpt");
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().ToString().find("tensor 3 of 1"), std::string::npos) << plan.status().ToString();
}

}  // namespace load_plan_test
}  // namespace lifeline
