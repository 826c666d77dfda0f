#include "agent/prestart.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <regex>
#include <thread>

namespace lifeline::agent {

namespace {

// Writes what the pipe takes now; a reader that is gone is an EPIPE, not a SIGPIPE to the agent
// (which ignores it anyway) or to whoever else uses the pool.
size_t WriteWithoutSigpipe(int fd, const std::string& bytes) {
  sigset_t pipe_only, old;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  size_t done = 0;
  int e = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      e = errno;
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (e == EPIPE) {  // the SIGPIPE it raised is pending: take it before unblocking
    const timespec none{0, 0};
    sigtimedwait(&pipe_only, nullptr, &none);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = e;
  return done;
}

}  // namespace

std::optional<PythonScriptCommand> ParsePythonScript(const std::vector<std::string>& command) {
  if (command.empty()) return std::nullopt;
  static const std::regex kPython(R"(python(3(\.[0-9]+)?)?)");
  if (!std::regex_match(std::filesystem::path(command[0]).filename().string(), kPython)) return std::nullopt;
  PythonScriptCommand parsed;
  parsed.interpreter.push_back(command[0]);
  size_t i = 1;
  for (; i < command.size(); ++i) {
    const std::string& a = command[i];
    if (a.empty() || a[0] != '-') break;
    if (a == "-" || a == "--") return std::nullopt;  // standard input, or an end of options Python reads oddly
    // Options that take the next word (-X opt, -W arg) or end in one (-Xopt, -Warg).
    if (a == "-X" || a == "-W") {
      if (i + 1 >= command.size()) return std::nullopt;
      parsed.interpreter.push_back(a);
      parsed.interpreter.push_back(command[++i]);
      continue;
    }
    if (a.rfind("-X", 0) == 0 || a.rfind("-W", 0) == 0) {
      parsed.interpreter.push_back(a);
      continue;
    }
    // Clusters of flags without arguments (-u, -OO, -uB); -m, -c and anything else are not a
    // script run.
    if (a.size() < 2 || a.find_first_not_of("bBdEiIOqsSuvx", 1) != std::string::npos) return std::nullopt;
    parsed.interpreter.push_back(a);
  }
  if (i >= command.size()) return std::nullopt;
  parsed.script = command[i];
  parsed.args.assign(command.begin() + static_cast<std::ptrdiff_t>(i) + 1, command.end());
  std::error_code ec;
  if (!std::filesystem::is_regular_file(parsed.script, ec)) return std::nullopt;
  return parsed;
}

SparePool::SparePool(PythonScriptCommand command, std::string bootstrap) {
  argv_ = command.interpreter;
  argv_.push_back(std::move(bootstrap));
  argv_.push_back("{fd}");
  argv_.push_back(command.script);
  argv_.insert(argv_.end(), command.args.begin(), command.args.end());
}

SparePool::~SparePool() {
  // The end of its pipe ends a spare by itself; one still importing gets a moment, then SIGKILL.
  for (Waiting& w : spares_) {
    close(w.go_fd);
    w.go_fd = -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  for (Waiting& w : spares_) {
    while (waitpid(w.process.pid, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        KillAndReap(w.process.pid);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CloseAll(w);
  }
}

void SparePool::CloseAll(Waiting& w) {
  for (int* fd : {&w.go_fd, &w.process.out_fd, &w.process.err_fd})
    if (*fd >= 0) {
      close(*fd);
      *fd = -1;
    }
}

void SparePool::Fill(size_t count, const std::map<std::string, std::string>& env) {
  Collect();
  while (failure_.empty() && spares_.size() < count) {
    int go[2];
    if (pipe2(go, O_CLOEXEC) != 0) {
      failure_ = std::string("cannot make a spare's pipe: ") + std::strerror(errno);
      return;
    }
    std::vector<std::string> argv = argv_;
    for (std::string& a : argv)
      if (a == "{fd}") a = std::to_string(go[0]);
    Result<ChildProcess> child = SpawnProcess(argv, env, /*keep_fd=*/go[0]);
    close(go[0]);
    if (!child.ok()) {
      close(go[1]);
      failure_ = "cannot start a spare: " + child.status().ToString();
      return;
    }
    spares_.push_back({*child, go[1]});
  }
}

std::vector<pid_t> SparePool::pids() const {
  std::vector<pid_t> pids;
  for (const Waiting& w : spares_) pids.push_back(w.process.pid);
  return pids;
}

void SparePool::Collect() {
  for (size_t i = 0; i < spares_.size();) {
    Waiting& w = spares_[i];
    int status = 0;
    if (waitpid(w.process.pid, &status, WNOHANG) != w.process.pid) {
      ++i;
      continue;
    }
    if (failure_.empty()) {
      // Its last words, for the reason: the spare's output is its own, never a rank's.
      char buf[4096];
      std::string text;
      for (int fd : {w.process.err_fd, w.process.out_fd}) {
        ssize_t n;
        while ((n = read(fd, buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
      }
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      const size_t nl = text.rfind('\n');
      const std::string last = nl == std::string::npos ? text : text.substr(nl + 1);
      failure_ = "a spare interpreter ended before it was needed (" + DescribeWaitStatus(status) +
                 (last.empty() ? "" : ": " + last.substr(0, 300)) + ")";
    }
    CloseAll(w);
    spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

std::optional<ChildProcess> SparePool::Hand(const std::map<std::string, std::string>& env) {
  Collect();
  // The environment as /proc/PID/environ holds one: NAME=VALUE, each ended by a NUL byte.
  std::string payload;
  for (const auto& [k, v] : env) {
    payload += k;
    payload += '=';
    payload += v;
    payload += '\0';
  }
  while (!spares_.empty()) {
    Waiting w = spares_.front();
    spares_.erase(spares_.begin());
    // Non-blocking: the pipe holds 64 KiB, or more when it grows; a spare busy importing reads it
    // after. An environment too large for it is not worth a wait: the rank starts afresh.
    fcntl(w.go_fd, F_SETFL, O_NONBLOCK);
    if (payload.size() > 65536) fcntl(w.go_fd, F_SETPIPE_SZ, static_cast<int>(payload.size()));
    const size_t done = WriteWithoutSigpipe(w.go_fd, payload);
    if (done != payload.size()) {
      const int e = errno;
      KillAndReap(w.process.pid);
      CloseAll(w);
      if (failure_.empty())
        failure_ = std::string("cannot hand a spare its environment: ") + (e == EPIPE ? "it has exited" : std::strerror(e));
      continue;
    }
    close(w.go_fd);  // the end of the environment: the spare runs the script now
    return w.process;
  }
  return std::nullopt;
}

}  // namespace lifeline::agent
