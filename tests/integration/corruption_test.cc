// Damaged and hostile checkpoints: a flipped data byte is caught by its chunk checksum and named
// (tensor, file, offset); a newest checkpoint that cannot be read makes Load fall back to the one
// before; index and manifest files crafted to break the reader (truncated, wrong magic, garbage,
// absurd counts, file names that point outside the checkpoint) give a clear error, never a crash,
// and nothing outside the checkpoint directory is ever opened, created or changed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "formats/index_codec.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {
namespace corruption_test {

constexpr char kRunId[] = "corruption-test";

std::vector<GlobalTensor> Tensors(uint64_t salt) {
  return {MakeTensor("w", DType::kF32, {64, 100}, salt), MakeTensor("b", DType::kBF16, {100}, salt),
          MakeTensor("count", DType::kI64, {}, salt)};
}

// Records every path the library touches, so a test can prove it never left the checkpoint.
class PathRecordingEnv : public EnvWrapper {
 public:
  explicit PathRecordingEnv(Env* target) : EnvWrapper(target) {}

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p, const FileOptions& o) override {
    Note(p);
    return EnvWrapper::NewWritableFile(p, o);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p, const FileOptions& o) override {
    Note(p);
    return EnvWrapper::NewRandomAccessFile(p, o);
  }
  Status CreateDir(const std::string& p) override { return Note(p), EnvWrapper::CreateDir(p); }
  Status RemoveFile(const std::string& p) override { return Note(p), EnvWrapper::RemoveFile(p); }
  Status RemoveDir(const std::string& p) override { return Note(p), EnvWrapper::RemoveDir(p); }
  Status RenameFile(const std::string& a, const std::string& b) override {
    Note(a);
    Note(b);
    return EnvWrapper::RenameFile(a, b);
  }
  Result<std::vector<std::string>> GetChildren(const std::string& p) override {
    Note(p);
    return EnvWrapper::GetChildren(p);
  }
  bool FileExists(const std::string& p) override { return Note(p), EnvWrapper::FileExists(p); }
  bool IsDirectory(const std::string& p) override { return Note(p), EnvWrapper::IsDirectory(p); }
  Result<uint64_t> GetFileSize(const std::string& p) override {
    Note(p);
    return EnvWrapper::GetFileSize(p);
  }
  Status SyncDir(const std::string& p) override { return Note(p), EnvWrapper::SyncDir(p); }

  std::set<std::string> paths() {
    std::lock_guard<std::mutex> lock(mu_);
    return paths_;
  }

 private:
  void Note(const std::string& p) {
    std::lock_guard<std::mutex> lock(mu_);
    paths_.insert(p);
  }
  std::mutex mu_;
  std::set<std::string> paths_;
};

// Little-endian field access in encoded indexes (formats/SPEC.md, "Index file").
void PutU64(std::string* b, size_t at, uint64_t v) { std::memcpy(b->data() + at, &v, 8); }
void PutU32(std::string* b, size_t at, uint32_t v) { std::memcpy(b->data() + at, &v, 4); }

constexpr size_t kHeaderChecksumAt = 200;  // version 1: the header's last 8 bytes
constexpr size_t kTrailerBytes = 16;

