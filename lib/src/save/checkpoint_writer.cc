#include "lib/src/save/checkpoint_writer.h"

#include "formats/index_codec.h"
#include "lib/src/store/checkpoint_layout.h"
#include "lib/src/save/commit.h"

namespace lifeline {

Result<CheckpointWriter> CheckpointWriter::Begin(Env* env, StepTarget target) {
  LL_ASSIGN_OR_RETURN(std::string step_dir, PrepareStepDir(env, target.root, target.step, target.run_hash,
                                                           target.rank, target.world_size));
  return CheckpointWriter(env, std::move(target), std::move(step_dir));
}

std::string CheckpointWriter::data_path() const {
  return JoinPath(step_dir_, DataFileName(target_.run_hash, target_.rank, target_.world_size));
}

std::string CheckpointWriter::index_path() const {
  return JoinPath(step_dir_, IndexFileName(target_.run_hash, target_.rank, target_.world_size));
}

Result<format::CheckpointIndex> CheckpointWriter::WriteData(
    const RankSavePlan& plan, const std::vector<std::pair<std::string, std::string>>& objects,
    const std::string& metadata_json, const RankWriteOptions& options, const FragmentReader& reader) const {
  return WriteRankData(env_, step_dir_, plan, objects, metadata_json, options, reader);
}

Result<PublishedIndex> CheckpointWriter::Publish(const format::CheckpointIndex& index,
                                                 const CommitOptions& commit) const {
  // The index promises its data files: one removed meanwhile (by a gc of partial steps) must not
  // be promised.
  for (const format::FileInfo& f : index.files) {
    Result<uint64_t> size = env_->GetFileSize(JoinPath(step_dir_, f.name));
    if (size.status().IsNotFound())
      return Status::IOError(JoinPath(step_dir_, f.name), "was removed before its rank index was published (was "
                                                           "`lifeline gc --partial --force` run against this job?)");
    LL_RETURN_IF_ERROR(size.status());
  }
  PublishedIndex published;
  LL_ASSIGN_OR_RETURN(published.encoded_index, format::EncodeIndex(index));
  LL_ASSIGN_OR_RETURN(published.committed, PublishEncoded(published.encoded_index, commit));
  return published;
}

Result<bool> CheckpointWriter::PublishEncoded(std::string_view encoded_index, const CommitOptions& commit) const {
  return PublishRankIndex(env_, target_.root, target_.step, target_.run_hash, target_.rank, target_.world_size,
                          encoded_index, commit.retention, commit.keep_last);
}

void CheckpointWriter::DiscardUnpublished() const {
  if (!env_->FileExists(index_path())) env_->RemoveFile(data_path()).IgnoreError();
}

}  // namespace lifeline
