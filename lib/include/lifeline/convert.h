// Conversion between a Lifeline checkpoint, HDF5 and safetensors: what `lifeline convert`,
// `reshard` and `diff` and Python's lifeline.convert() are built on.
//
// A TensorSource reads any region of any tensor of a checkpoint directory (one step), an HDF5
// file, or safetensors (one file, or a directory of shards with or without
// model.safetensors.index.json). Nothing but metadata is loaded when it is opened: callers stream
// regions within their memory budget. Convert() streams a source into HDF5, safetensors, or a
// Lifeline checkpoint laid out for a parallel layout (ranks, tp, dp), one slab at a time: peak
// memory is bounded by ConvertOptions::memory_budget, not by the model. On the way, tensors may be
// renamed by user rules (RenameRule: training names to Hugging Face's) and floating tensors cast
// (ConvertOptions::dtype), slab by slab too.
//
// Outputs appear whole or not at all: files are written under temporary names (".tmp-" in the
// name) and renamed at the end; a failed conversion removes its temporary files and reports the
// file that failed. A checkpoint step becomes visible only when its last rank index is published
// (formats/SPEC.md §9); a failed one leaves an unpublished step directory that loads ignore and
// `lifeline gc --partial` removes.
//
// The layouts written and read (HDF5 groups and attributes, safetensors "__metadata__" keys) are
// described in lib/src/convert/tensor_source.h.
//
// I/O goes through the Env of the options (the POSIX Env when null), except HDF5: libhdf5 opens and
// writes its files itself, so HDF5 input and output need the POSIX Env (NotSupported otherwise).
//
// Thread safety: a TensorSource is used by one thread at a time; one conversion per thread. HDF5
// (Debian's serial build) has process-wide state: no two threads may read or write HDF5 at once.
#ifndef LIFELINE_CONVERT_H_
#define LIFELINE_CONVERT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lifeline/export.h"
#include "lifeline/checkpoint.h"
#include "lifeline/dtype.h"
#include "lifeline/status.h"

namespace lifeline {

class Env;

struct LIFELINE_EXPORT SourceTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty for a 0-d tensor (one element)

  int64_t num_elements() const;
  uint64_t num_bytes() const;
};

struct LIFELINE_EXPORT SourceObject {
  uint32_t rank = 0;  // the rank that saved it
  std::string name;
};

// A box of a tensor (origin `offsets`, extent `shape`, one entry per dimension) and the row-major
// element range [flat_begin, flat_end) inside it. A 0-d tensor's only region is
// {{}, {}, 0, 1}.
struct LIFELINE_EXPORT TensorRegion {
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  int64_t flat_begin = 0;
  int64_t flat_end = 0;

  int64_t num_elements() const { return flat_end - flat_begin; }
  // The whole of `tensor`.
  static TensorRegion Whole(const SourceTensor& tensor);
};

enum class SourceKind { kCheckpoint, kHdf5, kSafetensors };
LIFELINE_EXPORT std::string_view SourceKindName(SourceKind kind);  // "lifeline", "hdf5", "safetensors"

class LIFELINE_EXPORT TensorSource {
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
  // hence every output of a conversion, gets only valid bools).
  [[nodiscard]] Status Read(size_t tensor, const TensorRegion& region, void* dst);
  // The bytes of object `object` (index into objects()).
  [[nodiscard]] virtual Result<std::string> ReadObject(size_t object) = 0;

 protected:
  explicit TensorSource(SourceKind kind) : kind_(kind) {}
  // Read without the bool check: what each kind of source implements.
  virtual Status ReadRegion(size_t tensor, const TensorRegion& region, void* dst) = 0;
  SourceKind kind_;
  std::string description_;
  std::vector<SourceTensor> tensors_;
  std::vector<SourceObject> objects_;
  std::string metadata_json_;
  std::optional<uint64_t> step_;
  uint32_t saved_world_size_ = 0;
};

struct LIFELINE_EXPORT SourceOptions {
  std::optional<uint64_t> step;           // a checkpoint's step (default: the newest complete one)
  uint64_t memory_budget = 256ull << 20;  // read staging of a checkpoint source
  Env* env = nullptr;                     // null: Env::Routing() (local paths, s3:// prefixes)
};

// Opens `path`, recognising what it is: a directory holding step-* directories (a Lifeline
// checkpoint), a directory holding *.safetensors files, an HDF5 file (by its signature) or a
// safetensors file. A path the user names may be a symbolic link. InvalidArgument naming the path
// when it is none of those; the opener's errors otherwise (NotFound when the path does not exist
// or a checkpoint has no complete step, Corruption for damaged input).
[[nodiscard]] LIFELINE_EXPORT Result<std::unique_ptr<TensorSource>> OpenTensorSource(const std::string& path,
                                                                     const SourceOptions& options = {});

enum class ConvertFormat { kHdf5, kSafetensors, kLifeline };
// "hdf5", "safetensors", "lifeline" and back; InvalidArgument naming `name` otherwise.
LIFELINE_EXPORT std::string_view ConvertFormatName(ConvertFormat format);
[[nodiscard]] LIFELINE_EXPORT Result<ConvertFormat> ParseConvertFormat(std::string_view name);

// A rule of `lifeline convert --rename`: a tensor whose whole name matches `pattern` (an
// ECMAScript regular expression, std::regex) is written as `replacement`, in which $1..$99 are
// the pattern's groups, $& the whole name and $$ a '$'. Rules are tried in order and the first
// that matches a name renames it; a name no rule matches is kept.
struct LIFELINE_EXPORT RenameRule {
  std::string pattern;
  std::string replacement;
};

