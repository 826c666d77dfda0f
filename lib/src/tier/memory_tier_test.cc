// The memory tier: a directory's identity keys its snapshots (so a directory deleted and created
// again never sees the old ones), the tier is private to its user, a new attempt frees the slot
// memory of a killed one, and a snapshot in it loads with the ordinary reader. The second part
// (moved here from tests/integration/async_save_test.cc) drives whole Checkpointers: a process
// killed before its disk write finished is resumed from memory, and more.
#include "lib/src/tier/memory_tier.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lifeline/checkpoint.h"
#include "tests/integration/test_util.h"
#include "tests/integration/whole_state.h"
#include "tests/kit/test_kit.h"

namespace lifeline {
namespace memory_tier_test {

TEST(MemoryTierTest, DirectoryIdentityIsCreatedOnceAndThenRead) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ASSERT_TRUE(env->CreateDir("/ckpt").ok());
  EXPECT_TRUE(CheckpointDirectoryId(env.get(), "/ckpt", /*create=*/false).status().IsNotFound());
  Result<std::string> id = CheckpointDirectoryId(env.get(), "/ckpt", /*create=*/true);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(32u, id->size());
  EXPECT_EQ(*id, CheckpointDirectoryId(env.get(), "/ckpt", /*create=*/true).value_or(""));
  EXPECT_EQ(*id, CheckpointDirectoryId(env.get(), "/ckpt", /*create=*/false).value_or(""));
}

TEST(MemoryTierTest, MalformedIdentityIsCorruptionNamingTheFile) {
  std::unique_ptr<MemEnv> env = NewMemEnv();
  ASSERT_TRUE(env->CreateDir("/ckpt").ok());
  ASSERT_TRUE(WriteFileAtomically(env.get(), "/ckpt/lifeline.id", "not-an-id\n").ok());
  Result<std::string> id = CheckpointDirectoryId(env.get(), "/ckpt", /*create=*/true);
  ASSERT_TRUE(id.status().IsCorruption()) << id.status().ToString();
  EXPECT_NE(std::string::npos, id.status().ToString().find("/ckpt/lifeline.id")) << id.status().ToString();
}

TEST(MemoryTierTest, DefaultRootIsPerUserAndChangesWithTheDirectoryIdentity) {
  test::ScopedEnv unset(kMemoryTierDirVariable, nullptr);
  const std::string id = "0123456789abcdef0123456789abcdef";
  const std::string a = DefaultMemoryTierRoot("/nonexistent/ckpt", id).value_or("");
  const std::string b = DefaultMemoryTierRoot("/nonexistent/ckpt", "fedcba9876543210fedcba9876543210").value_or("");
  EXPECT_EQ(0u, a.rfind("/dev/shm/lifeline-" + std::to_string(::geteuid()) + "/", 0)) << a;
  EXPECT_NE(a, b) << "a directory created again under the same path would see the old snapshots";
  EXPECT_EQ(a, DefaultMemoryTierRoot("/nonexistent/ckpt", id).value_or(""));
  EXPECT_NE(a, DefaultMemoryTierRoot("/nonexistent/other", id).value_or(""));

  // LIFELINE_MEMORY_TIER_DIR moves the tier's file system; a relative path is refused by name.
  {
    test::ScopedEnv moved(kMemoryTierDirVariable, "/run/node-1/");
    EXPECT_EQ("/run/node-1/lifeline-" + std::to_string(::geteuid()) + a.substr(a.rfind('/')),
              DefaultMemoryTierRoot("/nonexistent/ckpt", id).value_or(""));
  }
  test::ScopedEnv relative(kMemoryTierDirVariable, "node-1");
  Result<std::string> bad = DefaultMemoryTierRoot("/nonexistent/ckpt", id);
  ASSERT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
  EXPECT_NE(std::string::npos, bad.status().ToString().find("LIFELINE_MEMORY_TIER_DIR='node-1'"))
      << bad.status().ToString();
}

TEST(MemoryTierTest, TierIsPrivateAndANewAttemptFreesTheSlotsOfAKilledOne) {
  test::TempDir shm("/dev/shm", "lifeline-tier-test");
  if (shm.path().empty()) GTEST_SKIP() << "no /dev/shm here";
  const std::string root = shm.Sub("tier");
  const std::string killed = RunHash("launch-1"), next = RunHash("launch-2");
  std::string killed_slot, mine;
  {
    auto tier = MemoryTier::Open(root, "/unused", "", killed, 0, 1, 2);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    killed_slot = (*tier)->SlotPath(1);
    EXPECT_EQ(0u, killed_slot.rfind(root + "/slots/" + killed + ".", 0)) << killed_slot;
    ASSERT_TRUE(test::WriteWholeFile(killed_slot, "weights of launch 1"));
  }
  struct stat st;
  ASSERT_EQ(0, ::stat(root.c_str(), &st));
  EXPECT_EQ(0700u, st.st_mode & 0777) << "snapshots are the job's weights: owner only";

  {
    auto tier = MemoryTier::Open(root, "/unused", "", next, 0, 1, 2);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    EXPECT_NE(0, ::stat(killed_slot.c_str(), &st)) << "the killed launch's slot still holds memory";
    mine = (*tier)->SlotPath(0);
    ASSERT_TRUE(test::WriteWholeFile(mine, "weights of launch 2"));
  }
  // The same attempt opening the tier again (another rank, a second Checkpointer) keeps its own.
  auto again = MemoryTier::Open(root, "/unused", "", next, 0, 1, 2);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ("weights of launch 2", test::ReadWholeFile(mine));
  (*again)->RemoveSlotFiles();
  EXPECT_NE(0, ::stat(mine.c_str(), &st));
}

TEST(MemoryTierTest, ASnapshotInTheTierLoadsWithTheOrdinaryReader) {
  test::TempDir disk;
  test::TempDir shm("/dev/shm", "lifeline-tier-test");
  if (shm.path().empty()) GTEST_SKIP() << "no /dev/shm here";
  CheckpointerOptions o;
  o.directory = disk.Sub("ckpt");
  o.run_id = "memory-tier-test";
  o.memory_tier = true;
  o.memory_tier_directory = shm.Sub("tier");
  o.staging_budget_bytes = 8 << 20;
  o.chunk_bytes = 4096;
  o.write_block_bytes = 4096;
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  std::vector<float> w(3000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  SaveRequest req;
  req.tensors.push_back(TensorShard::Whole("w", DType::kF32, {3000}, w.data()));
  ASSERT_TRUE((*ckpt)->Save(4, req).WaitPersisted().ok());

  // Laid out as a checkpoint directory: the ordinary reader opens it and loads it, checking every
  // chunk's checksum. (Its data files are whole staging slots, longer than their indexes say, so
  // the byte-exact Verify of a disk checkpoint does not apply.)
  auto reader = CheckpointReader::Open(Env::Default(), o.memory_tier_directory, std::nullopt);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(4u, (*reader)->step());
  std::vector<float> back(3000, -1.0f);
  ASSERT_TRUE((*reader)->Load({TensorShard::Whole("w", DType::kF32, {3000}, back.data())}).ok());
  EXPECT_EQ(w, back);
}

}  // namespace memory_tier_test
}  // namespace lifeline

