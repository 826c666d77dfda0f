#include "tools/lifeline/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "tools/lifeline/byte_size.h"
#include "tools/lifeline/commands.h"

namespace lifeline::cli {

Progress::Progress(std::string what, uint64_t total, bool quiet)
    : what_(std::move(what)), total_(total), enabled_(!quiet && isatty(STDERR_FILENO) == 1), start_(NowSeconds()) {}

Progress::~Progress() { Clear(); }

double Progress::elapsed() const { return NowSeconds() - start_; }

void Progress::Add(uint64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  const double now = NowSeconds();
  if (now - start_ < 1.0 || now - last_draw_ < 0.1) return;
  last_draw_ = now;
  Draw();
}

void Progress::Draw() {
  const double secs = std::max(1e-9, NowSeconds() - start_);
  const double frac = total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_));
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  const double rate = static_cast<double>(done_) / secs;
  std::string detail = detail_;
  if (detail.size() > 40) detail = "..." + detail.substr(detail.size() - 37);
  std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %s of %s, %s/s %s", what_.c_str(), bar.c_str(), frac * 100,
               FormatByteSize(done_).c_str(), FormatByteSize(total_).c_str(),
               FormatByteSize(static_cast<uint64_t>(rate)).c_str(), detail.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::Clear() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace lifeline::cli
