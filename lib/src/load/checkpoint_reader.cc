#include "lib/src/load/checkpoint_reader.h"

#include <sys/mman.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <set>
#include <type_traits>
#include <unordered_map>

#include "formats/checksum.h"
#include "formats/codec.h"
#include "formats/geometry.h"
#include "formats/index_codec.h"
#include "lib/src/env/aligned_buffer.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lifeline/internal/io_pump.h"
#include "lifeline/internal/load_plan.h"
#include "lib/src/store/step_scan.h"
#include "lifeline/internal/copy_kernel.h"
#include "lifeline/log.h"
#include "lifeline/internal/shared_memory.h"

namespace lifeline {
namespace {

std::string ShapeString(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

constexpr uint64_t kHugePageBytes = 2ull << 20;
constexpr uint64_t kHugeStagingBytes = 4ull << 20;
constexpr uint64_t kReadAheadBytes = 32ull << 20;
// Reads of spans that are adjacent in a file, or share a 4096-byte block, are merged into one
// read of at most this many bytes (plus the alignment slack at its ends): 256 KiB chunks then cost
// one I/O per 8 MiB rather than one each, which is what a virtio disk needs to reach its limit
// (its requests are at most 4 MiB; smaller ones each cost it latency). At least
// kMinReadsInFlight merged reads fit in the read-ahead.
constexpr uint64_t kMergeBytes = 8ull << 20;
// Objects up to this size stored next to the chunks a load reads are read with them (and kept in
// memory until ReadObject asks for them).
constexpr uint64_t kPrefetchObjectBytes = 1ull << 20;
constexpr uint64_t kMinReadsInFlight = 4;
// Objects: 16 ranged GETs of up to 4 MiB in flight.
constexpr uint64_t kRemoteReadAheadBytes = 64ull << 20;
constexpr uint64_t kRemoteMergeBytes = 4ull << 20;

// One contiguous extent of a data file to read and hand to a consumer.
struct ReadSpan {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t tag = 0;  // the consumer's
};

// Writes zeros into the pages of [p, p + n) not yet present, so that a direct read into them does
// not fault them in one by one while the device waits.
void PopulatePages(uint8_t* p, uint64_t n) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
#else
  if (madvise(p, n, 23) == 0) return;  // Linux 5.14's value, for older headers
#endif
  for (uint64_t off = 0; off < n; off += kDirectIoAlignment) {
    volatile uint8_t* q = p + off;
    *q = *q;
  }
}

// Reads spans of the checkpoint's data files with aligned (O_DIRECT where possible) reads, many in
// flight, within a memory budget, and passes each span's bytes to `consume` on this thread.
// Spans that follow each other in the order given, in the same file with no whole 4096-byte block
// between them, are read together: small chunks cost one read per run rather than one each, and
// a block two unaligned chunks share is read once.
class SpanReader {
 public:
  SpanReader(Env* env, const std::string& step_dir, const format::CheckpointIndex& manifest,
             const ReaderOptions& options)
      : env_(env), step_dir_(step_dir), manifest_(manifest), options_(options), files_(manifest.files.size()),
        remote_(IsObjectStorePath(step_dir)) {}

