// The findings of the attack campaign of issue 17, each reproduced: a step belongs to one launch;
// complete means loadable; retention and gc never leave the job without a loadable checkpoint; a
// full disk does not leave it stuck; a load that falls back says so; a launch's ranks resume from
// the step fixed for it.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <cstring>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "formats/index_codec.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lib/src/save/commit.h"
#include "lifeline/inspect.h"
#include "tests/fuzz/index_reseal.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {
namespace safety_test {

using ::testing::HasSubstr;

std::vector<GlobalTensor> Tensors(uint64_t salt) {
  return {MakeTensor("w", DType::kF32, {64, 100}, salt), MakeTensor("b", DType::kBF16, {100}, salt)};
}

// The launch-id variables of the test process, cleared for a test and restored after it.
class ScopedLaunchEnvironment {
 public:
  ScopedLaunchEnvironment() {
    for (const char* k : kNames) {
      const char* v = std::getenv(k);
      saved_.emplace_back(k, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(k);
    }
  }
  ~ScopedLaunchEnvironment() {
    for (const auto& [k, v] : saved_) {
      if (v) ::setenv(k, v->c_str(), 1);
      else ::unsetenv(k);
    }
  }

 private:
  static constexpr const char* kNames[] = {"LIFELINE_LAUNCH_ID", "LIFELINE_JOB", "LIFELINE_RESTART",
                                           "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                                           "LIFELINE_RESUME_STEP", "LIFELINE_RESUME_DIR"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

class SafetyTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tmp_.Sub("ckpt"); }

  CheckpointerOptions Options(std::string run_id, uint32_t rank = 0, uint32_t world = 1) const {
    CheckpointerOptions o;
    o.directory = dir_;
    o.rank = rank;
    o.world_size = world;
    o.run_id = std::move(run_id);
    o.chunk_bytes = 4096;
    o.write_block_bytes = 4096;
    o.save_memory_budget = 64 << 10;
    return o;
  }

  // Saves step `step` (contents under salt == step) with every rank of `world`, cutting dim 0.
  void SaveStep(uint64_t step, uint32_t world, const std::string& run_id, uint32_t keep_last = 0) {
    CheckpointerOptions o = Options(run_id);
    o.keep_last = keep_last;
    std::vector<Status> st = SaveAllRanks(o, Tensors(step), DimLayout(world, 0), step, step, false);
    ASSERT_TRUE(AllOk(st)) << Describe(st);
  }

  std::vector<CheckpointInfo> List() {
    auto all = ScanCheckpoints(Env::Default(), dir_);
    EXPECT_TRUE(all.ok()) << all.status().ToString();
    return all.ok() ? *all : std::vector<CheckpointInfo>{};
  }

  const CheckpointInfo* Find(const std::vector<CheckpointInfo>& all, uint64_t step) {
    for (const CheckpointInfo& c : all)
      if (c.step == step) return &c;
    return nullptr;
  }

  TempDir tmp_;
  std::string dir_;
};

// Finding 2: with no launch id anywhere, every launch used "default", and ranks of two launches
// completed one step together. Now a multi-rank save without one is refused, saying how to set one.
TEST_F(SafetyTest, WithoutALaunchIdTwoLaunchesCannotCompleteOneStep) {
  ScopedLaunchEnvironment env;
  SaveStep(4, 2, "launch-0");
  std::vector<GlobalTensor> a = Tensors(50), b = Tensors(51);
  std::vector<RankState> ra = BuildRanks(a, DimLayout(2, 0), true), rb = BuildRanks(b, DimLayout(2, 0), true);
  // Launch A: rank 0 persists step 5, rank 1 dies before saving.
  {
    auto c = Checkpointer::Open(Options("", 0, 2));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    Status s = (*c)->Save(5, RequestOf(ra[0], 0, 50)).WaitPersisted();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_THAT(s.ToString(), HasSubstr("run_id"));
  }
  // Launch B: rank 1 saves a different step 5.
  {
    auto c = Checkpointer::Open(Options("", 1, 2));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_FALSE((*c)->Save(5, RequestOf(rb[1], 1, 51)).WaitPersisted().ok());
  }
  const CheckpointInfo* five = Find(List(), 5);
  EXPECT_TRUE(five == nullptr || !five->complete);
  auto loader = Checkpointer::Open(Options("", 0, 2));
  ASSERT_TRUE(loader.ok());
  std::string diff;
  auto got = LoadWholeAndCompare(loader->get(), std::nullopt, Tensors(4), &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 4u);
  EXPECT_EQ(diff, "");
}

TEST_F(SafetyTest, TorchrunsDefaultRunIdIsNoLaunchId) {
  ScopedLaunchEnvironment env;
  ::setenv("TORCHELASTIC_RUN_ID", "none", 1);
  ::setenv("TORCHELASTIC_RESTART_COUNT", "0", 1);
  auto c = Checkpointer::Open(Options("", 0, 2));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->options().run_id, "");
  ::setenv("TORCHELASTIC_RUN_ID", "job-17", 1);
  auto d = Checkpointer::Open(Options("", 0, 2));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->options().run_id, "torchelastic:job-17:0");
  ::setenv("LIFELINE_LAUNCH_ID", "j:abc:1", 1);
  auto e = Checkpointer::Open(Options("", 0, 2));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->options().run_id, "lifeline:j:abc:1");
}

