// Geometry of tensor pieces: boxes, row-major ranges of boxes (Regions), their intersections,
// strided copies between two differently laid out pieces, and the resharding planner.
//
// Coordinates are global element coordinates of the tensor. A Region's data is laid out as the
// row-major elements [flat_begin, flat_end) of its box, packed: the element at flat position p of
// the box lives at buffer element (p - flat_begin).
//
// All functions are pure and thread-compatible.
#ifndef LIFELINE_FORMATS_GEOMETRY_H_
#define LIFELINE_FORMATS_GEOMETRY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/model.h"
#include "lifeline/status.h"

namespace lifeline::format {

struct Box {
  std::vector<int64_t> lo;      // first coordinate, one per dimension
  std::vector<int64_t> extent;  // size per dimension, each >= 1 for a non-empty box

  int64_t volume() const;       // product of extents (1 for a 0-d box)
  bool operator==(const Box&) const = default;
};

// Product of `shape` into *out. False when an extent is negative or the product overflows int64.
bool CheckedVolume(const std::vector<int64_t>& shape, int64_t* out);

// A shape (or coordinates) as messages and listings write it: "[2, 3]".
std::string ShapeString(const std::vector<int64_t>& shape);

// Checks that `region` is a valid piece of a tensor of shape `tensor_shape`: same number of
// dimensions, box inside the tensor, 0 <= flat_begin <= flat_end <= volume(box), no overflow.
// The error is InvalidArgument (or Corruption when `untrusted`) and names `what`.
Status ValidateRegion(const Region& region, const std::vector<int64_t>& tensor_shape,
                      std::string_view what, bool untrusted);

// The whole-box region of a box.
Region RegionOfBox(const std::vector<int64_t>& offsets, const std::vector<int64_t>& shape);

// The sub-region holding elements [begin, end) of `region`'s own packed buffer (0 = its first
// element). REQUIRES: 0 <= begin <= end <= region.num_elements().
Region SubRegion(const Region& region, int64_t begin, int64_t end);

// Appends to `out` at most 2*ndim-1 disjoint boxes, in global coordinates, whose union is exactly
// the region's element range. Appends nothing for an empty range.
void DecomposeRegion(const Region& region, std::vector<Box>* out);

// The intersection of a and b. False (and *out untouched) when it is empty.
bool Intersect(const Box& a, const Box& b, Box* out);

// Element offset, inside the region's packed buffer, of the global coordinate `coord`.
// REQUIRES: coord lies inside the region's element range.
int64_t PackedOffsetOf(const Region& region, const int64_t* coord);

// Copies every element of `box` from `src` (laid out as src_region) to `dst` (laid out as
// dst_region), in runs of contiguous bytes as long as both layouts allow.
// REQUIRES: every element of box lies in both regions' element ranges.
void CopyBox(const Box& box, size_t elem_size, const void* src, const Region& src_region, void* dst,
             const Region& dst_region);

// One non-empty intersection found by the planner.
struct Overlap {
  uint32_t source = 0;  // index into the `sources` given to PlanOverlaps
  uint32_t target = 0;  // index into the `targets`
  Box box;              // lies in both regions' element ranges
};

// Finds every non-empty intersection between the element ranges of `sources` and `targets`, all
// pieces of one tensor. Overlaps come out sorted by (source, target). Cost: O((S + T) log S + K*d)
// where K is the number of overlaps, for sources that are disjoint (as stored fragments are);
// it never compares every source with every target.
void PlanOverlaps(const std::vector<Region>& sources, const std::vector<Region>& targets,
                  std::vector<Overlap>* out);

}  // namespace lifeline::format

#endif  // LIFELINE_FORMATS_GEOMETRY_H_
