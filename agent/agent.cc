#include "agent/agent.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>
#include <thread>

#include "agent/control_socket.h"
#include "agent/host_cpu.h"
#include "agent/metrics.h"
#include "agent/progress.h"
#include "agent/resume.h"
#include "lifeline/checkpoint.h"
#include "lifeline/env.h"
#include "lifeline/inspect.h"
#include "lifeline/internal/tier_replica.h"

namespace lifeline::agent {
namespace {

double Seconds(uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i == 0 ? "" : ",") + std::to_string(ranks[i]);
  return s.empty() ? "none" : s;
}

std::string NewJobId() {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "job-%08x", static_cast<unsigned>(rd()));
  return buf;
}

// A --run-dir the agent is told to use: created 0700 when missing; an existing one must be a real
// directory (not a link someone planted there) of the agent's user. Nothing existing is chmod-ed.
Status PrepareRunDir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();  // "link/" would resolve the link
  const std::string what = "run directory " + dir;
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);  // links above the run directory are the user's
    if (ec) return Status::IOError(what, ec.message());
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, what);
  // Checked on the descriptor so the entry cannot be swapped between the check and the use.
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    struct stat lst;
    if (lstat(dir.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode))
      return Status::FailedPrecondition(what, "is a symbolic link; the agent does not follow links for its run directory");
    if (err == ENOTDIR) return Status::FailedPrecondition(what, "is not a directory");
    return Status::FromErrno(err, what);
  }
  struct stat st;
  const int rc = fstat(fd, &st);
  const int err = errno;
  close(fd);
  if (rc != 0) return Status::FromErrno(err, what);
  if (st.st_uid != geteuid())
    return Status::FailedPrecondition(what, "is owned by uid " + std::to_string(st.st_uid) + ", not by the agent's user (uid " +
                                                std::to_string(geteuid()) + "); not using it");
  return Status::OK();  // a directory others can write to is refused by ControlSocket::Listen, before any use
}

// The directory holding the Python ranks' startup hook (lifeline_startup/sitecustomize.py) beside
// the lifeline package: LIFELINE_PYTHONPATH, else found from the agent's own binary, built
// (build/bin -> build/python), installed (PREFIX/bin -> PREFIX/lib/python3/dist-packages) or in a
// wheel (site-packages/lifeline/_bin -> site-packages).
// Empty, with the places looked at in `looked`, when there is none.
std::string FindPythonStartupDir(std::string* looked) {
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("LIFELINE_PYTHONPATH"); dir != nullptr && *dir != '\0') {
    candidates.push_back(std::string(dir) + "/lifeline_startup");
  } else {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      const std::filesystem::path prefix = exe.parent_path().parent_path();
      candidates.push_back((prefix / "python" / "lifeline_startup").string());
      candidates.push_back((prefix / "lib" / "python3" / "dist-packages" / "lifeline_startup").string());
      candidates.push_back((prefix.parent_path() / "lifeline_startup").string());
    }
  }
  for (const std::string& c : candidates) {
    if (Env::Default()->FileExists(c + "/sitecustomize.py")) return c;
    *looked += (looked->empty() ? "" : ", ") + c;
  }
  return "";
}

// A rank ended by SIGTERM, SIGINT or SIGHUP that the agent did not send: maybe the scheduler's
// stop of the whole job, which reaches the agent too.
bool KilledByATermination(const Anomaly& a) {
  if (a.kind != "dead" || !a.evidence.contains("signal") || !a.evidence["signal"].is_number_integer()) return false;
  const int sig = a.evidence["signal"].get<int>();
  return sig == SIGTERM || sig == SIGINT || sig == SIGHUP;
}

// Said with a give-up in etcd when a requeue may help: every node then exits kExitRequeue.
constexpr char kRequeueMark[] = " [a requeue may help]";

// SIGTERM/SIGINT to the agent: stop the ranks, then exit. Only a flag here.
volatile sig_atomic_t g_stop_signal = 0;
void OnStopSignal(int sig) { g_stop_signal = sig; }

// What the Supervisor asks, answered from this host's /proc and the job's etcd.
class AgentSurroundings final : public Surroundings {
 public:
  AgentSurroundings(Rendezvous* rdzv, std::function<std::string()> checkpoint_dir)
      : rdzv_(rdzv), checkpoint_dir_(std::move(checkpoint_dir)) {}
  bool CheckpointDirKnown() override { return !checkpoint_dir_().empty(); }
  HostCpu SampleHostCpu() override { return agent::SampleHostCpu(); }
  Status ReportFailure(uint64_t round, uint64_t unix_ms) override {
    return rdzv_ != nullptr ? rdzv_->ReportFailure(round, unix_ms) : NoRendezvous();
  }
  Result<bool> FailedEarlierElsewhere(uint64_t round, uint64_t unix_ms) override {
    if (rdzv_ == nullptr) return NoRendezvous();
    return rdzv_->FailedEarlierElsewhere(round, unix_ms);
  }
  Result<std::vector<std::string>> NodesWithoutFailure(uint64_t round, const std::vector<std::string>& nodes) override {
    if (rdzv_ == nullptr) return NoRendezvous();
    return rdzv_->NodesWithoutFailure(round, nodes);
  }

 private:
  static Status NoRendezvous() { return Status::FailedPrecondition("the round's failures", "a single-node job has no etcd"); }
  Rendezvous* const rdzv_;  // nullptr in a single-node job
  const std::function<std::string()> checkpoint_dir_;
};

}  // namespace

std::string IsoTimeNow() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc;
  gmtime_r(&ts.tv_sec, &utc);
  char buf[40];
  const size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(buf + n, sizeof(buf) - n, ".%03ldZ", ts.tv_nsec / 1000000);
  return buf;
}

Agent::Agent(AgentConfig config) : config_(std::move(config)) {}

Agent::~Agent() { Cleanup(); }

void Agent::Cleanup() {
  spares_.reset();    // retires the spares
  launcher_.reset();  // kills anything still running
  replication_.reset();
  // What supervising cost this node: the agent's own CPU, and its etcd traffic in a multi-node job.
  nlohmann::json usage = nullptr;
  if (started_ns_ != 0) {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                       static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
    usage = {{"action", "usage"}, {"seconds", Seconds(trace::MonotonicNanos() - started_ns_)}, {"cpu_seconds", cpu}};
  }
  if (rdzv_ != nullptr) {
    rdzv_->Leave(finished_);  // the last node out removes the job's keys from etcd
    if (!usage.is_null()) {
      const EtcdTraffic t = rdzv_->traffic();
      usage["etcd_requests"] = t.requests;
      usage["etcd_bytes_sent"] = t.bytes_sent;
      usage["etcd_bytes_received"] = t.bytes_received;
      usage["etcd_watch_events"] = rdzv_->watch_events();
      usage["summary_bytes_sent"] = rdzv_->summary_bytes_sent();
      usage["summary_bytes_received"] = rdzv_->summary_bytes_received();
    }
    rdzv_.reset();
  }
  if (!usage.is_null()) {
    Log(usage);
    started_ns_ = 0;
  }
  control_.reset();
  rings_.clear();
  if (events_log_ != nullptr) {
    std::fclose(events_log_);
    events_log_ = nullptr;
  }
  if (owns_run_dir_ && !config_.run_dir.empty()) {
    // What the ranks wrote when asked before a restart (their ring events, their Python stacks) is
    // what a person reads after the job: kept, with the directory; the rest goes.
    bool kept = false;
    Result<std::vector<std::string>> names = Env::Default()->GetChildren(config_.run_dir);
    for (const std::string& name : names.value_or(std::vector<std::string>{})) {
      const std::string path = config_.run_dir + "/" + name;
      const bool dump = name.rfind("dump.", 0) == 0 || name.rfind("stack.", 0) == 0;
      if (dump && Env::Default()->GetEntryType(path).value_or(EntryType::kOther) == EntryType::kFile &&
          Env::Default()->GetFileSize(path).value_or(0) > 0) {
        kept = true;
        continue;
      }
      Env::Default()->RemoveTree(path).IgnoreError();  // never follows a link inside it
    }
    if (kept) {
      std::cerr << "lifeline-agent: the ranks' dumps (ring events, Python stacks) are kept in " << config_.run_dir
                << std::endl;
    } else {
      Env::Default()->RemoveTree(config_.run_dir).IgnoreError();
    }
    owns_run_dir_ = false;
  }
}

void Agent::Log(nlohmann::json line) {
  nlohmann::json out = {{"time", IsoTimeNow()}, {"job", config_.job_id}, {"restart", restarts_}};
  out.update(line);
  const std::string text = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (events_log_ != nullptr) {
    std::fprintf(events_log_, "%s\n", text.c_str());
    std::fflush(events_log_);
  }
}