// Re-seals an edited encoding so that only the semantic checks can object.
void FixHeaderChecksum(std::string* b) { PutU64(b, kHeaderChecksumAt, format::Checksum64(b->data(), kHeaderChecksumAt)); }
void FixBodyChecksum(std::string* b) {
  const size_t body_end = b->size() - kTrailerBytes;
  PutU64(b, body_end, format::Checksum64(b->data(), body_end));
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    dir_ = tmp_.Sub("ckpt");
    sentinel_ = tmp_.Sub("sentinel");
    ASSERT_EQ(::mkdir(sentinel_.c_str(), 0755), 0);
    ASSERT_TRUE(WriteWholeFile(sentinel_ + "/precious", "do not touch"));
    for (uint64_t step : {1, 2}) {
      std::vector<Status> st = SaveAllRanks(Options(), Tensors(step), DimLayout(2, 0), step, step, false);
      ASSERT_TRUE(AllOk(st)) << Describe(st);
    }
  }

  CheckpointerOptions Options(Env* env = nullptr) const {
    CheckpointerOptions o;
    o.directory = dir_;
    o.env = env;
    o.run_id = kRunId;
    o.chunk_bytes = 4096;
    o.write_block_bytes = 8192;
    return o;
  }

  std::string StepDir(uint64_t step) const { return dir_ + "/" + StepDirName(step); }
  std::string Hash() const { return RunHash(kRunId); }
  std::string DataPath(uint64_t step, uint32_t rank, uint32_t world) const {
    return StepDir(step) + "/" + DataFileName(Hash(), rank, world);
  }
  std::string IndexPath(uint64_t step, uint32_t rank, uint32_t world) const {
    return StepDir(step) + "/" + IndexFileName(Hash(), rank, world);
  }
  std::string ManifestPath(uint64_t step, uint32_t world) const {
    return StepDir(step) + "/" + ManifestFileName(Hash(), world);
  }

  // Loads everything whole from `step` (or the newest) and compares with that step's contents.
  Result<uint64_t> LoadAll(std::optional<uint64_t> step, uint64_t expect_salt, std::string* diff, Env* env = nullptr) {
    auto c = Checkpointer::Open(Options(env));
    if (!c.ok()) return c.status();
    return LoadWholeAndCompare(c->get(), step, Tensors(expect_salt), diff);
  }

  void ExpectFallsBackTo(uint64_t step) {
    std::string diff;
    auto r = LoadAll(std::nullopt, step, &diff);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, step);
    EXPECT_EQ(diff, "");
  }

  void FlipByte(const std::string& path, uint64_t offset) {
    std::string bytes = ReadWholeFile(path);
    ASSERT_LT(offset, bytes.size());
    bytes[offset] ^= 0x5A;
    ASSERT_TRUE(WriteWholeFile(path, bytes));
  }

  // Everything outside the checkpoint directory, to prove it unchanged.
  std::map<std::string, std::pair<uint64_t, uint64_t>> Outside() {
    auto all = SnapshotTree(tmp_.path());
    for (auto it = all.begin(); it != all.end();) it = it->first.rfind("ckpt/", 0) == 0 ? all.erase(it) : std::next(it);
    return all;
  }

  TempDir tmp_;
  std::string dir_;
  std::string sentinel_;
};

TEST_F(CorruptionTest, FlippedDataByteIsNamedAndLoadFallsBack) {
  auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const format::CheckpointIndex m = (*reader)->manifest();
  // Chunk 2 of rank 1's fragment of "w".
  const format::FragmentInfo* frag = nullptr;
  for (const format::FragmentInfo& f : m.fragments)
    if (m.tensors[f.tensor].name == "w" && m.files[f.file].rank == 1) frag = &f;
  ASSERT_NE(frag, nullptr);
  ASSERT_GE(frag->num_chunks, 3u);
  uint64_t chunk_offset = frag->offset;
  for (uint64_t k = 0; k < 2; ++k) chunk_offset += m.chunks[frag->first_chunk + k].stored_length;
  const std::string data_path = DataPath(2, 1, 2);
  ASSERT_EQ(m.files[frag->file].name, DataFileName(Hash(), 1, 2));
  FlipByte(data_path, chunk_offset + 123);

  std::string diff;
  auto r = LoadAll(2, 2, &diff);
  ASSERT_FALSE(r.ok()) << "a damaged chunk was loaded";
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(data_path), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(chunk_offset)), std::string::npos) << msg;

  Status v = (*reader)->Verify(nullptr);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(v.IsCorruption()) << v.ToString();
  EXPECT_NE(v.message().find("'w'"), std::string::npos) << v.ToString();
  EXPECT_NE(v.message().find(data_path), std::string::npos) << v.ToString();
  EXPECT_NE(v.message().find("offset " + std::to_string(chunk_offset)), std::string::npos) << v.ToString();

  ExpectFallsBackTo(1);

  // Loading only what rank 0 wrote never reads the bad chunk, so it still works.
  auto c = Checkpointer::Open(Options());
  ASSERT_TRUE(c.ok());
  std::vector<GlobalTensor> expected = Tensors(2);
  std::vector<RankState> ranks = BuildRanks(expected, DimLayout(2, 0), false);
  LoadRequest req;
  req.tensors = ranks[0].shards;
  auto part = (*c)->Load(2, req);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  for (size_t k = 0; k < ranks[0].buffers.size(); ++k)
    EXPECT_EQ(CompareRegion(expected[ranks[0].where[k].first], ranks[0].where[k].second, ranks[0].buffers[k]), "");
}

