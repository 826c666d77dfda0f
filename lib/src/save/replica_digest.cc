#include "lib/src/save/replica_digest.h"

#include <algorithm>

#include "formats/checksum.h"
#include "lifeline/trace.h"

namespace lifeline::internal {

std::shared_ptr<ReplicaDigestPlan> PlanReplicaDigests(const SaveRequest& request, const RankSavePlan& plan,
                                     const std::vector<format::FragmentInfo>& fragments, uint64_t chunk_bytes,
                                     uint64_t replica_split_bytes) {
  auto plan_ptr = std::make_shared<ReplicaDigestPlan>();
  ReplicaDigestPlan& out = *plan_ptr;
  // The fragments of each request tensor (this rank's own part of it).
  std::vector<std::vector<size_t>> own(request.tensors.size());
  for (size_t f = 0; f < plan.fragments.size(); ++f) own[plan.fragments[f].request_index].push_back(f);
  for (size_t i = 0; i < request.tensors.size(); ++i) {
    const TensorShard& s = request.tensors[i];
    if (s.replica_count < 2 || s.device >= 0 || s.data == nullptr) continue;
    format::Region region;
    region.offsets = s.offsets;
    region.shape = s.shape;
    region.flat_begin = s.flat_begin;
    region.flat_end = s.flat_end;
    const int64_t n = region.num_elements();
    if (n <= 0) continue;
    const uint64_t elem = DTypeSize(s.dtype);
    ReplicaShardDigest d;
    d.key = ReplicaHash(s.name, region);
    d.name = s.name;
    d.replica_count = s.replica_count;
    d.bytes = static_cast<uint64_t>(n) * elem;
    bool whole_box = true;
    for (size_t k = 0; k < s.shape.size(); ++k)
      whole_box = whole_box && s.offsets[k] == 0 && s.shape[k] == s.global_shape[k];
    d.tensor_offset = whole_box ? static_cast<uint64_t>(s.flat_begin) * elem : trace::kNoOffset;
    // The parts' byte ranges, as the replica rule cuts them; which one is this rank's.
    std::vector<std::pair<uint64_t, uint64_t>> parts;
    size_t mine = SIZE_MAX;
    if (d.bytes > replica_split_bytes) {
      const int64_t count = s.replica_count, per = n / count, extra = n % count;
      for (int64_t p = 0; p < count; ++p) {
        const int64_t begin = p * per + std::min(p, extra), len = per + (p < extra ? 1 : 0);
        if (len == 0) continue;
        if (p == static_cast<int64_t>(s.replica_index)) mine = parts.size();
        parts.emplace_back(static_cast<uint64_t>(begin) * elem, static_cast<uint64_t>(begin + len) * elem);
      }
    } else {
      if (ReplicaHash(s.name, region) % s.replica_count == s.replica_index) mine = 0;
      parts.emplace_back(0, d.bytes);
    }
    // This rank's chunks stand for its part only when the part is one packed fragment, chunked
    // from its start (column blocks reorder the bytes).
    const bool reuse = own[i].size() == 1 && !plan.fragments[own[i][0]].strided();
    const auto* base = static_cast<const uint8_t*>(s.data);
    for (size_t p = 0; p < parts.size(); ++p) {
      const auto [begin, end] = parts[p];
      if (p == mine && reuse) {
        const format::FragmentInfo& f = fragments[own[i][0]];
        for (uint64_t k = 0; k < f.num_chunks; ++k) d.units.push_back({true, f.first_chunk + k});
        continue;
      }
      for (uint64_t at = begin; at < end; at += chunk_bytes) {
        CopyPiece piece;
        piece.verify = true;
        piece.source = base + at;
        piece.length = std::min(chunk_bytes, end - at);
        piece.target = out.verify_pieces.size();
        piece.request_tensor = static_cast<uint32_t>(i);
        d.units.push_back({false, piece.target});
        out.verify_pieces.push_back(piece);
      }
    }
    out.shards.push_back(std::move(d));
  }
  return plan_ptr;
}

uint64_t ShardDigest(const ReplicaShardDigest& shard, const std::vector<format::ChunkInfo>& chunks,
                     const std::vector<uint64_t>& verify_hashes) {
  format::StreamingChecksum hasher;
  for (const ReplicaDigestUnit& u : shard.units) {
    const uint64_t h = u.own_chunk ? chunks[u.index].checksum : verify_hashes[u.index];
    uint8_t le[8];
    for (int b = 0; b < 8; ++b) le[b] = static_cast<uint8_t>(h >> (8 * b));
    hasher.Update(le, sizeof(le));
  }
  return hasher.Digest();
}

}  // namespace lifeline::internal