Status Agent::Setup() {
  // The node's lasting name: what its failures are remembered by, and the metrics' node label.
  if (config_.rendezvous.node_name.empty())
    config_.rendezvous.node_name = !config_.rendezvous.host.empty() ? config_.rendezvous.host : HostName();
  if (!config_.rendezvous.endpoint.empty()) {
    const RendezvousSettings& z = config_.rendezvous;
    config_.job_id = z.id;  // LIFELINE_JOB: the same on every node
    RendezvousConfig rc;
    rc.endpoint = z.endpoint;
    rc.job = z.id;
    rc.min_nodes = z.min_nodes;
    rc.max_nodes = z.max_nodes;
    rc.nproc_per_node = config_.nproc;
    rc.node_rank = z.node_rank;
    rc.host = z.host;
    rc.node_name = z.node_name;
    rc.standby = z.standby;
    rc.exclude_after = z.exclude_after;
    rc.exclude_after_sdc = config_.rollback.sdc_per_node;
    rc.exclude_window_seconds = z.exclude_window_seconds;
    rc.lease_seconds = z.lease_seconds;
    rc.last_call_seconds = z.last_call_seconds;
    rc.join_timeout_seconds = z.join_timeout_seconds;
    rc.watch = z.watch;
    if (config_.replication.enabled) {
      replication::ReplicationSettings rs;
      rs.bandwidth_bytes_per_second = static_cast<uint64_t>(config_.replication.bandwidth_mb_per_second * 1e6);
      rs.keep_last = config_.replication.keep_last;
      rs.memory_budget_bytes = static_cast<uint64_t>(config_.replication.memory_budget_mb * 1e6);
      const char* damage = std::getenv("LIFELINE_DRILL_DAMAGE_REPLICAS");
      rs.damage_in_transit = damage != nullptr && std::string(damage) == "1";
      Result<std::unique_ptr<replication::ReplicationService>> service = replication::ReplicationService::Start(rs);
      if (service.ok()) {
        replication_ = std::move(*service);
        rc.replica_port = replication_->port();
      } else {  // the job runs all the same, its snapshots in one node's memory only
        std::cerr << "lifeline-agent: snapshot replication off: " << service.status().ToString() << std::endl;
      }
    }
    LL_ASSIGN_OR_RETURN(rdzv_, Rendezvous::Connect(std::move(rc)));
  }
  if (config_.job_id.empty()) config_.job_id = NewJobId();
  if (config_.run_dir.empty()) {
    const char* runtime = getenv("XDG_RUNTIME_DIR");
    std::string base = runtime != nullptr && *runtime != '\0' ? runtime : "/tmp";
    std::string tmpl = base + "/lifeline-agent-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) return Status::FromErrno(errno, "run directory under " + base);
    config_.run_dir = tmpl;
    owns_run_dir_ = true;
  } else {
    LL_RETURN_IF_ERROR(PrepareRunDir(config_.run_dir));
  }
  ring_dir_ = config_.run_dir;
  if (!config_.events_log.empty()) {
    events_log_ = std::fopen(config_.events_log.c_str(), "ae");
    if (events_log_ == nullptr) return Status::FromErrno(errno, "events log " + config_.events_log);
  }
  Result<std::unique_ptr<ControlSocket>> control = ControlSocket::Listen(config_.run_dir + "/control.sock");
  if (!control.ok()) return control.status();
  control_ = std::move(*control);
  metrics_ = std::make_unique<AgentMetrics>(config_.job_id, static_cast<int>(config_.nproc), config_.rendezvous.node_name);

  if (!config_.metrics_addr.empty()) LL_RETURN_IF_ERROR(metrics_->Serve(config_.metrics_addr));
  return Status::OK();
}

Status Agent::CheckCheckpointDirFree() const {
  if (config_.checkpoint_dir.empty()) return Status::OK();
  // What would fail every launch alike is said before the first.
  const std::string& dir = config_.checkpoint_dir;
  if (IsObjectStorePath(dir)) {
    // No credentials, no such bucket, no access: the same at every launch.
    Result<std::vector<std::string>> listed = Env::Routing()->GetChildren(dir);
    if (!listed.ok()) return Status::FailedPrecondition("--checkpoint-dir " + dir, listed.status().ToString());
  }
  if (Env::Default()->FileExists(dir) && !Env::Default()->IsDirectory(dir))
    return Status::FailedPrecondition("--checkpoint-dir " + dir, "is a file, not a directory");
  if (Env::Default()->IsDirectory(dir) && ::access(dir.c_str(), W_OK | X_OK) != 0)
    return Status::FailedPrecondition("--checkpoint-dir " + dir, std::string("cannot be written: ") + std::strerror(errno));
  // The job's own ranks (another node's, launched first) are welcome: the agent gives its ranks
  // the job id (LIFELINE_JOB) and the lock says it.
  Status free = CheckNoOtherJobSaving(config_.checkpoint_dir, config_.job_id);
  if (free.code() != StatusCode::kFailedPrecondition) return Status::OK();  // unreadable: the ranks' saves decide then
  return free.Annotate("--checkpoint-dir");
}

