#include "lib/src/saver.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "formats/checksum.h"
#include "formats/codec.h"
#include "formats/geometry.h"
#include "lib/src/aligned_buffer.h"
#include "lib/src/checkpoint_layout.h"
#include "lib/src/env/io_pump.h"

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

// Streams bytes into aligned blocks and writes each full block at the next file offset through an
// IoQueue, keeping up to `blocks` writes in flight. Bytes are hashed where they land, while hot.
class BlockStreamWriter {
 public:
  BlockStreamWriter(WritableFile* file, IoQueue* queue, size_t block_bytes, size_t blocks)
      : file_(file), block_bytes_(block_bytes), buffers_(MakeBuffers(block_bytes, blocks)),
        pump_(queue, [this](const IoCompletion& c) { free_.push_back(static_cast<size_t>(c.tag)); }) {
    for (size_t i = 0; i < blocks; ++i) free_.push_back(i);
  }

  Status Init() {
    for (const AlignedBuffer& b : buffers_)
      if (b.data() == nullptr)
        return Status::ResourceExhausted(file_->path(), "cannot allocate write staging buffers");
    return AcquireBlock();
  }

  uint64_t position() const { return flushed_ + fill_; }

  Status Append(const uint8_t* src, size_t n, format::StreamingChecksum* hasher) {
    while (n > 0) {
      const size_t take = std::min(n, block_bytes_ - fill_);
      uint8_t* dst = buffers_[current_].data() + fill_;
      std::memcpy(dst, src, take);
      if (hasher != nullptr) hasher->Update(dst, take);
      fill_ += take;
      src += take;
      n -= take;
      if (fill_ == block_bytes_) {
        LL_RETURN_IF_ERROR(SubmitCurrent(block_bytes_));
        LL_RETURN_IF_ERROR(AcquireBlock());
      }
    }
    return Status::OK();
  }

  // Writes the partial last block, zero-padded to the direct-I/O alignment, and waits for every
  // write. *file_size receives the padded length.
  Status Finish(uint64_t* file_size) {
    if (fill_ > 0) {
      const size_t padded = AlignUp(fill_, kDirectIoAlignment);
      std::memset(buffers_[current_].data() + fill_, 0, padded - fill_);
      LL_RETURN_IF_ERROR(SubmitCurrent(padded));
    } else {
      free_.push_back(current_);
    }
    LL_RETURN_IF_ERROR(Drain());
    *file_size = flushed_;
    return Status::OK();
  }

  // Waits for every write in flight, failed or not (used on the error path so that no buffer is
  // freed while the kernel or an I/O thread still reads it).
  Status Drain() { return pump_.Drain(); }
  // The queue failed as a whole (IoPump::broken): destroy it before the writer.
  bool broken() const { return pump_.broken(); }

 private:
  static std::vector<AlignedBuffer> MakeBuffers(size_t block_bytes, size_t blocks) {
    std::vector<AlignedBuffer> buffers;
    for (size_t i = 0; i < blocks; ++i) buffers.emplace_back(block_bytes);
    return buffers;
  }

  Status SubmitCurrent(size_t length) {
    IoRequest req;
    req.kind = IoRequest::Kind::kWrite;
    req.writer = file_;
    req.offset = flushed_;
    req.buffer = buffers_[current_].data();
    req.length = length;
    req.tag = current_;
    LL_RETURN_IF_ERROR(pump_.Submit(req));
    flushed_ += length;
    fill_ = 0;
    return Status::OK();
  }

  Status AcquireBlock() {
    while (free_.empty()) LL_RETURN_IF_ERROR(pump_.WaitSome());
    current_ = free_.back();
    free_.pop_back();
    fill_ = 0;
    return Status::OK();
  }

  WritableFile* file_;
  const size_t block_bytes_;
  std::vector<AlignedBuffer> buffers_;
  std::vector<size_t> free_;
  IoPump pump_;  // after the buffers: destroyed first, draining what still reads them
  size_t current_ = 0;
  size_t fill_ = 0;       // bytes in the current block
  uint64_t flushed_ = 0;  // bytes submitted (file offset of the current block)
};

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

namespace {

format::CheckpointIndex IndexSkeleton(const RankSavePlan& plan, const std::string& metadata_json,
                                      const RankWriteOptions& o) {
  format::CheckpointIndex index;
  index.kind = format::IndexKind::kRankIndex;
  index.step = o.step;
  index.rank = o.rank;
  index.world_size = o.world_size;
  index.run_id = o.run_id;
  index.chunk_bytes = o.chunk_bytes;
  index.created_unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  index.tensors = plan.tensors;
  index.metadata_json = o.rank == 0 ? metadata_json : std::string();
  return index;
}

uint64_t RawBytes(const RankSavePlan& plan, const PlannedFragment& pf) {
  return static_cast<uint64_t>(pf.region.num_elements()) * DTypeSize(plan.tensors[pf.tensor].dtype);
}

}  // namespace

