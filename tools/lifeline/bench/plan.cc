// lifeline bench plan: load planning at scale, no data. It builds in memory the manifest a job of
// --saved-ranks ranks in a TP x PP x DP layout would commit (a GPT-like stack of layers: per layer
// four TP-split matrices and two replicated norms, each with two optimizer states; every TP shard
// written by its DP replicas as near-equal flat ranges, as the library splits replicas), with
// enough layers for about --fragments fragments, then plans the load of every rank of another
// layout (--load-ranks): a rank loads the TP shards of its stage's parameters whole and its DP
// part of their optimizer states (ZeRO-1). Timed per rank: the library's planner (PlanLoad,
// lifeline/internal/load_plan.h), and on a sample of ranks the same plans by all-pairs matching (every
// target against every stored fragment), checked equal. It also counts the manifest
// bytes a rank's plan needs at least (its tensors' records and names, the fragment and chunk
// records it reads from), and what a rank reads when it opens the encoded manifest in parts, as
// loads do (formats/SPEC.md §5.5), planning on what it read.
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "formats/geometry.h"
#include "formats/index_codec.h"
#include "lifeline/internal/load_plan.h"
#include "tools/lifeline/bench/bench.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

struct PlanBenchOptions {
  uint32_t saved_ranks = 1024;
  uint32_t load_ranks = 768;
  uint64_t fragments = 1000000;
  std::string layouts;  // "tp8,pp8,dp16:tp4,pp8,dp24"; empty: chosen from the rank counts
  int64_t hidden = 1024;
  uint32_t all_pairs_ranks = 4;
  bool json = false;
};

struct Layout {
  uint32_t tp = 1, pp = 1, dp = 1;
  uint32_t world() const { return tp * pp * dp; }
  std::string ToString() const {
    return "tp" + std::to_string(tp) + ",pp" + std::to_string(pp) + ",dp" + std::to_string(dp);
  }
};

Result<Layout> ParseLayout(const std::string& text) {
  Layout l;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    const auto digits = part.find_first_of("0123456789");
    if (digits == std::string::npos || digits == 0) return Status::InvalidArgument("layout '" + text + "'", "expected tpN,ppN,dpN");
    const std::string key = part.substr(0, digits);
    const uint32_t v = static_cast<uint32_t>(std::stoul(part.substr(digits)));
    if (v == 0) return Status::InvalidArgument("layout '" + text + "'", key + " is 0");
    if (key == "tp") l.tp = v;
    else if (key == "pp") l.pp = v;
    else if (key == "dp") l.dp = v;
    else return Status::InvalidArgument("layout '" + text + "'", "unknown degree '" + key + "'");
  }
  return l;
}

// A layout of `world` ranks: TP 8 (or less), PP 8 (or less), DP the rest.
Layout DefaultLayout(uint32_t world, uint32_t tp_max) {
  Layout l;
  for (l.tp = tp_max; l.tp > 1 && world % l.tp != 0;) l.tp /= 2;
  for (l.pp = 8; l.pp > 1 && (world / l.tp) % l.pp != 0;) l.pp /= 2;
  l.dp = world / (l.tp * l.pp);
  return l;
}

// One tensor of the model: its global shape, the dimension TP splits (-1: replicated over TP),
// and whether it is an optimizer state (loaded by DP part under ZeRO-1).
struct ModelTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int split_dim = -1;
  bool optimizer_state = false;
  uint32_t layer = 0;
};

std::vector<ModelTensorSpec> ModelSpecs(uint32_t layers, int64_t h) {
  struct Base {
    const char* name;
    std::vector<int64_t> shape;
    int split;
  };
  const std::vector<Base> per_layer = {{"attn.qkv", {3 * h, h}, 0}, {"attn.proj", {h, h}, 1},
                                       {"mlp.fc1", {4 * h, h}, 0},  {"mlp.fc2", {h, 4 * h}, 1},
                                       {"ln1", {h}, -1},            {"ln2", {h}, -1}};
  std::vector<ModelTensorSpec> specs;
  for (uint32_t l = 0; l < layers; ++l) {
    for (const Base& b : per_layer) {
      const std::string p = "layers." + std::to_string(l) + "." + b.name;
      specs.push_back({p, b.shape, b.split, false, l});
      specs.push_back({"optim." + p + ".exp_avg", b.shape, b.split, true, l});
      specs.push_back({"optim." + p + ".exp_avg_sq", b.shape, b.split, true, l});
    }
  }
  return specs;
}

