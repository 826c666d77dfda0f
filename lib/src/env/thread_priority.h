// Background threads (snapshot copies, persistence, drains) yield the CPU to the training loop:
// on a machine with few cores a copy thread that holds a core while the loop's thread waits to be
// scheduled turns a microsecond Save into milliseconds.
#ifndef LIFELINE_SRC_THREAD_PRIORITY_H_
#define LIFELINE_SRC_THREAD_PRIORITY_H_

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace lifeline {

// Makes the calling thread `levels` nice levels less favoured than it is (capped at 19). Best
// effort: a refusal leaves the thread as it was. Linux applies nice values per thread.
inline void LowerCallingThreadPriority(int levels) {
  if (levels <= 0) return;
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  if (current == -1 && errno != 0) return;
  (void)setpriority(PRIO_PROCESS, tid, std::min(19, current + levels));
}

}  // namespace lifeline

#endif  // LIFELINE_SRC_THREAD_PRIORITY_H_