TEST_F(CorruptionTest, FlippedObjectByteIsNamed) {
  auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
  ASSERT_TRUE(reader.ok());
  const format::CheckpointIndex m = (*reader)->manifest();
  const format::ObjectInfo* obj = nullptr;
  for (const format::ObjectInfo& o : m.objects)
    if (o.rank == 1 && o.name == "rng") obj = &o;
  ASSERT_NE(obj, nullptr);
  FlipByte(DataPath(2, 1, 2), obj->offset + 2);
  Status v = (*reader)->Verify(nullptr);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(v.IsCorruption());
  EXPECT_NE(v.message().find("'rng'"), std::string::npos) << v.ToString();
  EXPECT_NE(v.message().find(DataPath(2, 1, 2)), std::string::npos) << v.ToString();

  CheckpointerOptions o = Options();
  o.rank = 1;
  o.world_size = 2;
  auto c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok());
  auto r = (*c)->Load(2, LoadRequest{});
  ASSERT_FALSE(r.ok()) << "a damaged object was returned";
  EXPECT_TRUE(r.status().IsCorruption());
  EXPECT_NE(r.status().message().find("'rng'"), std::string::npos) << r.status().ToString();
  // Rank 0's objects are intact.
  LoadRequest of0;
  of0.objects_of_rank = 0;
  EXPECT_TRUE((*c)->Load(2, of0).ok());
}

TEST_F(CorruptionTest, DamagedDataHeaderFailsVerify) {
  FlipByte(DataPath(2, 0, 2), 12);  // the rank field
  auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
  ASSERT_TRUE(reader.ok());
  Status v = (*reader)->Verify(nullptr);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(v.IsCorruption()) << v.ToString();
  EXPECT_NE(v.message().find(DataPath(2, 0, 2)), std::string::npos) << v.ToString();
}

TEST_F(CorruptionTest, TruncatedOrMissingDataFileFallsBack) {
  const std::string path = DataPath(2, 1, 2);
  const std::string bytes = ReadWholeFile(path);
  ASSERT_TRUE(WriteWholeFile(path, bytes.substr(0, bytes.size() / 2 + 100)));
  std::string diff;
  auto r = LoadAll(2, 2, &diff);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  ExpectFallsBackTo(1);

  ASSERT_EQ(::unlink(path.c_str()), 0);
  r = LoadAll(2, 2, &diff);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotFound() || r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  ExpectFallsBackTo(1);
}

// ---- every byte is covered: indexes, headers, sizes, padding --------------------------------

// Byte offsets spread over a file of `size` bytes, first and last included.
std::vector<uint64_t> SpreadOffsets(uint64_t size, int n) {
  std::vector<uint64_t> v;
  for (int i = 0; i < n; ++i) v.push_back(size <= 1 ? 0 : (size - 1) * static_cast<uint64_t>(i) / (n - 1));
  return v;
}

TEST_F(CorruptionTest, FlipInAnyRankIndexFailsVerifyEvenWithAManifest) {
  // The manifest lets Open skip the rank indexes; verify must still read every one of them.
  ASSERT_TRUE(::access(ManifestPath(2, 2).c_str(), F_OK) == 0);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    const std::string path = IndexPath(2, rank, 2);
    const std::string valid = ReadWholeFile(path);
    for (uint64_t offset : SpreadOffsets(valid.size(), 20)) {
      SCOPED_TRACE(path + " byte " + std::to_string(offset));
      FlipByte(path, offset);
      auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
      ASSERT_TRUE(reader.ok()) << reader.status().ToString();
      Status v = (*reader)->Verify(nullptr);
      EXPECT_FALSE(v.ok()) << "verify missed a flipped byte in a rank index";
      EXPECT_NE(v.message().find(path), std::string::npos) << v.ToString();
      ASSERT_TRUE(WriteWholeFile(path, valid));
    }
  }
  auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
  ASSERT_TRUE(reader.ok());
  VerifyReport report;
  Status v = (*reader)->Verify(&report);
  EXPECT_TRUE(v.ok()) << v.ToString();
  EXPECT_EQ(report.indexes_checked, 3u);  // two rank indexes and the manifest
}