Status Agent::Launch() {
  const int world = static_cast<int>(config_.nproc);  // local ranks (all of them on one node)
  const std::string checkpoint_dir =
      !config_.checkpoint_dir.empty() ? config_.checkpoint_dir : ReportedCheckpointDir(ring_dir_);
  if (rdzv_ != nullptr) LL_RETURN_IF_ERROR(JoinRound(checkpoint_dir));  // this node's place in the job
  if (ended_unplaced_) return Status::OK();
  if (plan_ && plan_->resume_location == "peer_memory") ShareResumeStep(checkpoint_dir);
  rings_.clear();
  for (int r = 0; r < world; ++r) {
    Result<std::unique_ptr<trace::TraceRing>> ring =
        trace::TraceRing::Create(trace::RingPath(ring_dir_, r), r, config_.ring_events);
    if (!ring.ok()) return ring.status().Annotate("trace ring of rank " + std::to_string(r));
    rings_.push_back(std::move(*ring));
  }
  ring_dropped_.assign(static_cast<size_t>(world), 0);
  const std::string n = std::to_string(world);
  std::map<std::string, std::string> env = {
      {"WORLD_SIZE", n},
      {"LOCAL_WORLD_SIZE", n},
      {"GROUP_RANK", "0"},
      {"GROUP_WORLD_SIZE", "1"},
      {"ROLE_WORLD_SIZE", n},
      {"MASTER_ADDR", config_.master_addr},
      // Port 0 picks a free port for every launch: a relaunch must not wait for the previous rank
      // 0's rendezvous port to leave TIME_WAIT.
      {"MASTER_PORT", std::to_string(config_.master_port != 0 ? config_.master_port : PickFreePort())},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restarts_)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(config_.restart.max_restarts)},
      {"LIFELINE_JOB", config_.job_id},
      {"LIFELINE_RESTART", std::to_string(restarts_)},
      // New for every launch, even of a job id reused by hand: a step belongs to one launch.
      {"LIFELINE_LAUNCH_ID", config_.job_id + ":" + launch_nonce_ + ":" + std::to_string(restarts_)},
      {"LIFELINE_AGENT", ring_dir_},
      {"LIFELINE_CONTROL", config_.run_dir + "/control.sock"},
  };
  // As torchrun, ranks sharing a machine's cores must not each start a thread per core; and, unlike
  // torchrun, the same for every layout of a job of more than one rank: CPU kernels sum in an order
  // that depends on their thread count, so a job of 2 ranks must compute alike on 1 node x 2 ranks
  // and on 2 nodes x 1 (issue 51, item 7).
  const uint32_t job_ranks = plan_ ? plan_->world_size : static_cast<uint32_t>(world);
  if (job_ranks > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    env["OMP_NUM_THREADS"] = "1";
    if (restarts_ == 0)
      std::cerr << "lifeline-agent: OMP_NUM_THREADS=1 for each rank (unset, and the job has " << job_ranks
                << " ranks: the same on every node layout, so that it computes alike); set it to tune"
                << std::endl;
  }
  // Python ranks write through to the agent, so nothing they printed is lost when they are stopped.
  if (std::getenv("PYTHONUNBUFFERED") == nullptr) env["PYTHONUNBUFFERED"] = "1";
  // Python ranks trace their steps and collectives through a startup hook placed first on their
  // path; it runs the user's own sitecustomize after it.
  if (config_.python_tracing) {
    std::string looked;
    const std::string startup = FindPythonStartupDir(&looked);
    if (!startup.empty()) {
      const char* path = std::getenv("PYTHONPATH");
      env["PYTHONPATH"] = path != nullptr && *path != '\0' ? startup + ":" + path : startup;
      if (!config_.python_step_from.empty()) env["LIFELINE_STEP_FROM"] = config_.python_step_from;
    } else if (restarts_ == 0) {
      std::cerr << "lifeline-agent: Python ranks are not traced: no lifeline_startup/sitecustomize.py in "
                << looked << " (set LIFELINE_PYTHONPATH to the directory holding lifeline/ and lifeline_startup/)"
                << std::endl;
    }
  }
  // Every rank of this launch resumes from one step, fixed here: the ranks' own views (memory
  // tiers, a commit landing meanwhile) may differ.
  nlohmann::json resume = nullptr;
  if (plan_) {
    PlanEnvironment(&env, &resume);
  } else if (!checkpoint_dir.empty()) {
    // A rollback fixed the step (the newest before its fault); otherwise the newest sound one.
    Result<ResumePoint> point = rollback_point_ ? Result<ResumePoint>(*rollback_point_)
                                                : FindResumePoint(Env::Routing(), checkpoint_dir);
    if (!point.ok()) return point.status().Annotate("choosing the resume step");
    env["LIFELINE_RESUME_STEP"] = point->EnvValue();
    env["LIFELINE_RESUME_DIR"] = IsObjectStorePath(checkpoint_dir)
                                     ? checkpoint_dir
                                     : std::filesystem::absolute(checkpoint_dir).lexically_normal().string();
    resume = {{"directory", checkpoint_dir}, {"step", point->step ? nlohmann::json(*point->step) : nlohmann::json(nullptr)},
              {"location", point->location}};
    if (rollback_point_) resume["rollback"] = true;
    // The data the rollbacks so far skip, of the steps ahead of this launch (lifeline.skip_steps()).
    const std::vector<StepRange> skip = supervisor_->SkipSteps(point->step);
    if (!skip.empty()) {
      env["LIFELINE_SKIP_STEPS"] = FormatStepRanges(skip);
      resume["skip_steps"] = env["LIFELINE_SKIP_STEPS"];
    }
  }
  rollback_point_.reset();
  if (!config_.checkpoint_dir.empty() && resume.is_object() && resume.value("step", nlohmann::json()).is_null()) {
    // The operator named a directory: a launch that finds nothing there (a mistyped path, a first
    // run) says so, rather than training from scratch without a word.
    std::cerr << "lifeline-agent: no checkpoint in " << config_.checkpoint_dir << ": "
              << (restarts_ == 0 ? "starting from step 0" : "starting again from step 0") << std::endl;
  }
  // Spares for the relaunches, when the command is a Python script: started once this launch ran.
  if (spares_ == nullptr && config_.restart.prestart && config_.restart.max_restarts > 0) {
    std::string looked;
    const std::string startup = FindPythonStartupDir(&looked);
    const std::optional<PythonScriptCommand> script = ParsePythonScript(config_.command);
    if (script && !startup.empty() && Env::Default()->FileExists(startup + "/_lifeline_prestart.py"))
      spares_ = std::make_unique<SparePool>(*script, startup + "/_lifeline_prestart.py");
  }
  launch_ran_ns_ = 0;
  if (spares_ != nullptr) {
    spare_env_ = ProcessEnvironment(env);
    spare_env_["LIFELINE_PRESTART"] = "1";
  }
  launcher_ = std::make_unique<Launcher>(config_.command, env);
  LL_RETURN_IF_ERROR(launcher_->Start(world, static_cast<int>(rank_base_), spares_.get()));
  int prestarted = 0;
  for (const RankProcess& r : launcher_->ranks()) prestarted += r.prestarted ? 1 : 0;
  SupervisedLaunch launched;
  launched.world = world;
  launched.rank_base = static_cast<int>(rank_base_);
  launched.restart = restarts_;
  launched.now_ns = trace::MonotonicNanos();
  launched.plan = plan_;
  supervisor_->Launched(launched);
  metrics_->Launched(world, static_cast<int>(rank_base_));
  if (plan_) {
    metrics_->JoinedRound(rdzv_->node_id(), plan_->group_rank, static_cast<int>(plan_->nodes.size()), plan_->round);
  } else {
    metrics_->SetRound(restarts_);
  }
  std::vector<int> pids;
  for (const RankProcess& r : launcher_->ranks()) pids.push_back(r.pid);
  nlohmann::json line = {{"action", "launch"}, {"ranks", world}, {"pids", pids}, {"command", config_.command}, {"resume", resume}};
  if (spares_ != nullptr) line["prestarted"] = prestarted;
  if (plan_) {
    line["first_rank"] = rank_base_;
    line["world_size"] = plan_->world_size;
  }
  resume_source_ = resume.is_object() ? resume.value("location", "") : "";
  resume_step_.reset();
  resume_dir_.clear();
  if (resume.is_object() && resume["step"].is_number_unsigned()) {
    resume_step_ = resume["step"].get<uint64_t>();
    resume_dir_ = resume.value("directory", "");
  }
  mismatch_said_ = false;
  tier_checked_ = false;
  Log(line);
  return Status::OK();
}

void Agent::FillSpares(uint64_t now_ns) {
  if (spares_ == nullptr) return;
  spares_->Collect();
  if (!spares_->failure().empty()) {
    if (!spares_off_said_) {
      spares_off_said_ = true;
      Log({{"action", "prestart_off"}, {"reason", spares_->failure()}});
      std::cerr << "lifeline-agent: relaunched ranks start afresh: " << spares_->failure() << std::endl;
    }
    return;
  }
  if (restarts_ >= config_.restart.max_restarts) {  // no relaunch left to hand them
    spares_.reset();
    return;
  }
  if (spares_->waiting() >= config_.nproc) return;
  if (launch_ran_ns_ == 0) {
    if (!supervisor_->LaunchRan(now_ns)) return;
    launch_ran_ns_ = now_ns;
  }
  if (now_ns - launch_ran_ns_ < static_cast<uint64_t>(config_.restart.prestart_after_seconds * 1e9)) return;
  const size_t before = spares_->waiting();
  spares_->Fill(config_.nproc, spare_env_);
  if (spares_->waiting() > before) Log({{"action", "prestart"}, {"pids", spares_->pids()}});
}

