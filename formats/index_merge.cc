// BuildManifest: the manifest of a checkpoint merged from its rank indexes.
#include <algorithm>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "formats/geometry.h"
#include "formats/index_codec.h"

namespace lifeline::format {
namespace {

std::string DTypeString(DType t) {
  if (!IsValidDType(static_cast<uint8_t>(t))) return "dtype code " + std::to_string(static_cast<unsigned>(t));
  return std::string(DTypeName(t));
}

}  // namespace

Result<CheckpointIndex> BuildManifest(std::vector<CheckpointIndex> rank_indexes) {
  constexpr std::string_view kWhat = "building the manifest";
  if (rank_indexes.empty()) return Status::InvalidArgument(kWhat, "no rank indexes");
  const CheckpointIndex& first = rank_indexes.front();
  const uint32_t world = first.world_size;
  if (world < 1 || world > kMaxWorldSize)
    return Status::InvalidArgument(kWhat, "world size " + std::to_string(world) + " outside [1, " +
                                              std::to_string(kMaxWorldSize) + "]");

  // Slot of each rank's index in `rank_indexes`.
  std::vector<uint32_t> slot_of_rank(world, UINT32_MAX);
  for (size_t i = 0; i < rank_indexes.size(); ++i) {
    const CheckpointIndex& idx = rank_indexes[i];
    const std::string who = "rank index of rank " + std::to_string(idx.rank);
    if (idx.kind != IndexKind::kRankIndex)
      return Status::InvalidArgument(kWhat, "input " + std::to_string(i) + " is not a rank index");
    if (idx.world_size != world)
      return Status::InvalidArgument(kWhat, who + " has world size " + std::to_string(idx.world_size) + ", rank " +
                                                std::to_string(first.rank) + "'s has " + std::to_string(world));
    if (idx.rank >= world)
      return Status::InvalidArgument(kWhat, who + " is not below world size " + std::to_string(world));
    if (slot_of_rank[idx.rank] != UINT32_MAX)
      return Status::InvalidArgument(kWhat, "rank " + std::to_string(idx.rank) + " appears twice");
    slot_of_rank[idx.rank] = static_cast<uint32_t>(i);
    if (idx.step != first.step)
      return Status::InvalidArgument(kWhat, who + " is for step " + std::to_string(idx.step) + ", rank " +
                                                std::to_string(first.rank) + "'s for step " + std::to_string(first.step));
    if (idx.run_id != first.run_id)
      return Status::InvalidArgument(kWhat, who + " has run id " + QuoteUntrusted(idx.run_id) + ", rank " +
                                                std::to_string(first.rank) + "'s has " + QuoteUntrusted(first.run_id));
    if (idx.chunk_bytes != first.chunk_bytes)
      return Status::InvalidArgument(kWhat, who + " has chunk size " + std::to_string(idx.chunk_bytes) + ", rank " +
                                                std::to_string(first.rank) + "'s has " +
                                                std::to_string(first.chunk_bytes));
  }
  for (uint32_t r = 0; r < world; ++r) {
    if (slot_of_rank[r] == UINT32_MAX)
      return Status::InvalidArgument(kWhat, "rank index of rank " + std::to_string(r) + " is missing (" +
                                                std::to_string(rank_indexes.size()) + " of " + std::to_string(world) +
                                                " ranks present)");
  }
  uint64_t total_files = 0, total_fragments = 0, total_chunks = 0, total_objects = 0;
  for (const CheckpointIndex& idx : rank_indexes) {
    LL_RETURN_IF_ERROR(ValidateIndex(idx, "rank index of rank " + std::to_string(idx.rank), /*untrusted=*/false));
    total_files += idx.files.size();
    total_fragments += idx.fragments.size();
    total_chunks += idx.chunks.size();
    total_objects += idx.objects.size();
  }

  CheckpointIndex manifest;
  manifest.kind = IndexKind::kManifest;
  manifest.step = first.step;
  manifest.rank = kManifestRank;
  manifest.world_size = world;
  manifest.run_id = first.run_id;
  manifest.chunk_bytes = first.chunk_bytes;
  manifest.files.reserve(total_files);
  manifest.fragments.reserve(total_fragments);
  manifest.chunks.reserve(total_chunks);
  manifest.objects.reserve(total_objects);

  // Keys view the inputs' names, which stay put: only fragments and chunks are moved out below.
  struct TensorEntry {
    uint32_t index;
    uint32_t first_rank;
  };
  std::unordered_map<std::string_view, TensorEntry> tensor_by_name;
  std::unordered_map<std::string_view, uint32_t> file_by_name;
  std::vector<uint32_t> tensor_map;
  for (uint32_t r = 0; r < world; ++r) {
    CheckpointIndex& idx = rank_indexes[slot_of_rank[r]];
    manifest.created_unix_ns = std::max(manifest.created_unix_ns, idx.created_unix_ns);
    tensor_map.assign(idx.tensors.size(), 0);
    for (size_t t = 0; t < idx.tensors.size(); ++t) {
      const TensorInfo& info = idx.tensors[t];
      auto [it, inserted] = tensor_by_name.try_emplace(info.name, TensorEntry{static_cast<uint32_t>(manifest.tensors.size()), r});
      if (inserted) {
        manifest.tensors.push_back(info);
      } else {
        const TensorInfo& known = manifest.tensors[it->second.index];
        if (known.dtype != info.dtype || known.shape != info.shape)
          return Status::InvalidArgument(kWhat, "tensor " + QuoteUntrusted(info.name) + ": rank " + std::to_string(r) +
                                                    " declares " + DTypeString(info.dtype) + " " + ShapeString(info.shape) +
                                                    " but rank " + std::to_string(it->second.first_rank) + " declares " +
                                                    DTypeString(known.dtype) + " " + ShapeString(known.shape));
      }
      tensor_map[t] = it->second.index;
    }
    if (manifest.tensors.size() > UINT32_MAX || manifest.files.size() + idx.files.size() > UINT32_MAX)
      return Status::InvalidArgument(kWhat, "more than 2^32 tensors or files");
    const uint32_t file_base = static_cast<uint32_t>(manifest.files.size());
    for (const FileInfo& f : idx.files) {
      auto [it, inserted] = file_by_name.try_emplace(f.name, r);
      if (!inserted)
        return Status::InvalidArgument(kWhat, "file " + QuoteUntrusted(f.name) + " is listed by rank " + std::to_string(it->second) +
                                                  " and rank " + std::to_string(r));
      manifest.files.push_back(f);
    }
    const uint64_t chunk_base = manifest.chunks.size();
    manifest.chunks.insert(manifest.chunks.end(), idx.chunks.begin(), idx.chunks.end());
    for (FragmentInfo& fr : idx.fragments) {
      manifest.fragments.push_back(std::move(fr));
      FragmentInfo& out = manifest.fragments.back();
      out.tensor = tensor_map[out.tensor];
      out.file += file_base;
      out.first_chunk += chunk_base;
    }
    for (const ObjectInfo& o : idx.objects) {
      manifest.objects.push_back(o);
      manifest.objects.back().file += file_base;
    }
  }
  manifest.metadata_json = std::move(rank_indexes[slot_of_rank[0]].metadata_json);

  // Fragments grouped by tensor (in rank order within one), their chunks moved along so that chunks
  // stay in fragment order: the layout the manifest directory describes (§5.5), which lets a load
  // read the fragments of its tensors and nothing else.
  std::vector<uint32_t> order(manifest.fragments.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return manifest.fragments[a].tensor < manifest.fragments[b].tensor;
  });
  std::vector<FragmentInfo> fragments;
  std::vector<ChunkInfo> chunks;
  fragments.reserve(manifest.fragments.size());
  chunks.reserve(manifest.chunks.size());
  for (uint32_t i : order) {
    FragmentInfo& fr = fragments.emplace_back(std::move(manifest.fragments[i]));
    const uint64_t first = fr.first_chunk;
    fr.first_chunk = chunks.size();
    chunks.insert(chunks.end(), manifest.chunks.begin() + first, manifest.chunks.begin() + first + fr.num_chunks);
  }
  manifest.fragments = std::move(fragments);
  manifest.chunks = std::move(chunks);

  LL_RETURN_IF_ERROR(ValidateCoverage(manifest, kWhat, /*untrusted=*/false));
  return manifest;
}

}  // namespace lifeline::format
