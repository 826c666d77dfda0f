#include "formats/geometry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <tuple>

namespace lifeline::format {
namespace geometry_test {

using ::testing::HasSubstr;
using Shape = std::vector<int64_t>;

int64_t Volume(const Shape& shape) {
  int64_t v = 1;
  for (int64_t e : shape) v *= e;
  return v;
}

// Coordinates (relative to the box) of row-major position p of a box of `shape`.
Shape CoordsOf(const Shape& shape, int64_t p) {
  Shape c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = p % shape[d];
    p /= shape[d];
  }
  return c;
}

int64_t FlatIndex(const Shape& shape, const Shape& coord) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + coord[d];
  return f;
}

// Global coordinates of the region's k-th packed element.
Shape GlobalCoordOf(const Region& r, int64_t k) {
  Shape c = CoordsOf(r.shape, r.flat_begin + k);
  for (size_t d = 0; d < c.size(); ++d) c[d] += r.offsets[d];
  return c;
}

// Global flat indices of a region's elements, in packed order.
std::vector<int64_t> ElementsOf(const Region& r, const Shape& tensor) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < r.num_elements(); ++k) out.push_back(FlatIndex(tensor, GlobalCoordOf(r, k)));
  return out;
}

std::vector<int64_t> ElementsOfBox(const Box& b, const Shape& tensor) {
  std::vector<int64_t> out;
  for (int64_t p = 0; p < b.volume(); ++p) {
    Shape c = CoordsOf(b.extent, p);
    for (size_t d = 0; d < c.size(); ++d) c[d] += b.lo[d];
    out.push_back(FlatIndex(tensor, c));
  }
  return out;
}

bool BoxInside(const Box& inner, const Region& r) {
  for (size_t d = 0; d < inner.lo.size(); ++d) {
    if (inner.extent[d] < 1 || inner.lo[d] < r.offsets[d] ||
        inner.lo[d] + inner.extent[d] > r.offsets[d] + r.shape[d]) {
      return false;
    }
  }
  return true;
}

// ---- random layouts ----

Shape RandomShape(std::mt19937_64& rng, size_t ndim, int64_t max_extent) {
  Shape s(ndim);
  for (auto& e : s) e = std::uniform_int_distribution<int64_t>(1, max_extent)(rng);
  return s;
}

// Sorted distinct cut points in (0, n), about `parts - 1` of them.
std::vector<int64_t> RandomCuts(std::mt19937_64& rng, int64_t n, int64_t parts) {
  std::set<int64_t> cuts;
  if (n > 1) {
    std::uniform_int_distribution<int64_t> pick(1, n - 1);
    for (int64_t i = 0; i + 1 < parts && static_cast<int64_t>(cuts.size()) < n - 1; ++i) {
      cuts.insert(pick(rng));
    }
  }
  return {cuts.begin(), cuts.end()};
}

std::vector<Region> RangesOf(const Region& whole, const std::vector<int64_t>& cuts) {
  std::vector<Region> out;
  int64_t prev = 0;
  for (int64_t c : cuts) {
    out.push_back(SubRegion(whole, prev, c));
    prev = c;
  }
  out.push_back(SubRegion(whole, prev, whole.num_elements()));
  return out;
}

// Recursive random bisection of the tensor into about `parts` boxes.
std::vector<Region> RandomBoxPartition(std::mt19937_64& rng, const Shape& shape, int parts) {
  std::vector<Box> boxes{Box{Shape(shape.size(), 0), shape}};
  for (int attempt = 0; attempt < parts * 4 && static_cast<int>(boxes.size()) < parts; ++attempt) {
    size_t i = std::uniform_int_distribution<size_t>(0, boxes.size() - 1)(rng);
    size_t d = std::uniform_int_distribution<size_t>(0, shape.size() - 1)(rng);
    Box b = boxes[i];
    if (b.extent[d] < 2) continue;
    int64_t cut = std::uniform_int_distribution<int64_t>(1, b.extent[d] - 1)(rng);
    Box other = b;
    b.extent[d] = cut;
    other.lo[d] += cut;
    other.extent[d] -= cut;
    boxes[i] = b;
    boxes.push_back(other);
  }
  std::shuffle(boxes.begin(), boxes.end(), rng);
  std::vector<Region> out;
  for (const Box& b : boxes) out.push_back(RegionOfBox(b.lo, b.extent));
  return out;
}

