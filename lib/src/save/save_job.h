// One save in flight: what it copies where, how far it has got, and who waits for what.
//
// A job is shared by the caller's tickets, the copy engine and the persist pipeline. The copy
// engine takes pieces (one checksum chunk or one object each) with an atomic counter; each piece
// copied counts down its tensor, the write blocks it touches and the job. The persist pipeline
// writes a block as soon as it is whole, so persisting overlaps copying.
#ifndef LIFELINE_SRC_SAVE_JOB_H_
#define LIFELINE_SRC_SAVE_JOB_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/model.h"
#include "lib/src/save/cuda_copy.h"
#include "lib/src/save/rank_data.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/trace.h"

namespace lifeline::internal {

// How a save codec is written in the format (formats/SPEC.md §12).
format::Codec StoredCodec(SaveCodec codec);

// Copy `length` bytes from `source` to image offset `image_offset`, hashing them as chunk
// `target` of the index (or object `target` when `object`). `length` is never 0: the pipeline
// takes the index's checksums as complete once every write block is whole, and a piece of no
// bytes lies in no block, so nothing would wait for its checksum (see PlanPieces).
struct CopyPiece {
  // Host memory to copy; for a device piece the device address, already copied into the image by
  // the job's device copies (the copy engine then only checksums the image).
  const uint8_t* source = nullptr;
  bool device = false;
  // A piece of a column block (save_plan.h): bytes [source_offset, +length) of runs of `run_bytes`,
  // one every `source_stride` bytes from `source`. 0: packed at `source`.
  uint64_t source_stride = 0;
  uint64_t run_bytes = 0;
  uint64_t source_offset = 0;
  uint64_t image_offset = 0;
  uint64_t length = 0;
  uint64_t target = 0;
  uint32_t request_tensor = 0;  // meaningless for objects
  bool object = false;
  // The pieces the copy engine takes together, this one first: a band, the same chunk of several
  // column blocks of one shard, of equal width, whose runs lie in the same rows, so that one pass
  // over those rows copies them all (GatherBandAndHash). 1: a piece taken alone; 0: a piece of a
  // band, taken with its first. At most kMaxBandPieces.
  uint32_t band = 1;
  // Hash only, for a replica digest (replica_digest.h): `length` host bytes at `source`, read and
  // hashed into the job's verify hash `target`; nothing is copied, no block or image is touched.
  bool verify = false;
};

inline constexpr uint32_t kMaxBandPieces = 16;

class SaveJob;
struct ReplicaDigestPlan;

// Splits the job's staged image into its pieces, each at most one chunk: the unit of copying,
// hashing and per-tensor readiness. The column blocks of one shard are interleaved into bands
// (CopyPiece::band): chunk k of each of its equal blocks, then chunk k + 1, ... An object with no
// bytes gets no piece: its checksum, that of nothing, is written into the index here. REQUIRES: the job's plan, objects, layout, index and
// write_options are set; `request` is the one they were planned from.
// With `fragment_pieces`, the fragments' part is that of an earlier PlanPieces of the same plan,
// layout and index fragments (the first index.chunks.size() pieces it made), shared, not copied.
void PlanPieces(SaveJob& job, const SaveRequest& request,
                std::shared_ptr<const std::vector<CopyPiece>> fragment_pieces = nullptr);

class SaveJob {
 public:
  using Clock = std::chrono::steady_clock;

  SaveJob(uint64_t step, Env* env, std::string root);