TEST_F(CorruptionTest, FlipAnywhereInADataHeaderFailsVerify) {
  const std::string path = DataPath(2, 1, 2);
  const std::string valid = ReadWholeFile(path);
  for (uint64_t offset : {0, 7, 8, 12, 16, 20, 24, 32, 40, 47, 48, 49, 100, 1000, 2048, 4000, 4095}) {
    SCOPED_TRACE("byte " + std::to_string(offset));
    FlipByte(path, offset);
    auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    Status v = (*reader)->Verify(nullptr);
    EXPECT_TRUE(v.IsCorruption()) << "verify missed a flipped header byte: " << v.ToString();
    EXPECT_NE(v.message().find(path), std::string::npos) << v.ToString();
    ASSERT_TRUE(WriteWholeFile(path, valid));
  }
}

TEST_F(CorruptionTest, DamagedManifestFailsVerifyWhileLoadUsesTheRankIndexes) {
  const std::string path = ManifestPath(2, 2);
  const std::string valid = ReadWholeFile(path);
  FlipByte(path, valid.size() / 2);
  // Load: the rank indexes are the commit record, so the checkpoint still loads, correctly.
  std::string diff;
  auto r = LoadAll(std::nullopt, 2, &diff);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 2u);
  EXPECT_EQ(diff, "");
  // Verify: the manifest is damaged, and it says so.
  auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Status v = (*reader)->Verify(nullptr);
  EXPECT_TRUE(v.IsCorruption()) << v.ToString();
  EXPECT_NE(v.message().find(path), std::string::npos) << v.ToString();

  // A manifest that decodes but says something the rank indexes do not: a chunk checksum (the
  // data still matches the indexes), then the user metadata.
  auto manifest = format::DecodeIndex(valid, path);
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  for (int edit = 0; edit < 2; ++edit) {
    SCOPED_TRACE(edit);
    format::CheckpointIndex m = *manifest;
    if (edit == 0) m.chunks[3].checksum ^= 1;
    if (edit == 1) m.metadata_json += " ";
    auto encoded = format::EncodeIndex(m);
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    ASSERT_TRUE(WriteWholeFile(path, *encoded));
    reader = CheckpointReader::Open(Env::Default(), dir_, 2);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    v = (*reader)->Verify(nullptr);
    EXPECT_TRUE(v.IsCorruption()) << v.ToString();
    EXPECT_NE(v.message().find(path), std::string::npos) << v.ToString();
    EXPECT_NE(v.message().find("disagrees with the rank indexes"), std::string::npos) << v.ToString();
  }
}