  template <typename Consume>
  Status Run(const std::vector<ReadSpan>& spans, Consume&& consume) {
    // Read-ahead is bounded by bytes as well as by the queue depth: every staging byte is fresh
    // memory the kernel must zero (on a small VM, slower than the disk delivers), and about 32 MiB
    // in flight per reader already keeps a fast device busy.
    // An object store is read with ranged GETs of exactly the spans' bytes (no alignment: nothing
    // bypasses a cache there), merged only where spans touch; each GET waits on the network, so
    // more and smaller ones are kept in flight.
    const uint64_t align = remote_ ? 1 : kDirectIoAlignment;
    const uint64_t staging_cap = std::min(options_.memory_budget, remote_ ? kRemoteReadAheadBytes : kReadAheadBytes);
    // Merged reads stay small enough that several fit in the staging at once.
    const uint64_t merge_cap =
        remote_ ? std::max<uint64_t>(1, std::min(kRemoteMergeBytes, staging_cap / kMinReadsInFlight))
                : std::max(kDirectIoAlignment,
                           AlignDown(std::min(kMergeBytes, staging_cap / kMinReadsInFlight), kDirectIoAlignment)) +
                      kDirectIoAlignment;
    std::vector<Read> reads;
    std::vector<size_t> members;  // span indexes; each read's are a contiguous range of them
    for (size_t i = 0; i < spans.size(); ++i) {
      const ReadSpan& span = spans[i];
      if (span.length == 0) {  // nothing to read (an empty object)
        static const uint8_t kNothing = 0;
        LL_RETURN_IF_ERROR(consume(span, &kNothing));
        continue;
      }
      const uint64_t start = AlignDown(span.offset, align);
      const uint64_t end = AlignUp(span.offset + span.length, align);
      if (!reads.empty()) {
        Read& last = reads.back();
        if (span.file == last.file && start >= last.start && start <= last.end &&
            std::max(end, last.end) - last.start <= merge_cap) {
          last.end = std::max(end, last.end);
          members.push_back(i);
          ++last.members_end;
          continue;
        }
      }
      reads.push_back(Read{span.file, start, end, members.size(), members.size() + 1});
      members.push_back(i);
    }
    if (reads.empty()) return Status::OK();
    uint64_t slot_bytes = 0;
    for (const Read& r : reads) slot_bytes = std::max(slot_bytes, r.end - r.start);
    const unsigned depth = std::max(1u, options_.queue_depth);
    const size_t in_flight_max =
        std::clamp<uint64_t>(staging_cap / slot_bytes, 1, std::min<uint64_t>(depth, reads.size()));
    // One slot more than the reads in flight, where the budget allows: the one being consumed.
    const size_t slots = std::min<uint64_t>(
        {in_flight_max + 1, std::max<uint64_t>(1, options_.memory_budget / slot_bytes), reads.size()});
    // Staging in huge pages where the kernel gives them: a direct read into 4 KiB pages is cut into
    // requests of as many pages as the device takes segments (254 on virtio-blk: 1 MiB), and costs
    // the kernel a page-pinning walk per page; on such a disk that alone halves the throughput.
    // Each slot is faulted in just before its first read, so that no read waits for pages to be
    // zeroed and no other rank's thread waits on this process's memory map meanwhile, while the
    // first read starts after one slot's worth of zeroing rather than the whole staging's. Small
    // staging (a single object) stays in small pages.
    const uint64_t staging_bytes = slots * slot_bytes;
    const bool huge = staging_bytes >= kHugeStagingBytes;
    Result<MappedRegion> mapped =
        MappedRegion::Anonymous(huge ? AlignUp(staging_bytes, kHugePageBytes) : staging_bytes, huge);
    if (!mapped.ok())
      return Status::ResourceExhausted(step_dir_, "cannot map " + std::to_string(staging_bytes) +
                                                      " bytes of read staging: " + mapped.status().message());
    MappedRegion staging = std::move(mapped).value();
    std::vector<size_t> free_slots;
    for (size_t i = slots; i-- > 0;) free_slots.push_back(i);
    std::vector<bool> populated(slots, !huge);
    auto slot_data = [&](size_t slot) { return staging.data() + slot * slot_bytes; };
    IoQueueOptions qopt;
    qopt.depth = static_cast<unsigned>(in_flight_max);
    LL_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue, env_->NewIoQueue(qopt));
    std::vector<size_t> read_of_slot(slots);
    std::vector<size_t> landed;  // slots whose reads completed, not yet consumed
    IoPump pump(queue.get(), [&](const IoCompletion& c) { landed.push_back(static_cast<size_t>(c.tag)); });
    size_t next = 0;
    // Starts reads while slots are free.
    auto fill = [&] {
      while (next < reads.size() && !free_slots.empty() && pump.pending() < in_flight_max && pump.status().ok()) {
        const Read& read = reads[next];
        RandomAccessFile* file = nullptr;
        pump.Fail(OpenFile(read.file, &file));
        if (!pump.status().ok()) return;
        const size_t slot = free_slots.back();
        if (!populated[slot]) {
          PopulatePages(slot_data(slot), slot_bytes);
          populated[slot] = true;
        }
        IoRequest req;
        req.kind = IoRequest::Kind::kRead;
        req.reader = file;
        req.offset = read.start;
        req.buffer = slot_data(slot);
        req.length = read.end - read.start;
        req.tag = slot;
        if (!pump.Submit(req).ok()) return;
        free_slots.pop_back();
        read_of_slot[slot] = next;
        bytes_read_ += read.end - read.start;
        ++next;
      }
    };
    fill();
    std::vector<size_t> batch;
    while (pump.pending() > 0) {
      pump.WaitSome().IgnoreError();  // kept in pump.status()
      batch.swap(landed);
      for (const size_t slot : batch) {
        const Read& read = reads[read_of_slot[slot]];
        // The spare slot takes the next read before this one is consumed: the device is never
        // left with fewer reads while the thread copies and checksums.
        fill();
        for (size_t k = read.members_begin; k < read.members_end && pump.status().ok(); ++k) {
          const ReadSpan& span = spans[members[k]];
          pump.Fail(consume(span, slot_data(slot) + (span.offset - read.start)));
        }
        free_slots.push_back(slot);
        fill();
      }
      batch.clear();
    }
    return pump.status();
  }

  uint64_t bytes_read() const { return bytes_read_; }

  Status OpenFile(uint32_t index, RandomAccessFile** out) {
    if (!files_[index]) {
      FileOptions fopt;
      fopt.direct_io = options_.direct_io;
      LL_ASSIGN_OR_RETURN(files_[index], env_->NewRandomAccessFile(FilePath(index), fopt));
    }
    *out = files_[index].get();
    return Status::OK();
  }

  std::string FilePath(uint32_t index) const { return JoinPath(step_dir_, manifest_.files[index].name); }

 private:
  // One aligned read: [start, end) of a file, holding spans members[members_begin, members_end).
  struct Read {
    uint32_t file;
    uint64_t start, end;
    size_t members_begin, members_end;
  };