// ---- through the Checkpointer, on real files ------------------------------------------------

namespace lifeline::testing {
namespace memory_tier_test {

CheckpointerOptions TierOptions(const TempDir& dir, const std::string& run_id) {
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.run_id = run_id;
  o.memory_tier = true;
  o.memory_tier_directory = dir.Sub("tier");
  return o;
}

// The child saves step 1 to disk, then step 5 whose disk write never finishes, and is killed
// once step 5 is in the memory tier.
void RunChildThatIsKilled(const TempDir& dir, int ready_fd) {
  GatedEnv env(Env::Default());
  CheckpointerOptions o = TierOptions(dir, "first-launch");
  auto plain = Checkpointer::Open(o);
  if (!plain.ok()) _exit(2);
  WholeState one(1);
  if (!(*plain)->Save(1, one.Request()).WaitCommitted(30).ok()) _exit(3);
  plain->reset();
  o.env = &env;
  auto ckpt = Checkpointer::Open(o);
  if (!ckpt.ok()) _exit(4);
  WholeState five(5);
  SaveTicket t = (*ckpt)->Save(5, five.Request());
  if (!t.WaitSnapshot().ok()) _exit(5);
  while (!t.Progress().memory_tier) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const char byte = 'k';
  if (write(ready_fd, &byte, 1) != 1) _exit(6);
  for (;;) pause();
}

TEST(MemoryTierTest, RestartedProcessLoadsTheSnapshotWhoseDiskWriteNeverFinished) {
  TempDir dir;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    RunChildThatIsKilled(dir, fds[1]);
  }
  close(fds[1]);
  char byte = 0;
  const ssize_t got = read(fds[0], &byte, 1);
  close(fds[0]);
  kill(child, SIGKILL);  // whatever happened: never leave it behind
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_EQ(got, 1) << "the child died before publishing its snapshot (exit " << WEXITSTATUS(wstatus) << ")";
  ASSERT_TRUE(WIFSIGNALED(wstatus));

