#include "lifeline/internal/synthetic_model.h"

#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "formats/checksum.h"

namespace lifeline {
namespace {

constexpr size_t kBufferAlignment = 4096;

// Bit patterns of k / 4 for k = -127..127, indexed by k + 127 (= m mod 255).
struct FloatTables {
  std::array<uint64_t, 255> f64;
  std::array<uint32_t, 255> f32;
  std::array<uint16_t, 255> f16;
  std::array<uint16_t, 255> bf16;
};

// Exact for values representable as normal f16 (all k / 4 above are).
uint16_t F32ToF16Exact(float f) {
  const uint32_t b = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  if ((b & 0x7FFFFFFFu) == 0) return sign;
  const int32_t exponent = static_cast<int32_t>((b >> 23) & 0xFFu) - 127 + 15;
  const uint32_t mantissa = (b & 0x7FFFFFu) >> 13;
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exponent) << 10) | mantissa);
}

const FloatTables& Tables() {
  static const FloatTables tables = [] {
    FloatTables t;
    for (int j = 0; j < 255; ++j) {
      const double v = (j - 127) / 4.0;
      const float f = static_cast<float>(v);
      t.f64[j] = std::bit_cast<uint64_t>(v);
      t.f32[j] = std::bit_cast<uint32_t>(f);
      t.f16[j] = F32ToF16Exact(f);
      t.bf16[j] = static_cast<uint16_t>(t.f32[j] >> 16);
    }
    return t;
  }();
  return tables;
}

// Applies `map` to the m of every element and writes (or compares) the result. Kept as simple
// loops over consecutive indexes: the compiler turns m % 255 into a multiply.
template <typename T, typename Map>
void GenerateRun(uint64_t seed, uint64_t first, int64_t n, T* out, Map map) {
  uint64_t x = seed + first * kIndexStride;
  for (int64_t j = 0; j < n; ++j, x += kIndexStride) out[j] = map(Mix64(x));
}

template <typename T, typename Map>
uint64_t CompareRun(uint64_t seed, uint64_t first, int64_t n, const T* in, Map map) {
  uint64_t x = seed + first * kIndexStride;
  uint64_t bad = 0;
  for (int64_t j = 0; j < n; ++j, x += kIndexStride) bad += (in[j] != map(Mix64(x)));
  return bad;
}

// Dispatches on dtype to `op(element_pointer_type_tag, map)`.
template <typename Op>
auto WithValueMap(DType dtype, Op&& op) {
  const FloatTables& t = Tables();
  switch (dtype) {
    case DType::kF64: return op(uint64_t{}, [&t](uint64_t m) { return t.f64[m % 255]; });
    case DType::kF32: return op(uint32_t{}, [&t](uint64_t m) { return t.f32[m % 255]; });
    case DType::kF16: return op(uint16_t{}, [&t](uint64_t m) { return t.f16[m % 255]; });
    case DType::kBF16: return op(uint16_t{}, [&t](uint64_t m) { return t.bf16[m % 255]; });
    case DType::kI64: return op(uint64_t{}, [](uint64_t m) { return m; });
    case DType::kI32: return op(uint32_t{}, [](uint64_t m) { return static_cast<uint32_t>(m); });
    case DType::kI16: return op(uint16_t{}, [](uint64_t m) { return static_cast<uint16_t>(m); });
    case DType::kBool: return op(uint8_t{}, [](uint64_t m) { return static_cast<uint8_t>(m & 1); });
    case DType::kI8:
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E5M2: break;
  }
  return op(uint8_t{}, [](uint64_t m) { return static_cast<uint8_t>(m); });
}

void AddTensor(std::vector<ModelTensor>* out, std::string name, DType dtype, std::vector<int64_t> shape,
               Placement placement) {
  ModelTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.placement = placement;
  out->push_back(std::move(t));
}

// The tensor-parallel box of rank t along `dim`.
void TensorParallelBox(const std::vector<int64_t>& shape, int dim, uint32_t tp, uint32_t t,
                       std::vector<int64_t>* offsets, std::vector<int64_t>* box) {
  *offsets = std::vector<int64_t>(shape.size(), 0);
  *box = shape;
  const auto [b, e] = EvenSplit(shape[dim], tp, t);
  (*offsets)[dim] = b;
  (*box)[dim] = e - b;
}

int64_t Volume(const std::vector<int64_t>& shape) {
  int64_t v = 1;
  for (int64_t x : shape) v *= x;
  return v;
}

}  // namespace

uint64_t ModelTensor::num_bytes() const { return static_cast<uint64_t>(Volume(shape)) * DTypeSize(dtype); }

uint64_t LayerBytes(int64_t hidden) {
  const uint64_t h = static_cast<uint64_t>(hidden);
  return 168 * h * h + 12 * h;
}

