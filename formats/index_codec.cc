#include "formats/index_codec.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "formats/checksum.h"
#include "formats/geometry.h"

namespace lifeline::format {
namespace {

// ---- layout constants (formats/SPEC.md, "Index file") ----

constexpr char kMagic[8] = {'L', 'L', 'I', 'N', 'D', 'E', 'X', '\0'};
constexpr char kEndMagic[8] = {'L', 'L', 'I', 'N', 'D', 'E', 'N', 'D'};
constexpr uint32_t kFormatVersion = 1;

// The first 16 bytes (magic, version, header length) and "the header checksum is the header's
// last 8 bytes" are fixed for every version, so a reader can authenticate a header it cannot parse
// and then say that its version is too new.
constexpr size_t kHeaderPrefixBytes = 16;
constexpr size_t kHeaderBytes = 208;  // version 1
constexpr size_t kMaxHeaderBytes = 4096;
constexpr size_t kTrailerBytes = 16;

constexpr size_t kFileRecordBytes = 24;
constexpr size_t kTensorRecordBytes = 24;
constexpr size_t kFragmentRecordBytes = 64;
constexpr size_t kChunkRecordBytes = 16;
constexpr size_t kObjectRecordBytes = 48;
constexpr size_t kDimBytes = 8;

// Header field offsets.
constexpr size_t kOffVersion = 8;
constexpr size_t kOffHeaderLength = 12;
constexpr size_t kOffKind = 16;
constexpr size_t kOffRank = 20;
constexpr size_t kOffWorldSize = 24;
constexpr size_t kOffStep = 32;
constexpr size_t kOffChunkBytes = 40;
constexpr size_t kOffCreated = 48;
constexpr size_t kOffFileLength = 56;
constexpr size_t kOffCounts = 64;    // 6 x u64: files, tensors, fragments, chunks, objects, dims
constexpr size_t kOffSections = 112; // 7 x u64: byte lengths of the 7 sections
constexpr size_t kOffRunIdOffset = 168;
constexpr size_t kOffRunIdLength = 176;
constexpr size_t kOffMetadataOffset = 184;
constexpr size_t kOffMetadataLength = 192;
constexpr size_t kOffHeaderChecksum = 200;

enum Section { kFiles = 0, kTensors, kFragments, kChunks, kObjects, kDims, kStrings, kNumSections };
constexpr const char* kSectionNames[kNumSections] = {"files", "tensors", "fragments", "chunks",
                                                     "objects", "dims", "strings"};
constexpr size_t kRecordBytes[kNumSections] = {kFileRecordBytes, kTensorRecordBytes, kFragmentRecordBytes,
                                               kChunkRecordBytes, kObjectRecordBytes, kDimBytes, 1};

// ---- little-endian access ----

template <typename T>
T FromLittle(T v) {
  if constexpr (std::endian::native == std::endian::big) {
    if constexpr (sizeof(T) == 8) return static_cast<T>(__builtin_bswap64(static_cast<uint64_t>(v)));
    if constexpr (sizeof(T) == 4) return static_cast<T>(__builtin_bswap32(static_cast<uint32_t>(v)));
    if constexpr (sizeof(T) == 2) return static_cast<T>(__builtin_bswap16(static_cast<uint16_t>(v)));
  }
  return v;
}

template <typename T>
void Put(char* p, T v) {
  v = FromLittle(v);
  std::memcpy(p, &v, sizeof(T));
}

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return FromLittle(v);
}

// ---- message helpers ----



std::string DTypeString(DType t) {
  if (!IsValidDType(static_cast<uint8_t>(t))) return "dtype code " + std::to_string(static_cast<unsigned>(t));
  return std::string(DTypeName(t));
}

std::string SourceName(std::string_view source) { return source.empty() ? std::string("index") : std::string(source); }

bool IsValidCodec(Codec c) { return static_cast<uint8_t>(c) <= static_cast<uint8_t>(Codec::kZstdByteGroup); }

// Raw (decoded) bytes of `elements` elements of `dtype`; false on overflow of uint64.
bool RawBytes(int64_t elements, DType dtype, uint64_t* out) {
  if (elements < 0) return false;
  return !__builtin_mul_overflow(static_cast<uint64_t>(elements), static_cast<uint64_t>(DTypeSize(dtype)), out);
}

// ---- semantic validation ----

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

// ---- decoding ----

class IndexDecoder {
 public:
  IndexDecoder(std::string_view bytes, std::string_view source) : bytes_(bytes), source_(SourceName(source)) {}

