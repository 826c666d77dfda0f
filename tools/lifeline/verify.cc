// lifeline verify DIR [--step S] [--json]: checks every byte of one checkpoint (CheckpointReader::
// Verify): every rank index and the manifest, which must agree; each data file's size, header and
// padding; every chunk and object against its checksum. Exit 0 only when all is intact; otherwise
// the error names the file (and the tensor or object and the byte offset), and the exit status is 1.
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "lifeline/checkpoint.h"
#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {
namespace {

std::string SecondsText(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f s", seconds);
  return buf;
}

int RunVerify(const StepArgs& o) {
  const double t0 = NowSeconds();
  Result<VerifyResult> r = VerifyCheckpoint(o.dir, o.chosen_step());
  if (!r.ok()) return ReportFailure("verify", r.status(), o.json);
  const VerifyResult& report = *r;
  const Status& s = report.status;
  const double seconds = NowSeconds() - t0;
  if (!s.ok()) {
    std::cerr << "lifeline verify: step " << report.step << " in " << report.directory
              << " is damaged: " << s.ToString() << std::endl;
    if (o.json) {
      PrintJson({{"ok", false},
                 {"command", "verify"},
                 {"step", report.step},
                 {"directory", report.directory},
                 {"code", StatusCodeName(s.code())},
                 {"error", s.message()},
                 {"indexes_checked", report.indexes_checked},
                 {"chunks_checked", report.chunks_checked},
                 {"objects_checked", report.objects_checked}});
    }
    return kExitFailed;
  }
  if (report.suspect) {
    std::cerr << "lifeline verify: step " << report.step << " in " << report.directory
              << " is marked suspect (its bytes match their checksums): " << report.suspect_reason << std::endl;
    if (o.json)
      PrintJson({{"ok", false},
                 {"command", "verify"},
                 {"step", report.step},
                 {"directory", report.directory},
                 {"code", "suspect"},
                 {"error", "marked suspect: " + report.suspect_reason},
                 {"suspect", true},
                 {"indexes_checked", report.indexes_checked},
                 {"chunks_checked", report.chunks_checked},
                 {"objects_checked", report.objects_checked}});
    return kExitFailed;
  }
  if (o.json) {
    PrintJson({{"ok", true},
               {"command", "verify"},
               {"step", report.step},
               {"directory", report.directory},
               {"indexes_checked", report.indexes_checked},
               {"chunks_checked", report.chunks_checked},
               {"objects_checked", report.objects_checked},
               {"bytes_checked", report.bytes_checked},
               {"seconds", seconds}});
  } else {
    std::cout << "step " << report.step << " OK: " << report.indexes_checked << " index files agree; "
              << report.chunks_checked << " chunks and " << report.objects_checked << " objects ("
              << FormatByteSize(report.bytes_checked) << " with headers and padding) match their checksums ("
              << SecondsText(seconds) << ")\n";
  }
  return kExitOk;
}

}  // namespace

void AddVerifyCommand(CLI::App& root, std::vector<Command>* commands) {
  auto options = std::make_shared<StepArgs>();
  CLI::App* app = root.add_subcommand(
      "verify", "Check every byte of a checkpoint: its rank indexes and manifest agree, data file sizes, headers and padding, every chunk and object against its checksum, compressed chunks decode (exit 1 on any damage)");
  AddStepArgs(app, options.get(), "Step to verify");
  commands->push_back({app, [options] { return RunVerify(*options); }});
}

}  // namespace lifeline::cli