// Boundaries extent*i/parts: uneven when parts does not divide the extent.
std::vector<Region> SplitAlong(const Shape& shape, size_t dim, int64_t parts) {
  std::vector<Region> out;
  for (int64_t i = 0; i < parts; ++i) {
    Shape off(shape.size(), 0), ext = shape;
    off[dim] = shape[dim] * i / parts;
    ext[dim] = shape[dim] * (i + 1) / parts - off[dim];
    out.push_back(RegionOfBox(off, ext));
  }
  return out;
}

std::vector<Region> EvenFlat(const Shape& shape, int64_t parts) {
  Region whole = RegionOfBox(Shape(shape.size(), 0), shape);
  std::vector<Region> out;
  const int64_t n = whole.num_elements();
  for (int64_t i = 0; i < parts; ++i) out.push_back(SubRegion(whole, n * i / parts, n * (i + 1) / parts));
  return out;
}

enum class Layout { kBoxes, kFlat, kFlatOfBoxes, kSlabs, kArbitrary };

// A random layout of the tensor; every kind but kArbitrary partitions it.
std::vector<Region> RandomLayout(std::mt19937_64& rng, const Shape& shape, Layout kind, int parts) {
  const Region whole = RegionOfBox(Shape(shape.size(), 0), shape);
  switch (kind) {
    case Layout::kBoxes:
      return RandomBoxPartition(rng, shape, parts);
    case Layout::kFlat:
      return RangesOf(whole, RandomCuts(rng, whole.num_elements(), parts));
    case Layout::kFlatOfBoxes: {
      std::vector<Region> out;
      for (const Region& box : RandomBoxPartition(rng, shape, std::max(1, parts / 3))) {
        for (const Region& r : RangesOf(box, RandomCuts(rng, box.num_elements(), 3))) out.push_back(r);
      }
      return out;
    }
    case Layout::kSlabs: {
      size_t dim = std::uniform_int_distribution<size_t>(0, shape.size() - 1)(rng);
      return SplitAlong(shape, dim, std::uniform_int_distribution<int64_t>(1, parts)(rng));
    }
    case Layout::kArbitrary: {
      std::vector<Region> out;
      for (int i = 0; i < parts; ++i) {
        Region r;
        for (int64_t e : shape) {
          int64_t lo = std::uniform_int_distribution<int64_t>(0, e - 1)(rng);
          r.offsets.push_back(lo);
          r.shape.push_back(std::uniform_int_distribution<int64_t>(1, e - lo)(rng));
        }
        int64_t v = Volume(r.shape);
        r.flat_begin = std::uniform_int_distribution<int64_t>(0, v)(rng);
        r.flat_end = std::uniform_int_distribution<int64_t>(r.flat_begin, v)(rng);
        out.push_back(r);
      }
      return out;
    }
  }
  return {};
}

// ---- CheckedVolume, ValidateRegion, small helpers ----

TEST(GeometryTest, Volumes) {
  int64_t v = -1;
  EXPECT_TRUE(CheckedVolume({}, &v));
  EXPECT_EQ(v, 1);
  EXPECT_TRUE(CheckedVolume({2, 3, 7}, &v));
  EXPECT_EQ(v, 42);
  EXPECT_TRUE(CheckedVolume({INT64_MAX, INT64_MAX, 0}, &v));
  EXPECT_EQ(v, 0);
  EXPECT_FALSE(CheckedVolume({3, -1}, &v));
  EXPECT_FALSE(CheckedVolume({0, -1}, &v));
  EXPECT_FALSE(CheckedVolume({INT64_MAX, 2}, &v));
  EXPECT_FALSE(CheckedVolume({1LL << 32, 1LL << 32}, &v));
  EXPECT_EQ((Box{{}, {}}.volume()), 1);
  EXPECT_EQ((Box{{1, 2}, {3, 4}}.volume()), 12);
}

TEST(GeometryTest, RegionOfBoxAndSubRegion) {
  Region r = RegionOfBox({2, 0}, {3, 4});
  EXPECT_EQ(r, (Region{{2, 0}, {3, 4}, 0, 12}));
  Region sub = SubRegion(r, 5, 9);
  EXPECT_EQ(sub, (Region{{2, 0}, {3, 4}, 5, 9}));
  EXPECT_EQ(SubRegion(sub, 1, 3), (Region{{2, 0}, {3, 4}, 6, 8}));
  EXPECT_EQ(RegionOfBox({}, {}), (Region{{}, {}, 0, 1}));
}

