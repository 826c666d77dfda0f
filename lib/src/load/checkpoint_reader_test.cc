// Reading checkpoints: which steps are complete, which one Open picks, loading any piece of a
// tensor, and every damaged or mismatched byte reported with the tensor and file it belongs to.
#include "lib/src/load/checkpoint_reader.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/store/checkpoint_layout.h"
#include "lifeline/checkpoint.h"

namespace lifeline {
namespace checkpoint_reader_test {

constexpr char kRunId[] = "reader-test";
constexpr int64_t kRows = 40, kCols = 50;

class CheckpointReaderTest : public ::testing::Test {
 protected:
  CheckpointReaderTest() : w_(kRows * kCols) {
    for (size_t i = 0; i < w_.size(); ++i) w_[i] = static_cast<float>(i);
  }

  // Saves step `step` as rank `rank` of `world` (each rank holds a flat part of "w").
  void Save(uint64_t step, uint32_t rank = 0, uint32_t world = 1) {
    CheckpointerOptions o;
    o.directory = "/ckpt";
    o.env = env_.get();
    o.rank = rank;
    o.world_size = world;
    o.run_id = kRunId;
    o.chunk_bytes = 1024;
    o.write_block_bytes = 4096;
    o.staging_budget_bytes = 1 << 20;
    o.direct_io = false;
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    const int64_t n = kRows * kCols, b = n * rank / world, e = n * (rank + 1) / world;
    SaveRequest req;
    req.tensors.push_back(TensorShard::Flat("w", DType::kF32, {kRows, kCols}, b, e, w_.data() + b));
    req.objects.emplace_back("rng", "rng-state-of-rank-" + std::to_string(rank));
    Status s = (*ckpt)->Save(step, req).WaitPersisted();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  std::string DataFile(uint64_t step) const {
    return JoinPath(JoinPath("/ckpt", StepDirName(step)), DataFileName(RunHash(kRunId), 0, 1));
  }

  void FlipByte(const std::string& path, uint64_t offset) {
    Result<std::string> bytes = ReadFileToString(env_.get(), path, 1 << 24);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    ASSERT_LT(offset, bytes->size());
    (*bytes)[offset] ^= 0x01;
    ASSERT_TRUE(WriteFileAtomically(env_.get(), path, *bytes).ok());
  }

  // Loads the whole of "w" into `whole`, first filled with -1 so that nothing stale passes.
  static Result<LoadStats> LoadWhole(CheckpointReader* reader, std::vector<float>* whole) {
    whole->assign(kRows * kCols, -1.0f);
    return reader->Load({TensorShard::Whole("w", DType::kF32, {kRows, kCols}, whole->data())});
  }

  std::unique_ptr<MemEnv> env_ = NewMemEnv();
  std::vector<float> w_;
};

TEST_F(CheckpointReaderTest, ScanListsStepsNewestFirstAndSaysWhatAPartialOneLacks) {
  Save(1);
  Save(2);
  Save(3, /*rank=*/0, /*world=*/2);  // rank 1 never saves step 3
  auto steps = ScanCheckpoints(env_.get(), "/ckpt");
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  ASSERT_EQ(3u, steps->size());
  EXPECT_EQ(3u, (*steps)[0].step);
  EXPECT_FALSE((*steps)[0].complete);
  EXPECT_EQ(1u, (*steps)[0].ranks_present);
  EXPECT_FALSE((*steps)[0].problem.empty());
  EXPECT_EQ(2u, (*steps)[1].step);
  EXPECT_TRUE((*steps)[1].complete) << (*steps)[1].problem;
  EXPECT_EQ(1u, (*steps)[1].world_size);
  EXPECT_EQ(1u, (*steps)[2].step);
}

TEST_F(CheckpointReaderTest, OpenPicksTheNewestCompleteStepAndRefusesAPartialOne) {
  Save(1);
  Save(2);
  Save(3, 0, 2);
  auto newest = CheckpointReader::Open(env_.get(), "/ckpt", std::nullopt);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(2u, (*newest)->step());
  auto partial = CheckpointReader::Open(env_.get(), "/ckpt", 3);
  EXPECT_TRUE(partial.status().IsNotFound()) << partial.status().ToString();
  auto missing = CheckpointReader::Open(env_.get(), "/ckpt", 9);
  EXPECT_TRUE(missing.status().IsNotFound()) << missing.status().ToString();
}

TEST_F(CheckpointReaderTest, PiecesSavedByTwoRanksLoadIntoAnyBox) {
  Save(1, 0, 2);
  Save(1, 1, 2);
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  // Rows 10-29, columns 5-14: crosses the ranks' boundary and many chunks.
  std::vector<float> box(20 * 10, -1.0f);
  auto stats = (*reader)->Load({TensorShard::Box("w", DType::kF32, {kRows, kCols}, {10, 5}, {20, 10}, box.data())});
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  for (int64_t r = 0; r < 20; ++r)
    for (int64_t c = 0; c < 10; ++c) ASSERT_EQ(w_[(r + 10) * kCols + c + 5], box[r * 10 + c]) << r << "," << c;
  EXPECT_GT(stats->chunks_read, 0u);
  VerifyReport report;
  Status verified = (*reader)->Verify(&report);
  EXPECT_TRUE(verified.ok()) << verified.ToString();
  EXPECT_EQ(3u, report.indexes_checked);  // two rank indexes and the manifest
  EXPECT_EQ(2u, report.objects_checked);
}

TEST_F(CheckpointReaderTest, ObjectsReadBackVerified) {
  Save(1);
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_EQ(1u, (*reader)->manifest().objects.size());
  auto rng = (*reader)->ReadObject((*reader)->manifest().objects[0]);
  ASSERT_TRUE(rng.ok()) << rng.status().ToString();
  EXPECT_EQ("rng-state-of-rank-0", *rng);
}

TEST_F(CheckpointReaderTest, TargetsThatDoNotMatchTheCheckpointAreRefusedNamingTheTensor) {
  Save(1);
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> buf(kRows * kCols);
  auto absent = (*reader)->Load({TensorShard::Whole("bias", DType::kF32, {kRows, kCols}, buf.data())});
  EXPECT_TRUE(absent.status().IsNotInCheckpoint()) << absent.status().ToString();
  EXPECT_NE(std::string::npos, absent.status().ToString().find("bias")) << absent.status().ToString();
  auto dtype = (*reader)->Load({TensorShard::Whole("w", DType::kI32, {kRows, kCols}, buf.data())});
  EXPECT_EQ(StatusCode::kInvalidArgument, dtype.status().code()) << dtype.status().ToString();
  auto shape = (*reader)->Load({TensorShard::Whole("w", DType::kF32, {kCols, kRows}, buf.data())});
  EXPECT_EQ(StatusCode::kInvalidArgument, shape.status().code()) << shape.status().ToString();
}

TEST_F(CheckpointReaderTest, AFlippedDataByteIsCorruptionNamingTensorAndFile) {
  Save(1);
  FlipByte(DataFile(1), kDataHeaderBytes + 100);  // inside the first chunk of "w"
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << "the indexes are intact: " << reader.status().ToString();
  std::vector<float> buf(kRows * kCols);
  auto loaded = (*reader)->Load({TensorShard::Whole("w", DType::kF32, {kRows, kCols}, buf.data())});
  ASSERT_TRUE(loaded.status().IsCorruption()) << loaded.status().ToString();
  EXPECT_NE(std::string::npos, loaded.status().ToString().find("tensor 'w'")) << loaded.status().ToString();
  EXPECT_NE(std::string::npos, loaded.status().ToString().find(DataFile(1))) << loaded.status().ToString();
  EXPECT_NE(std::string::npos, loaded.status().ToString().find("offset 4096")) << loaded.status().ToString();
  Status verified = (*reader)->Verify(nullptr);
  EXPECT_TRUE(verified.IsCorruption()) << verified.ToString();

  // A piece that avoids the damaged chunk still loads: only intersecting chunks are read.
  std::vector<float> tail(kCols);
  auto last_row = (*reader)->Load({TensorShard::Box("w", DType::kF32, {kRows, kCols}, {kRows - 1, 0}, {1, kCols}, tail.data())});
  ASSERT_TRUE(last_row.ok()) << last_row.status().ToString();
  EXPECT_EQ(w_[(kRows - 1) * kCols], tail[0]);
}

// A chunk that lands whole in one target is copied and checksummed in one pass; one split
// between targets is checksummed, then scattered. Either way a flipped byte fails the load.
TEST_F(CheckpointReaderTest, EveryChunkIsVerifiedWhetherCopiedWholeOrScattered) {
  Save(1);
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> whole;
  auto loaded = LoadWhole(reader->get(), &whole);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(w_, whole);
  EXPECT_EQ(8u, loaded->chunks_read);  // 8000 bytes in chunks of 1024
  EXPECT_EQ(static_cast<uint64_t>(kRows * kCols * 4), loaded->bytes_scattered);

  // The last chunk (832 bytes) goes whole into `whole`.
  FlipByte(DataFile(1), kDataHeaderBytes + 7 * 1024 + 10);
  reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  loaded = LoadWhole(reader->get(), &whole);
  ASSERT_TRUE(loaded.status().IsCorruption()) << loaded.status().ToString();
  EXPECT_NE(std::string::npos, loaded.status().ToString().find("chunk 7 of fragment 0")) << loaded.status().ToString();

  // Chunk 3 (bytes 3072-4095, elements 768-1023) holds the end of row 19 and the start of row 20:
  // with the rows split between two targets it is scattered.
  FlipByte(DataFile(1), kDataHeaderBytes + 7 * 1024 + 10);  // repaired
  FlipByte(DataFile(1), kDataHeaderBytes + 3 * 1024 + 1000);
  reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> top(20 * kCols), bottom(20 * kCols);
  loaded = (*reader)->Load({TensorShard::Box("w", DType::kF32, {kRows, kCols}, {0, 0}, {20, kCols}, top.data()),
                            TensorShard::Box("w", DType::kF32, {kRows, kCols}, {20, 0}, {20, kCols}, bottom.data())});
  ASSERT_TRUE(loaded.status().IsCorruption()) << loaded.status().ToString();
  EXPECT_NE(std::string::npos, loaded.status().ToString().find("chunk 3 of fragment 0")) << loaded.status().ToString();
}

// Chunks of 1024 bytes lie back to back, most of them across 4096-byte blocks: they are read in
// one go, so no block is read twice and the load takes no more than the file's data blocks.
TEST_F(CheckpointReaderTest, AdjacentSmallChunksAreReadOnceInOneGo) {
  Save(1);
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> whole;
  auto loaded = LoadWhole(reader->get(), &whole);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(w_, whole);
  EXPECT_EQ(8u, loaded->chunks_read);
  // 8000 bytes from offset 4096: blocks 4096-12287, read once (one read per chunk would be 32 KiB).
  EXPECT_EQ(8192u, loaded->bytes_read);

  // The same holds for a piece that needs a run of chunks out of the middle: rows 10-29 are
  // elements 500-1499, bytes 2000-5999 of "w", chunks 1-5.
  std::vector<float> rows(20 * kCols, -1.0f);
  loaded = (*reader)->Load({TensorShard::Box("w", DType::kF32, {kRows, kCols}, {10, 0}, {20, kCols}, rows.data())});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  for (int64_t i = 0; i < 20 * kCols; ++i) ASSERT_EQ(w_[10 * kCols + i], rows[i]) << i;
  EXPECT_EQ(5u, loaded->chunks_read);
  EXPECT_EQ(8192u, loaded->bytes_read);  // bytes 5120-10239 of the file
}

// A chunk in the middle of a merged read is still checked on its own: the error names it, its
// tensor, file and offset, and a piece that avoids it loads.
TEST_F(CheckpointReaderTest, ADamagedChunkInsideAMergedReadIsNamed) {
  Save(1);
  FlipByte(DataFile(1), kDataHeaderBytes + 4 * 1024 + 7);  // chunk 4 of 8
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> whole;
  auto loaded = LoadWhole(reader->get(), &whole);
  ASSERT_TRUE(loaded.status().IsCorruption()) << loaded.status().ToString();
  const std::string message = loaded.status().ToString();
  EXPECT_NE(std::string::npos, message.find("chunk 4 of fragment 0")) << message;
  EXPECT_NE(std::string::npos, message.find("tensor 'w'")) << message;
  EXPECT_NE(std::string::npos, message.find(DataFile(1))) << message;
  EXPECT_NE(std::string::npos, message.find("offset " + std::to_string(kDataHeaderBytes + 4 * 1024))) << message;
  // Rows 0-19 are bytes 0-3999: chunks 0-3, in the same 4096-byte blocks as chunk 4 but not it.
  std::vector<float> top(20 * kCols);
  auto first_rows = (*reader)->Load({TensorShard::Box("w", DType::kF32, {kRows, kCols}, {0, 0}, {20, kCols}, top.data())});
  ASSERT_TRUE(first_rows.ok()) << first_rows.status().ToString();
  for (int64_t i = 0; i < 20 * kCols; ++i) ASSERT_EQ(w_[i], top[i]) << i;
}

// Two ranks' files, loaded into four column blocks and an odd box: every element right, and no
// byte of either file read twice.
TEST_F(CheckpointReaderTest, ALoadIntoAnotherLayoutIsElementExactAndReadsEachBlockOnce) {
  Save(1, 0, 2);
  Save(1, 1, 2);
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<std::vector<float>> blocks(4, std::vector<float>(kRows * 13, -1.0f));
  std::vector<TensorShard> targets;
  const int64_t starts[] = {0, 13, 26, 39}, widths[] = {13, 13, 13, 11};
  for (int b = 0; b < 4; ++b)
    targets.push_back(TensorShard::Box("w", DType::kF32, {kRows, kCols}, {0, starts[b]}, {kRows, widths[b]},
                                       blocks[b].data()));
  std::vector<float> odd(7 * 9, -1.0f);
  targets.push_back(TensorShard::Box("w", DType::kF32, {kRows, kCols}, {17, 3}, {7, 9}, odd.data()));
  auto loaded = (*reader)->Load(targets);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  for (int b = 0; b < 4; ++b)
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < widths[b]; ++c)
        ASSERT_EQ(w_[r * kCols + starts[b] + c], blocks[b][r * widths[b] + c]) << b << ": " << r << "," << c;
  for (int64_t r = 0; r < 7; ++r)
    for (int64_t c = 0; c < 9; ++c) ASSERT_EQ(w_[(r + 17) * kCols + c + 3], odd[r * 9 + c]) << r << "," << c;
  // Each rank's 4000 bytes (and its object after them) lie in one 4096-byte block.
  EXPECT_EQ(2u * 4096u, loaded->bytes_read);
}

// The objects stored after a rank's chunks come in with the load's reads; ReadObject hands them
// out verified, and damage to one fails ReadObject, not the load.
TEST_F(CheckpointReaderTest, ObjectsNextToTheChunksComeWithTheLoadAndAreStillVerified) {
  Save(1);
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_EQ(1u, (*reader)->manifest().objects.size());
  const format::ObjectInfo object = (*reader)->manifest().objects[0];
  std::vector<float> whole;
  auto loaded = LoadWhole(reader->get(), &whole);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(8192u, loaded->bytes_read);  // the object shares the last block of the chunks
  for (int i = 0; i < 2; ++i) {  // handed out once, then read again
    auto rng = (*reader)->ReadObject((*reader)->manifest().objects[0]);
    ASSERT_TRUE(rng.ok()) << rng.status().ToString();
    EXPECT_EQ("rng-state-of-rank-0", *rng);
  }

  FlipByte(DataFile(1), object.offset + 3);
  reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  loaded = LoadWhole(reader->get(), &whole);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(w_, whole);
  auto rng = (*reader)->ReadObject((*reader)->manifest().objects[0]);
  ASSERT_TRUE(rng.status().IsCorruption()) << rng.status().ToString();
  EXPECT_NE(std::string::npos, rng.status().ToString().find("object 'rng'")) << rng.status().ToString();
}

// A budget smaller than one read still loads: one read at a time.
TEST_F(CheckpointReaderTest, ATinyMemoryBudgetStillLoadsEverything) {
  Save(1, 0, 2);
  Save(1, 1, 2);
  ReaderOptions options;
  options.memory_budget = 1024;
  options.queue_depth = 1;
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1, options);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> whole;
  auto loaded = LoadWhole(reader->get(), &whole);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(w_, whole);
  Status verified = (*reader)->Verify(nullptr);
  EXPECT_TRUE(verified.ok()) << verified.ToString();
}

// A job of 4 ranks saving 600 small tensors, each rank a flat quarter of each: a manifest of 2,400
// fragments, of which a load of two tensors needs eight.
class ManifestInPartsTest : public CheckpointReaderTest {
 protected:
  static constexpr int kTensors = 600, kWorld = 4, kElements = 64;
  static std::string Name(int t) { return "layers." + std::to_string(t) + ".weight"; }
  static float Value(int t, int64_t i) { return static_cast<float>(t * 1000 + i); }

