// The semantic rules every index obeys, whether built by a caller or decoded from a file:
// ValidateIndex (references, regions, chunk counts, names, sizes) and ValidateCoverage (every
// element of a tensor stored once), with the checks on untrusted names they use.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "formats/geometry.h"
#include "formats/index_codec.h"
#include "formats/index_layout.h"

namespace lifeline::format {
namespace {

using internal::SourceName;

bool IsValidCodec(Codec c) { return static_cast<uint8_t>(c) <= static_cast<uint8_t>(Codec::kZstdByteGroup); }

// Raw (decoded) bytes of `elements` elements of `dtype`; false on overflow of uint64.
bool RawBytes(int64_t elements, DType dtype, uint64_t* out) {
  if (elements < 0) return false;
  return !__builtin_mul_overflow(static_cast<uint64_t>(elements), static_cast<uint64_t>(DTypeSize(dtype)), out);
}

// The conditions of ValidateRegion, checked without building any diagnostic: this runs once per
// fragment, a million times for a large manifest. ValidateRegion is then called only to describe
// a failure.
bool RegionFits(const Region& r, const std::vector<int64_t>& tensor_shape) {
  const size_t n = tensor_shape.size();
  if (n > kMaxRank || r.offsets.size() != n || r.shape.size() != n) return false;
  bool empty = false;
  for (size_t d = 0; d < n; ++d) {
    int64_t end;
    if (r.offsets[d] < 0 || r.shape[d] < 0 || __builtin_add_overflow(r.offsets[d], r.shape[d], &end) ||
        end > tensor_shape[d])
      return false;
    empty = empty || r.shape[d] == 0;
  }
  int64_t volume = empty ? 0 : 1;
  for (size_t d = 0; d < n && !empty; ++d)
    if (__builtin_mul_overflow(volume, r.shape[d], &volume)) return false;
  return r.flat_begin >= 0 && r.flat_begin <= r.flat_end && r.flat_end <= volume;
}

class IndexValidator {
 public:
  IndexValidator(const CheckpointIndex& index, std::string_view source, bool untrusted)
      : index_(index), source_(SourceName(source)), untrusted_(untrusted) {}

  Status Run() {
    LL_RETURN_IF_ERROR(CheckHeader());
    LL_RETURN_IF_ERROR(CheckFiles());
    LL_RETURN_IF_ERROR(CheckTensors());
    LL_RETURN_IF_ERROR(CheckFragments());
    return CheckObjects();
  }

 private:
  Status Fail(const std::string& msg) const {
    return untrusted_ ? Status::Corruption(source_, msg) : Status::InvalidArgument(source_, msg);
  }

  // A rank index only describes what its own rank wrote.
  bool RankAllowed(uint32_t rank) const {
    return index_.kind == IndexKind::kRankIndex ? rank == index_.rank : rank < index_.world_size;
  }
  std::string RankRule() const {
    return index_.kind == IndexKind::kRankIndex ? "the index's rank " + std::to_string(index_.rank)
                                                : "below world size " + std::to_string(index_.world_size);
  }

  Status CheckHeader() {
    if (index_.kind != IndexKind::kRankIndex && index_.kind != IndexKind::kManifest)
      return Fail("unknown index kind " + std::to_string(static_cast<unsigned>(index_.kind)));
    if (index_.world_size < 1 || index_.world_size > kMaxWorldSize)
      return Fail("world size " + std::to_string(index_.world_size) + " outside [1, " +
                  std::to_string(kMaxWorldSize) + "]");
    if (index_.kind == IndexKind::kRankIndex && index_.rank >= index_.world_size)
      return Fail("rank " + std::to_string(index_.rank) + " is not below world size " +
                  std::to_string(index_.world_size));
    if (index_.kind == IndexKind::kManifest && index_.rank != kManifestRank)
      return Fail("manifest carries rank " + std::to_string(index_.rank) + " instead of " +
                  std::to_string(kManifestRank));
    if (index_.chunk_bytes == 0 || index_.chunk_bytes % 8 != 0)
      return Fail("chunk size " + std::to_string(index_.chunk_bytes) + " is not a positive multiple of 8");
    return Status::OK();
  }

