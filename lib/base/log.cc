#include "lifeline/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

namespace lifeline {
namespace {

std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}

// Shared so a message being delivered keeps its sink alive while another thread replaces it.
std::shared_ptr<LogSink>& SinkSlot() {
  static std::shared_ptr<LogSink> slot = [] {
    const char* env = std::getenv("LIFELINE_LOG");
    if (env != nullptr && std::strcmp(env, "stderr") == 0)
      return std::make_shared<LogSink>(StderrLogSink(LogLevel::kDebug));
    return std::shared_ptr<LogSink>();
  }();
  return slot;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "?";
}

}  // namespace

void SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  SinkSlot() = sink ? std::make_shared<LogSink>(std::move(sink)) : nullptr;
}

LogSink StderrLogSink(LogLevel min_level) {
  return [min_level](LogLevel level, std::string_view message) {
    if (level < min_level) return;
    std::string line = "lifeline: ";
    line += LevelName(level);
    line += ": ";
    line += message;
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stderr);
  };
}

void Log(LogLevel level, std::string_view message) {
  std::shared_ptr<LogSink> sink;
  {
    std::lock_guard<std::mutex> lock(SinkMutex());
    sink = SinkSlot();
  }
  if (sink) (*sink)(level, message);
}

}  // namespace lifeline
