// ManifestPartReader: a manifest read in parts (§5.5) gives what a whole decode gives, reads
// little more than it is asked for, and catches damage in every block it reads.
#include "formats/index_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "formats/index_test_kit.h"

namespace lifeline::format {
namespace manifest_parts_test {

// ---- reading a manifest in parts (§5.5) ----

// A manifest of 8 ranks and 1,000 tensors, each tensor split by rows among the ranks, plus a rank
// object each.
CheckpointIndex PartsManifest() {
  std::vector<CheckpointIndex> ranks;
  for (uint32_t r = 0; r < 8; ++r) {
    IndexBuilder b(r, 8);
    for (int t = 0; t < 1000; ++t) {
      const uint32_t id = b.Tensor("layer." + std::to_string(t) + ".weight", DType::kF32, {64, 16});
      b.Fragment(id, BoxRegion({8 * static_cast<int64_t>(r), 0}, {8, 16}));
    }
    b.Object("rng", 24);
    ranks.push_back(b.index());
  }
  Result<CheckpointIndex> m = BuildManifest(std::move(ranks));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// Reads from an in-memory file, counting the calls.
struct MemoryFile {
  std::string bytes;
  int reads = 0;
  ManifestPartReader::ReadAt Reader() {
    return [this](uint64_t offset, uint64_t length, char* out) -> Status {
      ++reads;
      if (offset > bytes.size() || length > bytes.size() - offset) return Status::IOError("read past the end");
      std::memcpy(out, bytes.data() + offset, length);
      return Status::OK();
    };
  }
};

// What a whole decode says of tensor `t`: its fragments with their chunks, chunk numbers made
// relative to the fragment.
std::vector<std::pair<FragmentInfo, std::vector<ChunkInfo>>> FragmentsOf(const CheckpointIndex& m, uint32_t t) {
  std::vector<std::pair<FragmentInfo, std::vector<ChunkInfo>>> out;
  for (const FragmentInfo& f : m.fragments) {
    if (f.tensor != t) continue;
    FragmentInfo copy = f;
    copy.first_chunk = 0;
    out.emplace_back(copy, std::vector<ChunkInfo>(m.chunks.begin() + f.first_chunk,
                                                  m.chunks.begin() + f.first_chunk + f.num_chunks));
  }
  return out;
}

TEST(ManifestPartsTest, ReadsTheHeadAndOnlyTheFragmentsAskedFor) {
  const CheckpointIndex manifest = PartsManifest();
  MemoryFile file{MustEncode(manifest)};
  EXPECT_EQ(GetU32(file.bytes, 12), 240u);  // the header carries the directory's place
  Result<CheckpointIndex> whole = DecodeIndex(file.bytes, "m.manifest");  // a reader that ignores it
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_TRUE(*whole == manifest);

  auto reader = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m.manifest");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_NE(*reader, nullptr);
  CheckpointIndex head = manifest;
  head.fragments.clear();
  head.chunks.clear();
  EXPECT_TRUE((*reader)->head() == head);
  const uint64_t head_bytes = (*reader)->bytes_read();

  CheckpointIndex part = (*reader)->head();
  ASSERT_TRUE((*reader)->AddTensors({150, 5, 6}, &part).ok());
  ASSERT_EQ(part.fragments.size(), 3u * 8);
  for (uint32_t t : {5u, 6u, 150u}) EXPECT_EQ(FragmentsOf(part, t), FragmentsOf(manifest, t)) << "tensor " << t;
  EXPECT_TRUE(FragmentsOf(part, 7).empty());
  // Three tensors' fragments (24 x 64 bytes), chunks (192 x 16 bytes) and dims come in whole
  // 16 KiB blocks, at most two of each kind per run of consecutive tensors; with the head, still a
  // small part of the 2 MB file.
  const uint64_t fragment_bytes = (*reader)->bytes_read() - head_bytes;
  EXPECT_LE(fragment_bytes, 12u * (16 << 10)) << "of " << file.bytes.size();
  EXPECT_LT((*reader)->bytes_read(), file.bytes.size() / 6) << "head " << head_bytes << ", fragments " << fragment_bytes;
  std::vector<uint32_t> more = {7};
  ASSERT_TRUE((*reader)->AddTensors(more, &part).ok());
  EXPECT_EQ(FragmentsOf(part, 7), FragmentsOf(manifest, 7));

  // A box of a tensor: only the runs (here each rank's piece is its own box) that meet it.
  const size_t before = part.fragments.size();
  ASSERT_TRUE((*reader)->AddFragments({{9, Box{{20, 0}, {10, 16}}}}, &part).ok());  // rows 20-29: ranks 2 and 3
  ASSERT_EQ(part.fragments.size(), before + 2);
  EXPECT_EQ(part.fragments[before].region.offsets, (std::vector<int64_t>{16, 0}));
  EXPECT_EQ(part.fragments[before + 1].region.offsets, (std::vector<int64_t>{24, 0}));
  ASSERT_TRUE((*reader)->AddFragments({{9, Box{{0, 0}, {64, 16}}}}, &part).ok());  // the rest, none twice
  EXPECT_EQ(part.fragments.size(), before + 8);

  // Asking for every tensor at once gives back exactly the manifest.
  auto again = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m.manifest");
  ASSERT_TRUE(again.ok());
  CheckpointIndex all = (*again)->head();
  std::vector<uint32_t> every(manifest.tensors.size());
  for (uint32_t t = 0; t < every.size(); ++t) every[t] = t;
  ASSERT_TRUE((*again)->AddTensors(every, &all).ok());
  EXPECT_TRUE(all == manifest);
  ASSERT_TRUE((*again)->AddAllFragments(&all).ok());  // nothing left to read
  EXPECT_TRUE(all == manifest);
  EXPECT_LE((*again)->bytes_read(), file.bytes.size() + 4096);
}

TEST(ManifestPartsTest, AnAlteredBlockIsCaughtWhenItIsRead) {
  const CheckpointIndex manifest = PartsManifest();
  MemoryFile file{MustEncode(manifest)};
  // One byte of the flat range of a fragment of tensor 150, with the whole-file checksum made
  // right again: only the block checksum can tell.
  const size_t fragment = 150 * 8 + 3;
  file.bytes[SectionStart(file.bytes, kFragments) + fragment * 64 + 40] ^= 0x01;
  Reseal(&file.bytes);
  auto reader = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m.manifest");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  CheckpointIndex part = (*reader)->head();
  ASSERT_TRUE((*reader)->AddTensors({5}, &part).ok());  // a block far from the damage
  Status s = (*reader)->AddTensors({150}, &part);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("m.manifest"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("does not match its checksum in the directory"), std::string::npos) << s.ToString();
}

TEST(ManifestPartsTest, EveryFlippedByteOfTheBodyIsCaught) {
  // Small enough to flip each byte: 2 ranks, 3 tensors.
  std::vector<CheckpointIndex> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    IndexBuilder b(r, 2);
    for (int t = 0; t < 3; ++t)
      b.Fragment(b.Tensor("t" + std::to_string(t), DType::kF32, {4, 4}), BoxRegion({2 * int64_t{r}, 0}, {2, 4}));
    b.Object("rng", 8);
    ranks.push_back(b.index());
  }
  Result<CheckpointIndex> m = BuildManifest(std::move(ranks));
  ASSERT_TRUE(m.ok());
  const std::string good = MustEncode(*m);
  const size_t body_end = good.size() - 16;  // the trailer is not read in parts
  for (size_t i = 0; i < body_end; ++i) {
    MemoryFile file{good};
    file.bytes[i] ^= 0x20;
    // Past the header, the whole-file checksum made right again: the blocks must tell.
    if (i >= GetU32(good, kHeaderLengthAt)) Reseal(&file.bytes);
    auto reader = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m");
    Status s = reader.status();
    if (reader.ok() && *reader != nullptr) {
      CheckpointIndex all = (*reader)->head();
      s = (*reader)->AddTensors({0, 1, 2}, &all);
      if (s.ok() && all == *m) s = Status::Corruption("m", "unchanged");  // a flip that changed nothing
    }
    if (reader.ok() && *reader == nullptr) s = Status::Corruption("m", "no directory");
    EXPECT_FALSE(s.ok()) << "byte " << i << " flipped went unnoticed";
  }
}

TEST(ManifestPartsTest, FilesWithoutADirectoryAreReadWhole) {
  // A manifest whose fragments are not grouped by tensor is written without a directory.
  CheckpointIndex m = PartsManifest();
  std::swap(m.fragments[0], m.fragments[8]);
  std::swap(m.fragments[0].first_chunk, m.fragments[8].first_chunk);
  MemoryFile file{MustEncode(m)};
  EXPECT_EQ(GetU32(file.bytes, 12), 208u);
  auto reader = ManifestPartReader::Open(file.Reader(), file.bytes.size(), "m");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(*reader, nullptr);
  // A rank index is not a manifest.
  MemoryFile rank{MustEncode(SmallIndex())};
  auto not_manifest = ManifestPartReader::Open(rank.Reader(), rank.bytes.size(), "r.index");
  EXPECT_TRUE(not_manifest.status().IsCorruption()) << not_manifest.status().ToString();
  // Truncated anywhere: Corruption or a failed read, never a crash.
  MemoryFile whole{MustEncode(PartsManifest())};
  for (size_t n : {size_t{0}, size_t{10}, size_t{200}, whole.bytes.size() / 2, whole.bytes.size() - 1}) {
    MemoryFile cut{whole.bytes.substr(0, n)};
    auto r = ManifestPartReader::Open(cut.Reader(), cut.bytes.size(), "cut");
    EXPECT_FALSE(r.ok()) << n;
  }
}

}  // namespace manifest_parts_test
}  // namespace lifeline::format