  // ---- set up by Checkpointer::Save before the job is shared, read-only afterwards ----
  const uint64_t step;
  Env* const env;
  const std::string root;  // checkpoint directory (for WaitCommitted)
  const Clock::time_point started = Clock::now();
  // Shared by the saves of one structure (Checkpointer reuses it while the request is the same).
  std::shared_ptr<const RankSavePlan> plan;
  std::vector<std::pair<std::string, std::string>> objects;  // copied from the request
  std::string metadata_json;
  RankWriteOptions write_options;
  format::CheckpointIndex index;  // raw image index; chunk/object checksums filled by the copies
  // Set when `index` was made by RawImageIndexOfReusedPlan: the index of an earlier save of the
  // same plan, whose tensors and fragments `index` lacks until CompleteIndex.
  std::shared_ptr<const format::CheckpointIndex> index_structure;
  // Copies index_structure's tensors and fragments into `index` (once; later calls return at
  // once). Called before anything reads those: off the caller's thread, by the copy thread that
  // publishes to the memory tier and by the persist pipeline. Safe for concurrent use.
  void CompleteIndex();
  ImageLayout layout;
  // The pieces, in order: `shared_pieces` (the fragments' pieces of a plan the Checkpointer reuses
  // from save to save, when it does), then `pieces`. Use num_pieces() and piece(i).
  std::shared_ptr<const std::vector<CopyPiece>> shared_pieces;
  std::vector<CopyPiece> pieces;
  // Then the hash-only pieces of the replica digests, last, so that the copy the persist pipeline
  // waits for comes first.
  size_t num_pieces() const { return (shared_pieces ? shared_pieces->size() : 0) + pieces.size() + num_verify_; }
  const CopyPiece& piece(size_t i) const {
    const size_t shared = shared_pieces ? shared_pieces->size() : 0;
    if (i < shared) return (*shared_pieces)[i];
    i -= shared;
    return i < pieces.size() ? pieces[i] : (*verify_pieces_)[i - pieces.size()];
  }
  // Digests this job's replicated shards by `plan` (its verify pieces join the job's pieces) and,
  // with `report`, sends them to the agent when the snapshot completes. Before InitCounters.
  void SetReplicaDigests(std::shared_ptr<const ReplicaDigestPlan> plan, bool report);
  // The digests, once the snapshot is complete (ReplicaDigestPlan's shards' order).
  std::vector<uint64_t> replica_digests() const;
  const ReplicaDigestPlan* replica_plan() const { return replica_plan_.get(); }
  uint8_t* image = nullptr;        // slot memory; null when streamed
  std::optional<unsigned> slot;    // the staging slot it holds
  uint64_t block_bytes = 0;        // granularity of block readiness
  uint64_t bytes_total = 0;
  // Fences after the device-to-host copies of the device pieces, one per device (set by Save
  // before the job reaches the copy engine).
  std::vector<std::shared_ptr<cuda::Fence>> device_fences;
  // Waits (once; later calls return the same status) for every device copy of the job.
  Status WaitDeviceCopies();
  // Run on the copy thread that finishes the copy, after the snapshot is marked complete.
  std::function<void(SaveJob&)> on_copied;
  // The rank index as persisted on disk (set by the persist pipeline before it reports the job).
  std::string disk_index;

  // Sizes the counters from `pieces`; call once, after the set-up above. A streamed job has no
  // pieces: its tensors all become copied at MarkStreamCopied.
  void InitCounters(size_t request_tensors, bool streamed = false);

  // ---- copy engine ----
  // Claims the next piece, with the band it begins (piece(i).band pieces from i); nullopt when all
  // are claimed.
  std::optional<size_t> ClaimPiece() {
    const size_t i = next_piece_.fetch_add(1, std::memory_order_relaxed);
    if (band_starts_.empty()) return i < num_pieces() ? std::optional<size_t>(i) : std::nullopt;
    return i < band_starts_.size() ? std::optional<size_t>(band_starts_[i]) : std::nullopt;
  }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Records piece i as copied with `checksum` (or skipped, when cancelled).
  void PieceDone(size_t i, uint64_t checksum);
  // For a job without pieces: completes the (empty) copy.
  void CompleteEmptyCopy() { CompleteCopy(); }