  // The restarted job: another launch, same checkpoint directory and node.
  auto ckpt = Checkpointer::Open(TierOptions(dir, "second-launch"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  auto on_disk = (*ckpt)->LatestStep();
  ASSERT_TRUE(on_disk.ok());
  EXPECT_EQ(on_disk->value_or(0), 1u) << "step 5 never reached the disk";
  uint64_t step = 0;
  EXPECT_EQ(LoadAndCompare(ckpt->get(), std::nullopt, WholeState(5).tensors, &step), "");
  EXPECT_EQ(step, 5u);
  // Asking for the disk's step still works, from disk.
  EXPECT_EQ(LoadAndCompare(ckpt->get(), 1, WholeState(1).tensors), "");

  // A damaged memory snapshot is refused by its checksums and the disk's newest is used instead.
  auto tier = (*ckpt)->ListMemoryTier();
  ASSERT_TRUE(tier.ok());
  ASSERT_FALSE(tier->empty());
  std::string data_file;
  for (const std::string& name : ListDir(tier->front().directory))
    if (name.find(".data") != std::string::npos) data_file = tier->front().directory + "/" + name;
  ASSERT_FALSE(data_file.empty());
  std::string bytes = ReadWholeFile(data_file);
  ASSERT_GT(bytes.size(), 8192u);
  bytes[8192] ^= 0x01;
  ASSERT_TRUE(WriteWholeFile(data_file, bytes));
  EXPECT_EQ(LoadAndCompare(ckpt->get(), std::nullopt, WholeState(1).tensors, &step), "");
  EXPECT_EQ(step, 1u);
}

// Loads the first tensor of `state`'s layout from the newest complete step into *buf.
Result<LoadResult> LoadFirstTensor(Checkpointer* ckpt, const WholeState& state, std::vector<uint8_t>* buf) {
  const GlobalTensor& t = state.tensors[0];
  buf->assign(t.bytes.size(), 0);
  LoadRequest req;
  req.tensors.push_back(TensorShard::Whole(t.name, t.dtype, t.shape, buf->data()));
  return ckpt->Load(std::nullopt, req);
}

TEST(MemoryTierTest, LoadPrefersTheTierOnlyWhenItIsAtLeastAsNewAsTheDisk) {
  TempDir dir;
  auto ckpt = Checkpointer::Open(TierOptions(dir, "run"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  WholeState state(2);
  ASSERT_TRUE((*ckpt)->Save(2, state.Request()).WaitCommitted(30).ok());
  std::vector<uint8_t> buf;
  auto r = LoadFirstTensor(ckpt->get(), state, &buf);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->from_memory_tier);
  EXPECT_EQ(buf, state.tensors[0].bytes);

  // A newer step on disk only (saved by a Checkpointer of the launch without the tier) wins over
  // the tier.
  {
    CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
    o.run_id = "run";
    auto plain = Checkpointer::Open(o);
    ASSERT_TRUE(plain.ok());
    WholeState newer(3);
    ASSERT_TRUE((*plain)->Save(3, newer.Request()).WaitCommitted(30).ok());
  }
  r = LoadFirstTensor(ckpt->get(), state, &buf);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->from_memory_tier);
  EXPECT_EQ(r->step, 3u);
  EXPECT_EQ(buf, WholeState(3).tensors[0].bytes);
}

// With the default tier root (in /dev/shm), the tier belongs to the checkpoint directory itself,
// not to its path: a directory deleted and created again starts with no snapshot in memory.
TEST(MemoryTierTest, ADirectoryCreatedAgainAtTheSamePathNeverLoadsTheOldSnapshots) {
  TempDir dir;
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.run_id = "first";
  o.memory_tier = true;  // default root
  o.memory_tier_cleanup_on_close = false;
  std::string first_root;
  {
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    first_root = (*ckpt)->memory_tier_directory();
    ASSERT_EQ(first_root.rfind("/dev/shm/lifeline-", 0), 0u) << first_root;
    WholeState state(7);
    ASSERT_TRUE((*ckpt)->Save(7, state.Request()).WaitCommitted(30).ok());
  }
  ASSERT_TRUE(Env::Default()->FileExists(dir.Sub("ckpt") + "/lifeline.id"));

  // The same directory, reopened: its identity is unchanged and the tier serves step 7.
  o.run_id = "second";
  {
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    EXPECT_EQ((*ckpt)->memory_tier_directory(), first_root);
    WholeState state(7);
    std::vector<uint8_t> buf;
    auto r = LoadFirstTensor(ckpt->get(), state, &buf);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->from_memory_tier);
    EXPECT_EQ(r->step, 7u);
  }

  // rm -rf and mkdir: a new job there starts from nothing, and the old tier is gone.
  ASSERT_TRUE(Env::Default()->RemoveTree(dir.Sub("ckpt")).ok());
  o.run_id = "third";
  o.memory_tier_cleanup_on_close = true;
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_NE((*ckpt)->memory_tier_directory(), first_root);
  EXPECT_FALSE(Env::Default()->IsDirectory(first_root)) << "the deleted directory's tier was left behind";
  auto tier = (*ckpt)->ListMemoryTier();
  ASSERT_TRUE(tier.ok());
  EXPECT_TRUE(tier->empty());
  WholeState state(7);
  std::vector<uint8_t> buf;
  auto r = LoadFirstTensor(ckpt->get(), state, &buf);
  EXPECT_FALSE(r.ok()) << "loaded step " << r->step << " of the deleted directory";
  const std::string second_root = (*ckpt)->memory_tier_directory();
  ckpt->reset();
  EXPECT_FALSE(Env::Default()->IsDirectory(second_root)) << "an orderly end left an empty tier folder behind";
  Env::Default()->RemoveTree(second_root).IgnoreError();
}

// Issue 32, item 3: after `rm -rf D/step-*` (lifeline.id kept), a new job silently resumed the
// deleted steps from memory. A snapshot whose disk copy was made and then deleted is not offered
// again; one whose disk copy never finished still is (RestartedProcessLoadsTheSnapshot... above).
TEST(MemoryTierTest, StepsDeletedFromTheDiskNeverComeBackFromMemory) {
  TempDir dir;
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.run_id = "first";
  o.memory_tier = true;  // default root
  o.memory_tier_cleanup_on_close = false;
  std::string root;
  {
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    root = (*ckpt)->memory_tier_directory();
    WholeState state(7);
    ASSERT_TRUE((*ckpt)->Save(7, state.Request()).WaitCommitted(30).ok());
    ASSERT_TRUE((*ckpt)->Save(8, state.Request()).WaitCommitted(30).ok());
  }
  auto before = ScanMemoryTierOf(dir.Sub("ckpt"));
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_EQ(before->size(), 2u);
  for (const std::string& name : ListDir(dir.Sub("ckpt"))) {
    if (name.rfind("step-", 0) == 0) {
      ASSERT_TRUE(Env::Default()->RemoveTree(dir.Sub("ckpt") + "/" + name).ok());
    }
  }
  ASSERT_TRUE(Env::Default()->FileExists(dir.Sub("ckpt") + "/lifeline.id"));

  auto after = ScanMemoryTierOf(dir.Sub("ckpt"));
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_TRUE(after->empty()) << "the tier still offers step " << (*after)[0].step;
  o.run_id = "second";
  o.memory_tier_cleanup_on_close = true;
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  WholeState state(7);
  std::vector<uint8_t> buf;
  auto r = LoadFirstTensor(ckpt->get(), state, &buf);
  EXPECT_TRUE(r.status().IsNotFound()) << (r.ok() ? "resumed the deleted step " + std::to_string(r->step)
                                                   : r.status().ToString());
  // The new job's own step 7 takes the deleted one's place in memory.
  WholeState next(70);
  ASSERT_TRUE((*ckpt)->Save(7, next.Request()).WaitCommitted(30).ok());
  auto tier = (*ckpt)->ListMemoryTier();
  ASSERT_TRUE(tier.ok());
  ASSERT_EQ(tier->size(), 1u);
  EXPECT_EQ((*tier)[0].step, 7u);
  EXPECT_TRUE((*tier)[0].complete);
  ckpt->reset();
  Env::Default()->RemoveTree(root).IgnoreError();
}

// Two processes of one machine given different LIFELINE_MEMORY_TIER_DIR are two nodes: each serves
// its own snapshots from memory and never the other's.
TEST(MemoryTierTest, AVariableTierDirectoryMakesAProcessANodeOfItsOwn) {
  TempDir dir;
  test::TempDir shm("/dev/shm", "lifeline-tier-var-test");
  if (shm.path().empty()) GTEST_SKIP() << "no /dev/shm here";
  CheckpointerOptions o = BaseOptions(dir.Sub("ckpt"));
  o.memory_tier = true;  // default root, moved by the variable
  o.memory_tier_cleanup_on_close = false;
  o.run_id = "node-a";
  {
    test::ScopedEnv node_a(kMemoryTierDirVariable, shm.Sub("node-a").c_str());
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    EXPECT_EQ(0u, (*ckpt)->memory_tier_directory().rfind(shm.Sub("node-a") + "/lifeline-", 0))
        << (*ckpt)->memory_tier_directory();
    WholeState state(4);
    ASSERT_TRUE((*ckpt)->Save(4, state.Request()).WaitCommitted(30).ok());
    auto found = FindMemoryTierOf(dir.Sub("ckpt"));
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    EXPECT_EQ(*found, (*ckpt)->memory_tier_directory());
  }
  // Step 5 reaches node b's memory only: node a still loads step 5 from disk, node b from memory.
  o.run_id = "node-b";
  {
    test::ScopedEnv node_b(kMemoryTierDirVariable, shm.Sub("node-b").c_str());
    EXPECT_FALSE(FindMemoryTierOf(dir.Sub("ckpt")).ok()) << "node b sees node a's memory tier";
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    WholeState state(5);
    ASSERT_TRUE((*ckpt)->Save(5, state.Request()).WaitCommitted(30).ok());
    std::vector<uint8_t> buf;
    auto r = LoadFirstTensor(ckpt->get(), state, &buf);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->from_memory_tier);
    EXPECT_EQ(r->step, 5u);
  }
  test::ScopedEnv node_a(kMemoryTierDirVariable, shm.Sub("node-a").c_str());
  o.run_id = "node-a-again";
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  WholeState state(5);
  std::vector<uint8_t> buf;
  auto r = LoadFirstTensor(ckpt->get(), state, &buf);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->from_memory_tier) << "node a loaded node b's snapshot";
  EXPECT_EQ(r->step, 5u);
  EXPECT_EQ(buf, state.tensors[0].bytes);
}