TEST_F(SafetyTest, ASingleProcessGetsALaunchIdOfItsOwn) {
  ScopedLaunchEnvironment env;
  auto a = Checkpointer::Open(Options(""));
  auto b = Checkpointer::Open(Options(""));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE((*a)->options().run_id.empty());
  EXPECT_NE((*a)->options().run_id, (*b)->options().run_id);
  std::vector<RankState> r = BuildRanks(Tensors(3), WholeLayout(), true);
  EXPECT_TRUE((*a)->Save(3, RequestOf(r[0], 0, 3)).WaitCommitted(30).ok());
}

// Finding 3 and deliverable 3: two ranks that both store a tensor whole (data-parallel copies not
// marked as replicas) never make a complete step: every rank's ticket fails naming the tensor, the
// ranks and the fix; the step is visibly invalid, never loaded, and collected.
TEST_F(SafetyTest, OverlappingPiecesMakeAnInvalidStepThatEveryRankSeesFail) {
  SaveStep(1, 2, "good");
  std::vector<GlobalTensor> t = Tensors(2);
  std::vector<std::unique_ptr<Checkpointer>> ranks;
  std::vector<SaveTicket> tickets;
  for (uint32_t r = 0; r < 2; ++r) {
    auto c = Checkpointer::Open(Options("ddp-mistake", r, 2));
    ASSERT_TRUE(c.ok());
    SaveRequest req;
    for (const GlobalTensor& g : t)
      req.tensors.push_back(TensorShard::Whole(g.name, g.dtype, g.shape, const_cast<uint8_t*>(g.bytes.data())));
    tickets.push_back((*c)->Save(2, req));
    ranks.push_back(std::move(*c));
  }
  for (uint32_t r = 0; r < 2; ++r) {
    Status s = tickets[r].WaitCommitted(30);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << "rank " << r << ": " << s.ToString();
    EXPECT_THAT(s.ToString(), HasSubstr("ranks 0 and 1 both stored overlapping pieces"));
    EXPECT_THAT(s.ToString(), HasSubstr("replicas"));
    EXPECT_NE(tickets[r].Progress().phase, SavePhase::kCommitted);
  }
  std::vector<CheckpointInfo> all = List();
  const CheckpointInfo* two = Find(all, 2);
  ASSERT_NE(two, nullptr);
  EXPECT_FALSE(two->complete);
  EXPECT_TRUE(two->invalid);
  EXPECT_THAT(two->problem, HasSubstr("tensor '"));
  // Never loaded: the newest loadable step is 1.
  std::string diff;
  auto got = LoadWholeAndCompare(ranks[0].get(), std::nullopt, Tensors(1), &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 1u);
  EXPECT_EQ(diff, "");
  EXPECT_FALSE(ranks[0]->Load(2, LoadRequest{}).ok());
  // Collected even though it is the newest step.
  ASSERT_TRUE(CollectGarbageIn(Env::Default(), dir_, SaverRetention(Env::Default(), 1, RunHash("next"))).ok());
  EXPECT_EQ(Find(List(), 2), nullptr);
  EXPECT_NE(Find(List(), 1), nullptr);
}