  Env* env_;
  const std::string& step_dir_;
  const format::CheckpointIndex& manifest_;
  const ReaderOptions& options_;
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
  const bool remote_;  // the files are objects
  uint64_t bytes_read_ = 0;
};

// File offset of every chunk, from its fragment's offset and the stored lengths before it.
std::vector<uint64_t> ChunkOffsets(const format::CheckpointIndex& m) {
  std::vector<uint64_t> offsets(m.chunks.size());
  for (const format::FragmentInfo& f : m.fragments) {
    uint64_t at = f.offset;
    for (uint64_t k = 0; k < f.num_chunks; ++k) {
      offsets[f.first_chunk + k] = at;
      at += m.chunks[f.first_chunk + k].stored_length;
    }
  }
  return offsets;
}

// Which fragment each chunk belongs to.
std::vector<uint32_t> ChunkFragments(const format::CheckpointIndex& m) {
  std::vector<uint32_t> owner(m.chunks.size());
  for (uint32_t i = 0; i < m.fragments.size(); ++i)
    for (uint64_t k = 0; k < m.fragments[i].num_chunks; ++k) owner[m.fragments[i].first_chunk + k] = i;
  return owner;
}

Status ChecksumMismatch(const format::CheckpointIndex& m, const std::string& path, uint32_t fragment,
                        uint64_t chunk, uint64_t offset, uint64_t length) {
  const format::FragmentInfo& f = m.fragments[fragment];
  return Status::Corruption(path, "checksum mismatch in tensor '" + m.tensors[f.tensor].name + "' (chunk " +
                                      std::to_string(chunk - f.first_chunk) + " of fragment " +
                                      std::to_string(fragment) + ", " + RegionString(f.region) +
                                      ") at byte offset " + std::to_string(offset) + ", " +
                                      std::to_string(length) + " bytes");
}

// Raw (decoded) bytes of chunk `chunk` (an index into m.chunks) of fragment `fragment`.
uint64_t ChunkRawBytes(const format::CheckpointIndex& m, uint32_t fragment, uint64_t chunk) {
  const format::FragmentInfo& f = m.fragments[fragment];
  const uint64_t raw = static_cast<uint64_t>(f.region.num_elements()) * DTypeSize(m.tensors[f.tensor].dtype);
  return std::min(m.chunk_bytes, raw - (chunk - f.first_chunk) * m.chunk_bytes);
}

std::string ChunkPlace(const format::CheckpointIndex& m, const std::string& path, uint32_t fragment, uint64_t chunk,
                       uint64_t offset) {
  const format::FragmentInfo& f = m.fragments[fragment];
  return path + " at byte offset " + std::to_string(offset) + ", tensor '" + m.tensors[f.tensor].name + "' (chunk " +
         std::to_string(chunk - f.first_chunk) + " of fragment " + std::to_string(fragment) + ", " +
         RegionString(f.region) + ")";
}

// Decodes the chunks of fragments stored with a codec into one buffer of a chunk's raw size, from
// which they are used like uncompressed chunks. Its memory is taken out of the read budget.
class ChunkDecoder {
 public:
  // Notes that `chunk` will be read; Corruption when its stored length exceeds what its codec can
  // produce from its raw size (the index is damaged; reading it could exhaust memory).
  Status Plan(const format::CheckpointIndex& m, const std::string& path, uint32_t fragment, uint64_t chunk,
              uint64_t offset) {
    const format::FragmentInfo& f = m.fragments[fragment];
    if (f.codec == format::Codec::kNone) return Status::OK();
    const uint64_t raw = ChunkRawBytes(m, fragment, chunk);
    const uint64_t stored = m.chunks[chunk].stored_length;
    if (stored > format::ChunkCodec::MaxEncodedSize(f.codec, raw))
      return Status::Corruption(ChunkPlace(m, path, fragment, chunk, offset),
                                "stored length " + std::to_string(stored) + " exceeds the largest encoding of " +
                                    std::to_string(raw) + " raw bytes");
    max_raw_ = std::max(max_raw_, raw);
    if (f.codec == format::Codec::kZstdByteGroup && DTypeSize(m.tensors[f.tensor].dtype) > 1) grouped_ = true;
    return Status::OK();
  }

  // Bytes of memory decoding the planned chunks takes: the decoded chunk, and for byte grouping
  // the codec's buffer of the still-grouped bytes.
  uint64_t footprint() const { return max_raw_ * (grouped_ ? 2 : 1); }

  // The raw bytes of a chunk whose stored bytes (checksum already verified) are `data`: `data`
  // itself without a codec, else the decoded bytes, valid until the next call.
  Result<const uint8_t*> Raw(const format::CheckpointIndex& m, const std::string& path, uint32_t fragment,
                             uint64_t chunk, uint64_t offset, const uint8_t* data) {
    const format::FragmentInfo& f = m.fragments[fragment];
    if (f.codec == format::Codec::kNone) return data;
    if (buffer_.data() == nullptr) {
      buffer_ = AlignedBuffer(max_raw_);
      if (buffer_.data() == nullptr)
        return Status::ResourceExhausted(path, "cannot allocate " + std::to_string(max_raw_) + " bytes to decode chunks");
    }
    const uint64_t raw = ChunkRawBytes(m, fragment, chunk);
    LL_RETURN_IF_ERROR(codec_.Decode(f.codec, DTypeSize(m.tensors[f.tensor].dtype), data,
                                     m.chunks[chunk].stored_length, buffer_.data(), raw,
                                     ChunkPlace(m, path, fragment, chunk, offset)));
    return static_cast<const uint8_t*>(buffer_.data());
  }

 private:
  uint64_t max_raw_ = 0;
  bool grouped_ = false;
  format::ChunkCodec codec_;
  AlignedBuffer buffer_;
};

// The options with the decoder's memory taken out of the read staging budget.
ReaderOptions AfterDecoding(ReaderOptions options, const ChunkDecoder& decoder) {
  options.memory_budget -= std::min(options.memory_budget, decoder.footprint());
  return options;
}

}  // namespace

