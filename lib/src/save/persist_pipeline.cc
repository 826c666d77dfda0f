#include "lib/src/save/persist_pipeline.h"

#include <algorithm>
#include <optional>

#include "lib/src/env/aligned_buffer.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/save/checkpoint_writer.h"
#include "lib/src/save/commit.h"
#include "lifeline/internal/io_pump.h"
#include "lifeline/log.h"

namespace lifeline {

PersistPipeline::PersistPipeline(Env* env, PersistConfig config, StagingArena* arena,
                                 std::function<void(internal::SaveJob&)> after_persist)
    : env_(env),
      config_(std::move(config)),
      arena_(arena),
      after_persist_(std::move(after_persist)),
      worker_([this](std::shared_ptr<internal::SaveJob>& job) {
        if (!job->finished() && job->BeginPersist()) Persist(*job);
        return job->status();
      }, config_.nice_levels) {}

void PersistPipeline::Persist(internal::SaveJob& job) {
  const RankWriteOptions& o = job.write_options;
  const std::string where = "saving step " + std::to_string(job.step) + " on rank " + std::to_string(config_.writer.rank);
  std::optional<CheckpointWriter> writer;  // set once this attempt's data file may exist
  auto finish = [&](Status s) {
    if (!s.ok()) {
      // A failed save takes its bytes with it (a full disk must not stay full), unless its index
      // was published: then the step's fate is decided by the commit protocol and retention.
      if (writer) writer->DiscardUnpublished();
      job.Fail(s.Annotate(where));
    }
    job.WaitCopyStopped();  // nothing may touch the slot once it is released
    if (job.slot && arena_ != nullptr) arena_->Release(*job.slot);
  };

  Result<CheckpointWriter> begun = CheckpointWriter::Begin(
      env_, config_.writer.AtStep(job.step));
  if (!begun.ok()) return finish(begun.status());
  writer.emplace(std::move(*begun));

  format::CheckpointIndex written;
  uint64_t stored = 0;
  if (job.image != nullptr && o.codec == format::Codec::kNone) {
    Result<uint64_t> n = WriteImage(job, writer->data_path());
    if (!n.ok()) return finish(n.status());
    stored = *n;
    job.CompleteIndex();
    written = job.index;  // its checksums are complete: every piece lies in a block, copied before it was written
  } else {
    RankSavePlan plan = *job.plan;
    if (job.image != nullptr) {  // encode from the snapshot, once it is complete
      job.WaitCopyStopped();
      if (job.cancelled()) return finish(Status::OK());
      for (size_t i = 0; i < plan.fragments.size(); ++i) {  // packed in the image, column blocks too
        plan.fragments[i].source = job.image + job.layout.fragment_offset[i];
        plan.fragments[i].source_stride = 0;
      }
    }
    Result<format::CheckpointIndex> index = writer->WriteData(plan, job.objects, job.metadata_json, o);
    if (job.image == nullptr) job.MarkStreamCopied();
    if (!index.ok()) return finish(index.status());
    written = std::move(*index);
    stored = written.files.empty() ? 0 : written.files[0].size;
  }
  // Retention is not part of the commit here: it runs below, after the ticket is released.
  Result<PublishedIndex> published = writer->Publish(written, CommitOptions{/*retention=*/false, config_.writer.keep_last});
  if (!published.ok()) return finish(published.status());
  const bool committed = published->committed;
  job.disk_index = std::move(published->encoded_index);
  finish(Status::OK());
  job.MarkPersisted(stored, committed);
  if (after_persist_) after_persist_(job);
  // Retention runs after the ticket is released: the caller waits for its own bytes, not for the
  // removal of old steps. Only the rank that committed collects, as a synchronous save does.
  if (committed) {
    Status gc = CollectGarbageIn(env_, config_.writer.root, SaverRetention(env_, config_.writer.keep_last, config_.writer.run_hash));
    if (!gc.ok()) Log(LogLevel::kWarning, "garbage collection after step " + std::to_string(job.step) + " in " +
                                              config_.writer.root + ": " + gc.ToString());
  }
}

void PersistPipeline::RenewRegistration() {
  if (!config_.register_buffers || registration_refused_ || arena_ == nullptr) return;
  const uint64_t generation = arena_->generation();
  if (generation == registered_generation_) return;
  registered_ = arena_->Regions();
  Status s = queue_->RegisterBuffers(registered_);
  registered_generation_ = generation;
  if (!s.ok()) {
    registration_refused_ = true;
    registered_.clear();
    Log(LogLevel::kInfo, "staging arena not registered with the I/O queue (" + s.ToString() +
                             "); writes pin pages per request instead");
  }
}

Result<uint64_t> PersistPipeline::WriteImage(internal::SaveJob& job, const std::string& path) {
  FileOptions fopt;
  fopt.direct_io = config_.writer.direct_io;
  LL_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env_->NewWritableFile(path, fopt));
  if (queue_ == nullptr) {
    IoQueueOptions qopt;
    qopt.depth = std::max(1u, config_.queue_depth);
    LL_ASSIGN_OR_RETURN(queue_, env_->NewIoQueue(qopt));
  }
  RenewRegistration();
  int buffer_index = -1;
  for (size_t i = 0; i < registered_.size(); ++i) {
    const auto* base = static_cast<const uint8_t*>(registered_[i].first);
    if (job.image >= base && job.image < base + registered_[i].second) buffer_index = static_cast<int>(i);
  }

  const uint64_t padded = AlignUp(job.layout.bytes, kDirectIoAlignment);
  Status first_error;
  {
    IoPump pump(queue_.get());
    pump.Fail(file->Allocate(padded));
    for (uint64_t off = 0; off < padded && pump.status().ok();) {
      const uint64_t len = std::min<uint64_t>(job.block_bytes, padded - off);
      if (!job.WaitCopiedThrough(off + len)) {
        pump.Fail(Status::Aborted(path, "the save was cancelled"));
        break;
      }
      IoRequest req;
      req.kind = IoRequest::Kind::kWrite;
      req.writer = file.get();
      req.offset = off;
      req.buffer = job.image + off;
      req.length = len;
      req.buffer_index = buffer_index;
      pump.Submit(req).IgnoreError();  // kept in pump.status()
      off += len;
    }
    first_error = pump.Drain();
    if (pump.broken()) {
      queue_.reset();  // unusable: its destructor waits for what the kernel still holds
      registered_generation_ = ~0ull;
    }
  }
  if (first_error.ok()) first_error = file->Sync();
  // A failed file is dropped unclosed: an object store then aborts its upload instead of publishing
  // an object with holes.
  if (first_error.ok()) first_error = file->Close();
  if (!first_error.ok()) return first_error.Annotate(path);
  return padded;
}

}  // namespace lifeline