// The box of TP shard `tp` of `degree` of a tensor (the whole tensor when it is not split).
void ShardBox(const ModelTensorSpec& s, uint32_t tp, uint32_t degree, std::vector<int64_t>* offsets,
              std::vector<int64_t>* shape) {
  *offsets = std::vector<int64_t>(s.shape.size(), 0);
  *shape = s.shape;
  if (s.split_dim < 0) return;
  const int64_t n = s.shape[s.split_dim];
  const int64_t lo = n * tp / degree, hi = n * (tp + 1) / degree;
  (*offsets)[s.split_dim] = lo;
  (*shape)[s.split_dim] = hi - lo;
}

int64_t Volume(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

// The manifest of a save by layout `l`: rank (pp, tp, dp) = (pp * tp_degree + tp) * dp_degree + dp
// writes its DP part of every TP shard of its stage (a replicated norm: whole, by the first rank
// of its stage).
format::CheckpointIndex SavedManifest(const std::vector<ModelTensorSpec>& specs, uint32_t layers, const Layout& l) {
  format::CheckpointIndex m;
  m.kind = format::IndexKind::kManifest;
  m.rank = format::kManifestRank;
  m.world_size = l.world();
  m.step = 1;
  m.run_id = "bench-plan";
  m.chunk_bytes = 4ull << 20;
  for (uint32_t r = 0; r < l.world(); ++r) m.files.push_back({"r" + std::to_string(r) + ".data", r, 0});
  const uint64_t elems_per_chunk = m.chunk_bytes / 4;
  for (uint32_t t = 0; t < specs.size(); ++t) {
    const ModelTensorSpec& s = specs[t];
    m.tensors.push_back({s.name, DType::kF32, s.shape});
    const uint32_t stage = s.layer * l.pp / layers;
    const uint32_t tp_parts = s.split_dim < 0 ? 1 : l.tp;
    const uint32_t dp_parts = s.split_dim < 0 ? 1 : l.dp;
    for (uint32_t tp = 0; tp < tp_parts; ++tp) {
      std::vector<int64_t> offsets, shape;
      ShardBox(s, tp, l.tp, &offsets, &shape);
      const int64_t n = Volume(shape);
      for (uint32_t dp = 0; dp < dp_parts; ++dp) {
        const uint32_t rank = (stage * l.tp + tp) * l.dp + dp;
        format::FragmentInfo f;
        f.tensor = t;
        f.file = rank;
        f.offset = m.files[rank].size;
        f.region = format::Region{offsets, shape, n * dp / dp_parts, n * (dp + 1) / dp_parts};
        const uint64_t bytes = static_cast<uint64_t>(f.region.num_elements()) * 4;
        f.first_chunk = m.chunks.size();
        f.num_chunks = (static_cast<uint64_t>(f.region.num_elements()) + elems_per_chunk - 1) / elems_per_chunk;
        for (uint64_t k = 0; k < f.num_chunks; ++k)
          m.chunks.push_back({std::min<uint64_t>(m.chunk_bytes, bytes - k * m.chunk_bytes), 0});
        m.files[rank].size += bytes;
        m.fragments.push_back(std::move(f));
      }
    }
  }
  return m;
}

// What load rank `rank` of layout `l` fills, as (tensor, region) pairs.
std::vector<LoadTarget> RankTargets(const std::vector<ModelTensorSpec>& specs, uint32_t layers, const Layout& l,
                                    uint32_t rank, const std::unordered_map<std::string, uint32_t>& tensor_ids) {
  const uint32_t dp = rank % l.dp, tp = (rank / l.dp) % l.tp, stage = rank / (l.dp * l.tp);
  std::vector<LoadTarget> targets;
  for (const ModelTensorSpec& s : specs) {
    if (s.layer * l.pp / layers != stage) continue;
    std::vector<int64_t> offsets, shape;
    ShardBox(s, tp, l.tp, &offsets, &shape);
    const int64_t n = Volume(shape);
    format::Region r{offsets, shape, 0, n};
    if (s.optimizer_state) r = format::Region{offsets, shape, n * dp / l.dp, n * (dp + 1) / l.dp};
    if (r.num_elements() == 0) continue;
    // A rank finds its tensors by name, as a reader does.
    targets.push_back({tensor_ids.at(s.name), std::move(r)});
  }
  return targets;
}

// The same plan by all-pairs matching: every target against every stored fragment (same
// tensor?), then against each chunk of a fragment of its tensor (bounding boxes, then the exact
// overlap of the pair).
std::vector<PlannedCopy> AllPairsPlan(const format::CheckpointIndex& m, const std::vector<LoadTarget>& targets) {
  std::vector<PlannedCopy> copies;
  std::vector<format::Overlap> overlaps;
  std::vector<format::Region> one_source(1), one_target(1);
  for (uint32_t i = 0; i < targets.size(); ++i) {
    const LoadTarget& t = targets[i];
    one_target[0] = t.region;
    const uint64_t per_chunk = m.chunk_bytes / DTypeSize(m.tensors[t.tensor].dtype);
    const format::Box target_box{t.region.offsets, t.region.shape};
    for (const format::FragmentInfo& frag : m.fragments) {
      if (frag.tensor != t.tensor) continue;
      for (uint64_t k = 0; k < frag.num_chunks; ++k) {
        one_source[0] = ChunkRegion(frag, k, per_chunk);
        format::Box both;
        if (!format::Intersect(format::Box{one_source[0].offsets, one_source[0].shape}, target_box, &both)) continue;
        overlaps.clear();
        format::PlanOverlaps(one_source, one_target, &overlaps);
        for (format::Overlap& o : overlaps) copies.push_back({frag.first_chunk + k, i, std::move(o.box)});
      }
    }
  }
  std::stable_sort(copies.begin(), copies.end(),
                   [](const PlannedCopy& a, const PlannedCopy& b) { return a.chunk < b.chunk; });
  return copies;
}

bool SamePlan(std::vector<PlannedCopy> a, std::vector<PlannedCopy> b) {
  auto key = [](const PlannedCopy& c) { return std::tie(c.chunk, c.target, c.box.lo, c.box.extent); };
  auto less = [&](const PlannedCopy& x, const PlannedCopy& y) { return key(x) < key(y); };
  std::sort(a.begin(), a.end(), less);
  std::sort(b.begin(), b.end(), less);
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [&](const PlannedCopy& x, const PlannedCopy& y) {
           return key(x) == key(y);
         });
}

