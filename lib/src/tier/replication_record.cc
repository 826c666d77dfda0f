#include "lifeline/internal/replication_record.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace lifeline {
namespace {

bool IsTemporaryName(const std::string& name) { return name.find(".tmp-") != std::string::npos; }

bool HasRecordShape(const std::string& name) {
  constexpr std::string_view kPrefix = "ranks-", kSuffix = ".json";
  return name.size() > kPrefix.size() + kSuffix.size() && name.compare(0, kPrefix.size(), kPrefix) == 0 &&
         name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

// Why `r` could not be a record, or empty. The one check shared by the writer and the reader, so
// that whatever is written can be read.
std::string InvalidReason(const ReplicationRecord& r) {
  if (r.world_size == 0 || r.world_size > kMaxReplicationWorldSize)
    return "world_size " + std::to_string(r.world_size) + " is not in 1.." + std::to_string(kMaxReplicationWorldSize);
  if (r.ranks == 0) return "ranks is 0";
  if (uint64_t{r.first_rank} + r.ranks > r.world_size)
    return "ranks " + std::to_string(r.first_rank) + ".." + std::to_string(uint64_t{r.first_rank} + r.ranks - 1) +
           " are not all in a world of " + std::to_string(r.world_size);
  if (r.steps.size() > kMaxReplicationRecordSteps)
    return std::to_string(r.steps.size()) + " steps, more than " + std::to_string(kMaxReplicationRecordSteps);
  return "";
}

void SortSteps(std::vector<uint64_t>* steps) {
  std::sort(steps->begin(), steps->end(), std::greater<uint64_t>());
  steps->erase(std::unique(steps->begin(), steps->end()), steps->end());
}

// Parses one record; an error message (without the path) when it is not one.
Result<ReplicationRecord> ParseRecord(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption("not a JSON object");
  const auto format = j.find("format");
  if (format == j.end() || !format->is_string() || format->get<std::string>() != kReplicationRecordFormat)
    return Status::Corruption(std::string("\"format\" is not \"") + kReplicationRecordFormat + "\"");
  ReplicationRecord r;
  auto unsigned_field = [&j](const char* key, uint64_t limit, uint64_t* out) -> Status {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned() || it->get<uint64_t>() > limit)
      return Status::Corruption(std::string("\"") + key + "\" is missing or not an integer in 0.." +
                                std::to_string(limit));
    *out = it->get<uint64_t>();
    return Status::OK();
  };
  uint64_t world = 0, first = 0, ranks = 0;
  LL_RETURN_IF_ERROR(unsigned_field("world_size", kMaxReplicationWorldSize, &world));
  LL_RETURN_IF_ERROR(unsigned_field("first_rank", kMaxReplicationWorldSize, &first));
  LL_RETURN_IF_ERROR(unsigned_field("ranks", kMaxReplicationWorldSize, &ranks));
  LL_RETURN_IF_ERROR(unsigned_field("updated_unix_ms", UINT64_MAX, &r.updated_unix_ms));
  r.world_size = static_cast<uint32_t>(world);
  r.first_rank = static_cast<uint32_t>(first);
  r.ranks = static_cast<uint32_t>(ranks);
  const auto node = j.find("node");
  if (node == j.end() || !node->is_string()) return Status::Corruption("\"node\" is missing or not a string");
  r.node = node->get<std::string>();
  const auto peers = j.find("peers");
  if (peers == j.end() || !peers->is_array()) return Status::Corruption("\"peers\" is missing or not an array");
  for (const nlohmann::json& p : *peers) {
    if (!p.is_string()) return Status::Corruption("\"peers\" holds something other than a string");
    r.peers.push_back(p.get<std::string>());
  }
  const auto steps = j.find("steps");
  if (steps == j.end() || !steps->is_array()) return Status::Corruption("\"steps\" is missing or not an array");
  for (const nlohmann::json& s : *steps) {
    if (!s.is_number_unsigned()) return Status::Corruption("\"steps\" holds something other than a step number");
    r.steps.push_back(s.get<uint64_t>());
  }
  if (std::string why = InvalidReason(r); !why.empty()) return Status::Corruption(why);
  SortSteps(&r.steps);
  return r;
}

}  // namespace

std::string ReplicationRecordFileName(const ReplicationRecord& record) {
  const uint64_t last = uint64_t{record.first_rank} + record.ranks - (record.ranks > 0 ? 1 : 0);
  return "ranks-" + std::to_string(record.first_rank) + "-" + std::to_string(last) + "-of-" +
         std::to_string(record.world_size) + ".json";
}

Status WriteReplicationRecord(Env* env, const std::string& checkpoint_dir, const ReplicationRecord& record) {
  ReplicationRecord r = record;
  SortSteps(&r.steps);
  if (r.steps.size() > kMaxReplicationRecordSteps) r.steps.resize(kMaxReplicationRecordSteps);
  if (std::string why = InvalidReason(r); !why.empty())
    return Status::InvalidArgument("replication record for " + checkpoint_dir, why);
  if (r.updated_unix_ms == 0) {
    r.updated_unix_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  std::chrono::system_clock::now().time_since_epoch())
                                                  .count());
  }
  // A checkpoint directory removed under a running job stays removed: a record never creates one.
  if (!env->IsDirectory(checkpoint_dir)) return Status::NotFound(checkpoint_dir, "no such checkpoint directory");
  const std::string dir = JoinPath(checkpoint_dir, kReplicationRecordDirName);
  Result<EntryType> type = env->GetEntryType(dir);
  if (type.ok() && *type == EntryType::kSymlink) return SymlinkRefused(dir);
  if (!type.ok()) {
    if (!type.status().IsNotFound()) return type.status();
    LL_RETURN_IF_ERROR(env->CreateDir(dir));
    LL_RETURN_IF_ERROR(env->SyncDir(checkpoint_dir));
  }
  const nlohmann::json j = {{"format", kReplicationRecordFormat},
                            {"world_size", r.world_size},
                            {"first_rank", r.first_rank},
                            {"ranks", r.ranks},
                            {"node", r.node},
                            {"peers", r.peers},
                            {"steps", r.steps},
                            {"updated_unix_ms", r.updated_unix_ms}};
  // Node ids come from etcd: bytes that are not UTF-8 are replaced rather than thrown over.
  const std::string text = j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (text.size() > kMaxReplicationRecordBytes)
    return Status::InvalidArgument("replication record for " + checkpoint_dir,
                                   "of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                                       std::to_string(kMaxReplicationRecordBytes));
  return WriteFileAtomically(env, JoinPath(dir, ReplicationRecordFileName(r)), text);
}

