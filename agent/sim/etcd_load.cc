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
// Many agents in one process: each has its own connections, as separate machines would.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
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

// A node's summary as the agent encodes it: `nproc` ranks in two communicators, each with its
// window of ended collectives full (the largest a summary gets).
std::string RealisticSummary(int node, int nproc) {
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
  return EncodeProgress(ranks, UnixMillisNow());
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lifeline-etcd-load: a real etcd under the control-plane traffic of many agents of one job; etcd's "
               "requests per second, CPU and a probe's latency while they train"};
  int agents = 2048, nproc = 8;
  double seconds = 20, lease_seconds = 10, join_timeout = 600;
  std::string protocol = "watch";
  bool json = false;
  app.add_option("--agents", agents, "Agents (nodes) of the job")->check(CLI::Range(1, 8192));
  app.add_option("--nproc-per-node", nproc, "Ranks per node (the size of each summary)")->check(CLI::Range(1, 64));
  app.add_option("--seconds", seconds, "How long the job trains once every agent joined")->check(CLI::Range(1.0, 3600.0));
  app.add_option("--lease-seconds", lease_seconds, "The agents' etcd lease")->check(CLI::Range(2.0, 600.0));
  app.add_option("--join-timeout", join_timeout,
                 "Seconds the agents have to join; past them --protocol before measures the window with those "
                 "that did (the others go on trying, as such agents would), the others fail")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--protocol", protocol, "watch (the agents now), poll (watch: false), before (the agents before issue 36)")
      ->check(CLI::IsMember({"watch", "poll", "before"}));
  app.add_flag("--json", json, "One JSON object on stdout");
  CLI11_PARSE(app, argc, argv);

  // Three connections an agent, and etcd's side of them.
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  signal(SIGPIPE, SIG_IGN);
  testing::EtcdTestServer etcd;
  if (!etcd.ok()) {
    std::cerr << "lifeline-etcd-load: " << etcd.error() << std::endl;
    return 1;
  }
  const std::string endpoint = etcd.endpoint();
  const std::string job = "load";
  std::cerr << "lifeline-etcd-load: etcd at " << endpoint << "; " << agents << " agents (" << protocol << ") joining"
            << std::endl;

  const Clock::time_point began = Clock::now();
  std::atomic<bool> stop{false};
  std::atomic<int> joined{0};
  std::vector<std::unique_ptr<BeforeAgent>> before;
  std::vector<std::unique_ptr<Rendezvous>> now;
  std::vector<std::string> summaries;
  for (int n = 0; n < agents; ++n) summaries.push_back(RealisticSummary(n, nproc));
  if (protocol == "before") {
    for (int n = 0; n < agents; ++n) {
      before.push_back(std::make_unique<BeforeAgent>(n, agents, nproc, "/lifeline/" + job + "/", endpoint, lease_seconds));
      before.back()->Start(&stop, &joined);
    }
  } else {
    std::vector<std::thread> joins;
    std::mutex mu;
    for (int n = 0; n < agents; ++n) {
      RendezvousConfig c;
      c.endpoint = endpoint;
      c.job = job;
      c.min_nodes = c.max_nodes = static_cast<uint32_t>(agents);
      c.nproc_per_node = static_cast<uint32_t>(nproc);
      c.host = "127.0.0.1";
      c.node_name = "node-" + std::to_string(n);
      c.lease_seconds = lease_seconds;
      c.watch = protocol == "watch";
      c.join_timeout_seconds = join_timeout;
      Result<std::unique_ptr<Rendezvous>> r = Rendezvous::Connect(c);
      if (!r.ok()) {
        std::cerr << "lifeline-etcd-load: agent " << n << ": " << r.status().ToString() << std::endl;
        return 1;
      }
      now.push_back(std::move(*r));
    }
    for (int n = 0; n < agents; ++n)
      joins.emplace_back([&, n] {
        Result<RoundPlan> plan = now[static_cast<size_t>(n)]->Join(ResumeOffer{});
        if (plan.ok()) ++joined;
        else {
          std::lock_guard<std::mutex> lock(mu);
          std::cerr << "lifeline-etcd-load: agent " << n << ": " << plan.status().ToString() << std::endl;
        }
      });
    for (std::thread& t : joins) t.join();
  }
  while (joined < agents && SecondsSince(began) < join_timeout)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double join_seconds = SecondsSince(began);
  const int joined_in_time = joined;
  if (joined_in_time < agents) {
    std::cerr << "lifeline-etcd-load: only " << joined_in_time << " of " << agents << " agents joined in "
              << join_seconds << " s" << std::endl;
    if (before.empty()) return 1;
    std::cerr << "lifeline-etcd-load: measuring the window with the rest still joining" << std::endl;
  } else {
    std::cerr << "lifeline-etcd-load: all joined in " << join_seconds << " s; training for " << seconds << " s"
              << std::endl;
  }

  // The training window: summaries handed over every 0.5 s (as the agent's loop does), a probe.
  std::atomic<bool> window_over{false};
  std::thread publisher([&] {
    while (!window_over) {
      for (int n = 0; n < agents; ++n) {
        if (!before.empty()) before[static_cast<size_t>(n)]->Publish(summaries[static_cast<size_t>(n)]);
        else now[static_cast<size_t>(n)]->PublishProgress(summaries[static_cast<size_t>(n)]);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(2));  // past the join's tail
  std::vector<double> probe_ms;
  std::atomic<bool> counting{false};
  std::atomic<uint64_t> probe_puts{0};
  std::thread probe([&] {
    std::unique_ptr<EtcdClient> c = std::move(EtcdClient::Create(endpoint, 5.0)).value();
    while (!window_over) {
      const Clock::time_point t = Clock::now();
      const bool counted = counting;
      if (c->Put("/probe/" + job, "x").ok()) probe_ms.push_back(SecondsSince(t) * 1000);
      if (counted) ++probe_puts;
      std::this_thread::sleep_until(t + std::chrono::milliseconds(20));
    }
  });
  auto leader_in = [&] {
    uint64_t most = 0;
    for (auto& r : now) most = std::max(most, r->summary_bytes_received());
    return most;
  };
  const uint64_t leader_in0 = leader_in();
  const EtcdCounters c0 = Scrape(endpoint);
  counting = true;
  const double cpu0 = ProcessCpuSeconds(etcd.pid());
  const Clock::time_point w0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  counting = false;
  const uint64_t leader_in1 = leader_in();
  const EtcdCounters c1 = Scrape(endpoint);
  const double cpu1 = ProcessCpuSeconds(etcd.pid());
  const double window = SecondsSince(w0);
  window_over = true;
  publisher.join();
  probe.join();
  stop = true;
  for (auto& a : before) a->Join();
  {  // every agent leaves at once, as a finished job's do
    std::vector<std::thread> leaving;
    for (auto& r : now) leaving.emplace_back([&r] { r->Leave(true); });
    for (std::thread& t : leaving) t.join();
  }

  nlohmann::json out = {{"protocol", protocol},
                        {"agents", agents},
                        {"ranks", agents * nproc},
                        {"lease_seconds", lease_seconds},
                        {"summary_bytes", summaries[0].size()},
                        {"joined", joined_in_time},
                        {"joined_by_window_end", joined.load()},
                        {"join_seconds", joined_in_time == agents ? nlohmann::json(join_seconds) : nlohmann::json(nullptr)},
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
  if (!now.empty())  // the summaries' way now: straight to the leader, compressed
    out["leader_summary_bytes_in_per_second"] = static_cast<double>(leader_in1 - leader_in0) / window;
  std::cout << out.dump(json ? -1 : 2) << std::endl;
  return 0;
}
