// The index decoder that DecodeIndex runs over a whole file and ManifestPartReader step by step
// over the verified blocks of a manifest (formats/SPEC.md, "Index file" and §5.5). Internal to the
// index codec (index_decode.cc, manifest_parts.cc); callers use formats/index_codec.h.
//
// Thread safety: one thread at a time per object.
#ifndef LIFELINE_FORMATS_INDEX_DECODER_H_
#define LIFELINE_FORMATS_INDEX_DECODER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/index_codec.h"
#include "formats/index_layout.h"
#include "formats/model.h"
#include "lifeline/status.h"

namespace lifeline::format::internal {

// The verified bytes of a manifest read piece by piece (§5.5): an anonymous mapping as large as
// the file, of which only the blocks asked for are read (and so only they occupy memory), each
// checked against its checksum in the directory before anything in it is used. The directory's
// own bytes, checked as a whole, are placed at their offset. Defined in manifest_parts.cc.
class BlockImage {
 public:
  BlockImage(ManifestPartReader::ReadAt read, uint64_t file_size, std::string source)
      : read_(std::move(read)), file_size_(file_size), source_(std::move(source)) {}
  ~BlockImage();
  BlockImage(const BlockImage&) = delete;
  BlockImage& operator=(const BlockImage&) = delete;

  // Maps the file's size of anonymous memory; ResourceExhausted when that fails.
  Status Map();
  char* base() const { return base_; }
  uint64_t bytes_read() const { return bytes_read_; }

  // Reads `n` bytes at `offset` straight into place, unverified (the header and the directory,
  // which carry their own checksums).
  Status ReadRaw(uint64_t offset, uint64_t n);

  // Blocks of `block_bytes` from `begin` to `end`, with their checksums; bytes from `end` on (the
  // directory) are resident already.
  void SetBlocks(uint64_t begin, uint64_t end, uint64_t block_bytes, std::vector<uint64_t> checksums);

  // Makes [offset, offset + length) readable and verified. Missing blocks next to each other are
  // read in one call.
  Status Ensure(uint64_t offset, uint64_t length);

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
// fetches and verifies the blocks first. Errors are Corruption naming the source (NotSupported for
// a newer format version). Defined in index_decode.cc.
class IndexDecoder {
 public:
  IndexDecoder(std::string_view bytes, std::string_view source)
      : base_(bytes.data()), available_(bytes.size()), file_size_(bytes.size()), source_(SourceName(source)) {}
  IndexDecoder(BlockImage* image, uint64_t header_bytes_read, uint64_t file_size, std::string_view source)
      : base_(image->base()), available_(header_bytes_read), file_size_(file_size), source_(SourceName(source)),
        image_(image) {}

  // The whole file, checked and validated (ValidateIndex).
  Result<CheckpointIndex> Decode();

  // ---- the steps of a partial read (ManifestPartReader) ----

  // Header and section layout, from the first bytes of the file.
  Status ParseHeaderAndLayout();

  // The directory's place and shape: false when the file has none (written before §5.5). The
  // fields are the header's, already authenticated; what they say is checked against the layout.
  Result<bool> DirectoryPlace(uint64_t* offset, uint64_t* length, uint64_t* checksum, uint64_t* block_bytes) const;
  uint64_t header_length() const { return header_length_; }
  uint64_t num_tensors() const { return counts_[kTensors]; }
  uint64_t num_fragments() const { return counts_[kFragments]; }
  uint64_t num_dims() const { return counts_[kDims]; }
  uint64_t strings_begin() const { return section_begin_[kStrings]; }

  // Offsets then shape at `start` of the dims pool, made readable (NeedRecords) and in range.
  void ReadBox(uint64_t start, size_t ndim, std::vector<int64_t>* lo, std::vector<int64_t>* extent) const;

  // Files, tensors, objects and the strings they name: everything but fragments and chunks.
  Status ParseHead();
  CheckpointIndex& index() { return index_; }

  // Fragment records [begin, end) appended to `out` as they are (chunk numbers unchanged).
  Status ParseFragments(uint64_t begin, uint64_t end, std::vector<FragmentInfo>* out);

  // Chunk records [begin, end), which the caller has checked lie in the section.
  Status ParseChunks(uint64_t begin, uint64_t end, std::vector<ChunkInfo>* out);
  uint64_t num_chunks() const { return counts_[kChunks]; }

  // Fetches the records of fragments [begin, end) and then, each in one go, the stretches of the
  // dims pool and of the chunks section they refer to (contiguous in a manifest grouped by tensor),
  // so that parsing them does not fetch block after block. References out of range are left for
  // the parsers to report.
  Status PrefetchFragments(uint64_t begin, uint64_t end);
  // Makes records [begin, end) of `section` readable.
  Status NeedRecords(int section, uint64_t begin, uint64_t end);

  Status Fail(const std::string& msg) const { return Status::Corruption(source_, msg); }

 private:
  static std::string At(uint64_t offset) { return " at byte offset " + std::to_string(offset); }

  // Makes the file's bytes [offset, offset + length) readable: a no-op for a whole file.
  Status Need(uint64_t offset, uint64_t length);

  Status ParseHeader();
  // Every section must fit in the file before anything is allocated for it.
  Status ParseLayout();
  // The whole-file checksum: only a decoder holding every byte can check it.
  Status CheckTrailer() const;

  const char* SectionData(Section s) const { return base_ + section_begin_[s]; }

  // Resolves a string reference. The sum of all referenced lengths may not exceed the table, so
  // overlapping references cannot make the decoder allocate more than the file holds.
  Status TakeString(uint64_t offset, uint64_t length, uint64_t limit, const std::string& what, std::string* out);
  Status TakeDims(uint64_t start, uint64_t n, const std::string& what, std::vector<int64_t>* out);
  Status ParseStrings();
  Status ParseFiles();
  Status ParseTensors();
  Status ParseObjects();

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

}  // namespace lifeline::format::internal

#endif  // LIFELINE_FORMATS_INDEX_DECODER_H_
