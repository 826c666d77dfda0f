#include "lifeline/internal/load_plan.h"

#include <algorithm>
#include <utility>

#include "lifeline/dtype.h"

namespace lifeline {

std::string RegionString(const format::Region& r) {
  return "offsets " + format::ShapeString(r.offsets) + " shape " + format::ShapeString(r.shape) + " elements [" +
         std::to_string(r.flat_begin) + ", " + std::to_string(r.flat_end) + ")";
}

format::Region ChunkRegion(const format::FragmentInfo& frag, uint64_t k, uint64_t elems_per_chunk) {
  const int64_t n = frag.region.num_elements();
  const int64_t b = static_cast<int64_t>(k * elems_per_chunk);
  const int64_t e = std::min<int64_t>(n, static_cast<int64_t>((k + 1) * elems_per_chunk));
  return format::SubRegion(frag.region, b, e);
}

Result<std::vector<PlannedCopy>> PlanLoad(const format::CheckpointIndex& m, const std::vector<LoadTarget>& targets,
                                          const std::string& where) {
  // Targets grouped by stored tensor; then, in one pass, the fragments of those tensors.
  std::vector<std::vector<uint32_t>> targets_of(m.tensors.size());
  for (uint32_t i = 0; i < targets.size(); ++i) {
    if (targets[i].tensor >= m.tensors.size())
      return Status::InvalidArgument(where, "a load target names tensor " + std::to_string(targets[i].tensor) +
                                                " of " + std::to_string(m.tensors.size()));
    targets_of[targets[i].tensor].push_back(i);
  }
  std::vector<std::vector<uint32_t>> fragments_of(m.tensors.size());
  for (uint32_t f = 0; f < m.fragments.size(); ++f)
    if (!targets_of[m.fragments[f].tensor].empty()) fragments_of[m.fragments[f].tensor].push_back(f);

  // Per tensor, intersect the chunks of its fragments with its targets.
  std::vector<PlannedCopy> copies;
  std::vector<format::Region> sources;
  std::vector<uint64_t> source_chunk;
  std::vector<format::Region> tensor_targets;
  std::vector<format::Overlap> overlaps;
  for (uint32_t t = 0; t < m.tensors.size(); ++t) {
    if (targets_of[t].empty()) continue;
    const uint64_t elems_per_chunk = m.chunk_bytes / DTypeSize(m.tensors[t].dtype);
    sources.clear();
    source_chunk.clear();
    for (uint32_t f : fragments_of[t]) {
      const format::FragmentInfo& frag = m.fragments[f];
      for (uint64_t k = 0; k < frag.num_chunks; ++k) {
        sources.push_back(ChunkRegion(frag, k, elems_per_chunk));
        source_chunk.push_back(frag.first_chunk + k);
      }
    }
    tensor_targets.clear();
    for (uint32_t i : targets_of[t]) tensor_targets.push_back(targets[i].region);
    overlaps.clear();
    format::PlanOverlaps(sources, tensor_targets, &overlaps);
    std::vector<int64_t> covered(tensor_targets.size(), 0);
    for (format::Overlap& o : overlaps) {
      covered[o.target] += o.box.volume();
      copies.push_back(PlannedCopy{source_chunk[o.source], targets_of[t][o.target], std::move(o.box)});
    }
    for (size_t i = 0; i < tensor_targets.size(); ++i) {
      const int64_t want = tensor_targets[i].num_elements();
      if (covered[i] != want)
        return Status::Corruption(where, "tensor '" + m.tensors[t].name + "': the checkpoint holds " +
                                             std::to_string(covered[i]) + " of the " + std::to_string(want) +
                                             " elements of the target region " + RegionString(tensor_targets[i]));
    }
  }
  std::stable_sort(copies.begin(), copies.end(),
                   [](const PlannedCopy& a, const PlannedCopy& b) { return a.chunk < b.chunk; });
  return copies;
}

}  // namespace lifeline
