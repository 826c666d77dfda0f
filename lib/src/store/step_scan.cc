#include "lib/src/store/step_scan.h"

#include <algorithm>
#include <map>
#include <set>

#include "formats/geometry.h"
#include "formats/index_codec.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lifeline/log.h"

#include <nlohmann/json.hpp>

namespace lifeline {
namespace {

// The reason a suspect marker gives: its "message", else its text as it is (never trusted further).
std::string SuspectMessage(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  return "suspect (" + std::to_string(text.size()) + " bytes of marker, no message)";
}

// An index or manifest larger than the format allows is damage, not a resource problem: saying
// Corruption lets a load fall back to an older checkpoint instead of giving up.
Result<std::string> ReadIndexFile(Env* env, const std::string& path) {
  Result<std::string> bytes = ReadFileToString(env, path, format::kMaxIndexBytes);
  if (bytes.status().code() == StatusCode::kResourceExhausted) return Status::Corruption(bytes.status().message());
  return bytes;
}

Status CheckManifestIdentity(const format::CheckpointIndex& manifest, const StepState& state, const std::string& path) {
  if (manifest.kind != format::IndexKind::kManifest || manifest.step != state.info.step ||
      manifest.world_size != state.info.world_size || RunHash(manifest.run_id) != state.run_hash)
    return Status::Corruption(path, "manifest describes another step or save attempt than its name");
  return Status::OK();
}

}  // namespace

Result<StepState> ScanStep(Env* env, const std::string& step_dir, uint64_t step) {
  StepState state;
  state.info.step = step;
  state.info.directory = step_dir;
  // A link in place of a step directory, index or manifest would let a load read, or retention
  // delete, files outside the checkpoint: such entries are reported, never followed.
  if (Result<EntryType> type = env->GetEntryType(step_dir); type.ok() && *type == EntryType::kSymlink) {
    state.info.problem = "the step directory is a symbolic link, not followed (Lifeline never follows links inside a checkpoint)";
    return state;
  }
  LL_ASSIGN_OR_RETURN(state.children, env->GetChildren(step_dir));
  std::map<std::pair<std::string, uint32_t>, std::set<uint32_t>> attempts;
  std::set<std::pair<std::string, uint32_t>> manifests, invalid;
  std::string linked;  // the first index or manifest name that is a link
  for (const std::string& name : state.children) {
    if (auto bad = ParseInvalidMarkerFileName(name)) {
      invalid.insert({bad->run_hash, bad->world_size});
      continue;
    }
    const bool ours = ParseIndexFileName(name) || ParseManifestFileName(name);
    if (ours && env->GetEntryType(JoinPath(step_dir, name)).value_or(EntryType::kFile) == EntryType::kSymlink) {
      if (linked.empty()) linked = name;
      continue;
    }
    if (auto idx = ParseIndexFileName(name)) {
      attempts[{idx->run_hash, idx->world_size}].insert(idx->rank);
    } else if (auto man = ParseManifestFileName(name)) {
      manifests.insert({man->run_hash, man->world_size});
    }
  }
  // Prefer a complete attempt with a manifest, then any complete one, then the most advanced, and
  // an attempt marked invalid last.
  const std::pair<std::string, uint32_t>* best = nullptr;
  int best_score = -1;
  size_t best_present = 0;
  for (const auto& [key, ranks] : attempts) {
    const bool complete = ranks.size() == key.second;
    const int score = invalid.count(key) ? 0 : complete ? (manifests.count(key) ? 3 : 2) : 1;
    if (score > best_score || (score == best_score && ranks.size() > best_present)) {
      best = &key;
      best_score = score;
      best_present = ranks.size();
    }
  }
  const std::string link_note = linked.empty() ? "" : "; " + linked + " is a symbolic link, not followed";
  if (best == nullptr) {
    state.info.problem = "no rank index" + link_note;
    return state;
  }
  const std::set<uint32_t>& ranks = attempts[*best];
  state.run_hash = best->first;
  state.info.world_size = best->second;
  state.info.ranks_present = static_cast<uint32_t>(ranks.size());
  state.info.complete = best_score >= 2;
  state.has_manifest = best_score == 3;
  if (best_score == 0) {
    state.info.invalid = true;
    const std::string marker = JoinPath(step_dir, InvalidMarkerFileName(state.run_hash, state.info.world_size));
    Result<std::string> reason = ReadFileToString(env, marker, 64 << 10);
    state.info.problem = "invalid, never loaded: " + (reason.ok() ? *reason : reason.status().ToString());
  } else if (state.info.complete) {
    if (std::find(state.children.begin(), state.children.end(), kSuspectMarkerName) != state.children.end()) {
      state.info.suspect = true;
      Result<std::string> text = ReadFileToString(env, JoinPath(step_dir, kSuspectMarkerName), kMaxSuspectMarkerBytes);
      state.info.suspect_reason = text.ok() ? SuspectMessage(*text) : text.status().ToString();
    }
  } else if (!state.info.complete) {
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
                         " rank indexes present (missing rank " + missing + ")" + link_note;
  }
  // The attempt's data and index files as listed, not probed rank by rank: the world size comes
  // from a file name (up to 999999), and one stray name must not cost two million lookups a scan.
  for (const std::string& name : state.children) {
    constexpr std::string_view kData = ".data";
    const bool data = name.size() > kData.size() && name.compare(name.size() - kData.size(), kData.size(), kData) == 0;
    const auto file = ParseIndexFileName(data ? name.substr(0, name.size() - kData.size()) + ".index" : name);
    if (!file || file->run_hash != state.run_hash || file->world_size != best->second) continue;
    auto size = env->GetFileSize(JoinPath(step_dir, name));
    if (size.ok()) state.info.bytes += *size;
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
  return manifest;
}

Result<ManifestParts> OpenManifestParts(Env* env, const StepState& state) {
  ManifestParts out;
  if (!state.info.complete || !state.has_manifest) return out;
  const std::string path = JoinPath(state.info.directory, ManifestFileName(state.run_hash, state.info.world_size));
  LL_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path, FileOptions{}));
  LL_ASSIGN_OR_RETURN(const uint64_t size, file->Size());
  // The reader keeps the file open for the fragments asked for later.
  std::shared_ptr<RandomAccessFile> shared(std::move(file));
  auto read = [shared](uint64_t offset, uint64_t length, char* out) { return shared->ReadAt(offset, out, length); };
  Result<std::unique_ptr<format::ManifestPartReader>> parts = format::ManifestPartReader::Open(read, size, path);
  if (!parts.ok()) {
    if (parts.status().IsCorruption() || parts.status().IsNotSupported()) return out;  // ReadManifest decides
    return parts.status();
  }
  if (*parts == nullptr || !CheckManifestIdentity((*parts)->head(), state, path).ok()) return out;
  out.head = (*parts)->head();
  out.parts = std::move(*parts);
  return out;
}

