// lifeline-etcd-load: a real etcd (started here, on free loopback ports) under the control-plane
// traffic of --agents agents of one job (issue 36, item 5b): they join one round, then train for
// --seconds, each publishing its progress summary. What etcd went through in the training window
// is measured from etcd itself (its gRPC request counters, the bytes it received, its CPU time
// from /proc) and from a probe client that puts a key every 20 ms (the latency any agent's
// request sees: a restart's compare-and-swap, a failure report).
//
// --protocol says how the agents speak to etcd:
//   watch   the agent's Rendezvous as it is (agent/rendezvous.h): one watch stream per agent
//   poll    the same Rendezvous with `watch: false` (its mirror reads its keys every 0.25 s)
//   before  the requests of the Rendezvous before issue 36 (commit 5c9b7d4), replayed request by
//           request: every agent read the round, the give-up, the keys of the round's entries and
//           finished nodes and the leader every 0.25 s, its join looked every 100 ms, and every
//           node's summary went through etcd once a second, the leader reading them all.
// Many agents in each of a few processes (--processes; one per 1,000 agents): each agent has its own
// connections, as separate machines would.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "agent/etcd/etcd_client.h"
#include "agent/etcd/etcd_test_server.h"
#include "agent/progress.h"
#include "agent/rendezvous.h"

namespace {

using namespace lifeline::agent;  // NOLINT: a tool's main
using lifeline::Result;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What etcd says of itself on /metrics.
struct EtcdCounters {
  std::map<std::string, double> started;  // gRPC calls started, by method
  double received_bytes = 0;
  double sent_bytes = 0;
  double total() const {
    double t = 0;
    for (const auto& [m, n] : started) t += n;
    return t;
  }
};

size_t Append(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

EtcdCounters Scrape(const std::string& endpoint) {
  std::string body;
  CURL* c = curl_easy_init();
  const std::string url = "http://" + endpoint + "/metrics";
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_perform(c);
  curl_easy_cleanup(c);
  EtcdCounters out;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    const double value = std::strtod(line.c_str() + space + 1, nullptr);
    if (line.rfind("grpc_server_started_total{", 0) == 0) {
      const size_t m = line.find("grpc_method=\"");
      if (m == std::string::npos) continue;
      const size_t end = line.find('"', m + 13);
      out.started[line.substr(m + 13, end - m - 13)] += value;
    } else if (line.rfind("etcd_network_client_grpc_received_bytes_total", 0) == 0) {
      out.received_bytes += value;
    } else if (line.rfind("etcd_network_client_grpc_sent_bytes_total", 0) == 0) {
      out.sent_bytes += value;
    }
  }
  return out;
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int k = 3; k <= 15 && rest >> field; ++k)
    if (k == 14 || k == 15) ticks += std::stod(field);  // utime, stime
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// A node's summary as the agent encodes it (`json`: as the agents before issue 36 did): `nproc`
// ranks in two communicators, each with its window of ended collectives full (the largest a
// summary gets: the agents now send only the collectives the leader has not had, these send all).
std::string RealisticSummary(int node, int nproc, bool json) {
  std::vector<RankProgress> ranks;
  for (int k = 0; k < nproc; ++k) {
    RankProgress r;
    r.rank = node * nproc + k;
    r.node = node;
    r.step = 1000;
    r.silent_seconds = 0.01;
    for (uint32_t comm : {1u, 2u}) {
      r.comms[comm] = CommProgress{5000, -1, false, 0, 0};
      for (size_t s = 0; s < kSamplesPerComm; ++s)
        r.recent.push_back({comm, 5000 - kSamplesPerComm + s, 1, 0.9 - 0.01 * static_cast<double>(s), 0.85, 0.8});
    }
    ranks.push_back(std::move(r));
  }
  return json ? EncodeProgressJson(ranks, UnixMillisNow()) : EncodeProgress(ranks, UnixMillisNow());
}

std::string NodeEntry(int node, int nproc) {
  return nlohmann::json{{"id", "10.0." + std::to_string(node / 256) + "." + std::to_string(node % 256) + ":4242:abcdef01"},
                        {"host", "10.0." + std::to_string(node / 256) + "." + std::to_string(node % 256)},
                        {"nproc", nproc}, {"requested_rank", -1}, {"master_port", 29500}, {"replica_port", 29600},
                        {"joined_revision", 0}, {"name", "node-" + std::to_string(node)},
                        {"resume", {{"directory", "/shared/ckpt/job"}, {"disk_step", 1000}, {"memory_steps", {900, 950, 1000}},
                                    {"memory_incomplete_step", nullptr}}}}
      .dump();
}

// The agents of before issue 36, replayed: each agent's requests as its Rendezvous made them.
class BeforeAgent {
 public:
  BeforeAgent(int node, int nodes, int nproc, std::string prefix, std::string endpoint, double lease_seconds)
      : node_(node), nodes_(nodes), nproc_(nproc), prefix_(std::move(prefix)), lease_seconds_(lease_seconds) {
    client_ = std::move(EtcdClient::Create(endpoint, std::max(1.0, lease_seconds / 4))).value();
    id_ = "agent-" + std::to_string(node);
  }
  void Start(const std::atomic<bool>* stop, std::atomic<int>* joined) {
    thread_ = std::thread([this, stop, joined] { Run(*stop, joined); });
  }
  void Join() { thread_.join(); }
  void Publish(std::string summary) {
    std::lock_guard<std::mutex> lock(mu_);
    summary_ = std::move(summary);
  }

