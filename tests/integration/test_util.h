// Shared helpers of the integration tests (beside tests/kit/test_kit.h's): deterministic tensor contents,
// an independent (deliberately naive) reference for where a piece's elements lie, layouts that
// cut a tensor into per-rank pieces, and multi-rank save/load drivers.
//
// The reference geometry here walks element by element on purpose: it must not share code (or
// bugs) with formats/geometry.cc, whose results it checks.
#ifndef LIFELINE_TESTS_INTEGRATION_TEST_UTIL_H_
#define LIFELINE_TESTS_INTEGRATION_TEST_UTIL_H_

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "formats/checksum.h"
#include "formats/model.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

namespace lifeline::testing {

// The kit's temporary directory and file helpers (tests/kit/test_kit.h), under this namespace's names.
using test::ListDir;
using test::ReadWholeFile;
using test::TempDir;
using test::WriteWholeFile;

// Every regular file below `root` (relative path -> size and content hash), for "nothing changed"
// checks.
inline std::map<std::string, std::pair<uint64_t, uint64_t>> SnapshotTree(const std::string& root) {
  std::map<std::string, std::pair<uint64_t, uint64_t>> out;
  std::function<void(const std::string&, const std::string&)> walk = [&](const std::string& dir,
                                                                         const std::string& rel) {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return;
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
    for (const std::string& n : names) {
      const std::string path = dir + "/" + n;
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0) continue;
      if (S_ISDIR(st.st_mode)) {
        out[rel + n + "/"] = {0, 0};
        walk(path, rel + n + "/");
      } else {
        const std::string bytes = ReadWholeFile(path);
        out[rel + n] = {static_cast<uint64_t>(st.st_size), format::Checksum64(bytes)};
      }
    }
  };
  walk(root, "");
  return out;
}

// ---- tensors ------------------------------------------------------------------------------

struct GlobalTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // row-major, whole tensor

  int64_t volume() const {
    int64_t v = 1;
    for (int64_t e : shape) v *= e;
    return v;
  }
  size_t elem() const { return DTypeSize(dtype); }
};

// Element i of tensor `name` (under `salt`, e.g. the step): a deterministic function of both, so a
// byte landing in the wrong place, or coming from another step, is noticed.
inline void FillElement(const std::string& name, uint64_t salt, int64_t i, DType dtype, uint8_t* out) {
  std::string key = name;
  key.append(reinterpret_cast<const char*>(&salt), sizeof(salt));
  key.append(reinterpret_cast<const char*>(&i), sizeof(i));
  const uint64_t h = format::Checksum64(key);
  const size_t n = DTypeSize(dtype);
  if (dtype == DType::kBool) {
    out[0] = static_cast<uint8_t>(h & 1);
  } else {
    std::memcpy(out, &h, n);
  }
}

inline GlobalTensor MakeTensor(std::string name, DType dtype, std::vector<int64_t> shape, uint64_t salt) {
  GlobalTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<size_t>(t.volume()) * t.elem());
  for (int64_t i = 0; i < t.volume(); ++i) FillElement(t.name, salt, i, dtype, t.bytes.data() + i * t.elem());
  return t;
}

// The usual mix: every dtype family, a scalar, a 3-d tensor, an empty one, and one large enough to
// span many 4 KiB chunks.
inline std::vector<GlobalTensor> StandardTensors(uint64_t salt) {
  std::vector<GlobalTensor> ts;
  ts.push_back(MakeTensor("layer0.weight.f32", DType::kF32, {13, 11}, salt));
  ts.push_back(MakeTensor("layer0.weight.bf16", DType::kBF16, {17, 6}, salt));
  ts.push_back(MakeTensor("layer1.f16", DType::kF16, {10, 9}, salt));
  ts.push_back(MakeTensor("step_counts.i64", DType::kI64, {7, 12}, salt));
  ts.push_back(MakeTensor("bytes.u8", DType::kU8, {23, 5}, salt));
  ts.push_back(MakeTensor("mask.bool", DType::kBool, {6, 7}, salt));
  ts.push_back(MakeTensor("scale.scalar", DType::kF32, {}, salt));
  ts.push_back(MakeTensor("conv.3d", DType::kF32, {5, 6, 7}, salt));
  ts.push_back(MakeTensor("empty", DType::kF32, {0, 4}, salt));
  ts.push_back(MakeTensor("embedding.big", DType::kF32, {130, 97}, salt));
  ts.push_back(MakeTensor("vector.f64", DType::kF64, {29}, salt));
  return ts;
}