Result<format::CheckpointIndex> ReadManifest(Env* env, const StepState& state) {
  const std::string& dir = state.info.directory;
  if (!state.info.complete) return Status::NotFound(dir, "checkpoint is not complete: " + state.info.problem);
  if (state.has_manifest) {
    const std::string path = JoinPath(dir, ManifestFileName(state.run_hash, state.info.world_size));
    auto read = [&]() -> Result<format::CheckpointIndex> {
      LL_ASSIGN_OR_RETURN(std::string bytes, ReadIndexFile(env, path));
      LL_ASSIGN_OR_RETURN(format::CheckpointIndex manifest, format::DecodeIndex(bytes, path));
      LL_RETURN_IF_ERROR(CheckManifestIdentity(manifest, state, path));
      // The same rule as a merge of the rank indexes: a manifest is trusted no more than they are.
      LL_RETURN_IF_ERROR(format::ValidateCoverage(manifest, path, /*untrusted=*/true));
      return manifest;
    };
    Result<format::CheckpointIndex> manifest = read();
    // A damaged manifest, or one of a format version this reader does not know beside rank indexes
    // it does: the rank indexes are the commit record, the manifest only their merge, made again here.
    if (manifest.ok() || (!manifest.status().IsCorruption() && !manifest.status().IsNotSupported()))
      return manifest;
    Result<format::CheckpointIndex> merged =
        MergeRankIndexes(env, dir, state.run_hash, state.info.world_size, state.info.step);
    if (!merged.ok()) return manifest.status();
    Log(LogLevel::kWarning, "ignoring the manifest, merged the rank indexes instead: " + manifest.status().ToString());
    return merged;
  }
  return MergeRankIndexes(env, dir, state.run_hash, state.info.world_size, state.info.step);
}

Result<std::vector<CheckpointInfo>> ScanCheckpoints(Env* env, const std::string& root) {
  // A prefix of an object store exists while objects do: an empty one is an empty directory, and
  // the listing below says what is wrong with the bucket or the credentials.
  const bool object_store = IsObjectStorePath(root);
  if (!object_store && !env->IsDirectory(root)) return Status::NotFound(root, "no such checkpoint directory");
  // A step removed between the listing and its scan was removed by the retention of a concurrent
  // save, which committed a newer step the listing may predate: list again to see it.
  for (int attempt = 0;; ++attempt) {
    LL_ASSIGN_OR_RETURN(std::vector<std::string> children, env->GetChildren(root));
    std::vector<std::pair<uint64_t, std::string>> steps;
    for (const std::string& name : children)
      if (auto step = ParseStepDirName(name)) steps.emplace_back(*step, JoinPath(root, name));
    std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<CheckpointInfo> out;
    bool vanished = false;
    for (const auto& [step, dir] : steps) {
      Result<StepState> state = ScanStep(env, dir, step);
      if (state.status().IsNotFound() && !env->FileExists(dir)) {
        vanished = true;
        continue;
      }
      if (!state.ok()) return state.status();
      // A prefix with no object below is no step: some stores (SeaweedFS) list the folder of a
      // step just removed for a while after its last object is gone.
      if (object_store && state->children.empty()) continue;
      out.push_back(std::move(state->info));
    }
    if (!vanished || attempt == 4) return out;
  }
}

}  // namespace lifeline
