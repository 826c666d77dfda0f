// Any save layout loads into any load layout, byte for byte: world sizes that do not divide each
// other, splits along different dimensions, flat (ZeRO) ranges, ZeRO over tensor parallelism,
// replicas, scalars and empty tensors. Replicated pieces are written exactly once, spread over the
// replicas. Per-rank objects and the global metadata survive any change of world size.
#include <algorithm>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "lib/src/load/checkpoint_reader.h"
#include "tests/integration/test_util.h"

namespace lifeline::testing {
namespace reshard_test {

constexpr uint64_t kStep = 100;
constexpr uint64_t kSalt = 7;

CheckpointerOptions BaseOptions(const std::string& dir) {
  CheckpointerOptions o;
  o.directory = dir;
  o.run_id = "reshard-test";
  o.chunk_bytes = 4096;  // many chunks per fragment, chunk boundaries inside rows
  o.write_block_bytes = 64 << 10;
  o.save_memory_budget = 256 << 10;
  o.load_memory_budget = 64 << 10;
  return o;
}

std::vector<Layout> SaveLayouts() {
  return {WholeLayout(),         DimLayout(3, 0),  DimLayout(3, 1),          DimLayout(6, 0),
          DimLayout(6, 1),       FlatLayout(4),    BoxFlatLayout(3, 2, 1),   ReplicatedLayout(3),
          TpDpLayout(2, 2)};
}

std::vector<Layout> LoadLayouts() {
  return {WholeLayout(),   DimLayout(5, 0),        DimLayout(5, 1),        DimLayout(4, 0), DimLayout(4, 1),
          FlatLayout(7),   BoxFlatLayout(2, 2, 0), BoxFlatLayout(2, 3, 1)};
}

std::map<std::string, std::string> AsMap(const std::vector<std::pair<std::string, std::string>>& v) {
  return std::map<std::string, std::string>(v.begin(), v.end());
}

std::map<std::string, std::string> SavedObjects(uint32_t rank, uint64_t salt) {
  RankState none;
  return AsMap(RequestOf(none, rank, salt).objects);
}

// Loads step `step` from `dir` into every rank of `layout` and checks every byte.
void LoadAndCheck(const std::string& dir, const std::vector<GlobalTensor>& tensors, const Layout& layout,
                  uint64_t step, uint64_t salt, uint32_t saved_world) {
  std::vector<RankState> ranks = BuildRanks(tensors, layout, /*fill_from_global=*/false);
  for (uint32_t r = 0; r < layout.world_size; ++r) {
    SCOPED_TRACE("load layout " + layout.name + ", rank " + std::to_string(r));
    CheckpointerOptions o = BaseOptions(dir);
    o.rank = r;
    o.world_size = layout.world_size;
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    LoadRequest req;
    req.tensors = ranks[r].shards;
    auto res = (*ckpt)->Load(step, req);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(res->step, step);
    EXPECT_EQ(res->saved_world_size, saved_world);
    EXPECT_EQ(res->metadata_json, MetadataOf(0, salt));
    uint64_t want_bytes = 0;
    for (size_t k = 0; k < ranks[r].buffers.size(); ++k) {
      const auto& [ti, region] = ranks[r].where[k];
      want_bytes += ranks[r].buffers[k].size();
      const std::string diff = CompareRegion(tensors[ti], region, ranks[r].buffers[k]);
      EXPECT_EQ(diff, "") << "piece " << k;
    }
    EXPECT_EQ(res->bytes_scattered, want_bytes);
    // The loading rank gets the objects the saving rank of the same number saved, if any.
    if (r < saved_world) {
      EXPECT_EQ(AsMap(res->objects), SavedObjects(r, salt));
    } else {
      EXPECT_TRUE(res->objects.empty());
    }
  }
}

class ReshardMatrixTest : public ::testing::TestWithParam<int> {};

TEST_P(ReshardMatrixTest, EverySaveLayoutLoadsIntoEveryLoadLayout) {
  const Layout save = SaveLayouts()[GetParam()];
  SCOPED_TRACE("save layout " + save.name);
  TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  const std::string dir = tmp.Sub("ckpt");
  const std::vector<GlobalTensor> tensors = StandardTensors(kSalt);

  std::vector<Status> saved = SaveAllRanks(BaseOptions(dir), tensors, save, kStep, kSalt, /*threads=*/true);
  ASSERT_TRUE(AllOk(saved)) << Describe(saved);

  CheckpointerOptions o = BaseOptions(dir);
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok());
  auto latest = (*ckpt)->LatestStep();
  ASSERT_TRUE(latest.ok());
  ASSERT_EQ(*latest, std::optional<uint64_t>(kStep));

