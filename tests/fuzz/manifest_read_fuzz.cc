// libFuzzer target: a step directory as a hostile or damaged storage would leave it, opened the way
// every load opens one (CheckpointReader::Open: ScanStep, ReadManifest, the rank indexes decoded and
// merged by BuildManifest, the geometry checks on the merged fragments). It must never crash; a
// manifest it accepts must describe every tensor element exactly once and encode again.
//
// Input: index files one after the other, each ending with its end magic "LLINDEND" (so a seed is
// the concatenation of a checkpoint's rank indexes and manifest). Each is resealed
// (index_reseal.h); one that decodes is stored under the name its content gives it (rank index or
// manifest of its run, rank and world size), one that does not under the name of rank i of the
// first decoded attempt, i being its position. All go into the directory of the first decoded
// index's step, in an in-memory Env.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "formats/geometry.h"
#include "formats/index_codec.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/load/checkpoint_reader.h"
#include "lifeline/env.h"
#include "tests/fuzz/index_reseal.h"

namespace {

using namespace lifeline;

constexpr std::string_view kEndMagic = "LLINDEND";
constexpr size_t kMaxFiles = 16;

std::vector<std::string> SplitAfterEndMagic(std::string_view input) {
  std::vector<std::string> pieces;
  while (!input.empty() && pieces.size() < kMaxFiles) {
    size_t at = input.find(kEndMagic);
    const size_t len = at == std::string_view::npos ? input.size() : at + kEndMagic.size();
    pieces.emplace_back(input.substr(0, len));
    input.remove_prefix(len);
  }
  return pieces;
}

// What the reader promises about a manifest it returns.
void CheckAccepted(const format::CheckpointIndex& m) {
  if (m.kind != format::IndexKind::kManifest) std::abort();
  if (!format::EncodeIndex(m).ok()) std::abort();
  std::vector<std::vector<format::Region>> regions(m.tensors.size());
  for (const format::FragmentInfo& f : m.fragments) regions.at(f.tensor).push_back(f.region);
  std::vector<format::Overlap> overlaps;
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    int64_t volume = 1;
    for (int64_t d : m.tensors[t].shape) volume *= d;  // ValidateIndex: no overflow
    int64_t stored = 0;
    for (const format::Region& r : regions[t]) stored += r.num_elements();
    if (stored != volume) std::abort();  // a gap or a double write
    overlaps.clear();
    format::PlanOverlaps(regions[t], regions[t], &overlaps);
    for (const format::Overlap& o : overlaps)
      if (o.source != o.target) std::abort();  // two fragments hold the same element
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> pieces =
      SplitAfterEndMagic(std::string_view(reinterpret_cast<const char*>(data), size));
  struct Named {
    std::string bytes;
    Result<format::CheckpointIndex> index;
  };
  std::vector<Named> files;
  const format::CheckpointIndex* first = nullptr;
  for (const std::string& piece : pieces) {
    std::string bytes = piece;
    fuzz::ResealIndex(&bytes);
    Result<format::CheckpointIndex> index = format::DecodeIndex(bytes, "fuzz");
    files.push_back(Named{std::move(bytes), std::move(index)});
  }
  for (const Named& f : files) {
    if (f.index.ok()) {
      first = &*f.index;
      break;
    }
  }
  if (first == nullptr) return 0;

  std::unique_ptr<MemEnv> env = NewMemEnv();
  const std::string root = "/ckpt";
  const std::string dir = JoinPath(root, StepDirName(first->step));
  if (!env->CreateDir(root).ok() || !env->CreateDir(dir).ok()) std::abort();
  const std::string first_hash = RunHash(first->run_id);
  for (size_t i = 0; i < files.size(); ++i) {
    std::string name;
    if (files[i].index.ok()) {
      const format::CheckpointIndex& x = *files[i].index;
      name = x.kind == format::IndexKind::kManifest ? ManifestFileName(RunHash(x.run_id), x.world_size)
                                                    : IndexFileName(RunHash(x.run_id), x.rank, x.world_size);
    } else {
      name = IndexFileName(first_hash, static_cast<uint32_t>(i), first->world_size);
    }
    if (!WriteFileAtomically(env.get(), JoinPath(dir, name), files[i].bytes).ok()) std::abort();
  }

  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(env.get(), root, first->step);
  if (reader.ok()) CheckAccepted((*reader)->manifest());
  return 0;
}
