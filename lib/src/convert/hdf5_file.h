// Hdf5File: the small slice of HDF5 that `lifeline convert` needs to export a checkpoint to an
// HDF5 file (readable by h5py out of the box) and to import one back.
//
// Why it lives here, beside conversion, and not in formats/ with the safetensors and index codecs:
// libhdf5 opens, reads and writes its files itself, below the Env seam, while formats/ does no I/O
// of its own (its readers take the Env's file types). So this is the one reader/writer that works
// on the POSIX file system only; OpenTensorSource and Convert refuse HDF5 with any other Env.
//
// Layout written: one dataset per tensor at a '/'-separated path ("tensors/model.embed.weight"),
// intermediate groups created on demand. Stored element types:
//   f64, f32         IEEE little-endian floats
//   f16              an IEEE half float built from H5T_IEEE_F32LE (h5py reads it as float16)
//   bf16             H5T_STD_U16LE (raw bits)
//   f8e4m3, f8e5m2   H5T_STD_U8LE (raw bits)
//   i64..i8, u8      standard little-endian integers
//   bool             enum over int8 {FALSE=0, TRUE=1}, as h5py stores numpy bool
// Every dataset created here carries a string attribute "lifeline_dtype" = DTypeName(dtype), so
// bf16 and fp8 (which look like plain unsigned integers to other readers) can be recognised.
// In memory, elements are little-endian host values of the DType; a bool is one byte, 0 or 1.
//
// Errors: nothing is printed (HDF5's automatic error-stack printing is switched off for the whole
// process the first time a file is created or opened). Every failure is a Status whose message
// names the file, the dataset or object, and the innermost description from HDF5's error stack.
// No exception leaves this code.
//
// Paths: dataset and object paths are '/'-separated, with or without a leading '/'; empty
// components ("a//b") are rejected. "/" names the root group where a group is expected.
//
// Thread safety: NOT thread-safe. The HDF5 library this links against is the serial build, which
// has global state and no locks: no two threads may be inside any Hdf5File method (of the same or of
// different objects) at the same time. Callers serialise all use of this class.
#ifndef LIFELINE_LIB_SRC_CONVERT_HDF5_FILE_H_
#define LIFELINE_LIB_SRC_CONVERT_HDF5_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lifeline/dtype.h"
#include "lifeline/status.h"

namespace lifeline {

// The name of the attribute that records a dataset's Lifeline dtype.
inline constexpr char kHdf5DTypeAttribute[] = "lifeline_dtype";

struct DatasetOptions {
  // Target bytes per HDF5 chunk. The chunk keeps the trailing dimensions whole and shrinks the
  // leading ones until it fits (a single trailing row larger than this is cut too). Must be > 0;
  // values above 4 GiB - 1 (HDF5's limit) are clamped.
  uint64_t chunk_bytes = 1 << 20;
  // 0 = no compression; 1..9 = deflate (gzip) at that level, preceded by the byte-shuffle filter
  // for elements wider than one byte. Ignored for 0-d and zero-size datasets (nothing to chunk).
  int deflate_level = 0;
};

struct DatasetInfo {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty for a 0-d (scalar) dataset
  std::string stored_type;     // human readable, e.g. "IEEE float16 LE", "uint16 LE"

  // Product of shape (1 for a 0-d dataset). Describe guarantees it times the element size fits
  // in int64_t.
  int64_t num_elements() const;
};

class Hdf5File {
 public:
  // Creates (or truncates) the file at `path` for writing. IOError naming the path, with HDF5's
  // reason, when it cannot be created.
  static Result<Hdf5File> Create(const std::string& path);

  // Opens an existing file read-only. NotFound when `path` does not exist; Corruption naming the
  // path when it is not an HDF5 file or is truncated/damaged; IOError for other failures.
  static Result<Hdf5File> OpenReadOnly(const std::string& path);

  Hdf5File(Hdf5File&&) noexcept;
  Hdf5File& operator=(Hdf5File&&) noexcept;
  Hdf5File(const Hdf5File&) = delete;
  Hdf5File& operator=(const Hdf5File&) = delete;
  // Closes the file if Close() was not called; an error at that point is lost, so writers call
  // Close() and check it.
  ~Hdf5File();

  // The path given to Create/OpenReadOnly.
  const std::string& path() const;

  // Flushes and closes the file. IOError naming the file when HDF5 fails to write it out. Every
  // other method returns FailedPrecondition after Close(). Calling Close() twice is OK.
  Status Close();

  // Creates a dataset of `dtype` and `shape` at `path` (intermediate groups created), with the
  // "lifeline_dtype" attribute. Chunked layout per `opts`; a 0-d dataset is stored compact and a
  // dataset with a zero extent contiguous. Unwritten elements read as zero.
  // InvalidArgument for a bad path, dtype, shape (negative extent, more than 32 dimensions, byte
  // size overflowing int64) or option; AlreadyExists when something exists at `path`;
  // NotSupported when deflate is requested and the HDF5 library lacks it; IOError otherwise.
  Status CreateDataset(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
                       const DatasetOptions& opts = {});