TEST(GeometryTest, ValidateRegionAcceptsGoodRegions) {
  EXPECT_TRUE(ValidateRegion(Region{{}, {}, 0, 1}, {}, "scalar", false).ok());
  EXPECT_TRUE(ValidateRegion(Region{{0, 0}, {4, 5}, 0, 20}, {4, 5}, "t", false).ok());
  EXPECT_TRUE(ValidateRegion(Region{{1, 2}, {3, 3}, 4, 4}, {4, 5}, "t", true).ok());
  EXPECT_TRUE(ValidateRegion(Region{{4, 0}, {0, 5}, 0, 0}, {4, 5}, "t", true).ok());
  EXPECT_TRUE(ValidateRegion(Region{{0}, {0}, 0, 0}, {0}, "empty", true).ok());
}

TEST(GeometryTest, ValidateRegionRejectsEachKindOfBadRegion) {
  struct Case {
    Region region;
    Shape tensor;
    std::vector<std::string> mentions;
  };
  const Shape big_rank(kMaxRank + 1, 1);
  const std::vector<Case> cases = {
      {Region{{0}, {4}, 0, 4}, {4, 5}, {"1 offsets", "2 dimensions"}},
      {Region{{0, 0}, {4}, 0, 4}, {4, 5}, {"1 extents"}},
      {Region{big_rank, big_rank, 0, 1}, big_rank, {"33 dimensions", "32"}},
      {Region{{0, -1}, {4, 2}, 0, 8}, {4, 5}, {"offset -1", "dimension 1"}},
      {Region{{0, 0}, {-2, 5}, 0, 0}, {4, 5}, {"extent -2", "dimension 0"}},
      {Region{{0, 3}, {4, 3}, 0, 12}, {4, 5}, {"offset 3 + extent 3", "tensor extent 5", "dimension 1"}},
      {Region{{INT64_MAX}, {2}, 0, 2}, {INT64_MAX}, {"exceeds", "9223372036854775807"}},
      {Region{{0, 0}, {1LL << 62, 4}, 0, 0}, {1LL << 62, 4}, {"overflows"}},
      {Region{{0, 0}, {2, 3}, -1, 2}, {4, 5}, {"[-1, 2)", "6 elements"}},
      {Region{{0, 0}, {2, 3}, 3, 2}, {4, 5}, {"[3, 2)"}},
      {Region{{0, 0}, {2, 3}, 0, 7}, {4, 5}, {"[0, 7)", "6 elements"}},
      {Region{{0, 0}, {0, 0}, 0, 0}, {-4, 5}, {"tensor extent -4"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.mentions));
    Status trusted = ValidateRegion(c.region, c.tensor, "tensor 'w.q' fragment 7", false);
    ASSERT_FALSE(trusted.ok());
    EXPECT_EQ(trusted.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(trusted.message(), HasSubstr("tensor 'w.q' fragment 7"));
    for (const std::string& m : c.mentions) EXPECT_THAT(trusted.message(), HasSubstr(m));
    Status untrusted = ValidateRegion(c.region, c.tensor, "index-r00003", true);
    EXPECT_TRUE(untrusted.IsCorruption()) << untrusted.ToString();
    EXPECT_THAT(untrusted.message(), HasSubstr("index-r00003"));
  }
}

TEST(GeometryTest, IntersectAndPackedOffset) {
  Box out{{9}, {9}};
  EXPECT_FALSE(Intersect(Box{{0, 0}, {2, 2}}, Box{{2, 0}, {2, 2}}, &out));
  EXPECT_EQ(out, (Box{{9}, {9}}));  // untouched
  ASSERT_TRUE(Intersect(Box{{0, 1}, {4, 3}}, Box{{2, 0}, {5, 2}}, &out));
  EXPECT_EQ(out, (Box{{2, 1}, {2, 1}}));
  ASSERT_TRUE(Intersect(Box{{}, {}}, Box{{}, {}}, &out));
  EXPECT_EQ(out, (Box{{}, {}}));

  Region r{{2, 3}, {4, 5}, 7, 20};  // box rows 2..5, cols 3..7; packed from box position 7
  int64_t c1[] = {3, 5};            // box position 1*5 + 2 = 7
  int64_t c2[] = {5, 6};            // box position 3*5 + 3 = 18
  EXPECT_EQ(PackedOffsetOf(r, c1), 0);
  EXPECT_EQ(PackedOffsetOf(r, c2), 11);
  EXPECT_EQ(PackedOffsetOf(Region{{}, {}, 0, 1}, nullptr), 0);
}

// ---- DecomposeRegion ----

TEST(GeometryTest, DecomposeRegionClassicShape) {
  // Elements [3, 17) of a 4x5 box at (10, 20): the rest of row 0, rows 1-2, the start of row 3.
  std::vector<Box> boxes;
  DecomposeRegion(Region{{10, 20}, {4, 5}, 3, 17}, &boxes);
  EXPECT_EQ(boxes, (std::vector<Box>{Box{{10, 23}, {1, 2}}, Box{{11, 20}, {2, 5}}, Box{{13, 20}, {1, 2}}}));

  boxes.clear();
  DecomposeRegion(Region{{0, 0}, {4, 5}, 0, 20}, &boxes);
  EXPECT_EQ(boxes, (std::vector<Box>{Box{{0, 0}, {4, 5}}}));

  boxes.clear();
  DecomposeRegion(Region{{0, 0}, {4, 5}, 6, 6}, &boxes);
  EXPECT_TRUE(boxes.empty());

  DecomposeRegion(Region{{}, {}, 0, 1}, &boxes);
  EXPECT_EQ(boxes, (std::vector<Box>{Box{{}, {}}}));
  boxes.clear();
  DecomposeRegion(Region{{}, {}, 0, 0}, &boxes);
  EXPECT_TRUE(boxes.empty());
}

TEST(GeometryTest, DecomposeRegionCoversExactlyTheRange) {
  std::mt19937_64 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    const size_t ndim = 1 + iter % 4;
    const Shape tensor = RandomShape(rng, ndim, 6);
    const Region r = RandomLayout(rng, tensor, Layout::kArbitrary, 1)[0];
    SCOPED_TRACE(::testing::PrintToString(r.offsets) + ::testing::PrintToString(r.shape) + " [" +
                 std::to_string(r.flat_begin) + ", " + std::to_string(r.flat_end) + ")");
    std::vector<Box> boxes;
    DecomposeRegion(r, &boxes);
    ASSERT_LE(boxes.size(), 2 * ndim - 1);
    std::vector<int64_t> covered;
    for (const Box& b : boxes) {
      ASSERT_TRUE(BoxInside(b, r));
      for (int64_t e : ElementsOfBox(b, tensor)) covered.push_back(e);
    }
    std::vector<int64_t> expected = ElementsOf(r, tensor);
    std::sort(covered.begin(), covered.end());
    std::sort(expected.begin(), expected.end());
    // Equal sorted lists: same union, and no element covered twice (the boxes are disjoint).
    ASSERT_EQ(covered, expected);
  }
}