// Manifest bytes a plan needs (records of section 5.2 of formats/SPEC.md): the header, its
// tensors' records, dims and names, and the records of the fragments and chunks it reads.
uint64_t NeededMetadataBytes(const format::CheckpointIndex& m, const std::vector<LoadTarget>& targets,
                             const std::vector<PlannedCopy>& plan) {
  std::vector<bool> tensor(m.tensors.size(), false);
  for (const LoadTarget& t : targets) tensor[t.tensor] = true;
  uint64_t bytes = 208 + 16;  // header and trailer
  for (uint32_t t = 0; t < m.tensors.size(); ++t)
    if (tensor[t]) bytes += 24 + 8 * m.tensors[t].shape.size() + m.tensors[t].name.size();
  uint64_t last_chunk = ~uint64_t{0};
  std::vector<bool> fragment_seen(m.fragments.size(), false);
  for (const PlannedCopy& c : plan) {  // sorted by chunk
    if (c.chunk == last_chunk) continue;
    last_chunk = c.chunk;
    bytes += 16;  // the chunk record
    // Its fragment's record, offsets and shape (the fragments' chunks ascend with them here).
    const auto it = std::upper_bound(m.fragments.begin(), m.fragments.end(), c.chunk,
                                     [](uint64_t chunk, const format::FragmentInfo& f) { return chunk < f.first_chunk; });
    const size_t f = static_cast<size_t>(it - m.fragments.begin()) - 1;
    if (!fragment_seen[f]) {
      fragment_seen[f] = true;
      bytes += 64 + 16 * m.tensors[m.fragments[f].tensor].shape.size();
    }
  }
  return bytes;
}

// What one loading rank does with a manifest read in parts (formats/SPEC.md §5.5): open it (header,
// directory, head), fetch its tensors' fragments, plan on that. The plan is checked against the
// one made on the whole manifest, chunk numbers mapped back (a partial index numbers its chunks
// in the order it fetched them).
struct PartialPlan {
  bool ok = false;
  bool equal = false;
  uint64_t bytes_read = 0;
  double ms = 0;
  Status status;
};

// A fragment's place in its data file, which no other fragment shares: (file, byte offset).
uint64_t PlaceKey(const format::FragmentInfo& f) { return (uint64_t{f.file} << 44) ^ f.offset; }

