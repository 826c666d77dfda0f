#include "formats/index_codec.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
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
// The header checksum is always the header's last 8 bytes: at 200 in a 208-byte header.

// The manifest directory (§5.5): header fields appended after version 1's, so that a reader that
// does not know them skips them.
constexpr size_t kOffDirectoryOffset = 200;
constexpr size_t kOffDirectoryLength = 208;
constexpr size_t kOffDirectoryChecksum = 216;
constexpr size_t kOffBlockBytes = 224;
constexpr size_t kManifestHeaderBytes = 240;
constexpr uint64_t kDirectoryFixedBytes = 16;  // tables offset, number of runs
constexpr uint64_t kBlockBytes = 4 << 10;
constexpr uint64_t kMinBlockBytes = 4096;
constexpr uint64_t kMaxBlockBytes = 16 << 20;

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

// The verified bytes of a manifest read piece by piece (§5.5): an anonymous mapping as large as
// the file, of which only the blocks asked for are read (and so only they occupy memory), each
// checked against its checksum in the directory before anything in it is used. The directory's
// own bytes, checked as a whole, are placed at their offset.
class BlockImage {
 public:
  BlockImage(ManifestPartReader::ReadAt read, uint64_t file_size, std::string source)
      : read_(std::move(read)), file_size_(file_size), source_(std::move(source)) {}
  ~BlockImage() {
    if (base_ != nullptr) munmap(base_, file_size_);
  }
  BlockImage(const BlockImage&) = delete;
  BlockImage& operator=(const BlockImage&) = delete;

  Status Map() {
    void* p = mmap(nullptr, file_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return Status::ResourceExhausted(source_, "cannot map " + std::to_string(file_size_) + " bytes");
    base_ = static_cast<char*>(p);
    return Status::OK();
  }
  char* base() const { return base_; }
  uint64_t bytes_read() const { return bytes_read_; }

  // Reads `n` bytes at `offset` straight into place, unverified (the header and the directory,
  // which carry their own checksums).
  Status ReadRaw(uint64_t offset, uint64_t n) {
    bytes_read_ += n;
    return read_(offset, n, base_ + offset);
  }

  // Blocks of `block_bytes` from `begin` to `end`, with their checksums; bytes from `end` on (the
  // directory) are resident already.
  void SetBlocks(uint64_t begin, uint64_t end, uint64_t block_bytes, std::vector<uint64_t> checksums) {
    blocks_begin_ = begin;
    blocks_end_ = end;
    block_bytes_ = block_bytes;
    checksums_ = std::move(checksums);
    resident_.assign(checksums_.size(), false);
  }

  // Makes [offset, offset + length) readable and verified. Missing blocks next to each other are
  // read in one call.
  Status Ensure(uint64_t offset, uint64_t length) {
    if (length == 0) return Status::OK();
    const uint64_t end = std::min(offset + length, blocks_end_);
    if (offset < blocks_begin_ || offset > file_size_ || length > file_size_ - offset)
      return Status::Corruption(source_, "bytes [" + std::to_string(offset) + ", +" + std::to_string(length) +
                                             ") lie outside the manifest's checked blocks");
    if (offset >= end) return Status::OK();
    const uint64_t first = (offset - blocks_begin_) / block_bytes_;
    const uint64_t last = (end - 1 - blocks_begin_) / block_bytes_;
    for (uint64_t b = first; b <= last;) {
      if (resident_[b]) {
        ++b;
        continue;
      }
      uint64_t e = b;
      while (e <= last && !resident_[e]) ++e;
      const uint64_t from = blocks_begin_ + b * block_bytes_;
      const uint64_t to = std::min(blocks_begin_ + e * block_bytes_, blocks_end_);
      bytes_read_ += to - from;
      LL_RETURN_IF_ERROR(read_(from, to - from, base_ + from));
      for (uint64_t k = b; k < e; ++k) {
        const uint64_t at = blocks_begin_ + k * block_bytes_;
        const uint64_t n = std::min(block_bytes_, blocks_end_ - at);
        if (Checksum64(base_ + at, n) != checksums_[k])
          return Status::Corruption(source_, "block " + std::to_string(k) + " (bytes " + std::to_string(at) + " to " +
                                                 std::to_string(at + n) +
                                                 ") does not match its checksum in the directory: the manifest was altered");
        resident_[k] = true;
      }
      b = e;
    }
    return Status::OK();
  }

 private:
  ManifestPartReader::ReadAt read_;
  const uint64_t file_size_;
  const std::string source_;
  char* base_ = nullptr;
  uint64_t bytes_read_ = 0;
  uint64_t blocks_begin_ = 0, blocks_end_ = 0, block_bytes_ = 1;
  std::vector<uint64_t> checksums_;
  std::vector<bool> resident_;
};

// Decodes an index from the bytes of the whole file, or, given a BlockImage, from the parts of a
// manifest that a load needs: every access to the body goes through Need, which for a partial read
// fetches and verifies the blocks first.
class IndexDecoder {
 public:
  IndexDecoder(std::string_view bytes, std::string_view source)
      : base_(bytes.data()), available_(bytes.size()), file_size_(bytes.size()), source_(SourceName(source)) {}
  IndexDecoder(BlockImage* image, uint64_t header_bytes_read, uint64_t file_size, std::string_view source)
      : base_(image->base()), available_(header_bytes_read), file_size_(file_size), source_(SourceName(source)),
        image_(image) {}

