// lifeline bench compress: what the chunk codecs (formats/codec.h) do to weights. Draws --bytes
// of normal(0, --sigma) values, the shape trained weights have, as bf16 and as f32, and encodes
// them in 4 MiB chunks as the writer does, with plain zstd and with byte grouping at the same
// level, in the same run. Every decoded chunk is compared with the original.
//
// --json fields: bytes, level, sigma, chunk_bytes, threads (1), and "results", one per dtype and
// codec: dtype, codec, ratio (raw / stored bytes), compress_gbps and decompress_gbps (raw bytes /
// seconds / 1e9, codec calls only), ratio_vs_plain (ratio / the plain zstd ratio of that dtype);
// the byte-grouping rows add group_gbps and ungroup_gbps, the transform alone.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "formats/codec.h"
#include "lifeline/dtype.h"
#include "tools/lifeline/bench/bench.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

constexpr uint64_t kChunkBytes = 4ull << 20;  // the writer's default chunk

struct CompressBenchOptions {
  std::string bytes = "256MiB";
  int level = 1;
  std::string dtype = "all";
  double sigma = 0.02;
  bool json = false;
};

struct CodecRun {
  std::string dtype;
  format::Codec codec;
  double ratio = 0;
  double compress_gbps = 0;
  double decompress_gbps = 0;
  double ratio_vs_plain = 0;
  double group_gbps = 0;  // byte grouping only
  double ungroup_gbps = 0;
};


// n normal(0, sigma) values as little-endian bf16 (rounded to nearest even, as frameworks do) or
// f32, from a fixed seed.
void FillNormal(DType dtype, double sigma, uint8_t* out, size_t n) {
  std::mt19937 rng(20240501);
  std::normal_distribution<float> normal(0.0f, static_cast<float>(sigma));
  for (size_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if (dtype == DType::kBF16) {
      const uint16_t h = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
      std::memcpy(out + i * 2, &h, 2);
    } else {
      std::memcpy(out + i * 4, &u, 4);
    }
  }
}

// Encodes `raw` chunk by chunk, then decodes every chunk and compares it with the original.
Result<CodecRun> MeasureCodec(format::ChunkCodec& codec, format::Codec c, DType dtype, int level,
                              const std::vector<uint8_t>& raw, std::vector<uint8_t>& stored,
                              std::vector<uint8_t>& decoded) {
  const size_t elem = DTypeSize(dtype);
  const size_t bound = format::ChunkCodec::MaxEncodedSize(c, kChunkBytes);
  std::vector<size_t> lengths;
  size_t at = 0;
  double encode_seconds = 0;
  for (size_t off = 0; off < raw.size(); off += kChunkBytes) {
    const size_t n = std::min<size_t>(kChunkBytes, raw.size() - off);
    const double t0 = NowSeconds();
    Result<size_t> len = codec.Encode(c, elem, level, raw.data() + off, n, stored.data() + at, bound);
    encode_seconds += NowSeconds() - t0;
    if (!len.ok()) return len.status().Annotate(format::CodecName(c) + " chunk at raw offset " + std::to_string(off));
    lengths.push_back(*len);
    at += *len;
  }
  const uint64_t stored_total = at;
  at = 0;
  double decode_seconds = 0;
  for (size_t k = 0; k < lengths.size(); ++k) {
    const size_t off = k * kChunkBytes;
    const size_t n = std::min<size_t>(kChunkBytes, raw.size() - off);
    const std::string what = format::CodecName(c) + " chunk " + std::to_string(k);
    const double t0 = NowSeconds();
    Status s = codec.Decode(c, elem, stored.data() + at, lengths[k], decoded.data(), n, what);
    decode_seconds += NowSeconds() - t0;
    if (!s.ok()) return s;
    if (std::memcmp(decoded.data(), raw.data() + off, n) != 0)
      return Status::Corruption(what, "decodes to other bytes than were encoded");
    at += lengths[k];
  }
  CodecRun run;
  run.dtype = DTypeName(dtype);
  run.codec = c;
  run.ratio = stored_total > 0 ? static_cast<double>(raw.size()) / static_cast<double>(stored_total) : 0;
  run.compress_gbps = Gbps(raw.size(), encode_seconds);
  run.decompress_gbps = Gbps(raw.size(), decode_seconds);
  if (c == format::Codec::kZstdByteGroup) {
    double group_seconds = 0, ungroup_seconds = 0;
    for (size_t off = 0; off < raw.size(); off += kChunkBytes) {
      const size_t n = std::min<size_t>(kChunkBytes, raw.size() - off);
      const double t0 = NowSeconds();
      format::GroupBytes(elem, raw.data() + off, n, stored.data());
      const double t1 = NowSeconds();
      format::UngroupBytes(elem, stored.data(), n, decoded.data());
      ungroup_seconds += NowSeconds() - t1;
      group_seconds += t1 - t0;
      if (std::memcmp(decoded.data(), raw.data() + off, n) != 0)
        return Status::Corruption("byte grouping", "does not invert at raw offset " + std::to_string(off));
    }
    run.group_gbps = Gbps(raw.size(), group_seconds);
    run.ungroup_gbps = Gbps(raw.size(), ungroup_seconds);
  }
  return run;
}