  Status CheckFiles() {
    std::unordered_set<std::string_view> names;
    names.reserve(index_.files.size());
    for (size_t i = 0; i < index_.files.size(); ++i) {
      const FileInfo& f = index_.files[i];
      if (!IsSafeFileName(f.name))
        return Fail("file " + std::to_string(i) + ": unsafe file name " + QuoteUntrusted(f.name) +
                    " (must be 1.." + std::to_string(kMaxFileNameBytes) +
                    " characters of [A-Za-z0-9._-], not starting with '.')");
      if (!names.insert(f.name).second) return Fail("file " + std::to_string(i) + ": duplicate file name " + QuoteUntrusted(f.name));
      if (!RankAllowed(f.rank))
        return Fail("file " + std::to_string(i) + " " + QuoteUntrusted(f.name) + ": rank " + std::to_string(f.rank) +
                    " is not " + RankRule());
    }
    return Status::OK();
  }

  Status CheckName(std::string_view what, size_t i, const std::string& name) const {
    if (name.empty()) return Fail(std::string(what) + " " + std::to_string(i) + ": empty name");
    if (name.size() > kMaxNameBytes)
      return Fail(std::string(what) + " " + std::to_string(i) + ": name of " + std::to_string(name.size()) +
                  " bytes exceeds " + std::to_string(kMaxNameBytes));
    if (name.find('\0') != std::string::npos)
      return Fail(std::string(what) + " " + std::to_string(i) + ": name " + QuoteUntrusted(name) + " contains a NUL byte");
    return Status::OK();
  }

  Status CheckTensors() {
    std::unordered_set<std::string_view> names;
    names.reserve(index_.tensors.size());
    volumes_.resize(index_.tensors.size());
    for (size_t i = 0; i < index_.tensors.size(); ++i) {
      const TensorInfo& t = index_.tensors[i];
      LL_RETURN_IF_ERROR(CheckName("tensor", i, t.name));
      if (!names.insert(t.name).second) return Fail("tensor " + std::to_string(i) + ": duplicate name " + QuoteUntrusted(t.name));
      if (!IsValidDType(static_cast<uint8_t>(t.dtype)))
        return Fail("tensor " + QuoteUntrusted(t.name) + ": invalid dtype code " + std::to_string(static_cast<unsigned>(t.dtype)));
      if (t.shape.size() > kMaxRank)
        return Fail("tensor " + QuoteUntrusted(t.name) + ": " + std::to_string(t.shape.size()) +
                    " dimensions exceed the limit of " + std::to_string(kMaxRank));
      uint64_t bytes = 0;
      if (!CheckedVolume(t.shape, &volumes_[i]) || !RawBytes(volumes_[i], t.dtype, &bytes))
        return Fail("tensor " + QuoteUntrusted(t.name) + ": shape " + ShapeString(t.shape) +
                    " has a negative extent or its size overflows");
    }
    return Status::OK();
  }

  std::string FragmentName(size_t i, const FragmentInfo& fr) const {
    std::string s = "fragment " + std::to_string(i);
    if (fr.tensor < index_.tensors.size()) s += " of tensor " + QuoteUntrusted(index_.tensors[fr.tensor].name);
    return s;
  }