  // Writes the row-major element range [flat_begin, flat_end) of the box of the dataset whose
  // origin is `box_offsets` and extent `box_shape` (one entry per dimension; both empty for a 0-d
  // dataset, whose box has one element). `data` holds exactly flat_end - flat_begin elements of
  // the dataset's dtype. An empty range writes nothing.
  // NotFound when there is no dataset at `path`; InvalidArgument naming the dataset, offsets and
  // shape when the box is not inside the dataset or the range not inside the box; the errors of
  // Describe for a dataset of an unsupported type; IOError when HDF5 fails.
  Status WriteRegion(const std::string& path, const std::vector<int64_t>& box_offsets,
                     const std::vector<int64_t>& box_shape, int64_t flat_begin, int64_t flat_end,
                     const void* data);

  // The reverse of WriteRegion: fills `out` (flat_end - flat_begin elements) from the file,
  // converting the stored type to the in-memory representation of Describe(path).dtype.
  // Same errors as WriteRegion.
  Status ReadRegion(const std::string& path, const std::vector<int64_t>& box_offsets,
                    const std::vector<int64_t>& box_shape, int64_t flat_begin, int64_t flat_end,
                    void* out);

  // The whole dataset. `bytes` must equal num_elements * DTypeSize(dtype) (InvalidArgument
  // otherwise); other errors as WriteRegion/ReadRegion.
  Status WriteAll(const std::string& path, const void* data, size_t bytes);
  Status ReadAll(const std::string& path, void* out, size_t bytes);

  // The dataset's dtype, shape and stored type. The dtype comes from the "lifeline_dtype"
  // attribute when present and is checked against the stored type (Corruption naming the
  // dataset when they disagree or the attribute is not a known dtype name); otherwise it is
  // inferred: IEEE floats of 2/4/8 bytes, signed integers of 1/2/4/8 bytes, uint8, and the
  // FALSE/TRUE int8 enum. NotSupported naming the dataset and its type for anything else
  // (strings, compounds, complex, other unsigned widths...), for more than 32 dimensions, and
  // for extents whose byte size overflows int64. NotFound when there is no dataset at `path`.
  Result<DatasetInfo> Describe(const std::string& path);

  // Full paths (no leading '/') of every dataset under `group`, recursively, sorted bytewise.
  // Soft and external links are not followed. NotFound when `group` does not exist,
  // InvalidArgument when it is a dataset.
  Result<std::vector<std::string>> ListDatasets(const std::string& group = "/");

  // Sets (replacing any previous value) a variable-length UTF-8 string attribute on the group or
  // dataset at `object_path` ("/" = root group). InvalidArgument for an empty key or a key/value
  // containing a NUL byte; NotFound when the object does not exist.
  Status SetStringAttribute(const std::string& object_path, const std::string& key,
                            const std::string& value);

  // The value of string attribute `key`, or nullopt when the object has no such attribute.
  // Accepts fixed-length and variable-length strings of one element. InvalidArgument naming the
  // object and key when the attribute is not a single string; NotFound when the object does not
  // exist.
  Result<std::optional<std::string>> GetStringAttribute(const std::string& object_path,
                                                        const std::string& key);

  // All single-string attributes of the object (fixed- or variable-length), sorted by name;
  // attributes of other types are skipped.
  Result<std::vector<std::pair<std::string, std::string>>> StringAttributes(
      const std::string& object_path);

  // An opaque byte string stored as a 1-D uint8 dataset at `path` (chunked, uncompressed).
  // Errors as CreateDataset/WriteAll.
  Status WriteBytes(const std::string& path, std::string_view bytes);
  // Reads it back. InvalidArgument naming the dataset when it is not a 1-D u8 dataset; other
  // errors as ReadAll.
  Result<std::string> ReadBytes(const std::string& path);

 private:
  struct Impl;
  explicit Hdf5File(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The decomposition WriteRegion/ReadRegion use, exposed for tests: the row-major range
// [flat_begin, flat_end) of a box of extent `box_shape` as at most 2N-1 sub-boxes (N = rank),
// in row-major order; each covers a contiguous part of the range. Boxes are relative to the box
// origin. REQUIRES: 0 <= flat_begin <= flat_end <= product(box_shape), product fits in int64.
struct FlatRangeBox {
  std::vector<int64_t> start;
  std::vector<int64_t> count;
};
std::vector<FlatRangeBox> DecomposeFlatRange(const std::vector<int64_t>& box_shape,
                                             int64_t flat_begin, int64_t flat_end);

}  // namespace lifeline

#endif  // LIFELINE_LIB_SRC_CONVERT_HDF5_FILE_H_