Status RemoveReplicationRecord(Env* env, const std::string& checkpoint_dir, const ReplicationRecord& record) {
  const std::string dir = JoinPath(checkpoint_dir, kReplicationRecordDirName);
  Result<EntryType> type = env->GetEntryType(dir);
  if (type.status().IsNotFound()) return Status::OK();
  LL_RETURN_IF_ERROR(type.status());
  if (*type == EntryType::kSymlink) return SymlinkRefused(dir);
  Status s = env->RemoveFile(JoinPath(dir, ReplicationRecordFileName(record)));
  if (s.IsNotFound()) return Status::OK();
  LL_RETURN_IF_ERROR(s);
  return env->SyncDir(dir);
}

Result<std::vector<ReplicationRecord>> ReadReplicationRecords(Env* env, const std::string& checkpoint_dir,
                                                              std::vector<std::string>* skipped) {
  auto skip = [skipped](const std::string& path, const std::string& why) {
    if (skipped != nullptr) skipped->push_back(path + ": " + why);
  };
  std::vector<ReplicationRecord> records;
  const std::string dir = JoinPath(checkpoint_dir, kReplicationRecordDirName);
  Result<EntryType> dir_type = env->GetEntryType(dir);
  if (dir_type.status().IsNotFound()) return records;
  LL_RETURN_IF_ERROR(dir_type.status());
  if (*dir_type == EntryType::kSymlink) {
    skip(dir, "is a symbolic link; not followed");
    return records;
  }
  if (*dir_type != EntryType::kDirectory) {
    skip(dir, "is not a directory");
    return records;
  }
  Result<std::vector<std::string>> names = env->GetChildren(dir);
  if (names.status().IsNotFound()) return records;  // removed with its checkpoint directory meanwhile
  LL_RETURN_IF_ERROR(names.status());
  std::sort(names->begin(), names->end());
  for (const std::string& name : *names) {
    if (IsTemporaryName(name)) continue;
    const std::string path = JoinPath(dir, name);
    if (!HasRecordShape(name)) {
      skip(path, "not a replication record's name (ranks-<first>-<last>-of-<world>.json)");
      continue;
    }
    Result<EntryType> type = env->GetEntryType(path);
    if (type.status().IsNotFound()) continue;  // replaced or removed by its writer meanwhile
    if (!type.ok()) {
      skip(path, type.status().ToString());
      continue;
    }
    if (*type == EntryType::kSymlink) {
      skip(path, "is a symbolic link; not followed");
      continue;
    }
    if (*type != EntryType::kFile) {
      skip(path, "is not a regular file");
      continue;
    }
    // Opened without following a link, so one swapped in after the check above is refused too.
    Result<std::string> text = ReadFileToString(env, path, kMaxReplicationRecordBytes);
    if (text.status().IsNotFound()) continue;
    if (text.status().code() == StatusCode::kResourceExhausted) {
      skip(path, "larger than " + std::to_string(kMaxReplicationRecordBytes) + " bytes: not a replication record");
      continue;
    }
    if (!text.ok()) {
      skip(path, text.status().ToString());
      continue;
    }
    Result<ReplicationRecord> record = ParseRecord(*text);
    if (!record.ok()) {
      skip(path, "not a replication record: " + record.status().message());
      continue;
    }
    if (const std::string expected = ReplicationRecordFileName(*record); expected != name) {
      skip(path, "holds the record of " + expected + ", not of its own name");
      continue;
    }
    records.push_back(std::move(*record));
  }
  std::sort(records.begin(), records.end(), [](const ReplicationRecord& a, const ReplicationRecord& b) {
    return std::pair(a.world_size, a.first_rank) < std::pair(b.world_size, b.first_rank);
  });
  return records;
}

uint32_t ReplicatedRanks(const std::vector<ReplicationRecord>& records, uint64_t step, uint32_t world_size) {
  // The records' rank ranges holding `step`, merged: overlapping records count a rank once.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const ReplicationRecord& r : records) {
    if (r.world_size != world_size || world_size == 0 || r.ranks == 0) continue;
    if (std::find(r.steps.begin(), r.steps.end(), step) == r.steps.end()) continue;
    const uint64_t end = std::min<uint64_t>(uint64_t{r.first_rank} + r.ranks, world_size);
    if (r.first_rank < end) ranges.emplace_back(r.first_rank, end);
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t counted = 0, covered_to = 0;
  for (const auto& [begin, end] : ranges) {
    const uint64_t from = std::max(begin, covered_to);
    if (end > from) counted += end - from;
    covered_to = std::max(covered_to, end);
  }
  return static_cast<uint32_t>(counted);
}

}  // namespace lifeline
