#include "lib/src/save/save_plan.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "formats/checksum.h"
#include "formats/geometry.h"

namespace lifeline {
namespace {

format::Region RegionOf(const TensorShard& s) {
  format::Region r;
  r.offsets = s.offsets;
  r.shape = s.shape;
  r.flat_begin = s.flat_begin;
  r.flat_end = s.flat_end;
  return r;
}

}  // namespace

uint64_t ReplicaHash(const std::string& name, const format::Region& r) {
  std::string key = name;
  key.push_back('\0');
  auto put = [&key](int64_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  for (int64_t v : r.offsets) put(v);
  for (int64_t v : r.shape) put(v);
  put(r.flat_begin);
  put(r.flat_end);
  return format::Checksum64(key);
}

namespace {

constexpr uint64_t kColumnBlockMinBytes = uint64_t{64} << 10;
constexpr uint64_t kColumnBlockMinRunBytes = 256;
constexpr int64_t kColumnBlocksMax = 16;

// Appends `pf` to the plan, as column blocks when asked and it qualifies (see PlanRankSave).
void AddFragment(RankSavePlan& plan, PlannedFragment pf, size_t elem, bool blocks_wanted) {
  const format::Region& r = pf.region;
  const std::vector<int64_t>& global = plan.tensors[pf.tensor].shape;
  const size_t n = r.shape.size();
  const int64_t cols = n >= 2 ? r.shape[n - 1] : 0;
  const int64_t blocks = cols > 0 ? std::min<int64_t>(kColumnBlocksMax, cols * static_cast<int64_t>(elem) /
                                                                             static_cast<int64_t>(kColumnBlockMinRunBytes))
                                  : 0;
  // Whole rows [r0, r1) of the box; partial ones only for a 2-d box.
  int64_t volume = 0;
  format::CheckedVolume(r.shape, &volume);  // validated: no overflow
  const int64_t r0 = cols > 0 ? (r.flat_begin + cols - 1) / cols : 0;
  const int64_t r1 = cols > 0 ? r.flat_end / cols : 0;
  const bool whole_box = r.flat_begin == 0 && r.flat_end == volume;
  if (!blocks_wanted || pf.source == nullptr || cols == 0 || global[n - 1] == cols || blocks < 2 || (n > 2 && !whole_box) ||
      r1 <= r0 || static_cast<uint64_t>((r1 - r0) * cols) * elem < kColumnBlockMinBytes) {
    plan.fragments.push_back(std::move(pf));
    return;
  }
  auto packed = [&](int64_t begin, int64_t end) {  // elements [begin, end) of the box, kept row-major
    if (begin >= end) return;
    PlannedFragment part = pf;
    part.region = format::SubRegion(r, begin - r.flat_begin, end - r.flat_begin);
    part.source = pf.source + static_cast<uint64_t>(begin - r.flat_begin) * elem;
    plan.fragments.push_back(std::move(part));
  };
  packed(r.flat_begin, r0 * cols);
  const int64_t width = (cols + blocks - 1) / blocks;
  for (int64_t c0 = 0; c0 < cols; c0 += width) {
    const int64_t w = std::min(width, cols - c0);
    PlannedFragment block = pf;
    std::vector<int64_t> offsets = r.offsets, shape = r.shape;
    if (n == 2) {
      offsets[0] += r0;
      shape[0] = r1 - r0;
    }
    offsets[n - 1] += c0;
    shape[n - 1] = w;
    block.region = format::RegionOfBox(offsets, shape);
    block.source = pf.source + static_cast<uint64_t>(r0 * cols + c0 - r.flat_begin) * elem;
    block.source_stride = static_cast<uint64_t>(cols) * elem;
    block.run_bytes = static_cast<uint64_t>(w) * elem;
    plan.fragments.push_back(std::move(block));
  }
  packed(r1 * cols, r.flat_end);
}

}  // namespace

void GatherRuns(const uint8_t* source, uint64_t stride, uint64_t run, uint64_t offset, uint64_t n, uint8_t* dst) {
  uint64_t in_row = offset % run;
  for (const uint8_t* at = source + offset / run * stride; n > 0; at += stride, in_row = 0) {
    const uint64_t take = std::min(n, run - in_row);
    std::memcpy(dst, at + in_row, take);
    dst += take;
    n -= take;
  }
}

void CopyFragmentBytes(const PlannedFragment& pf, uint64_t offset, uint64_t n, uint8_t* dst) {
  if (pf.strided()) {
    GatherRuns(pf.source, pf.source_stride, pf.run_bytes, offset, n, dst);
  } else {
    std::memcpy(dst, pf.source + offset, n);
  }
}

Result<RankSavePlan> PlanRankSave(const SaveRequest& request, uint64_t replica_split_bytes, bool require_data,
                                  bool column_blocks) {
  RankSavePlan plan;
  std::unordered_map<std::string, uint32_t> by_name;
  for (size_t i = 0; i < request.tensors.size(); ++i) {
    const TensorShard& s = request.tensors[i];
    const std::string what = "tensor '" + s.name + "'";
    if (s.name.empty() || s.name.size() > format::kMaxNameBytes || s.name.find('\0') != std::string::npos)
      return Status::InvalidArgument("tensor #" + std::to_string(i), "name must be 1 to 4096 bytes without NUL");
    if (DTypeSize(s.dtype) == 0) return Status::InvalidArgument(what, "invalid dtype");
    if (s.global_shape.size() > format::kMaxRank) return Status::InvalidArgument(what, "too many dimensions");
    const format::Region region = RegionOf(s);
    LL_RETURN_IF_ERROR(format::ValidateRegion(region, s.global_shape, what, /*untrusted=*/false));
    if (s.replica_count == 0 || s.replica_index >= s.replica_count)
      return Status::InvalidArgument(what, "replica index " + std::to_string(s.replica_index) + " not below count " +
                                               std::to_string(s.replica_count));
    if (require_data && region.num_elements() > 0 && s.data == nullptr)
      return Status::InvalidArgument(what, "data is null");

    auto [it, inserted] = by_name.emplace(s.name, static_cast<uint32_t>(plan.tensors.size()));
    if (inserted) {
      plan.tensors.push_back(format::TensorInfo{s.name, s.dtype, s.global_shape});
    } else {
      const format::TensorInfo& t = plan.tensors[it->second];
      if (t.dtype != s.dtype || t.shape != s.global_shape)
        return Status::InvalidArgument(what, "declared twice with different dtype or global shape");
    }
    const uint32_t tensor = it->second;
    const size_t elem = DTypeSize(s.dtype);
    const auto* base = static_cast<const uint8_t*>(s.data);
    const int64_t n = region.num_elements();
    if (n == 0) continue;
    const bool blockable = column_blocks && s.device < 0;  // host shards only (see PlanRankSave)
    if (s.replica_count == 1) {
      AddFragment(plan, PlannedFragment{tensor, region, base, static_cast<uint32_t>(i)}, elem, blockable);
    } else if (static_cast<uint64_t>(n) * elem > replica_split_bytes) {
      const int64_t parts = s.replica_count, i_part = s.replica_index;
      const int64_t per = n / parts, extra = n % parts;
      const int64_t begin = i_part * per + std::min(i_part, extra);
      const int64_t len = per + (i_part < extra ? 1 : 0);
      if (len > 0)
        AddFragment(plan,
                    PlannedFragment{tensor, format::SubRegion(region, begin, begin + len),
                                    base != nullptr ? base + static_cast<uint64_t>(begin) * elem : nullptr,
                                    static_cast<uint32_t>(i)},
                    elem, blockable);
    } else if (ReplicaHash(s.name, region) % s.replica_count == s.replica_index) {
      AddFragment(plan, PlannedFragment{tensor, region, base, static_cast<uint32_t>(i)}, elem, blockable);
    }
  }
  return plan;
}

}  // namespace lifeline