 private:
  std::string Key(const std::string& tail) const { return prefix_ + tail; }
  void Run(const std::atomic<bool>& stop, std::atomic<int>* joined) {
    Result<int64_t> lease = client_->GrantLease(static_cast<int64_t>(lease_seconds_));
    if (!lease.ok()) return;
    client_->PutIfAbsent(Key("round"), "0").status().IgnoreError();
    Clock::time_point next_join = Clock::now(), next_watch = Clock::now(), last_renewal = Clock::now(),
                      last_progress = Clock::now();
    bool in_round = false, entry_put = false;
    const std::string dir = "rounds/0/";
    while (!stop) {
      const Clock::time_point now = Clock::now();
      if (!in_round && now >= next_join) {  // Join's step, every 100 ms
        next_join = now + std::chrono::milliseconds(100);
        client_->Get(Key("give_up")).status().IgnoreError();
        client_->Get(Key("round")).status().IgnoreError();
        if (!entry_put) entry_put = client_->Put(Key(dir + "nodes/" + id_), NodeEntry(node_, nproc_), *lease).ok();
        Result<std::optional<EtcdKeyValue>> plan = client_->Get(Key(dir + "plan"));
        if (plan.ok() && plan->has_value()) {
          in_round = true;
          ++*joined;
        } else {
          Result<std::vector<EtcdKeyValue>> members = client_->GetPrefix(Key(dir + "nodes/"));
          if (members.ok() && members->size() >= static_cast<size_t>(nodes_)) {
            client_->ReadMany({{Key("node_failures/")}, {Key("readmitted/")}}).status().IgnoreError();
            nlohmann::json p = {{"nodes", nlohmann::json::array()}};
            for (const EtcdKeyValue& kv : *members) p["nodes"].push_back(nlohmann::json::parse(kv.value));
            client_->PutIfAbsent(Key(dir + "plan"), p.dump()).status().IgnoreError();
          }
        }
      }
      if (now >= next_watch) {  // Watch's pass, every 0.25 s
        next_watch = now + std::chrono::milliseconds(250);
        if (SecondsSince(last_renewal) >= lease_seconds_ / 3) {
          client_->KeepAlive(*lease).IgnoreError();
          last_renewal = Clock::now();
        }
        bool tick = false;
        if (in_round && SecondsSince(last_progress) >= 1.0) {
          tick = true;
          last_progress = Clock::now();
          std::string summary;
          {
            std::lock_guard<std::mutex> lock(mu_);
            summary.swap(summary_);
          }
          if (!summary.empty()) client_->Put(Key(dir + "progress/" + id_), summary, *lease).IgnoreError();
        }
        std::vector<EtcdClient::Range> ranges = {{Key("round")}, {Key("give_up")}, {Key(dir + "nodes/"), true},
                                                 {Key(dir + "finished/"), true}, {Key(dir + "leader")}};
        const bool leader = in_round && node_ == 0;
        if (leader && tick) ranges.push_back({Key(dir + "progress/")});
        Result<std::vector<std::vector<EtcdKeyValue>>> read = client_->ReadMany(ranges);
        if (read.ok() && leader && (*read)[4].empty())
          client_->PutIfAbsent(Key(dir + "leader"), id_, *lease).status().IgnoreError();
      }
      std::this_thread::sleep_until(std::min(in_round ? next_watch : std::min(next_join, next_watch),
                                             Clock::now() + std::chrono::milliseconds(100)));
    }
    client_->RevokeLease(*lease).IgnoreError();
  }