// ---- CopyBox ----

std::vector<unsigned char> FillRegion(const Region& r, const Shape& tensor, size_t elem_size) {
  std::vector<unsigned char> buf(r.num_elements() * elem_size);
  for (int64_t k = 0; k < r.num_elements(); ++k) {
    const int64_t g = FlatIndex(tensor, GlobalCoordOf(r, k));
    for (size_t b = 0; b < elem_size; ++b) buf[k * elem_size + b] = static_cast<unsigned char>(g * 31 + b * 7 + 1);
  }
  return buf;
}

void ReferenceCopy(const Box& box, size_t elem_size, const unsigned char* src, const Region& sr,
                   unsigned char* dst, const Region& dr) {
  for (int64_t p = 0; p < box.volume(); ++p) {
    Shape c = CoordsOf(box.extent, p);
    for (size_t d = 0; d < c.size(); ++d) c[d] += box.lo[d];
    std::memcpy(dst + PackedOffsetOf(dr, c.data()) * elem_size, src + PackedOffsetOf(sr, c.data()) * elem_size,
                elem_size);
  }
}

// A random non-empty box inside `b`.
Box RandomSubBox(std::mt19937_64& rng, const Box& b) {
  Box s = b;
  for (size_t d = 0; d < b.lo.size(); ++d) {
    if (rng() % 2) continue;  // keep the full extent often, so dimensions can coalesce
    int64_t lo = std::uniform_int_distribution<int64_t>(0, b.extent[d] - 1)(rng);
    s.lo[d] = b.lo[d] + lo;
    s.extent[d] = std::uniform_int_distribution<int64_t>(1, b.extent[d] - lo)(rng);
  }
  return s;
}