CheckpointReader::CheckpointReader(Env* env, std::string step_dir, format::CheckpointIndex manifest,
                                   ReaderOptions options)
    : env_(env), step_dir_(std::move(step_dir)), manifest_(std::move(manifest)), options_(options) {}

CheckpointReader::~CheckpointReader() = default;

Result<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(Env* env, const std::string& root,
                                                                 std::optional<uint64_t> step,
                                                                 const ReaderOptions& options) {
  std::string dir;
  if (step.has_value()) {
    dir = JoinPath(root, StepDirName(*step));
    if (!env->IsDirectory(dir)) return Status::NotFound(root, "no checkpoint of step " + std::to_string(*step));
  } else {
    LL_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ScanCheckpoints(env, root));
    for (const CheckpointInfo& info : all) {
      if (info.complete) {
        dir = info.directory;
        step = info.step;
        break;
      }
    }
    if (dir.empty()) return Status::NotFound(root, "no complete checkpoint");
  }
  LL_ASSIGN_OR_RETURN(StepState state, ScanStep(env, dir, *step));
  if (!state.info.complete)
    return Status::NotFound(dir, "checkpoint of step " + std::to_string(*step) + " is not complete: " + state.info.problem);
  if (options.manifest_in_parts) {
    LL_ASSIGN_OR_RETURN(ManifestParts parts, OpenManifestParts(env, state));
    if (parts.parts != nullptr) {
      std::unique_ptr<CheckpointReader> reader(new CheckpointReader(env, dir, std::move(parts.head), options));
      reader->parts_ = std::move(parts.parts);
      return reader;
    }
  }
  LL_ASSIGN_OR_RETURN(format::CheckpointIndex manifest, ReadManifest(env, state));
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(env, dir, std::move(manifest), options));
}

uint64_t CheckpointReader::manifest_bytes_read() const { return parts_ == nullptr ? 0 : parts_->bytes_read(); }

Status CheckpointReader::FetchFragments(const std::vector<format::ManifestPartReader::TensorBox>* wanted) {
  if (parts_ == nullptr) return Status::OK();
  Status added = wanted != nullptr ? parts_->AddFragments(*wanted, &manifest_) : parts_->AddAllFragments(&manifest_);
  if (added.ok()) return added;
  // A damaged part: the rank indexes are the commit record, the manifest only their merge.
  parts_.reset();
  prefetched_objects_.clear();
  if (!added.IsCorruption()) return added;
  Result<format::CheckpointIndex> merged =
      MergeRankIndexes(env_, step_dir_, RunHash(manifest_.run_id), manifest_.world_size, manifest_.step);
  if (!merged.ok()) return added;
  Log(LogLevel::kWarning, "ignoring the manifest, merged the rank indexes instead: " + added.ToString());
  manifest_ = std::move(*merged);
  return Status::OK();
}