// Ranks opening a new directory at the same moment agree on one identity.
TEST(MemoryTierTest, ConcurrentRanksAgreeOnTheDirectoryIdentity) {
  TempDir dir;
  ASSERT_TRUE(Env::Default()->CreateDir(dir.Sub("ckpt")).ok());
  std::vector<std::string> ids(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ids.size(); ++i) {
    threads.emplace_back([&, i] {
      auto id = CheckpointDirectoryId(Env::Default(), dir.Sub("ckpt"), /*create=*/true);
      ids[i] = id.ok() ? *id : id.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ids[0].size(), 32u) << ids[0];
  for (const std::string& id : ids) EXPECT_EQ(id, ids[0]);
  EXPECT_EQ(ListDir(dir.Sub("ckpt")), std::vector<std::string>{"lifeline.id"}) << "a temporary file was left behind";

  // A damaged identity is reported, naming the file.
  ASSERT_TRUE(WriteWholeFile(dir.Sub("ckpt") + "/lifeline.id", "not an id\n"));
  auto bad = CheckpointDirectoryId(Env::Default(), dir.Sub("ckpt"), /*create=*/true);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsCorruption());
  EXPECT_NE(bad.status().message().find("lifeline.id"), std::string::npos) << bad.status().ToString();
}

TEST(MemoryTierTest, PreparingStagingAfterARestartKeepsTheTierSnapshot) {
  TempDir dir;
  WholeState state(4);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto first = Checkpointer::Open(TierOptions(dir, "first"));
    if (!first.ok()) _exit(2);
    if (!(*first)->Save(6, state.Request()).WaitPersisted().ok()) _exit(3);
    _exit(0);  // no orderly close: the tier keeps step 6
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  auto again = Checkpointer::Open(TierOptions(dir, "first"));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE((*again)->PrepareStaging(state.Request()).ok());
  LoadRequest req;
  std::vector<uint8_t> buf(state.tensors[0].bytes.size());
  req.tensors.push_back(TensorShard::Whole(state.tensors[0].name, state.tensors[0].dtype, state.tensors[0].shape, buf.data()));
  auto r = (*again)->Load(std::nullopt, req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step, 6u);
  EXPECT_TRUE(r->from_memory_tier);
  EXPECT_EQ(buf, state.tensors[0].bytes);
}

TEST(MemoryTierTest, KeepsOneSnapshotPerSlotAndCleansUpOnClose) {
  TempDir dir;
  {
    CheckpointerOptions o = TierOptions(dir, "run");
    o.staging_slots = 2;
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok());
    WholeState state(1);
    for (uint64_t step = 1; step <= 5; ++step) ASSERT_TRUE((*ckpt)->Save(step, state.Request()).WaitPersisted().ok());
    auto tier = (*ckpt)->ListMemoryTier();
    ASSERT_TRUE(tier.ok());
    std::vector<uint64_t> steps;
    for (const CheckpointInfo& c : *tier) steps.push_back(c.step);
    EXPECT_EQ(steps, (std::vector<uint64_t>{5, 4}));
    EXPECT_EQ(ListDir(dir.Sub("tier/slots")).size(), 2u);
  }
  // Orderly close: everything durable on disk leaves memory.
  EXPECT_TRUE(ListDir(dir.Sub("tier/slots")).empty());
  for (const std::string& name : ListDir(dir.Sub("tier")))
    EXPECT_TRUE(name == "slots") << "left in the memory tier: " << name;
}

