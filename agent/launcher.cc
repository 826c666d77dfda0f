#include "agent/launcher.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "agent/prestart.h"

extern char** environ;

namespace lifeline::agent {

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string DescribeWaitStatus(int s) {
  if (WIFEXITED(s)) return "exit code " + std::to_string(WEXITSTATUS(s));
  if (WIFSIGNALED(s)) return "killed by " + SignalName(WTERMSIG(s));
  return "status " + std::to_string(s);
}

Launcher::Launcher(std::vector<std::string> command, std::map<std::string, std::string> env)
    : command_(std::move(command)), env_(std::move(env)) {}

void KillAndReap(pid_t pid) {
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

Launcher::~Launcher() {
  for (RankProcess& r : ranks_) {
    if (r.running) KillAndReap(r.pid);
    if (r.out_fd >= 0) close(r.out_fd);
    if (r.err_fd >= 0) close(r.err_fd);
  }
}

std::map<std::string, std::string> ProcessEnvironment(const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = strchr(*e, '=');
    if (eq != nullptr) env.emplace(std::string(static_cast<const char*>(*e), eq), std::string(eq + 1));
  }
  for (const auto& [k, v] : overrides) env[k] = v;
  return env;
}

Result<ChildProcess> SpawnProcess(const std::vector<std::string>& command,
                                  const std::map<std::string, std::string>& environment, int keep_fd) {
  if (command.empty()) return Status::InvalidArgument("launch", "no command to run");
  // Everything the child needs is built before forking: between fork and exec it only calls
  // async-signal-safe functions.
  std::vector<const char*> argv;
  for (const std::string& a : command) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  std::vector<std::string> strings;
  for (const auto& [k, v] : environment) strings.push_back(k + "=" + v);
  std::vector<const char*> envp;
  for (const std::string& s : strings) envp.push_back(s.c_str());
  envp.push_back(nullptr);

  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Status::FromErrno(errno, "launch: pipe");
  if (pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    close(out[0]);
    close(out[1]);
    return Status::FromErrno(e, "launch: pipe");
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return Status::FromErrno(e, "launch: fork");
  }
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGPIPE, SIG_DFL);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    if (keep_fd >= 0) fcntl(keep_fd, F_SETFD, 0);
    execvpe(argv[0], const_cast<char* const*>(argv.data()), const_cast<char* const*>(envp.data()));
    const char* what = strerror(errno);
    (void)!write(STDERR_FILENO, "lifeline-agent: cannot run ", 27);
    (void)!write(STDERR_FILENO, argv[0], strlen(argv[0]));
    (void)!write(STDERR_FILENO, ": ", 2);
    (void)!write(STDERR_FILENO, what, strlen(what));
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent: no race with a signal sent right away
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  ChildProcess child;
  child.pid = pid;
  child.out_fd = out[0];
  child.err_fd = err[0];
  return child;
}

Status Launcher::Start(int world, int rank_base, SparePool* spares) {
  rank_base_ = rank_base;
  ranks_.clear();
  if (command_.empty()) return Status::InvalidArgument("launch", "no command to run");
  const std::map<std::string, std::string> base = ProcessEnvironment(env_);
  for (int rank = 0; rank < world; ++rank) {
    std::map<std::string, std::string> env = base;
    env["RANK"] = std::to_string(rank_base_ + rank);
    env["LOCAL_RANK"] = std::to_string(rank);
    RankProcess r;
    r.rank = rank;
    std::optional<ChildProcess> child = spares != nullptr ? spares->Hand(env) : std::nullopt;
    r.prestarted = child.has_value();
    if (!child) {
      Result<ChildProcess> spawned = SpawnProcess(command_, env);
      if (!spawned.ok()) return spawned.status();
      child = *spawned;
    }
    r.pid = child->pid;
    r.out_fd = child->out_fd;
    r.err_fd = child->err_fd;
    r.running = true;
    ranks_.push_back(std::move(r));
  }
  return Status::OK();
}

std::vector<int> Launcher::OutputFds() const {
  std::vector<int> fds;
  for (const RankProcess& r : ranks_) {
    if (r.out_fd >= 0) fds.push_back(r.out_fd);
    if (r.err_fd >= 0) fds.push_back(r.err_fd);
  }
  return fds;
}