PartialPlan PlanFromParts(const std::string& encoded, const format::CheckpointIndex& m,
                          const std::unordered_map<uint64_t, uint64_t>& fragment_at,
                          const std::vector<LoadTarget>& targets, const std::vector<PlannedCopy>& whole_plan) {
  PartialPlan out;
  auto read = [&encoded](uint64_t offset, uint64_t length, char* dst) -> Status {
    if (offset > encoded.size() || length > encoded.size() - offset) return Status::IOError("read past the end");
    std::memcpy(dst, encoded.data() + offset, length);
    return Status::OK();
  };
  const double t0 = NowSeconds();
  Result<std::unique_ptr<format::ManifestPartReader>> parts =
      format::ManifestPartReader::Open(read, encoded.size(), "bench manifest");
  if (!parts.ok() || *parts == nullptr) {
    out.status = parts.ok() ? Status::FailedPrecondition("bench manifest", "written without a directory") : parts.status();
    return out;
  }
  format::CheckpointIndex part = (*parts)->head();
  std::vector<format::ManifestPartReader::TensorBox> wanted;
  for (const LoadTarget& t : targets) wanted.push_back({t.tensor, format::Box{t.region.offsets, t.region.shape}});
  out.status = (*parts)->AddFragments(wanted, &part);
  if (!out.status.ok()) return out;
  Result<std::vector<PlannedCopy>> plan = PlanLoad(part, targets, "bench plan");
  out.ms = (NowSeconds() - t0) * 1e3;
  out.bytes_read = (*parts)->bytes_read();
  if (!plan.ok()) {
    out.status = plan.status();
    return out;
  }
  out.ok = true;
  std::vector<uint64_t> chunk_in_whole(part.chunks.size());
  for (const format::FragmentInfo& f : part.fragments) {
    const format::FragmentInfo& whole = m.fragments[fragment_at.at(PlaceKey(f))];
    for (uint64_t k = 0; k < f.num_chunks; ++k) chunk_in_whole[f.first_chunk + k] = whole.first_chunk + k;
  }
  for (PlannedCopy& c : *plan) c.chunk = chunk_in_whole[c.chunk];
  out.equal = SamePlan(std::move(*plan), whole_plan);
  return out;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())) - 1));
  return v[i];
}

uint64_t MaxRssBytes() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