uint64_t ModelBytes(const ModelShape& shape) {
  return static_cast<uint64_t>(shape.layers) * LayerBytes(shape.hidden) + DTypeSize(DType::kI64);
}

Result<ModelShape> ChooseModelShape(uint64_t state_bytes, int64_t hidden) {
  if (hidden < 1 || hidden > kMaxHidden)
    return Status::InvalidArgument("hidden size must be 1 to " + std::to_string(kMaxHidden) + ", got " +
                                   std::to_string(hidden));
  ModelShape s;
  s.hidden = hidden;
  while (s.hidden / 2 >= kMinHidden && state_bytes < 2 * LayerBytes(s.hidden)) s.hidden /= 2;
  const uint64_t layer = LayerBytes(s.hidden);
  const uint64_t layers = state_bytes / layer + (state_bytes % layer >= (layer + 1) / 2 ? 1 : 0);
  if (layers > static_cast<uint64_t>(kMaxLayers))
    return Status::InvalidArgument("a model state of " + std::to_string(state_bytes) + " bytes needs " +
                                   std::to_string(layers) + " layers of hidden size " + std::to_string(s.hidden) +
                                   ", more than " + std::to_string(kMaxLayers) + "; raise the hidden size");
  s.layers = std::max<int64_t>(1, static_cast<int64_t>(layers));
  return s;
}

std::vector<ModelTensor> ModelTensors(const ModelShape& shape) {
  const int64_t h = shape.hidden;
  std::vector<ModelTensor> out;
  out.reserve(static_cast<size_t>(shape.layers) * 18 + 1);
  for (int64_t i = 0; i < shape.layers; ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    struct Weight {
      const char* suffix;
      DType dtype;
      std::vector<int64_t> shape;
      int dim;
    };
    const Weight weights[] = {
        {"attn.qkv.weight", DType::kBF16, {3 * h, h}, 0},
        {"attn.proj.weight", DType::kBF16, {h, h}, 1},
        {"mlp.fc1.weight", DType::kF16, {4 * h, h}, 0},
        {"mlp.fc2.weight", DType::kF16, {h, 4 * h}, 1},
    };
    for (const Weight& w : weights) {
      AddTensor(&out, prefix + w.suffix, w.dtype, w.shape,
                w.dim == 0 ? Placement::kTensorParallelDim0 : Placement::kTensorParallelDim1);
    }
    AddTensor(&out, prefix + "norm.weight", DType::kF32, {h}, Placement::kWholeOnEveryRank);
    AddTensor(&out, prefix + "router.tokens", DType::kI64, {h}, Placement::kTensorParallelDim0);
    for (const Weight& w : weights) {
      const Placement p = w.dim == 0 ? Placement::kZeroOverDim0Box : Placement::kZeroOverDim1Box;
      for (const char* state : {".master", ".exp_avg", ".exp_avg_sq"}) {
        AddTensor(&out, "optim." + prefix + w.suffix + state, DType::kF32, w.shape, p);
      }
    }
  }
  AddTensor(&out, kStepTensorName, DType::kI64, {}, Placement::kWholeOnEveryRank);
  return out;
}

uint64_t ModelTensorCount(const ModelShape& shape) { return static_cast<uint64_t>(shape.layers) * 18 + 1; }

Status CheckModelTensors(const ModelShape& shape, const std::vector<ModelTensor>& stored) {
  if (ModelTensorCount(shape) != stored.size())
    return Status::InvalidArgument("metadata field \"layers\" says " + std::to_string(shape.layers) + " layers (" +
                                   std::to_string(ModelTensorCount(shape)) + " tensors), but the checkpoint holds " +
                                   std::to_string(stored.size()) + " tensors");
  std::map<std::string_view, const ModelTensor*> by_name;
  for (const ModelTensor& t : stored) by_name.emplace(t.name, &t);
  for (const ModelTensor& m : ModelTensors(shape)) {
    auto it = by_name.find(m.name);
    if (it == by_name.end())
      return Status::InvalidArgument("metadata field \"layers\" says " + std::to_string(shape.layers) +
                                     " layers, but the checkpoint has no tensor '" + m.name + "'");
    if (it->second->dtype != m.dtype || it->second->shape != m.shape)
      return Status::InvalidArgument("metadata field \"hidden\" is " + std::to_string(shape.hidden) + ", but tensor '" +
                                     m.name + "' is " + std::string(DTypeName(it->second->dtype)) +
                                     nlohmann::json(it->second->shape).dump() + " in the checkpoint, not " +
                                     std::string(DTypeName(m.dtype)) + nlohmann::json(m.shape).dump());
  }
  return Status::OK();
}