// A manifest is trusted no more than the rank indexes it merges: one claiming overlapping pieces
// is refused, and the load uses the rank indexes (right data, never zeros for the uncovered rows).
TEST_F(SafetyTest, AnOverlappingManifestIsNotTrusted) {
  SaveStep(3, 2, "m");
  const std::string step_dir = JoinPath(dir_, StepDirName(3));
  const std::string path = JoinPath(step_dir, ManifestFileName(RunHash("m"), 2));
  auto manifest = format::DecodeIndex(ReadWholeFile(path), path);
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  // Rank 1 claims rank 0's rows of "w".
  for (format::FragmentInfo& f : manifest->fragments)
    if (manifest->tensors[f.tensor].name == "w" && manifest->files[f.file].rank == 1) f.region.offsets[0] = 0;
  auto bytes = format::EncodeIndex(*manifest);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  ASSERT_TRUE(WriteWholeFile(path, *bytes));
  EXPECT_THAT(format::ValidateCoverage(*manifest, path, true).ToString(), HasSubstr("tensor 'w'"));
  auto c = Checkpointer::Open(Options("m"));
  ASSERT_TRUE(c.ok());
  std::string diff;
  auto got = LoadWholeAndCompare(c->get(), 3, Tensors(3), &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(diff, "");
}

// Finding 9: a manifest of a format version this reader does not know, beside rank indexes it
// does, no longer makes the checkpoint unreadable: the rank indexes are merged instead.
TEST_F(SafetyTest, AManifestOfANewerVersionBesideGoodRankIndexesStillLoads) {
  SaveStep(6, 2, "v");
  const std::string path = JoinPath(JoinPath(dir_, StepDirName(6)), ManifestFileName(RunHash("v"), 2));
  std::string bytes = ReadWholeFile(path);
  const uint32_t version = 2;
  std::memcpy(bytes.data() + 8, &version, 4);  // magic (8), then the format version
  ASSERT_TRUE(fuzz::ResealIndex(&bytes));
  ASSERT_TRUE(WriteWholeFile(path, bytes));
  ASSERT_TRUE(format::DecodeIndex(bytes, path).status().IsNotSupported());
  auto c = Checkpointer::Open(Options("v"));
  ASSERT_TRUE(c.ok());
  std::string diff;
  auto got = LoadWholeAndCompare(c->get(), std::nullopt, Tensors(6), &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 6u);
  EXPECT_EQ(diff, "");
}

// Finding 4: damage in the newest step must not cost the older good one.
TEST_F(SafetyTest, RetentionNeverCountsAnUnloadableStep) {
  SaveStep(1, 2, "r");
  SaveStep(2, 2, "r");
  const std::string step_dir = JoinPath(dir_, StepDirName(2));
  // Flip a byte of step 2's manifest and of a rank index: its metadata no longer reads.
  for (const std::string& name : {ManifestFileName(RunHash("r"), 2), IndexFileName(RunHash("r"), 1, 2)}) {
    std::string bytes = ReadWholeFile(JoinPath(step_dir, name));
    ASSERT_GT(bytes.size(), 100u);
    bytes[bytes.size() / 2] ^= 0x40;
    ASSERT_TRUE(WriteWholeFile(JoinPath(step_dir, name), bytes));
  }
  ASSERT_TRUE(CollectGarbageIn(Env::Default(), dir_, SaverRetention(Env::Default(), 1, RunHash("r"))).ok());
  std::vector<CheckpointInfo> all = List();
  ASSERT_NE(Find(all, 1), nullptr) << "the only loadable step was removed";
  auto c = Checkpointer::Open(Options("r"));
  ASSERT_TRUE(c.ok());
  std::string diff;
  auto got = LoadWholeAndCompare(c->get(), std::nullopt, Tensors(1), &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 1u);
  EXPECT_EQ(diff, "");
  // Deliverable 6: the load says which step it passed over and why.
  LoadRequest req;
  std::vector<uint8_t> w(64 * 100 * 4);
  req.tensors.push_back(TensorShard::Whole("w", DType::kF32, {64, 100}, w.data()));
  auto result = (*c)->Load(std::nullopt, req);
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result->skipped.size(), 1u);
  EXPECT_EQ(result->skipped[0].step, 2u);
  EXPECT_EQ(result->skipped[0].location, "disk");
  EXPECT_THAT(result->skipped[0].reason, HasSubstr("Corruption: " + step_dir));
  // A newer good step makes the damaged one collectable.
  SaveStep(3, 2, "r", /*keep_last=*/1);
  all = List();
  EXPECT_EQ(Find(all, 2), nullptr);
  EXPECT_EQ(Find(all, 1), nullptr);
  EXPECT_NE(Find(all, 3), nullptr);
}

