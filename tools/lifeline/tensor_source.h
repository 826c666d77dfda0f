// Where `lifeline convert`, `reshard` and `diff` read tensors from: a Lifeline checkpoint
// directory, an HDF5 file, or safetensors (one file, or a directory of shards with or without
// model.safetensors.index.json), all behind one interface that reads any region of any tensor.
// Nothing is loaded up front but the metadata: callers stream regions within their memory budget.
//
// HDF5 layout written by `lifeline convert --to hdf5` and read back here:
//
//   /                          attributes: lifeline_format = "lifeline-hdf5/1", lifeline_step,
//                              lifeline_saved_world_size, lifeline_metadata (the checkpoint's user
//                              metadata JSON); each top-level key of that JSON object also as its
//                              own string attribute (strings bare, other values as JSON text)
//   /tensors/<name>            one dataset per tensor, global shape, attributes lifeline_dtype and
//                              lifeline_name (the tensor's name; the dataset name escapes '/', '%'
//                              and a leading '.' as %2F, %25, %2E)
//   /objects/rank<R>/<name>    the per-rank objects of rank R, 1-D uint8 datasets (lifeline_name)
//
// An HDF5 file without lifeline_format is read as "every dataset is a tensor named by its path".
//
// safetensors metadata ("__metadata__") written by `lifeline convert --to safetensors`: "format":
// "pt" (what transformers expects), the checkpoint's user metadata (its entries when it is a JSON
// object of strings, else as "lifeline_metadata"), "lifeline_step", and each per-rank object as
// "lifeline_object.<rank>.<name>" holding its bytes in base64 (in the first shard only).
//
// A checkpoint written by a conversion to a world smaller than the saving job's holds the objects
// of saved rank R >= W folded into rank R mod W (lib/src/rank_objects.h); a checkpoint source lists
// them as rank R's, under their saved names.
//
// Thread safety: a source is used by one thread at a time.
#ifndef LIFELINE_TOOLS_LIFELINE_TENSOR_SOURCE_H_
#define LIFELINE_TOOLS_LIFELINE_TENSOR_SOURCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/model.h"
#include "lifeline/dtype.h"
#include "lifeline/status.h"

namespace lifeline::cli {

struct SourceTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  int64_t num_elements() const;
  uint64_t num_bytes() const;
};

struct SourceObject {
  uint32_t rank = 0;  // the rank that saved it
  std::string name;
};

enum class SourceKind { kCheckpoint, kHdf5, kSafetensors };
std::string_view SourceKindName(SourceKind kind);  // "lifeline", "hdf5", "safetensors"

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  SourceKind kind() const { return kind_; }
  // What the source is, for messages: "checkpoint /d step 100", "HDF5 file /x.h5".
  const std::string& description() const { return description_; }
  // Every tensor, in the source's order (unique names).
  const std::vector<SourceTensor>& tensors() const { return tensors_; }
  const std::vector<SourceObject>& objects() const { return objects_; }
  // The user metadata JSON text (may be empty).
  const std::string& metadata_json() const { return metadata_json_; }
  // The step the source records, if any.
  std::optional<uint64_t> step() const { return step_; }
  // The world size of the job that saved it; 0 when unknown.
  uint32_t saved_world_size() const { return saved_world_size_; }

  // Fills dst with the elements of `region` of tensor `tensor` (index into tensors()), packed in
  // the region's flat order, little-endian, DTypeSize bytes each (bool: one byte 0 or 1).
  // InvalidArgument when the region does not fit the tensor; Corruption/IOError naming the file,
  // tensor and offset when the bytes cannot be read or fail their checks; Corruption naming the
  // tensor and the element when a bool byte is neither 0 nor 1 (every source and every reader,
  // hence every output of convert, gets only valid bools).
  Status Read(size_t tensor, const format::Region& region, void* dst);
  // The bytes of object `object` (index into objects()).
  virtual Result<std::string> ReadObject(size_t object) = 0;

 protected:
  explicit TensorSource(SourceKind kind) : kind_(kind) {}
  // Read without the bool check: what each kind of source implements.
  virtual Status ReadRegion(size_t tensor, const format::Region& region, void* dst) = 0;
  SourceKind kind_;
  std::string description_;
  std::vector<SourceTensor> tensors_;
  std::vector<SourceObject> objects_;
  std::string metadata_json_;
  std::optional<uint64_t> step_;
  uint32_t saved_world_size_ = 0;
};

struct SourceOptions {
  std::optional<uint64_t> step;          // a checkpoint's step (default: the newest complete one)
  uint64_t memory_budget = 256ull << 20;  // read staging of a checkpoint source
};

// Opens `path`, recognising what it is: a directory holding step-* directories (a Lifeline
// checkpoint), a directory holding *.safetensors files, an HDF5 file (by its signature) or a
// safetensors file. InvalidArgument naming the path when it is none of those; the opener's errors
// otherwise (NotFound when a checkpoint has no complete step, Corruption for damaged input).
Result<std::unique_ptr<TensorSource>> OpenTensorSource(const std::string& path, const SourceOptions& options);

// The dataset path of a tensor or object name under `group` in the HDF5 layout above, and back.
std::string Hdf5DatasetName(std::string_view name);
std::string Hdf5NameFromDataset(std::string_view dataset_name);

// Base64 (RFC 4648, with padding) for objects in safetensors metadata.
std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);

// The prefix of the metadata keys that carry per-rank objects in safetensors.
inline constexpr char kObjectKeyPrefix[] = "lifeline_object.";

}  // namespace lifeline::cli

#endif  // LIFELINE_TOOLS_LIFELINE_TENSOR_SOURCE_H_