TEST_F(CorruptionTest, DataFileSizeAndPaddingAreChecked) {
  const std::string path = DataPath(2, 0, 2);
  const std::string valid = ReadWholeFile(path);
  ASSERT_EQ(valid.size() % 4096, 0u);
  auto verify = [&]() {
    auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    return reader.ok() ? (*reader)->Verify(nullptr) : reader.status();
  };
  ASSERT_TRUE(verify().ok());
  // Where the chunks and objects of rank 0 end: the rest of the file is zero padding.
  auto reader = CheckpointReader::Open(Env::Default(), dir_, 2);
  ASSERT_TRUE(reader.ok());
  const format::CheckpointIndex& m = (*reader)->manifest();
  uint64_t end = kDataHeaderBytes;
  for (const format::FragmentInfo& f : m.fragments) {
    if (m.files[f.file].rank != 0) continue;
    uint64_t at = f.offset;
    for (uint64_t k = 0; k < f.num_chunks; ++k) at += m.chunks[f.first_chunk + k].stored_length;
    end = std::max(end, at);
  }
  for (const format::ObjectInfo& o : m.objects)
    if (o.rank == 0) end = std::max(end, o.offset + o.length);
  ASSERT_LT(end, valid.size()) << "the specimen needs some padding";

  struct Case {
    std::string what, bytes, expect;
  };
  std::string padded = valid;
  padded[valid.size() - 1] = 1;
  std::string first_pad = valid;
  first_pad[end] = 1;
  const std::vector<Case> cases = {
      {"a block of zeros appended", valid + std::string(4096, '\0'), "bytes, but its index says"},
      {"one byte appended", valid + std::string(1, '\0'), "bytes, but its index says"},
      {"truncated by a block", valid.substr(0, valid.size() - 4096), ""},
      {"last padding byte set", padded, "padding"},
      {"first padding byte set", first_pad, "padding"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ASSERT_TRUE(WriteWholeFile(path, c.bytes));
    Status v = verify();
    EXPECT_TRUE(v.IsCorruption()) << v.ToString();
    EXPECT_NE(v.message().find(path), std::string::npos) << v.ToString();
    EXPECT_NE(v.message().find(c.expect), std::string::npos) << v.ToString();
  }
  ASSERT_TRUE(WriteWholeFile(path, valid));
  EXPECT_TRUE(verify().ok());
}

TEST_F(CorruptionTest, CompressedDataFileTakesOnlyWhatItStores) {
  // 64 MiB of very compressible f32 values, saved with zstd.
  constexpr int64_t kElements = int64_t{16} << 20;
  std::vector<float> values(kElements);
  for (int64_t i = 0; i < kElements; ++i) values[i] = static_cast<float>(i % 1000) * 0.5f;
  const uint64_t raw = kElements * sizeof(float);
  CheckpointerOptions o = Options();
  o.directory = tmp_.Sub("compressed");
  o.codec = SaveCodec::kZstd;
  o.chunk_bytes = 1 << 20;
  {
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    SaveRequest req;
    req.tensors.push_back(TensorShard::Whole("state", DType::kF32, {kElements}, values.data()));
    Status s = (*c)->Save(7, req).WaitPersisted();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  auto reader = CheckpointReader::Open(Env::Default(), o.directory, 7);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const format::CheckpointIndex& m = (*reader)->manifest();
  ASSERT_EQ(m.files.size(), 1u);
  uint64_t stored = 0;
  for (const format::ChunkInfo& c : m.chunks) stored += c.stored_length;
  ASSERT_LT(stored, raw / 10) << "the test state should compress well";

  const std::string path = o.directory + "/" + StepDirName(7) + "/" + m.files[0].name;
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  // The file is the header and the stored bytes, padded to the next 4096 bytes, and its index says so.
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), m.files[0].size);
  EXPECT_EQ(m.files[0].size, (kDataHeaderBytes + stored + 4095) / 4096 * 4096);
  // What `du` counts: the blocks allocated, not only the length.
  const uint64_t on_disk = static_cast<uint64_t>(st.st_blocks) * 512;
  EXPECT_LT(on_disk, raw / 4) << "a " << raw << "-byte state stored in " << stored << " bytes takes " << on_disk
                              << " bytes on disk";
  Status v = (*reader)->Verify(nullptr);
  EXPECT_TRUE(v.ok()) << v.ToString();
  std::vector<float> back(kElements, -1.0f);
  auto loaded = (*reader)->Load({TensorShard::Whole("state", DType::kF32, {kElements}, back.data())});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(back == values);
}

TEST_F(CorruptionTest, DrainedCompressedCopyIsExactAndVerifies) {
  CheckpointerOptions o = Options();
  o.directory = tmp_.Sub("fast");
  o.drain_directory = tmp_.Sub("shared");
  o.codec = SaveCodec::kZstd;
  std::vector<Status> st = SaveAllRanks(o, Tensors(5), DimLayout(2, 0), 5, 5, /*threads=*/true);
  ASSERT_TRUE(AllOk(st)) << Describe(st);
  for (const std::string& root : {o.directory, o.drain_directory}) {
    SCOPED_TRACE(root);
    auto reader = CheckpointReader::Open(Env::Default(), root, 5);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    for (const format::FileInfo& f : (*reader)->manifest().files)
      EXPECT_EQ(ReadWholeFile(root + "/" + StepDirName(5) + "/" + f.name).size(), f.size) << f.name;
    Status v = (*reader)->Verify(nullptr);
    EXPECT_TRUE(v.ok()) << v.ToString();
  }
}

// ---- hostile index and manifest files ------------------------------------------------------

class HostileFilesTest : public CorruptionTest {
 protected:
  void SetUp() override {
    CorruptionTest::SetUp();
    if (HasFatalFailure()) return;
    // Step 3, one rank: its index is the specimen every case edits.
    CheckpointerOptions o = Options();
    std::vector<Status> st = SaveAllRanks(o, Tensors(3), WholeLayout(), 3, 3, false);
    ASSERT_TRUE(AllOk(st)) << Describe(st);
    index_path_ = IndexPath(3, 0, 1);
    manifest_path_ = ManifestPath(3, 1);
    valid_index_ = ReadWholeFile(index_path_);
    valid_manifest_ = ReadWholeFile(manifest_path_);
    ASSERT_GT(valid_index_.size(), 224u);
    // Bait: files a reader following an escaping name would find.
    relative_escape_ = "../../sentinel/";
    const size_t name_len = DataFileName(Hash(), 0, 1).size();
    ASSERT_GT(name_len, relative_escape_.size());
    relative_escape_ += std::string(name_len - relative_escape_.size(), 'x');
    absolute_escape_ = sentinel_ + "/";
    ASSERT_LT(absolute_escape_.size(), name_len) << "temporary directory path too long for this case";
    absolute_escape_ += std::string(name_len - absolute_escape_.size(), 'y');
    ASSERT_TRUE(WriteWholeFile(StepDir(3) + "/" + relative_escape_, valid_data()));
    ASSERT_TRUE(WriteWholeFile(absolute_escape_, valid_data()));
    outside_before_ = Outside();
  }

