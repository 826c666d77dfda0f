#include "formats/geometry.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>
#include <string>
#include <tuple>

namespace lifeline::format {
namespace {

// Per-dimension scratch space: on the stack for every valid rank, on the heap only for ranks
// beyond kMaxRank (which ValidateRegion rejects), so out-of-contract input cannot overrun it.
class DimScratch {
 public:
  explicit DimScratch(size_t n) {
    if (n > kMaxRank) heap_.resize(n);
  }
  int64_t* data() { return heap_.empty() ? stack_.data() : heap_.data(); }

 private:
  std::array<int64_t, kMaxRank> stack_;
  std::vector<int64_t> heap_;
};


// Calls emit(lo, extent) for each box of the classic decomposition of the region's row-major
// range: partial pieces climbing from the innermost dimension until the cursor is aligned to a
// block that also holds the end, one middle block, then partial pieces descending to the end.
// `lo` is in global coordinates; both pointers are null for a 0-d region.
template <typename Emit>
void ForEachPiece(const Region& r, Emit&& emit) {
  const int64_t b = r.flat_begin;
  const int64_t e = r.flat_end;
  if (b >= e) return;
  const size_t n = r.shape.size();
  if (n == 0) {
    emit(static_cast<const int64_t*>(nullptr), static_cast<const int64_t*>(nullptr));
    return;
  }
  DimScratch stride_buf(n), lo_buf(n), ext_buf(n);
  int64_t* stride = stride_buf.data();
  int64_t* lo = lo_buf.data();
  int64_t* ext = ext_buf.data();
  const int64_t* shape = r.shape.data();
  const int64_t* off = r.offsets.data();
  stride[n - 1] = 1;
  for (size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];

  // The piece whose first element is box position `pos`: dimensions before `level` fixed at
  // pos's coordinates, `count` steps along `level`, later dimensions whole.
  auto emit_level = [&](size_t level, int64_t pos, int64_t count) {
    for (size_t d = 0; d < n; ++d) {
      if (d <= level) {
        lo[d] = off[d] + (pos / stride[d]) % shape[d];
        ext[d] = (d == level) ? count : 1;
      } else {
        lo[d] = off[d];
        ext[d] = shape[d];
      }
    }
    emit(static_cast<const int64_t*>(lo), static_cast<const int64_t*>(ext));
  };

  int64_t cur = b;
  size_t level = 0;
  // Invariant at the top of iteration d: cur is a multiple of stride[d].
  for (size_t d = n - 1; d >= 1; --d) {
    const int64_t block = stride[d - 1];
    if (cur % block == 0) continue;
    const int64_t next = (cur / block + 1) * block;
    if (next > e) {
      level = d;
      break;
    }
    emit_level(d, cur, (next - cur) / stride[d]);
    cur = next;
    if (cur == e) return;
  }
  const int64_t mid_end = e / stride[level] * stride[level];
  if (mid_end > cur) {
    emit_level(level, cur, (mid_end - cur) / stride[level]);
    cur = mid_end;
  }
  for (size_t d = level + 1; d < n && cur < e; ++d) {
    const int64_t tail_end = e / stride[d] * stride[d];
    if (tail_end > cur) {
      emit_level(d, cur, (tail_end - cur) / stride[d]);
      cur = tail_end;
    }
  }
  assert(cur == e);
}

// The decomposed pieces of many regions, flattened: piece i spans [lo[i*ndim+d], hi[i*ndim+d]).
struct PieceSet {
  size_t ndim = 0;
  std::vector<int64_t> lo;
  std::vector<int64_t> hi;
  std::vector<uint32_t> owner;  // index of the region the piece came from

  size_t size() const { return owner.size(); }
  const int64_t* Lo(size_t i) const { return lo.data() + i * ndim; }
  const int64_t* Hi(size_t i) const { return hi.data() + i * ndim; }

  // Regions of another rank cannot belong to the tensor and are skipped.
  void AddAll(const std::vector<Region>& regions) {
    for (size_t r = 0; r < regions.size(); ++r) {
      const Region& region = regions[r];
      if (region.shape.size() != ndim || region.offsets.size() != ndim) continue;
      ForEachPiece(region, [&](const int64_t* l, const int64_t* ext) {
        for (size_t d = 0; d < ndim; ++d) {
          lo.push_back(l[d]);
          hi.push_back(l[d] + ext[d]);
        }
        owner.push_back(static_cast<uint32_t>(r));
      });
    }
  }
};

inline bool BoxesOverlap(const int64_t* alo, const int64_t* ahi, const int64_t* blo,
                         const int64_t* bhi, size_t ndim) {
  for (size_t d = 0; d < ndim; ++d) {
    if (alo[d] >= bhi[d] || blo[d] >= ahi[d]) return false;
  }
  return true;
}

// A static bounding-volume tree (a k-d tree over box centres) on the source pieces. Each node
// covers a contiguous slice of `order` and stores the bounding box of its pieces; inner nodes
// split their slice at the median centre along the dimension where centres spread most.
class PieceTree {
 public:
  explicit PieceTree(const PieceSet& pieces) : p_(pieces) {
    order_.resize(p_.size());
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    if (!order_.empty()) Build(0, order_.size());
  }