  const int node_, nodes_, nproc_;
  const std::string prefix_;
  const double lease_seconds_;
  std::string id_;
  std::unique_ptr<EtcdClient> client_;
  std::mutex mu_;
  std::string summary_;
  std::thread thread_;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}


// What the load is made of: --agents agents of one job, as this process's share of them.
struct LoadOptions {
  int agents = 2048, nproc = 8;
  double lease_seconds = 10, join_timeout = 600;
  std::string protocol = "watch";
  std::string endpoint, job = "load";
};

// One line to or from a worker (the pipes between this tool's processes).
void WriteLine(int fd, const std::string& line) {
  const std::string l = line + "\n";
  size_t done = 0;
  while (done < l.size()) {
    const ssize_t n = write(fd, l.data() + done, l.size() - done);
    if (n <= 0 && errno != EINTR) return;
    if (n > 0) done += static_cast<size_t>(n);
  }
}
std::string ReadLine(int fd) {
  std::string line;
  char c;
  for (;;) {
    const ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') return line;
    line.push_back(c);
  }
}

// A worker process: agents [first, first + count) of the job. It says "joined N" once they joined
// (or the join timeout passed), hands each agent's summary over every 0.5 s from then on, answers
// "bytes" with the most summary bytes one of its agents received as leader, and on "stop" makes
// its agents leave and exits. Each process has its own descriptors: about ten an agent, so that
// one process of this machine (20,000, a hard limit) holds about 1,000 agents.
int RunWorker(const LoadOptions& o, int first, int count, int in, int out) {
  std::atomic<bool> stop{false};
  std::atomic<int> joined{0};
  std::vector<std::unique_ptr<BeforeAgent>> before;
  std::vector<std::unique_ptr<Rendezvous>> now;
  std::vector<std::string> summaries;
  for (int n = first; n < first + count; ++n) summaries.push_back(RealisticSummary(n, o.nproc, o.protocol == "before"));
  const Clock::time_point began = Clock::now();
  if (o.protocol == "before") {
    for (int n = first; n < first + count; ++n) {
      before.push_back(std::make_unique<BeforeAgent>(n, o.agents, o.nproc, "/lifeline/" + o.job + "/", o.endpoint,
                                                     o.lease_seconds));
      before.back()->Start(&stop, &joined);
    }
  } else {
    for (int n = first; n < first + count; ++n) {
      RendezvousConfig c;
      c.endpoint = o.endpoint;
      c.job = o.job;
      c.min_nodes = c.max_nodes = static_cast<uint32_t>(o.agents);
      c.nproc_per_node = static_cast<uint32_t>(o.nproc);
      c.host = "127.0.0.1";
      c.node_name = "node-" + std::to_string(n);
      c.lease_seconds = o.lease_seconds;
      c.watch = o.protocol == "watch";
      c.join_timeout_seconds = o.join_timeout;
      Result<std::unique_ptr<Rendezvous>> r = Rendezvous::Connect(c);
      if (!r.ok()) {
        std::cerr << "lifeline-etcd-load: agent " << n << ": " << r.status().ToString() << std::endl;
        return 1;
      }
      now.push_back(std::move(*r));
    }
    std::vector<std::thread> joins;
    std::mutex mu;
    for (size_t k = 0; k < now.size(); ++k)
      joins.emplace_back([&, k] {
        Result<RoundPlan> plan = now[k]->Join(ResumeOffer{});
        if (plan.ok()) ++joined;
        else {
          std::lock_guard<std::mutex> lock(mu);
          std::cerr << "lifeline-etcd-load: agent " << first + static_cast<int>(k) << ": " << plan.status().ToString()
                    << std::endl;
        }
      });
    for (std::thread& t : joins) t.join();
  }
  while (joined < count && SecondsSince(began) < o.join_timeout)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  WriteLine(out, "joined " + std::to_string(joined.load()));
  // The training: summaries handed over every 0.5 s (as the agent's loop does).
  std::atomic<bool> over{false};
  std::thread publisher([&] {
    while (!over) {
      for (size_t k = 0; k < summaries.size(); ++k) {
        if (!before.empty()) before[k]->Publish(summaries[k]);
        else now[k]->PublishProgress(summaries[k]);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  for (std::string command = ReadLine(in); command == "bytes"; command = ReadLine(in)) {
    uint64_t most = 0;
    for (auto& r : now) most = std::max(most, r->summary_bytes_received());
    WriteLine(out, std::to_string(most) + " " + std::to_string(joined.load()));
  }
  over = true;
  publisher.join();
  stop = true;
  for (auto& a : before) a->Join();
  {  // every agent leaves at once, as a finished job's do
    std::vector<std::thread> leaving;
    for (auto& r : now) leaving.emplace_back([&r] { r->Leave(true); });
    for (std::thread& t : leaving) t.join();
  }
  WriteLine(out, "left");
  return 0;
}

struct Worker {
  pid_t pid = -1;
  int to = -1, from = -1;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lifeline-etcd-load: a real etcd under the control-plane traffic of many agents of one job; etcd's "
               "requests per second, CPU and a probe's latency while they train"};
  LoadOptions o;
  double seconds = 20;
  int processes = 0;
  bool json = false;
  app.add_option("--agents", o.agents, "Agents (nodes) of the job")->check(CLI::Range(1, 8192));
  app.add_option("--nproc-per-node", o.nproc, "Ranks per node (the size of each summary)")->check(CLI::Range(1, 64));
  app.add_option("--seconds", seconds, "How long the job trains once every agent joined")->check(CLI::Range(1.0, 3600.0));
  app.add_option("--lease-seconds", o.lease_seconds, "The agents' etcd lease")->check(CLI::Range(2.0, 600.0));
  app.add_option("--join-timeout", o.join_timeout,
                 "Seconds the agents have to join; past them --protocol before measures the window with those "
                 "that did (the others go on trying, as such agents would), the others fail")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--protocol", o.protocol, "watch (the agents now), poll (watch: false), before (the agents before issue 36)")
      ->check(CLI::IsMember({"watch", "poll", "before"}));
  app.add_option("--processes", processes,
                 "Processes the agents are spread over (default: one per 1,000 agents; each has its own "
                 "file descriptors)")
      ->check(CLI::Range(1, 64));
  app.add_flag("--json", json, "One JSON object on stdout");
  CLI11_PARSE(app, argc, argv);
  if (processes == 0) processes = (o.agents + 999) / 1000;
  processes = std::min(processes, o.agents);

  // About ten descriptors an agent (its etcd connections, the stream's wake-up pair, its summary
  // port, the leader's side of every node's connection), and etcd's side of them: 2,048 agents in
  // one process ran out of this machine's 20,000 (a hard limit here) and their streams retried
  // forever. Hence the worker processes; each raises its soft limit to the hard one.
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < static_cast<rlim_t>((o.agents + processes - 1) / processes) * 12)
    std::cerr << "lifeline-etcd-load: only " << files.rlim_cur << " file descriptors for "
              << (o.agents + processes - 1) / processes << " agents a process (about 12 each): connections will fail; "
              << "use more --processes" << std::endl;
  signal(SIGPIPE, SIG_IGN);
  testing::EtcdTestServer etcd;
  if (!etcd.ok()) {
    std::cerr << "lifeline-etcd-load: " << etcd.error() << std::endl;
    return 1;
  }
  o.endpoint = etcd.endpoint();
  std::cerr << "lifeline-etcd-load: etcd at " << o.endpoint << "; " << o.agents << " agents (" << o.protocol
            << ") in " << processes << " process" << (processes == 1 ? "" : "es") << " joining" << std::endl;

  const Clock::time_point began = Clock::now();
  std::vector<Worker> workers;
  for (int w = 0; w < processes; ++w) {
    const int first = o.agents * w / processes, count = o.agents * (w + 1) / processes - first;
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) {
      std::cerr << "lifeline-etcd-load: pipe: " << std::strerror(errno) << std::endl;
      return 1;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      std::cerr << "lifeline-etcd-load: fork: " << std::strerror(errno) << std::endl;
      return 1;
    }
    if (pid == 0) {  // a worker: its agents, then out without the parent's destructors (etcd is the parent's)
      for (const Worker& other : workers) {
        close(other.to);
        close(other.from);
      }
      close(down[1]);
      close(up[0]);
      _exit(RunWorker(o, first, count, down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    workers.push_back({pid, down[1], up[0]});
  }
  int joined = 0;
  for (const Worker& w : workers) {
    const std::string said = ReadLine(w.from);
    if (said.rfind("joined ", 0) == 0) joined += std::atoi(said.c_str() + 7);
  }
  const double join_seconds = SecondsSince(began);
  auto stop_workers = [&] {
    for (const Worker& w : workers) close(w.to);  // end of input: leave
    for (const Worker& w : workers) {
      ReadLine(w.from);
      waitpid(w.pid, nullptr, 0);
    }
  };
  if (joined < o.agents) {
    std::cerr << "lifeline-etcd-load: only " << joined << " of " << o.agents << " agents joined in " << join_seconds
              << " s" << std::endl;
    if (o.protocol != "before") {
      stop_workers();
      return 1;
    }
    std::cerr << "lifeline-etcd-load: measuring the window with the rest still joining" << std::endl;
  } else {
    std::cerr << "lifeline-etcd-load: all joined in " << join_seconds << " s; training for " << seconds << " s"
              << std::endl;
  }
  // The most summary bytes one agent (the leader) received, and how many have joined by now.
  auto ask = [&](int* joined_now) {
    uint64_t most = 0;
    *joined_now = 0;
    for (const Worker& w : workers) WriteLine(w.to, "bytes");
    for (const Worker& w : workers) {
      std::istringstream said(ReadLine(w.from));
      uint64_t bytes = 0;
      int j = 0;
      said >> bytes >> j;
      most = std::max(most, bytes);
      *joined_now += j;
    }
    return most;
  };

  // The training window, a probe putting a key every 20 ms throughout.
  std::atomic<bool> window_over{false};
  std::this_thread::sleep_for(std::chrono::seconds(2));  // past the join's tail
  std::vector<double> probe_ms;
  std::atomic<bool> counting{false};
  std::atomic<uint64_t> probe_puts{0};
  std::thread probe([&] {
    std::unique_ptr<EtcdClient> c = std::move(EtcdClient::Create(o.endpoint, 5.0)).value();
    while (!window_over) {
      const Clock::time_point t = Clock::now();
      const bool counted = counting;
      if (c->Put("/probe/" + o.job, "x").ok()) probe_ms.push_back(SecondsSince(t) * 1000);
      if (counted) ++probe_puts;
      std::this_thread::sleep_until(t + std::chrono::milliseconds(20));
    }
  });
  int joined_then = 0;
  const uint64_t leader_in0 = ask(&joined_then);
  const EtcdCounters c0 = Scrape(o.endpoint);
  counting = true;
  const double cpu0 = ProcessCpuSeconds(etcd.pid());
  const Clock::time_point w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  counting = false;
  const EtcdCounters c1 = Scrape(o.endpoint);
  const double cpu1 = ProcessCpuSeconds(etcd.pid());
  const double window = SecondsSince(w0);
  const uint64_t leader_in1 = ask(&joined_then);
  window_over = true;
  probe.join();
  stop_workers();

  nlohmann::json out = {{"protocol", o.protocol},
                        {"agents", o.agents},
                        {"processes", processes},
                        {"ranks", o.agents * o.nproc},
                        {"lease_seconds", o.lease_seconds},
                        {"summary_bytes", RealisticSummary(0, o.nproc, o.protocol == "before").size()},
                        {"joined", joined},
                        {"joined_by_window_end", joined_then},
                        {"join_seconds", joined == o.agents ? nlohmann::json(join_seconds) : nlohmann::json(nullptr)},
                        {"window_seconds", window},
                        {"etcd_requests_per_second", (c1.total() - c0.total() - static_cast<double>(probe_puts)) / window},
                        {"etcd_received_bytes_per_second", (c1.received_bytes - c0.received_bytes) / window},
                        {"etcd_sent_bytes_per_second", (c1.sent_bytes - c0.sent_bytes) / window},
                        {"etcd_cpu_cores", (cpu1 - cpu0) / window},
                        {"probe_put_ms", {{"p50", Percentile(probe_ms, 0.5)}, {"p99", Percentile(probe_ms, 0.99)},
                                          {"max", Percentile(probe_ms, 1.0)}, {"count", probe_ms.size()}}}};
  // The probe's own puts are taken out: what is left is the agents'.
  nlohmann::json by_method = nlohmann::json::object();
  for (const auto& [m, n] : c1.started) {
    const auto it = c0.started.find(m);
    double d = n - (it == c0.started.end() ? 0 : it->second);
    if (m == "Put") d -= static_cast<double>(probe_puts);
    if (d > 0) by_method[m] = d / window;
  }
  out["etcd_requests_per_second_by_method"] = by_method;
  if (o.protocol != "before")  // the summaries' way now: straight to the leader, compressed
    out["leader_summary_bytes_in_per_second"] = static_cast<double>(leader_in1 - leader_in0) / window;
  std::cout << out.dump(json ? -1 : 2) << std::endl;
  return 0;
}