// "PATTERN=REPLACEMENT", split at the first '=' not preceded by a backslash (write \= for an '='
// in the pattern; the replacement may hold any). InvalidArgument quoting `text` when there is no
// such '=', the pattern is empty, or it is not a valid regular expression.
[[nodiscard]] LIFELINE_EXPORT Result<RenameRule> ParseRenameRule(std::string_view text);
// The rules of a rules file's text: one rule per line as ParseRenameRule reads it, surrounding
// spaces and tabs trimmed; empty lines and lines whose first other character is '#' are skipped.
// InvalidArgument naming `file_name` and the line otherwise.
[[nodiscard]] LIFELINE_EXPORT Result<std::vector<RenameRule>> ParseRenameRules(std::string_view text,
                                                                             std::string_view file_name);

struct LIFELINE_EXPORT ConvertOptions {
  uint64_t memory_budget = 256ull << 20;  // bytes of slabs in memory at once (at least 1 MiB is used)
  std::vector<std::string> select;        // prefixes of the source's tensor names to convert; empty: all
  // Applied to the selected tensors, before any output is opened, whatever the output format:
  std::vector<RenameRule> rename;         // output names (RenameRule); unmatched names are kept
  std::optional<DType> dtype;             // cast every floating tensor (f64 f32 f16 bf16 fp8) of
                                          // another dtype to this one (f64, f32, f16 or bf16),
                                          // rounding to nearest even; integers and bool are kept
  bool force = false;                     // replace an existing output file (hdf5, safetensors)
  // hdf5
  int deflate_level = 0;                  // 0 off, 1..9
  // safetensors
  uint64_t max_shard_bytes = 0;           // 0: one file
  // lifeline
  std::optional<uint64_t> step;           // the output step (default: the source's, else 0)
  uint32_t ranks = 0;                     // 0: the source's saved world size, else 1
  uint32_t tp = 0, dp = 0;                // tp alone: dp = ranks / tp; dp alone: tp = ranks / dp; neither: tp = ranks
  SaveCodec codec = SaveCodec::kNone;
  int codec_level = 0;
  bool direct_io = true;
  Env* env = nullptr;                     // null: Env::Routing() (local paths, s3:// prefixes)
  // Called from the converting thread after each slab read: the tensor and the bytes just read.
  std::function<void(const std::string& tensor, uint64_t bytes)> progress;
};

// One selected tensor as Convert() writes it.
struct LIFELINE_EXPORT ExportTensor {
  size_t source_index = 0;            // into source.tensors()
  std::string source_name;
  std::string name;                   // after the rename rules
  int rule = -1;                      // the index in options.rename of the rule that matched; -1: none
  DType source_dtype = DType::kF32;
  DType dtype = DType::kF32;          // after the cast
  std::vector<int64_t> shape;

  bool renamed() const { return name != source_name; }
  bool cast() const { return dtype != source_dtype; }
};

struct LIFELINE_EXPORT ConvertReport {
  uint64_t tensors = 0;
  uint64_t bytes = 0;                 // tensor bytes written, in the output's dtypes (replicas once)
  uint64_t objects = 0;
  std::vector<std::string> outputs;   // files or the step directory written
  // lifeline only:
  uint64_t step = 0;                  // the step written
  uint32_t ranks = 0, tp = 0, dp = 0; // the layout written
  std::string placement;              // "synthetic model" or "generic"
  // The selected tensors that --rename or --dtype changed, in the source's order.
  std::vector<ExportTensor> renamed;
  std::vector<ExportTensor> cast;
};

// The tensors of `source` whose names start with one of `prefixes` (all when empty), as indexes
// into source.tensors().
LIFELINE_EXPORT std::vector<size_t> SelectTensors(const TensorSource& source, const std::vector<std::string>& prefixes);

// The tensors Convert(source, ..., options) writes, in the source's order: those selected by
// options.select (matched against the source's names), renamed by options.rename, cast to
// options.dtype. InvalidArgument, before anything is written, when options.dtype is not f64, f32,
// f16 or bf16 (naming a floating tensor it would have cast), when a rule makes a name empty (naming
// the tensor and the rule), or when two tensors would get the same name (naming both). Pure: reads
// only the source's list of tensors.
[[nodiscard]] LIFELINE_EXPORT Result<std::vector<ExportTensor>> PlanExportTensors(const TensorSource& source,
                                                                                 const ConvertOptions& options);

// Converts `source` into `out`:
//   kHdf5         `out` is the file written (layout in tensor_source.h).
//   kSafetensors  `out` ending in .safetensors is one file; otherwise a directory that receives
//                 model.safetensors, or model-0000K-of-0000N.safetensors plus
//                 model.safetensors.index.json when max_shard_bytes splits the tensors.
//   kLifeline     `out` is a checkpoint root that receives the step, laid out for
//                 (ranks, tp, dp): the synthetic model's placement when the tensors are exactly
//                 that model's, otherwise tensors of at least tp rows split along dimension 0
//                 and the rest held whole by every rank.
// AlreadyExists naming the output when it exists and !force; InvalidArgument for options that do
// not apply (max_shard_bytes with a single .safetensors file, deflate outside 0..9, a layout that
// does not resolve) and for renames and casts PlanExportTensors refuses; otherwise the source's or the writer's error, annotated with the source and
// naming the file that failed. Nothing is published on failure.
[[nodiscard]] LIFELINE_EXPORT Result<ConvertReport> Convert(TensorSource& source, ConvertFormat to, const std::string& out,
                                            const ConvertOptions& options = {});

}  // namespace lifeline

#endif  // LIFELINE_CONVERT_H_
