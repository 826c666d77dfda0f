// The streaming conversions behind Convert() (lifeline/convert.h): any TensorSource into HDF5,
// safetensors, or a Lifeline checkpoint laid out for a target (ranks, tp, dp). Each reads and
// writes one slab at a time: peak memory is bounded by ConvertOptions::memory_budget, not by the
// model. Outputs appear whole or not at all: files are written under temporary names and renamed
// at the end; a checkpoint step becomes visible only when its last rank index is published
// (formats/SPEC.md §9).
//
// Thread safety: one conversion per thread; the source is used by the calling thread only.
#ifndef LIFELINE_LIB_SRC_CONVERT_CONVERT_H_
#define LIFELINE_LIB_SRC_CONVERT_CONVERT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lifeline/internal/synthetic_model.h"
#include "lifeline/checkpoint.h"
#include "lifeline/convert.h"
#include "lifeline/status.h"

namespace lifeline {

Result<ConvertReport> ExportHdf5(TensorSource& source, const std::string& out, const ConvertOptions& options);
Result<ConvertReport> ExportSafetensors(TensorSource& source, const std::string& out, const ConvertOptions& options);
// Writes the step under checkpoint root `out` for `layout` (see TargetShards).
Result<ConvertReport> ExportLifeline(TensorSource& source, const std::string& out, const ParallelLayout& layout,
                                     const ConvertOptions& options);

// What rank `rank` of `layout` holds of the given tensors (data null, replica fields set):
// the synthetic model's table (synthetic_model.h) when the tensors are exactly that model's;
// otherwise the generic rule: a tensor of at least tp rows is split along dimension 0 into tp
// tensor-parallel boxes (EvenSplit), each held by the dp ranks of its tensor-parallel index as
// Replica(d, dp); smaller tensors, scalars and vectors shorter than tp are held whole by every rank
// as Replica(rank, ranks). *synthetic says which rule applied.
std::vector<TensorShard> TargetShards(const std::vector<SourceTensor>& tensors, const std::string& metadata_json,
                                      const ParallelLayout& layout, uint32_t rank, bool* synthetic);

}  // namespace lifeline

#endif  // LIFELINE_LIB_SRC_CONVERT_CONVERT_H_