  std::string valid_data() const { return ReadWholeFile(DataPath(3, 0, 1)); }

  // `bytes` with the data file's name replaced by `name` (same length) and the checksums resealed.
  std::string WithFileName(std::string bytes, const std::string& name) {
    const std::string old = DataFileName(Hash(), 0, 1);
    EXPECT_EQ(old.size(), name.size());
    const size_t at = bytes.find(old);
    EXPECT_NE(at, std::string::npos);
    if (at == std::string::npos) return bytes;
    bytes.replace(at, old.size(), name);
    FixBodyChecksum(&bytes);
    return bytes;
  }

  struct Case {
    std::string what;
    std::string bytes;
    bool manifest = false;  // replaces the manifest (the index stays valid) instead of the index
  };

  std::vector<Case> Cases() {
    std::vector<Case> cases;
    const std::string& v = valid_index_;
    cases.push_back({"empty file", ""});
    for (size_t n : {1ul, 7ul, 8ul, 23ul, 24ul, 100ul, 207ul, 208ul, 216ul, v.size() / 2, v.size() - 16, v.size() - 1})
      cases.push_back({"truncated to " + std::to_string(n) + " bytes", v.substr(0, n)});
    cases.push_back({"one byte too many", v + "x"});
    {
      std::string b = v;
      b[0] = 'X';
      cases.push_back({"wrong magic", b});
    }
    {
      std::string b = v;
      std::memcpy(b.data() + b.size() - 8, "NOTANEND", 8);
      cases.push_back({"wrong end magic", b});
    }
    std::mt19937_64 rng(12345);
    for (size_t n : {16ul, 208ul, 4096ul, v.size()}) {
      std::string b(n, '\0');
      for (char& c : b) c = static_cast<char>(rng());
      cases.push_back({"random garbage of " + std::to_string(n) + " bytes", b});
      std::string m = b;
      std::memcpy(m.data(), v.data(), std::min<size_t>(16, n));  // a valid-looking prefix
      cases.push_back({"garbage behind a valid prefix, " + std::to_string(n) + " bytes", m});
    }
    for (size_t field = 0; field < 6; ++field) {
      std::string b = v;
      PutU64(&b, 64 + 8 * field, uint64_t{1} << 60);
      FixHeaderChecksum(&b);
      cases.push_back({"huge count #" + std::to_string(field), b});
      std::string s = v;
      PutU64(&s, 112 + 8 * field, ~uint64_t{0} - 7);
      FixHeaderChecksum(&s);
      cases.push_back({"huge section length #" + std::to_string(field), s});
    }
    {
      std::string b = v;
      PutU64(&b, 56, uint64_t{1} << 62);
      FixHeaderChecksum(&b);
      cases.push_back({"huge file length", b});
      std::string h = v;
      PutU32(&h, 12, 1u << 30);
      cases.push_back({"huge header length", h});
      std::string r = v;
      PutU64(&r, 168, uint64_t{1} << 40);
      PutU64(&r, 176, uint64_t{1} << 40);
      FixHeaderChecksum(&r);
      cases.push_back({"run id outside the string table", r});
      std::string w = v;
      PutU32(&w, 24, 0);
      FixHeaderChecksum(&w);
      cases.push_back({"world size 0", w});
    }
    {
      std::string b = v;
      b[v.size() / 2] ^= 1;
      cases.push_back({"one body byte flipped", b});
    }
    cases.push_back({"file name escaping upwards", WithFileName(v, relative_escape_)});
    cases.push_back({"absolute file name", WithFileName(v, absolute_escape_)});
    {
      std::string name = DataFileName(Hash(), 0, 1);
      name[5] = '/';
      cases.push_back({"file name with a slash", WithFileName(v, name)});
      name = DataFileName(Hash(), 0, 1);
      name[0] = '.';
      name[1] = '.';
      name[2] = '\0';
      cases.push_back({"file name with a NUL", WithFileName(v, name)});
    }
    // The same attacks on the manifest, with valid rank indexes beside it.
    const std::string& mv = valid_manifest_;
    cases.push_back({"manifest: empty", "", true});
    cases.push_back({"manifest: truncated", mv.substr(0, mv.size() / 3), true});
    cases.push_back({"manifest: garbage", std::string(mv.size(), 'g'), true});
    cases.push_back({"manifest: escaping file name", WithFileName(mv, relative_escape_), true});
    cases.push_back({"manifest: absolute file name", WithFileName(mv, absolute_escape_), true});
    cases.push_back({"manifest: a rank index in its place", v, true});
    return cases;
  }