  Status CheckFragments() {
    const uint64_t num_chunks = index_.chunks.size();
    const uint64_t chunk_bytes = index_.chunk_bytes;
    // Chunks are stored in fragment order, so each fragment's chunks lie after the previous
    // fragment's: no chunk is shared, which also bounds the work below by the number of chunks.
    uint64_t next_free_chunk = 0;
    for (size_t i = 0; i < index_.fragments.size(); ++i) {
      const FragmentInfo& fr = index_.fragments[i];
      if (fr.tensor >= index_.tensors.size())
        return Fail(FragmentName(i, fr) + ": tensor " + std::to_string(fr.tensor) + " out of range (" +
                    std::to_string(index_.tensors.size()) + " tensors)");
      if (fr.file >= index_.files.size())
        return Fail(FragmentName(i, fr) + ": file " + std::to_string(fr.file) + " out of range (" +
                    std::to_string(index_.files.size()) + " files)");
      if (!IsValidCodec(fr.codec))
        return Fail(FragmentName(i, fr) + ": unknown codec " + std::to_string(static_cast<unsigned>(fr.codec)));
      const TensorInfo& tensor = index_.tensors[fr.tensor];
      if (!RegionFits(fr.region, tensor.shape)) {
        Status s = ValidateRegion(fr.region, tensor.shape, source_ + ": " + FragmentName(i, fr), untrusted_);
        return s.ok() ? Fail(FragmentName(i, fr) + ": invalid region") : s;
      }
      uint64_t raw = 0;
      if (!RawBytes(fr.region.num_elements(), tensor.dtype, &raw))
        return Fail(FragmentName(i, fr) + ": byte size overflows");
      const uint64_t expected_chunks = raw == 0 ? 0 : (raw - 1) / chunk_bytes + 1;
      if (fr.num_chunks != expected_chunks)
        return Fail(FragmentName(i, fr) + ": " + std::to_string(fr.num_chunks) + " chunks, but " +
                    std::to_string(raw) + " bytes in chunks of " + std::to_string(chunk_bytes) + " need " +
                    std::to_string(expected_chunks));
      if (fr.first_chunk > num_chunks || fr.num_chunks > num_chunks - fr.first_chunk)
        return Fail(FragmentName(i, fr) + ": chunks [" + std::to_string(fr.first_chunk) + ", +" +
                    std::to_string(fr.num_chunks) + ") out of range (" + std::to_string(num_chunks) + " chunks)");
      if (fr.num_chunks > 0) {
        if (fr.first_chunk < next_free_chunk)
          return Fail(FragmentName(i, fr) + ": chunks [" + std::to_string(fr.first_chunk) + ", +" +
                      std::to_string(fr.num_chunks) + ") overlap or precede those of an earlier fragment");
        next_free_chunk = fr.first_chunk + fr.num_chunks;
      }
      uint64_t stored = 0;
      for (uint64_t k = 0; k < fr.num_chunks; ++k) {
        const ChunkInfo& c = index_.chunks[fr.first_chunk + k];
        if (fr.codec == Codec::kNone) {
          const uint64_t raw_len = std::min(chunk_bytes, raw - k * chunk_bytes);
          if (c.stored_length != raw_len)
            return Fail(FragmentName(i, fr) + ": chunk " + std::to_string(fr.first_chunk + k) + " stores " +
                        std::to_string(c.stored_length) + " bytes, but an uncompressed chunk holds " +
                        std::to_string(raw_len));
        }
        if (__builtin_add_overflow(stored, c.stored_length, &stored))
          return Fail(FragmentName(i, fr) + ": stored length overflows");
      }
      const FileInfo& file = index_.files[fr.file];
      if (fr.offset > file.size || stored > file.size - fr.offset)
        return Fail(FragmentName(i, fr) + ": bytes [" + std::to_string(fr.offset) + ", +" + std::to_string(stored) +
                    ") lie outside file " + QuoteUntrusted(file.name) + " of " + std::to_string(file.size) + " bytes");
    }
    return Status::OK();
  }

  Status CheckObjects() {
    for (size_t i = 0; i < index_.objects.size(); ++i) {
      const ObjectInfo& o = index_.objects[i];
      LL_RETURN_IF_ERROR(CheckName("object", i, o.name));
      if (!RankAllowed(o.rank))
        return Fail("object " + QuoteUntrusted(o.name) + ": rank " + std::to_string(o.rank) + " is not " + RankRule());
      if (o.file >= index_.files.size())
        return Fail("object " + QuoteUntrusted(o.name) + ": file " + std::to_string(o.file) + " out of range (" +
                    std::to_string(index_.files.size()) + " files)");
      const FileInfo& file = index_.files[o.file];
      if (o.offset > file.size || o.length > file.size - o.offset)
        return Fail("object " + QuoteUntrusted(o.name) + ": bytes [" + std::to_string(o.offset) + ", +" +
                    std::to_string(o.length) + ") lie outside file " + QuoteUntrusted(file.name) + " of " +
                    std::to_string(file.size) + " bytes");
    }
    return Status::OK();
  }

  const CheckpointIndex& index_;
  const std::string source_;
  const bool untrusted_;
  std::vector<int64_t> volumes_;
};

}  // namespace

std::string QuoteUntrusted(std::string_view s) {
  constexpr size_t kMaxShown = 120;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > kMaxShown) out += "...(" + std::to_string(s.size()) + " bytes)";
  out += "'";
  return out;
}