  Result<CheckpointIndex> Decode() {
    LL_RETURN_IF_ERROR(ParseHeader());
    LL_RETURN_IF_ERROR(ParseLayout());
    LL_RETURN_IF_ERROR(ParseStrings());
    LL_RETURN_IF_ERROR(ParseFiles());
    LL_RETURN_IF_ERROR(ParseTensors());
    LL_RETURN_IF_ERROR(ParseFragments());
    ParseChunks();
    LL_RETURN_IF_ERROR(ParseObjects());
    LL_RETURN_IF_ERROR(ValidateIndex(index_, source_, /*untrusted=*/true));
    return std::move(index_);
  }

 private:
  Status Fail(const std::string& msg) const { return Status::Corruption(source_, msg); }
  static std::string At(uint64_t offset) { return " at byte offset " + std::to_string(offset); }

  Status ParseHeader() {
    const char* p = bytes_.data();
    if (bytes_.size() >= sizeof(kMagic) && std::memcmp(p, kMagic, sizeof(kMagic)) != 0)
      return Fail("not a Lifeline index (bad magic)");
    if (bytes_.size() < kHeaderPrefixBytes + 8)
      return Fail("truncated: " + std::to_string(bytes_.size()) + " bytes, shorter than an index header");
    const uint32_t version = Get<uint32_t>(p + kOffVersion);
    const uint32_t header_length = Get<uint32_t>(p + kOffHeaderLength);
    if (header_length < kHeaderPrefixBytes + 8 || header_length > kMaxHeaderBytes || header_length % 8 != 0)
      return Fail("implausible header length " + std::to_string(header_length) + At(kOffHeaderLength));
    if (header_length > bytes_.size())
      return Fail("truncated: " + std::to_string(bytes_.size()) + " bytes, shorter than the " +
                  std::to_string(header_length) + "-byte header");
    const uint64_t stored_sum = Get<uint64_t>(p + header_length - 8);
    if (stored_sum != Checksum64(p, header_length - 8))
      return Fail("header checksum mismatch" + At(header_length - 8));
    if (version > kFormatVersion)
      return Status::NotSupported(source_, "index format version " + std::to_string(version) +
                                               " is newer than this reader supports (" +
                                               std::to_string(kFormatVersion) + "); upgrade Lifeline to read it");
    if (version == 0) return Fail("invalid format version 0");
    if (header_length < kHeaderBytes)
      return Fail("header length " + std::to_string(header_length) + " is shorter than version " +
                  std::to_string(version) + "'s " + std::to_string(kHeaderBytes) + " bytes");
    header_length_ = header_length;

    const uint8_t kind = Get<uint8_t>(p + kOffKind);
    if (kind != static_cast<uint8_t>(IndexKind::kRankIndex) && kind != static_cast<uint8_t>(IndexKind::kManifest))
      return Fail("unknown index kind " + std::to_string(kind) + At(kOffKind));
    index_.kind = static_cast<IndexKind>(kind);
    index_.rank = Get<uint32_t>(p + kOffRank);
    index_.world_size = Get<uint32_t>(p + kOffWorldSize);
    index_.step = Get<uint64_t>(p + kOffStep);
    index_.chunk_bytes = Get<uint64_t>(p + kOffChunkBytes);
    index_.created_unix_ns = Get<uint64_t>(p + kOffCreated);
    file_length_ = Get<uint64_t>(p + kOffFileLength);
    for (int s = 0; s < kNumSections; ++s) {
      if (s < kStrings) counts_[s] = Get<uint64_t>(p + kOffCounts + 8 * s);
      section_bytes_[s] = Get<uint64_t>(p + kOffSections + 8 * s);
    }
    counts_[kStrings] = section_bytes_[kStrings];
    run_id_offset_ = Get<uint64_t>(p + kOffRunIdOffset);
    run_id_length_ = Get<uint64_t>(p + kOffRunIdLength);
    metadata_offset_ = Get<uint64_t>(p + kOffMetadataOffset);
    metadata_length_ = Get<uint64_t>(p + kOffMetadataLength);
    return Status::OK();
  }