  for (const Layout& load : LoadLayouts()) {
    LoadAndCheck(dir, tensors, load, kStep, kSalt, save.world_size);
    if (HasFatalFailure()) return;
  }

  // Every target of a layout at once, in one request: several targets of one tensor.
  {
    const Layout all = FlatLayout(7);
    std::vector<RankState> ranks = BuildRanks(tensors, all, false);
    LoadRequest req;
    for (const RankState& rs : ranks) req.tensors.insert(req.tensors.end(), rs.shards.begin(), rs.shards.end());
    req.objects_of_rank = 0;
    auto res = (*ckpt)->Load(std::nullopt, req);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(AsMap(res->objects), SavedObjects(0, kSalt));
    for (const RankState& rs : ranks)
      for (size_t k = 0; k < rs.buffers.size(); ++k)
        EXPECT_EQ(CompareRegion(tensors[rs.where[k].first], rs.where[k].second, rs.buffers[k]), "");
  }

  // Verify reads every chunk and object and finds nothing wrong.
  auto reader = CheckpointReader::Open(Env::Default(), dir, kStep);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  VerifyReport report;
  Status v = (*reader)->Verify(&report);
  EXPECT_TRUE(v.ok()) << v.ToString();
  EXPECT_GT(report.chunks_checked, 0u);
}

INSTANTIATE_TEST_SUITE_P(SaveLayouts, ReshardMatrixTest, ::testing::Range(0, static_cast<int>(SaveLayouts().size())),
                         [](const ::testing::TestParamInfo<int>& info) { return SaveLayouts()[info.param].name; });

// ---- odd options --------------------------------------------------------------------------

struct OddOptions {
  std::string name;
  uint64_t chunk_bytes;
  uint64_t write_block_bytes;
  uint64_t save_budget;
  uint64_t load_budget;
  unsigned queue_depth;
  bool save_direct;
  bool load_direct;
};

class OddOptionsTest : public ::testing::TestWithParam<OddOptions> {};

TEST_P(OddOptionsTest, RoundTripsWithTheseOptions) {
  const OddOptions& p = GetParam();
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  const std::vector<GlobalTensor> tensors = StandardTensors(kSalt);
  CheckpointerOptions o = BaseOptions(dir);
  o.chunk_bytes = p.chunk_bytes;
  o.write_block_bytes = p.write_block_bytes;
  o.save_memory_budget = p.save_budget;
  o.queue_depth = p.queue_depth;
  o.direct_io = p.save_direct;
  std::vector<Status> saved = SaveAllRanks(o, tensors, BoxFlatLayout(3, 2, 1), kStep, kSalt, true);
  ASSERT_TRUE(AllOk(saved)) << Describe(saved);
  for (const Layout& load : {DimLayout(4, 0), FlatLayout(3)}) {
    std::vector<RankState> ranks = BuildRanks(tensors, load, false);
    for (uint32_t r = 0; r < load.world_size; ++r) {
      CheckpointerOptions lo = BaseOptions(dir);
      lo.rank = r;
      lo.world_size = load.world_size;
      lo.load_memory_budget = p.load_budget;
      lo.queue_depth = p.queue_depth;
      lo.direct_io = p.load_direct;
      auto ckpt = Checkpointer::Open(lo);
      ASSERT_TRUE(ckpt.ok());
      LoadRequest req;
      req.tensors = ranks[r].shards;
      auto res = (*ckpt)->Load(std::nullopt, req);
      ASSERT_TRUE(res.ok()) << res.status().ToString();
      for (size_t k = 0; k < ranks[r].buffers.size(); ++k)
        EXPECT_EQ(CompareRegion(tensors[ranks[r].where[k].first], ranks[r].where[k].second, ranks[r].buffers[k]), "")
            << load.name << " rank " << r;
    }
  }
  auto reader = CheckpointReader::Open(Env::Default(), dir, kStep);
  ASSERT_TRUE(reader.ok());
  EXPECT_TRUE((*reader)->Verify(nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Options, OddOptionsTest,
    ::testing::Values(OddOptions{"one_element_chunks", 8, 4096, 1, 1, 1, true, true},
                      OddOptions{"chunks_across_rows", 24, 8192, 8192, 4096, 2, true, false},
                      OddOptions{"unaligned_chunks", 4104, 12288, 1 << 20, 5000, 3, false, true},
                      OddOptions{"buffered", 65536, 1 << 20, 64 << 20, 256 << 20, 16, false, false}),
    [](const ::testing::TestParamInfo<OddOptions>& info) { return info.param.name; });

// ---- replicas ----------------------------------------------------------------------------

struct ReplicaStats {
  int64_t elements = 0;
  size_t fragments = 0;
  std::map<uint32_t, int64_t> elements_by_writer;  // writer rank -> elements
};

std::map<std::string, ReplicaStats> StatsOf(const format::CheckpointIndex& m) {
  std::map<std::string, ReplicaStats> out;
  for (const auto& t : m.tensors) out[t.name];  // tensors with no fragment too
  for (const format::FragmentInfo& f : m.fragments) {
    ReplicaStats& s = out[m.tensors[f.tensor].name];
    s.elements += f.region.num_elements();
    s.fragments += 1;
    s.elements_by_writer[m.files[f.file].rank] += f.region.num_elements();
  }
  return out;
}

void CheckReplicas(const Layout& layout, uint64_t split_bytes, uint32_t replica_count) {
  SCOPED_TRACE(layout.name + " with replica_split_bytes " + std::to_string(split_bytes));
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  const std::vector<GlobalTensor> tensors = StandardTensors(kSalt);
  CheckpointerOptions o = BaseOptions(dir);
  o.replica_split_bytes = split_bytes;
  std::vector<Status> saved = SaveAllRanks(o, tensors, layout, kStep, kSalt, /*threads=*/true);
  ASSERT_TRUE(AllOk(saved)) << Describe(saved);

  auto reader = CheckpointReader::Open(Env::Default(), dir, kStep);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const format::CheckpointIndex& m = (*reader)->manifest();
  EXPECT_EQ(m.world_size, layout.world_size);
  std::map<std::string, ReplicaStats> stats = StatsOf(m);
  std::set<uint32_t> small_writers;
  for (const GlobalTensor& t : tensors) {
    SCOPED_TRACE("tensor " + t.name);
    ASSERT_TRUE(stats.count(t.name));
    const ReplicaStats& s = stats[t.name];
    // Each element written exactly once: no replica duplicated, none left out.
    EXPECT_EQ(s.elements, t.volume());
    // A replicated piece (the whole tensor, or one tensor-parallel box of it) is large when its bytes
    // exceed the split threshold; the layouts here cut at most into boxes along dim 0.
    RankPieces pieces = layout.cut(t.shape);
    for (const auto& rank_pieces : pieces) {
      for (const Piece& p : rank_pieces) {
        if (p.replica_index != 0 || p.region.num_elements() == 0) continue;  // each replicated piece once
        const uint64_t bytes = static_cast<uint64_t>(p.region.num_elements()) * t.elem();
        std::set<uint32_t> writers;
        int64_t written = 0;
        for (const format::FragmentInfo& f : m.fragments) {
          if (m.tensors[f.tensor].name != t.name) continue;
          // Fragments inside this piece's box.
          bool inside = true;
          for (size_t d = 0; d < p.region.offsets.size(); ++d)
            inside = inside && f.region.offsets[d] >= p.region.offsets[d] &&
                     f.region.offsets[d] + f.region.shape[d] <= p.region.offsets[d] + p.region.shape[d];
          if (!inside) continue;
          writers.insert(m.files[f.file].rank);
          written += f.region.num_elements();
        }
        EXPECT_EQ(written, p.region.num_elements());
        if (bytes > split_bytes) {
          // The writing load is spread: every replica wrote a share.
          EXPECT_EQ(writers.size(), replica_count) << "a large replicated piece was not written by all replicas";
        } else {
          EXPECT_EQ(writers.size(), 1u) << "a small replicated piece must be written whole by one replica";
          small_writers.insert(writers.begin(), writers.end());
        }
      }
    }
  }
  // Small pieces are spread by hashing: with this many of them, not all land on one rank.
  EXPECT_GE(small_writers.size(), 2u);

  // And all of it loads back into another layout.
  LoadAndCheck(dir, tensors, DimLayout(5, 1), kStep, kSalt, layout.world_size);
  LoadAndCheck(dir, tensors, WholeLayout(), kStep, kSalt, layout.world_size);
}

TEST(ReplicaTest, SmallReplicasAreWrittenOnceByOneReplica) { CheckReplicas(ReplicatedLayout(4), 1 << 20, 4); }

TEST(ReplicaTest, LargeReplicasAreSplitOverAllReplicas) { CheckReplicas(ReplicatedLayout(4), 1024, 4); }

TEST(ReplicaTest, TensorParallelPiecesReplicatedOverDataParallelGroups) {
  CheckReplicas(TpDpLayout(2, 3), 512, 3);
}

TEST(ReplicaTest, ReplicaWriterIsTheSameWhateverTheOrderOfSaves) {
  // Ranks computing the plan alone (sequential saves, reversed declaration order on one rank)
  // still agree: the commit would fail on a gap or a double write.
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  std::vector<GlobalTensor> tensors = StandardTensors(kSalt);
  const Layout layout = ReplicatedLayout(3);
  std::vector<RankState> ranks = BuildRanks(tensors, layout, true);
  std::reverse(ranks[1].shards.begin(), ranks[1].shards.end());
  for (uint32_t r = 0; r < 3; ++r) {
    CheckpointerOptions o = BaseOptions(dir);
    o.rank = r;
    o.world_size = 3;
    o.replica_split_bytes = 2048;
    auto ckpt = Checkpointer::Open(o);
    ASSERT_TRUE(ckpt.ok());
    Status s = (*ckpt)->Save(kStep, RequestOf(ranks[r], r, kSalt)).WaitPersisted();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  LoadAndCheck(dir, tensors, FlatLayout(2), kStep, kSalt, 3);
}

// ---- what a user sees when asking for the wrong thing ---------------------------------------

TEST(ReshardErrorsTest, WrongDtypeShapeOrNameIsReported) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  std::vector<GlobalTensor> tensors = {MakeTensor("w", DType::kF32, {8, 8}, kSalt)};
  ASSERT_TRUE(AllOk(SaveAllRanks(BaseOptions(dir), tensors, DimLayout(2, 0), kStep, kSalt, false)));
  auto ckpt = Checkpointer::Open(BaseOptions(dir));
  ASSERT_TRUE(ckpt.ok());
  std::vector<uint8_t> buf(8 * 8 * 8);

  LoadRequest wrong_dtype;
  wrong_dtype.tensors.push_back(TensorShard::Whole("w", DType::kF64, {8, 8}, buf.data()));
  auto r1 = (*ckpt)->Load(kStep, wrong_dtype);
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.status().code(), StatusCode::kInvalidArgument) << r1.status().ToString();
  EXPECT_NE(r1.status().message().find("'w'"), std::string::npos) << r1.status().ToString();

  LoadRequest wrong_shape;
  wrong_shape.tensors.push_back(TensorShard::Whole("w", DType::kF32, {8, 9}, buf.data()));
  auto r2 = (*ckpt)->Load(kStep, wrong_shape);
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.status().code(), StatusCode::kInvalidArgument) << r2.status().ToString();

  LoadRequest missing;
  missing.tensors.push_back(TensorShard::Whole("no-such-tensor", DType::kF32, {8, 8}, buf.data()));
  auto r3 = (*ckpt)->Load(kStep, missing);
  ASSERT_FALSE(r3.ok());
  EXPECT_TRUE(r3.status().IsNotInCheckpoint()) << r3.status().ToString();
  EXPECT_NE(r3.status().message().find("no-such-tensor"), std::string::npos) << r3.status().ToString();

  LoadRequest outside;  // a box that does not fit in the tensor
  outside.tensors.push_back(TensorShard::Box("w", DType::kF32, {8, 8}, {6, 0}, {4, 8}, buf.data()));
  auto r4 = (*ckpt)->Load(kStep, outside);
  ASSERT_FALSE(r4.ok());
  EXPECT_EQ(r4.status().code(), StatusCode::kInvalidArgument) << r4.status().ToString();

  // An empty request loads nothing and still returns the metadata and objects.
  auto r5 = (*ckpt)->Load(kStep, LoadRequest{});
  ASSERT_TRUE(r5.ok()) << r5.status().ToString();
  EXPECT_EQ(r5->metadata_json, MetadataOf(0, kSalt));
  EXPECT_EQ(AsMap(r5->objects), SavedObjects(0, kSalt));
}

TEST(ReshardErrorsTest, ObjectsOfAnotherRankOnRequest) {
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  std::vector<GlobalTensor> tensors = {MakeTensor("w", DType::kI32, {6, 4}, kSalt)};
  ASSERT_TRUE(AllOk(SaveAllRanks(BaseOptions(dir), tensors, FlatLayout(3), kStep, kSalt, true)));
  CheckpointerOptions o = BaseOptions(dir);
  o.rank = 0;
  o.world_size = 1;  // the job shrank to one rank; it redistributes the others' objects itself
  auto ckpt = Checkpointer::Open(o);
  ASSERT_TRUE(ckpt.ok());
  for (uint32_t r = 0; r < 3; ++r) {
    LoadRequest req;
    req.objects_of_rank = r;
    auto res = (*ckpt)->Load(std::nullopt, req);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_EQ(AsMap(res->objects), SavedObjects(r, kSalt)) << "rank " << r;
    EXPECT_EQ(res->metadata_json, MetadataOf(0, kSalt));
  }
}

TEST(ReshardErrorsTest, OverlappingPiecesHidingAGapAreNeverLoaded) {
  // Rank 0 declares elements [0, 5), rank 1 [3, 8) of a 10-element tensor: as many elements as the
  // tensor has, but [3, 5) twice and [8, 10) never. No rank can see it alone; the checkpoint must
  // not hand out the unwritten elements as if they were data.
  TempDir tmp;
  const std::string dir = tmp.Sub("ckpt");
  GlobalTensor t = MakeTensor("w", DType::kF32, {10}, kSalt);
  Layout overlapping{"overlapping", 2, [](const std::vector<int64_t>& shape) {
                       RankPieces out(2);
                       format::Region a = WholeRegion(shape), b = WholeRegion(shape);
                       a.flat_begin = 0, a.flat_end = 5;
                       b.flat_begin = 3, b.flat_end = 8;
                       out[0].push_back(Piece{a});
                       out[1].push_back(Piece{b});
                       return out;
                     }};
  std::vector<Status> saved = SaveAllRanks(BaseOptions(dir), {t}, overlapping, kStep, kSalt, /*threads=*/false);
  EXPECT_TRUE(saved[0].ok()) << saved[0].ToString();
  EXPECT_FALSE(saved[1].ok()) << "the completing rank committed a checkpoint with a gap";
  EXPECT_NE(saved[1].message().find("'w'"), std::string::npos) << saved[1].ToString();

  auto ckpt = Checkpointer::Open(BaseOptions(dir));
  ASSERT_TRUE(ckpt.ok());
  std::vector<uint8_t> buf(40, 0xAB);
  LoadRequest req;
  req.tensors.push_back(TensorShard::Whole("w", DType::kF32, {10}, buf.data()));
  auto res = (*ckpt)->Load(kStep, req);
  ASSERT_FALSE(res.ok()) << "a load returned elements no rank wrote";
  // The step is marked invalid at commit, with the reason: never loaded.
  EXPECT_TRUE(res.status().IsNotFound()) << res.status().ToString();
  EXPECT_NE(res.status().message().find("invalid"), std::string::npos) << res.status().ToString();
  EXPECT_NE(res.status().message().find("'w'"), std::string::npos) << res.status().ToString();
  auto latest = (*ckpt)->Load(std::nullopt, req);
  EXPECT_FALSE(latest.ok());
}

}  // namespace reshard_test
}  // namespace lifeline::testing
