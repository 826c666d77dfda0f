#include "lib/src/store/checkpoint_layout.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "formats/checksum.h"

namespace lifeline {
namespace {

constexpr char kDataMagic[8] = {'L', 'L', 'D', 'A', 'T', 'A', '0', '1'};
constexpr uint32_t kDataVersion = 1;
constexpr size_t kDataHeaderChecked = 40;

bool ParseDigits(std::string_view s, size_t n, uint64_t* out) {
  if (s.size() != n) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

bool IsHex16(std::string_view s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::string Stem(std::string_view run_hash, uint32_t rank, uint32_t world_size) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), ".r%06u-of-%06u", rank, world_size);
  return std::string(run_hash) + buf;
}

void PutU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }  // little-endian hosts only
void PutU64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t GetU32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t GetU64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

}  // namespace

std::string StepDirName(uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%020" PRIu64, step);
  return buf;
}

std::optional<uint64_t> ParseStepDirName(std::string_view name) {
  if (name.substr(0, 5) != "step-") return std::nullopt;
  uint64_t step;
  if (!ParseDigits(name.substr(5), 20, &step)) return std::nullopt;
  return step;
}

std::string RunHash(std::string_view run_id) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, format::Checksum64(run_id));
  return buf;
}

std::string RunIdFromEnvironment() {
  auto get = [](const char* k) -> std::string {
    const char* v = std::getenv(k);
    return v ? v : "";
  };
  if (!get("LIFELINE_LAUNCH_ID").empty()) return "lifeline:" + get("LIFELINE_LAUNCH_ID");
  if (!get("LIFELINE_JOB").empty()) return "lifeline:" + get("LIFELINE_JOB") + ":" + get("LIFELINE_RESTART");
  // torchrun's default rendezvous id "none" is the same for every launch: no id at all.
  const std::string torch_id = get("TORCHELASTIC_RUN_ID");
  if (!torch_id.empty() && torch_id != "none") return "torchelastic:" + torch_id + ":" + get("TORCHELASTIC_RESTART_COUNT");
  return "";
}

std::string DataFileName(std::string_view run_hash, uint32_t rank, uint32_t world_size) {
  return Stem(run_hash, rank, world_size) + ".data";
}

std::string IndexFileName(std::string_view run_hash, uint32_t rank, uint32_t world_size) {
  return Stem(run_hash, rank, world_size) + ".index";
}

namespace {

std::string AttemptFileName(std::string_view run_hash, uint32_t world_size, std::string_view suffix) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), ".of-%06u", world_size);
  return std::string(run_hash) + buf + std::string(suffix);
}

// H(16) ".of-" W(6) suffix
std::optional<RankFileName> ParseAttemptFileName(std::string_view name, std::string_view suffix) {
  if (name.size() != 16 + 4 + 6 + suffix.size()) return std::nullopt;
  if (!IsHex16(name.substr(0, 16)) || name.substr(16, 4) != ".of-" || name.substr(26) != suffix) return std::nullopt;
  uint64_t world;
  if (!ParseDigits(name.substr(20, 6), 6, &world) || world == 0) return std::nullopt;
  return RankFileName{std::string(name.substr(0, 16)), 0, static_cast<uint32_t>(world)};
}

constexpr std::string_view kManifestSuffix = ".manifest";
constexpr std::string_view kInvalidSuffix = ".invalid";

}  // namespace

std::string ManifestFileName(std::string_view run_hash, uint32_t world_size) {
  return AttemptFileName(run_hash, world_size, kManifestSuffix);
}

std::string InvalidMarkerFileName(std::string_view run_hash, uint32_t world_size) {
  return AttemptFileName(run_hash, world_size, kInvalidSuffix);
}

std::optional<RankFileName> ParseIndexFileName(std::string_view name) {
  // H(16) ".r" R(6) "-of-" W(6) ".index"
  constexpr std::string_view kSuffix = ".index";
  if (name.size() != 16 + 2 + 6 + 4 + 6 + kSuffix.size()) return std::nullopt;
  if (!IsHex16(name.substr(0, 16)) || name.substr(16, 2) != ".r" || name.substr(24, 4) != "-of-" ||
      name.substr(34) != kSuffix)
    return std::nullopt;
  uint64_t rank, world;
  if (!ParseDigits(name.substr(18, 6), 6, &rank) || !ParseDigits(name.substr(28, 6), 6, &world)) return std::nullopt;
  if (world == 0 || rank >= world) return std::nullopt;
  return RankFileName{std::string(name.substr(0, 16)), static_cast<uint32_t>(rank), static_cast<uint32_t>(world)};
}

std::optional<RankFileName> ParseManifestFileName(std::string_view name) {
  return ParseAttemptFileName(name, kManifestSuffix);
}

std::optional<RankFileName> ParseInvalidMarkerFileName(std::string_view name) {
  return ParseAttemptFileName(name, kInvalidSuffix);
}

bool IsTempFileName(std::string_view name) { return name.find(".tmp-") != std::string_view::npos; }

void EncodeDataHeader(uint32_t rank, uint32_t world_size, uint64_t step, std::string_view run_hash,
                      uint8_t* block) {
  std::memset(block, 0, kDataHeaderBytes);
  std::memcpy(block, kDataMagic, 8);
  PutU32(block + 8, kDataVersion);
  PutU32(block + 12, rank);
  PutU32(block + 16, world_size);
  PutU32(block + 20, 0);
  PutU64(block + 24, step);
  PutU64(block + 32, std::strtoull(std::string(run_hash).c_str(), nullptr, 16));
  PutU64(block + kDataHeaderChecked, format::Checksum64(block, kDataHeaderChecked));
}

Status CheckDataHeader(const uint8_t* block, uint32_t rank, uint32_t world_size, uint64_t step,
                       std::string_view run_hash, std::string_view path) {
  if (std::memcmp(block, kDataMagic, 8) != 0) return Status::Corruption(path, "data file header: bad magic");
  if (GetU64(block + kDataHeaderChecked) != format::Checksum64(block, kDataHeaderChecked))
    return Status::Corruption(path, "data file header: checksum mismatch at offset 0");
  if (GetU32(block + 8) != kDataVersion)  // intact but newer: not ours to call damaged
    return Status::NotSupported(path, "data file format version " + std::to_string(GetU32(block + 8)) +
                                          " is newer than this reader's " + std::to_string(kDataVersion));
  const uint64_t hash = std::strtoull(std::string(run_hash).c_str(), nullptr, 16);
  if (GetU32(block + 12) != rank || GetU32(block + 16) != world_size || GetU64(block + 24) != step ||
      GetU64(block + 32) != hash)
    return Status::Corruption(path, "data file header names another rank, step or save attempt than its index");
  // The checksum covers only the fields; the rest of the block must be zero, so that no byte of
  // the header can change unnoticed.
  for (size_t i = kDataHeaderChecked + 8; i < kDataHeaderBytes; ++i)
    if (block[i] != 0)
      return Status::Corruption(path, "data file header: nonzero byte at offset " + std::to_string(i) +
                                          " (bytes 48 to 4095 must be zero)");
  return Status::OK();
}

}  // namespace lifeline