// ---- reference geometry ------------------------------------------------------------------

// Global flat index of the element at flat position p of `r`'s box.
inline int64_t GlobalIndexOf(const format::Region& r, const std::vector<int64_t>& global_shape, int64_t p) {
  const size_t n = r.shape.size();
  std::vector<int64_t> coord(n);
  for (size_t d = n; d-- > 0;) {
    coord[d] = r.offsets[d] + p % r.shape[d];
    p /= r.shape[d];
  }
  int64_t g = 0;
  for (size_t d = 0; d < n; ++d) g = g * global_shape[d] + coord[d];
  return g;
}

// The packed bytes of region `r` of `t`.
inline std::vector<uint8_t> Extract(const GlobalTensor& t, const format::Region& r) {
  const size_t e = t.elem();
  std::vector<uint8_t> out(static_cast<size_t>(r.num_elements()) * e);
  for (int64_t p = r.flat_begin; p < r.flat_end; ++p) {
    const int64_t g = GlobalIndexOf(r, t.shape, p);
    std::memcpy(out.data() + (p - r.flat_begin) * e, t.bytes.data() + g * e, e);
  }
  return out;
}

inline format::Region WholeRegion(const std::vector<int64_t>& shape) {
  format::Region r;
  r.offsets.assign(shape.size(), 0);
  r.shape = shape;
  int64_t v = 1;
  for (int64_t x : shape) v *= x;
  r.flat_begin = 0;
  r.flat_end = v;
  return r;
}

// [begin, end) of part i when n items are cut into `parts` near-equal parts.
inline std::pair<int64_t, int64_t> EvenPart(int64_t n, int64_t parts, int64_t i) {
  const int64_t per = n / parts, extra = n % parts;
  const int64_t b = i * per + std::min(i, extra);
  return {b, b + per + (i < extra ? 1 : 0)};
}

// ---- layouts -----------------------------------------------------------------------------
//
// A tensor with no elements has nothing to cut: every rank declares (or asks for) it whole, as a
// job that registers the same parameters on every rank does.

// Which pieces of a tensor each rank holds. A piece may be marked as replica (index, count).
struct Piece {
  format::Region region;
  uint32_t replica_index = 0;
  uint32_t replica_count = 1;
};
using RankPieces = std::vector<std::vector<Piece>>;  // [rank] -> pieces

struct Layout {
  std::string name;
  uint32_t world_size = 1;
  std::function<RankPieces(const std::vector<int64_t>& shape)> cut;
};

// Flat split of the whole tensor into `parts` ranges (ZeRO-style), rank i holding range i.
inline RankPieces FlatPieces(const std::vector<int64_t>& shape, uint32_t parts, bool keep_empty = false) {
  RankPieces out(parts);
  const format::Region whole = WholeRegion(shape);
  if (whole.num_elements() == 0) {
    for (uint32_t i = 0; i < parts; ++i) out[i].push_back(Piece{whole});
    return out;
  }
  for (uint32_t i = 0; i < parts; ++i) {
    auto [b, e] = EvenPart(whole.flat_end, parts, i);
    if (b == e && !keep_empty) continue;
    format::Region r = whole;
    r.flat_begin = b;
    r.flat_end = e;
    out[i].push_back(Piece{r});
  }
  return out;
}