  std::string index_path_, manifest_path_, valid_index_, valid_manifest_;
  std::string relative_escape_, absolute_escape_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> outside_before_;
};

TEST_F(HostileFilesTest, EveryHostileFileGivesAClearErrorAndNeverEscapes) {
  std::string diff;
  ASSERT_TRUE(LoadAll(3, 3, &diff).ok());  // the specimen is valid to begin with
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.what);
    // Reset step 3: valid index, and the manifest only for the manifest cases (without it the
    // reader merges the indexes, which is what the index cases attack).
    ASSERT_TRUE(WriteWholeFile(index_path_, c.manifest ? valid_index_ : c.bytes));
    ::unlink(manifest_path_.c_str());
    if (c.manifest) {
      ASSERT_TRUE(WriteWholeFile(manifest_path_, c.bytes));
    }
    const std::string& attacked = c.manifest ? manifest_path_ : index_path_;

    PathRecordingEnv recorder(Env::Default());
    auto r = LoadAll(3, 3, &diff, &recorder);
    if (r.ok()) {
      // A damaged manifest may be bypassed by merging the valid indexes, but then the data is right.
      EXPECT_TRUE(c.manifest) << "a hostile index was accepted";
      EXPECT_EQ(diff, "");
    } else {
      EXPECT_TRUE(r.status().IsCorruption() || r.status().IsNotFound()) << r.status().ToString();
      EXPECT_NE(r.status().message().find(attacked), std::string::npos)
          << "the error does not name the file: " << r.status().ToString();
    }
    auto reader = CheckpointReader::Open(&recorder, dir_, 3);
    if (reader.ok()) {
      // Open may bypass a damaged manifest; verify must not: every case here is damage.
      EXPECT_TRUE(c.manifest) << "a hostile index was opened";
      Status v = (*reader)->Verify(nullptr);
      EXPECT_FALSE(v.ok()) << "verify accepted a damaged manifest";
      EXPECT_NE(v.message().find(attacked), std::string::npos) << "verify does not name the file: " << v.ToString();
    } else {
      EXPECT_TRUE(reader.status().IsCorruption() || reader.status().IsNotFound()) << reader.status().ToString();
    }
    // The newest loadable checkpoint is used instead.
    auto fallback = LoadAll(std::nullopt, r.ok() ? 3 : 2, &diff, &recorder);
    ASSERT_TRUE(fallback.ok()) << fallback.status().ToString();
    EXPECT_EQ(*fallback, r.ok() ? 3u : 2u);
    EXPECT_EQ(diff, "");
    auto c2 = Checkpointer::Open(Options(&recorder));
    ASSERT_TRUE(c2.ok());
    EXPECT_TRUE((*c2)->List().ok());

    for (const std::string& p : recorder.paths())
      EXPECT_TRUE(p == dir_ || p.rfind(dir_ + "/", 0) == 0) << "touched a path outside the checkpoint: " << p;
    for (const std::string& p : recorder.paths())
      EXPECT_EQ(p.find(".."), std::string::npos) << "followed a name with '..': " << p;
    EXPECT_EQ(Outside(), outside_before_) << "something outside the checkpoint directory changed";
    if (HasFailure()) return;
  }
}

TEST_F(HostileFilesTest, DamagedManifestIsRebuiltFromIntactIndexes) {
  // The rank indexes are the commit record; a manifest that rotted does not cost the checkpoint.
  std::string b = valid_manifest_;
  b[b.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteWholeFile(manifest_path_, b));
  std::string diff;
  auto r = LoadAll(3, 3, &diff);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(diff, "");
  ExpectFallsBackTo(3);
  // Both damaged: the error names the manifest, and the load falls back.
  ASSERT_TRUE(WriteWholeFile(index_path_, valid_index_.substr(0, 100)));
  r = LoadAll(3, 3, &diff);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(manifest_path_), std::string::npos) << r.status().ToString();
  ExpectFallsBackTo(2);
}

