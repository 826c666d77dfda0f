#include "agent/detectors/echo.h"

#include <sys/wait.h>

#include <csignal>
#include <utility>

namespace lifeline::agent {

bool MayBeEcho(const Anomaly& dead, int wait_status) {
  const bool echo_end = WIFEXITED(wait_status) || (WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGABRT);
  if (!echo_end) return false;
  // It died in a step before beginning any collective in it, and was in none: nothing of a peer's
  // could reach it. Without that evidence (no collectives or steps recorded) it may be an echo.
  const auto in = dead.evidence.find("in_collective");
  const auto in_step = dead.evidence.find("collective_in_step");
  const auto is_false = [&](nlohmann::json::const_iterator it) {
    return it != dead.evidence.end() && it->is_boolean() && !it->get<bool>();
  };
  return !(is_false(in) && is_false(in_step));
}

void SortFailuresAsTheRoundMoves(std::vector<Anomaly>* anomalies, const std::function<int(int)>& wait_status,
                                 std::vector<Anomaly>* echoes) {
  std::vector<Anomaly> own;
  for (Anomaly& a : *anomalies) {
    if (a.kind != "dead") continue;
    bool may_echo = !a.ranks.empty();
    for (int global : a.ranks) may_echo = may_echo && MayBeEcho(a, wait_status(global));
    (may_echo ? *echoes : own).push_back(std::move(a));
  }
  *anomalies = std::move(own);
}

}  // namespace lifeline::agent