  // Calls visit(piece) for every piece whose box overlaps [lo, hi). `stack` is caller-owned
  // scratch so repeated queries do not allocate.
  template <typename Visit>
  void Query(const int64_t* lo, const int64_t* hi, std::vector<size_t>* stack, Visit&& visit) const {
    if (nodes_.empty()) return;
    const size_t nd = p_.ndim;
    stack->clear();
    stack->push_back(0);
    while (!stack->empty()) {
      const size_t id = stack->back();
      stack->pop_back();
      if (!BoxesOverlap(box_lo_.data() + id * nd, box_hi_.data() + id * nd, lo, hi, nd)) continue;
      const Node& node = nodes_[id];
      if (node.left == kLeaf) {
        for (size_t k = node.begin; k < node.end; ++k) {
          const size_t piece = order_[k];
          if (BoxesOverlap(p_.Lo(piece), p_.Hi(piece), lo, hi, nd)) visit(piece);
        }
      } else {
        stack->push_back(node.right);
        stack->push_back(node.left);
      }
    }
  }

 private:
  static constexpr size_t kLeaf = static_cast<size_t>(-1);
  static constexpr size_t kLeafPieces = 8;

  struct Node {
    size_t begin, end;
    size_t left = kLeaf, right = kLeaf;
  };

  size_t Build(size_t begin, size_t end) {
    const size_t nd = p_.ndim;
    const size_t id = nodes_.size();
    nodes_.push_back(Node{begin, end});
    box_lo_.resize(box_lo_.size() + nd);
    box_hi_.resize(box_hi_.size() + nd);
    DimScratch cmin_buf(nd), cmax_buf(nd), ext_buf(nd);
    int64_t* cmin = cmin_buf.data();
    int64_t* cmax = cmax_buf.data();
    int64_t* ext_sum = ext_buf.data();  // saturating: only its magnitude matters
    int64_t* blo = box_lo_.data() + id * nd;
    int64_t* bhi = box_hi_.data() + id * nd;
    for (size_t d = 0; d < nd; ++d) {
      blo[d] = cmin[d] = INT64_MAX;
      bhi[d] = cmax[d] = INT64_MIN;
      ext_sum[d] = 0;
    }
    for (size_t k = begin; k < end; ++k) {
      const int64_t* lo = p_.Lo(order_[k]);
      const int64_t* hi = p_.Hi(order_[k]);
      for (size_t d = 0; d < nd; ++d) {
        blo[d] = std::min(blo[d], lo[d]);
        bhi[d] = std::max(bhi[d], hi[d]);
        const int64_t c = Centre(lo[d], hi[d]);
        cmin[d] = std::min(cmin[d], c);
        cmax[d] = std::max(cmax[d], c);
        if (__builtin_add_overflow(ext_sum[d], hi[d] - lo[d], &ext_sum[d])) ext_sum[d] = INT64_MAX;
      }
    }
    if (end - begin <= kLeafPieces || nd == 0) return id;
    // Split where the pieces lie most pieces-deep: the spread of centres measured in mean piece
    // extents. Raw spread would cut rows of long thin pieces (flat shards of wide rows) into
    // column windows whose bounding boxes all span every row.
    const double count = static_cast<double>(end - begin);
    size_t split_dim = 0;
    double best = -1;
    for (size_t d = 0; d < nd; ++d) {
      const double mean_extent = std::max(1.0, static_cast<double>(ext_sum[d]) / count);
      const double score = static_cast<double>(cmax[d] - cmin[d]) / mean_extent;
      if (score > best) {
        best = score;
        split_dim = d;
      }
    }
    const size_t mid = begin + (end - begin) / 2;
    std::nth_element(order_.begin() + begin, order_.begin() + mid, order_.begin() + end,
                     [&](size_t a, size_t b) {
                       return Centre(p_.Lo(a)[split_dim], p_.Hi(a)[split_dim]) <
                              Centre(p_.Lo(b)[split_dim], p_.Hi(b)[split_dim]);
                     });
    const size_t left = Build(begin, mid);
    const size_t right = Build(mid, end);
    nodes_[id].left = left;
    nodes_[id].right = right;
    return id;
  }