TEST(GeometryTest, CopyBoxMatchesElementwiseCopy) {
  std::mt19937_64 rng(99);
  const size_t kElemSizes[] = {1, 2, 3, 4, 8, 16};
  int copies = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    const size_t ndim = 1 + iter % 6;  // 5-d and 6-d boxes reach the general odometer loop
    const Shape tensor = RandomShape(rng, ndim, ndim > 4 ? 4 : 7);
    const Region whole = RegionOfBox(Shape(ndim, 0), tensor);
    auto random_region = [&]() {
      switch (rng() % 4) {
        case 0: return whole;
        case 1: {
          int64_t b = std::uniform_int_distribution<int64_t>(0, whole.num_elements() - 1)(rng);
          return SubRegion(whole, b, std::uniform_int_distribution<int64_t>(b + 1, whole.num_elements())(rng));
        }
        case 2: {
          Region r = RandomLayout(rng, tensor, Layout::kArbitrary, 1)[0];
          return RegionOfBox(r.offsets, r.shape);
        }
        default: return RandomLayout(rng, tensor, Layout::kArbitrary, 1)[0];
      }
    };
    const Region src_region = random_region();
    const Region dst_region = (rng() % 4 == 0) ? src_region : random_region();
    std::vector<Overlap> overlaps;
    PlanOverlaps({src_region}, {dst_region}, &overlaps);
    for (const Overlap& o : overlaps) {
      const Box box = RandomSubBox(rng, o.box);
      const size_t es = kElemSizes[rng() % std::size(kElemSizes)];
      SCOPED_TRACE("iter " + std::to_string(iter) + " elem " + std::to_string(es));
      const std::vector<unsigned char> src = FillRegion(src_region, tensor, es);
      std::vector<unsigned char> got(dst_region.num_elements() * es, 0xEE);
      std::vector<unsigned char> want = got;
      CopyBox(box, es, src.data(), src_region, got.data(), dst_region);
      ReferenceCopy(box, es, src.data(), src_region, want.data(), dst_region);
      ASSERT_EQ(got, want);
      ++copies;
    }
  }
  EXPECT_GT(copies, 1000);
}

TEST(GeometryTest, CopyBoxOfWholeLayouts) {
  // Same layout on both sides: the whole range is one contiguous run.
  const Shape tensor{6, 5, 4};
  const Region r{{1, 0, 0}, {4, 5, 4}, 3, 70};
  std::vector<unsigned char> src = FillRegion(r, tensor, 4);
  std::vector<Box> boxes;
  DecomposeRegion(r, &boxes);
  std::vector<unsigned char> dst(src.size(), 0);
  for (const Box& b : boxes) CopyBox(b, 4, src.data(), r, dst.data(), r);
  EXPECT_EQ(dst, src);

  // A higher-rank column slab into a narrower box: runs of the inner row only.
  const Region wide = RegionOfBox({0, 0, 0}, tensor);
  const Region narrow = RegionOfBox({0, 2, 1}, {6, 3, 2});
  std::vector<unsigned char> wsrc = FillRegion(wide, tensor, 8);
  std::vector<unsigned char> got(narrow.num_elements() * 8, 0);
  CopyBox(Box{narrow.offsets, narrow.shape}, 8, wsrc.data(), wide, got.data(), narrow);
  EXPECT_EQ(got, FillRegion(narrow, tensor, 8));

  // 0-d.
  const Region scalar{{}, {}, 0, 1};
  const double value = 2.5;
  double out = 0;
  CopyBox(Box{{}, {}}, sizeof(double), &value, scalar, &out, scalar);
  EXPECT_EQ(out, 2.5);
}

// ---- PlanOverlaps ----

