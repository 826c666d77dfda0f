// ManifestPartReader: a manifest read in parts through its directory (formats/SPEC.md §5.5), and
// the BlockImage that holds the blocks read so far, each verified before use.
#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "formats/checksum.h"
#include "formats/geometry.h"
#include "formats/index_codec.h"
#include "formats/index_decoder.h"
#include "formats/index_layout.h"

namespace lifeline::format {
namespace internal {

BlockImage::~BlockImage() {
  if (base_ != nullptr) munmap(base_, file_size_);
}

Status BlockImage::Map() {
  void* p = mmap(nullptr, file_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return Status::ResourceExhausted(source_, "cannot map " + std::to_string(file_size_) + " bytes");
  base_ = static_cast<char*>(p);
  return Status::OK();
}

Status BlockImage::ReadRaw(uint64_t offset, uint64_t n) {
  bytes_read_ += n;
  return read_(offset, n, base_ + offset);
}

void BlockImage::SetBlocks(uint64_t begin, uint64_t end, uint64_t block_bytes, std::vector<uint64_t> checksums) {
  blocks_begin_ = begin;
  blocks_end_ = end;
  block_bytes_ = block_bytes;
  checksums_ = std::move(checksums);
  resident_.assign(checksums_.size(), false);
}

Status BlockImage::Ensure(uint64_t offset, uint64_t length) {
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

}  // namespace internal

using namespace internal;

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

}  // namespace lifeline::format