int RunCompressBench(const CompressBenchOptions& o) {
  const char* kCommand = "bench compress";
  Result<uint64_t> bytes = ParseByteSize(o.bytes);
  if (!bytes.ok()) return ReportFailure(kCommand, bytes.status().Annotate("--bytes"), o.json);
  const uint64_t total = *bytes / 8 * 8;  // whole elements of every dtype
  if (total == 0) return ReportFailure(kCommand, Status::InvalidArgument("--bytes", "must be at least 8 bytes"), o.json);
  std::vector<DType> dtypes;
  if (o.dtype == "bf16" || o.dtype == "all") dtypes.push_back(DType::kBF16);
  if (o.dtype == "f32" || o.dtype == "all") dtypes.push_back(DType::kF32);

  std::vector<uint8_t> raw(total);
  const uint64_t chunks = (total + kChunkBytes - 1) / kChunkBytes;
  std::vector<uint8_t> stored(chunks * format::ChunkCodec::MaxEncodedSize(format::Codec::kZstd, kChunkBytes));
  std::vector<uint8_t> decoded(kChunkBytes);
  format::ChunkCodec codec;
  std::vector<CodecRun> runs;
  for (DType dtype : dtypes) {
    FillNormal(dtype, o.sigma, raw.data(), total / DTypeSize(dtype));
    double plain_ratio = 0;
    for (format::Codec c : {format::Codec::kZstd, format::Codec::kZstdByteGroup}) {
      Result<CodecRun> run = MeasureCodec(codec, c, dtype, o.level, raw, stored, decoded);
      if (!run.ok()) return ReportFailure(kCommand, run.status(), o.json);
      if (c == format::Codec::kZstd) plain_ratio = run->ratio;
      run->ratio_vs_plain = plain_ratio > 0 ? run->ratio / plain_ratio : 0;
      runs.push_back(*run);
    }
  }

  if (o.json) {
    nlohmann::json results = nlohmann::json::array();
    for (const CodecRun& r : runs) {
      nlohmann::json j = {{"dtype", r.dtype},
                          {"codec", format::CodecName(r.codec)},
                          {"ratio", r.ratio},
                          {"compress_gbps", r.compress_gbps},
                          {"decompress_gbps", r.decompress_gbps},
                          {"ratio_vs_plain", r.ratio_vs_plain}};
      if (r.codec == format::Codec::kZstdByteGroup) {
        j["group_gbps"] = r.group_gbps;
        j["ungroup_gbps"] = r.ungroup_gbps;
      }
      results.push_back(std::move(j));
    }
    PrintJson({{"ok", true},
               {"command", kCommand},
               {"bytes", total},
               {"level", o.level},
               {"sigma", o.sigma},
               {"chunk_bytes", kChunkBytes},
               {"threads", 1},
               {"results", std::move(results)}});
    return kExitOk;
  }
  std::printf("%s per dtype of normal(0, %g) weights, zstd level %d, %s chunks, one thread\n",
              FormatByteSize(total).c_str(), o.sigma, o.level, FormatByteSize(kChunkBytes).c_str());
  std::printf("%-6s %-15s %7s %15s %17s %15s\n", "dtype", "codec", "ratio", "compress GB/s", "decompress GB/s",
              "ratio vs plain");
  for (const CodecRun& r : runs)
    std::printf("%-6s %-15s %7.3f %15.2f %17.2f %15.3f\n", r.dtype.c_str(), format::CodecName(r.codec).c_str(), r.ratio,
                r.compress_gbps, r.decompress_gbps, r.ratio_vs_plain);
  for (const CodecRun& r : runs)
    if (r.codec == format::Codec::kZstdByteGroup)
      std::printf("byte grouping alone, %s: %.2f GB/s, ungrouping %.2f GB/s\n", r.dtype.c_str(), r.group_gbps,
                  r.ungroup_gbps);
  return kExitOk;
}

}  // namespace

void AddBenchCompressCommand(CLI::App* bench, std::vector<Command>* commands) {
  auto o = std::make_shared<CompressBenchOptions>();
  CLI::App* app = bench->add_subcommand(
      "compress", "Compression ratio and speed of zstd and byte-grouped zstd on normal bf16/f32 weights");
  app->add_option("--bytes", o->bytes, "Bytes of weights per dtype, e.g. 64MiB (default 256MiB)");
  app->add_option("--level", o->level, "zstd level (default 1)");
  app->add_option("--dtype", o->dtype, "bf16, f32 or all (default all)")->check(CLI::IsMember({"bf16", "f32", "all"}));
  app->add_option("--sigma", o->sigma, "Standard deviation of the weights (default 0.02)")->check(CLI::PositiveNumber);
  app->add_flag("--json", o->json, "Print one JSON object on stdout");
  commands->push_back(Command{app, [o] { return RunCompressBench(*o); }});
}

}  // namespace lifeline::cli