// Boxes along dimension `dim` (tensor parallelism). Falls back to a flat split for tensors with
// fewer dimensions, and leaves ranks empty-handed when the extent is smaller than `parts`.
inline RankPieces DimPieces(const std::vector<int64_t>& shape, uint32_t parts, size_t dim) {
  if (dim >= shape.size() || WholeRegion(shape).num_elements() == 0) return FlatPieces(shape, parts);
  RankPieces out(parts);
  for (uint32_t i = 0; i < parts; ++i) {
    auto [b, e] = EvenPart(shape[dim], parts, i);
    if (b == e) continue;
    format::Region r = WholeRegion(shape);
    r.offsets[dim] = b;
    r.shape[dim] = e - b;
    int64_t v = 1;
    for (int64_t x : r.shape) v *= x;
    r.flat_end = v;
    if (v == 0) continue;
    out[i].push_back(Piece{r});
  }
  return out;
}

// ZeRO over tensor parallelism: `tp` boxes along `dim`, each cut into `zero` flat ranges of the
// box. Rank tp_i * zero + z holds range z of box tp_i.
inline RankPieces BoxFlatPieces(const std::vector<int64_t>& shape, uint32_t tp, uint32_t zero, size_t dim) {
  if (WholeRegion(shape).num_elements() == 0) return FlatPieces(shape, tp * zero);
  RankPieces boxes = DimPieces(shape, tp, dim);
  RankPieces out(tp * zero);
  for (uint32_t t = 0; t < tp; ++t) {
    for (const Piece& box : boxes[t]) {
      const int64_t n = box.region.num_elements();
      for (uint32_t z = 0; z < zero; ++z) {
        auto [b, e] = EvenPart(n, zero, z);
        if (b == e) continue;
        format::Region r = box.region;  // a range of the box's own range (a flat piece has one too)
        r.flat_begin = box.region.flat_begin + b;
        r.flat_end = box.region.flat_begin + e;
        out[t * zero + z].push_back(Piece{r});
      }
    }
  }
  return out;
}

// Every rank holds the whole tensor as replica r of `world` (data parallelism).
inline RankPieces ReplicatedPieces(const std::vector<int64_t>& shape, uint32_t world) {
  RankPieces out(world);
  const format::Region whole = WholeRegion(shape);
  for (uint32_t r = 0; r < world; ++r) out[r].push_back(Piece{whole, r, world});
  return out;
}

// Tensor parallelism `tp` along dim 0, replicated over `dp` data-parallel groups; rank = dp_i * tp + tp_i.
inline RankPieces TpDpPieces(const std::vector<int64_t>& shape, uint32_t tp, uint32_t dp) {
  if (WholeRegion(shape).num_elements() == 0) return ReplicatedPieces(shape, tp * dp);
  RankPieces boxes = DimPieces(shape, tp, 0);
  RankPieces out(tp * dp);
  for (uint32_t d = 0; d < dp; ++d)
    for (uint32_t t = 0; t < tp; ++t)
      for (const Piece& p : boxes[t]) out[d * tp + t].push_back(Piece{p.region, d, dp});
  return out;
}

inline Layout WholeLayout() {
  return Layout{"whole", 1, [](const std::vector<int64_t>& s) {
                  RankPieces out(1);
                  out[0].push_back(Piece{WholeRegion(s)});
                  return out;
                }};
}
inline Layout DimLayout(uint32_t parts, size_t dim) {
  return Layout{"dim" + std::to_string(dim) + "x" + std::to_string(parts), parts,
                [=](const std::vector<int64_t>& s) { return DimPieces(s, parts, dim); }};
}
inline Layout FlatLayout(uint32_t parts) {
  return Layout{"flat" + std::to_string(parts), parts,
                [=](const std::vector<int64_t>& s) { return FlatPieces(s, parts); }};
}
inline Layout BoxFlatLayout(uint32_t tp, uint32_t zero, size_t dim) {
  return Layout{"boxflat_tp" + std::to_string(tp) + "_zero" + std::to_string(zero) + "_dim" + std::to_string(dim),
                tp * zero, [=](const std::vector<int64_t>& s) { return BoxFlatPieces(s, tp, zero, dim); }};
}
inline Layout ReplicatedLayout(uint32_t world) {
  return Layout{"replicated" + std::to_string(world), world,
                [=](const std::vector<int64_t>& s) { return ReplicatedPieces(s, world); }};
}
inline Layout TpDpLayout(uint32_t tp, uint32_t dp) {
  return Layout{"tp" + std::to_string(tp) + "_dp" + std::to_string(dp), tp * dp,
                [=](const std::vector<int64_t>& s) { return TpDpPieces(s, tp, dp); }};
}