  void SaveAll(uint64_t step) {
    std::vector<float> values(kElements);
    for (uint32_t rank = 0; rank < kWorld; ++rank) {
      CheckpointerOptions o;
      o.directory = "/ckpt";
      o.env = env_.get();
      o.rank = rank;
      o.world_size = kWorld;
      o.run_id = kRunId;
      o.direct_io = false;
      auto ckpt = Checkpointer::Open(o);
      ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
      std::vector<std::vector<float>> data(kTensors, std::vector<float>(kElements));
      SaveRequest req;
      const int64_t b = kElements * rank / kWorld, e = kElements * (rank + 1) / kWorld;
      for (int t = 0; t < kTensors; ++t) {
        for (int64_t i = 0; i < kElements; ++i) data[t][i] = Value(t, i);
        req.tensors.push_back(TensorShard::Flat(Name(t), DType::kF32, {kElements}, b, e, data[t].data() + b));
      }
      Status s = (*ckpt)->Save(step, req).WaitPersisted();
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }

  std::string ManifestPath(uint64_t step) const {
    return JoinPath(JoinPath("/ckpt", StepDirName(step)), ManifestFileName(RunHash(kRunId), kWorld));
  }

  // Loads tensors `which` whole and checks every element.
  void LoadAndCheck(CheckpointReader* reader, const std::vector<int>& which) {
    std::vector<std::vector<float>> out(which.size(), std::vector<float>(kElements, -1.0f));
    std::vector<TensorShard> targets;
    for (size_t k = 0; k < which.size(); ++k)
      targets.push_back(TensorShard::Whole(Name(which[k]), DType::kF32, {kElements}, out[k].data()));
    auto stats = reader->Load(targets);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    for (size_t k = 0; k < which.size(); ++k)
      for (int64_t i = 0; i < kElements; ++i) ASSERT_EQ(out[k][i], Value(which[k], i)) << Name(which[k]) << "[" << i << "]";
  }
};

TEST_F(ManifestInPartsTest, ALoadReadsTheManifestsHeadAndItsOwnTensorsFragmentsOnly) {
  SaveAll(7);
  auto size = env_->GetFileSize(ManifestPath(7));
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  ReaderOptions options;
  options.manifest_in_parts = true;
  options.direct_io = false;
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 7, options);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->manifest().tensors.size(), size_t{kTensors});
  EXPECT_TRUE((*reader)->manifest().fragments.empty());
  LoadAndCheck(reader->get(), {3, 411});
  EXPECT_EQ((*reader)->manifest().fragments.size(), 2u * kWorld);
  // The head (names, tensor records, shapes) and 16 KiB blocks of two tensors' fragment, chunk
  // and dims records: less than half of this small manifest (1.7% of a 1,024-rank one: bench plan).
  const uint64_t first = (*reader)->manifest_bytes_read();
  EXPECT_LT(first, *size / 2) << "of " << *size;
  LoadAndCheck(reader->get(), {3, 4});  // one more tensor's fragments, none twice
  EXPECT_EQ((*reader)->manifest().fragments.size(), 3u * kWorld);
  EXPECT_LE((*reader)->manifest_bytes_read() - first, 3u * (16 << 10));
  VerifyReport report;
  Status verified = (*reader)->Verify(&report);  // reads the rest
  EXPECT_TRUE(verified.ok()) << verified.ToString();
  EXPECT_EQ((*reader)->manifest().fragments.size(), size_t{kTensors} * kWorld);
}