int RunPlanBench(const PlanBenchOptions& o) {
  const char* kCommand = "bench plan";
  Layout saved = DefaultLayout(o.saved_ranks, 8), load = DefaultLayout(o.load_ranks, 4);
  if (!o.layouts.empty()) {
    const auto colon = o.layouts.find(':');
    if (colon == std::string::npos)
      return ReportFailure(kCommand, Status::InvalidArgument("--layouts '" + o.layouts + "'", "expected SAVED:LOAD"), o.json);
    Result<Layout> s = ParseLayout(o.layouts.substr(0, colon)), l = ParseLayout(o.layouts.substr(colon + 1));
    if (!s.ok()) return ReportFailure(kCommand, s.status(), o.json);
    if (!l.ok()) return ReportFailure(kCommand, l.status(), o.json);
    saved = *s;
    load = *l;
  }
  if (saved.world() != o.saved_ranks || load.world() != o.load_ranks)
    return ReportFailure(kCommand,
                         Status::InvalidArgument("--layouts " + saved.ToString() + ":" + load.ToString(),
                                                 "does not have --saved-ranks " + std::to_string(o.saved_ranks) +
                                                     " and --load-ranks " + std::to_string(o.load_ranks)),
                         o.json);
  if (o.hidden < 64 || o.hidden % std::max(saved.tp, load.tp) != 0)
    return ReportFailure(kCommand, Status::InvalidArgument("--hidden", "must be at least 64 and divisible by TP"), o.json);
  // Layers: enough for the fragments asked, a multiple of both pipelines' depths.
  const uint64_t per_layer = 3 * (4ull * saved.tp * saved.dp + 2);
  const uint32_t pp = std::max(saved.pp, load.pp);
  uint32_t layers = static_cast<uint32_t>(std::max<uint64_t>(1, (o.fragments + per_layer - 1) / per_layer));
  layers = (layers + pp - 1) / pp * pp;

  const uint64_t rss0 = MaxRssBytes();
  const double b0 = NowSeconds();
  const std::vector<ModelTensorSpec> specs = ModelSpecs(layers, o.hidden);
  const format::CheckpointIndex m = SavedManifest(specs, layers, saved);
  const double build_seconds = NowSeconds() - b0;
  Result<std::string> encoded = format::EncodeIndex(m);
  if (!encoded.ok()) return ReportFailure(kCommand, encoded.status(), o.json);
  const uint64_t manifest_bytes = encoded->size();
  std::unordered_map<std::string, uint32_t> tensor_ids;
  for (uint32_t t = 0; t < m.tensors.size(); ++t) tensor_ids.emplace(m.tensors[t].name, t);
  std::unordered_map<uint64_t, uint64_t> fragment_at;
  fragment_at.reserve(m.fragments.size());
  for (uint64_t f = 0; f < m.fragments.size(); ++f) fragment_at.emplace(PlaceKey(m.fragments[f]), f);
  std::vector<double> part_ms, part_bytes;
  bool parts_equal = true;

  std::vector<double> plan_ms, all_pairs_ms, sampled_plan_ms;
  std::vector<double> needed_bytes;
  uint64_t copies_total = 0, plan_bytes_max = 0;
  bool all_equal = true;
  const uint32_t sample_every = o.all_pairs_ranks == 0 ? 0 : std::max<uint32_t>(1, load.world() / o.all_pairs_ranks);
  for (uint32_t r = 0; r < load.world(); ++r) {
    const std::vector<LoadTarget> targets = RankTargets(specs, layers, load, r, tensor_ids);
    const double t0 = NowSeconds();
    Result<std::vector<PlannedCopy>> plan = PlanLoad(m, targets, "bench plan");
    const double ms = (NowSeconds() - t0) * 1e3;
    if (!plan.ok()) return ReportFailure(kCommand, plan.status().Annotate("rank " + std::to_string(r)), o.json);
    plan_ms.push_back(ms);
    copies_total += plan->size();
    plan_bytes_max = std::max<uint64_t>(plan_bytes_max, plan->size() * sizeof(PlannedCopy));
    needed_bytes.push_back(static_cast<double>(NeededMetadataBytes(m, targets, *plan)));
    const PartialPlan partial = PlanFromParts(*encoded, m, fragment_at, targets, *plan);
    if (!partial.ok)
      return ReportFailure(kCommand, partial.status.Annotate("rank " + std::to_string(r) + " reading in parts"), o.json);
    part_ms.push_back(partial.ms);
    part_bytes.push_back(static_cast<double>(partial.bytes_read));
    parts_equal = parts_equal && partial.equal;
    if (sample_every != 0 && r % sample_every == 0) {
      const double a0 = NowSeconds();
      const std::vector<PlannedCopy> pairs = AllPairsPlan(m, targets);
      all_pairs_ms.push_back((NowSeconds() - a0) * 1e3);
      sampled_plan_ms.push_back(ms);
      all_equal = all_equal && SamePlan(*plan, pairs);
    }
  }
  const double sampled_plan = std::accumulate(sampled_plan_ms.begin(), sampled_plan_ms.end(), 0.0);
  const double sampled_pairs = std::accumulate(all_pairs_ms.begin(), all_pairs_ms.end(), 0.0);
  const double speedup = sampled_plan > 0 ? sampled_pairs / sampled_plan : 0;
  const uint64_t rss = MaxRssBytes();
  const double needed_p50 = Percentile(needed_bytes, 0.5), needed_max = Percentile(needed_bytes, 1.0);
  const double read_p50 = Percentile(part_bytes, 0.5), read_max = Percentile(part_bytes, 1.0);
  all_equal = all_equal && parts_equal;
  if (o.json) {
    PrintJson({{"ok", all_equal},
               {"command", kCommand},
               {"saved_layout", saved.ToString()},
               {"load_layout", load.ToString()},
               {"saved_ranks", saved.world()},
               {"load_ranks", load.world()},
               {"layers", layers},
               {"hidden", o.hidden},
               {"tensors", m.tensors.size()},
               {"fragments", m.fragments.size()},
               {"chunks", m.chunks.size()},
               {"manifest_bytes", manifest_bytes},
               {"build_seconds", build_seconds},
               {"plan_ms_p50", Percentile(plan_ms, 0.5)},
               {"plan_ms_p99", Percentile(plan_ms, 0.99)},
               {"plan_ms_max", Percentile(plan_ms, 1.0)},
               {"copies_per_rank", static_cast<double>(copies_total) / load.world()},
               {"plan_bytes_max", plan_bytes_max},
               {"peak_rss_bytes", rss},
               {"rss_growth_bytes", rss - rss0},
               {"all_pairs_ranks", all_pairs_ms.size()},
               {"all_pairs_ms_p50", Percentile(all_pairs_ms, 0.5)},
               {"speedup_vs_all_pairs", speedup},
               {"plans_equal", all_equal},
               {"needed_metadata_bytes_p50", needed_p50},
               {"needed_metadata_bytes_max", needed_max},
               {"needed_metadata_fraction_p50", needed_p50 / static_cast<double>(manifest_bytes)},
               {"manifest_read_bytes_p50", read_p50},
               {"manifest_read_bytes_max", read_max},
               {"manifest_read_fraction_p50", read_p50 / static_cast<double>(manifest_bytes)},
               {"read_and_plan_ms_p50", Percentile(part_ms, 0.5)},
               {"read_and_plan_ms_p99", Percentile(part_ms, 0.99)},
               {"plans_from_parts_equal", parts_equal}});
  } else {
    std::cout << "saved by " << saved.world() << " ranks (" << saved.ToString() << "), loaded by " << load.world()
              << " ranks (" << load.ToString() << "): " << layers << " layers, " << m.tensors.size() << " tensors, "
              << m.fragments.size() << " fragments, " << m.chunks.size() << " chunks, manifest of "
              << FormatByteSize(manifest_bytes) << "\n"
              << "  plan per rank       p50 " << Fixed(Percentile(plan_ms, 0.5), 2) << " ms, p99 "
              << Fixed(Percentile(plan_ms, 0.99), 2) << " ms, max " << Fixed(Percentile(plan_ms, 1.0), 2) << " ms ("
              << Fixed(static_cast<double>(copies_total) / load.world(), 0) << " copies per rank)\n"
              << "  all-pairs matching  p50 " << Fixed(Percentile(all_pairs_ms, 0.5), 2) << " ms on "
              << all_pairs_ms.size() << " ranks: the planner is " << Fixed(speedup, 1) << "x faster; plans "
              << (all_equal ? "equal" : "DIFFER") << "\n"
              << "  metadata a rank needs  p50 " << FormatByteSize(static_cast<uint64_t>(needed_p50)) << " ("
              << Fixed(100.0 * needed_p50 / static_cast<double>(manifest_bytes), 2) << "% of the manifest)\n"
              << "  manifest read in parts  p50 " << FormatByteSize(static_cast<uint64_t>(read_p50)) << " ("
              << Fixed(100.0 * read_p50 / static_cast<double>(manifest_bytes), 2) << "%), max "
              << FormatByteSize(static_cast<uint64_t>(read_max)) << "; read and plan p50 "
              << Fixed(Percentile(part_ms, 0.5), 2) << " ms, p99 " << Fixed(Percentile(part_ms, 0.99), 2)
              << " ms; plans " << (parts_equal ? "equal" : "DIFFER") << "\n"
              << "  memory              peak RSS " << FormatByteSize(rss) << "\n";
  }
  if (!all_equal) {
    std::cerr << "lifeline " << kCommand << ": plans disagree (planner, all-pairs matching, manifest read in parts)\n";
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace

void AddBenchPlanCommand(CLI::App* bench, std::vector<Command>* commands) {
  auto o = std::make_shared<PlanBenchOptions>();
  CLI::App* app = bench->add_subcommand("plan", "Plan the loads of a large job's checkpoint in another layout (no data)");
  app->add_option("--saved-ranks", o->saved_ranks, "Ranks that saved (default 1024)")->check(CLI::PositiveNumber);
  app->add_option("--load-ranks", o->load_ranks, "Ranks that load (default 768)")->check(CLI::PositiveNumber);
  app->add_option("--fragments", o->fragments, "About this many fragments (default 1000000)")->check(CLI::PositiveNumber);
  app->add_option("--layouts", o->layouts,
                  "SAVED:LOAD degrees, e.g. tp8,pp8,dp16:tp4,pp8,dp24 (default: TP 8 / 4, PP 8, DP the rest)");
  app->add_option("--hidden", o->hidden, "Hidden size of the synthetic model (default 1024)");
  app->add_option("--all-pairs-ranks", o->all_pairs_ranks, "Ranks also planned by all-pairs matching (default 4)");
  app->add_flag("--json", o->json, "Print one JSON object on stdout");
  commands->push_back(Command{app, [o] { return RunPlanBench(*o); }});
}

}  // namespace lifeline::cli