bool IsSafeFileName(std::string_view name) {
  if (name.empty() || name.size() > kMaxFileNameBytes || name.front() == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

Status ValidateIndex(const CheckpointIndex& index, std::string_view source, bool untrusted) {
  return IndexValidator(index, source, untrusted).Run();
}

Status ValidateCoverage(const CheckpointIndex& m, std::string_view source, bool untrusted,
                        const std::vector<uint32_t>* only) {
  auto fail = [&](std::string message) {
    return untrusted ? Status::Corruption(source, std::move(message)) : Status::InvalidArgument(source, std::move(message));
  };
  auto rank_of = [&](const FragmentInfo& f) { return f.file < m.files.size() ? m.files[f.file].rank : kManifestRank; };
  std::vector<std::vector<uint32_t>> fragments_of(m.tensors.size());
  std::vector<int64_t> covered(m.tensors.size(), 0);
  for (uint32_t f = 0; f < m.fragments.size(); ++f) {
    const FragmentInfo& fr = m.fragments[f];
    if (fr.tensor >= m.tensors.size()) return fail("fragment " + std::to_string(f) + " names no tensor");
    fragments_of[fr.tensor].push_back(f);
    int64_t& sum = covered[fr.tensor];
    if (__builtin_add_overflow(sum, fr.region.num_elements(), &sum)) sum = INT64_MAX;
  }
  std::vector<Region> regions;
  std::vector<Overlap> overlaps;
  const size_t checked = only != nullptr ? only->size() : m.tensors.size();
  for (size_t k = 0; k < checked; ++k) {
    const uint32_t t = only != nullptr ? (*only)[k] : static_cast<uint32_t>(k);
    if (t >= m.tensors.size()) return fail("tensor " + std::to_string(t) + " is not in the index");
    const std::string tensor = "tensor " + QuoteUntrusted(m.tensors[t].name);
    // Overlaps first: two ranks storing the same elements is the common mistake (data-parallel
    // copies saved by every rank), and it also explains the hole its element count implies.
    if (fragments_of[t].size() >= 2) {
      regions.clear();
      for (uint32_t f : fragments_of[t]) regions.push_back(m.fragments[f].region);
      overlaps.clear();
      PlanOverlaps(regions, regions, &overlaps);
      for (const Overlap& o : overlaps) {
        if (o.source == o.target) continue;
        const FragmentInfo& a = m.fragments[fragments_of[t][o.source]];
        const FragmentInfo& b = m.fragments[fragments_of[t][o.target]];
        const bool same = a.region.offsets == b.region.offsets && a.region.shape == b.region.shape &&
                          a.region.flat_begin == b.region.flat_begin && a.region.flat_end == b.region.flat_end;
        const uint32_t ra = rank_of(a), rb = rank_of(b);
        std::string who = ra == rb ? "rank " + std::to_string(ra) + " stored"
                                   : "ranks " + std::to_string(std::min(ra, rb)) + " and " +
                                         std::to_string(std::max(ra, rb)) + " both stored";
        return fail(tensor + ": " + who + " overlapping pieces (" + std::to_string(o.box.volume()) +
                    " elements stored twice" + (same ? ", the same piece" : "") +
                    "), so the checkpoint cannot be loaded. " +
                    (same ? "If these ranks hold data-parallel copies of it, mark them as replicas "
                            "so that one copy is written: TensorShard::Replica(i, n); in Python, "
                            "lifeline.torch.state_dict(model, optimizer) for a DistributedDataParallel model, or "
                            "lifeline.Shard(t, replica=(i, n))"
                          : "Each element must be saved by exactly one rank: check how the ranks describe "
                            "their pieces (offsets, shapes, flat ranges)"));
      }
    }
    int64_t volume = 0;
    if (!CheckedVolume(m.tensors[t].shape, &volume)) return fail(tensor + ": shape overflows");
    if (covered[t] != volume)
      return fail(tensor + ": the ranks' fragments hold " + std::to_string(covered[t]) + " elements but the tensor has " +
                  std::to_string(volume) +
                  (covered[t] < volume ? " (part of it was saved by no rank: every element must be saved by one rank)"
                                       : " (some elements were saved more than once)"));
  }
  return Status::OK();
}

}  // namespace lifeline::format