TEST_F(ManifestInPartsTest, ADamagedPartOfTheManifestFallsBackToTheRankIndexes) {
  SaveAll(7);
  // The fragment records of tensor 500 lie past the middle of the fragments section, which starts
  // after the header, files and tensors; a byte in the middle of the file belongs to them or to
  // the chunks of tensors loaded later, never to the head.
  auto bytes = ReadFileToString(env_.get(), ManifestPath(7), 1 << 24);
  ASSERT_TRUE(bytes.ok());
  const uint64_t header = 240, files = kWorld * 24, tensors = kTensors * 24;
  FlipByte(ManifestPath(7), header + files + tensors + (500 * kWorld + 1) * 64 + 32);
  ReaderOptions options;
  options.manifest_in_parts = true;
  options.direct_io = false;
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 7, options);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  LoadAndCheck(reader->get(), {3});
  EXPECT_GT((*reader)->manifest_bytes_read(), 0u);
  LoadAndCheck(reader->get(), {500});  // the damaged block: merged from the rank indexes instead
  EXPECT_EQ((*reader)->manifest_bytes_read(), 0u);
  EXPECT_EQ((*reader)->manifest().fragments.size(), size_t{kTensors} * kWorld);
  Status verified = (*reader)->Verify(nullptr);  // verification does not accept a damaged manifest
  EXPECT_TRUE(verified.IsCorruption()) << verified.ToString();
  EXPECT_NE(verified.message().find(".manifest"), std::string::npos) << verified.ToString();
}

TEST_F(CheckpointReaderTest, ADamagedDataHeaderIsFoundByVerify) {
  Save(1);
  FlipByte(DataFile(1), 200);  // in the zero padding of the 4096-byte header
  auto reader = CheckpointReader::Open(env_.get(), "/ckpt", 1);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Status verified = (*reader)->Verify(nullptr);
  EXPECT_TRUE(verified.IsCorruption()) << verified.ToString();
  EXPECT_NE(std::string::npos, verified.ToString().find(DataFileName(RunHash(kRunId), 0, 1))) << verified.ToString();
}

}  // namespace checkpoint_reader_test
}  // namespace lifeline
