#include "lib/src/save/rank_data.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "formats/checksum.h"
#include "formats/codec.h"
#include "lib/src/env/aligned_buffer.h"
#include "lifeline/internal/io_pump.h"
#include "lib/src/store/checkpoint_layout.h"

namespace lifeline {
namespace {

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

format::CheckpointIndex IndexSkeleton(const RankSavePlan* plan, const std::string& metadata_json,
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
  if (plan != nullptr) index.tensors = plan->tensors;
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

format::CheckpointIndex RawImageIndexOfReusedPlan(const std::vector<format::ChunkInfo>& chunks,
                                                  const std::vector<std::pair<std::string, std::string>>& objects,
                                                  const std::string& metadata_json, const ImageLayout& layout,
                                                  const RankWriteOptions& o) {
  format::CheckpointIndex index = IndexSkeleton(nullptr, metadata_json, o);
  index.chunks = chunks;
  AddRawObjects(objects, layout, o, &index);
  return index;
}

format::CheckpointIndex RawImageIndex(const RankSavePlan& plan, const std::vector<std::pair<std::string, std::string>>& objects,
                                      const std::string& metadata_json, const ImageLayout& layout,
                                      const RankWriteOptions& o) {
  format::CheckpointIndex index = IndexSkeleton(&plan, metadata_json, o);
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
  format::CheckpointIndex index = IndexSkeleton(&plan, metadata_json, o);
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
    file.reset();  // unclosed: an object store aborts the upload rather than publish what was written
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
