// Nothing outside the checkpoint root, ever: a symbolic link planted inside a checkpoint (as a step
// directory, a rank index or a data file) is reported and refused, never followed. Retention
// removes such a link as a link and leaves what it points to alone; a load or verify refuses it
// naming it; a save never writes through it.
#include <unistd.h>

#include <algorithm>
#include <string>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/commit.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {
namespace symlink_test {

std::vector<GlobalTensor> Tensors(uint64_t salt) {
  return {MakeTensor("w", DType::kF32, {32, 50}, salt), MakeTensor("b", DType::kBF16, {50}, salt)};
}

bool Contains(const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

class SymlinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    dir_ = tmp_.Sub("ckpt");
    outside_ = tmp_.Sub("outside");
    // Files of the machine that a link inside the checkpoint points to: they must survive untouched.
    ASSERT_TRUE(Env::Default()->CreateDir(outside_ + "/nested").ok());
    ASSERT_TRUE(WriteWholeFile(outside_ + "/precious", "do not delete"));
    ASSERT_TRUE(WriteWholeFile(outside_ + "/nested/also", "nor this"));
    before_ = SnapshotTree(outside_);
  }

  CheckpointerOptions Options(uint32_t keep_last = 0) const {
    CheckpointerOptions o = test::SmallCheckpointerOptions(dir_, "symlink-test", 4096);
    o.save_memory_budget = 64 << 10;
    o.keep_last = keep_last;
    return o;
  }

  Status Save(uint64_t step, uint32_t keep_last = 0) {
    std::vector<Status> st = SaveAllRanks(Options(keep_last), Tensors(step), DimLayout(1, 0), step, step, false);
    return st[0];
  }

  std::string StepDir(uint64_t step) const { return dir_ + "/" + StepDirName(step); }

  // The one file of `step`'s directory whose name contains `part` (".data", ".index").
  std::string FileOfStep(uint64_t step, const std::string& part) const {
    for (const std::string& n : ListDir(StepDir(step)))
      if (n.find(part) != std::string::npos && n.find(".manifest") == std::string::npos) return StepDir(step) + "/" + n;
    return "";
  }

  void PlantLink(const std::string& target, const std::string& link) {
    ASSERT_EQ(0, ::symlink(target.c_str(), link.c_str())) << link;
  }

  bool OutsideIntact() const { return SnapshotTree(outside_) == before_; }

  TempDir tmp_;
  std::string dir_;
  std::string outside_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> before_;
};

TEST_F(SymlinkTest, RetentionRemovesALinkedStepDirectoryNotItsTarget) {
  ASSERT_TRUE(Save(1).ok());
  PlantLink(outside_, StepDir(0));
  ASSERT_TRUE(Save(2, /*keep_last=*/1).ok());
  EXPECT_TRUE(OutsideIntact()) << "retention deleted files outside the checkpoint through a link";
  EXPECT_TRUE(Env::Default()->GetEntryType(StepDir(0)).status().IsNotFound()) << "the planted link was kept";
  EXPECT_FALSE(Env::Default()->FileExists(StepDir(1)));
  EXPECT_TRUE(Env::Default()->IsDirectory(StepDir(2)));
}

TEST_F(SymlinkTest, ALinkToAnotherCompleteCheckpointIsNotComplete) {
  // The worst case: the link points at a real, complete checkpoint step elsewhere.
  const std::string elsewhere = tmp_.Sub("other");
  {
    CheckpointerOptions o = Options();
    o.directory = elsewhere;
    std::vector<Status> st = SaveAllRanks(o, Tensors(5), DimLayout(1, 0), 5, 5, false);
    ASSERT_TRUE(st[0].ok()) << st[0].ToString();
  }
  const auto other_before = SnapshotTree(elsewhere);
  ASSERT_TRUE(Save(1).ok());
  PlantLink(elsewhere + "/" + StepDirName(5), StepDir(0));

  Result<std::vector<CheckpointInfo>> all = ScanCheckpoints(Env::Default(), dir_);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(2u, all->size());
  const CheckpointInfo& linked = all->back();
  EXPECT_EQ(0u, linked.step);
  EXPECT_FALSE(linked.complete);
  EXPECT_NE(std::string::npos, linked.problem.find("symbolic link")) << linked.problem;
  EXPECT_NE(std::string::npos, linked.problem.find("not followed")) << linked.problem;

  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(Env::Default(), dir_, 0);
  EXPECT_TRUE(reader.status().IsNotFound()) << reader.status().ToString();
  EXPECT_TRUE(Contains(reader.status(), "symbolic link")) << reader.status().ToString();

  RetentionPolicy policy;
  policy.keep_last = 1;
  ASSERT_TRUE(CollectGarbageIn(Env::Default(), dir_, policy).ok());
  EXPECT_TRUE(Env::Default()->GetEntryType(StepDir(0)).status().IsNotFound());
  EXPECT_EQ(other_before, SnapshotTree(elsewhere)) << "garbage collection deleted another checkpoint through a link";
}

