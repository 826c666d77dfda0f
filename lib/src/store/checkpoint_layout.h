// Names of the files and directories of a checkpoint (formats/SPEC.md, "Directory layout") and the
// data-file header. Every name Lifeline opens is built here or validated by IsSafeFileName.
#ifndef LIFELINE_SRC_CHECKPOINT_LAYOUT_H_
#define LIFELINE_SRC_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "lifeline/status.h"

namespace lifeline {

inline constexpr uint64_t kDataHeaderBytes = 4096;

// "step-00000000000000000100".
std::string StepDirName(uint64_t step);
std::optional<uint64_t> ParseStepDirName(std::string_view name);

// 16 lowercase hex digits of XXH3-64(run_id): names the files of one save attempt.
std::string RunHash(std::string_view run_id);

// The launch id used when the caller gives none: LIFELINE_LAUNCH_ID (lifeline-agent, new for every
// launch), else LIFELINE_JOB/LIFELINE_RESTART, else TORCHELASTIC_RUN_ID/TORCHELASTIC_RESTART_COUNT
// (unless the run id is torchrun's default "none"), else "" (unknown).
std::string RunIdFromEnvironment();

std::string DataFileName(std::string_view run_hash, uint32_t rank, uint32_t world_size);
std::string IndexFileName(std::string_view run_hash, uint32_t rank, uint32_t world_size);
std::string ManifestFileName(std::string_view run_hash, uint32_t world_size);
// "H.of-WWWWWW.invalid": written instead of the manifest when an attempt's rank indexes are all
// present but cannot form a loadable checkpoint; holds the reason (text). The attempt is never
// loaded and garbage collection removes it.
std::string InvalidMarkerFileName(std::string_view run_hash, uint32_t world_size);

// "suspect.json": a complete step whose data-parallel replicas were found to differ at its
// snapshot (lifeline-agent's sdc_suspect); a JSON object, at most kMaxSuspectMarkerBytes. The step
// is never loaded as the latest nor resumed from (formats/SPEC.md §2, §7).
inline constexpr char kSuspectMarkerName[] = "suspect.json";
inline constexpr uint64_t kMaxSuspectMarkerBytes = 64 << 10;

struct RankFileName {
  std::string run_hash;
  uint32_t rank = 0;
  uint32_t world_size = 0;
};
// Parses "H.rRRRRRR-of-WWWWWW.index"; nullopt for anything else (temp files included).
std::optional<RankFileName> ParseIndexFileName(std::string_view name);
// Parses "H.of-WWWWWW.manifest".
std::optional<RankFileName> ParseManifestFileName(std::string_view name);
std::optional<RankFileName> ParseInvalidMarkerFileName(std::string_view name);
// True for names of temporary files ("*.tmp-*").
bool IsTempFileName(std::string_view name);

// The first 4096 bytes of a data file: magic "LLDATA01", version, rank, world size, step, run
// hash, XXH3-64 of the 40 bytes before it; zeros after. CheckDataHeader returns Corruption naming
// `path` for any change to the 4096 bytes (a bad magic or checksum, fields that disagree with the
// index, a nonzero byte after the checksum), NotSupported for an intact header of a newer version.
void EncodeDataHeader(uint32_t rank, uint32_t world_size, uint64_t step, std::string_view run_hash,
                      uint8_t* block /* kDataHeaderBytes */);
Status CheckDataHeader(const uint8_t* block, uint32_t rank, uint32_t world_size, uint64_t step,
                       std::string_view run_hash, std::string_view path);

}  // namespace lifeline

#endif  // LIFELINE_SRC_CHECKPOINT_LAYOUT_H_