  static int64_t Centre(int64_t lo, int64_t hi) { return lo + (hi - lo) / 2; }

  const PieceSet& p_;
  std::vector<size_t> order_;
  std::vector<Node> nodes_;
  std::vector<int64_t> box_lo_, box_hi_;  // per node, ndim each
};

}  // namespace

int64_t Box::volume() const {
  int64_t v = 1;
  for (int64_t e : extent) v *= e;
  return v;
}

bool CheckedVolume(const std::vector<int64_t>& shape, int64_t* out) {
  bool has_zero = false;
  for (int64_t e : shape) {
    if (e < 0) return false;
    if (e == 0) has_zero = true;
  }
  // A zero extent makes the product zero however large the other extents are.
  int64_t v = has_zero ? 0 : 1;
  if (!has_zero) {
    for (int64_t e : shape) {
      if (__builtin_mul_overflow(v, e, &v)) return false;
    }
  }
  *out = v;
  return true;
}

Status ValidateRegion(const Region& region, const std::vector<int64_t>& tensor_shape,
                      std::string_view what, bool untrusted) {
  auto fail = [&](const std::string& detail) {
    return untrusted ? Status::Corruption(what, detail) : Status::InvalidArgument(what, detail);
  };
  const size_t n = tensor_shape.size();
  if (n > kMaxRank) {
    return fail("tensor has " + std::to_string(n) + " dimensions, more than the limit of " +
                std::to_string(kMaxRank));
  }
  if (region.offsets.size() != n || region.shape.size() != n) {
    return fail("region has " + std::to_string(region.offsets.size()) + " offsets and " +
                std::to_string(region.shape.size()) + " extents but the tensor has " +
                std::to_string(n) + " dimensions");
  }
  // Descriptions are built only on failure: this runs once per fragment of a million-fragment index.
  auto box_desc = [&] {
    return "box offsets " + ShapeString(region.offsets) + " shape " + ShapeString(region.shape) +
           " in tensor shape " + ShapeString(tensor_shape);
  };
  for (size_t d = 0; d < n; ++d) {
    auto dim = [&] { return " in dimension " + std::to_string(d) + " (" + box_desc() + ")"; };
    if (tensor_shape[d] < 0) {
      return fail("tensor extent " + std::to_string(tensor_shape[d]) + " is negative" + dim());
    }
    if (region.offsets[d] < 0) {
      return fail("offset " + std::to_string(region.offsets[d]) + " is negative" + dim());
    }
    if (region.shape[d] < 0) {
      return fail("extent " + std::to_string(region.shape[d]) + " is negative" + dim());
    }
    int64_t box_end;
    if (__builtin_add_overflow(region.offsets[d], region.shape[d], &box_end) ||
        box_end > tensor_shape[d]) {
      return fail("offset " + std::to_string(region.offsets[d]) + " + extent " +
                  std::to_string(region.shape[d]) + " exceeds the tensor extent " +
                  std::to_string(tensor_shape[d]) + dim());
    }
  }
  int64_t volume;
  if (!CheckedVolume(region.shape, &volume)) {
    return fail("box volume overflows int64 (" + box_desc() + ")");
  }
  if (region.flat_begin < 0 || region.flat_begin > region.flat_end || region.flat_end > volume) {
    return fail("flat range [" + std::to_string(region.flat_begin) + ", " +
                std::to_string(region.flat_end) + ") is not inside the box's " +
                std::to_string(volume) + " elements (" + box_desc() + ")");
  }
  return Status::OK();
}

Region RegionOfBox(const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape) {
  Region r;
  r.offsets = offsets;
  r.shape = shape;
  r.flat_begin = 0;
  r.flat_end = Box{offsets, shape}.volume();
  return r;
}

Region SubRegion(const Region& region, int64_t begin, int64_t end) {
  assert(0 <= begin && begin <= end && end <= region.num_elements());
  Region r;
  r.offsets = region.offsets;
  r.shape = region.shape;
  r.flat_begin = region.flat_begin + begin;
  r.flat_end = region.flat_begin + end;
  return r;
}

void DecomposeRegion(const Region& region, std::vector<Box>* out) {
  const size_t n = region.shape.size();
  ForEachPiece(region, [&](const int64_t* lo, const int64_t* ext) {
    Box& box = out->emplace_back();
    box.lo.assign(lo, lo + n);
    box.extent.assign(ext, ext + n);
  });
}

bool Intersect(const Box& a, const Box& b, Box* out) {
  const size_t n = a.lo.size();
  if (b.lo.size() != n || a.extent.size() != n || b.extent.size() != n) return false;
  DimScratch lo_buf(n), hi_buf(n);
  int64_t* lo = lo_buf.data();
  int64_t* hi = hi_buf.data();
  for (size_t d = 0; d < n; ++d) {
    lo[d] = std::max(a.lo[d], b.lo[d]);
    hi[d] = std::min(a.lo[d] + a.extent[d], b.lo[d] + b.extent[d]);
    if (hi[d] <= lo[d]) return false;
  }
  out->lo.assign(lo, lo + n);
  out->extent.resize(n);
  for (size_t d = 0; d < n; ++d) out->extent[d] = hi[d] - lo[d];
  return true;
}

int64_t PackedOffsetOf(const Region& region, const int64_t* coord) {
  int64_t flat = 0;
  for (size_t d = 0; d < region.shape.size(); ++d) {
    flat = flat * region.shape[d] + (coord[d] - region.offsets[d]);
  }
  return flat - region.flat_begin;
}

void CopyBox(const Box& box, size_t elem_size, const void* src, const Region& src_region, void* dst,
             const Region& dst_region) {
  const size_t n = box.extent.size();
  for (size_t d = 0; d < n; ++d) {
    if (box.extent[d] <= 0) return;
  }
  const char* s = static_cast<const char*>(src) +
                  static_cast<size_t>(PackedOffsetOf(src_region, box.lo.data())) * elem_size;
  char* t = static_cast<char*>(dst) +
            static_cast<size_t>(PackedOffsetOf(dst_region, box.lo.data())) * elem_size;

  // Collapse the box into as few (extent, src stride, dst stride) dimensions as possible,
  // innermost first: extent-1 dimensions vanish, and a dimension folds into the one inside it
  // when both layouts step over exactly that inner dimension's span.
  DimScratch ext_buf(n), ss_buf(n), ds_buf(n);
  int64_t* ext = ext_buf.data();
  int64_t* ss = ss_buf.data();
  int64_t* ds = ds_buf.data();
  size_t m = 0;
  int64_t src_stride = 1, dst_stride = 1;
  for (size_t d = n; d-- > 0;) {
    const int64_t e = box.extent[d];
    if (e != 1) {
      if (m > 0 && ss[m - 1] * ext[m - 1] == src_stride && ds[m - 1] * ext[m - 1] == dst_stride) {
        ext[m - 1] *= e;
      } else {
        ext[m] = e;
        ss[m] = src_stride;
        ds[m] = dst_stride;
        ++m;
      }
    }
    src_stride *= src_region.shape[d];
    dst_stride *= dst_region.shape[d];
  }

  size_t run = elem_size;
  size_t first = 0;
  if (m > 0 && ss[0] == 1 && ds[0] == 1) {
    run = static_cast<size_t>(ext[0]) * elem_size;
    first = 1;
  }
  const size_t loops = m - first;
  if (loops == 0) {
    std::memcpy(t, s, run);
    return;
  }
  // Byte strides of the remaining loop dimensions, innermost first.
  const int64_t* le = ext + first;
  for (size_t k = first; k < m; ++k) {
    ss[k] *= static_cast<int64_t>(elem_size);
    ds[k] *= static_cast<int64_t>(elem_size);
  }
  const int64_t* ls = ss + first;
  const int64_t* ld = ds + first;
  if (loops == 1) {
    for (int64_t i = 0; i < le[0]; ++i) std::memcpy(t + i * ld[0], s + i * ls[0], run);
    return;
  }
  if (loops == 2) {
    for (int64_t j = 0; j < le[1]; ++j) {
      const char* sj = s + j * ls[1];
      char* tj = t + j * ld[1];
      for (int64_t i = 0; i < le[0]; ++i) std::memcpy(tj + i * ld[0], sj + i * ls[0], run);
    }
    return;
  }
  // General case: the innermost loop dimension runs in a tight loop, the outer ones as an
  // odometer over a counter per dimension.
  DimScratch count_buf(loops);
  int64_t* count = count_buf.data();
  for (size_t k = 0; k < loops; ++k) count[k] = 0;
  for (;;) {
    for (int64_t i = 0; i < le[0]; ++i) std::memcpy(t + i * ld[0], s + i * ls[0], run);
    size_t k = 1;
    for (; k < loops; ++k) {
      s += ls[k];
      t += ld[k];
      if (++count[k] < le[k]) break;
      s -= ls[k] * le[k];
      t -= ld[k] * le[k];
      count[k] = 0;
    }
    if (k == loops) return;
  }
}

// PlanOverlaps: every source and target region is cut into at most 2*ndim-1 boxes (pieces).
// The source pieces go into a static k-d tree of bounding boxes (PieceTree); each target piece
// is a box query on it. Costs, with P_s <= (2d-1)S source pieces and P_t <= (2d-1)T target
// pieces: building O(d * P_s log P_s); the queries O(d * (P_t log P_s + visited)); sorting
// the K overlaps O(K + S). When the source pieces are disjoint and tile space coherently
// (partitions along one or several dimensions, grids, flat ranges, flat ranges of boxes), a
// query visits about log P_s + k nodes for its k overlaps (observed, not a proven bound), so
// the plan costs about O(d * (S + T) log S + K*d). For adversarial layouts (e.g. many
// overlapping or interleaved sources) a query may visit up to every node, O(P_s); the answer
// is exact for any input. 0-d tensors match every non-empty source with every
// non-empty target, which is exactly K.
void PlanOverlaps(const std::vector<Region>& sources, const std::vector<Region>& targets,
                  std::vector<Overlap>* out) {
  if (sources.empty() || targets.empty()) return;
  const size_t ndim = sources[0].shape.size();

  if (ndim == 0) {
    for (size_t s = 0; s < sources.size(); ++s) {
      const Region& src = sources[s];
      if (!src.shape.empty() || src.flat_begin >= src.flat_end) continue;
      for (size_t t = 0; t < targets.size(); ++t) {
        const Region& tgt = targets[t];
        if (!tgt.shape.empty() || tgt.flat_begin >= tgt.flat_end) continue;
        Overlap& o = out->emplace_back();
        o.source = static_cast<uint32_t>(s);
        o.target = static_cast<uint32_t>(t);
      }
    }
    return;
  }

  PieceSet src_pieces, tgt_pieces;
  src_pieces.ndim = tgt_pieces.ndim = ndim;
  src_pieces.AddAll(sources);
  tgt_pieces.AddAll(targets);
  const PieceTree tree(src_pieces);

  struct Hit {
    uint32_t source, target;
    size_t source_piece, target_piece;
  };
  std::vector<Hit> hits;
  hits.reserve(src_pieces.size() + tgt_pieces.size());
  std::vector<size_t> stack;
  for (size_t tp = 0; tp < tgt_pieces.size(); ++tp) {
    const uint32_t target = tgt_pieces.owner[tp];
    tree.Query(tgt_pieces.Lo(tp), tgt_pieces.Hi(tp), &stack, [&](size_t sp) {
      hits.push_back(Hit{src_pieces.owner[sp], target, sp, tp});
    });
  }
  // Hits arrive in target-piece order, hence in target order. A stable counting sort by source
  // gives (source, target) order in O(K + S); each run of one (source, target) pair, at most
  // (2d-1)^2 long, is then put in piece order, which follows the regions' row-major order.
  std::vector<size_t> first(sources.size() + 1, 0);
  for (const Hit& h : hits) ++first[h.source + 1];
  for (size_t s = 0; s < sources.size(); ++s) first[s + 1] += first[s];
  std::vector<Hit> sorted(hits.size());
  for (const Hit& h : hits) sorted[first[h.source]++] = h;
  hits.clear();
  hits.shrink_to_fit();
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i + 1;
    while (j < sorted.size() && sorted[j].source == sorted[i].source && sorted[j].target == sorted[i].target) ++j;
    if (j - i > 1) {
      std::sort(sorted.begin() + i, sorted.begin() + j, [](const Hit& a, const Hit& b) {
        return std::tie(a.source_piece, a.target_piece) < std::tie(b.source_piece, b.target_piece);
      });
    }
    i = j;
  }

  out->reserve(out->size() + sorted.size());
  DimScratch lo_buf(ndim), ext_buf(ndim);
  int64_t* lo = lo_buf.data();
  int64_t* ext = ext_buf.data();
  for (const Hit& h : sorted) {
    const int64_t* slo = src_pieces.Lo(h.source_piece);
    const int64_t* shi = src_pieces.Hi(h.source_piece);
    const int64_t* tlo = tgt_pieces.Lo(h.target_piece);
    const int64_t* thi = tgt_pieces.Hi(h.target_piece);
    for (size_t d = 0; d < ndim; ++d) {
      lo[d] = std::max(slo[d], tlo[d]);
      ext[d] = std::min(shi[d], thi[d]) - lo[d];
    }
    Overlap& o = out->emplace_back();
    o.source = h.source;
    o.target = h.target;
    o.box.lo.assign(lo, lo + ndim);
    o.box.extent.assign(ext, ext + ndim);
  }
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace lifeline::format
