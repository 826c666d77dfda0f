// The subcommands of the `lifeline` tool and what they share: how results and errors are printed.
//
// Output contract of every command: with --json, exactly one JSON object on stdout (also when the
// command fails, with "ok": false and "error"); without it, human-readable text on stdout. Errors
// always go to stderr as one line naming the command and what failed. Exit status: 0 on success,
// 1 when the operation failed or found a problem, 2 for bad arguments.
//
// Thread safety: the helpers may be called from one thread at a time (they write to stdout/stderr).
#ifndef LIFELINE_TOOLS_LIFELINE_COMMANDS_H_
#define LIFELINE_TOOLS_LIFELINE_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "lifeline/status.h"

namespace lifeline::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// A parsed subcommand and what to run when the user picked it.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the exit status
};

// The arguments of a command about one step of a checkpoint directory (inspect, verify).
struct StepArgs {
  std::string dir;
  int64_t step = -1;  // -1: the newest complete step
  bool json = false;

  std::optional<uint64_t> chosen_step() const {
    return step >= 0 ? std::optional<uint64_t>(step) : std::nullopt;
  }
};

// Adds the positional `dir`, `--step` (`step_help` says what is done with it) and `--json`.
void AddStepArgs(CLI::App* app, StepArgs* args, const std::string& step_help);

// Each adds its subcommand(s) to `root` and appends what to run to `commands`.
// `bench` and its subcommands (bench/).
void AddBenchCommands(CLI::App& root, std::vector<Command>* commands);
void AddInspectCommand(CLI::App& root, std::vector<Command>* commands);
void AddVerifyCommand(CLI::App& root, std::vector<Command>* commands);
// convert, reshard, ls, gc and diff (convert_commands.cc).
void AddConvertCommands(CLI::App& root, std::vector<Command>* commands);

// Prints `j` on stdout as one JSON document (invalid UTF-8 from a damaged file is replaced, not
// fatal).
void PrintJson(const nlohmann::json& j);

// Reports a failure of `command`: "lifeline <command>: <status>" on stderr and, when `json`, an
// object {"ok": false, "command": ..., "error": ..., "code": ...} on stdout. Returns kExitFailed
// (kExitUsage for InvalidArgument).
int ReportFailure(std::string_view command, const Status& status, bool json);

// Wall-clock seconds since an arbitrary origin, monotonic.
double NowSeconds();

// "2024-05-01 12:34:56 UTC" for a Unix time in nanoseconds; "-" for 0.
std::string FormatUnixNanos(uint64_t unix_ns);

}  // namespace lifeline::cli

#endif  // LIFELINE_TOOLS_LIFELINE_COMMANDS_H_
