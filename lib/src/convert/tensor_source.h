// The sources behind OpenTensorSource (lifeline/convert.h): a Lifeline checkpoint directory, an
// HDF5 file, or safetensors (one file, or a directory of shards with or without
// model.safetensors.index.json), and the layouts conversions write and read back.
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
// of saved rank R >= W folded into rank R mod W (lib/src/save/rank_objects.h); a checkpoint source lists
// them as rank R's, under their saved names.
//
// Thread safety: a source is used by one thread at a time.
#ifndef LIFELINE_LIB_SRC_CONVERT_TENSOR_SOURCE_H_
#define LIFELINE_LIB_SRC_CONVERT_TENSOR_SOURCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/model.h"
#include "lifeline/convert.h"
#include "lifeline/dtype.h"
#include "lifeline/env.h"
#include "lifeline/internal/base64.h"  // objects in safetensors metadata are base64
#include "lifeline/status.h"

namespace lifeline {

// Opens a file the user named (a link is followed) for reading through `env`. InvalidArgument
// naming the path, before anything is opened, when it is not a regular file (a directory, a FIFO,
// a device): opening a FIFO would block. NotFound/IOError from the Env otherwise.
Result<std::unique_ptr<RandomAccessFile>> OpenUserFile(Env* env, const std::string& path);

// The same region in the formats layer's type, and back.
format::Region ToFormatRegion(const TensorRegion& region);
TensorRegion ToTensorRegion(const format::Region& region);

// The dataset path of a tensor or object name under `group` in the HDF5 layout above, and back.
std::string Hdf5DatasetName(std::string_view name);
std::string Hdf5NameFromDataset(std::string_view dataset_name);


// The prefix of the metadata keys that carry per-rank objects in safetensors.
inline constexpr char kObjectKeyPrefix[] = "lifeline_object.";

}  // namespace lifeline

#endif  // LIFELINE_LIB_SRC_CONVERT_TENSOR_SOURCE_H_
