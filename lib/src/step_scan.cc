#include "lib/src/step_scan.h"

#include <map>
#include <set>

#include "formats/geometry.h"
#include "formats/index_codec.h"
#include "lib/src/checkpoint_layout.h"
#include "lifeline/log.h"

namespace lifeline {
namespace {

// BuildManifest counts elements per tensor, which a double write and a gap of the same size fool
// (ranks that declared overlapping pieces). Loads assume stored fragments are disjoint, so such a
// checkpoint would fill the gap's targets with nothing: refuse it here, where every merge goes.
Status CheckFragmentsDisjoint(const format::CheckpointIndex& m, const std::string& step_dir) {
  std::vector<std::vector<uint32_t>> fragments_of(m.tensors.size());
  for (uint32_t f = 0; f < m.fragments.size(); ++f) fragments_of[m.fragments[f].tensor].push_back(f);
  std::vector<format::Region> regions;
  std::vector<format::Overlap> overlaps;
  for (uint32_t t = 0; t < m.tensors.size(); ++t) {
    if (fragments_of[t].size() < 2) continue;
    regions.clear();
    for (uint32_t f : fragments_of[t]) regions.push_back(m.fragments[f].region);
    overlaps.clear();
    format::PlanOverlaps(regions, regions, &overlaps);
    for (const format::Overlap& o : overlaps) {
      if (o.source == o.target) continue;
      const format::FragmentInfo& a = m.fragments[fragments_of[t][o.source]];
      const format::FragmentInfo& b = m.fragments[fragments_of[t][o.target]];
      return Status::Corruption(step_dir, "tensor '" + m.tensors[t].name + "': ranks " +
                                              std::to_string(m.files[a.file].rank) + " and " +
                                              std::to_string(m.files[b.file].rank) +
                                              " wrote overlapping pieces (elements written twice, others by no rank)");
    }
  }
  return Status::OK();
}

// An index or manifest larger than the format allows is damage, not a resource problem: saying
// Corruption lets a load fall back to an older checkpoint instead of giving up.
Result<std::string> ReadIndexFile(Env* env, const std::string& path) {
  Result<std::string> bytes = ReadFileToString(env, path, format::kMaxIndexBytes);
  if (bytes.status().code() == StatusCode::kResourceExhausted) return Status::Corruption(bytes.status().message());
  return bytes;
}

}  // namespace

Result<StepState> ScanStep(Env* env, const std::string& step_dir, uint64_t step) {
  StepState state;
  state.info.step = step;
  state.info.directory = step_dir;
  LL_ASSIGN_OR_RETURN(state.children, env->GetChildren(step_dir));
  std::map<std::pair<std::string, uint32_t>, std::set<uint32_t>> attempts;
  std::set<std::pair<std::string, uint32_t>> manifests;
  for (const std::string& name : state.children) {
    if (auto idx = ParseIndexFileName(name)) {
      attempts[{idx->run_hash, idx->world_size}].insert(idx->rank);
    } else if (auto man = ParseManifestFileName(name)) {
      manifests.insert({man->run_hash, man->world_size});
    }
  }
  // Prefer a complete attempt with a manifest, then any complete one, then the most advanced.
  const std::pair<std::string, uint32_t>* best = nullptr;
  int best_score = -1;
  size_t best_present = 0;
  for (const auto& [key, ranks] : attempts) {
    const bool complete = ranks.size() == key.second;
    const int score = complete ? (manifests.count(key) ? 3 : 2) : 1;
    if (score > best_score || (score == best_score && ranks.size() > best_present)) {
      best = &key;
      best_score = score;
      best_present = ranks.size();
    }
  }
  if (best == nullptr) {
    state.info.problem = "no rank index";
    return state;
  }
  const std::set<uint32_t>& ranks = attempts[*best];
  state.run_hash = best->first;
  state.info.world_size = best->second;
  state.info.ranks_present = static_cast<uint32_t>(ranks.size());
  state.info.complete = best_score >= 2;
  state.has_manifest = best_score == 3;
  if (!state.info.complete) {
    std::string missing;
    int listed = 0;
    for (uint32_t r = 0; r < best->second && listed < 8; ++r) {
      if (!ranks.count(r)) {
        missing += (listed ? ", " : "") + std::to_string(r);
        ++listed;
      }
    }
    if (best->second - ranks.size() > static_cast<size_t>(listed)) missing += ", ...";
    state.info.problem = std::to_string(ranks.size()) + " of " + std::to_string(best->second) +
                         " rank indexes present (missing rank " + missing + ")";
  }
  for (uint32_t r = 0; r < best->second; ++r) {
    for (const std::string& name : {DataFileName(state.run_hash, r, best->second), IndexFileName(state.run_hash, r, best->second)}) {
      auto size = env->GetFileSize(JoinPath(step_dir, name));
      if (size.ok()) state.info.bytes += *size;
    }
  }
  return state;
}

Result<format::CheckpointIndex> MergeRankIndexes(Env* env, const std::string& step_dir, const std::string& run_hash,
                                                 uint32_t world_size, uint64_t step) {
  std::vector<format::CheckpointIndex> indexes;
  indexes.reserve(world_size);
  for (uint32_t r = 0; r < world_size; ++r) {
    const std::string path = JoinPath(step_dir, IndexFileName(run_hash, r, world_size));
    LL_ASSIGN_OR_RETURN(std::string bytes, ReadIndexFile(env, path));
    LL_ASSIGN_OR_RETURN(format::CheckpointIndex index, format::DecodeIndex(bytes, path));
    if (index.kind != format::IndexKind::kRankIndex || index.rank != r || index.world_size != world_size ||
        index.step != step || RunHash(index.run_id) != run_hash)
      return Status::Corruption(path, "rank index describes rank " + std::to_string(index.rank) + " of " +
                                          std::to_string(index.world_size) + " at step " + std::to_string(index.step) +
                                          ", which its name and directory contradict");
    indexes.push_back(std::move(index));
  }
  auto manifest = format::BuildManifest(std::move(indexes));
  if (!manifest.ok()) return Status::Corruption(step_dir, manifest.status().message());
  LL_RETURN_IF_ERROR(CheckFragmentsDisjoint(*manifest, step_dir));
  return manifest;
}

Result<format::CheckpointIndex> ReadManifest(Env* env, const StepState& state) {
  const std::string& dir = state.info.directory;
  if (!state.info.complete) return Status::NotFound(dir, "checkpoint is not complete: " + state.info.problem);
  if (state.has_manifest) {
    const std::string path = JoinPath(dir, ManifestFileName(state.run_hash, state.info.world_size));
    auto read = [&]() -> Result<format::CheckpointIndex> {
      LL_ASSIGN_OR_RETURN(std::string bytes, ReadIndexFile(env, path));
      LL_ASSIGN_OR_RETURN(format::CheckpointIndex manifest, format::DecodeIndex(bytes, path));
      if (manifest.kind != format::IndexKind::kManifest || manifest.step != state.info.step ||
          manifest.world_size != state.info.world_size || RunHash(manifest.run_id) != state.run_hash)
        return Status::Corruption(path, "manifest describes another step or save attempt than its name");
      return manifest;
    };
    Result<format::CheckpointIndex> manifest = read();
    if (manifest.ok() || !manifest.status().IsCorruption()) return manifest;
    // The rank indexes are the commit record; the manifest is only their merge, made again here.
    Result<format::CheckpointIndex> merged =
        MergeRankIndexes(env, dir, state.run_hash, state.info.world_size, state.info.step);
    if (!merged.ok()) return manifest.status();
    Log(LogLevel::kWarning, "ignoring a damaged manifest, merged the rank indexes instead: " + manifest.status().ToString());
    return merged;
  }
  return MergeRankIndexes(env, dir, state.run_hash, state.info.world_size, state.info.step);
}

}  // namespace lifeline