  Result<CheckpointIndex> Decode() {
    LL_RETURN_IF_ERROR(ParseHeader());
    LL_RETURN_IF_ERROR(ParseLayout());
    LL_RETURN_IF_ERROR(CheckTrailer());
    LL_RETURN_IF_ERROR(ParseHead());
    LL_RETURN_IF_ERROR(ParseFragments(0, counts_[kFragments], &index_.fragments));
    LL_RETURN_IF_ERROR(ParseChunks(0, counts_[kChunks], &index_.chunks));
    LL_RETURN_IF_ERROR(ValidateIndex(index_, source_, /*untrusted=*/true));
    return std::move(index_);
  }

  // ---- the steps of a partial read (ManifestPartReader) ----

  // Header and section layout, from the first bytes of the file.
  Status ParseHeaderAndLayout() {
    LL_RETURN_IF_ERROR(ParseHeader());
    return ParseLayout();
  }

  // The directory's place and shape: false when the file has none (written before §5.5). The
  // fields are the header's, already authenticated; what they say is checked against the layout.
  Result<bool> DirectoryPlace(uint64_t* offset, uint64_t* length, uint64_t* checksum, uint64_t* block_bytes) const {
    if (header_length_ < kManifestHeaderBytes || index_.kind != IndexKind::kManifest) return false;
    *offset = Get<uint64_t>(base_ + kOffDirectoryOffset);
    *length = Get<uint64_t>(base_ + kOffDirectoryLength);
    *checksum = Get<uint64_t>(base_ + kOffDirectoryChecksum);
    *block_bytes = Get<uint64_t>(base_ + kOffBlockBytes);
    if (*length == 0) return false;
    const uint64_t strings_begin = section_begin_[kStrings];
    const uint64_t body_end = strings_begin + section_bytes_[kStrings];
    if (*offset < strings_begin || *offset > body_end || *length != body_end - *offset)
      return Fail("directory [" + std::to_string(*offset) + ", +" + std::to_string(*length) +
                  ") is not the end of the string table [" + std::to_string(strings_begin) + ", " +
                  std::to_string(body_end) + ")" + At(kOffDirectoryOffset));
    if (*block_bytes < kMinBlockBytes || *block_bytes > kMaxBlockBytes || !std::has_single_bit(*block_bytes))
      return Fail("directory block size " + std::to_string(*block_bytes) + " is not a power of two in [" +
                  std::to_string(kMinBlockBytes) + ", " + std::to_string(kMaxBlockBytes) + "]" + At(kOffBlockBytes));
    const uint64_t blocks = (*offset - header_length_ + *block_bytes - 1) / *block_bytes;
    if (*length != kDirectoryFixedBytes + 8 * blocks)
      return Fail("directory of " + std::to_string(*length) + " bytes does not hold the place of the tables and " +
                  std::to_string(blocks) + " block checksums");
    return true;
  }
  uint64_t header_length() const { return header_length_; }
  uint64_t num_tensors() const { return counts_[kTensors]; }
  uint64_t num_fragments() const { return counts_[kFragments]; }
  uint64_t num_dims() const { return counts_[kDims]; }
  uint64_t strings_begin() const { return section_begin_[kStrings]; }

  // Offsets then shape at `start` of the dims pool, made readable (NeedRecords) and in range.
  void ReadBox(uint64_t start, size_t ndim, std::vector<int64_t>* lo, std::vector<int64_t>* extent) const {
    const char* d = SectionData(kDims) + start * kDimBytes;
    lo->resize(ndim);
    extent->resize(ndim);
    for (size_t k = 0; k < ndim; ++k) {
      (*lo)[k] = Get<int64_t>(d + k * kDimBytes);
      (*extent)[k] = Get<int64_t>(d + (ndim + k) * kDimBytes);
    }
  }

