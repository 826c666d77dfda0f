#include "lib/src/save/rank_objects.h"

#include <optional>

namespace lifeline {
namespace {

constexpr std::string_view kFoldPrefix = "rank";

// The R of a folded name "rank<R>/<rest>" written by FoldObject (canonical decimal, in range,
// non-empty rest), with the position of the '/'.
std::optional<std::pair<uint32_t, size_t>> ParseFolded(std::string_view name) {
  if (!IsReservedObjectName(name)) return std::nullopt;
  const size_t slash = name.find('/');
  const std::string_view digits = name.substr(kFoldPrefix.size(), slash - kFoldPrefix.size());
  if ((digits.size() > 1 && digits[0] == '0') || digits.size() > 7 || slash + 1 == name.size()) return std::nullopt;
  uint64_t r = 0;
  for (char c : digits) r = r * 10 + static_cast<uint64_t>(c - '0');
  if (r >= format::kMaxWorldSize) return std::nullopt;
  return std::make_pair(static_cast<uint32_t>(r), slash);
}

}  // namespace

bool IsReservedObjectName(std::string_view name) {
  if (name.substr(0, kFoldPrefix.size()) != kFoldPrefix) return false;
  size_t i = kFoldPrefix.size();
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  return i > kFoldPrefix.size() && i < name.size() && name[i] == '/';
}

RankedObjectName SavedObjectOf(const format::ObjectInfo& object, uint32_t world) {
  if (const auto folded = ParseFolded(object.name);
      folded && world > 0 && folded->first >= world && folded->first % world == object.rank)
    return RankedObjectName{folded->first, object.name.substr(folded->second + 1)};
  return RankedObjectName{object.rank, object.name};
}

std::vector<RankObjectRef> ObjectsSavedBy(const format::CheckpointIndex& manifest, uint32_t saved_rank) {
  std::vector<RankObjectRef> out;
  for (const format::ObjectInfo& o : manifest.objects) {
    RankedObjectName saved = SavedObjectOf(o, manifest.world_size);
    if (saved.rank == saved_rank) out.push_back(RankObjectRef{&o, std::move(saved.name)});
  }
  return out;
}

Result<RankedObjectName> FoldObject(uint32_t saved_rank, std::string_view name, uint32_t world) {
  const std::string what = "object '" + std::string(name) + "' of rank " + std::to_string(saved_rank);
  if (world == 0 || world > format::kMaxWorldSize || saved_rank >= format::kMaxWorldSize)
    return Status::InvalidArgument(what, "cannot be placed in a world of " + std::to_string(world) + " ranks");
  if (IsReservedObjectName(name))
    return Status::InvalidArgument(what, "names of the form rank<R>/... are reserved for objects of ranks beyond "
                                         "a converted checkpoint's world size");
  if (saved_rank < world) return RankedObjectName{saved_rank, std::string(name)};
  std::string folded = std::string(kFoldPrefix) + std::to_string(saved_rank) + "/" + std::string(name);
  if (folded.size() > format::kMaxNameBytes)
    return Status::InvalidArgument(what, "its folded name '" + folded.substr(0, 64) + "...' exceeds " +
                                             std::to_string(format::kMaxNameBytes) + " bytes");
  return RankedObjectName{saved_rank % world, std::move(folded)};
}

}  // namespace lifeline
