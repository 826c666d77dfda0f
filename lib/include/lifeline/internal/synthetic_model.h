// Part of the declared internal interface (lifeline/internal/): for Lifeline's own binaries, not users.
// `lifeline bench save|load`, `lifeline convert` and the tests build and check this model.
// The synthetic model of `lifeline bench`: a transformer-shaped set of tensors whose every element
// is a pure function of (tensor name, global index), so a checkpoint saved in one parallel layout
// can be loaded into any other and checked element by element without keeping the original.
//
// Layout. A job of N = T x P ranks: rank r = d*T + t, where t in [0, T) is the tensor-parallel
// index and d in [0, P) the data-parallel index. H is the hidden size, L the number of layers.
// Per layer i (names use the decimal i):
//
//   tensor                       dtype  global shape  held by rank (t, d)
//   layers.{i}.attn.qkv.weight   bf16   [3H, H]       TP box t along dim 0, Replica(d, P)
//   layers.{i}.attn.proj.weight  bf16   [H, H]        TP box t along dim 1, Replica(d, P)
//   layers.{i}.mlp.fc1.weight    f16    [4H, H]       TP box t along dim 0, Replica(d, P)
//   layers.{i}.mlp.fc2.weight    f16    [H, 4H]       TP box t along dim 1, Replica(d, P)
//   layers.{i}.norm.weight       f32    [H]           whole, Replica(r, N)
//   layers.{i}.router.tokens     i64    [H]           TP box t along dim 0, Replica(d, P)
//   optim.{W}.master             f32    shape of W    BoxFlat: W's TP box t, element range d of P
//   optim.{W}.exp_avg            f32    shape of W    of that box (ZeRO-1 style), not replicated
//   optim.{W}.exp_avg_sq         f32    shape of W
//
// where W ranges over the four weight matrices above (W is the full tensor name, e.g.
// "optim.layers.0.attn.qkv.weight.master"). One more tensor, `step` (i64, 0-d, shape {}), is held
// whole by every rank as Replica(r, N); its single element is the step number.
//
// Splits. Extent E split into n parts: part j gets E/n elements, and the first E mod n parts one
// more (so T = 3 over 3H rows is even, T = 3 over H = 1024 columns is 342/341/341). A rank whose
// part is empty holds no shard of that tensor. The same rule splits a TP box's flattened elements
// over the P data-parallel ranks for the optimizer state. Counting each replica group once, every
// element of every tensor is held exactly once.
//
// Size. Per layer the tensors take 168 H^2 + 12 H bytes (weights 24 H^2, optimizer state 144 H^2,
// vectors 12 H); the model holds L layers plus the 8-byte `step`. ChooseModelShape halves H (not
// below 64) while the requested state is smaller than two layers, then picks L >= 1 so that the
// total is as close as possible to the request.
//
// Values. The element at global row-major index i of tensor `name` is derived from
//   m = Mix64(XXH3_64(name) + i * 0x9E3779B97F4A7C15)      (arithmetic mod 2^64)
// where XXH3_64 is XXH3 64-bit with seed 0 over the name's bytes and Mix64 is the splitmix64
// finaliser (z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
// z ^= z >> 31). Floating types (f64 f32 f16 bf16): k = (m mod 255) - 127 and the value is k / 4,
// exactly representable in all four (bf16 is the upper 16 bits of the f32, f16 the exact
// conversion). i64: the 64 bits of m as two's complement; i32/i16: its low 32/16 bits; bool:
// m & 1; u8, i8 and the fp8 types: the low byte of m. Values are compared bit for bit.
//
// Per-rank objects. Rank r saving step s stores "rng" (32 bytes: four little-endian words
// Mix64(s * 0x9E3779B97F4A7C15 + r * 4 + w) for w = 0..3) and "dataloader" (the JSON text
// {"rank":r,"position":s*1000+r}). The save's metadata_json is
// {"model":"lifeline-synthetic","hidden":H,"layers":L,"tp":T,"dp":P,"step":s}.
//
// Thread safety: everything here is a pure function or a value type; RankState is used by one
// thread at a time.
#ifndef LIFELINE_INTERNAL_SYNTHETIC_MODEL_H_
#define LIFELINE_INTERNAL_SYNTHETIC_MODEL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lifeline/checkpoint.h"
#include "lifeline/dtype.h"
#include "lifeline/status.h"