std::pair<int64_t, int64_t> EvenSplit(int64_t extent, uint32_t parts, uint32_t index) {
  const int64_t base = extent / parts;
  const int64_t extra = extent % parts;
  const int64_t i = index;
  const int64_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

std::vector<TensorShard> RankShards(const std::vector<ModelTensor>& tensors, const ParallelLayout& layout,
                                    uint32_t rank) {
  const uint32_t n = layout.world_size();
  const uint32_t t = rank % layout.tp;
  const uint32_t d = rank / layout.tp;
  std::vector<TensorShard> out;
  out.reserve(tensors.size());
  std::vector<int64_t> offsets, box;
  for (const ModelTensor& m : tensors) {
    switch (m.placement) {
      case Placement::kWholeOnEveryRank:
        // Box rather than Whole: the same thing, spelled with the offsets explicit.
        out.push_back(TensorShard::Box(m.name, m.dtype, m.shape, std::vector<int64_t>(m.shape.size(), 0),
                                       m.shape, nullptr)
                          .Replica(rank, n));
        break;
      case Placement::kTensorParallelDim0:
      case Placement::kTensorParallelDim1: {
        TensorParallelBox(m.shape, m.placement == Placement::kTensorParallelDim0 ? 0 : 1, layout.tp, t,
                          &offsets, &box);
        if (Volume(box) == 0) break;
        out.push_back(TensorShard::Box(m.name, m.dtype, m.shape, offsets, box, nullptr).Replica(d, layout.dp));
        break;
      }
      case Placement::kZeroOverDim0Box:
      case Placement::kZeroOverDim1Box: {
        TensorParallelBox(m.shape, m.placement == Placement::kZeroOverDim0Box ? 0 : 1, layout.tp, t, &offsets,
                          &box);
        const auto [b, e] = EvenSplit(Volume(box), layout.dp, d);
        if (e == b) break;
        out.push_back(TensorShard::BoxFlat(m.name, m.dtype, m.shape, offsets, box, b, e, nullptr));
        break;
      }
    }
  }
  return out;
}

uint64_t TensorSeed(std::string_view name) { return format::Checksum64(name); }

void GenerateValues(uint64_t seed, DType dtype, uint64_t global_begin, int64_t n, void* dst) {
  WithValueMap(dtype, [&](auto tag, auto map) {
    GenerateRun(seed, global_begin, n, static_cast<decltype(tag)*>(dst), map);
    return 0;
  });
}

uint64_t CountMismatches(uint64_t seed, DType dtype, uint64_t global_begin, int64_t n, const void* src) {
  return WithValueMap(dtype, [&](auto tag, auto map) {
    return CompareRun(seed, global_begin, n, static_cast<const decltype(tag)*>(src), map);
  });
}

void FillShard(const TensorShard& shard, uint64_t step) {
  const size_t elem = DTypeSize(shard.dtype);
  auto* base = static_cast<unsigned char*>(shard.data);
  if (shard.name == kStepTensorName) {
    for (int64_t j = 0; j < shard.num_elements(); ++j) std::memcpy(base + j * elem, &step, elem);
    return;
  }
  const uint64_t seed = TensorSeed(shard.name);
  ForEachRun(shard, [&](uint64_t global, int64_t buffer, int64_t n) {
    GenerateValues(seed, shard.dtype, global, n, base + buffer * static_cast<int64_t>(elem));
  });
}

uint64_t CountShardMismatches(const TensorShard& shard, uint64_t step) {
  const size_t elem = DTypeSize(shard.dtype);
  const auto* base = static_cast<const unsigned char*>(shard.data);
  uint64_t bad = 0;
  if (shard.name == kStepTensorName) {
    for (int64_t j = 0; j < shard.num_elements(); ++j) bad += std::memcmp(base + j * elem, &step, elem) != 0;
    return bad;
  }
  const uint64_t seed = TensorSeed(shard.name);
  ForEachRun(shard, [&](uint64_t global, int64_t buffer, int64_t n) {
    bad += CountMismatches(seed, shard.dtype, global, n, base + buffer * static_cast<int64_t>(elem));
  });
  return bad;
}

std::string RngObject(uint32_t rank, uint64_t step) {
  std::string out(32, '\0');
  for (uint64_t w = 0; w < 4; ++w) {
    const uint64_t v = Mix64(step * kIndexStride + uint64_t{rank} * 4 + w);
    for (int b = 0; b < 8; ++b) out[w * 8 + b] = static_cast<char>((v >> (8 * b)) & 0xFF);
  }
  return out;
}

std::string DataloaderObject(uint32_t rank, uint64_t step) {
  nlohmann::json j = {{"rank", rank}, {"position", step * 1000 + rank}};
  return j.dump();
}

std::string ModelMetadataJson(const ModelShape& shape, const ParallelLayout& layout, uint64_t step) {
  nlohmann::json j = {{"model", kModelName}, {"hidden", shape.hidden}, {"layers", shape.layers},
                      {"tp", layout.tp},     {"dp", layout.dp},         {"step", step}};
  return j.dump();
}

Result<ModelShape> ParseModelMetadata(std::string_view metadata_json) {
  const nlohmann::json j = nlohmann::json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument("checkpoint metadata is not a JSON object; was it saved by `lifeline bench save`?");
  }
  auto model = j.find("model");
  if (model == j.end() || !model->is_string() || model->get<std::string>() != kModelName) {
    return Status::InvalidArgument(std::string("checkpoint metadata does not describe the model \"") + kModelName +
                                   "\"; was it saved by `lifeline bench save`?");
  }
  ModelShape s;
  for (auto [key, field, limit] : {std::tuple{"hidden", &s.hidden, kMaxHidden}, std::tuple{"layers", &s.layers, kMaxLayers}}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 1) {
      return Status::InvalidArgument(std::string("checkpoint metadata lacks a positive integer \"") + key + "\"");
    }
    if (it->get<int64_t>() > limit || (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(limit)))
      return Status::InvalidArgument(std::string("checkpoint metadata field \"") + key + "\" is " + it->dump() +
                                     ", more than the " + std::to_string(limit) + " this tool handles");
    *field = it->get<int64_t>();
  }
  return s;
}