void Agent::CheckRanksMemoryTier(bool last_look) {
  if (replication_ == nullptr || tier_checked_) return;
  // Two small reads, once a second at most, not at every poll: the ranks may never report a tier.
  // And once more when the ranks have exited, so that a job shorter than that is told too.
  const uint64_t now = trace::MonotonicNanos();
  if (!last_look && now - tier_looked_ns_ < 1'000'000'000ull) return;
  tier_looked_ns_ = now;
  const std::string dir = ReportedCheckpointDir(ring_dir_);
  Result<std::string> reported = ReadFileToString(Env::Default(), JoinPath(ring_dir_, trace::kMemoryTierFile), 64 << 10);
  if (dir.empty() || !reported.ok()) return;  // not yet (or the tier is off)
  tier_checked_ = true;
  Result<std::string> mine = FindMemoryTierOf(dir);
  if (mine.ok() && *mine == *reported) return;
  const std::string message = "the ranks keep their memory tier in " + *reported + ", but this agent replicates " +
                              (mine.ok() ? *mine : std::string("the tier of ") + dir) +
                              ": LIFELINE_MEMORY_TIER_DIR differs between the agent and its ranks, so their "
                              "snapshots are not replicated to other nodes (set it for the agent, not the script)";
  Log({{"action", "replication_blind"}, {"ranks_tier", *reported}, {"agent_tier", mine.ok() ? *mine : ""},
       {"message", message}});
  std::cerr << "lifeline-agent: warning: " << message << std::endl;
}

void Agent::CheckResumeStep() {
  if (!resume_step_ || mismatch_said_) return;
  // A rank that announced a fresh start (its load found nothing) where the launch was to resume
  // from a step: its script's Checkpointer looks somewhere else (a mistyped path), and the job
  // would silently train again from scratch.
  std::vector<int> fresh;
  const Timeline& timeline = supervisor_->timeline();
  for (int r = 0; r < timeline.world(); ++r) {
    const RankTimeline& v = timeline.rank(r);
    if (v.started && v.resumed_from == trace::kNoStep) fresh.push_back(static_cast<int>(rank_base_) + r);
  }
  if (fresh.empty()) return;
  mismatch_said_ = true;
  const std::string opened = ReportedCheckpointDir(ring_dir_);
  const std::string message =
      "ranks " + JoinRanks(fresh) + " started from scratch, but this launch was to resume from step " +
      std::to_string(*resume_step_) + " of " + resume_dir_ +
      (opened.empty() || opened == resume_dir_ ? std::string() : "; their Checkpointer opened " + opened) +
      ": is the script's checkpoint path right?";
  Log({{"action", "resume_mismatch"}, {"ranks", fresh}, {"expected_step", *resume_step_},
       {"expected_directory", resume_dir_}, {"opened_directory", opened}, {"message", message}});
  std::cerr << "lifeline-agent: warning: " << message << std::endl;
}

namespace {

// The holder's side of ShareResumeStep: step `step` of `tier` to node `to`. The other node may
// take the plan a moment after this one, and until then has nowhere to put the step and says so:
// a few more tries, for up to 5 s.
Result<replication::ReplicationPass> SendResumeStep(const Result<std::string>& tier, uint64_t step, const RoundNode& to) {
  if (!tier.ok()) return tier.status();
  if (to.replica_port == 0) return Status::Unavailable(to.id, "takes no replicas");
  replication::ReplicaSendOptions peer;
  peer.host = to.host;
  peer.port = static_cast<uint16_t>(to.replica_port);
  Result<replication::ReplicationPass> sent = replication::SendStep(*tier, step, peer);
  for (int attempt = 0; attempt < 10 && !sent.ok() && g_stop_signal == 0; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    sent = replication::SendStep(*tier, step, peer);
  }
  return sent;
}

}  // namespace

void Agent::ShareResumeStep(const std::string& local_checkpoint_dir) {
  const uint64_t step = *plan_->resume_step;
  const std::string dir = !plan_->checkpoint_dir.empty() ? plan_->checkpoint_dir : local_checkpoint_dir;
  auto holds = [step](const RoundNode& n) {
    return std::find(n.resume.memory_steps.begin(), n.resume.memory_steps.end(), step) != n.resume.memory_steps.end();
  };
  int holder = -1;
  for (size_t g = 0; g < plan_->nodes.size() && holder < 0; ++g)
    if (holds(plan_->nodes[g])) holder = static_cast<int>(g);
  if (holder < 0 || dir.empty()) return;
  const RoundNode& from = plan_->nodes[holder];
  if (holder == plan_->group_rank) {
    // The first node holding the step sends it whole to every node that lacks it; training is
    // stopped everywhere meanwhile, so at the network's full speed.
    Result<std::string> tier = FindMemoryTierOf(dir);
    for (const RoundNode& to : plan_->nodes) {
      if (holds(to)) continue;
      Result<replication::ReplicationPass> sent = SendResumeStep(tier, step, to);
      if (sent.ok()) {
        Log({{"action", "sent_resume_step"}, {"step", step}, {"to", to.id}, {"bytes", sent->bytes}, {"seconds", sent->seconds}});
      } else {
        Log({{"action", "sent_resume_step_failed"}, {"step", step}, {"to", to.id}, {"error", sent.status().ToString()}});
      }
    }
    return;
  }
  if (holds(plan_->nodes[plan_->group_rank])) return;
  // This node lacks it (a replacement, or a node whose memory went): it arrives from `from`.
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && g_stop_signal == 0) {
    Result<std::string> tier = MemoryTierRootOf(dir);
    if (tier.ok() && replication::TierHoldsStep(*tier, step)) {
      Log({{"action", "fetched_resume_step"},
           {"step", step},
           {"from", from.id},
           {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}});
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Log({{"action", "fetch_resume_step_failed"}, {"step", step}, {"from", from.id},
       {"error", "step " + std::to_string(step) + " did not arrive within 120 s; the ranks will find it nowhere"}});
}

namespace {

// The job's time account for `status` and the end of the events log.
nlohmann::json TimeAccountJson(const TimeLedger& ledger, uint64_t now) {
  nlohmann::json lost = nlohmann::json::object();
  for (const char* phase : kLostPhases) lost[phase] = ledger.lost_seconds(phase);
  return {{"ettr", ledger.ettr(now)},
          {"wall_seconds", ledger.wall_seconds(now)},
          {"productive_seconds", ledger.productive_seconds()},
          {"restarts_settled", ledger.restarts().size()},
          {"lost_seconds", lost},
          {"steps_redone", ledger.steps_redone()}};
}

nlohmann::json ExcludedJson(const std::vector<ExcludedNode>& excluded) {
  nlohmann::json out = nlohmann::json::array();
  for (const ExcludedNode& x : excluded)
    out.push_back({{"node", x.name}, {"failures", x.failures}, {"last_cause", x.last_cause}, {"kept", x.kept}});
  return out;
}

}  // namespace

Status Agent::JoinRound(const std::string& checkpoint_dir) {
  ResumeOffer offer;
  if (!checkpoint_dir.empty()) {
    Result<ResumeOffer> found = FindResumeOffer(Env::Routing(), checkpoint_dir);
    if (!found.ok()) return found.status().Annotate("choosing the resume step");
    offer = std::move(*found);
  }
  const RendezvousSettings& z = config_.rendezvous;
  std::cerr << "lifeline-agent: node " << rdzv_->node_id() << " joining job " << z.id << " (" << z.min_nodes
            << (z.max_nodes != z.min_nodes ? ":" + std::to_string(z.max_nodes) : std::string()) << " nodes) at etcd "
            << z.endpoint << std::endl;
  Result<RoundPlan> plan = rdzv_->Join(offer, [] { return g_stop_signal != 0; }, [this](const std::string& what) {
    Log({{"action", "waiting_for_nodes"}, {"message", what}});
    std::cerr << "lifeline-agent: waiting for nodes: " << what << std::endl;
  });
  if (!plan.ok()) return plan.status();
  if (plan->finished) {  // a spare or an excluded node, never placed again before the job ended
    ended_unplaced_ = true;
    finished_ = true;
    Log({{"action", "finished_without_this_node"},
         {"node", config_.rendezvous.node_name},
         {"round", plan->round},
         {"message", "the job finished without this node: it was not placed (a spare, or excluded as bad)"}});
    std::cerr << "lifeline-agent: the job finished without this node (" << config_.rendezvous.node_name << ")" << std::endl;
    return Status::OK();
  }
  plan_ = std::move(*plan);
  restarts_ = static_cast<uint32_t>(plan_->round);
  rank_base_ = plan_->rank_base;
  // The job's skipped steps, whichever node's rollback decided them: the same for every node.
  supervisor_->AdoptSkipSteps(plan_->skip_steps);
  if (plan_->rollback) ClearAfterRollbackRound(checkpoint_dir);
  nlohmann::json nodes = nlohmann::json::array();
  for (const RoundNode& n : plan_->nodes) nodes.push_back(n.id);
  Log({{"action", "rendezvous"},
       {"round", plan_->round},
       {"node", rdzv_->node_id()},
       {"group_rank", plan_->group_rank},
       {"nodes", nodes},
       {"world_size", plan_->world_size},
       {"first_rank", plan_->rank_base},
       {"master", plan_->master_addr + ":" + std::to_string(plan_->master_port)},
       {"excluded", ExcludedJson(plan_->excluded)},
       {"spares", plan_->spares}});
  metrics_->NodesExcluded(static_cast<int>(std::count_if(plan_->excluded.begin(), plan_->excluded.end(),
                                                         [](const ExcludedNode& x) { return !x.kept; })));
  for (const ExcludedNode& x : plan_->excluded) {
    Log({{"action", x.kept ? "node_kept" : "node_excluded"},
         {"round", plan_->round},
         {"node", x.name},
         {"failures", x.failures},
         {"last_cause", x.last_cause},
         {"reason", x.kept ? "its ranks caused " + std::to_string(x.failures) +
                                 " restarts within the window, but the job has too few nodes without it"
                           : "its ranks caused " + std::to_string(x.failures) + " restarts within " +
                                 std::to_string(static_cast<int>(config_.rendezvous.exclude_window_seconds)) +
                                 " s; `lifeline-agent ctl SOCKET readmit " + x.name + "` takes it back"}});
    std::cerr << "lifeline-agent: node " << x.name << (x.kept ? " kept although bad" : " excluded") << ": "
              << x.failures << " restarts caused (last: " << x.last_cause << ")" << std::endl;
  }
  if (!plan_->resume_note.empty()) {
    // A newer step lives on in part only: say what the job falls back to, and why.
    Log({{"action", "resume_fallback"},
         {"step", plan_->resume_step ? nlohmann::json(*plan_->resume_step) : nlohmann::json(nullptr)},
         {"location", plan_->resume_location},
         {"reason", plan_->resume_note}});
    std::cerr << "lifeline-agent: " << plan_->resume_note << std::endl;
  }
  if (replication_ != nullptr) {
    // This node's snapshots go to the peers its place in the round gives it, never to itself.
    replication::ReplicationTarget t;
    t.checkpoint_dir = !plan_->checkpoint_dir.empty() ? plan_->checkpoint_dir : checkpoint_dir;
    t.node = rdzv_->node_id();
    t.world_size = plan_->world_size;
    t.first_rank = plan_->rank_base;
    t.ranks = config_.nproc;
    t.find_checkpoint_dir = [run_dir = ring_dir_] { return ReportedCheckpointDir(run_dir); };
    if (plan_->group_rank >= 0) {
      for (uint32_t g : replication::ReplicaPeers(static_cast<uint32_t>(plan_->group_rank),
                                                  static_cast<uint32_t>(plan_->nodes.size()),
                                                  config_.replication.group_size)) {
        const RoundNode& peer = plan_->nodes[g];
        if (peer.replica_port != 0) t.peers.push_back({peer.id, peer.host, static_cast<uint16_t>(peer.replica_port)});
      }
    }
    replication_->SetTarget(t);
  }
  std::cerr << "lifeline-agent: round " << plan_->round << ": node " << plan_->group_rank << " of "
            << plan_->nodes.size() << ", global ranks " << plan_->rank_base << "-"
            << plan_->rank_base + config_.nproc - 1 << " of " << plan_->world_size << std::endl;
  return Status::OK();
}

void Agent::ClearAfterRollbackRound(const std::string& local_checkpoint_dir) {
  const RoundRollback& r = *plan_->rollback;
  const std::string dir = !plan_->checkpoint_dir.empty() ? plan_->checkpoint_dir : local_checkpoint_dir;
  nlohmann::json line = {{"action", "rollback_round"},
                         {"round", plan_->round},
                         {"decided_by", r.by},
                         {"anomaly", r.anomaly},
                         {"anomaly_step", r.anomaly_step},
                         {"ranks", r.ranks},
                         {"before", r.before},
                         {"step", plan_->resume_step ? nlohmann::json(*plan_->resume_step) : nlohmann::json(nullptr)},
                         {"location", plan_->resume_location},
                         {"skip_steps", FormatStepRanges(supervisor_->SkipSteps(plan_->resume_step))}};
  if (!dir.empty()) {
    // The steps after the round's choice go from this node's memory tier (a later restart would
    // offer them), and, by the node of group rank 0, from the shared directory: the relaunched
    // ranks save those step numbers again. Before this node's ranks start, so before any save.
    Result<std::vector<uint64_t>> removed =
        RemoveStepsAfterRollback(Env::Default(), dir, plan_->resume_step, /*disk=*/plan_->group_rank == 0);
    if (removed.ok()) {
      line["removed"] = *removed;
    } else {
      line["error"] = removed.status().ToString();
      std::cerr << "lifeline-agent: warning: clearing the steps after the rollback's: " << removed.status().ToString()
                << std::endl;
    }
  }
  Log(line);
  std::cerr << "lifeline-agent: round " << plan_->round << " rolls back (" << r.anomaly << " at step " << r.anomaly_step
            << ", decided by " << r.by << "): every node resumes from "
            << (plan_->resume_step ? "step " + std::to_string(*plan_->resume_step) : std::string("scratch")) << std::endl;
}

void Agent::PlanEnvironment(std::map<std::string, std::string>* env, nlohmann::json* resume) const {
  const std::string world = std::to_string(plan_->world_size);
  (*env)["WORLD_SIZE"] = world;
  (*env)["ROLE_WORLD_SIZE"] = world;
  (*env)["GROUP_RANK"] = std::to_string(plan_->group_rank);
  (*env)["GROUP_WORLD_SIZE"] = std::to_string(plan_->nodes.size());
  (*env)["MASTER_ADDR"] = plan_->master_addr;
  (*env)["MASTER_PORT"] = std::to_string(plan_->master_port);
  (*env)["TORCHELASTIC_RESTART_COUNT"] = std::to_string(plan_->round);
  (*env)["LIFELINE_RESTART"] = std::to_string(plan_->round);
  (*env)["LIFELINE_LAUNCH_ID"] = plan_->launch_id;
  // Every node resumes from the round's step, in the directory the plan names (shared storage).
  if (!plan_->checkpoint_dir.empty()) {
    ResumePoint point;
    point.step = plan_->resume_step;
    point.location = plan_->resume_location;
    (*env)["LIFELINE_RESUME_STEP"] = point.EnvValue();
    (*env)["LIFELINE_RESUME_DIR"] = IsObjectStorePath(plan_->checkpoint_dir)
                                        ? plan_->checkpoint_dir
                                        : std::filesystem::absolute(plan_->checkpoint_dir).lexically_normal().string();
    *resume = {{"directory", plan_->checkpoint_dir},
               {"step", point.step ? nlohmann::json(*point.step) : nlohmann::json(nullptr)},
               {"location", point.location}};
    if (plan_->rollback) (*resume)["rollback"] = true;
    // The job's skipped steps ahead of the round's step: every node computes them from the same
    // ranges (the plan's) and the same step, so every rank reads the same list.
    const std::vector<StepRange> skip = supervisor_->SkipSteps(plan_->resume_step);
    if (!skip.empty()) {
      (*env)["LIFELINE_SKIP_STEPS"] = FormatStepRanges(skip);
      (*resume)["skip_steps"] = (*env)["LIFELINE_SKIP_STEPS"];
    }
  }
}

void Agent::ReadReplication() {
  if (replication_ == nullptr) return;
  const replication::ReplicationStats s = replication_->stats();
  metrics_->Replication(s);
  if (s.replicated_step && s.replicated_step != logged_replicated_step_) {
    logged_replicated_step_ = s.replicated_step;
    Log({{"action", "replicated"},
         {"step", *s.replicated_step},
         {"ranks", {rank_base_, rank_base_ + config_.nproc - 1}},
         {"bytes_sent_total", s.bytes_sent}});
  }
  // Once per distinct reason: a peer that stays away must not flood the log (the metric counts).
  if (s.failures > logged_replication_failures_ && s.last_error != logged_replication_error_) {
    logged_replication_error_ = s.last_error;
    Log({{"action", "replication_failed"}, {"failures", s.failures}, {"error", s.last_error}});
  }
  logged_replication_failures_ = s.failures;
  if (s.over_budget > 0 && !logged_over_budget_) {
    logged_over_budget_ = true;
    Log({{"action", "replica_over_budget"},
         {"memory_budget_bytes", s.memory_budget_bytes},
         {"message", "a peer's replica did not fit this node's memory budget and was refused (not replicated); "
                     "later ones are counted in lifeline_replicas_over_budget_total"}});
  }
}

void Agent::DrainRings(uint64_t now) {
  for (size_t r = 0; r < rings_.size(); ++r) {
    scratch_.clear();
    rings_[r]->Drain(&scratch_);
    for (const trace::Event& e : scratch_) {
      const TimelineChange change = supervisor_->Observe(static_cast<int>(r), e);
      if (change.rank >= 0) metrics_->Observe(supervisor_->timeline(), change);
    }
    const uint64_t dropped = rings_[r]->header()->dropped.load(std::memory_order_relaxed);
    metrics_->RingDropped(static_cast<int>(r), dropped);
    if (r < ring_dropped_.size() && dropped > ring_dropped_[r]) {
      // What the rank did while its events were lost is unknown: a collective whose end was lost
      // must not look hung. Said once per burst, with the count.
      supervisor_->MarkGap(static_cast<int>(r), now);
      Log({{"action", "events_lost"},
           {"rank", static_cast<int>(rank_base_ + r)},
           {"dropped", dropped - ring_dropped_[r]},
           {"dropped_total", dropped},
           {"note", "the rank's trace ring was full (the agent stalled or fell behind); detectors restart their "
                    "watch of it from now"}});
      ring_dropped_[r] = dropped;
    }
  }
}

void Agent::CheckResumed(uint64_t now) {
  if (!restart_detected_ns_) return;
  uint64_t resumed_at = 0;
  uint64_t first_step = trace::kNoStep, from = trace::kNoStep;
  const Timeline& timeline = supervisor_->timeline();
  for (const RankTimeline& v : timeline.ranks()) {
    if (!v.began_step) return;
    resumed_at = std::max(resumed_at, v.last_event_ns);
    // The step the ranks resumed at, not the one they reached by this poll: a fast step may have
    // ended before the agent looked.
    first_step = std::min(first_step, v.first_step);
    if (v.resumed_from != trace::kNoStep) from = v.resumed_from;
  }
  nlohmann::json line = {{"action", "resumed"},
                         {"step", first_step},
                         {"seconds_since_detection", Seconds(now - *restart_detected_ns_)},
                         {"seconds_since_launch", Seconds(now - supervisor_->launched_ns())}};
  line["resumed_from_checkpoint"] = from == trace::kNoStep ? nlohmann::json(nullptr) : nlohmann::json(from);
  // Where the ranks say they loaded from (a rank that read its memory tier says "memory" whatever
  // the plan expected); the plan's choice when they did not say.
  int memory = 0, disk = 0;
  for (const RankTimeline& v : timeline.ranks()) {
    memory += v.resumed_source == trace::ResumeSource::kMemoryTier;
    disk += v.resumed_source == trace::ResumeSource::kDisk;
  }
  std::string source = resume_source_;  // memory, peer_memory or disk
  if (memory + disk > 0) source = disk > 0 ? (memory == 0 ? "disk" : "mixed")
                                           : (resume_source_ == "peer_memory" ? resume_source_ : "memory");
  if (!source.empty()) line["source"] = source;
  if (memory > 0 && disk > 0) line["ranks_from_memory"] = memory;
  if (!resume_source_.empty() && source != resume_source_) line["planned_source"] = resume_source_;
  Log(line);
  std::cerr << "lifeline-agent: resumed at step " << first_step << ", "
            << Seconds(now - *restart_detected_ns_) << " s after the anomaly was detected" << std::endl;
  restart_detected_ns_.reset();
}

void Agent::RequestDumps(const std::string& reason) {
  std::vector<int> asked;
  for (size_t r = 0; r < rings_.size(); ++r) {
    const int sig = rings_[r]->header()->dump_signal;
    if (sig > 0 && launcher_->Signal(static_cast<int>(r), sig)) asked.push_back(static_cast<int>(r));
  }
  Log({{"action", "dump"}, {"reason", reason}, {"ranks", asked}, {"directory", ring_dir_}});
}

void Agent::SayDumps(const std::string& why) {
  std::vector<std::string> files;
  for (const std::string& name : Env::Default()->GetChildren(ring_dir_).value_or(std::vector<std::string>{}))
    if (name.rfind("dump.", 0) == 0 || name.rfind("stack.", 0) == 0) files.push_back(name);
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::cerr << "lifeline-agent: " << why << ": no rank wrote its stack (ranks that are not Python, or stuck in C "
              << "code that holds the GIL, cannot)" << std::endl;
    return;
  }
  std::string list;
  for (const std::string& f : files) list += (list.empty() ? "" : ", ") + f;
  std::cerr << "lifeline-agent: " << why << ": the ranks' Python stacks and last events are in " << ring_dir_ << "/ ("
            << list << ")" << std::endl;
}

void Agent::SayStopped(int ranks, int killed_after_grace) {
  const std::string dir = !config_.checkpoint_dir.empty() ? config_.checkpoint_dir : ReportedCheckpointDir(ring_dir_);
  std::string newest = "no checkpoint directory was named or reported";
  if (!dir.empty()) {
    Result<ResumePoint> point = FindResumePoint(Env::Routing(), dir);
    newest = !point.ok() ? "the checkpoints of " + dir + " cannot be read: " + point.status().ToString()
             : point->step ? "the newest checkpoint is step " + std::to_string(*point->step) + " of " + dir + " (" +
                                 point->location + "): a relaunch resumes from it"
                           : "no complete checkpoint in " + dir;
  }
  const std::string stopped =
      ranks == 0 ? "the ranks were stopped already"
                 : "stopped " + std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") +
                       (killed_after_grace > 0 ? " (" + std::to_string(killed_after_grace) + " killed after the grace period)" : "");
  std::cerr << "lifeline-agent: " << SignalName(g_stop_signal) << ": " << stopped << ", after " << restarts_
            << " restart(s); " << newest << std::endl;
}

PollDecision Agent::Poll(uint64_t now) {
  PollInput in;
  in.now_ns = now;
  in.unix_ms = UnixMillisNow();
  for (int rank : launcher_->Reap()) in.exits.push_back({rank, launcher_->ranks()[rank].wait_status});
  RendezvousNews news;
  if (rdzv_ != nullptr) {
    news = rdzv_->TakeNews();
    metrics_->Rendezvous(news.leader, !news.etcd_unreachable);
    in.news = &news;
    for (const std::string& e : news.summary_errors) {
      Log({{"action", "summary_refused"}, {"message", e}});
      std::cerr << "lifeline-agent: warning: " << e << std::endl;
    }
  }
  PollDecision decision = supervisor_->Poll(in);
  if (!in.exits.empty()) metrics_->RankExited(supervisor_->timeline());
  metrics_->TimeAccount(supervisor_->ledger(), now);
  if (decision.progress) rdzv_->PublishProgress(std::move(*decision.progress));
  for (const DigestQuery& q : decision.digest_queries) {
    // The replicas' folds differ: the nodes of the ranks are asked which tensors.
    const Status asked = rdzv_->AskDigests(plan_ ? plan_->round : 0, q);
    nlohmann::json line = {{"action", "digest_query"}, {"step", q.step}, {"ranks", q.ranks}, {"ok", asked.ok()}};
    if (!asked.ok()) line["error"] = asked.ToString();
    Log(std::move(line));
  }
  for (nlohmann::json& line : decision.records) Log(std::move(line));
  return decision;
}

void Agent::Act(const std::vector<RaisedAnomaly>& raised) {
  for (const RaisedAnomaly& r : raised) {
    const Anomaly& a = r.anomaly;
    ++anomalies_;
    metrics_->Anomaly(a.kind, a.ranks);
    Log(r.record);
    std::cerr << "lifeline-agent: " << a.kind << " (ranks " << JoinRanks(a.ranks) << "): " << a.message << " -> "
              << ActionName(r.action) << std::endl;
    if (r.action == Action::kDump) RequestDumps(a.kind);
    if (a.kind == "sdc_suspect" && a.step) MarkSuspect(a);
  }
}

// The replicas of step a.step differ: the step is marked in the checkpoint, so that no launch
// resumes from it (resume.cc, Checkpointer::Load(latest)) and `lifeline ls`/`verify` show it.
void Agent::MarkSuspect(const Anomaly& a) {
  const std::string dir = !config_.checkpoint_dir.empty() ? config_.checkpoint_dir : ReportedCheckpointDir(ring_dir_);
  const int64_t unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::json marker = {{"format", "lifeline-suspect-1"}, {"kind", a.kind},       {"step", *a.step},
                           {"ranks", a.ranks},               {"message", a.message}, {"evidence", a.evidence},
                           {"job", config_.job_id},          {"detected_unix_ms", unix_ms}};
  std::string text = marker.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > (64 << 10)) {
    marker["evidence"] = {{"truncated", true}};
    text = marker.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  const Status s = dir.empty() ? Status::FailedPrecondition("step " + std::to_string(*a.step),
                                                            "no checkpoint directory known to mark suspect")
                               : MarkStepSuspect(dir, *a.step, text);
  nlohmann::json line = {{"action", "mark_suspect"}, {"step", *a.step}, {"directory", dir}, {"ok", s.ok()}};
  if (!s.ok()) {
    line["error"] = s.ToString();
    std::cerr << "lifeline-agent: cannot mark step " << *a.step << " suspect: " << s.ToString() << std::endl;
  }
  Log(std::move(line));
}

bool Agent::Restart(const Anomaly& reason, uint64_t detected_ns, bool rollback) {
  if (reason.kind == "hang") {
    // The hung ranks' last events say where they stopped: ask for them before they are killed.
    RequestDumps("hang");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    SayDumps("hang");
  }
  const int killed = launcher_->StopAll(config_.restart.grace_seconds);
  Log({{"action", "stop"}, {"reason", reason.kind}, {"killed_after_grace", killed}});
  std::vector<RankEnd> ends;
  for (const RankProcess& p : launcher_->ranks()) ends.push_back({p.wait_status, p.last_line});
  const RestartPlan plan =
      rollback ? PlanRollback(reason, ends) : supervisor_->PlanRestart(reason, trace::MonotonicNanos(), ends);
  // Which node's ranks caused it, remembered with the job: a node that keeps failing is left out.
  const std::string culprit_node = reason.ranks.empty() ? std::string() : supervisor_->NodeOfRank(reason.ranks.front());
  metrics_->RestartCause(reason.kind, culprit_node);
  // An sdc_suspect too: its node's machine corrupted a replica (counted apart: rendezvous.h).
  if (rdzv_ != nullptr && plan_ &&
      (reason.kind == "dead" || reason.kind == "hang" || reason.kind == "node_lost" || reason.kind == "sdc_suspect")) {
    std::set<std::string> nodes;
    for (int r : reason.ranks) nodes.insert(supervisor_->NodeOfRank(r));
    for (const std::string& node : nodes)
      rdzv_->RecordNodeFailure(plan_->round, node, reason.kind + " (ranks " + JoinRanks(reason.ranks) + ")", reason.kind)
          .IgnoreError();
  }
  if (!plan.give_up.empty()) {
    give_up_reason_ = plan.give_up;
    requeue_may_help_ = plan.job_wide && !plan.incurable && supervisor_->RequeueMayHelp();
    Log({{"action", "give_up"}, {"reason", give_up_reason_}, {"requeue_may_help", requeue_may_help_},
         {"exit_code", requeue_may_help_ ? kExitRequeue : kExitFailed},
         {"time", TimeAccountJson(supervisor_->ledger(), trace::MonotonicNanos())}});
    if (plan.job_wide && rdzv_ != nullptr)  // every node ends with it, and with its exit code
      rdzv_->GiveUp(give_up_reason_ + (requeue_may_help_ ? kRequeueMark : "")).IgnoreError();
    return false;
  }
  if (rdzv_ != nullptr) {
    // The budget is the job's: the round number counts its restarts. Another node may have opened
    // the next round for the same fault meanwhile; either way every node joins it.
    Result<uint64_t> next =
        rdzv_->OpenNextRound(plan_ ? plan_->round : restarts_, pending_rollback_ ? &*pending_rollback_ : nullptr);
    pending_rollback_.reset();
    if (!next.ok()) {
      give_up_reason_ = "cannot open the next round in etcd: " + next.status().ToString();
      Log({{"action", "give_up"}, {"reason", give_up_reason_}});
      return false;
    }
  }
  ++restarts_;
  metrics_->Restarted();
  Log({{"action", "restart"},
       {"reason", reason.kind},
       {"rollback", rollback},
       {"ranks", reason.ranks},
       {"node", culprit_node},
       {"backoff_seconds", plan.backoff_seconds},
       {"max_restarts", config_.restart.max_restarts}});
  std::cerr << "lifeline-agent: " << (rollback ? "rollback (restart " : "restart ") << restarts_ << " of "
            << config_.restart.max_restarts << (rollback ? ")" : "") << " in " << plan.backoff_seconds << " s ("
            << reason.kind << ")" << std::endl;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(plan.backoff_seconds);
  while (std::chrono::steady_clock::now() < until && g_stop_signal == 0) {
    if (control_ != nullptr) control_->ServePending([this](const std::string& r) { return HandleControl(r); });
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (g_stop_signal != 0) return false;
  Status s = Launch();
  if (!s.ok()) {
    give_up_reason_ = "relaunch failed: " + s.ToString();
    Log({{"action", "give_up"}, {"reason", give_up_reason_}});
    return false;
  }
  restart_detected_ns_ = detected_ns;
  return !ended_unplaced_;
}

std::string Agent::CheckpointDir() const {
  return !config_.checkpoint_dir.empty() ? config_.checkpoint_dir : ReportedCheckpointDir(ring_dir_);
}

RestartPlan Agent::PlanRollback(const Anomaly& reason, const std::vector<RankEnd>& ends) {
  const std::string dir = CheckpointDir();
  // Listed once the ranks are stopped: no save can commit a step after the choice.
  Result<std::vector<ResumableStep>> listing = ListResumableSteps(Env::Default(), dir);
  if (!listing.ok()) {
    RestartPlan plan;
    plan.give_up = "cannot roll back: the checkpoints of " + dir + " cannot be read: " + listing.status().ToString();
    plan.job_wide = true;
    return plan;
  }
  RollbackPlan rollback = supervisor_->PlanRollback(reason, trace::MonotonicNanos(), ends, *listing);
  const RollbackDecision& d = rollback.decision;
  nlohmann::json line = d.Record(reason);
  line["directory"] = dir;
  if (rollback.restart.give_up.empty()) {
    // The steps after the checkpoint go: they may hold the damage, a later restart would resume
    // from them, and the relaunch saves their step numbers again.
    Result<std::vector<uint64_t>> removed = RemoveStepsAfterRollback(Env::Default(), dir, d.point.step);
    if (!removed.ok()) {
      rollback.restart.give_up = "cannot roll back: removing the checkpoints after " +
                                 (d.point.step ? "step " + std::to_string(*d.point.step) : std::string("scratch")) +
                                 " failed: " + removed.status().ToString();
      rollback.restart.job_wide = true;
      line["action"] = "rollback_give_up";
      line["reason"] = rollback.restart.give_up;
    } else {
      line["removed"] = *removed;
      ResumePoint point;
      point.step = d.point.step;
      point.location = d.point.location;
      if (rdzv_ != nullptr) {
        // The nodes resume from the step their next round agrees on: the newest every node can
        // load below the one after this checkpoint (the other nodes' memory tiers may hold later
        // ones), and every node's ranks skip the same steps.
        RoundRollback r;
        r.before = d.point.step ? *d.point.step + 1 : 0;
        r.anomaly_step = d.anomaly_step;
        r.anomaly = reason.kind;
        r.ranks = reason.ranks;
        r.by = config_.rendezvous.node_name;
        r.skip = supervisor_->AllSkipSteps();
        pending_rollback_ = r;
        line["round_resumes_before"] = r.before;
      } else {
        rollback_point_ = point;
      }
      metrics_->RolledBack(d.skipped ? d.skipped->last - d.skipped->first + 1 : 0);
    }
  }
  if (!d.node_out.empty()) metrics_->SdcNodeOut();
  Log(line);
  if (line["action"] == "rollback") {
    std::cerr << "lifeline-agent: rolling back to "
              << (d.point.step ? "step " + std::to_string(*d.point.step) + " (" + d.point.location + ")"
                               : std::string("scratch"))
              << " after " << reason.kind << " at step " << d.anomaly_step << ": " << d.point.why << "; "
              << d.steps_rolled_back() << " steps to train again"
              << (d.skipped ? ", the data of steps " + FormatStepRanges({*d.skipped}) + " skipped" : std::string())
              << std::endl;
  }
  return rollback.restart;
}

int Agent::Finish() {
  // Output still in the pipes comes first, and the ranks' last events.
  for (int fd : launcher_->OutputFds()) launcher_->PumpOutput(fd);
  DrainRings(trace::MonotonicNanos());
  CheckRanksMemoryTier(/*last_look=*/true);
  const JobEnd end = supervisor_->Conclude();
  finished_ = end.finished;  // the job did end: its keys in etcd go
  if (!end.give_up.empty()) {
    give_up_reason_ = end.give_up;
    Log({{"action", "give_up"}, {"reason", give_up_reason_}});
    std::cerr << "lifeline-agent: " << give_up_reason_ << std::endl;
    return kExitFailed;
  }
  Log({{"action", "finished"}, {"ranks", config_.nproc},
       {"time", TimeAccountJson(supervisor_->ledger(), trace::MonotonicNanos())}});
  if (replication_ != nullptr) {
    // What this node holds of other nodes' ranks is on disk now: its memory goes back.
    const std::vector<uint64_t> freed = replication_->Finish();
    if (!freed.empty()) Log({{"action", "replicas_freed"}, {"steps", freed}});
  }
  std::cerr << "lifeline-agent: job finished after " << restarts_ << " restart(s)" << std::endl;
  return 0;
}

std::string Agent::HandleControl(const std::string& request) {
  std::string cmd = request;
  while (!cmd.empty() && (cmd.back() == '\n' || cmd.back() == '\r' || cmd.back() == ' ')) cmd.pop_back();
  if (cmd == "status") {
    const uint64_t now = trace::MonotonicNanos();
    nlohmann::json ranks = nlohmann::json::array();
    if (launcher_ != nullptr)
      for (const RankProcess& p : launcher_->ranks()) {
        const RankTimeline& v = supervisor_->timeline().rank(p.rank);
        nlohmann::json j = {{"rank", static_cast<int>(rank_base_) + p.rank}, {"pid", p.pid}, {"running", p.running},
                            {"events", v.events}};
        j["step"] = v.step == trace::kNoStep ? nlohmann::json(nullptr) : nlohmann::json(v.step);
        j["last_event_age_seconds"] = v.last_event_ns == 0 ? nlohmann::json(nullptr)
                                                           : nlohmann::json(Seconds(now - v.last_event_ns));
        if (!p.running) j["exit"] = DescribeWaitStatus(p.wait_status);
        ranks.push_back(j);
      }
    nlohmann::json status = {{"job", config_.job_id},
                             {"restarts", restarts_},
                             {"max_restarts", config_.restart.max_restarts},
                             {"anomalies", anomalies_},
                             {"run_dir", config_.run_dir},
                             {"ranks", ranks}};
    status["node_name"] = config_.rendezvous.node_name;
    if (plan_) {  // a multi-node job: this node's place in the current round
      status["node"] = rdzv_->node_id();
      status["round"] = plan_->round;
      status["group_rank"] = plan_->group_rank;
      status["nodes"] = plan_->nodes.size();
      status["world_size"] = plan_->world_size;
      status["excluded"] = ExcludedJson(plan_->excluded);
      status["spares"] = plan_->spares;
    }
    if (!config_.scheduler.empty()) {
      status["scheduler"] = config_.scheduler;
      if (config_.scheduler.find("slurm") != std::string::npos) status["requeues"] = config_.requeues;
    }
    if (supervisor_ != nullptr) status["time"] = TimeAccountJson(supervisor_->ledger(), now);
    return status.dump();
  }
  if (cmd.rfind("readmit", 0) == 0) {
    const std::string node = cmd.size() > 8 ? cmd.substr(8) : "";
    if (rdzv_ == nullptr) return nlohmann::json({{"error", "readmit: a single-node job excludes no node"}}).dump();
    if (Status s = rdzv_->Readmit(node); !s.ok()) return nlohmann::json({{"error", s.ToString()}}).dump();
    Log({{"action", "node_readmitted"}, {"node", node}});
    return nlohmann::json({{"ok", true}, {"readmitted", node},
                           {"note", "its failures until now no longer count; it is placed from the next round"}}).dump();
  }
  if (cmd == "dump") {
    if (launcher_ != nullptr) RequestDumps("control socket");
    return nlohmann::json({{"ok", true}, {"directory", ring_dir_}}).dump();
  }
  if (cmd == "metrics") return metrics_->Render();
  if (cmd == "help" || cmd.empty()) return R"({"commands":["status","dump","metrics","readmit NODE","help"]})";
  return nlohmann::json({{"error", "unknown command '" + cmd + "' (try help)"}}).dump();
}

std::optional<int> Agent::CarryOut(const PollDecision& decision, uint64_t now) {
  if (!decision.job_ended.empty()) {
    give_up_reason_ = decision.job_ended;
    requeue_may_help_ = give_up_reason_.find(kRequeueMark) != std::string::npos;
    Log({{"action", "stop"}, {"reason", "the job ended on another node: " + give_up_reason_}});
    launcher_->StopAll(config_.restart.grace_seconds);
    std::cerr << "lifeline-agent: giving up: " << give_up_reason_ << std::endl;
    return requeue_may_help_ ? kExitRequeue : kExitFailed;
  }
  if (decision.round_moved) {  // another node opened the next round: stop here and join it
    Act(decision.raised);
    const int killed = launcher_->StopAll(config_.restart.grace_seconds);
    supervisor_->StoppedForRound(trace::MonotonicNanos());
    Log({{"action", "stop"}, {"reason", "round opened by another node"}, {"killed_after_grace", killed}});
    if (Status s = Launch(); !s.ok() || ended_unplaced_) {
      if (ended_unplaced_) return 0;
      give_up_reason_ = "relaunch failed: " + s.ToString();
      Log({{"action", "give_up"}, {"reason", give_up_reason_}});
      std::cerr << "lifeline-agent: giving up: " << give_up_reason_ << std::endl;
      return g_stop_signal != 0 ? 128 + g_stop_signal : 1;
    }
    metrics_->Restarted();
    restart_detected_ns_ = now;
    return std::nullopt;
  }
  if (decision.restart && KilledByATermination(*decision.restart)) {
    // scancel, a time limit, a pod's deletion: SIGTERM to every process of the job, and a rank's
    // may land before the agent's own. A moment for it before a stop is taken for a failure.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (g_stop_signal == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (g_stop_signal != 0) return std::nullopt;  // the loop stops the ranks, as asked
  }
  CheckResumeStep();
  CheckRanksMemoryTier();
  CheckResumed(now);
  Act(decision.raised);
  if (decision.restart_cost) metrics_->RestartCost(*decision.restart_cost);
  for (int r : decision.stop_ranks) {
    // Stuck in its exit: its work is done and saved; nothing it could still do is worth waiting for.
    const bool sent = launcher_->Signal(r, SIGKILL);
    Log({{"action", "stop"}, {"reason", "exit_hang"}, {"ranks", {static_cast<int>(rank_base_) + r}}, {"signal", "SIGKILL"},
         {"sent", sent}});
  }
  if (decision.restart) {
    const Anomaly& reason = *decision.restart;
    if (!Restart(reason, reason.detected_ns != 0 ? reason.detected_ns : now, decision.rollback)) {
      if (ended_unplaced_) return 0;
      if (g_stop_signal != 0 && give_up_reason_.empty()) {
        SayStopped(0, 0);
        return 128 + g_stop_signal;
      }
      std::cerr << "lifeline-agent: giving up: " << (give_up_reason_.empty() ? std::string("stopped") : give_up_reason_)
                << std::endl;
      if (g_stop_signal != 0) return 128 + g_stop_signal;
      return requeue_may_help_ ? kExitRequeue : kExitFailed;
    }
    return std::nullopt;
  }
  if (decision.ranks_done) return Finish();
  return std::nullopt;
}

int Agent::Run() {
  started_ns_ = trace::MonotonicNanos();
  if (Status s = Setup(); !s.ok()) {
    std::cerr << "lifeline-agent: " << s.ToString() << std::endl;
    Cleanup();
    return kExitUsage;
  }
  struct sigaction sa{};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  surroundings_ = std::make_unique<AgentSurroundings>(rdzv_.get(), [this] { return CheckpointDir(); });
  supervisor_ = std::make_unique<Supervisor>(config_, surroundings_.get(), rdzv_ != nullptr ? rdzv_->node_id() : "");
  std::cerr << "lifeline-agent: job " << config_.job_id << ", " << config_.nproc << " ranks; control socket "
            << config_.run_dir << "/control.sock" << std::endl;
  if (!config_.scheduler.empty()) {
    nlohmann::json vars = nlohmann::json::object();
    for (const auto& [name, value] : config_.scheduler_env) vars[name] = value;
    nlohmann::json line = {{"action", "scheduler"}, {"scheduler", config_.scheduler}, {"variables", vars}};
    if (!config_.allocation_hosts.empty()) line["hosts"] = config_.allocation_hosts;
    if (config_.scheduler.find("slurm") != std::string::npos) line["requeues"] = config_.requeues;
    Log(line);
  }
  if (Status s = CheckCheckpointDirFree(); !s.ok()) {
    std::cerr << "lifeline-agent: " << s.ToString() << std::endl;
    Log({{"action", "give_up"}, {"reason", s.ToString()}});
    Cleanup();
    return kExitUsage;
  }
  if (Status s = Launch(); !s.ok()) {
    std::cerr << "lifeline-agent: " << s.ToString() << std::endl;
    Cleanup();
    return kExitUsage;
  }
  if (ended_unplaced_) {
    Cleanup();
    return kExitFinished;
  }
  const int timeout_ms = std::max(1, static_cast<int>(config_.poll_interval_seconds * 1000));
  int exit_code = 0;
  for (;;) {
    if (g_stop_signal != 0) {
      Log({{"action", "stop"}, {"reason", "agent received " + SignalName(g_stop_signal)}});
      int running = 0;
      for (const RankProcess& p : launcher_->ranks()) running += p.running ? 1 : 0;
      SayStopped(running, launcher_->StopAll(config_.restart.grace_seconds));
      exit_code = 128 + g_stop_signal;
      break;
    }
    std::vector<pollfd> pfds;
    for (int fd : launcher_->OutputFds()) pfds.push_back({fd, POLLIN, 0});
    pfds.push_back({control_->fd(), POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), timeout_ms) > 0) {
      for (const pollfd& p : pfds) {
        if (p.revents == 0) continue;
        if (p.fd == control_->fd()) {
          control_->ServePending([this](const std::string& r) { return HandleControl(r); });
        } else {
          launcher_->PumpOutput(p.fd);
        }
      }
    }
    const uint64_t now = trace::MonotonicNanos();
    DrainRings(now);
    const PollDecision decision = Poll(now);
    ReadReplication();
    FillSpares(now);
    if (const std::optional<int> done = CarryOut(decision, now)) {
      exit_code = *done;
      break;
    }
  }
  Cleanup();
  return exit_code;
}

}  // namespace lifeline::agent
