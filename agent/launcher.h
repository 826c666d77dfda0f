// Launching and stopping the local ranks: torchrun's environment, each rank in its own process
// group (so a rank's own children are stopped with it), its stdout and stderr prefixed with the
// rank as whole lines.
#ifndef LIFELINE_AGENT_LAUNCHER_H_
#define LIFELINE_AGENT_LAUNCHER_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lifeline/status.h"

namespace lifeline::agent {

// A process the agent started: its pid (also its process group's) and the read ends of its
// stdout and stderr, non-blocking.
struct ChildProcess {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
};

// The environment a process the agent starts gets: the agent's own, `overrides` added or
// replacing. Launched ranks and spares (agent/prestart.h) alike.
std::map<std::string, std::string> ProcessEnvironment(const std::map<std::string, std::string>& overrides);

// Forks and execs `argv` (searched on PATH) with exactly `env`, in a process group of its own,
// its stdout and stderr into pipes whose read ends come back non-blocking; `keep_fd`, when >= 0,
// stays open across the exec (every other descriptor the agent holds is close-on-exec). A command
// that cannot be executed exits 127 saying why on its stderr.
Result<ChildProcess> SpawnProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                                  int keep_fd = -1);

// SIGKILL to `pid`'s process group and to `pid` (it may have left the group), then reaps it.
void KillAndReap(pid_t pid);

class SparePool;

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int wait_status = 0;     // valid once !running
  int out_fd = -1;         // read ends of the rank's stdout and stderr (-1 once closed)
  int err_fd = -1;
  std::string out_partial; // an unfinished last line
  std::string err_partial;
  std::string last_line;   // the last non-empty line it wrote (stdout or stderr)
  bool prestarted = false; // a spare interpreter took the rank (agent/prestart.h)
};

class Launcher {
 public:
  // `env` is added to (and overrides) the agent's own environment for every rank; RANK and
  // LOCAL_RANK are set per rank.
  Launcher(std::vector<std::string> command, std::map<std::string, std::string> env);
  ~Launcher();  // kills what is still running (SIGKILL) and reaps it

  // Starts `world` local ranks, global ranks `rank_base` on (RANK; LOCAL_RANK counts from 0), each
  // in a waiting spare of `spares` while there is one, else afresh. On failure nothing is left
  // running.
  Status Start(int world, int rank_base = 0, SparePool* spares = nullptr);
  std::vector<RankProcess>& ranks() { return ranks_; }
  // The fds to poll for output.
  std::vector<int> OutputFds() const;
  // Reads what is available on `fd` and writes whole lines to the agent's stdout or stderr as
  // "[rank R] line". At end of file the fd is closed and any partial line is flushed.
  void PumpOutput(int fd);
  // Reaps exited ranks without blocking; returns the ranks that exited since the last call.
  std::vector<int> Reap();
  bool AllExited() const;
  // SIGTERM to every running rank's process group, then SIGKILL after `grace_seconds`; reaps all
  // and drains their output. Returns how many needed SIGKILL.
  int StopAll(double grace_seconds);
  // Sends `sig` to a running rank's process (not its group: a dump request is for the rank).
  bool Signal(int rank, int sig);

 private:
  void FlushLine(int rank, bool is_err, std::string_view line);

  std::vector<std::string> command_;
  std::map<std::string, std::string> env_;
  std::vector<RankProcess> ranks_;
  int rank_base_ = 0;
};

// A TCP port free on every address of this machine a moment ago, for MASTER_PORT (29500 when
// none can be found).
uint32_t PickFreePort();

// This machine's hostname ("localhost" when it has none).
std::string HostName();

// "SIGKILL", "SIGSEGV", ... ("signal N" when unnamed).
std::string SignalName(int sig);
// "exit code 3" or "killed by SIGKILL".
std::string DescribeWaitStatus(int wait_status);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_LAUNCHER_H_