// Finding 5: after a full disk, the failed save's files go, and the next save succeeds once space
// is back, with nothing done by hand.
TEST_F(SafetyTest, AfterAFullDiskTheNextSaveSucceeds) {
  SaveStep(1, 2, "full");
  FaultInjectionEnv faulty(Env::Default());
  std::vector<RankState> ranks = BuildRanks(Tensors(2), DimLayout(2, 0), true);
  std::vector<std::unique_ptr<Checkpointer>> c;
  for (uint32_t r = 0; r < 2; ++r) {
    CheckpointerOptions o = Options("full", r, 2);
    o.env = &faulty;
    o.keep_last = 1;
    auto opened = Checkpointer::Open(o);
    ASSERT_TRUE(opened.ok());
    c.push_back(std::move(*opened));
  }
  // Rank 1's disk fills up during step 2; rank 0's save succeeds.
  EXPECT_TRUE(c[0]->Save(2, RequestOf(ranks[0], 0, 2)).WaitPersisted().ok());
  faulty.FailWritesAfterBytes(1000);
  Status failed = c[1]->Save(2, RequestOf(ranks[1], 1, 2)).WaitPersisted();
  EXPECT_EQ(failed.code(), StatusCode::kResourceExhausted) << failed.ToString();
  EXPECT_THAT(failed.ToString(), HasSubstr("No space left"));
  const std::string step_dir = JoinPath(dir_, StepDirName(2));
  EXPECT_FALSE(Env::Default()->FileExists(JoinPath(step_dir, DataFileName(RunHash("full"), 1, 2))))
      << "the failed save left its data file";
  // Space is back: the next save commits, and retention takes the partial step 2 and step 1.
  faulty.FailWritesAfterBytes(-1);
  std::vector<RankState> next = BuildRanks(Tensors(3), DimLayout(2, 0), true);
  SaveTicket t0 = c[0]->Save(3, RequestOf(next[0], 0, 3));
  SaveTicket t1 = c[1]->Save(3, RequestOf(next[1], 1, 3));
  ASSERT_TRUE(t0.WaitCommitted(30).ok());
  ASSERT_TRUE(t1.WaitCommitted(30).ok());
  c.clear();
  std::vector<CheckpointInfo> all = List();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].step, 3u);
  EXPECT_TRUE(all[0].complete);
}