uint32_t MetadataWorldSize(std::string_view metadata_json) {
  const nlohmann::json j = nlohmann::json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return 0;
  auto tp = j.find("tp"), dp = j.find("dp");
  if (tp == j.end() || dp == j.end() || !tp->is_number_unsigned() || !dp->is_number_unsigned()) return 0;
  const uint64_t w = tp->get<uint64_t>() * dp->get<uint64_t>();
  return w >= 1 && w <= (1u << 20) ? static_cast<uint32_t>(w) : 0;
}

Result<RankState> RankState::Build(const std::vector<ModelTensor>& tensors, const ParallelLayout& layout,
                                   uint32_t rank, uint64_t step, bool fill) {
  RankState state;
  state.shards_ = RankShards(tensors, layout, rank);
  state.buffers_.reserve(state.shards_.size());
  for (TensorShard& shard : state.shards_) {
    const uint64_t n = shard.num_bytes();
    const size_t rounded = static_cast<size_t>((n + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment);
    void* p = std::aligned_alloc(kBufferAlignment, rounded == 0 ? kBufferAlignment : rounded);
    if (p == nullptr) {
      return Status::ResourceExhausted("rank " + std::to_string(rank) + ": cannot allocate " +
                                       std::to_string(rounded) + " bytes for " + shard.name);
    }
    state.buffers_.emplace_back(p);
    shard.data = p;
    state.bytes_ += n;
    if (fill) {
      FillShard(shard, step);
    } else {
      // 0xFF bytes are NaN in every float type: no element of the model's dtypes can match by
      // chance except an i64 equal to -1 (probability 2^-64 per element).
      std::memset(p, 0xFF, n);
    }
  }
  return state;
}

uint64_t RankState::CountMismatches(uint64_t step) const {
  uint64_t bad = 0;
  for (const TensorShard& shard : shards_) bad += CountShardMismatches(shard, step);
  return bad;
}

void RankState::FreeDeleter::operator()(void* p) const { std::free(p); }

Result<ParallelLayout> ResolveLayout(uint32_t ranks, uint32_t tp, uint32_t dp) {
  if (ranks == 0) return Status::InvalidArgument("--ranks must be at least 1");
  ParallelLayout l;
  if (tp == 0 && dp == 0) {
    l.tp = ranks;
    l.dp = 1;
  } else if (dp == 0) {
    if (ranks % tp != 0) {
      return Status::InvalidArgument("--tp " + std::to_string(tp) + " does not divide --ranks " + std::to_string(ranks));
    }
    l.tp = tp;
    l.dp = ranks / tp;
  } else if (tp == 0) {
    if (ranks % dp != 0) {
      return Status::InvalidArgument("--dp " + std::to_string(dp) + " does not divide --ranks " + std::to_string(ranks));
    }
    l.dp = dp;
    l.tp = ranks / dp;
  } else {
    l.tp = tp;
    l.dp = dp;
  }
  if (uint64_t{l.tp} * l.dp != ranks) {
    return Status::InvalidArgument("--tp " + std::to_string(l.tp) + " x --dp " + std::to_string(l.dp) + " = " +
                                   std::to_string(uint64_t{l.tp} * l.dp) + " ranks, but --ranks is " +
                                   std::to_string(ranks));
  }
  return l;
}

}  // namespace lifeline