// ---- multi-rank drivers ------------------------------------------------------------------

// The pieces one rank holds: copies of the global data (for saving) or buffers filled with 0xAB
// (for loading), so a byte the load did not write is noticed.
struct RankState {
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<std::pair<size_t, format::Region>> where;  // per buffer: tensor index, region
  std::vector<TensorShard> shards;
};

inline TensorShard ShardOf(const GlobalTensor& t, const Piece& p, void* data) {
  TensorShard s = TensorShard::BoxFlat(t.name, t.dtype, t.shape, p.region.offsets, p.region.shape,
                                       p.region.flat_begin, p.region.flat_end, data);
  s.Replica(p.replica_index, p.replica_count);
  return s;
}

// Builds every rank's pieces of `tensors` under `layout`. With `fill_from_global`, each piece holds
// its data; otherwise each holds 0xAB bytes waiting to be loaded.
inline std::vector<RankState> BuildRanks(const std::vector<GlobalTensor>& tensors, const Layout& layout,
                                         bool fill_from_global) {
  std::vector<RankState> ranks(layout.world_size);
  std::vector<std::vector<Piece>> held(layout.world_size);  // parallel to each rank's buffers
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const GlobalTensor& t = tensors[ti];
    RankPieces pieces = layout.cut(t.shape);
    for (uint32_t r = 0; r < layout.world_size && r < pieces.size(); ++r) {
      for (const Piece& p : pieces[r]) {
        RankState& rs = ranks[r];
        if (fill_from_global) {
          rs.buffers.push_back(Extract(t, p.region));
        } else {
          rs.buffers.emplace_back(static_cast<size_t>(p.region.num_elements()) * t.elem(), 0xAB);
        }
        rs.where.emplace_back(ti, p.region);
        held[r].push_back(p);
      }
    }
  }
  // Shards point into the buffers only once no buffer moves any more.
  for (uint32_t r = 0; r < layout.world_size; ++r) {
    RankState& rs = ranks[r];
    for (size_t k = 0; k < rs.buffers.size(); ++k)
      rs.shards.push_back(ShardOf(tensors[rs.where[k].first], held[r][k],
                                  rs.buffers[k].empty() ? nullptr : rs.buffers[k].data()));
  }
  return ranks;
}

inline std::string ObjectValue(uint32_t rank, uint64_t salt, const std::string& what) {
  return what + "-of-rank-" + std::to_string(rank) + "-salt-" + std::to_string(salt);
}

inline std::string MetadataOf(uint32_t rank, uint64_t salt) {
  return "{\"salt\": " + std::to_string(salt) + ", \"written_by_rank\": " + std::to_string(rank) + "}";
}

inline SaveRequest RequestOf(const RankState& rs, uint32_t rank, uint64_t salt) {
  SaveRequest req;
  req.tensors = rs.shards;
  req.objects.emplace_back("rng", ObjectValue(rank, salt, "rng"));
  req.objects.emplace_back("dataloader", ObjectValue(rank, salt, "dataloader"));
  if (rank % 2 == 1) req.objects.emplace_back("empty-object", std::string());
  req.metadata_json = MetadataOf(rank, salt);
  return req;
}