// The same on a real file system that fills up: a 16 MiB tmpfs (root only; skipped elsewhere).
TEST_F(SafetyTest, ARealFullFileSystemRecoversWithoutAManualStep) {
  const std::string mnt = tmp_.Sub("small-fs");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0700), 0);
  if (::geteuid() != 0 || ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=16m") != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root): " << std::strerror(errno);
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::vector<GlobalTensor> step1 = {MakeTensor("w", DType::kF32, {512, 1024}, 1)};  // 2 MiB
  const std::vector<GlobalTensor> step2 = {MakeTensor("w", DType::kF32, {512, 1024}, 2)};
  const std::vector<GlobalTensor> step3 = {MakeTensor("w", DType::kF32, {512, 1024}, 3)};
  CheckpointerOptions o = Options("fs");
  o.directory = mnt + "/ckpt";
  o.keep_last = 1;
  std::vector<Status> st = SaveAllRanks(o, step1, DimLayout(2, 0), 1, 1, false);
  ASSERT_TRUE(AllOk(st)) << Describe(st);
  // Something else fills the file system to the brim, then leaves 1 MiB.
  const std::string filler = mnt + "/filler";
  {
    const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    std::vector<char> block(1 << 16, 'x');
    off_t size = 0;
    for (ssize_t n; (n = ::write(fd, block.data(), block.size())) > 0;) size += n;
    ASSERT_EQ(errno, ENOSPC);
    ASSERT_EQ(::ftruncate(fd, std::max<off_t>(0, size - (1 << 20))), 0);
    ::close(fd);
  }
  st = SaveAllRanks(o, step2, DimLayout(2, 0), 2, 2, false);
  ASSERT_FALSE(AllOk(st)) << "step 2 fit on a full file system";
  bool full = false;
  for (uint32_t r = 0; r < st.size(); ++r) {
    if (st[r].ok()) continue;
    full |= st[r].ToString().find("No space left") != std::string::npos;
    // A failed save takes its bytes with it.
    EXPECT_FALSE(Env::Default()->FileExists(
        JoinPath(JoinPath(o.directory, StepDirName(2)), DataFileName(RunHash("fs"), r, 2))))
        << "rank " << r << "'s failed save left its data file";
  }
  EXPECT_TRUE(full) << Describe(st);
  auto c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok());
  std::string diff;
  auto got = LoadWholeAndCompare(c->get(), std::nullopt, step1, &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 1u);
  // Some space comes back (1.5 MiB of the 2 MiB step 3 needs: the rest is what the failed save
  // gave back); the next save succeeds with nothing done by hand, and what step 2 left goes.
  struct stat fst;
  ASSERT_EQ(::stat(filler.c_str(), &fst), 0);
  ASSERT_EQ(::truncate(filler.c_str(), std::max<off_t>(0, fst.st_size - (3 << 19))), 0);
  st = SaveAllRanks(o, step3, DimLayout(2, 0), 3, 3, false);
  ASSERT_TRUE(AllOk(st)) << Describe(st);
  got = LoadWholeAndCompare(c->get(), std::nullopt, step3, &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 3u);
  EXPECT_EQ(diff, "");
  auto all = ScanCheckpoints(Env::Default(), o.directory);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].step, 3u);
}

// A partial step of a launch that has ended can never complete: a later launch collects it even
// when it is newer than the newest complete step (before, it stayed forever).
TEST_F(SafetyTest, StalePartialStepsOfEndedLaunchesAreCollected) {
  SaveStep(1, 2, "old");
  std::vector<Status> st = SaveSomeRanks(Options("old"), Tensors(9), DimLayout(2, 0), 9, 9, {0}, false);
  ASSERT_TRUE(AllOk(st)) << Describe(st);
  ASSERT_NE(Find(List(), 9), nullptr);
  SaveStep(2, 2, "new", /*keep_last=*/1);
  std::vector<CheckpointInfo> all = List();
  EXPECT_EQ(Find(all, 9), nullptr) << "a partial step of an ended launch survived";
  EXPECT_EQ(Find(all, 1), nullptr);
  ASSERT_NE(Find(all, 2), nullptr);
  EXPECT_TRUE(Find(all, 2)->complete);
  // A partial step of the saving launch itself is left alone: its other ranks may still write.
  st = SaveSomeRanks(Options("new"), Tensors(5), DimLayout(2, 0), 5, 5, {1}, false);
  ASSERT_TRUE(AllOk(st)) << Describe(st);
  ASSERT_TRUE(CollectGarbageIn(Env::Default(), dir_, SaverRetention(Env::Default(), 1, RunHash("new"))).ok());
  EXPECT_NE(Find(List(), 5), nullptr);
}

