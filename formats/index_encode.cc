// EncodeIndex: a rank index or manifest as the bytes of its file (formats/SPEC.md, "Index file"),
// with the manifest directory (§5.5) when the fragments are grouped by tensor.
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "formats/checksum.h"
#include "formats/index_codec.h"
#include "formats/index_layout.h"

namespace lifeline::format {

using namespace internal;

namespace {

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

}  // namespace lifeline::format
