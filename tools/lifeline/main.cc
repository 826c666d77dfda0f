// lifeline: inspect, verify, convert, reshard, list, collect and benchmark Lifeline checkpoints. See commands.h for the output
// contract shared by the subcommands.
#include <vector>

#include <CLI/CLI.hpp>

#include "lifeline/log.h"
#include "tools/lifeline/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"lifeline: inspect, verify, convert, reshard and benchmark Lifeline checkpoints"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "lifeline " LIFELINE_VERSION);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Also print the library's informational messages");

  std::vector<lifeline::cli::Command> commands;
  lifeline::cli::AddBenchCommands(app, &commands);
  lifeline::cli::AddInspectCommand(app, &commands);
  lifeline::cli::AddVerifyCommand(app, &commands);
  lifeline::cli::AddConvertCommands(app, &commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and version requests are "errors" with status 0 in CLI11.
    return app.exit(e) == 0 ? lifeline::cli::kExitOk : lifeline::cli::kExitUsage;
  }

  lifeline::SetLogSink(lifeline::StderrLogSink(verbose ? lifeline::LogLevel::kInfo : lifeline::LogLevel::kWarning));
  for (const lifeline::cli::Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return lifeline::cli::kExitUsage;
}