namespace lifeline {

inline constexpr int64_t kDefaultHidden = 1024;
inline constexpr int64_t kMinHidden = 64;
inline constexpr const char* kModelName = "lifeline-synthetic";
inline constexpr const char* kStepTensorName = "step";
// The largest model this tool describes: metadata claiming more is refused before anything is
// allocated for it (4H x H elements per tensor and L x LayerBytes(H) stay far below 2^63).
inline constexpr int64_t kMaxHidden = int64_t{1} << 17;
inline constexpr int64_t kMaxLayers = int64_t{1} << 16;

struct ModelShape {
  int64_t hidden = kDefaultHidden;
  int64_t layers = 1;
};

struct ParallelLayout {
  uint32_t tp = 1;
  uint32_t dp = 1;
  uint32_t world_size() const { return tp * dp; }
};

// Resolves (--ranks, --tp, --dp) into a layout, as every command taking a layout does: --tp alone
// gives dp = ranks / tp, --dp alone tp = ranks / dp, neither tp = ranks. InvalidArgument when they
// disagree.
Result<ParallelLayout> ResolveLayout(uint32_t ranks, uint32_t tp, uint32_t dp);

// How a tensor is spread over the ranks (see the table above).
enum class Placement {
  kWholeOnEveryRank,  // Replica(r, N)
  kTensorParallelDim0,  // TP box along dim 0, Replica(d, P)
  kTensorParallelDim1,  // TP box along dim 1, Replica(d, P)
  kZeroOverDim0Box,   // range d of P of the TP box along dim 0, not replicated
  kZeroOverDim1Box,   // range d of P of the TP box along dim 1, not replicated
};

struct ModelTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  Placement placement = Placement::kWholeOnEveryRank;

  uint64_t num_bytes() const;
};

// Bytes of one layer at hidden size `hidden`: 168 H^2 + 12 H.
uint64_t LayerBytes(int64_t hidden);
// Bytes of the whole model counting every replicated tensor once (what a save writes).
uint64_t ModelBytes(const ModelShape& shape);

// Picks H and L for about `state_bytes` of model state, starting from `hidden` (see "Size").
// InvalidArgument when hidden is not 1..kMaxHidden or the state needs more than kMaxLayers layers.
Result<ModelShape> ChooseModelShape(uint64_t state_bytes, int64_t hidden);

// Every tensor of the model, in a fixed order (layer by layer, then `step`).
std::vector<ModelTensor> ModelTensors(const ModelShape& shape);
// How many that is (18 per layer, plus `step`), without building them.
uint64_t ModelTensorCount(const ModelShape& shape);

// OK when `stored` (a checkpoint's tensors, any order) is exactly the model `shape`: same names,
// dtypes and shapes. InvalidArgument naming the metadata field that disagrees ("layers" for the
// tensor count, "hidden" for a shape) otherwise; the count is compared before the model's tensors
// are listed, so a claim of a huge model costs nothing.
Status CheckModelTensors(const ModelShape& shape, const std::vector<ModelTensor>& stored);

// Part `index` of `parts` of [0, extent): {begin, end}. REQUIRES: index < parts, parts >= 1.
std::pair<int64_t, int64_t> EvenSplit(int64_t extent, uint32_t parts, uint32_t index);

// The pieces rank `rank` holds under `layout` (data == nullptr; replica fields set). Tensors of
// which the rank holds nothing are left out. REQUIRES: rank < layout.world_size().
std::vector<TensorShard> RankShards(const std::vector<ModelTensor>& tensors, const ParallelLayout& layout,
                                    uint32_t rank);

// XXH3_64 of the name: the per-tensor seed of the value function.
uint64_t TensorSeed(std::string_view name);
// The splitmix64 finaliser.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline constexpr uint64_t kIndexStride = 0x9E3779B97F4A7C15ull;

// Writes the values of elements [global_begin, global_begin + n) of a tensor with seed `seed`
// into dst (n elements of `dtype`, packed).
void GenerateValues(uint64_t seed, DType dtype, uint64_t global_begin, int64_t n, void* dst);
// Number of elements among the n at src that differ from GenerateValues' output.
uint64_t CountMismatches(uint64_t seed, DType dtype, uint64_t global_begin, int64_t n, const void* src);