Result<LoadStats> CheckpointReader::Load(const std::vector<TensorShard>& targets) {
  const format::CheckpointIndex& m = manifest_;
  std::unordered_map<std::string_view, uint32_t> tensor_by_name;
  auto index_names = [&] {
    tensor_by_name.clear();
    tensor_by_name.reserve(m.tensors.size());
    for (uint32_t i = 0; i < m.tensors.size(); ++i) tensor_by_name.emplace(m.tensors[i].name, i);
  };
  index_names();
  if (parts_ != nullptr) {
    // The fragments that meet the targets' boxes (a flat range's box is the whole box it lies in).
    std::vector<format::ManifestPartReader::TensorBox> wanted;
    for (const TensorShard& t : targets)
      if (auto it = tensor_by_name.find(t.name); it != tensor_by_name.end() && t.offsets.size() == t.shape.size())
        wanted.push_back({it->second, format::Box{t.offsets, t.shape}});
    LL_RETURN_IF_ERROR(FetchFragments(&wanted));
    index_names();  // the fallback to the rank indexes replaces the manifest
  }

  // Targets checked against what is stored; then the plan (lifeline/internal/load_plan.h).
  std::vector<format::Region> target_regions(targets.size());
  std::vector<LoadTarget> planned(targets.size());
  for (uint32_t i = 0; i < targets.size(); ++i) {
    const TensorShard& t = targets[i];
    auto it = tensor_by_name.find(t.name);
    if (it == tensor_by_name.end())
      return Status::NotInCheckpoint(step_dir_, "tensor '" + t.name + "' is not in the checkpoint of step " + std::to_string(m.step));
    const format::TensorInfo& info = m.tensors[it->second];
    if (info.dtype != t.dtype || info.shape != t.global_shape)
      return Status::InvalidArgument("tensor '" + t.name + "'", "target is " + std::string(DTypeName(t.dtype)) + " " +
                                                                     ShapeString(t.global_shape) + " but the checkpoint holds " +
                                                                     std::string(DTypeName(info.dtype)) + " " + ShapeString(info.shape));
    target_regions[i] = format::Region{t.offsets, t.shape, t.flat_begin, t.flat_end};
    LL_RETURN_IF_ERROR(format::ValidateRegion(target_regions[i], info.shape, "target of tensor '" + t.name + "'", false));
    if (target_regions[i].num_elements() > 0 && t.data == nullptr)
      return Status::InvalidArgument("tensor '" + t.name + "'", "target data is null");
    planned[i] = LoadTarget{it->second, target_regions[i]};
  }
  using Copy = PlannedCopy;
  LL_ASSIGN_OR_RETURN(const std::vector<Copy> copies, PlanLoad(m, planned, step_dir_));

  // One read per chunk that feeds a copy, in file order.
  const std::vector<uint64_t> chunk_offset = ChunkOffsets(m);
  const std::vector<uint32_t> chunk_fragment = ChunkFragments(m);
  std::vector<ReadSpan> spans;
  std::vector<size_t> first_copy;  // per span: its range in `copies`
  ChunkDecoder decoder;
  for (size_t i = 0; i < copies.size();) {
    const uint64_t c = copies[i].chunk;
    const uint32_t file = m.fragments[chunk_fragment[c]].file;
    LL_RETURN_IF_ERROR(decoder.Plan(m, JoinPath(step_dir_, m.files[file].name), chunk_fragment[c], c, chunk_offset[c]));
    spans.push_back(ReadSpan{file, chunk_offset[c], m.chunks[c].stored_length, spans.size()});
    first_copy.push_back(i);
    while (i < copies.size() && copies[i].chunk == c) ++i;
  }
  first_copy.push_back(copies.size());
  std::vector<ReadSpan> ordered = spans;
  auto file_order = [](const ReadSpan& a, const ReadSpan& b) {
    return a.file != b.file ? a.file < b.file : a.offset < b.offset;
  };
  std::sort(ordered.begin(), ordered.end(), file_order);
  // Small objects stored next to the chunks read (a rank's objects follow its chunks in its file)
  // join their reads, so that ReadObject right after the load costs no I/O of its own.
  prefetched_objects_.clear();
  const uint64_t first_object_tag = spans.size();
  {
    std::vector<bool> file_read(m.files.size(), false);
    for (const ReadSpan& s : ordered) file_read[s.file] = true;
    std::vector<ReadSpan> candidates;
    for (uint64_t o = 0; o < m.objects.size(); ++o) {
      const format::ObjectInfo& obj = m.objects[o];
      if (obj.length > 0 && obj.length <= kPrefetchObjectBytes && file_read[obj.file])
        candidates.push_back(ReadSpan{obj.file, obj.offset, obj.length, first_object_tag + o});
    }
    if (!candidates.empty()) {
      std::vector<ReadSpan> all = ordered;
      all.insert(all.end(), candidates.begin(), candidates.end());
      std::stable_sort(all.begin(), all.end(), file_order);
      // An object is kept when no whole 4096-byte block separates it from a span kept before or
      // after it in its file: reading it then only widens a read the load makes anyway.
      std::vector<bool> keep(all.size());
      for (size_t i = 0; i < all.size(); ++i) keep[i] = all[i].tag < first_object_tag;
      auto touching = [](const ReadSpan& a, const ReadSpan& b) {  // a before b
        return a.file == b.file &&
               AlignDown(b.offset, kDirectIoAlignment) <= AlignUp(a.offset + a.length, kDirectIoAlignment);
      };
      for (size_t i = 1; i < all.size(); ++i)
        if (!keep[i] && keep[i - 1] && touching(all[i - 1], all[i])) keep[i] = true;
      for (size_t i = all.size() - 1; i-- > 0;)
        if (!keep[i] && keep[i + 1] && touching(all[i], all[i + 1])) keep[i] = true;
      ordered.clear();
      for (size_t i = 0; i < all.size(); ++i)
        if (keep[i]) ordered.push_back(all[i]);
    }
  }

  // A chunk stored raw that lands whole in one contiguous stretch of one target (every chunk of a
  // load into the saving layout) is copied and checksummed in one pass over memory.
  std::vector<uint8_t*> whole_destination(spans.size(), nullptr);
  for (size_t i = 0; i < spans.size(); ++i) {
    if (first_copy[i + 1] - first_copy[i] != 1) continue;
    const Copy& cp = copies[first_copy[i]];
    const format::FragmentInfo& frag = m.fragments[chunk_fragment[cp.chunk]];
    if (frag.codec != format::Codec::kNone) continue;
    const size_t elem = DTypeSize(m.tensors[frag.tensor].dtype);
    const int64_t volume = cp.box.volume();
    if (static_cast<uint64_t>(volume) * elem != m.chunks[cp.chunk].stored_length) continue;
    const format::Region& dst = target_regions[cp.target];
    std::vector<int64_t> last(cp.box.lo.size());
    for (size_t d = 0; d < last.size(); ++d) last[d] = cp.box.lo[d] + cp.box.extent[d] - 1;
    // The box fills the whole chunk, so it is contiguous in the source; in the target it is when
    // its first and last elements are volume - 1 apart.
    const int64_t first_at = format::PackedOffsetOf(dst, cp.box.lo.data());
    if (format::PackedOffsetOf(dst, last.data()) - first_at + 1 != volume) continue;
    whole_destination[i] = static_cast<uint8_t*>(targets[cp.target].data) + first_at * static_cast<int64_t>(elem);
  }

  LoadStats stats;
  const ReaderOptions staging = AfterDecoding(options_, decoder);
  SpanReader reader(env_, step_dir_, m, staging);
  Status s = reader.Run(ordered, [&](const ReadSpan& span, const uint8_t* stored) -> Status {
    if (span.tag >= first_object_tag) {
      // Damage is reported by the ReadObject that asks for it, not by this load.
      const uint64_t o = span.tag - first_object_tag;
      if (format::Checksum64(stored, span.length) == m.objects[o].checksum)
        prefetched_objects_.emplace(o, std::string(reinterpret_cast<const char*>(stored), span.length));
      return Status::OK();
    }
    const uint64_t c = copies[first_copy[span.tag]].chunk;
    if (uint8_t* dst = whole_destination[span.tag]; dst != nullptr) {
      if (CopyAndHash(dst, stored, span.length) != m.chunks[c].checksum)
        return ChecksumMismatch(m, reader.FilePath(span.file), chunk_fragment[c], c, span.offset, span.length);
      stats.bytes_scattered += span.length;
      ++stats.chunks_read;
      return Status::OK();
    }
    if (format::Checksum64(stored, span.length) != m.chunks[c].checksum)
      return ChecksumMismatch(m, reader.FilePath(span.file), chunk_fragment[c], c, span.offset, span.length);
    LL_ASSIGN_OR_RETURN(const uint8_t* data,
                        decoder.Raw(m, reader.FilePath(span.file), chunk_fragment[c], c, span.offset, stored));
    const format::FragmentInfo& frag = m.fragments[chunk_fragment[c]];
    const size_t elem = DTypeSize(m.tensors[frag.tensor].dtype);
    const uint64_t elems_per_chunk = m.chunk_bytes / elem;
    const format::Region src = ChunkRegion(frag, c - frag.first_chunk, elems_per_chunk);
    for (size_t i = first_copy[span.tag]; i < first_copy[span.tag + 1]; ++i) {
      const Copy& cp = copies[i];
      format::CopyBox(cp.box, elem, data, src, targets[cp.target].data, target_regions[cp.target]);
      stats.bytes_scattered += static_cast<uint64_t>(cp.box.volume()) * elem;
    }
    ++stats.chunks_read;
    return Status::OK();
  });
  if (!s.ok()) return s.Annotate("loading step " + std::to_string(m.step));
  stats.bytes_read = reader.bytes_read();
  return stats;
}