  // Every section must fit in the bytes we actually have before anything is allocated for it.
  Status ParseLayout() {
    if (file_length_ != bytes_.size())
      return Fail((file_length_ > bytes_.size() ? "truncated: " : "trailing bytes: ") + std::to_string(bytes_.size()) +
                  " bytes, but the header says " + std::to_string(file_length_));
    if (bytes_.size() > kMaxIndexBytes)
      return Fail(std::to_string(bytes_.size()) + " bytes exceed the index size limit of " +
                  std::to_string(kMaxIndexBytes));
    if (bytes_.size() < header_length_ + kTrailerBytes)
      return Fail("truncated: no room for the trailer after the header");
    uint64_t pos = header_length_;
    const uint64_t body_end = bytes_.size() - kTrailerBytes;
    for (int s = 0; s < kNumSections; ++s) {
      const uint64_t len = section_bytes_[s];
      if (len > body_end - pos)
        return Fail(std::string(kSectionNames[s]) + " section of " + std::to_string(len) + " bytes" + At(pos) +
                    " runs past the end of the body at " + std::to_string(body_end));
      if (len % kRecordBytes[s] != 0 || len / kRecordBytes[s] != counts_[s])
        return Fail(std::string(kSectionNames[s]) + " section" + At(pos) + ": " + std::to_string(counts_[s]) +
                    " records of " + std::to_string(kRecordBytes[s]) + " bytes do not make " + std::to_string(len) +
                    " bytes");
      section_begin_[s] = pos;
      pos += len;
    }
    if (pos != body_end)
      return Fail("sections end" + At(pos) + " but the trailer starts" + At(body_end));
    const char* trailer = bytes_.data() + body_end;
    if (std::memcmp(trailer + 8, kEndMagic, sizeof(kEndMagic)) != 0) return Fail("bad end magic" + At(body_end + 8));
    if (Get<uint64_t>(trailer) != Checksum64(bytes_.data(), body_end))
      return Fail("checksum mismatch: the body's bytes were altered" + At(body_end));
    return Status::OK();
  }

  const char* SectionData(Section s) const { return bytes_.data() + section_begin_[s]; }

  // Resolves a string reference. The sum of all referenced lengths may not exceed the table, so
  // overlapping references cannot make the decoder allocate more than the file holds.
  Status TakeString(uint64_t offset, uint64_t length, uint64_t limit, const std::string& what, std::string* out) {
    const uint64_t table = section_bytes_[kStrings];
    if (length > limit)
      return Fail(what + ": string of " + std::to_string(length) + " bytes exceeds the limit of " + std::to_string(limit));
    if (offset > table || length > table - offset)
      return Fail(what + ": string [" + std::to_string(offset) + ", +" + std::to_string(length) +
                  ") outside the string table of " + std::to_string(table) + " bytes");
    string_bytes_used_ += length;
    if (string_bytes_used_ > table) return Fail(what + ": strings overlap (more string bytes referenced than stored)");
    out->assign(SectionData(kStrings) + offset, length);
    return Status::OK();
  }

  Status TakeDims(uint64_t start, uint64_t n, const std::string& what, std::vector<int64_t>* out) {
    if (n > kMaxRank) return Fail(what + ": " + std::to_string(n) + " dimensions exceed " + std::to_string(kMaxRank));
    const uint64_t pool = counts_[kDims];
    if (start > pool || n > pool - start)
      return Fail(what + ": dims [" + std::to_string(start) + ", +" + std::to_string(n) + ") outside the pool of " +
                  std::to_string(pool));
    out->resize(n);
    const char* p = SectionData(kDims) + start * kDimBytes;
    for (uint64_t i = 0; i < n; ++i) (*out)[i] = Get<int64_t>(p + i * kDimBytes);
    return Status::OK();
  }

  Status ParseStrings() {
    LL_RETURN_IF_ERROR(TakeString(run_id_offset_, run_id_length_, UINT64_MAX, "run id", &index_.run_id));
    return TakeString(metadata_offset_, metadata_length_, UINT64_MAX, "metadata", &index_.metadata_json);
  }

  Status ParseFiles() {
    index_.files.resize(counts_[kFiles]);
    const char* p = SectionData(kFiles);
    for (size_t i = 0; i < index_.files.size(); ++i, p += kFileRecordBytes) {
      FileInfo& f = index_.files[i];
      LL_RETURN_IF_ERROR(TakeString(Get<uint64_t>(p), Get<uint32_t>(p + 8), kMaxFileNameBytes,
                                    "file " + std::to_string(i), &f.name));
      f.rank = Get<uint32_t>(p + 12);
      f.size = Get<uint64_t>(p + 16);
    }
    return Status::OK();
  }

