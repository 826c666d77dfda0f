// Part of the declared internal interface (lifeline/internal/): for Lifeline's own binaries, not users.
// The load planner: which stored chunks feed which target region, and where in it. It is the part
// of a load that grows with the checkpoint's metadata rather than its bytes, so it is kept apart
// from the reads (checkpoint_reader.cc) and measured at scale by `lifeline bench plan`.
//
// Cost, for a rank loading T target regions from a manifest of F fragments and C chunks: one pass
// over the fragments to find those of the tensors it loads (O(F)), then per tensor the sweep of
// format::PlanOverlaps over that tensor's chunks and targets, O((S + T) log S + K) for S chunks of
// the tensor and K overlaps; never every chunk against every target.
//
// Thread safety: the functions share no state.
#ifndef LIFELINE_INTERNAL_LOAD_PLAN_H_
#define LIFELINE_INTERNAL_LOAD_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "formats/geometry.h"
#include "formats/model.h"
#include "lifeline/status.h"

namespace lifeline {

// A region of a stored tensor that one load fills.
struct LoadTarget {
  uint32_t tensor = 0;    // index into the manifest's tensors
  format::Region region;  // valid for that tensor's shape
};

// Elements of chunk `chunk` (an index into the manifest's chunks) that go to target `target`.
struct PlannedCopy {
  uint64_t chunk = 0;
  uint32_t target = 0;
  format::Box box;
};

// Every copy that fills `targets` from the chunks of `m`, sorted by chunk (so a reader reads each
// chunk once, in order). Corruption naming `where`, the tensor and the region when the stored
// fragments do not cover a target exactly.
Result<std::vector<PlannedCopy>> PlanLoad(const format::CheckpointIndex& m, const std::vector<LoadTarget>& targets,
                                          const std::string& where);

// "offsets [..] shape [..] elements [b, e)", as errors name regions.
std::string RegionString(const format::Region& r);

// The raw region chunk `k` of fragment `frag` holds (elements [k * per_chunk, ...) of it).
format::Region ChunkRegion(const format::FragmentInfo& frag, uint64_t k, uint64_t elems_per_chunk);

}  // namespace lifeline

#endif  // LIFELINE_INTERNAL_LOAD_PLAN_H_