TEST_F(HostileFilesTest, DecoderRejectsEscapingFileNames) {
  // The patched encodings are intact byte-wise (checksums resealed): only the name check stands
  // between them and a path outside the checkpoint.
  for (const std::string& name : {relative_escape_, absolute_escape_}) {
    auto decoded = format::DecodeIndex(WithFileName(valid_index_, name), index_path_);
    ASSERT_FALSE(decoded.ok()) << name;
    EXPECT_TRUE(decoded.status().IsCorruption()) << decoded.status().ToString();
    EXPECT_NE(decoded.status().message().find("unsafe file name"), std::string::npos) << decoded.status().ToString();
    EXPECT_NE(decoded.status().message().find(index_path_), std::string::npos) << decoded.status().ToString();
  }
  // The unpatched specimen decodes, so the rejection above is the name's doing.
  EXPECT_TRUE(format::DecodeIndex(valid_index_, index_path_).ok());
  EXPECT_TRUE(format::DecodeIndex(WithFileName(valid_index_, DataFileName(Hash(), 0, 1)), index_path_).ok());
}

TEST_F(HostileFilesTest, IndexOfAnotherStepOrRankIsRejected) {
  // A valid index, but of step 1 (rank 0 of 2), put where step 3's rank 0 of 1 index belongs.
  ::unlink(manifest_path_.c_str());
  ASSERT_TRUE(WriteWholeFile(index_path_, ReadWholeFile(IndexPath(1, 0, 2))));
  std::string diff;
  auto r = LoadAll(3, 3, &diff);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(index_path_), std::string::npos) << r.status().ToString();
  ExpectFallsBackTo(2);
}

TEST_F(HostileFilesTest, IndexOfANewerFormatVersionSaysSo) {
  ::unlink(manifest_path_.c_str());
  std::string b = valid_index_;
  PutU32(&b, 8, 2);
  FixHeaderChecksum(&b);
  ASSERT_TRUE(WriteWholeFile(index_path_, b));
  std::string diff;
  auto r = LoadAll(3, 3, &diff);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsNotSupported()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(index_path_), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("version 2"), std::string::npos) << r.status().ToString();
}

TEST_F(HostileFilesTest, GiantSparseIndexIsRefusedWithoutReadingIt) {
  ::unlink(manifest_path_.c_str());
  const int fd = ::open(index_path_.c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, (off_t{17} << 30)), 0);  // 17 GiB of holes, above the 16 GiB limit
  ::close(fd);
  std::string diff;
  auto r = LoadAll(3, 3, &diff);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(index_path_), std::string::npos) << r.status().ToString();
  ExpectFallsBackTo(2);
}

TEST_F(HostileFilesTest, StrayFilesInTheCheckpointAreIgnored) {
  // Names that look almost like checkpoint files, directories where files belong, temp files.
  ASSERT_TRUE(WriteWholeFile(dir_ + "/step-123", "not a step"));
  ASSERT_TRUE(WriteWholeFile(dir_ + "/step-0000000000000000000x", "not a step"));
  ASSERT_EQ(::mkdir((dir_ + "/step-00000000000000000009").c_str(), 0755), 0);  // empty step dir
  ASSERT_TRUE(WriteWholeFile(StepDir(2) + "/" + Hash() + ".r000000-of-000002.index.tmp-1-1", "junk"));
  ASSERT_TRUE(WriteWholeFile(StepDir(2) + "/ffffffffffffffff.r000005-of-000002.index", "bad rank"));
  ASSERT_TRUE(WriteWholeFile(StepDir(2) + "/README", "hello"));
  ASSERT_EQ(::mkdir((StepDir(2) + "/" + Hash() + ".r000001-of-000003.index").c_str(), 0755), 0);
  ExpectFallsBackTo(3);
  std::string diff;
  auto r = LoadAll(2, 2, &diff);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(diff, "");
  auto c = Checkpointer::Open(Options());
  ASSERT_TRUE(c.ok());
  auto list = (*c)->List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->front().step, 9u);
  EXPECT_FALSE(list->front().complete);
}

}  // namespace corruption_test
}  // namespace lifeline::testing
