#include "lib/src/save/drainer.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "formats/index_codec.h"
#include "lib/src/env/aligned_buffer.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/save/checkpoint_writer.h"
#include "lib/src/save/commit.h"
#include "lifeline/log.h"

namespace lifeline {
namespace {

// Part uploads in flight when draining into an object store.
constexpr unsigned kObjectDrainLanes = 8;

}  // namespace

Drainer::Drainer(Env* env, DrainConfig config)
    : env_(env), config_(std::move(config)), worker_([this](Item& item) {
        Status s = Drain(item);
        if (s.ok()) {
          drained_.fetch_add(1);
        } else {
          Log(LogLevel::kWarning, s.ToString());
        }
        return s;
      }, config_.nice_levels) {}

Status Drainer::Drain(const Item& item) {
  const std::string where = "draining step " + std::to_string(item.step) + " of rank " + std::to_string(config_.writer.rank) +
                            " to " + config_.writer.root;
  // Only a committed step is worth a copy; wait for the slowest rank, but not past a newer step.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(config_.commit_timeout_seconds);
  for (;;) {
    Status s = WaitForCommitIn(env_, config_.source_root, item.step, 1.0);
    if (s.ok()) break;
    if (s.code() != StatusCode::kAborted) return s.Annotate(where);
    if (worker_.Pending() || std::chrono::steady_clock::now() >= deadline)
      return Status::Unavailable(where, "skipped: the step is not committed (" + s.message() + ")");
  }
  LL_RETURN_IF_ERROR(CreateDirDurably(env_, config_.writer.root).Annotate(where));
  Result<CheckpointWriter> writer = CheckpointWriter::Begin(
      env_, config_.writer.AtStep(item.step));
  if (writer.status().IsAlreadyExists()) return Status::OK();  // drained before (a retried save)
  if (!writer.ok()) return writer.status().Annotate(where);
  const std::string name = DataFileName(config_.writer.run_hash, config_.writer.rank, config_.writer.world_size);
  const std::string from = JoinPath(JoinPath(config_.source_root, StepDirName(item.step)), name);
  // The copy must be exactly the bytes the index describes (formats/SPEC.md §3), as the source is.
  Result<format::CheckpointIndex> index = format::DecodeIndex(item.index, "rank index of " + from);
  if (!index.ok()) return index.status().Annotate(where);
  if (index->files.size() != 1 || index->files[0].name != name)
    return Status::InvalidArgument(where, "the rank index does not describe exactly the data file " + name);
  Status copied = CopyFile(from, writer->data_path(), index->files[0].size);
  if (copied.IsNotFound() && !env_->FileExists(from))
    return Status::Unavailable(where, "skipped: retention removed the step from " + config_.source_root +
                                          " before it was drained (keep more checkpoints there)");
  LL_RETURN_IF_ERROR(copied.Annotate(where));
  // The source's index bytes, unchanged: the copy is the same checkpoint, with its own retention.
  return writer->PublishEncoded(item.index, CommitOptions{/*retention=*/true, config_.writer.keep_last}).status().Annotate(where);
}

// Data files are written with their padding kept, so their sizes are multiples of the direct-I/O
// alignment and both sides can bypass the page cache.
Status Drainer::CopyFile(const std::string& from, const std::string& to, uint64_t size) {
  FileOptions fopt;
  fopt.direct_io = config_.writer.direct_io;
  LL_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> in, env_->NewRandomAccessFile(from, fopt));
  LL_ASSIGN_OR_RETURN(uint64_t actual, in->Size());
  if (actual != size)
    return Status::Corruption(from, "is " + std::to_string(actual) + " bytes but its rank index says " +
                                        std::to_string(size));
  if (size % kDirectIoAlignment != 0) fopt.direct_io = false;
  LL_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, env_->NewWritableFile(to, fopt));
  Status s = out->Allocate(size);
  // Into an object store each block is one part upload, a network round trip: several go at once,
  // each thread copying every `lanes`-th block through a buffer of its own.
  const unsigned lanes = IsObjectStorePath(to) ? kObjectDrainLanes : 1;
  const uint64_t block = config_.buffer_bytes;
  std::mutex mu;
  auto copy_lane = [&](unsigned lane) {
    AlignedBuffer buffer(block);
    Status ls = buffer.data() != nullptr ? Status::OK() : Status::ResourceExhausted(to, "cannot allocate the drain buffer");
    for (uint64_t off = lane * block; off < size && ls.ok(); off += lanes * block) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!s.ok()) return;
      }
      const uint64_t n = std::min<uint64_t>(block, size - off);
      ls = in->ReadAt(off, buffer.data(), n);
      if (ls.ok()) ls = out->WriteAt(off, buffer.data(), n);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (s.ok()) s = ls;
  };
  if (s.ok()) {
    std::vector<std::thread> threads;
    for (unsigned lane = 1; lane < lanes; ++lane) threads.emplace_back(copy_lane, lane);
    copy_lane(0);
    for (std::thread& t : threads) t.join();
  }
  if (s.ok()) s = out->Sync();
  if (s.ok()) s = out->Close();  // a failed copy is dropped unclosed: no partial object published
  return s;
}

}  // namespace lifeline
