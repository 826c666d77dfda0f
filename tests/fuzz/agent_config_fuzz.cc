// libFuzzer target: arbitrary bytes as lifeline-agent's YAML configuration (LoadAgentConfig reads
// a file, so they are written to a temporary one), then ValidateAgentConfig on what it accepted.
// Neither may crash or let an exception out (yaml-cpp reports through exceptions); a file that
// fails must leave the configuration as it was.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/config.h"

namespace {

const std::string& TempPath() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/lifeline_config_fuzz." +
           std::to_string(::getpid()) + ".yaml";
  }();
  return path;
}

bool Same(const lifeline::agent::AgentConfig& a, const lifeline::agent::AgentConfig& b) {
  // The fields a YAML file can set, spot-checked: a failed load must not have touched any.
  return a.nproc == b.nproc && a.command == b.command && a.metrics_addr == b.metrics_addr &&
         a.master_port == b.master_port && a.ring_events == b.ring_events && a.policy == b.policy &&
         a.hang.window == b.hang.window && a.restart.max_restarts == b.restart.max_restarts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lifeline::agent;
  const std::string& path = TempPath();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) std::abort();
  AgentConfig config;
  config.command = {"train"};
  const AgentConfig before = config;
  const lifeline::Status s = LoadAgentConfig(path, &config);
  if (s.ok()) {
    (void)ValidateAgentConfig(config);
  } else if (!Same(config, before)) {
    std::abort();
  }
  std::remove(path.c_str());
  return 0;
}