namespace {

std::string Hex64(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof(buf), "0x%016" PRIx64, v);
  return buf;
}

// The first difference between record lists, or "" when they are equal.
template <typename T, typename Describe>
std::string FirstRecordDifference(const char* what, const std::vector<T>& manifest, const std::vector<T>& merged,
                                  Describe describe) {
  if (manifest.size() != merged.size())
    return std::to_string(manifest.size()) + " " + what + " records, the rank indexes " + std::to_string(merged.size());
  for (size_t i = 0; i < manifest.size(); ++i)
    if (!(manifest[i] == merged[i]))
      return std::string(what) + " record " + std::to_string(i) + " is " + describe(manifest[i]) +
             ", the rank indexes say " + describe(merged[i]);
  return "";
}

// What the manifest says differently from the merge of the rank indexes, or "" when they agree.
std::string ManifestDifference(const format::CheckpointIndex& a, const format::CheckpointIndex& b) {
  auto field = [](const char* name, const auto& x, const auto& y) -> std::string {
    if (x == y) return "";
    if constexpr (std::is_convertible_v<decltype(x), std::string_view>) {
      return std::string(name) + " is '" + std::string(x) + "', the rank indexes say '" + std::string(y) + "'";
    } else {
      return std::string(name) + " is " + std::to_string(x) + ", the rank indexes say " + std::to_string(y);
    }
  };
  for (std::string d : {field("kind", static_cast<int>(a.kind), static_cast<int>(b.kind)), field("step", a.step, b.step),
                        field("rank", a.rank, b.rank), field("world size", a.world_size, b.world_size),
                        field("run id", a.run_id, b.run_id), field("chunk bytes", a.chunk_bytes, b.chunk_bytes),
                        field("creation time", a.created_unix_ns, b.created_unix_ns),
                        field("user metadata", a.metadata_json, b.metadata_json)})
    if (!d.empty()) return d;
  std::string d = FirstRecordDifference("file", a.files, b.files, [](const format::FileInfo& f) {
    return "'" + f.name + "' of rank " + std::to_string(f.rank) + ", " + std::to_string(f.size) + " bytes";
  });
  if (d.empty())
    d = FirstRecordDifference("tensor", a.tensors, b.tensors, [](const format::TensorInfo& t) {
      return "'" + t.name + "' " + std::string(DTypeName(t.dtype)) + " " + ShapeString(t.shape);
    });
  if (d.empty())
    d = FirstRecordDifference("fragment", a.fragments, b.fragments, [](const format::FragmentInfo& f) {
      return "tensor #" + std::to_string(f.tensor) + " " + RegionString(f.region) + " in file #" + std::to_string(f.file) +
             " at offset " + std::to_string(f.offset) + ", chunks [" + std::to_string(f.first_chunk) + ", +" +
             std::to_string(f.num_chunks) + "), codec " + std::to_string(static_cast<int>(f.codec));
    });
  if (d.empty())
    d = FirstRecordDifference("chunk", a.chunks, b.chunks, [](const format::ChunkInfo& c) {
      return std::to_string(c.stored_length) + " bytes with checksum " + Hex64(c.checksum);
    });
  if (d.empty())
    d = FirstRecordDifference("object", a.objects, b.objects, [](const format::ObjectInfo& o) {
      return "'" + o.name + "' of rank " + std::to_string(o.rank) + " in file #" + std::to_string(o.file) + " at offset " +
             std::to_string(o.offset) + ", " + std::to_string(o.length) + " bytes with checksum " + Hex64(o.checksum);
    });
  return d;
}

