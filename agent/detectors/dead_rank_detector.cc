#include "agent/detectors/dead_rank_detector.h"

#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include <string>

#include "agent/detectors/echo.h"
#include "agent/detectors/evidence.h"

namespace lifeline::agent {

using namespace detail;

namespace {

const char* SignalName(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGCHLD: return "SIGCHLD";
    case SIGCONT: return "SIGCONT";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    case SIGURG: return "SIGURG";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGPROF: return "SIGPROF";
    case SIGWINCH: return "SIGWINCH";
    case SIGIO: return "SIGIO";
    case SIGSYS: return "SIGSYS";
    default: return nullptr;
  }
}

}  // namespace

void DeadRankDetector::Reset(int world) {
  reported_.assign(static_cast<size_t>(std::max(world, 0)), false);
  early_exits_.clear();
}

void DeadRankDetector::RankExited(const Timeline& timeline, int rank, int wait_status, bool expected, uint64_t now_ns,
                                  std::vector<Anomaly>* out) {
  if (expected || rank < 0) return;
  const bool signaled = WIFSIGNALED(wait_status);
  const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 0;
  const bool known = rank < static_cast<int>(reported_.size()) && rank < timeline.world();
  if (!signaled && code == 0) {
    // Not an anomaly by itself (a rank may finish first), unless a peer then fails in a collective.
    if (known && timeline.alive_count() > 0) early_exits_.push_back({rank, KnownStep(timeline.rank(rank).step)});
    return;
  }
  if (known) {
    if (reported_[rank]) return;
    reported_[rank] = true;
  }
  const RankTimeline none;
  const RankTimeline& r = known ? timeline.rank(rank) : none;

  const int global = timeline.GlobalRank(rank);
  Anomaly a;
  a.kind = "dead";
  a.ranks = {global};
  a.step = KnownStep(r.step);
  a.detected_ns = now_ns;
  std::string how;
  if (signaled) {
    const int sig = WTERMSIG(wait_status);
    const char* name = SignalName(sig);
    const std::string sig_name = name != nullptr ? name : "signal " + std::to_string(sig);
    a.evidence["signal"] = sig;
    a.evidence["signal_name"] = sig_name;
    if (WCOREDUMP(wait_status)) a.evidence["core_dumped"] = true;
    how = "died (" + sig_name + (WCOREDUMP(wait_status) ? ", core dumped)" : ")");
  } else {
    a.evidence["exit_code"] = code;
    how = "exited with status " + std::to_string(code);
  }
  a.evidence["orderly_exit_recorded"] = r.finished;
  // Where it was when it died: inside a collective (begun, not ended), or in a step in which it
  // had begun one. A rank that a peer's death brought down learns of it in a collective (the call
  // raises, and Python's trace scope then records its end, or NCCL's watchdog aborts while it is
  // open), so a rank that died in a step before beginning any collective in it failed on its own
  // (agent/detectors/echo.h). Left out when the rank never recorded a collective: nothing is known.
  if (known && !r.last_begun.empty()) {
    nlohmann::json in = false;
    uint64_t oldest = 0, newest_begin = 0;
    bool begin_known = false;
    for (const auto& [comm, seqs] : r.open) {
      for (const auto& [seq, open] : seqs) {
        newest_begin = std::max(newest_begin, open.begin_ns);
        begin_known = true;
      }
      if (seqs.empty()) continue;
      const auto& [seq, open] = *seqs.begin();  // the oldest it had not ended on this comm
      if (!in.is_boolean() && open.begin_ns >= oldest) continue;
      oldest = open.begin_ns;
      in = {{"comm", comm}, {"seq", seq}, {"op", trace::OpName(open.op)}, {"posted", open.posted}};
    }
    for (const auto& [comm, seq] : r.last_begun) {
      const auto* records = timeline.Collectives(comm);
      if (records == nullptr) continue;
      const auto it = records->find(seq);
      if (it == records->end() || it->second.begin_ns[rank] == 0) continue;
      newest_begin = std::max(newest_begin, it->second.begin_ns[rank]);
      begin_known = true;
    }
    a.evidence["in_collective"] = std::move(in);
    if (r.began_step && begin_known) a.evidence["collective_in_step"] = newest_begin >= r.step_begin_ns;
  }
  if (r.last_event_ns != 0) a.evidence["seconds_since_last_event"] = SecondsBetween(r.last_event_ns, now_ns);
  a.message = "rank " + std::to_string(global) + " " + how + StepSuffix(r.step);
  // A peer that left with status 0 while this one still needed it for its collectives: this
  // failure, met in a collective (it recorded one), is the echo of that early exit, and the rank
  // that left is the culprit.
  const nlohmann::json& in = a.evidence.value("in_collective", nlohmann::json());
  const bool in_a_collective = in.is_object() || a.evidence.value("collective_in_step", false);
  if (!early_exits_.empty() && in_a_collective && MayBeEcho(a, wait_status)) {
    const EarlyExit first = early_exits_.front();
    early_exits_.clear();
    Anomaly e;
    e.kind = "dead";
    const int left = timeline.GlobalRank(first.rank);
    e.ranks = {left};
    e.step = first.step;
    e.detected_ns = now_ns;
    e.evidence["exit_code"] = 0;
    e.evidence["early_exit"] = true;
    e.evidence["echo"] = {{"rank", global}, {"message", a.message}};
    e.message = "rank " + std::to_string(left) + " exited with status 0" +
                (first.step ? " at step " + std::to_string(*first.step) : std::string()) +
                " while its peers were still training; rank " + std::to_string(global) + " " + how +
                " in a collective afterwards, an echo of that early exit";
    out->push_back(std::move(e));
    return;
  }
  out->push_back(std::move(a));
}

}  // namespace lifeline::agent