  Status ParseTensors() {
    index_.tensors.resize(counts_[kTensors]);
    const char* p = SectionData(kTensors);
    for (size_t i = 0; i < index_.tensors.size(); ++i, p += kTensorRecordBytes) {
      TensorInfo& t = index_.tensors[i];
      const std::string what = "tensor " + std::to_string(i);
      LL_RETURN_IF_ERROR(TakeString(Get<uint64_t>(p), Get<uint32_t>(p + 8), kMaxNameBytes, what, &t.name));
      t.dtype = static_cast<DType>(Get<uint8_t>(p + 12));
      LL_RETURN_IF_ERROR(TakeDims(Get<uint64_t>(p + 16), Get<uint8_t>(p + 13), what, &t.shape));
    }
    return Status::OK();
  }

  Status ParseFragments() {
    index_.fragments.resize(counts_[kFragments]);
    const char* p = SectionData(kFragments);
    for (size_t i = 0; i < index_.fragments.size(); ++i, p += kFragmentRecordBytes) {
      FragmentInfo& fr = index_.fragments[i];
      fr.tensor = Get<uint32_t>(p);
      fr.file = Get<uint32_t>(p + 4);
      fr.offset = Get<uint64_t>(p + 8);
      fr.first_chunk = Get<uint64_t>(p + 16);
      fr.num_chunks = Get<uint64_t>(p + 24);
      fr.region.flat_begin = Get<int64_t>(p + 32);
      fr.region.flat_end = Get<int64_t>(p + 40);
      const uint64_t dims_start = Get<uint64_t>(p + 48);
      const uint8_t ndim = Get<uint8_t>(p + 56);
      fr.codec = static_cast<Codec>(Get<uint8_t>(p + 57));
      // Offsets then shape, 2 * ndim values in all.
      if (ndim > kMaxRank || dims_start > counts_[kDims] || 2ull * ndim > counts_[kDims] - dims_start)
        return Fail("fragment " + std::to_string(i) + ": dims [" + std::to_string(dims_start) + ", +2*" +
                    std::to_string(ndim) + ") outside the pool of " + std::to_string(counts_[kDims]));
      const char* d = SectionData(kDims) + dims_start * kDimBytes;
      fr.region.offsets.resize(ndim);
      fr.region.shape.resize(ndim);
      for (uint32_t k = 0; k < ndim; ++k) {
        fr.region.offsets[k] = Get<int64_t>(d + k * kDimBytes);
        fr.region.shape[k] = Get<int64_t>(d + (ndim + k) * kDimBytes);
      }
    }
    return Status::OK();
  }

  void ParseChunks() {
    index_.chunks.resize(counts_[kChunks]);
    const char* p = SectionData(kChunks);
    for (ChunkInfo& c : index_.chunks) {
      c.stored_length = Get<uint64_t>(p);
      c.checksum = Get<uint64_t>(p + 8);
      p += kChunkRecordBytes;
    }
  }

  Status ParseObjects() {
    index_.objects.resize(counts_[kObjects]);
    const char* p = SectionData(kObjects);
    for (size_t i = 0; i < index_.objects.size(); ++i, p += kObjectRecordBytes) {
      ObjectInfo& o = index_.objects[i];
      LL_RETURN_IF_ERROR(TakeString(Get<uint64_t>(p), Get<uint32_t>(p + 8), kMaxNameBytes,
                                    "object " + std::to_string(i), &o.name));
      o.rank = Get<uint32_t>(p + 12);
      o.file = Get<uint32_t>(p + 16);
      o.offset = Get<uint64_t>(p + 24);
      o.length = Get<uint64_t>(p + 32);
      o.checksum = Get<uint64_t>(p + 40);
    }
    return Status::OK();
  }

