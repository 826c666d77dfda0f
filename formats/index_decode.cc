// DecodeIndex and the IndexDecoder behind it (formats/index_decoder.h): every length, count,
// offset and name of a rank index or manifest is checked before use.
#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <utility>

#include "formats/checksum.h"
#include "formats/index_codec.h"
#include "formats/index_decoder.h"
#include "formats/index_layout.h"

namespace lifeline::format {
namespace internal {

Result<CheckpointIndex> IndexDecoder::Decode() {
  LL_RETURN_IF_ERROR(ParseHeader());
  LL_RETURN_IF_ERROR(ParseLayout());
  LL_RETURN_IF_ERROR(CheckTrailer());
  LL_RETURN_IF_ERROR(ParseHead());
  LL_RETURN_IF_ERROR(ParseFragments(0, counts_[kFragments], &index_.fragments));
  LL_RETURN_IF_ERROR(ParseChunks(0, counts_[kChunks], &index_.chunks));
  LL_RETURN_IF_ERROR(ValidateIndex(index_, source_, /*untrusted=*/true));
  return std::move(index_);
}

Status IndexDecoder::ParseHeaderAndLayout() {
  LL_RETURN_IF_ERROR(ParseHeader());
  return ParseLayout();
}

Result<bool> IndexDecoder::DirectoryPlace(uint64_t* offset, uint64_t* length, uint64_t* checksum,
                                          uint64_t* block_bytes) const {
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

void IndexDecoder::ReadBox(uint64_t start, size_t ndim, std::vector<int64_t>* lo, std::vector<int64_t>* extent) const {
  const char* d = SectionData(kDims) + start * kDimBytes;
  lo->resize(ndim);
  extent->resize(ndim);
  for (size_t k = 0; k < ndim; ++k) {
    (*lo)[k] = Get<int64_t>(d + k * kDimBytes);
    (*extent)[k] = Get<int64_t>(d + (ndim + k) * kDimBytes);
  }
}

Status IndexDecoder::ParseHead() {
  LL_RETURN_IF_ERROR(ParseStrings());
  LL_RETURN_IF_ERROR(ParseFiles());
  LL_RETURN_IF_ERROR(ParseTensors());
  return ParseObjects();
}

Status IndexDecoder::ParseFragments(uint64_t begin, uint64_t end, std::vector<FragmentInfo>* out) {
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

Status IndexDecoder::ParseChunks(uint64_t begin, uint64_t end, std::vector<ChunkInfo>* out) {
  LL_RETURN_IF_ERROR(NeedRecords(kChunks, begin, end));
  if (out->empty()) out->reserve(end - begin);
  const char* p = SectionData(kChunks) + begin * kChunkRecordBytes;
  for (uint64_t i = begin; i < end; ++i, p += kChunkRecordBytes)
    out->push_back(ChunkInfo{Get<uint64_t>(p), Get<uint64_t>(p + 8)});
  return Status::OK();
}

Status IndexDecoder::PrefetchFragments(uint64_t begin, uint64_t end) {
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

Status IndexDecoder::NeedRecords(int section, uint64_t begin, uint64_t end) {
  return Need(section_begin_[section] + begin * kRecordBytes[section], (end - begin) * kRecordBytes[section]);
}

Status IndexDecoder::Need(uint64_t offset, uint64_t length) {
  return image_ == nullptr ? Status::OK() : image_->Ensure(offset, length);
}

Status IndexDecoder::ParseHeader() {
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

Status IndexDecoder::ParseLayout() {
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

Status IndexDecoder::CheckTrailer() const {
  const uint64_t body_end = file_size_ - kTrailerBytes;
  const char* trailer = base_ + body_end;
  if (std::memcmp(trailer + 8, kEndMagic, sizeof(kEndMagic)) != 0) return Fail("bad end magic" + At(body_end + 8));
  if (Get<uint64_t>(trailer) != Checksum64(base_, body_end))
    return Fail("checksum mismatch: the body's bytes were altered" + At(body_end));
  return Status::OK();
}

Status IndexDecoder::TakeString(uint64_t offset, uint64_t length, uint64_t limit, const std::string& what,
                                std::string* out) {
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

Status IndexDecoder::TakeDims(uint64_t start, uint64_t n, const std::string& what, std::vector<int64_t>* out) {
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

Status IndexDecoder::ParseStrings() {
  LL_RETURN_IF_ERROR(TakeString(run_id_offset_, run_id_length_, UINT64_MAX, "run id", &index_.run_id));
  return TakeString(metadata_offset_, metadata_length_, UINT64_MAX, "metadata", &index_.metadata_json);
}

Status IndexDecoder::ParseFiles() {
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

Status IndexDecoder::ParseTensors() {
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

Status IndexDecoder::ParseObjects() {
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

}  // namespace internal

Result<CheckpointIndex> DecodeIndex(std::string_view bytes, std::string_view source) {
  return internal::IndexDecoder(bytes, source).Decode();
}

}  // namespace lifeline::format
