#include "tools/lifeline/commands.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>

namespace lifeline::cli {

void PrintJson(const nlohmann::json& j) {
  std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
}

int ReportFailure(std::string_view command, const Status& status, bool json) {
  std::cerr << "lifeline " << command << ": " << status.ToString() << std::endl;
  if (json) {
    PrintJson({{"ok", false},
               {"command", std::string(command)},
               {"code", StatusCodeName(status.code())},
               {"error", status.message()}});
  }
  return status.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string FormatUnixNanos(uint64_t unix_ns) {
  if (unix_ns == 0) return "-";
  const std::time_t secs = static_cast<std::time_t>(unix_ns / 1000000000ull);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

void AddStepArgs(CLI::App* app, StepArgs* args, const std::string& step_help) {
  app->add_option("dir", args->dir, "Checkpoint root directory")->required();
  app->add_option("--step", args->step, step_help + " (default: the newest complete one)")
      ->check(CLI::NonNegativeNumber);
  app->add_flag("--json", args->json, "Print one JSON object on stdout");
}

}  // namespace lifeline::cli
