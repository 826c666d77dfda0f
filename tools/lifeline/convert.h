// The streaming conversions behind `lifeline convert` and `lifeline reshard`: any TensorSource
// (a checkpoint, HDF5, safetensors) into HDF5, safetensors, or a Lifeline checkpoint laid out for
// a target (ranks, tp, dp). Each reads and writes one slab at a time: peak memory is bounded by
// ConvertOptions::memory_budget, not by the model. Outputs appear whole or not at all: files are
// written under temporary names and renamed at the end; a checkpoint step becomes visible only
// when its last rank index is published (formats/SPEC.md §9).
//
// Thread safety: one conversion per thread; the source is used by the calling thread only.
#ifndef LIFELINE_TOOLS_LIFELINE_CONVERT_H_
#define LIFELINE_TOOLS_LIFELINE_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/model.h"
#include "lifeline/checkpoint.h"
#include "lifeline/status.h"
#include "tools/lifeline/synthetic_model.h"
#include "tools/lifeline/tensor_source.h"

namespace lifeline::cli {

class Progress;

struct ConvertOptions {
  uint64_t memory_budget = 256ull << 20;   // bytes of slabs in memory at once (at least 1 MiB)
  std::vector<std::string> select;         // tensor name prefixes to export; empty: all
  bool force = false;                      // replace an existing output file
  // hdf5
  int deflate_level = 0;                   // 0 off, 1..9
  // safetensors
  uint64_t max_shard_bytes = 0;            // 0: one file
  // lifeline
  std::optional<uint64_t> step;            // the output step (default: the source's, else 0)
  SaveCodec codec = SaveCodec::kNone;
  int codec_level = 0;
  bool direct_io = true;
};

struct ConvertReport {
  uint64_t tensors = 0;
  uint64_t bytes = 0;           // tensor bytes read from the source (replicas once)
  uint64_t objects = 0;
  std::vector<std::string> outputs;  // files or the step directory written
  uint64_t step = 0;            // lifeline: the step written
  std::string placement;        // lifeline: "synthetic model" or "generic"
};

// The tensors of `source` that `options.select` keeps (indexes into source.tensors()).
std::vector<size_t> SelectTensors(const TensorSource& source, const std::vector<std::string>& prefixes);

Result<ConvertReport> ExportHdf5(TensorSource& source, const std::string& out, const ConvertOptions& options,
                                 Progress* progress);
// `out`: a file name ending in .safetensors (one file), or a directory that receives
// model.safetensors, or model-0000K-of-0000N.safetensors plus model.safetensors.index.json when
// max_shard_bytes splits the tensors.
Result<ConvertReport> ExportSafetensors(TensorSource& source, const std::string& out, const ConvertOptions& options,
                                        Progress* progress);
// Writes step S under checkpoint root `out` for `layout` (see TargetShards).
Result<ConvertReport> ExportLifeline(TensorSource& source, const std::string& out, const ParallelLayout& layout,
                                     const ConvertOptions& options, Progress* progress);

// What rank `rank` of `layout` holds of the given tensors (data null, replica fields set):
// the synthetic model's table (synthetic_model.h) when the tensors are exactly that model's;
// otherwise the generic rule: a tensor of at least tp rows is split along dimension 0 into tp
// tensor-parallel boxes (EvenSplit), each held by the dp ranks of its tensor-parallel index as
// Replica(d, dp); smaller tensors, scalars and vectors shorter than tp are held whole by every rank
// as Replica(rank, ranks). *synthetic says which rule applied.
std::vector<TensorShard> TargetShards(const std::vector<SourceTensor>& tensors, const std::string& metadata_json,
                                      const ParallelLayout& layout, uint32_t rank, bool* synthetic);

}  // namespace lifeline::cli

#endif  // LIFELINE_TOOLS_LIFELINE_CONVERT_H_