// Saves `tensors` (contents under `salt`) as step `step` with `layout`, one Checkpointer per rank,
// for the ranks in `which` only (a job that died half-way). With `threads`, the ranks run
// concurrently. Returns each rank's status (OK for ranks not in `which`).
inline std::vector<Status> SaveSomeRanks(const CheckpointerOptions& base, const std::vector<GlobalTensor>& tensors,
                                         const Layout& layout, uint64_t step, uint64_t salt,
                                         const std::vector<uint32_t>& which, bool threads) {
  std::vector<RankState> ranks = BuildRanks(tensors, layout, /*fill_from_global=*/true);
  std::vector<Status> status(layout.world_size);
  auto run = [&](uint32_t r) {
    CheckpointerOptions o = base;
    o.rank = r;
    o.world_size = layout.world_size;
    auto ckpt = Checkpointer::Open(o);
    if (!ckpt.ok()) {
      status[r] = ckpt.status();
      return;
    }
    status[r] = (*ckpt)->Save(step, RequestOf(ranks[r], r, salt)).WaitPersisted();
  };
  if (threads) {
    std::vector<std::thread> ts;
    for (uint32_t r : which) ts.emplace_back(run, r);
    for (std::thread& t : ts) t.join();
  } else {
    for (uint32_t r : which) run(r);
  }
  return status;
}

inline std::vector<uint32_t> RankRange(uint32_t begin, uint32_t end) {
  std::vector<uint32_t> v;
  for (uint32_t r = begin; r < end; ++r) v.push_back(r);
  return v;
}

// Every rank of `layout`.
inline std::vector<Status> SaveAllRanks(const CheckpointerOptions& base, const std::vector<GlobalTensor>& tensors,
                                        const Layout& layout, uint64_t step, uint64_t salt, bool threads) {
  return SaveSomeRanks(base, tensors, layout, step, salt, RankRange(0, layout.world_size), threads);
}

inline bool AllOk(const std::vector<Status>& v) {
  for (const Status& s : v)
    if (!s.ok()) return false;
  return true;
}

inline std::string Describe(const std::vector<Status>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += "rank " + std::to_string(i) + ": " + v[i].ToString() + "\n";
  return out;
}

// Byte positions where `got` differs from what region `r` of `t` should hold, as a short message
// (empty when equal).
inline std::string CompareRegion(const GlobalTensor& t, const format::Region& r, const std::vector<uint8_t>& got) {
  const std::vector<uint8_t> want = Extract(t, r);
  if (want.size() != got.size()) return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      return "tensor '" + t.name + "' differs first at byte " + std::to_string(i) + " of " +
             std::to_string(want.size()) + " (element " + std::to_string(i / t.elem()) + " of the piece)";
    }
  }
  return "";
}

// Loads every tensor of `expected` whole through `ckpt` (step `step`, or the newest) and compares
// it with `expected`. Returns the step loaded, or the load's error; *diff receives the first
// difference (empty when every byte matches).
inline Result<uint64_t> LoadWholeAndCompare(Checkpointer* ckpt, std::optional<uint64_t> step,
                                            const std::vector<GlobalTensor>& expected, std::string* diff) {
  std::vector<std::vector<uint8_t>> bufs;
  LoadRequest req;
  for (const GlobalTensor& t : expected) bufs.emplace_back(t.bytes.size(), 0xAB);
  for (size_t i = 0; i < expected.size(); ++i)
    req.tensors.push_back(TensorShard::Whole(expected[i].name, expected[i].dtype, expected[i].shape,
                                             bufs[i].empty() ? nullptr : bufs[i].data()));
  auto res = ckpt->Load(step, req);
  if (!res.ok()) return res.status();
  diff->clear();
  for (size_t i = 0; i < expected.size() && diff->empty(); ++i)
    *diff = CompareRegion(expected[i], WholeRegion(expected[i].shape), bufs[i]);
  return res->step;
}

}  // namespace lifeline::testing

#endif  // LIFELINE_TESTS_INTEGRATION_TEST_UTIL_H_