bool OverlapLess(const Overlap& a, const Overlap& b) {
  return std::tie(a.source, a.target, a.box.lo, a.box.extent) < std::tie(b.source, b.target, b.box.lo, b.box.extent);
}

// Every pair of pieces of every (source, target) pair.
std::vector<Overlap> AllPairsPlan(const std::vector<Region>& sources, const std::vector<Region>& targets) {
  std::vector<Overlap> out;
  for (size_t s = 0; s < sources.size(); ++s) {
    std::vector<Box> sb;
    DecomposeRegion(sources[s], &sb);
    for (size_t t = 0; t < targets.size(); ++t) {
      std::vector<Box> tb;
      DecomposeRegion(targets[t], &tb);
      for (const Box& a : sb) {
        for (const Box& b : tb) {
          Overlap o;
          o.source = static_cast<uint32_t>(s);
          o.target = static_cast<uint32_t>(t);
          if (Intersect(a, b, &o.box)) out.push_back(o);
        }
      }
    }
  }
  return out;
}

// (source, target, element) for every element in both, from membership alone.
std::vector<std::tuple<uint32_t, uint32_t, int64_t>> ElementPairs(const std::vector<Region>& sources,
                                                                  const std::vector<Region>& targets,
                                                                  const Shape& tensor) {
  std::map<int64_t, std::vector<uint32_t>> holders;
  for (size_t s = 0; s < sources.size(); ++s) {
    for (int64_t e : ElementsOf(sources[s], tensor)) holders[e].push_back(static_cast<uint32_t>(s));
  }
  std::vector<std::tuple<uint32_t, uint32_t, int64_t>> out;
  for (size_t t = 0; t < targets.size(); ++t) {
    for (int64_t e : ElementsOf(targets[t], tensor)) {
      for (uint32_t s : holders[e]) out.emplace_back(s, static_cast<uint32_t>(t), e);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void CheckPlan(const std::vector<Region>& sources, const std::vector<Region>& targets, const Shape& tensor,
               bool sources_partition) {
  std::vector<Overlap> plan;
  PlanOverlaps(sources, targets, &plan);
  ASSERT_TRUE(std::is_sorted(plan.begin(), plan.end(), [](const Overlap& a, const Overlap& b) {
    return std::tie(a.source, a.target) < std::tie(b.source, b.target);
  }));
  std::vector<Overlap> got = plan, want = AllPairsPlan(sources, targets);
  std::sort(got.begin(), got.end(), OverlapLess);
  std::sort(want.begin(), want.end(), OverlapLess);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].source, want[i].source);
    ASSERT_EQ(got[i].target, want[i].target);
    ASSERT_EQ(got[i].box, want[i].box);
  }

  std::vector<std::tuple<uint32_t, uint32_t, int64_t>> elements;
  std::vector<int64_t> per_target(targets.size(), 0);
  for (const Overlap& o : plan) {
    for (int64_t e : ElementsOfBox(o.box, tensor)) elements.emplace_back(o.source, o.target, e);
    per_target[o.target] += o.box.volume();
  }
  std::sort(elements.begin(), elements.end());
  ASSERT_EQ(elements, ElementPairs(sources, targets, tensor));
  if (sources_partition) {
    for (size_t t = 0; t < targets.size(); ++t) ASSERT_EQ(per_target[t], targets[t].num_elements()) << "target " << t;
  }
}

TEST(GeometryTest, PlanOverlapsMatchesBruteForce) {
  std::mt19937_64 rng(7);
  const Layout kinds[] = {Layout::kBoxes, Layout::kFlat, Layout::kFlatOfBoxes, Layout::kSlabs, Layout::kArbitrary};
  for (int iter = 0; iter < 400; ++iter) {
    const size_t ndim = 1 + iter % 4;
    const Shape tensor = RandomShape(rng, ndim, ndim == 1 ? 60 : 8);
    const Layout sk = kinds[rng() % std::size(kinds)];
    const Layout tk = kinds[rng() % std::size(kinds)];
    const std::vector<Region> sources = RandomLayout(rng, tensor, sk, 1 + rng() % 30);
    const std::vector<Region> targets = RandomLayout(rng, tensor, tk, 1 + rng() % 30);
    SCOPED_TRACE("iter " + std::to_string(iter) + " tensor " + ::testing::PrintToString(tensor) + " kinds " +
                 std::to_string(static_cast<int>(sk)) + "->" + std::to_string(static_cast<int>(tk)));
    CheckPlan(sources, targets, tensor, sk != Layout::kArbitrary);
  }
}