// Deliverable 2: the resume step fixed for a launch (by lifeline-agent) is what Load(latest) loads
// on every rank, whatever is newer; "none" starts fresh; the first save ends the pin.
TEST_F(SafetyTest, TheLaunchsResumeStepPinsLoadLatest) {
  ScopedLaunchEnvironment env;
  SaveStep(1, 1, "p");
  SaveStep(2, 1, "p");
  ::setenv("LIFELINE_RESUME_STEP", "1", 1);
  auto c = Checkpointer::Open(Options("p2"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::string diff;
  auto got = LoadWholeAndCompare(c->get(), std::nullopt, Tensors(1), &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 1u);
  EXPECT_EQ(diff, "");
  std::vector<RankState> r = BuildRanks(Tensors(3), WholeLayout(), true);
  ASSERT_TRUE((*c)->Save(3, RequestOf(r[0], 0, 3)).WaitCommitted(30).ok());
  got = LoadWholeAndCompare(c->get(), std::nullopt, Tensors(3), &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 3u);

  ::setenv("LIFELINE_RESUME_STEP", "none", 1);
  auto fresh = Checkpointer::Open(Options("p3"));
  ASSERT_TRUE(fresh.ok());
  Status s = LoadWholeAndCompare(fresh->get(), std::nullopt, Tensors(3), &diff).status();
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_THAT(s.ToString(), HasSubstr("starts fresh"));

  // The pin is for the directory the agent computed it from; another Checkpointer is not pinned.
  ::setenv("LIFELINE_RESUME_STEP", "1", 1);
  ::setenv("LIFELINE_RESUME_DIR", tmp_.Sub("elsewhere").c_str(), 1);
  auto other = Checkpointer::Open(Options("p5"));
  ASSERT_TRUE(other.ok());
  got = LoadWholeAndCompare(other->get(), std::nullopt, Tensors(3), &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 3u);
  ::setenv("LIFELINE_RESUME_DIR", (dir_ + "/").c_str(), 1);
  auto same = Checkpointer::Open(Options("p6"));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ((*same)->options().resume_step, "1");
  ::unsetenv("LIFELINE_RESUME_DIR");

  ::setenv("LIFELINE_RESUME_STEP", "12x", 1);
  EXPECT_EQ(Checkpointer::Open(Options("p4")).status().code(), StatusCode::kInvalidArgument);
}

// ---- Issue 32: one launch saves into a directory at a time; gc never publishes a hole --------------

// Item 4: a second job in the same directory got AlreadyExists for its last steps, lost its final
// state and exited 0. Now its first save is refused at once, naming the job that holds the
// directory, and it saves once that job has ended.
TEST_F(SafetyTest, ASecondJobInTheDirectoryIsRefusedNamingTheFirstUntilItEnds) {
  std::vector<GlobalTensor> t = Tensors(1);
  std::vector<RankState> one = BuildRanks(t, DimLayout(1, 0), true), two = BuildRanks(t, DimLayout(2, 0), true);
  auto first = Checkpointer::Open(Options("job-a"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE((*first)->Save(1, RequestOf(one[0], 0, 1)).WaitPersisted().ok());

  auto holder = DescribeSavingLaunch(dir_);
  ASSERT_TRUE(holder.ok()) << holder.status().ToString();
  ASSERT_TRUE(holder->has_value());
  EXPECT_THAT(**holder, HasSubstr("launch 'job-a' (pid " + std::to_string(::getpid())));

  for (uint32_t rank : {0u, 1u}) {  // rank 0 finds the lock taken; the others find it names job-a
    auto second = Checkpointer::Open(Options("job-b", rank, 2));
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    Status s = (*second)->Save(2, RequestOf(two[rank], rank, 1)).WaitPersisted();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_THAT(s.ToString(), HasSubstr("is being saved into by another Checkpointer of this process, launch 'job-a'"));
    EXPECT_THAT(s.ToString(), HasSubstr("rank " + std::to_string(rank)));
  }
  // Another Checkpointer of the same launch is not another job.
  auto again = Checkpointer::Open(Options("job-a"));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->Save(3, RequestOf(one[0], 0, 1)).WaitPersisted().ok());
  again->reset();
  first->reset();  // job-a ends: its lock goes with it

  EXPECT_FALSE(DescribeSavingLaunch(dir_).value_or("held").has_value());
  auto later = Checkpointer::Open(Options("job-b"));
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE((*later)->Save(4, RequestOf(one[0], 0, 1)).WaitPersisted().ok());
}

// A job killed without closing never leaves the directory locked: the kernel drops the lock of a
// dead process. A planted FIFO or hard link at the lock's name is replaced, not blocked on or
// written through.
TEST_F(SafetyTest, TheSaveLockDiesWithItsProcessAndAPlantedLockFileIsReplaced) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0755), 0);
  const std::string lock = dir_ + "/lifeline.lock";
  const std::string outside = tmp_.Sub("outside.txt");
  {
    std::FILE* f = std::fopen(outside.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("precious", f);
    std::fclose(f);
  }
  ASSERT_EQ(::link(outside.c_str(), lock.c_str()), 0);

  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the lock as a job's rank 0 would, until killed
    ::close(ready[0]);
    Result<std::unique_ptr<FileLock>> held = Env::Default()->LockFile(lock);
    if (!held.ok() || !(*held)->SetHolder("run_id=killed-job\nhost=h\npid=1\n").ok()) ::_exit(1);
    (void)!::write(ready[1], "x", 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  auto held = DescribeSavingLaunch(dir_);
  ASSERT_TRUE(held.ok() && held->has_value()) << held.status().ToString();
  EXPECT_THAT(**held, HasSubstr("launch 'killed-job'"));
  EXPECT_EQ(ReadWholeFile(outside), "precious");  // the link was replaced, its target untouched

  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(DescribeSavingLaunch(dir_).value_or("held").has_value());
  std::vector<RankState> one = BuildRanks(Tensors(1), DimLayout(1, 0), true);
  auto next = Checkpointer::Open(Options("next-job"));
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE((*next)->Save(1, RequestOf(one[0], 0, 1)).WaitPersisted().ok());

  ASSERT_EQ(::unlink(lock.c_str()), 0);
  ASSERT_EQ(::mkfifo(lock.c_str(), 0644), 0);
  next->reset();
  auto after_fifo = Checkpointer::Open(Options("fifo-job"));
  ASSERT_TRUE(after_fifo.ok());
  EXPECT_TRUE((*after_fifo)->Save(2, RequestOf(one[0], 0, 2)).WaitPersisted().ok());
  struct stat st;
  ASSERT_EQ(::lstat(lock.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

// Item 2: `gc --partial` during a live job removed files of saves in progress; one step whose data
// file went mid-save was still published complete, and retention then trusted it. Now the gc is
// refused while the job holds the directory, and a step whose data file is gone is never published.
TEST_F(SafetyTest, GcOfPartialStepsIsRefusedWhileAJobSavesAndAStepMissingADataFileIsNeverPublished) {
  SaveStep(1, 2, "old");
  std::vector<RankState> ranks = BuildRanks(Tensors(2), DimLayout(2, 0), true);
  auto r0 = Checkpointer::Open(Options("live", 0, 2));
  ASSERT_TRUE(r0.ok());
  ASSERT_TRUE((*r0)->Save(2, RequestOf(ranks[0], 0, 2)).WaitPersisted().ok());  // step 2: partial, rank 1 to come

  RetentionOptions gc;
  gc.keep_last = 1;
  gc.remove_partial = true;
  Status refused = ApplyRetention(dir_, gc);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_THAT(refused.ToString(), HasSubstr("launch 'live'"));
  ASSERT_NE(Find(List(), 2), nullptr);

  // Forced anyway, between rank 0's save and rank 1's: rank 1 completes the set, finds rank 0's
  // data file gone, and the step is marked invalid rather than published.
  const std::string step_dir = Find(List(), 2)->directory;
  ASSERT_EQ(::unlink((step_dir + "/" + DataFileName(RunHash("live"), 0, 2)).c_str()), 0);
  auto r1 = Checkpointer::Open(Options("live", 1, 2));
  ASSERT_TRUE(r1.ok());
  Status s = (*r1)->Save(2, RequestOf(ranks[1], 1, 2)).WaitPersisted();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.ToString(), HasSubstr("is missing: it was removed while the step was being saved"));
  const CheckpointInfo* two = Find(List(), 2);
  ASSERT_NE(two, nullptr);
  EXPECT_FALSE(two->complete);
  std::string diff;
  auto got = LoadWholeAndCompare(r0->get(), std::nullopt, Tensors(1), &diff);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 1u);

  gc.even_while_saving = true;  // --force
  EXPECT_TRUE(ApplyRetention(dir_, gc).ok());
}

}  // namespace safety_test
}  // namespace lifeline::testing