ImageLayout LayoutImage(const RankSavePlan& plan, const std::vector<std::pair<std::string, std::string>>& objects) {
  ImageLayout layout;
  uint64_t at = kDataHeaderBytes;
  layout.fragment_offset.reserve(plan.fragments.size());
  for (const PlannedFragment& pf : plan.fragments) {
    layout.fragment_offset.push_back(at);
    at += RawBytes(plan, pf);
  }
  layout.bytes = at;
  LayoutObjects(objects, &layout);
  return layout;
}

void LayoutObjects(const std::vector<std::pair<std::string, std::string>>& objects, ImageLayout* layout) {
  layout->object_offset.clear();
  layout->object_offset.reserve(objects.size());
  for (const auto& object : objects) {
    layout->object_offset.push_back(layout->bytes);
    layout->bytes += object.second.size();
  }
}

namespace {

// RawImageIndex's part after the fragments: the objects and the data file.
void AddRawObjects(const std::vector<std::pair<std::string, std::string>>& objects, const ImageLayout& layout,
                   const RankWriteOptions& o, format::CheckpointIndex* index) {
  index->objects.reserve(objects.size());
  for (size_t i = 0; i < objects.size(); ++i) {
    format::ObjectInfo obj;
    obj.name = objects[i].first;
    obj.rank = o.rank;
    obj.file = 0;
    obj.offset = layout.object_offset[i];
    obj.length = objects[i].second.size();
    index->objects.push_back(std::move(obj));
  }
  const std::string name = DataFileName(o.run_hash, o.rank, o.world_size);
  index->files.push_back(format::FileInfo{name, o.rank, AlignUp(layout.bytes, kDirectIoAlignment)});
}

}  // namespace

format::CheckpointIndex RawImageIndex(const RankSavePlan& plan, const std::vector<format::FragmentInfo>& fragments,
                                      const std::vector<format::ChunkInfo>& chunks,
                                      const std::vector<std::pair<std::string, std::string>>& objects,
                                      const std::string& metadata_json, const ImageLayout& layout,
                                      const RankWriteOptions& o) {
  format::CheckpointIndex index = IndexSkeleton(plan, metadata_json, o);
  index.fragments = fragments;
  index.chunks = chunks;
  AddRawObjects(objects, layout, o, &index);
  return index;
}

format::CheckpointIndex RawImageIndex(const RankSavePlan& plan, const std::vector<std::pair<std::string, std::string>>& objects,
                                      const std::string& metadata_json, const ImageLayout& layout,
                                      const RankWriteOptions& o) {
  format::CheckpointIndex index = IndexSkeleton(plan, metadata_json, o);
  index.fragments.reserve(plan.fragments.size());
  uint64_t num_chunks = 0;
  for (const PlannedFragment& pf : plan.fragments) num_chunks += (RawBytes(plan, pf) + o.chunk_bytes - 1) / o.chunk_bytes;
  index.chunks.reserve(num_chunks);
  for (size_t i = 0; i < plan.fragments.size(); ++i) {
    const PlannedFragment& pf = plan.fragments[i];
    format::FragmentInfo f;
    f.tensor = pf.tensor;
    f.region = pf.region;
    f.file = 0;
    f.offset = layout.fragment_offset[i];
    f.codec = format::Codec::kNone;
    f.first_chunk = index.chunks.size();
    const uint64_t raw = RawBytes(plan, pf);
    for (uint64_t done = 0; done < raw; done += o.chunk_bytes)
      index.chunks.push_back(format::ChunkInfo{std::min(o.chunk_bytes, raw - done), 0});
    f.num_chunks = index.chunks.size() - f.first_chunk;
    index.fragments.push_back(std::move(f));
  }
  AddRawObjects(objects, layout, o, &index);
  return index;
}

