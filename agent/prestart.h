// Spare ranks started ahead of a relaunch. A relaunched Python rank spends most of its start-up
// importing torch (0.7 to 1.9 s here) and, on torch 2.x, torch._dynamo when DDP or FSDP is built
// (1.2 to 1.7 s). While a launch trains, the agent starts one spare interpreter per local rank
// with the rank's command; each imports what the script imports
// (lib/python/lifeline_startup/_lifeline_prestart.py) and waits. A relaunch hands each spare its
// rank's whole environment instead of starting a process, and the spare runs the script as
// `python SCRIPT ARGS` would. A command that is not a Python interpreter running a script file,
// a spare that exited before it was needed, or one that cannot be handed its environment: the rank
// is started afresh, as without spares.
#ifndef LIFELINE_AGENT_PRESTART_H_
#define LIFELINE_AGENT_PRESTART_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/launcher.h"

namespace lifeline::agent {

// A rank's command read as [interpreter, interpreter options..., script, script arguments...].
struct PythonScriptCommand {
  std::vector<std::string> interpreter;  // the interpreter and its options
  std::string script;
  std::vector<std::string> args;
};

// The command as a Python interpreter (python, python3, python3.11, a path to one) running a
// script file with options Python takes before it (-u, -O, -B, -X opt, -W arg, ...); nullopt for
// anything else: -m, -c, standard input, a wrapper, an option it does not know.
std::optional<PythonScriptCommand> ParsePythonScript(const std::vector<std::string>& command);

class SparePool {
 public:
  // `command`: the ranks' command (ParsePythonScript must accept it); `bootstrap`: the path of
  // _lifeline_prestart.py.
  SparePool(PythonScriptCommand command, std::string bootstrap);
  ~SparePool();  // retires the waiting spares (they exit at the end of their pipe), then kills them
  SparePool(const SparePool&) = delete;
  SparePool& operator=(const SparePool&) = delete;

  // Starts spares until `count` wait, each with the whole environment `env`. Nothing once a spare
  // has failed (failure()).
  void Fill(size_t count, const std::map<std::string, std::string>& env);
  // A waiting spare handed `env`, the rank's whole environment: from now on the rank's process.
  // nullopt when no spare is waiting, or none could take it (failure() says why).
  std::optional<ChildProcess> Hand(const std::map<std::string, std::string>& env);
  // Reaps spares that exited while they waited; the first makes failure() say so.
  void Collect();
  size_t waiting() const { return spares_.size(); }
  std::vector<pid_t> pids() const;  // the waiting spares
  // Why spares are no longer started ("" while they are): a spare exited before it was needed, or
  // could not be started or handed a rank.
  const std::string& failure() const { return failure_; }
  const std::vector<std::string>& spare_command() const { return argv_; }

 private:
  struct Waiting {
    ChildProcess process;
    int go_fd = -1;  // write end of the spare's environment pipe
  };
  static void CloseAll(Waiting& w);  // its pipes

  std::vector<std::string> argv_;  // the spare's command, "{fd}" where the pipe's number goes
  std::vector<Waiting> spares_;
  std::string failure_;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_PRESTART_H_
