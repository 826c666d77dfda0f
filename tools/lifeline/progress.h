// A one-line progress bar on stderr for long commands (convert, reshard, diff): drawn only when
// stderr is a terminal and the command is not printing JSON, and only once the work has taken
// more than a second, so quick runs and scripts see nothing.
//
// Thread safety: one thread at a time.
#ifndef LIFELINE_TOOLS_LIFELINE_PROGRESS_H_
#define LIFELINE_TOOLS_LIFELINE_PROGRESS_H_

#include <cstdint>
#include <string>

namespace lifeline::cli {

class Progress {
 public:
  // `total` bytes of work; `quiet` (e.g. --json) never draws.
  Progress(std::string what, uint64_t total, bool quiet);
  ~Progress();  // clears the line if one was drawn
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `bytes` more done; redraws at most ten times a second.
  void Add(uint64_t bytes);
  // What is being worked on now (e.g. a tensor name), shown after the figures.
  void SetDetail(std::string detail) { detail_ = std::move(detail); }
  uint64_t done() const { return done_; }
  // Seconds since construction.
  double elapsed() const;

 private:
  void Draw();
  void Clear();

  std::string what_;
  std::string detail_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  bool drawn_ = false;
  double start_;
  double last_draw_ = 0;
};

}  // namespace lifeline::cli

#endif  // LIFELINE_TOOLS_LIFELINE_PROGRESS_H_