TEST(GeometryTest, PlanOverlapsEdgeCases) {
  std::vector<Overlap> plan;
  PlanOverlaps({}, {Region{{0}, {4}, 0, 4}}, &plan);
  EXPECT_TRUE(plan.empty());
  // An empty tensor has nothing to match.
  PlanOverlaps({Region{{0, 0}, {0, 3}, 0, 0}}, {Region{{0, 0}, {0, 3}, 0, 0}}, &plan);
  EXPECT_TRUE(plan.empty());
  // 0-d: every non-empty source with every non-empty target, including replicas.
  const Region scalar{{}, {}, 0, 1};
  const Region none{{}, {}, 0, 0};
  PlanOverlaps({scalar, none, scalar}, {scalar, scalar}, &plan);
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].source, 0u);
  EXPECT_EQ(plan[0].target, 0u);
  EXPECT_EQ(plan[1].target, 1u);
  EXPECT_EQ(plan[3].source, 2u);
  EXPECT_EQ(plan[3].box, (Box{{}, {}}));
  // One (source, target) pair meeting in several pieces reports each.
  plan.clear();
  PlanOverlaps({Region{{0, 0}, {4, 5}, 3, 17}}, {RegionOfBox({0, 0}, {4, 3})}, &plan);
  // Row 0's piece (cols 3-4) misses; rows 1-2 and row 3's first two columns meet separately.
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].box, (Box{{1, 0}, {2, 3}}));
  EXPECT_EQ(plan[1].box, (Box{{3, 0}, {1, 2}}));
}

// ---- reshard round trip ----

// Copies a tensor of distinct values through `sources` into `targets` with the planner's
// overlaps and checks that every target element arrived.
void RoundTrip(const Shape& tensor, const std::vector<Region>& sources, const std::vector<Region>& targets) {
  std::vector<std::vector<int64_t>> src(sources.size()), dst(targets.size());
  for (size_t s = 0; s < sources.size(); ++s) src[s] = ElementsOf(sources[s], tensor);
  for (size_t t = 0; t < targets.size(); ++t) dst[t].assign(targets[t].num_elements(), -1);
  std::vector<Overlap> plan;
  PlanOverlaps(sources, targets, &plan);
  for (const Overlap& o : plan) {
    CopyBox(o.box, sizeof(int64_t), src[o.source].data(), sources[o.source], dst[o.target].data(),
            targets[o.target]);
  }
  for (size_t t = 0; t < targets.size(); ++t) EXPECT_EQ(dst[t], ElementsOf(targets[t], tensor)) << "target " << t;
}

TEST(GeometryTest, ReshardRoundTrips) {
  const Shape m{13, 17};
  {
    SCOPED_TRACE("dim 0: 3 -> 5, 6 -> 4");
    RoundTrip(m, SplitAlong(m, 0, 3), SplitAlong(m, 0, 5));
    RoundTrip(m, SplitAlong(m, 0, 6), SplitAlong(m, 0, 4));
  }
  {
    SCOPED_TRACE("dim 1: 3 -> 5, 6 -> 4");
    RoundTrip(m, SplitAlong(m, 1, 3), SplitAlong(m, 1, 5));
    RoundTrip(m, SplitAlong(m, 1, 6), SplitAlong(m, 1, 4));
  }
  {
    SCOPED_TRACE("dim 0 -> dim 1");
    RoundTrip(m, SplitAlong(m, 0, 3), SplitAlong(m, 1, 5));
  }
  {
    SCOPED_TRACE("flat -> box, box -> flat");
    RoundTrip(m, EvenFlat(m, 3), SplitAlong(m, 1, 5));
    RoundTrip(m, SplitAlong(m, 0, 6), EvenFlat(m, 4));
    RoundTrip(m, EvenFlat(m, 7), EvenFlat(m, 5));
  }
  {
    SCOPED_TRACE("flat shards of tensor-parallel pieces, regrouped");
    std::vector<Region> zero_of_tp, other;
    for (const Region& piece : SplitAlong(m, 1, 2)) {
      for (int64_t i = 0; i < 3; ++i) {
        const int64_t n = piece.num_elements();
        zero_of_tp.push_back(SubRegion(piece, n * i / 3, n * (i + 1) / 3));
      }
    }
    for (const Region& piece : SplitAlong(m, 0, 4)) {
      const int64_t n = piece.num_elements();
      other.push_back(SubRegion(piece, 0, n / 2));
      other.push_back(SubRegion(piece, n / 2, n));
    }
    RoundTrip(m, zero_of_tp, other);
    RoundTrip(m, other, zero_of_tp);
  }
  {
    SCOPED_TRACE("3-d, split along the last dimension");
    const Shape t{5, 6, 7};
    RoundTrip(t, SplitAlong(t, 2, 3), SplitAlong(t, 2, 5));
    RoundTrip(t, SplitAlong(t, 2, 4), EvenFlat(t, 6));
  }
  {
    SCOPED_TRACE("0-d, replicated source");
    const Region scalar{{}, {}, 0, 1};
    RoundTrip({}, {scalar, scalar}, {scalar, scalar, scalar});
  }
}