  const std::string_view bytes_;
  const std::string source_;
  CheckpointIndex index_;
  uint64_t header_length_ = 0;
  uint64_t file_length_ = 0;
  uint64_t counts_[kNumSections] = {};
  uint64_t section_bytes_[kNumSections] = {};
  uint64_t section_begin_[kNumSections] = {};
  uint64_t run_id_offset_ = 0, run_id_length_ = 0;
  uint64_t metadata_offset_ = 0, metadata_length_ = 0;
  uint64_t string_bytes_used_ = 0;
};

// ---- encoding ----

class StringTable {
 public:
  // Returns the offset of `s` in the table.
  uint64_t Add(std::string_view s) {
    const uint64_t offset = bytes_.size();
    bytes_.append(s);
    return offset;
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
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

Result<std::string> EncodeIndex(const CheckpointIndex& index) {
  const std::string what = index.kind == IndexKind::kManifest
                               ? "manifest of step " + std::to_string(index.step)
                               : "rank index of rank " + std::to_string(index.rank) + ", step " + std::to_string(index.step);
  LL_RETURN_IF_ERROR(ValidateIndex(index, what, /*untrusted=*/false));

  StringTable strings;
  const uint64_t run_id_offset = strings.Add(index.run_id);
  const uint64_t metadata_offset = strings.Add(index.metadata_json);
  std::vector<uint64_t> file_names(index.files.size());
  for (size_t i = 0; i < index.files.size(); ++i) file_names[i] = strings.Add(index.files[i].name);
  std::vector<uint64_t> tensor_names(index.tensors.size());
  for (size_t i = 0; i < index.tensors.size(); ++i) tensor_names[i] = strings.Add(index.tensors[i].name);
  std::vector<uint64_t> object_names(index.objects.size());
  for (size_t i = 0; i < index.objects.size(); ++i) object_names[i] = strings.Add(index.objects[i].name);

  // Dims pool: tensor shapes, then each fragment's offsets and shape. Consecutive fragments of one
  // box (flat ranges of it, replica splits) share one entry.
  uint64_t num_dims = 0;
  std::vector<uint64_t> tensor_dims(index.tensors.size());
  for (size_t i = 0; i < index.tensors.size(); ++i) {
    tensor_dims[i] = num_dims;
    num_dims += index.tensors[i].shape.size();
  }
  std::vector<uint64_t> fragment_dims(index.fragments.size());
  for (size_t i = 0; i < index.fragments.size(); ++i) {
    const Region& r = index.fragments[i].region;
    if (i > 0 && r.offsets == index.fragments[i - 1].region.offsets && r.shape == index.fragments[i - 1].region.shape) {
      fragment_dims[i] = fragment_dims[i - 1];
    } else {
      fragment_dims[i] = num_dims;
      num_dims += 2 * r.offsets.size();
    }
  }

  uint64_t counts[kNumSections] = {index.files.size(), index.tensors.size(), index.fragments.size(),
                                   index.chunks.size(), index.objects.size(), num_dims, strings.bytes().size()};
  uint64_t section_bytes[kNumSections];
  uint64_t section_begin[kNumSections];
  uint64_t pos = kHeaderBytes;
  for (int s = 0; s < kNumSections; ++s) {
    section_bytes[s] = counts[s] * kRecordBytes[s];
    section_begin[s] = pos;
    pos += section_bytes[s];
  }
  const uint64_t file_length = pos + kTrailerBytes;
  if (file_length > kMaxIndexBytes)
    return Status::InvalidArgument(what, "encoded size of " + std::to_string(file_length) +
                                                          " bytes exceeds the limit of " + std::to_string(kMaxIndexBytes));

  std::string out(file_length, '\0');
  char* base = out.data();

  std::memcpy(base, kMagic, sizeof(kMagic));
  Put<uint32_t>(base + kOffVersion, kFormatVersion);
  Put<uint32_t>(base + kOffHeaderLength, kHeaderBytes);
  Put<uint8_t>(base + kOffKind, static_cast<uint8_t>(index.kind));
  Put<uint32_t>(base + kOffRank, index.rank);
  Put<uint32_t>(base + kOffWorldSize, index.world_size);
  Put<uint64_t>(base + kOffStep, index.step);
  Put<uint64_t>(base + kOffChunkBytes, index.chunk_bytes);
  Put<uint64_t>(base + kOffCreated, index.created_unix_ns);
  Put<uint64_t>(base + kOffFileLength, file_length);
  for (int s = 0; s < kNumSections; ++s) {
    if (s < kStrings) Put<uint64_t>(base + kOffCounts + 8 * s, counts[s]);
    Put<uint64_t>(base + kOffSections + 8 * s, section_bytes[s]);
  }
  Put<uint64_t>(base + kOffRunIdOffset, run_id_offset);
  Put<uint64_t>(base + kOffRunIdLength, index.run_id.size());
  Put<uint64_t>(base + kOffMetadataOffset, metadata_offset);
  Put<uint64_t>(base + kOffMetadataLength, index.metadata_json.size());
  Put<uint64_t>(base + kOffHeaderChecksum, Checksum64(base, kOffHeaderChecksum));

  char* p = base + section_begin[kFiles];
  for (size_t i = 0; i < index.files.size(); ++i, p += kFileRecordBytes) {
    const FileInfo& f = index.files[i];
    Put<uint64_t>(p, file_names[i]);
    Put<uint32_t>(p + 8, static_cast<uint32_t>(f.name.size()));
    Put<uint32_t>(p + 12, f.rank);
    Put<uint64_t>(p + 16, f.size);
  }

  char* dims = base + section_begin[kDims];
  p = base + section_begin[kTensors];
  for (size_t i = 0; i < index.tensors.size(); ++i, p += kTensorRecordBytes) {
    const TensorInfo& t = index.tensors[i];
    Put<uint64_t>(p, tensor_names[i]);
    Put<uint32_t>(p + 8, static_cast<uint32_t>(t.name.size()));
    Put<uint8_t>(p + 12, static_cast<uint8_t>(t.dtype));
    Put<uint8_t>(p + 13, static_cast<uint8_t>(t.shape.size()));
    Put<uint64_t>(p + 16, tensor_dims[i]);
    for (size_t k = 0; k < t.shape.size(); ++k) Put<int64_t>(dims + (tensor_dims[i] + k) * kDimBytes, t.shape[k]);
  }

  p = base + section_begin[kFragments];
  for (size_t i = 0; i < index.fragments.size(); ++i, p += kFragmentRecordBytes) {
    const FragmentInfo& fr = index.fragments[i];
    const size_t ndim = fr.region.offsets.size();
    Put<uint32_t>(p, fr.tensor);
    Put<uint32_t>(p + 4, fr.file);
    Put<uint64_t>(p + 8, fr.offset);
    Put<uint64_t>(p + 16, fr.first_chunk);
    Put<uint64_t>(p + 24, fr.num_chunks);
    Put<int64_t>(p + 32, fr.region.flat_begin);
    Put<int64_t>(p + 40, fr.region.flat_end);
    Put<uint64_t>(p + 48, fragment_dims[i]);
    Put<uint8_t>(p + 56, static_cast<uint8_t>(ndim));
    Put<uint8_t>(p + 57, static_cast<uint8_t>(fr.codec));
    char* d = dims + fragment_dims[i] * kDimBytes;
    for (size_t k = 0; k < ndim; ++k) {
      Put<int64_t>(d + k * kDimBytes, fr.region.offsets[k]);
      Put<int64_t>(d + (ndim + k) * kDimBytes, fr.region.shape[k]);
    }
  }

  p = base + section_begin[kChunks];
  for (const ChunkInfo& c : index.chunks) {
    Put<uint64_t>(p, c.stored_length);
    Put<uint64_t>(p + 8, c.checksum);
    p += kChunkRecordBytes;
  }

  p = base + section_begin[kObjects];
  for (size_t i = 0; i < index.objects.size(); ++i, p += kObjectRecordBytes) {
    const ObjectInfo& o = index.objects[i];
    Put<uint64_t>(p, object_names[i]);
    Put<uint32_t>(p + 8, static_cast<uint32_t>(o.name.size()));
    Put<uint32_t>(p + 12, o.rank);
    Put<uint32_t>(p + 16, o.file);
    Put<uint64_t>(p + 24, o.offset);
    Put<uint64_t>(p + 32, o.length);
    Put<uint64_t>(p + 40, o.checksum);
  }

  if (!strings.bytes().empty())
    std::memcpy(base + section_begin[kStrings], strings.bytes().data(), strings.bytes().size());

  const uint64_t body_end = file_length - kTrailerBytes;
  Put<uint64_t>(base + body_end, Checksum64(base, body_end));
  std::memcpy(base + body_end + 8, kEndMagic, sizeof(kEndMagic));
  return out;
}

Result<CheckpointIndex> DecodeIndex(std::string_view bytes, std::string_view source) {
  return IndexDecoder(bytes, source).Decode();
}

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

  LL_RETURN_IF_ERROR(ValidateCoverage(manifest, kWhat, /*untrusted=*/false));
  return manifest;
}

Status ValidateCoverage(const CheckpointIndex& m, std::string_view source, bool untrusted) {
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
  for (uint32_t t = 0; t < m.tensors.size(); ++t) {
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