TEST_F(SymlinkTest, ASaveNeverWritesThroughALinkedStepDirectory) {
  ASSERT_TRUE(Save(1).ok());
  PlantLink(outside_, StepDir(3));
  Status s = Save(3);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s, StepDir(3))) << s.ToString();
  EXPECT_TRUE(Contains(s, "symbolic link")) << s.ToString();
  EXPECT_TRUE(OutsideIntact()) << "the save wrote into the link's target";
}

TEST_F(SymlinkTest, ALoadAndAVerifyRefuseALinkedDataFile) {
  ASSERT_TRUE(Save(1).ok());
  const std::string data = FileOfStep(1, ".data");
  ASSERT_FALSE(data.empty());
  // The same bytes, moved outside and linked back: still refused, the link is the problem.
  ASSERT_EQ(0, ::rename(data.c_str(), (outside_ + "/moved.data").c_str()));
  PlantLink(outside_ + "/moved.data", data);

  auto ckpt = Checkpointer::Open(Options());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  std::string diff;
  Result<uint64_t> got = LoadWholeAndCompare(ckpt->get(), 1, Tensors(1), &diff);
  ASSERT_FALSE(got.ok()) << "a load read a data file through a link";
  EXPECT_TRUE(Contains(got.status(), data)) << got.status().ToString();
  EXPECT_TRUE(Contains(got.status(), "is a symbolic link")) << got.status().ToString();

  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(Env::Default(), dir_, 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  VerifyReport report;
  Status v = (*reader)->Verify(&report);
  EXPECT_FALSE(v.ok());
  EXPECT_TRUE(Contains(v, data)) << v.ToString();
}

// Issue 32, item 6: a FIFO or a link in the newest step made Load(latest) fail outright (a FIFO
// also hung it before). It is damage like any other: the load falls back to the step before, says
// which it passed over, and never blocks.
TEST_F(SymlinkTest, ALoadOfTheLatestPassesOverAStepWithAPlantedFifoOrLink) {
  ASSERT_TRUE(Save(1).ok());
  ASSERT_TRUE(Save(2).ok());
  ASSERT_TRUE(Save(3).ok());
  const std::string data = FileOfStep(3, ".data");
  ASSERT_EQ(0, ::unlink(data.c_str()));
  ASSERT_EQ(0, ::mkfifo(data.c_str(), 0644));
  const std::string index = FileOfStep(2, ".index");
  ASSERT_EQ(0, ::rename(index.c_str(), (outside_ + "/moved.index").c_str()));
  for (const std::string& n : ListDir(StepDir(2)))  // the manifest would describe it without the index
    if (n.find(".manifest") != std::string::npos) {
      ASSERT_EQ(0, ::unlink((StepDir(2) + "/" + n).c_str()));
    }
  PlantLink(outside_ + "/moved.index", index);

  auto ckpt = Checkpointer::Open(Options());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  std::vector<GlobalTensor> expected = Tensors(1);
  std::vector<RankState> ranks = BuildRanks(expected, DimLayout(1, 0), false);
  LoadRequest req;
  req.tensors = ranks[0].shards;
  Result<LoadResult> r = (*ckpt)->Load(std::nullopt, req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step, 1u);
  std::vector<uint64_t> skipped;
  for (const SkippedCheckpoint& s : r->skipped) skipped.push_back(s.step);
  EXPECT_EQ(skipped, std::vector<uint64_t>{3}) << "step 2 has no valid index: it is not even complete";
  ASSERT_FALSE(r->skipped.empty());
  EXPECT_TRUE(r->skipped[0].reason.find("is not a regular file") != std::string::npos) << r->skipped[0].reason;
}

TEST_F(SymlinkTest, ALinkedRankIndexIsNotCountedAndIsNamed) {
  ASSERT_TRUE(Save(1).ok());
  const std::string index = FileOfStep(1, ".index");
  ASSERT_FALSE(index.empty());
  ASSERT_EQ(0, ::rename(index.c_str(), (outside_ + "/moved.index").c_str()));
  PlantLink(outside_ + "/moved.index", index);
  const auto outside_now = SnapshotTree(outside_);

  Result<std::vector<CheckpointInfo>> all = ScanCheckpoints(Env::Default(), dir_);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(1u, all->size());
  EXPECT_FALSE((*all)[0].complete);
  const std::string name = index.substr(index.rfind('/') + 1);
  EXPECT_NE(std::string::npos, (*all)[0].problem.find(name + " is a symbolic link")) << (*all)[0].problem;

  auto ckpt = Checkpointer::Open(Options());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  std::string diff;
  Result<uint64_t> got = LoadWholeAndCompare(ckpt->get(), 1, Tensors(1), &diff);
  EXPECT_FALSE(got.ok());
  EXPECT_TRUE(Contains(got.status(), "symbolic link")) << got.status().ToString();

  // A newer save's retention removes the broken step; the moved index outside stays.
  ASSERT_TRUE(Save(2, /*keep_last=*/1).ok());
  EXPECT_FALSE(Env::Default()->FileExists(StepDir(1)));
  EXPECT_EQ(outside_now, SnapshotTree(outside_));
}

}  // namespace symlink_test
}  // namespace lifeline::testing