  // Files, tensors, objects and the strings they name: everything but fragments and chunks.
  Status ParseHead() {
    LL_RETURN_IF_ERROR(ParseStrings());
    LL_RETURN_IF_ERROR(ParseFiles());
    LL_RETURN_IF_ERROR(ParseTensors());
    return ParseObjects();
  }
  CheckpointIndex& index() { return index_; }

  // Fragment records [begin, end) appended to `out` as they are (chunk numbers unchanged).
  Status ParseFragments(uint64_t begin, uint64_t end, std::vector<FragmentInfo>* out) {
    LL_RETURN_IF_ERROR(NeedRecords(kFragments, begin, end));
    if (out->empty()) out->reserve(end - begin);  // exact growth per call would copy quadratically
    const char* p = SectionData(kFragments) + begin * kFragmentRecordBytes;
    for (uint64_t i = begin; i < end; ++i, p += kFragmentRecordBytes) {
      FragmentInfo& fr = out->emplace_back();
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
      LL_RETURN_IF_ERROR(Need(section_begin_[kDims] + dims_start * kDimBytes, 2ull * ndim * kDimBytes));
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

  // Chunk records [begin, end), which the caller has checked lie in the section.
  Status ParseChunks(uint64_t begin, uint64_t end, std::vector<ChunkInfo>* out) {
    LL_RETURN_IF_ERROR(NeedRecords(kChunks, begin, end));
    if (out->empty()) out->reserve(end - begin);
    const char* p = SectionData(kChunks) + begin * kChunkRecordBytes;
    for (uint64_t i = begin; i < end; ++i, p += kChunkRecordBytes)
      out->push_back(ChunkInfo{Get<uint64_t>(p), Get<uint64_t>(p + 8)});
    return Status::OK();
  }
  uint64_t num_chunks() const { return counts_[kChunks]; }

  // Fetches the records of fragments [begin, end) and then, each in one go, the stretches of the
  // dims pool and of the chunks section they refer to (contiguous in a manifest grouped by tensor),
  // so that parsing them does not fetch block after block. References out of range are left for
  // the parsers to report.
  Status PrefetchFragments(uint64_t begin, uint64_t end) {
    if (image_ == nullptr || begin >= end) return Status::OK();
    LL_RETURN_IF_ERROR(NeedRecords(kFragments, begin, end));
    uint64_t dims_lo = UINT64_MAX, dims_hi = 0, chunks_lo = UINT64_MAX, chunks_hi = 0;
    const char* p = SectionData(kFragments) + begin * kFragmentRecordBytes;
    for (uint64_t i = begin; i < end; ++i, p += kFragmentRecordBytes) {
      const uint64_t first_chunk = Get<uint64_t>(p + 16), num_chunks = Get<uint64_t>(p + 24);
      const uint64_t dims_start = Get<uint64_t>(p + 48), ndim = Get<uint8_t>(p + 56);
      if (dims_start <= counts_[kDims] && 2 * ndim <= counts_[kDims] - dims_start) {
        dims_lo = std::min(dims_lo, dims_start);
        dims_hi = std::max(dims_hi, dims_start + 2 * ndim);
      }
      if (num_chunks > 0 && first_chunk <= counts_[kChunks] && num_chunks <= counts_[kChunks] - first_chunk) {
        chunks_lo = std::min(chunks_lo, first_chunk);
        chunks_hi = std::max(chunks_hi, first_chunk + num_chunks);
      }
    }
    if (dims_lo < dims_hi) LL_RETURN_IF_ERROR(NeedRecords(kDims, dims_lo, dims_hi));
    if (chunks_lo < chunks_hi) LL_RETURN_IF_ERROR(NeedRecords(kChunks, chunks_lo, chunks_hi));
    return Status::OK();
  }
  Status NeedRecords(int section, uint64_t begin, uint64_t end) {
    return Need(section_begin_[section] + begin * kRecordBytes[section], (end - begin) * kRecordBytes[section]);
  }

  Status Fail(const std::string& msg) const { return Status::Corruption(source_, msg); }

 private:
  static std::string At(uint64_t offset) { return " at byte offset " + std::to_string(offset); }

  // Makes the file's bytes [offset, offset + length) readable: a no-op for a whole file.
  Status Need(uint64_t offset, uint64_t length) {
    return image_ == nullptr ? Status::OK() : image_->Ensure(offset, length);
  }

  Status ParseHeader() {
    const char* p = base_;
    if (available_ >= sizeof(kMagic) && std::memcmp(p, kMagic, sizeof(kMagic)) != 0)
      return Fail("not a Lifeline index (bad magic)");
    if (available_ < kHeaderPrefixBytes + 8)
      return Fail("truncated: " + std::to_string(file_size_) + " bytes, shorter than an index header");
    const uint32_t version = Get<uint32_t>(p + kOffVersion);
    const uint32_t header_length = Get<uint32_t>(p + kOffHeaderLength);
    if (header_length < kHeaderPrefixBytes + 8 || header_length > kMaxHeaderBytes || header_length % 8 != 0)
      return Fail("implausible header length " + std::to_string(header_length) + At(kOffHeaderLength));
    if (header_length > available_)
      return Fail("truncated: " + std::to_string(file_size_) + " bytes, shorter than the " +
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

  // Every section must fit in the file before anything is allocated for it.
  Status ParseLayout() {
    if (file_length_ != file_size_)
      return Fail((file_length_ > file_size_ ? "truncated: " : "trailing bytes: ") + std::to_string(file_size_) +
                  " bytes, but the header says " + std::to_string(file_length_));
    if (file_size_ > kMaxIndexBytes)
      return Fail(std::to_string(file_size_) + " bytes exceed the index size limit of " + std::to_string(kMaxIndexBytes));
    if (file_size_ < header_length_ + kTrailerBytes) return Fail("truncated: no room for the trailer after the header");
    uint64_t pos = header_length_;
    const uint64_t body_end = file_size_ - kTrailerBytes;
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
    if (pos != body_end) return Fail("sections end" + At(pos) + " but the trailer starts" + At(body_end));
    return Status::OK();
  }

  // The whole-file checksum: only a decoder holding every byte can check it.
  Status CheckTrailer() const {
    const uint64_t body_end = file_size_ - kTrailerBytes;
    const char* trailer = base_ + body_end;
    if (std::memcmp(trailer + 8, kEndMagic, sizeof(kEndMagic)) != 0) return Fail("bad end magic" + At(body_end + 8));
    if (Get<uint64_t>(trailer) != Checksum64(base_, body_end))
      return Fail("checksum mismatch: the body's bytes were altered" + At(body_end));
    return Status::OK();
  }

  const char* SectionData(Section s) const { return base_ + section_begin_[s]; }

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
    LL_RETURN_IF_ERROR(Need(section_begin_[kStrings] + offset, length));
    out->assign(SectionData(kStrings) + offset, length);
    return Status::OK();
  }

  Status TakeDims(uint64_t start, uint64_t n, const std::string& what, std::vector<int64_t>* out) {
    if (n > kMaxRank) return Fail(what + ": " + std::to_string(n) + " dimensions exceed " + std::to_string(kMaxRank));
    const uint64_t pool = counts_[kDims];
    if (start > pool || n > pool - start)
      return Fail(what + ": dims [" + std::to_string(start) + ", +" + std::to_string(n) + ") outside the pool of " +
                  std::to_string(pool));
    LL_RETURN_IF_ERROR(Need(section_begin_[kDims] + start * kDimBytes, n * kDimBytes));
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
    LL_RETURN_IF_ERROR(NeedRecords(kFiles, 0, counts_[kFiles]));
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
    LL_RETURN_IF_ERROR(NeedRecords(kTensors, 0, counts_[kTensors]));
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

  Status ParseObjects() {
    LL_RETURN_IF_ERROR(NeedRecords(kObjects, 0, counts_[kObjects]));
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

  const char* const base_;
  const uint64_t available_;  // bytes at base_ readable before any Need: the header's
  const uint64_t file_size_;
  const std::string source_;
  BlockImage* const image_ = nullptr;
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

  // A manifest whose fragments are grouped by tensor gets a directory (§5.5) at the end of its
  // string table: where each tensor's fragments end, and a checksum per block of the body, so that
  // a load can read only the parts it needs. BuildManifest groups them so.
  const bool directory =
      index.kind == IndexKind::kManifest &&
      std::is_sorted(index.fragments.begin(), index.fragments.end(),
                     [](const FragmentInfo& a, const FragmentInfo& b) { return a.tensor < b.tensor; });
  const uint64_t header_length = directory ? kManifestHeaderBytes : kHeaderBytes;
  uint64_t counts[kNumSections] = {index.files.size(), index.tensors.size(), index.fragments.size(),
                                   index.chunks.size(), index.objects.size(), num_dims, strings.bytes().size()};
  uint64_t section_bytes[kNumSections];
  uint64_t section_begin[kNumSections];
  uint64_t pos = header_length;
  uint64_t directory_offset = 0, num_blocks = 0;
  // Box runs: maximal stretches of one tensor's fragments that share a box (the DP parts of one
  // TP shard, say). A reader tests a run's box against its targets before reading its fragments.
  std::vector<uint64_t> run_begin;
  uint64_t tables_offset = 0;
  if (directory) {
    for (size_t i = 0; i < index.fragments.size(); ++i)
      if (i == 0 || index.fragments[i].tensor != index.fragments[i - 1].tensor || fragment_dims[i] != fragment_dims[i - 1])
        run_begin.push_back(i);
  }
  for (int s = 0; s < kNumSections; ++s) {
    if (s == kStrings && directory) {
      tables_offset = pos + counts[s];
      directory_offset = tables_offset + 16 * (index.tensors.size() + run_begin.size());
      num_blocks = (directory_offset - header_length + kBlockBytes - 1) / kBlockBytes;
      counts[s] = directory_offset - pos + kDirectoryFixedBytes + 8 * num_blocks;
    }
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
  Put<uint32_t>(base + kOffHeaderLength, static_cast<uint32_t>(header_length));
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

  if (directory) {
    // Tensor table: (fragment end, run end) per tensor; run table: (first fragment, dims start).
    char* d = base + tables_offset;
    uint64_t end = 0, runs = 0;
    for (size_t t = 0; t < index.tensors.size(); ++t, d += 16) {
      while (end < index.fragments.size() && index.fragments[end].tensor == t) ++end;
      while (runs < run_begin.size() && run_begin[runs] < end) ++runs;
      Put<uint64_t>(d, end);
      Put<uint64_t>(d + 8, runs);
    }
    for (uint64_t r = 0; r < run_begin.size(); ++r, d += 16) {
      Put<uint64_t>(d, run_begin[r]);
      Put<uint64_t>(d + 8, fragment_dims[run_begin[r]]);
    }
    // The directory proper: where the tables are, then the block checksums, which cover them.
    Put<uint64_t>(d, tables_offset);
    Put<uint64_t>(d + 8, run_begin.size());
    d += kDirectoryFixedBytes;
    for (uint64_t b = 0; b < num_blocks; ++b, d += 8) {
      const uint64_t at = header_length + b * kBlockBytes;
      Put<uint64_t>(d, Checksum64(base + at, std::min(kBlockBytes, directory_offset - at)));
    }
    const uint64_t directory_length = kDirectoryFixedBytes + 8 * num_blocks;
    Put<uint64_t>(base + kOffDirectoryOffset, directory_offset);
    Put<uint64_t>(base + kOffDirectoryLength, directory_length);
    Put<uint64_t>(base + kOffDirectoryChecksum, Checksum64(base + directory_offset, directory_length));
    Put<uint64_t>(base + kOffBlockBytes, kBlockBytes);
  }
  Put<uint64_t>(base + header_length - 8, Checksum64(base, header_length - 8));

  const uint64_t body_end = file_length - kTrailerBytes;
  Put<uint64_t>(base + body_end, Checksum64(base, body_end));
  std::memcpy(base + body_end + 8, kEndMagic, sizeof(kEndMagic));
  return out;
}

Result<CheckpointIndex> DecodeIndex(std::string_view bytes, std::string_view source) {
  return IndexDecoder(bytes, source).Decode();
}

// ---- reading a manifest in parts ----

struct ManifestPartReader::State {
  State(ReadAt read, uint64_t file_size, std::string source)
      : image(std::move(read), file_size, source), source(std::move(source)) {}

  Status Fail(const std::string& msg) const { return Status::Corruption(source, msg); }
  // (fragment end, run end) of tensor t, whose entry is resident; (0, 0) before tensor 0.
  std::pair<uint64_t, uint64_t> TensorEntry(int64_t t) const {
    if (t < 0) return {0, 0};
    const char* p = image.base() + tables_offset + 16 * static_cast<uint64_t>(t);
    return {Get<uint64_t>(p), Get<uint64_t>(p + 8)};
  }
  uint64_t RunAt(uint64_t r) const { return tables_offset + 16 * (num_tensors + r); }

  Status Add(const std::vector<TensorBox>* wanted, CheckpointIndex* into);

  BlockImage image;
  std::string source;
  std::unique_ptr<IndexDecoder> decoder;
  uint64_t tables_offset = 0;  // tensor table, then run table (§5.5)
  uint64_t num_tensors = 0;
  uint64_t num_runs = 0;
  std::vector<bool> run_fetched;
};

ManifestPartReader::ManifestPartReader(std::unique_ptr<State> state) : state_(std::move(state)) {}
ManifestPartReader::~ManifestPartReader() = default;

Result<std::unique_ptr<ManifestPartReader>> ManifestPartReader::Open(ReadAt read, uint64_t file_size,
                                                                     std::string_view source) {
  auto state = std::make_unique<State>(std::move(read), file_size, SourceName(source));
  const std::string& name = state->source;
  if (file_size > kMaxIndexBytes)
    return Status::Corruption(name, std::to_string(file_size) + " bytes exceed the index size limit of " +
                                        std::to_string(kMaxIndexBytes));
  if (file_size < kHeaderPrefixBytes + 8)
    return Status::Corruption(name, "truncated: " + std::to_string(file_size) + " bytes, shorter than an index header");
  LL_RETURN_IF_ERROR(state->image.Map());
  const uint64_t prefix = std::min<uint64_t>(file_size, kMaxHeaderBytes);
  LL_RETURN_IF_ERROR(state->image.ReadRaw(0, prefix));
  state->decoder = std::make_unique<IndexDecoder>(&state->image, prefix, file_size, name);
  IndexDecoder& decoder = *state->decoder;
  LL_RETURN_IF_ERROR(decoder.ParseHeaderAndLayout());
  if (decoder.index().kind != IndexKind::kManifest) return Status::Corruption(name, "is a rank index, not a manifest");
  uint64_t offset = 0, length = 0, checksum = 0, block_bytes = 0;
  LL_ASSIGN_OR_RETURN(const bool has_directory, decoder.DirectoryPlace(&offset, &length, &checksum, &block_bytes));
  if (!has_directory) return std::unique_ptr<ManifestPartReader>();
  LL_RETURN_IF_ERROR(state->image.ReadRaw(offset, length));
  const char* dir = state->image.base() + offset;
  if (Checksum64(dir, length) != checksum)
    return decoder.Fail("directory [" + std::to_string(offset) + ", +" + std::to_string(length) +
                        ") does not match its checksum in the header");
  state->num_tensors = decoder.num_tensors();
  state->tables_offset = Get<uint64_t>(dir);
  state->num_runs = Get<uint64_t>(dir + 8);
  // The tables end where the directory begins, inside the string table.
  const uint64_t tensors_bytes = 16 * state->num_tensors;
  if (state->tables_offset < decoder.strings_begin() || state->tables_offset > offset ||
      offset - state->tables_offset < tensors_bytes || state->num_runs > decoder.num_fragments() ||
      offset - state->tables_offset - tensors_bytes != 16 * state->num_runs)
    return decoder.Fail("directory: tensor and run tables at " + std::to_string(state->tables_offset) + " with " +
                        std::to_string(state->num_runs) + " runs do not end where the directory begins, at " +
                        std::to_string(offset));
  state->run_fetched.assign(state->num_runs, false);
  std::vector<uint64_t> sums((length - kDirectoryFixedBytes) / 8);
  for (size_t b = 0; b < sums.size(); ++b) sums[b] = Get<uint64_t>(dir + kDirectoryFixedBytes + 8 * b);
  state->image.SetBlocks(decoder.header_length(), offset, block_bytes, std::move(sums));
  LL_RETURN_IF_ERROR(decoder.ParseHead());
  LL_RETURN_IF_ERROR(ValidateIndex(decoder.index(), name, /*untrusted=*/true));
  return std::unique_ptr<ManifestPartReader>(new ManifestPartReader(std::move(state)));
}

const CheckpointIndex& ManifestPartReader::head() const { return state_->decoder->index(); }

uint64_t ManifestPartReader::bytes_read() const { return state_->image.bytes_read(); }

Status ManifestPartReader::AddFragments(const std::vector<TensorBox>& wanted, CheckpointIndex* into) {
  return state_->Add(&wanted, into);
}

Status ManifestPartReader::AddTensors(const std::vector<uint32_t>& tensors, CheckpointIndex* into) {
  std::vector<TensorBox> whole;
  for (uint32_t t : tensors) whole.push_back(TensorBox{t, std::nullopt});
  return state_->Add(&whole, into);
}

Status ManifestPartReader::AddAllFragments(CheckpointIndex* into) { return state_->Add(nullptr, into); }

Status ManifestPartReader::State::Add(const std::vector<TensorBox>* wanted, CheckpointIndex* into) {
  IndexDecoder& d = *decoder;
  const CheckpointIndex& head = d.index();
  // The boxes asked for, by tensor; a tensor mapped to nothing is wanted whole.
  std::map<uint32_t, std::vector<Box>> boxes;
  std::set<uint32_t> whole;
  if (wanted == nullptr) {
    for (uint32_t t = 0; t < num_tensors; ++t) whole.insert(t);
  } else {
    for (const TensorBox& w : *wanted) {
      if (w.tensor >= num_tensors)
        return Status::InvalidArgument(source, "tensor " + std::to_string(w.tensor) + " of " +
                                                   std::to_string(num_tensors) + " asked for");
      if (!w.box.has_value()) {
        whole.insert(w.tensor);
      } else if (w.box->volume() > 0) {
        boxes[w.tensor].push_back(*w.box);
      }
    }
  }
  std::vector<uint32_t> tensors(whole.begin(), whole.end());
  for (const auto& [t, list] : boxes)
    if (!whole.count(t)) tensors.push_back(t);
  std::sort(tensors.begin(), tensors.end());

  // Groups of consecutive tensors: their table entries, run entries and run boxes each come in one read.
  struct Selected {
    uint32_t tensor;
    uint64_t run, fragment_begin, fragment_end, dims_start;
  };
  std::vector<Selected> selected;
  std::vector<uint32_t> completed;  // tensors whose every run is now read
  std::vector<int64_t> zeros;
  for (size_t i = 0; i < tensors.size();) {
    size_t j = i + 1;
    while (j < tensors.size() && tensors[j] == tensors[j - 1] + 1) ++j;
    const int64_t lo = static_cast<int64_t>(tensors[i]) - 1, hi = tensors[j - 1];
    const uint64_t first_entry = static_cast<uint64_t>(std::max<int64_t>(lo, 0));
    LL_RETURN_IF_ERROR(image.Ensure(tables_offset + 16 * first_entry, 16 * (hi - first_entry + 1)));
    const uint64_t runs_begin = TensorEntry(lo).second, runs_end = TensorEntry(hi).second;
    if (runs_begin > runs_end || runs_end > num_runs)
      return Fail("run table: tensors " + std::to_string(tensors[i]) + " to " + std::to_string(hi) + " list runs [" +
                  std::to_string(runs_begin) + ", " + std::to_string(runs_end) + ") of " + std::to_string(num_runs));
    LL_RETURN_IF_ERROR(image.Ensure(RunAt(runs_begin), 16 * (runs_end - runs_begin)));
    // The boxes of those runs lie together in the dims pool; fetched in one go.
    uint64_t dims_lo = UINT64_MAX, dims_hi = 0;
    for (uint64_t r = runs_begin; r < runs_end; ++r) {
      const uint64_t start = Get<uint64_t>(image.base() + RunAt(r) + 8);
      if (start < d.num_dims() && start < dims_lo) dims_lo = start;
      dims_hi = std::max(dims_hi, std::min(d.num_dims(), start + 2 * kMaxRank));
    }
    if (dims_lo < dims_hi) LL_RETURN_IF_ERROR(d.NeedRecords(kDims, dims_lo, dims_hi));
    for (size_t k = i; k < j; ++k) {
      const uint32_t t = tensors[k];
      const auto [fragments_begin, run_begin] = TensorEntry(static_cast<int64_t>(t) - 1);
      const auto [fragments_end, run_end] = TensorEntry(t);
      if (fragments_begin > fragments_end || fragments_end > d.num_fragments() || run_begin > run_end ||
          (fragments_begin == fragments_end) != (run_begin == run_end))
        return Fail("tensor table: tensor " + std::to_string(t) + " lists fragments [" + std::to_string(fragments_begin) +
                    ", " + std::to_string(fragments_end) + ") and runs [" + std::to_string(run_begin) + ", " +
                    std::to_string(run_end) + ")");
      const size_t ndim = head.tensors[t].shape.size();
      const std::vector<Box>& targets = boxes[t];
      bool all_read = true;
      for (uint64_t r = run_begin; r < run_end; ++r) {
        const char* e = image.base() + RunAt(r);
        const uint64_t begin = Get<uint64_t>(e), dims_start = Get<uint64_t>(e + 8);
        const uint64_t end = r + 1 < run_end ? Get<uint64_t>(e + 16) : fragments_end;
        if (begin >= end || begin < fragments_begin || end > fragments_end || (r == run_begin && begin != fragments_begin))
          return Fail("run table: run " + std::to_string(r) + " of tensor " + std::to_string(t) + " spans fragments [" +
                      std::to_string(begin) + ", " + std::to_string(end) + "), outside its tensor's [" +
                      std::to_string(fragments_begin) + ", " + std::to_string(fragments_end) + ")");
        if (dims_start > d.num_dims() || 2 * ndim > d.num_dims() - dims_start)
          return Fail("run table: run " + std::to_string(r) + " has dims [" + std::to_string(dims_start) + ", +2*" +
                      std::to_string(ndim) + ") outside the pool of " + std::to_string(d.num_dims()));
        bool take = whole.count(t) > 0 || ndim == 0;
        if (!take) {
          LL_RETURN_IF_ERROR(d.NeedRecords(kDims, dims_start, dims_start + 2 * ndim));
          Box run_box;
          d.ReadBox(dims_start, ndim, &run_box.lo, &run_box.extent);
          Box both;
          for (const Box& b : targets) take = take || Intersect(run_box, b, &both);
        }
        if (take && !run_fetched[r]) {
          run_fetched[r] = true;
          selected.push_back(Selected{t, r, begin, end, dims_start});
        }
        all_read = all_read && run_fetched[r];
      }
      if (all_read) completed.push_back(t);
    }
    i = j;
  }

  // The selected runs' fragments: consecutive runs read together, then parsed run by run.
  for (size_t i = 0; i < selected.size();) {
    size_t j = i + 1;
    while (j < selected.size() && selected[j].fragment_begin == selected[j - 1].fragment_end) ++j;
    LL_RETURN_IF_ERROR(d.PrefetchFragments(selected[i].fragment_begin, selected[j - 1].fragment_end));
    i = j;
  }
  std::vector<FragmentInfo> fragments;
  for (const Selected& run : selected) {
    fragments.clear();
    LL_RETURN_IF_ERROR(d.ParseFragments(run.fragment_begin, run.fragment_end, &fragments));
    Box run_box;
    const size_t ndim = head.tensors[run.tensor].shape.size();
    LL_RETURN_IF_ERROR(d.NeedRecords(kDims, run.dims_start, run.dims_start + 2 * ndim));
    d.ReadBox(run.dims_start, ndim, &run_box.lo, &run_box.extent);
    for (uint64_t i = 0; i < fragments.size(); ++i) {
      FragmentInfo& fr = fragments[i];
      const uint64_t at = run.fragment_begin + i;
      if (fr.tensor != run.tensor)
        return Fail("fragment " + std::to_string(at) + " belongs to tensor " + std::to_string(fr.tensor) +
                    ", but the directory lists it among tensor " + std::to_string(run.tensor) + "'s");
      if (fr.region.offsets != run_box.lo || fr.region.shape != run_box.extent)
        return Fail("fragment " + std::to_string(at) + " of tensor " + QuoteUntrusted(head.tensors[run.tensor].name) +
                    " lies in another box than its run " + std::to_string(run.run) + " says");
      if (fr.first_chunk > d.num_chunks() || fr.num_chunks > d.num_chunks() - fr.first_chunk)
        return Fail("fragment " + std::to_string(at) + ": chunks [" + std::to_string(fr.first_chunk) + ", +" +
                    std::to_string(fr.num_chunks) + ") outside the " + std::to_string(d.num_chunks()) + " chunks");
      const uint64_t renumbered = into->chunks.size();
      LL_RETURN_IF_ERROR(d.ParseChunks(fr.first_chunk, fr.first_chunk + fr.num_chunks, &into->chunks));
      fr.first_chunk = renumbered;
      into->fragments.push_back(std::move(fr));
    }
  }
  LL_RETURN_IF_ERROR(ValidateIndex(*into, source, /*untrusted=*/true));
  // The coverage rule needs all of a tensor's fragments: applied to each tensor read completely.
  // A tensor read in part relies on the load plan, which fails when a target element is stored by
  // no fragment it read.
  return ValidateCoverage(*into, source, /*untrusted=*/true, &completed);
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

  // Fragments grouped by tensor (in rank order within one), their chunks moved along so that chunks
  // stay in fragment order: the layout the manifest directory describes (§5.5), which lets a load
  // read the fragments of its tensors and nothing else.
  std::vector<uint32_t> order(manifest.fragments.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return manifest.fragments[a].tensor < manifest.fragments[b].tensor;
  });
  std::vector<FragmentInfo> fragments;
  std::vector<ChunkInfo> chunks;
  fragments.reserve(manifest.fragments.size());
  chunks.reserve(manifest.chunks.size());
  for (uint32_t i : order) {
    FragmentInfo& fr = fragments.emplace_back(std::move(manifest.fragments[i]));
    const uint64_t first = fr.first_chunk;
    fr.first_chunk = chunks.size();
    chunks.insert(chunks.end(), manifest.chunks.begin() + first, manifest.chunks.begin() + first + fr.num_chunks);
  }
  manifest.fragments = std::move(fragments);
  manifest.chunks = std::move(chunks);

  LL_RETURN_IF_ERROR(ValidateCoverage(manifest, kWhat, /*untrusted=*/false));
  return manifest;
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