// ---- scale ----

TEST(GeometryTest, PlanOverlapsScalesToManyFlatPieces) {
  // 100,000 flat shards re-cut into 100,000 others: a quadratic planner would need 10^10 checks.
  std::mt19937_64 rng(2024);
  const Shape tensor{1'000'000'000};
  const Region whole = RegionOfBox({0}, tensor);
  const std::vector<int64_t> scuts = RandomCuts(rng, tensor[0], 100'000);
  const std::vector<int64_t> tcuts = RandomCuts(rng, tensor[0], 100'000);
  const std::vector<Region> sources = RangesOf(whole, scuts);
  const std::vector<Region> targets = RangesOf(whole, tcuts);
  std::vector<Overlap> plan;
  PlanOverlaps(sources, targets, &plan);

  std::set<int64_t> all_cuts(scuts.begin(), scuts.end());
  all_cuts.insert(tcuts.begin(), tcuts.end());
  ASSERT_EQ(plan.size(), all_cuts.size() + 1);
  std::vector<int64_t> per_target(targets.size(), 0);
  for (const Overlap& o : plan) per_target[o.target] += o.box.extent[0];
  for (size_t t = 0; t < targets.size(); ++t) ASSERT_EQ(per_target[t], targets[t].num_elements());
}

TEST(GeometryTest, PlanOverlapsScalesToGridsAndFlatRanges) {
  // A 300x300 grid of tensor-parallel boxes against 100,000 flat shards, and against another grid.
  std::mt19937_64 rng(5);
  const Shape tensor{3000, 3001};
  std::vector<Region> grid, other_grid;
  for (int64_t i = 0; i < 300; ++i) {
    for (int64_t j = 0; j < 300; ++j) {
      grid.push_back(RegionOfBox({i * 10, j * 3001 / 300}, {10, (j + 1) * 3001 / 300 - j * 3001 / 300}));
    }
  }
  for (int64_t i = 0; i < 250; ++i) {
    for (int64_t j = 0; j < 350; ++j) {
      other_grid.push_back(
          RegionOfBox({i * 12, j * 3001 / 350}, {12, (j + 1) * 3001 / 350 - j * 3001 / 350}));
    }
  }
  const Region whole = RegionOfBox({0, 0}, tensor);
  const std::vector<Region> flat = RangesOf(whole, RandomCuts(rng, whole.num_elements(), 100'000));

  using Layouts = const std::vector<Region>*;
  const std::pair<Layouts, Layouts> cases[] = {{&grid, &flat}, {&flat, &grid}, {&grid, &other_grid}};
  for (const auto& [sources, targets] : cases) {
    std::vector<Overlap> plan;
    PlanOverlaps(*sources, *targets, &plan);
    std::vector<int64_t> per_target(targets->size(), 0);
    for (const Overlap& o : plan) {
      ASSERT_TRUE(BoxInside(o.box, (*sources)[o.source]));
      ASSERT_TRUE(BoxInside(o.box, (*targets)[o.target]));
      per_target[o.target] += o.box.volume();
    }
    for (size_t t = 0; t < targets->size(); ++t) ASSERT_EQ(per_target[t], (*targets)[t].num_elements());
  }
}

}  // namespace geometry_test
}  // namespace lifeline::format