void Launcher::FlushLine(int rank, bool is_err, std::string_view line) {
  if (line.find_first_not_of(" \t\r") != std::string_view::npos) ranks_[rank].last_line.assign(line.substr(0, 500));
  std::string text = "[rank " + std::to_string(rank_base_ + rank) + "] ";
  text.append(line);
  text.push_back('\n');
  std::fwrite(text.data(), 1, text.size(), is_err ? stderr : stdout);
  std::fflush(is_err ? stderr : stdout);
}

void Launcher::PumpOutput(int fd) {
  for (RankProcess& r : ranks_) {
    const bool is_err = fd == r.err_fd;
    if (fd != r.out_fd && !is_err) continue;
    std::string& partial = is_err ? r.err_partial : r.out_partial;
    char buf[65536];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return;  // EAGAIN: nothing more for now
      if (n == 0) {       // end of file
        if (!partial.empty()) FlushLine(r.rank, is_err, partial);
        partial.clear();
        close(fd);
        (is_err ? r.err_fd : r.out_fd) = -1;
        return;
      }
      partial.append(buf, static_cast<size_t>(n));
      size_t start = 0;
      for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1)
        FlushLine(r.rank, is_err, std::string_view(partial).substr(start, nl - start));
      partial.erase(0, start);
      if (partial.size() > (1 << 20)) {  // a line too long to hold: print it in pieces
        FlushLine(r.rank, is_err, partial);
        partial.clear();
      }
    }
  }
}

std::vector<int> Launcher::Reap() {
  std::vector<int> exited;
  for (RankProcess& r : ranks_) {
    if (!r.running) continue;
    int status = 0;
    const pid_t got = waitpid(r.pid, &status, WNOHANG);
    if (got == r.pid) {
      r.running = false;
      r.wait_status = status;
      exited.push_back(r.rank);
    }
  }
  return exited;
}

bool Launcher::AllExited() const {
  for (const RankProcess& r : ranks_)
    if (r.running) return false;
  return true;
}

int Launcher::StopAll(double grace_seconds) {
  // A rank that is still writing (a traceback after its peer died) finishes first: wait while
  // output flows, up to a second, and stop as soon as 100 ms pass without any.
  const auto settle_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < settle_deadline) {
    std::vector<pollfd> pfds;
    for (int fd : OutputFds()) pfds.push_back({fd, POLLIN, 0});
    if (pfds.empty() || poll(pfds.data(), pfds.size(), 100) <= 0) break;
    for (const pollfd& p : pfds)
      if (p.revents != 0) PumpOutput(p.fd);
  }
  for (RankProcess& r : ranks_)
    if (r.running) kill(-r.pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds);
  auto drain_output = [&] {
    std::vector<pollfd> pfds;
    for (int fd : OutputFds()) pfds.push_back({fd, POLLIN, 0});
    if (pfds.empty()) return;
    if (poll(pfds.data(), pfds.size(), 0) > 0)
      for (const pollfd& p : pfds)
        if (p.revents != 0) PumpOutput(p.fd);
  };
  while (!AllExited() && std::chrono::steady_clock::now() < deadline) {
    drain_output();
    Reap();
    if (!AllExited()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  int killed = 0;
  for (RankProcess& r : ranks_) {
    if (!r.running) continue;
    kill(-r.pid, SIGKILL);
    kill(r.pid, SIGKILL);
    ++killed;
  }
  for (RankProcess& r : ranks_) {
    if (!r.running) continue;
    int status = 0;
    waitpid(r.pid, &status, 0);
    r.running = false;
    r.wait_status = status;
  }
  // Whatever the ranks wrote last. A descendant that left the rank's process group may still
  // hold a pipe open: give up on it after a second rather than wait for it.
  const auto output_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!OutputFds().empty() && std::chrono::steady_clock::now() < output_deadline) {
    std::vector<pollfd> pfds;
    for (int fd : OutputFds()) pfds.push_back({fd, POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), 100) > 0)
      for (const pollfd& p : pfds)
        if (p.revents != 0) PumpOutput(p.fd);
  }
  for (RankProcess& r : ranks_) {
    for (int* fd : {&r.out_fd, &r.err_fd})
      if (*fd >= 0) {
        close(*fd);
        *fd = -1;
      }
  }
  return killed;
}

bool Launcher::Signal(int rank, int sig) {
  for (RankProcess& r : ranks_)
    if (r.rank == rank && r.running) return kill(r.pid, sig) == 0;
  return false;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

uint32_t PickFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  uint32_t port = 29500;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

}  // namespace lifeline::agent