Result<format::CheckpointIndex> WriteRankData(Env* env, const std::string& step_dir, const RankSavePlan& plan,
                                              const std::vector<std::pair<std::string, std::string>>& objects,
                                              const std::string& metadata_json, const RankWriteOptions& o,
                                              const FragmentReader& reader) {
  if (o.chunk_bytes == 0 || o.chunk_bytes % 8 != 0)
    return Status::InvalidArgument("chunk_bytes must be a positive multiple of 8");
  format::CheckpointIndex index = IndexSkeleton(plan, metadata_json, o);
  const std::string name = DataFileName(o.run_hash, o.rank, o.world_size);
  const std::string path = JoinPath(step_dir, name);
  FileOptions fopt;
  fopt.direct_io = o.direct_io;
  LL_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path, fopt));
  IoQueueOptions qopt;
  qopt.depth = std::max(1u, o.queue_depth);
  LL_ASSIGN_OR_RETURN(std::unique_ptr<IoQueue> queue, env->NewIoQueue(qopt));

  // Blocks: as many as the budget and the queue allow, at least two so copying overlaps writing.
  uint64_t block = std::max<uint64_t>(AlignUp(o.write_block_bytes, kDirectIoAlignment), kDirectIoAlignment);
  if (o.memory_budget < 2 * block) block = std::max<uint64_t>(AlignDown(o.memory_budget / 2, kDirectIoAlignment), kDirectIoAlignment);
  const size_t blocks = std::clamp<uint64_t>(o.memory_budget / block, 2, qopt.depth + 1);
  BlockStreamWriter writer(file.get(), queue.get(), block, blocks);

  auto fail = [&](Status s) -> Status {
    writer.Drain().IgnoreError();
    if (writer.broken()) queue.reset();  // waits for what Drain could not reap, before the writer's buffers go
    file->Close().IgnoreError();
    return s.Annotate("saving step " + std::to_string(o.step) + " on rank " + std::to_string(o.rank) + " to " + path);
  };

  uint64_t total = kDataHeaderBytes;
  for (const PlannedFragment& pf : plan.fragments)
    total += static_cast<uint64_t>(pf.region.num_elements()) * DTypeSize(plan.tensors[pf.tensor].dtype);
  for (const auto& object : objects) total += object.second.size();
  Status s = file->Allocate(AlignUp(total, kDirectIoAlignment));
  if (s.ok()) s = writer.Init();
  if (!s.ok()) return fail(s);
  uint8_t header[kDataHeaderBytes];
  EncodeDataHeader(o.rank, o.world_size, o.step, o.run_hash, header);
  s = writer.Append(header, sizeof(header), nullptr);
  if (!s.ok()) return fail(s);

  format::StreamingChecksum hasher;
  format::ChunkCodec codec;
  // One chunk fetched through `reader` or gathered from a column block.
  const bool gathers = reader != nullptr || std::any_of(plan.fragments.begin(), plan.fragments.end(),
                                                        [](const PlannedFragment& pf) { return pf.strided(); });
  AlignedBuffer fetched(gathers ? o.chunk_bytes : 0);
  if (gathers && fetched.data() == nullptr)
    return fail(Status::ResourceExhausted(path, "cannot allocate a chunk buffer"));
  std::vector<uint8_t> encoded(o.codec == format::Codec::kNone
                                   ? 0
                                   : format::ChunkCodec::MaxEncodedSize(o.codec, o.chunk_bytes));
  index.fragments.reserve(plan.fragments.size());
  for (const PlannedFragment& pf : plan.fragments) {
    const format::TensorInfo& t = plan.tensors[pf.tensor];
    const uint64_t raw = static_cast<uint64_t>(pf.region.num_elements()) * DTypeSize(t.dtype);
    format::FragmentInfo f;
    f.tensor = pf.tensor;
    f.region = pf.region;
    f.file = 0;
    f.offset = writer.position();
    f.codec = o.codec;
    f.first_chunk = index.chunks.size();
    for (uint64_t done = 0; done < raw && s.ok();) {
      const uint64_t n = std::min(o.chunk_bytes, raw - done);
      const uint8_t* src = pf.source != nullptr && !pf.strided() ? pf.source + done : nullptr;
      if (pf.strided()) {
        CopyFragmentBytes(pf, done, n, fetched.data());
        src = fetched.data();
      } else if (src == nullptr) {
        if (reader == nullptr) {
          s = Status::InvalidArgument("tensor '" + t.name + "'", "no bytes to write (null source and no reader)");
          break;
        }
        s = reader(pf, done, n, fetched.data());
        if (!s.ok()) break;
        src = fetched.data();
      }
      hasher.Reset();
      uint64_t stored = n;
      if (o.codec == format::Codec::kNone) {
        s = writer.Append(src, n, &hasher);
      } else {
        Result<size_t> len = codec.Encode(o.codec, DTypeSize(t.dtype), o.codec_level, src, n,
                                          encoded.data(), encoded.size());
        if (!len.ok()) {
          s = len.status().Annotate("tensor '" + t.name + "'");
          break;
        }
        stored = *len;
        s = writer.Append(encoded.data(), stored, &hasher);
      }
      index.chunks.push_back(format::ChunkInfo{stored, hasher.Digest()});
      done += n;
    }
    if (!s.ok()) return fail(s);
    f.num_chunks = index.chunks.size() - f.first_chunk;
    index.fragments.push_back(std::move(f));
  }
  for (const auto& [obj_name, bytes] : objects) {
    format::ObjectInfo obj;
    obj.name = obj_name;
    obj.rank = o.rank;
    obj.file = 0;
    obj.offset = writer.position();
    obj.length = bytes.size();
    obj.checksum = format::Checksum64(bytes);
    s = writer.Append(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), nullptr);
    if (!s.ok()) return fail(s);
    index.objects.push_back(std::move(obj));
  }
  uint64_t file_size = 0;
  s = writer.Finish(&file_size);
  // The reservation was for the raw bytes; a codec stores fewer. Give the rest back, so that the
  // file holds exactly what its index describes and compression saves disk space.
  if (s.ok()) s = file->Truncate(file_size);
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = file->Close();
  if (!s.ok()) return fail(s);
  index.files.push_back(format::FileInfo{name, o.rank, file_size});
  return index;
}

}  // namespace lifeline