  // ---- persist pipeline ----
  // Waits until image bytes [0, end) are copied; false when the job was cancelled.
  bool WaitCopiedThrough(uint64_t end);
  // Streamed jobs: the state has been read (written to disk); release the caller.
  void MarkStreamCopied();
  // Blocks until no copy thread reads the state or touches the slot any more (on_copied included).
  void WaitCopyStopped();
  // Marks this rank's part durable; `committed` when its index completed the checkpoint.
  void MarkPersisted(uint64_t bytes_stored, bool committed);
  // Records the first error, stops further copying, and wakes every waiter. The job still waits
  // for copies in progress before it reports the snapshot as finished.
  void Fail(Status status);
  // A save not taken (BusyPolicy::kSkip, or refused before anything was read).
  void FinishWithoutCopy(Status status, SavePhase phase);
  // Who takes a staged job once its snapshot is complete: the persist pipeline, which claims it
  // with BeginPersist before writing it (false: it was superseded, nothing is to be written), or
  // Checkpointer::Save, which supersedes it with `status` when a newer snapshot needs its slot and
  // the job is still only waiting for the pipeline (false, nothing changed, when the pipeline began
  // it, its copy is not done, or it finished). A superseded job is failed; its slot is the caller's
  // to release.
  bool BeginPersist();
  bool Supersede(Status status);
  void MarkMemoryTier() { memory_tier_.store(true); }
  // Why a save of a Checkpointer with the memory tier on is not in it (SaveProgress).
  void NoteMemoryTier(std::string why);
  void SetStaged(bool staged) { staged_.store(staged); }

  // ---- tickets ----
  Status WaitSnapshot();
  Status WaitTensor(size_t i);
  bool TensorCopied(size_t i) const;
  Status WaitPersisted();
  Status WaitCommitted(double timeout_seconds);
  SaveProgress Progress() const;
  Status status() const;
  bool finished() const;  // persisted, failed or skipped
  // Records a checkpoint lifecycle event for the node agent (a no-op without one): this job's
  // step and bytes, the time since Save in duration_ns, and `aux` (per type, see trace.h).
  void Trace(trace::EventType type, uint64_t aux = 0) const;
  // The parts of SaveStallBreakdown, in its order.
  enum class StallPart { kPlan, kSlot, kStage, kSubmit, kWait, kCount };
  void AddStall(Clock::duration d, StallPart part) {
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
    stall_ns_.fetch_add(ns);
    stall_part_ns_[static_cast<size_t>(part)].fetch_add(ns);
  }

 private:
  std::once_flag index_completed_;
  void CompleteCopy();
  void FinishReplicaDigests();

  std::shared_ptr<const ReplicaDigestPlan> replica_plan_;
  const std::vector<CopyPiece>* verify_pieces_ = nullptr;  // replica_plan_'s
  size_t num_verify_ = 0;
  bool report_digests_ = false;
  std::vector<uint64_t> verify_hashes_;   // each written by one copy thread, read after the last piece
  std::vector<uint64_t> replica_digests_; // GUARDED_BY(mu_) once copied_
  std::once_flag device_once_;
  Status device_status_;  // written once under device_once_
  std::atomic<size_t> next_piece_{0};  // counts claims: pieces, or bands when there are bands
  std::vector<size_t> band_starts_;     // the first piece of every claim; empty without bands
  std::atomic<size_t> pieces_left_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> bytes_copied_{0};
  std::atomic<int64_t> stall_ns_{0};
  std::atomic<int64_t> stall_part_ns_[static_cast<size_t>(StallPart::kCount)] = {};
  std::atomic<bool> memory_tier_{false};
  std::string memory_tier_note_;  // GUARDED_BY(mu_)
  std::atomic<bool> staged_{true};
  std::unique_ptr<std::atomic<uint32_t>[]> tensor_pending_;
  size_t num_tensors_ = 0;
  std::unique_ptr<std::atomic<int64_t>[]> block_pending_;
  size_t num_blocks_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  SavePhase phase_ = SavePhase::kCopying;  // GUARDED_BY(mu_)
  Status status_;                          // GUARDED_BY(mu_)
  bool copied_ = false;                    // GUARDED_BY(mu_): the state is no longer read
  bool copy_done_ = false;                 // GUARDED_BY(mu_): nor the slot written, on_copied has run
  bool persisted_ = false;                 // GUARDED_BY(mu_)
  bool persist_claimed_ = false;           // GUARDED_BY(mu_): by BeginPersist or Supersede
  bool committed_ = false;                 // GUARDED_BY(mu_)
  uint64_t bytes_stored_ = 0;              // GUARDED_BY(mu_)
  Clock::time_point copied_at_{};          // GUARDED_BY(mu_)
  Clock::time_point persisted_at_{};       // GUARDED_BY(mu_)
};

}  // namespace lifeline::internal

#endif  // LIFELINE_SRC_SAVE_JOB_H_