// Decodes every rank index of the checkpoint `m` describes and its manifest when there is one,
// and checks that the manifest is exactly their merge: a load may fall back from a damaged
// manifest, but a checkpoint with any damaged index is not intact.
Status VerifyIndexes(Env* env, const std::string& step_dir, const format::CheckpointIndex& m, uint64_t* checked) {
  const std::string run_hash = RunHash(m.run_id);
  LL_ASSIGN_OR_RETURN(format::CheckpointIndex merged, MergeRankIndexes(env, step_dir, run_hash, m.world_size, m.step));
  *checked = m.world_size;
  const std::string path = JoinPath(step_dir, ManifestFileName(run_hash, m.world_size));
  Result<std::string> bytes = ReadFileToString(env, path, format::kMaxIndexBytes);
  if (bytes.status().IsNotFound()) {
    // Absent: a crash between the last rank index and the manifest. The indexes are the commit
    // record, so nothing is lost, but what `m` holds must be their merge.
    if (!(m == merged)) return Status::Corruption(step_dir, "the checkpoint read differs from the merge of its rank indexes");
    return Status::OK();
  }
  if (bytes.status().code() == StatusCode::kResourceExhausted) return Status::Corruption(bytes.status().message());
  if (!bytes.ok()) return bytes.status();
  LL_ASSIGN_OR_RETURN(format::CheckpointIndex manifest, format::DecodeIndex(*bytes, path));
  ++*checked;
  if (manifest.kind != format::IndexKind::kManifest)
    return Status::Corruption(path, "is a rank index, not a manifest");
  const std::string difference = ManifestDifference(manifest, merged);
  if (!difference.empty())
    return Status::Corruption(path, "the manifest disagrees with the rank indexes: its " + difference);
  return Status::OK();
}

// Each data file is exactly its header, then its fragments' chunks and its objects back to back,
// zero-padded to a multiple of 4096 bytes (formats/SPEC.md §3). Returns, per file, where the
// bytes described by the index end (the padding runs from there to the file's recorded size).
Result<std::vector<uint64_t>> DataFileContentEnds(const format::CheckpointIndex& m, const std::string& step_dir) {
  struct Extent {
    uint64_t offset, length;
    std::string what;
  };
  std::vector<std::vector<Extent>> extents(m.files.size());
  for (uint32_t i = 0; i < m.fragments.size(); ++i) {
    const format::FragmentInfo& f = m.fragments[i];
    uint64_t length = 0;
    for (uint64_t k = 0; k < f.num_chunks; ++k) length += m.chunks[f.first_chunk + k].stored_length;
    extents[f.file].push_back(Extent{f.offset, length, "fragment " + std::to_string(i) + " of tensor '" +
                                                            m.tensors[f.tensor].name + "'"});
  }
  for (const format::ObjectInfo& o : m.objects)
    extents[o.file].push_back(Extent{o.offset, o.length, "object '" + o.name + "' of rank " + std::to_string(o.rank)});
  std::vector<uint64_t> ends(m.files.size());
  for (uint32_t i = 0; i < m.files.size(); ++i) {
    const std::string path = JoinPath(step_dir, m.files[i].name);
    std::vector<Extent>& e = extents[i];
    std::stable_sort(e.begin(), e.end(), [](const Extent& a, const Extent& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.length < b.length;
    });
    uint64_t at = kDataHeaderBytes;
    for (const Extent& x : e) {
      if (x.offset > at)
        return Status::Corruption(path, "bytes " + std::to_string(at) + " to " + std::to_string(x.offset) +
                                            " belong to no fragment or object (the index is damaged)");
      if (x.offset < at)
        return Status::Corruption(path, x.what + " at byte offset " + std::to_string(x.offset) +
                                            " overlaps the bytes before it, which end at " + std::to_string(at));
      at += x.length;
    }
    if (m.files[i].size != AlignUp(at, kDirectIoAlignment))
      return Status::Corruption(path, "the index gives its size as " + std::to_string(m.files[i].size) +
                                          " bytes, but what it holds ends at " + std::to_string(at) +
                                          " (padded: " + std::to_string(AlignUp(at, kDirectIoAlignment)) + ")");
    ends[i] = at;
  }
  return ends;
}

}  // namespace