// Fills shard.data with the shard's region of its tensor (the `step` tensor gets `step`).
// REQUIRES: shard.data holds shard.num_bytes() bytes.
void FillShard(const TensorShard& shard, uint64_t step);
// Elements of shard.data that differ from what FillShard would write.
uint64_t CountShardMismatches(const TensorShard& shard, uint64_t step);

// Calls fn(global_index, buffer_element, count) for each run of elements of the shard's region
// that is contiguous both in the global row-major order and in the packed buffer, in buffer order.
// Costs one division per dimension per shard, not per element.
template <typename Fn>
void ForEachRun(const TensorShard& shard, Fn&& fn);

// The per-rank objects and the metadata (see above).
std::string RngObject(uint32_t rank, uint64_t step);
std::string DataloaderObject(uint32_t rank, uint64_t step);
std::string ModelMetadataJson(const ModelShape& shape, const ParallelLayout& layout, uint64_t step);
// The model shape recorded by ModelMetadataJson. InvalidArgument naming the field when the text is
// not such metadata or claims a hidden size or layer count beyond kMaxHidden / kMaxLayers.
Result<ModelShape> ParseModelMetadata(std::string_view metadata_json);
// tp x dp of the job that saved the model, from its metadata (kept by `lifeline reshard` and
// `convert`, so it still names the ranks the per-rank objects belong to); 0 when absent.
uint32_t MetadataWorldSize(std::string_view metadata_json);

// One rank's shards together with their buffers (4096-byte aligned, so direct I/O may use them).
class RankState {
 public:
  // Allocates every shard of `rank`; when `fill`, writes the model's values (for a save), else
  // fills with a pattern that never matches the model's values (a load target).
  // ResourceExhausted when memory runs out.
  static Result<RankState> Build(const std::vector<ModelTensor>& tensors, const ParallelLayout& layout,
                         uint32_t rank, uint64_t step, bool fill);

  const std::vector<TensorShard>& shards() const { return shards_; }
  uint64_t bytes() const { return bytes_; }
  // Sum of CountShardMismatches over the shards.
  uint64_t CountMismatches(uint64_t step) const;

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  std::vector<TensorShard> shards_;
  std::vector<std::unique_ptr<void, FreeDeleter>> buffers_;
  uint64_t bytes_ = 0;
};

// ---- implementation of the template ----

template <typename Fn>
void ForEachRun(const TensorShard& shard, Fn&& fn) {
  const size_t nd = shard.shape.size();
  int64_t begin = shard.flat_begin;
  const int64_t end = shard.flat_end;
  if (begin >= end) return;
  if (nd == 0) {
    fn(uint64_t{0}, int64_t{0}, end - begin);
    return;
  }
  // Global row-major strides.
  std::vector<int64_t> gstride(nd, 1);
  for (size_t k = nd - 1; k > 0; --k) gstride[k - 1] = gstride[k] * shard.global_shape[k];
  // Coordinates inside the box of the first element.
  std::vector<int64_t> coord(nd, 0);
  int64_t rest = begin;
  for (size_t k = nd; k-- > 0;) {
    const int64_t extent = shard.shape[k];
    coord[k] = extent > 0 ? rest % extent : 0;
    rest = extent > 0 ? rest / extent : 0;
  }
  const int64_t row = shard.shape[nd - 1];
  int64_t buffer = 0;
  while (begin < end) {
    uint64_t global = 0;
    for (size_t k = 0; k < nd; ++k) global += static_cast<uint64_t>((shard.offsets[k] + coord[k]) * gstride[k]);
    const int64_t n = std::min<int64_t>(row - coord[nd - 1], end - begin);
    fn(global, buffer, n);
    buffer += n;
    begin += n;
    // Advance to the start of the next row of the box.
    coord[nd - 1] = 0;
    for (size_t k = nd - 1; k > 0; --k) {
      if (++coord[k - 1] < shard.shape[k - 1]) break;
      coord[k - 1] = 0;
    }
  }
}

}  // namespace lifeline

#endif  // LIFELINE_INTERNAL_SYNTHETIC_MODEL_H_
