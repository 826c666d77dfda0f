// Per-rank objects across world sizes: the one rule that says which saved rank an object of a
// checkpoint belongs to (formats/SPEC.md §8).
//
// A rank's objects (RNG state, data-loader position) are stored by the rank that saved them. A
// checkpoint converted to a world W smaller than the saving job's has no rank R >= W to hold the
// objects of saved rank R: rank R mod W holds them under the folded name "rank<R>/<name>" (R in
// decimal, no leading zeros). Names of that form are reserved for this: Checkpointer::Save refuses
// them, and FoldObject (used by `lifeline convert`, the only writer of folded names) refuses to fold
// them again, so a folded entry is never mistaken for a plain one.
//
// Every reader (Checkpointer::Load, the CLI's checkpoint source, diff, bench load) asks through
// SavedObjectOf / ObjectsSavedBy, so an object keeps its saving rank and name through any number
// of conversions.
//
// Thread safety: pure functions.
#ifndef LIFELINE_SRC_RANK_OBJECTS_H_
#define LIFELINE_SRC_RANK_OBJECTS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/model.h"
#include "lifeline/status.h"

namespace lifeline {

// True when `name` starts with "rank<digits>/": the reserved folded form.
bool IsReservedObjectName(std::string_view name);

// A rank and an object name: who saved an object and under what name, or who stores it and how.
struct RankedObjectName {
  uint32_t rank = 0;
  std::string name;
};

// The saving rank and name of `object`, stored in a checkpoint of world size `world`: a folded
// entry "rank<R>/<name>" held by rank R mod W with R >= W is R's object <name>; anything else is
// the holder's, under its stored name.
RankedObjectName SavedObjectOf(const format::ObjectInfo& object, uint32_t world);

// The objects of `manifest` saved by rank `saved_rank`, in manifest order, each with its saved
// name. Empty when that rank saved none, including a rank the saving job never had (e.g. rank 6
// of a 4-rank save): which ranks existed is not recorded beyond the objects themselves.
struct RankObjectRef {
  const format::ObjectInfo* object;  // into `manifest`
  std::string name;                  // as saved
};
std::vector<RankObjectRef> ObjectsSavedBy(const format::CheckpointIndex& manifest, uint32_t saved_rank);

// Where a checkpoint of world size `world` stores object `name` of saved rank `saved_rank`: that
// rank under `name` when saved_rank < world, else rank saved_rank mod world under the folded name.
// InvalidArgument naming the object when `name` is reserved, the folded name would exceed
// format::kMaxNameBytes, `world` is 0 or a rank is out of range.
Result<RankedObjectName> FoldObject(uint32_t saved_rank, std::string_view name, uint32_t world);

}  // namespace lifeline

#endif  // LIFELINE_SRC_RANK_OBJECTS_H_