Status CheckpointReader::Verify(VerifyReport* report) {
  // Every fragment, whatever was loaded; the manifest file itself is then decoded whole below.
  LL_RETURN_IF_ERROR(FetchFragments(nullptr));
  const format::CheckpointIndex& m = manifest_;
  VerifyReport local;
  Status indexes = VerifyIndexes(env_, step_dir_, m, &local.indexes_checked);
  if (!indexes.ok()) {
    if (report != nullptr) *report = local;
    return indexes;
  }
  LL_ASSIGN_OR_RETURN(const std::vector<uint64_t> content_end, DataFileContentEnds(m, step_dir_));
  const std::vector<uint64_t> chunk_offset = ChunkOffsets(m);
  const std::vector<uint32_t> chunk_fragment = ChunkFragments(m);
  ChunkDecoder decoder;
  for (uint64_t c = 0; c < m.chunks.size(); ++c) {
    const uint32_t file = m.fragments[chunk_fragment[c]].file;
    LL_RETURN_IF_ERROR(decoder.Plan(m, JoinPath(step_dir_, m.files[file].name), chunk_fragment[c], c, chunk_offset[c]));
  }
  const ReaderOptions staging = AfterDecoding(options_, decoder);
  SpanReader reader(env_, step_dir_, m, staging);
  // Data files first: each header says which rank, step and attempt wrote the file, and every
  // byte outside the chunks and objects (header, final padding) is checked here, as is the size.
  const std::string run_hash = RunHash(m.run_id);
  AlignedBuffer block(kDataHeaderBytes);
  if (block.data() == nullptr) return Status::ResourceExhausted("cannot allocate a header buffer");
  for (uint32_t i = 0; i < m.files.size(); ++i) {
    RandomAccessFile* file = nullptr;
    LL_RETURN_IF_ERROR(reader.OpenFile(i, &file));
    LL_ASSIGN_OR_RETURN(const uint64_t size, file->Size());
    if (size != m.files[i].size)
      return Status::Corruption(file->path(), "is " + std::to_string(size) + " bytes, but its index says " +
                                                  std::to_string(m.files[i].size));
    LL_RETURN_IF_ERROR(file->ReadAt(0, block.data(), kDataHeaderBytes));
    LL_RETURN_IF_ERROR(CheckDataHeader(block.data(), m.files[i].rank, m.world_size, m.step, run_hash, file->path()));
    local.bytes_checked += kDataHeaderBytes;
    const uint64_t end = content_end[i];
    if (end % kDirectIoAlignment != 0) {
      const uint64_t start = AlignDown(end, kDirectIoAlignment);
      LL_RETURN_IF_ERROR(file->ReadAt(start, block.data(), kDirectIoAlignment));
      for (uint64_t at = end; at < start + kDirectIoAlignment; ++at)
        if (block.data()[at - start] != 0)
          return Status::Corruption(file->path(), "nonzero byte at offset " + std::to_string(at) +
                                                      " in the padding after the last chunk or object (must be zero)");
      local.bytes_checked += start + kDirectIoAlignment - end;
    }
  }
  std::vector<ReadSpan> spans;
  spans.reserve(m.chunks.size() + m.objects.size());
  for (uint64_t c = 0; c < m.chunks.size(); ++c)
    spans.push_back(ReadSpan{m.fragments[chunk_fragment[c]].file, chunk_offset[c], m.chunks[c].stored_length, c});
  for (uint64_t o = 0; o < m.objects.size(); ++o)
    spans.push_back(ReadSpan{m.objects[o].file, m.objects[o].offset, m.objects[o].length, m.chunks.size() + o});
  std::sort(spans.begin(), spans.end(),
            [](const ReadSpan& a, const ReadSpan& b) { return a.file != b.file ? a.file < b.file : a.offset < b.offset; });
  Status s = reader.Run(spans, [&](const ReadSpan& span, const uint8_t* data) -> Status {
    const uint64_t sum = format::Checksum64(data, span.length);
    local.bytes_checked += span.length;
    if (span.tag < m.chunks.size()) {
      if (sum != m.chunks[span.tag].checksum)
        return ChecksumMismatch(m, reader.FilePath(span.file), chunk_fragment[span.tag], span.tag, span.offset, span.length);
      // A frame that does not decode to its chunk's length would fail every load of it.
      LL_RETURN_IF_ERROR(
          decoder.Raw(m, reader.FilePath(span.file), chunk_fragment[span.tag], span.tag, span.offset, data).status());
      ++local.chunks_checked;
    } else {
      const format::ObjectInfo& obj = m.objects[span.tag - m.chunks.size()];
      if (sum != obj.checksum)
        return Status::Corruption(reader.FilePath(span.file), "checksum mismatch in object '" + obj.name + "' of rank " +
                                                                   std::to_string(obj.rank) + " at byte offset " +
                                                                   std::to_string(span.offset));
      ++local.objects_checked;
    }
    return Status::OK();
  });
  if (report != nullptr) *report = local;
  return s;
}

Result<std::string> CheckpointReader::ReadObject(const format::ObjectInfo& object) {
  if (&object >= manifest_.objects.data() && &object < manifest_.objects.data() + manifest_.objects.size()) {
    auto it = prefetched_objects_.find(static_cast<uint64_t>(&object - manifest_.objects.data()));
    if (it != prefetched_objects_.end()) {
      std::string bytes = std::move(it->second);
      prefetched_objects_.erase(it);
      return bytes;
    }
  }
  std::string out;
  SpanReader reader(env_, step_dir_, manifest_, options_);
  std::vector<ReadSpan> spans{ReadSpan{object.file, object.offset, object.length, 0}};
  LL_RETURN_IF_ERROR(reader.Run(spans, [&](const ReadSpan& span, const uint8_t* data) -> Status {
    if (format::Checksum64(data, span.length) != object.checksum)
      return Status::Corruption(reader.FilePath(span.file), "checksum mismatch in object '" + object.name + "' of rank " +
                                                                 std::to_string(object.rank) + " at byte offset " +
                                                                 std::to_string(span.offset));
    out.assign(reinterpret_cast<const char*>(data), span.length);
    return Status::OK();
  }));
  return out;
}

}  // namespace lifeline