// Issue 51: a killed launch never withdraws its snapshots; the launch that ends the job in order
// frees them too, once their steps are on disk.
TEST(MemoryTierTest, AnOrderlyCloseAlsoFreesWhatAKilledLaunchLeft) {
  TempDir dir;
  WholeState state(1);
  auto step_dirs = [&dir] {
    std::vector<std::string> steps;
    for (const std::string& name : ListDir(dir.Sub("tier")))
      if (name != "slots") steps.push_back(name);
    return steps;
  };
  {
    CheckpointerOptions o = TierOptions(dir, "killed-launch");
    o.staging_slots = 2;
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    for (uint64_t step = 1; step <= 2; ++step) ASSERT_TRUE((*ckpt)->Save(step, state.Request()).WaitPersisted().ok());
    (*ckpt)->KeepMemoryTierOnClose();  // what a SIGKILL leaves
  }
  ASSERT_EQ(step_dirs().size(), 2u);
  {
    auto ckpt = Checkpointer::Open(TierOptions(dir, "last-launch"));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    ASSERT_TRUE((*ckpt)->Save(3, state.Request()).WaitPersisted().ok());
  }
  EXPECT_EQ(step_dirs(), std::vector<std::string>{}) << "left in the memory tier";
}

}  // namespace memory_tier_test
}  // namespace lifeline::testing
