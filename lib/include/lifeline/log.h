// Where the library's diagnostics go. By default nowhere: the library never prints unless asked.
// A program asks by installing a sink (the CLI prints to stderr), or by setting LIFELINE_LOG=stderr
// in the environment before the first message.
//
// Thread safety: SetLogSink and Log may be called from any thread; the sink itself is called
// from whichever thread logs, possibly concurrently, and must be thread-safe.
#ifndef LIFELINE_LOG_H_
#define LIFELINE_LOG_H_

#include "lifeline/export.h"

#include <functional>
#include <string_view>

namespace lifeline {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

using LogSink = std::function<void(LogLevel, std::string_view message)>;

// Replaces the process-wide sink; an empty function silences the library.
LIFELINE_EXPORT void SetLogSink(LogSink sink);
// A sink that writes "lifeline: <level>: <message>" lines to stderr.
LIFELINE_EXPORT LogSink StderrLogSink(LogLevel min_level = LogLevel::kInfo);

LIFELINE_EXPORT void Log(LogLevel level, std::string_view message);

}  // namespace lifeline

#endif  // LIFELINE_LOG_H_
