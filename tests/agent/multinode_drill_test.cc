// Multi-node drills: two or three lifeline-agents, each a "node" of 2 ranks of lifeline-drill on this
// machine with a memory tier of its own (LIFELINE_MEMORY_TIER_DIR), meeting through a real etcd
// (Debian's etcd-server, started by the test); the drill's allreduce goes over TCP through global
// rank 0, as a job spanning machines would. The job must form one world, act together on a fault
// anywhere, end like a single-node run of as many ranks, and leave nothing of itself in etcd.
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "agent/etcd/etcd_client.h"
#include "agent/etcd/etcd_test_server.h"
#include "agent/rendezvous.h"
#include "agent/resume.h"
#include "lib/net/socket.h"
#include "lifeline/internal/replication_record.h"

namespace lifeline::agent {
namespace multinode_drill_test {

// Removes a step directory of a job whose surviving ranks may still be finishing their last writes
// into it (a temporary file renamed away while remove_all walks the directory fails it with
// ENOENT): tried again until nothing is left.
void RemoveWhileWritten(const std::filesystem::path& path) {
  for (int attempt = 0; attempt < 250; ++attempt) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (!ec && !std::filesystem::exists(path)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "cannot remove " << path << ": the job kept writing into it for 5 s";
}

struct NodeRun {
  int exit_code = -1;
  std::string output;
  std::vector<nlohmann::json> anomalies;  // events-log lines with "kind"
  std::vector<nlohmann::json> actions;    // lines with "action"
  std::map<int, std::string> finals;      // global rank -> "step=S checksum=HEX"
};

// Starts `cmd` under sh with its output to `out`; returns the pid.
pid_t Spawn(const std::string& cmd, const std::string& out) {
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    const std::string line = cmd + " > " + out + " 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + line).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int WaitFor(pid_t pid, double timeout_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// A TCP proxy between one agent and etcd (issue 36): Stop() cuts that agent off from etcd, as a
// partition would, while everything else reaches it.
class EtcdProxy {
 public:
  explicit EtcdProxy(uint16_t to) : to_(to) {
    Result<int> fd = net::Listen(0, 64, "the test's etcd proxy");
    if (!fd.ok()) return;
    listen_ = *fd;
    port_ = net::LocalPort(listen_);
    thread_ = std::thread([this] { Run(); });
  }
  ~EtcdProxy() { Stop(); }
  uint16_t port() const { return port_; }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    std::vector<std::pair<int, int>> pairs;  // (from the agent, to etcd)
    std::vector<pollfd> fds;
    char buf[65536];
    while (!stop_) {
      fds.clear();
      fds.push_back({listen_, POLLIN, 0});
      for (const auto& [a, b] : pairs) {
        fds.push_back({a, POLLIN, 0});
        fds.push_back({b, POLLIN, 0});
      }
      if (poll(fds.data(), fds.size(), 100) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int a = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        Result<int> b = net::Connect("127.0.0.1", to_, std::chrono::steady_clock::now() + std::chrono::seconds(2));
        if (a >= 0 && b.ok()) pairs.emplace_back(a, *b);
        else if (a >= 0) close(a);
      }
      for (size_t k = 0; k < pairs.size(); ++k) {
        for (int side = 0; side < 2; ++side) {
          if (!(fds[1 + 2 * k + side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          const int from = side == 0 ? pairs[k].first : pairs[k].second;
          const int to = side == 0 ? pairs[k].second : pairs[k].first;
          const ssize_t n = recv(from, buf, sizeof(buf), 0);
          if (n <= 0 || !net::SendAll(to, buf, static_cast<size_t>(n), "proxy").ok()) {
            shutdown(pairs[k].first, SHUT_RDWR);
            shutdown(pairs[k].second, SHUT_RDWR);
          }
        }
      }
    }
    // Stopped: every connection and the port go, as behind a partition (nothing answers).
    for (const auto& [a, b] : pairs) {
      close(a);
      close(b);
    }
    close(listen_);
  }
  const uint16_t to_;
  int listen_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string Dump(const std::vector<nlohmann::json>& lines) {
  std::string s;
  for (const auto& j : lines) s += j.dump() + "\n";
  return s;
}

int Count(const std::vector<nlohmann::json>& lines, const std::string& key, const std::string& value) {
  int n = 0;
  for (const auto& j : lines)
    if (j.value(key, "") == value) ++n;
  return n;
}

class MultiNodeTest : public ::testing::Test {
 public:
  void SetUp() override {
    ASSERT_TRUE(etcd_.ok()) << etcd_.error();
    char tmpl[] = "/tmp/lifeline-multinode-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    if (std::getenv("LIFELINE_KEEP_TEST_DIR") == nullptr) std::filesystem::remove_all(dir_, ec);
  }

  // Node `node` of job `job`: an agent whose memory tier is its own, as on a machine of its own.
  std::string AgentCommand(const std::string& name, int node, const std::string& job, const std::string& agent_flags,
                           const std::string& drill_flags, int nnodes = 2) const {
    return "env LIFELINE_MEMORY_TIER_DIR=" + dir_ + "/" + name + ".tier." + std::to_string(node) + " " +
           LIFELINE_AGENT_BIN + " run --nnodes " + std::to_string(nnodes) + " --nproc-per-node 2 --rdzv-endpoint " +
           etcd_.endpoint() + " --rdzv-id " + job + " --hang-timeout 5 --events-log " + dir_ + "/" + name + "." +
           std::to_string(node) + ".events " +
           (tell_checkpoint_dir_ ? "--checkpoint-dir " + dir_ + "/" + name + ".ckpt " : std::string()) + agent_flags +
           " -- " + LIFELINE_DRILL_BIN + " --dir " + dir_ + "/" + name + ".ckpt " + drill_flags;
  }

  // Runs the `nnodes` nodes of job `name` at once and waits for all.
  std::vector<NodeRun> RunJob(const std::string& name, const std::string& agent_flags, const std::string& drill_flags,
                              int nnodes = 2, double timeout_seconds = 120) {
    std::vector<pid_t> pids;
    for (int node = 0; node < nnodes; ++node)
      pids.push_back(Spawn(AgentCommand(name, node, name, agent_flags, drill_flags, nnodes), Out(name, node)));
    return WaitForNodes(name, pids, timeout_seconds);
  }

  // Waits for the agents `pids` (node 0, 1, ...) of job `name` and reads what each did.
  std::vector<NodeRun> WaitForNodes(const std::string& name, const std::vector<pid_t>& pids, double timeout_seconds = 120) {
    std::vector<NodeRun> runs(pids.size());
    for (size_t node = 0; node < pids.size(); ++node) {
      runs[node].exit_code = WaitFor(pids[node], timeout_seconds);
      Read(name, static_cast<int>(node), &runs[node]);
    }
    return runs;
  }

  std::string Out(const std::string& name, int node) const { return dir_ + "/" + name + "." + std::to_string(node) + ".out"; }

  void Read(const std::string& name, int node, NodeRun* run) const {
    std::ifstream out(Out(name, node));
    run->output.assign(std::istreambuf_iterator<char>(out), std::istreambuf_iterator<char>());
    std::ifstream events(dir_ + "/" + name + "." + std::to_string(node) + ".events");
    for (std::string line; std::getline(events, line);) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      EXPECT_FALSE(j.is_discarded()) << line;
      if (j.contains("kind")) run->anomalies.push_back(j);
      else if (j.contains("action")) run->actions.push_back(j);
    }
    static const std::regex kFinal(R"(final rank=(\d+) (step=\d+ checksum=[0-9a-f]+))");
    for (auto it = std::sregex_iterator(run->output.begin(), run->output.end(), kFinal); it != std::sregex_iterator(); ++it)
      run->finals[std::stoi((*it)[1])] = (*it)[2];
  }

  // The same job on one node with `nproc` ranks: what every multi-node run must end with.
  std::map<int, std::string> SingleNodeFinals(const std::string& drill_flags, int nproc = 4) {
    NodeRun run;
    const std::string cmd = std::string(LIFELINE_AGENT_BIN) + " run --nproc " + std::to_string(nproc) +
                            " --hang-timeout 5 --events-log " + dir_ +
                            "/single.0.events -- " + LIFELINE_DRILL_BIN + " --dir " + dir_ + "/single.ckpt " + drill_flags;
    run.exit_code = WaitFor(Spawn(cmd, Out("single", 0)), 120);
    Read("single", 0, &run);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(run.finals.size(), static_cast<size_t>(nproc)) << run.output;
    return run.finals;
  }

  std::vector<EtcdKeyValue> JobKeys(const std::string& job) {
    auto c = EtcdClient::Create(etcd_.endpoint());
    EXPECT_TRUE(c.ok());
    auto keys = (*c)->GetPrefix("/lifeline/" + job + "/");
    EXPECT_TRUE(keys.ok()) << keys.status().ToString();
    return keys.ok() ? *keys : std::vector<EtcdKeyValue>{};
  }

  // Lets job `name` train past a checkpoint, then loses node 1 (agent `agent`, its 2 ranks) as a
  // machine would be lost: SIGKILL to all. *lost: node 0's node_lost anomaly, which must come
  // within 3 s (issue 36: the leader sees the node's summary connection close and probes its
  // agent's port, whatever the lease).
  void LoseNode(const std::string& name, pid_t agent, std::optional<nlohmann::json>* lost, int within_seconds = 3) {
    std::vector<int> ranks;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      NodeRun so_far;
      Read(name, 1, &so_far);
      ranks.clear();
      for (const auto& a : so_far.actions)
        if (a.value("action", "") == "launch") ranks = a["pids"].get<std::vector<int>>();
      // Step 100 complete on disk: the job that goes on has a checkpoint it can reach (a step only
      // snapshotted by the lost node's ranks may never have been written).
      Result<ResumeOffer> offer = FindResumeOffer(Env::Default(), dir_ + "/" + name + ".ckpt");
      if (!ranks.empty() && offer.ok() && offer->disk_step && *offer->disk_step >= 100) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_EQ(ranks.size(), 2u);
    kill(agent, SIGKILL);
    for (int pid : ranks) kill(-pid, SIGKILL);  // each rank leads its own process group
    waitpid(agent, nullptr, 0);
    const auto lost_at = std::chrono::steady_clock::now();
    while (!*lost && std::chrono::steady_clock::now() - lost_at < std::chrono::seconds(30)) {
      NodeRun so_far;
      Read(name, 0, &so_far);
      for (const auto& a : so_far.anomalies)
        if (a.value("kind", "") == "node_lost") *lost = a;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(lost->has_value()) << "no node_lost within 30 s";
    EXPECT_EQ((**lost)["ranks"], nlohmann::json::array({2, 3})) << (*lost)->dump();
    EXPECT_LT(std::chrono::steady_clock::now() - lost_at, std::chrono::seconds(within_seconds)) << (*lost)->dump();
  }

  // Starts nodes 0 and 1 of job `name` with a 3 s lease, so that a lost node is noticed quickly;
  // returns the agent flags, for a replacement.
  std::string StartWithAShortLease(const std::string& name, const std::string& steps, pid_t* node0, pid_t* node1) {
    const std::string config = dir_ + "/" + name + ".yaml";
    std::ofstream(config) << "rendezvous:\n  lease_seconds: 3\n  join_timeout_seconds: 120\n";
    const std::string flags = "--max-restarts 2 --config " + config;
    *node0 = Spawn(AgentCommand(name, 0, name, flags + " --node-rank 0", steps), Out(name, 0));
    *node1 = Spawn(AgentCommand(name, 1, name, flags + " --node-rank 1", steps), Out(name, 1));
    return flags;
  }

  // Starts a replacement for node 1 of job `name` (a new machine: its own memory) and waits for
  // it and the survivor, node 0, to finish the job; *survivor_run and *replacement_run get what
  // they did.
  void RunReplacement(const std::string& name, const std::string& flags, const std::string& steps, pid_t survivor,
                      NodeRun* survivor_run, NodeRun* replacement_run) {
    const pid_t replacement = Spawn(AgentCommand(name, 2, name, flags + " --node-rank 1", steps), Out(name, 2));
    survivor_run->exit_code = WaitFor(survivor, 120);
    replacement_run->exit_code = WaitFor(replacement, 120);
    Read(name, 0, survivor_run);
    Read(name, 2, replacement_run);
    ASSERT_EQ(survivor_run->exit_code, 0) << survivor_run->output;
    ASSERT_EQ(replacement_run->exit_code, 0) << replacement_run->output;
  }

  // How many of node `node`'s ranks have marked their memory-tier snapshot of `step` as on disk.
  int DiskMarks(const std::string& name, int node, uint64_t step) {
    const std::string tier = dir_ + "/" + name + ".tier." + std::to_string(node);
    int marks = 0;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(tier, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      const std::string file = it->path().filename().string();
      const std::string dir = it->path().parent_path().filename().string();
      if (file.size() > 8 && file.compare(file.size() - 8, 8, ".on-disk") == 0 && dir.rfind("step-", 0) == 0 &&
          std::stoull(dir.substr(5)) == step)
        ++marks;
    }
    return marks;
  }

  // Makes the disk copies of steps from `from_step` on look never finished to node `node`'s memory
  // tier, as the tests that delete those steps from the disk mean it: a rank marks its snapshot
  // once its disk copy is published (and a tier snapshot whose disk copy was then deleted is not
  // offered again), so the marks of writes that "never finished" go too.
  void ForgetDiskCopies(const std::string& name, int node, uint64_t from_step) {
    const std::string tier = dir_ + "/" + name + ".tier." + std::to_string(node);
    std::vector<std::filesystem::path> marks;
    for (const auto& e : std::filesystem::recursive_directory_iterator(tier)) {
      const std::string file = e.path().filename().string();
      const std::string step = e.path().parent_path().filename().string();
      if (file.size() > 8 && file.compare(file.size() - 8, 8, ".on-disk") == 0 && step.rfind("step-", 0) == 0 &&
          std::stoull(step.substr(5)) >= from_step)
        marks.push_back(e.path());
    }
    for (const auto& m : marks) std::filesystem::remove(m);
  }

  testing::EtcdTestServer etcd_;
  std::string dir_;
  // false: the agents learn the checkpoint directory only as users' agents do, from the ranks
  // (which report it when they open it), after the first round has formed.
  bool tell_checkpoint_dir_ = true;
};

constexpr char kSteps[] = "--steps 120 --ckpt-every 20";

TEST_F(MultiNodeTest, TwoNodesFormOneWorldAndEndLikeOneNodeLeavingNothingInEtcd) {
  const auto single = SingleNodeFinals(kSteps);
  std::vector<NodeRun> runs = RunJob("clean", "", kSteps);
  std::map<int, std::string> finals;
  std::vector<int> first_ranks;
  for (const NodeRun& r : runs) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(r.anomalies.empty()) << Dump(r.anomalies);
    ASSERT_EQ(Count(r.actions, "action", "rendezvous"), 1) << Dump(r.actions);
    for (const auto& a : r.actions) {
      if (a.value("action", "") != "rendezvous") continue;
      EXPECT_EQ(a["world_size"], 4) << a.dump();
      EXPECT_EQ(a["round"], 0) << a.dump();
      EXPECT_EQ(a["nodes"].size(), 2u) << a.dump();
      first_ranks.push_back(a["first_rank"].get<int>());
    }
    EXPECT_EQ(Count(r.actions, "action", "finished"), 1) << Dump(r.actions);
    finals.insert(r.finals.begin(), r.finals.end());
  }
  std::sort(first_ranks.begin(), first_ranks.end());
  EXPECT_EQ(first_ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(finals, single);
  EXPECT_TRUE(JobKeys("clean").empty()) << "the job's keys stay in etcd";
  // Issue 36: the agents learned of the round through their watch streams, and etcd's work
  // followed the job's changes: a join, a plan, the summaries once a second and a lease renewal
  // every lease/3 (an agent polling etcd four times a second, as before, made more than 5 a second).
  for (const NodeRun& r : runs) {
    ASSERT_EQ(Count(r.actions, "action", "usage"), 1) << Dump(r.actions);
    for (const auto& a : r.actions) {
      if (a.value("action", "") != "usage") continue;
      EXPECT_GT(a.value("etcd_watch_events", 0), 0) << a.dump();
      EXPECT_LT(a["etcd_requests"].get<double>(), 30 + 2.5 * a["seconds"].get<double>()) << a.dump();
    }
  }
  // Nor anything in memory: the ranks withdrew their snapshots, the agents the replicas they
  // held, and the records of what was replicated are gone with them.
  for (int node = 0; node < 2; ++node)
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_ + "/clean.tier." + std::to_string(node)))
      EXPECT_NE(e.path().filename().string().rfind("step-", 0), 0u) << "left in memory: " << e.path();
  Result<std::vector<ReplicationRecord>> records = ReadReplicationRecords(Env::Default(), dir_ + "/clean.ckpt");
  ASSERT_TRUE(records.ok());
  EXPECT_TRUE(records->empty()) << "a record of replicas no longer held";
}

// The crash of global rank 3 (node 1's second rank) in a job of `nnodes` nodes of 2 ranks: only
// node 1 names it; every node goes to round 1 together, resumes from one step, and the job ends
// like one node of as many ranks, leaving nothing in etcd.
void ExpectACrashRestartsEveryNodeTogether(MultiNodeTest* t, const std::string& name, int nnodes,
                                           const std::string& flags = "") {
  const auto single = t->SingleNodeFinals(kSteps, 2 * nnodes);
  std::vector<NodeRun> runs =
      t->RunJob(name, "--max-restarts 2 " + flags, std::string(kSteps) + " --fault crash@3:50", nnodes);
  std::map<int, std::string> finals;
  std::vector<int> first_ranks, want_first_ranks;
  std::set<std::string> resumed;
  int dead_reports = 0;
  for (const NodeRun& r : runs) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& a : r.anomalies) {
      EXPECT_EQ(a["kind"], "dead") << a.dump();
      EXPECT_EQ(a["ranks"], nlohmann::json::array({3})) << a.dump();
      EXPECT_NE(a.value("message", "").find("rank 3"), std::string::npos) << a.dump();
      ++dead_reports;
    }
    std::vector<int> rounds;
    for (const auto& a : r.actions) {
      if (a.value("action", "") == "rendezvous") {
        rounds.push_back(a["round"].get<int>());
        EXPECT_EQ(a["world_size"], 2 * nnodes) << a.dump();
        if (a["round"] == 0) first_ranks.push_back(a["first_rank"].get<int>());
      }
      if (a.value("action", "") == "resumed") resumed.insert(a["resumed_from_checkpoint"].dump());
    }
    EXPECT_EQ(rounds, (std::vector<int>{0, 1})) << Dump(r.actions);
    finals.insert(r.finals.begin(), r.finals.end());
  }
  EXPECT_EQ(dead_reports, 1) << "only the node that ran rank 3 saw it die";
  std::sort(first_ranks.begin(), first_ranks.end());
  for (int node = 0; node < nnodes; ++node) want_first_ranks.push_back(2 * node);
  EXPECT_EQ(first_ranks, want_first_ranks);
  EXPECT_EQ(resumed.size(), 1u) << "the nodes resumed from different steps";
  EXPECT_EQ(finals, single);
  EXPECT_TRUE(t->JobKeys(name).empty());
}

TEST_F(MultiNodeTest, ACrashOnOneNodeRestartsEveryNodeInTheNextRoundNamingTheGlobalRank) {
  ExpectACrashRestartsEveryNodeTogether(this, "crash", 2);
}

// `rendezvous: {watch: false}` (a proxy in between that does not pass streams): the same job,
// with the agents polling etcd.
TEST_F(MultiNodeTest, WithPollsInsteadOfWatchesACrashRestartsEveryNodeTogether) {
  const std::string config = dir_ + "/poll.yaml";
  std::ofstream(config) << "rendezvous:\n  watch: false\n";
  ExpectACrashRestartsEveryNodeTogether(this, "poll", 2, "--config " + config);
}

TEST_F(MultiNodeTest, ThreeNodesActTogetherOnACrashAndEndLikeOneNodeOfSixRanks) {
  ExpectACrashRestartsEveryNodeTogether(this, "three", 3);
}

// Each node's memory tier holds only its own ranks' snapshots, until its agent replicates them to
// the next node (a ring): with two nodes, both tiers then hold every rank, so after rank 3 is
// SIGKILLed every rank of the next round loads step 50 from memory, and the job ends like one node.
TEST_F(MultiNodeTest, AfterACrashEveryRankResumesFromMemoryThroughThePeersReplica) {
  // Step 50 is saved, then 45 steps of 20 ms leave the agents time to replicate it.
  const std::string steps = "--steps 120 --ckpt-every 50 --compute-ms 20";
  const auto single = SingleNodeFinals(steps);
  tell_checkpoint_dir_ = false;  // replication starts from what the ranks report
  std::vector<NodeRun> runs = RunJob("replica", "--max-restarts 2", steps + " --fault crash@3:95");
  std::map<int, std::string> finals;
  for (const NodeRun& r : runs) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::vector<int> replicated;
    for (const auto& a : r.actions)
      if (a.value("action", "") == "replicated") replicated.push_back(a["step"].get<int>());
    EXPECT_NE(std::find(replicated.begin(), replicated.end(), 50), replicated.end()) << Dump(r.actions);
    finals.insert(r.finals.begin(), r.finals.end());
  }
  std::string output = runs[0].output + runs[1].output;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(output.find("rank " + std::to_string(rank) + " resumed from step 50 (memory tier)"), std::string::npos)
        << output;
  EXPECT_EQ(finals, single);
}

// replication.group_size 3 over three nodes: each node's snapshots go to both others (with the
// default ring, node 0 would hold ranks 0-1 and 4-5 only, and resume from disk), so after rank 5
// is SIGKILLed all six ranks load step 50 from their own node's memory.
TEST_F(MultiNodeTest, WithAGroupOfThreeEveryNodeHoldsEveryRankAndResumesFromMemory) {
  const std::string steps = "--steps 120 --ckpt-every 50 --compute-ms 20";
  const auto single = SingleNodeFinals(steps, 6);
  const std::string config = dir_ + "/group.yaml";
  std::ofstream(config) << "replication:\n  group_size: 3\n";
  std::vector<NodeRun> runs =
      RunJob("group", "--max-restarts 2 --config " + config, steps + " --fault crash@5:95", /*nnodes=*/3);
  std::map<int, std::string> finals;
  std::string output;
  for (const NodeRun& r : runs) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& a : r.actions)
      if (a.value("action", "") == "resumed") {
        EXPECT_EQ(a.value("source", ""), "memory") << a.dump();
      }
    EXPECT_EQ(Count(r.actions, "action", "resumed"), 1) << Dump(r.actions);
    finals.insert(r.finals.begin(), r.finals.end());
    output += r.output;
  }
  for (int rank = 0; rank < 6; ++rank)
    EXPECT_NE(output.find("rank " + std::to_string(rank) + " resumed from step 50 (memory tier)"), std::string::npos)
        << output;
  EXPECT_EQ(finals, single);
}

// A rank hung on node 1 is the one named, on every node: node 0, whose ranks all joined the
// allreduce rank 3 never entered, does not blame them (its view stops at its own ranks); the
// culprit's node or the round's leader (the job-wide view) names rank 3 within the hang timeout
// plus 2 s, and the job ends like a clean one.
TEST_F(MultiNodeTest, AHangOnOneNodeIsNamedAsTheGlobalCulpritOnEveryNode) {
  const auto single = SingleNodeFinals(kSteps);
  std::vector<NodeRun> runs = RunJob("hang", "--max-restarts 2", std::string(kSteps) + " --fault hang@3:110");
  std::map<int, std::string> finals;
  int hangs = 0;
  for (const NodeRun& r : runs) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& a : r.anomalies) {
      // A rank-less slow_collective from CPU contention on this 2-core machine is issue 24's
      // subject; what matters here is that no other rank is ever blamed.
      for (const auto& rank : a["ranks"]) EXPECT_EQ(rank, 3) << a.dump();
      if (a["kind"] != "hang") continue;
      EXPECT_EQ(a["ranks"], nlohmann::json::array({3})) << a.dump();
      const double waited = a["evidence"].value("waited_seconds", 0.0);
      EXPECT_LT(waited, 5.0 + 2.0) << a.dump();
      ++hangs;
    }
    finals.insert(r.finals.begin(), r.finals.end());
  }
  EXPECT_GE(hangs, 1);
  EXPECT_EQ(finals, single);
}

// The job-wide view at work: node 1's own detectors are given a 60 s hang timeout, so only the
// round's leader (node 0, timeout 5 s), reading every node's progress summary, can name rank 3,
// which never joined the allreduce rank 2 (on its node) and ranks 0 and 1 (on node 0) wait in.
TEST_F(MultiNodeTest, TheLeaderNamesAHungRankOfAnotherNodeFromTheProgressSummaries) {
  const auto single = SingleNodeFinals(kSteps);
  const std::string drill = std::string(kSteps) + " --fault hang@3:110";
  const pid_t leader = Spawn(AgentCommand("view", 0, "view", "--max-restarts 2 --node-rank 0", drill), Out("view", 0));
  std::string slow = AgentCommand("view", 1, "view", "--max-restarts 2 --node-rank 1", drill);
  slow.replace(slow.find("--hang-timeout 5"), 16, "--hang-timeout 60");
  const pid_t other = Spawn(slow, Out("view", 1));
  const std::vector<NodeRun> runs = WaitForNodes("view", {leader, other});
  const NodeRun &a = runs[0], &b = runs[1];
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  std::vector<nlohmann::json> hangs;
  for (const auto& x : a.anomalies)
    if (x["kind"] == "hang") hangs.push_back(x);
  ASSERT_EQ(hangs.size(), 1u) << Dump(a.anomalies);
  EXPECT_EQ(hangs[0]["ranks"], nlohmann::json::array({3})) << hangs[0].dump();
  EXPECT_EQ(hangs[0]["evidence"].value("job_wide", false), true) << hangs[0].dump();
  EXPECT_EQ(hangs[0]["evidence"]["waiting_ranks"], nlohmann::json::array({0, 1, 2})) << hangs[0].dump();
  // Published once a second and read once a second: seen at most ~2 s late, so named within the
  // timeout plus 2 s of the last rank entering (what waited_seconds counts from its first sight).
  EXPECT_LT(hangs[0]["evidence"]["waited_seconds"].get<double>(), 5.0 + 2.0) << hangs[0].dump();
  for (const auto& x : b.anomalies) EXPECT_NE(x["kind"], "hang") << "node 1's own view needed 60 s: " << x.dump();
  std::map<int, std::string> finals = a.finals;
  finals.insert(b.finals.begin(), b.finals.end());
  EXPECT_EQ(finals, single);
}

// Stragglers and slow links are judged on the job-wide view: the leader replays every node's
// summaries and names the rank once, wherever it runs; nothing restarts; the job ends like a
// clean one. `kind` is the expected anomaly, `fault` the drill's.
void ExpectNamedOnceByTheLeader(MultiNodeTest* t, const std::string& name, const std::string& steps,
                                const std::string& fault, const std::string& kind, int rank) {
  const auto single = t->SingleNodeFinals(steps);
  std::vector<NodeRun> runs = t->RunJob(name, "--max-restarts 2", steps + " --fault " + fault);
  std::map<int, std::string> finals;
  int named = 0;
  std::string seen;  // every node's anomalies and what it did not page, for a failure's message
  for (const NodeRun& r : runs) {
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Count(r.actions, "action", "restart"), 0) << Dump(r.actions);
    seen += Dump(r.anomalies);
    for (const auto& x : r.actions)
      if (x.value("action", "") == "not_paged") seen += x.dump() + "\n";
    for (const auto& a : r.anomalies) {
      for (const auto& x : a["ranks"]) EXPECT_EQ(x, rank) << a.dump();
      if (a["kind"] != kind) continue;
      EXPECT_EQ(a["ranks"], nlohmann::json::array({rank})) << a.dump();
      EXPECT_EQ(a["evidence"].value("job_wide", false), true) << a.dump();
      ++named;
    }
    finals.insert(r.finals.begin(), r.finals.end());
  }
  EXPECT_EQ(named, 1) << "one fault, one alarm (the detectors' cooldown outlasts the job)\n" << seen;
  EXPECT_EQ(finals, single);
}

TEST_F(MultiNodeTest, AStragglerOnAnotherNodeIsNamedOnceByTheLeader) {
  ExpectNamedOnceByTheLeader(this, "straggler", "--steps 200 --ckpt-every 20", "slow@3:30:40", "straggler", 3);
}

// The slowdown must stand out of the host's own noise by the detector's factor (x2): on this
// 2-core machine saturated by other tests the drill's allreduce takes 28 ms at its median (its
// ranks wait for a core at every wake-up), so a link 30 ms slow was at the threshold and named in
// some runs only. 100 ms is a slow link on any host that runs the test.
TEST_F(MultiNodeTest, ASlowLinkIsNamedByTheLeader) {
  ExpectNamedOnceByTheLeader(this, "slowlink", "--steps 300 --ckpt-every 50 --compute-ms 5", "slowcomm@1:200:100",
                             "slow_collective", 1);
}

// Issue 50, item 5: a link 20 ms slower per collective on rank 2 from step 97 raised nothing: the
// leader's view saw the job's collectives from about the 90th on (its first summaries), so its
// baseline held the slow ones; and node 1, whose summaries shared no collective with the leader's
// of the same read, was held unmeasured for 5 reads of a 6-second job. Named now, once, by the
// leader, against the collective's own cost (0.4 ms here).
TEST_F(MultiNodeTest, ALinkTwentyMillisecondsSlowFromStep97IsNamedByTheLeader) {
  ExpectNamedOnceByTheLeader(this, "slowlink20", "--steps 300 --ckpt-every 50", "slowcomm@2:97:20", "slow_collective", 2);
}

// The drill's crash is a SIGKILL from outside: a fault of the machine, so every node exits 3 (a
// requeue may help), the node that gave up and the one that learnt it from etcd alike.
TEST_F(MultiNodeTest, ASpentBudgetEndsTheJobOnEveryNodeWithTheReason) {
  std::vector<NodeRun> runs = RunJob("budget", "--max-restarts 0", std::string(kSteps) + " --fault crash@1:30");
  for (const NodeRun& r : runs) {
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_NE(r.output.find("restart budget spent"), std::string::npos) << r.output;
  }
  EXPECT_TRUE(JobKeys("budget").empty());
}

// A node whose agent and ranks die (SIGKILL, as a machine lost) is reported as node_lost naming
// its global ranks once its lease expires; the other node stops its ranks, opens the next round
// and waits; a replacement agent joins it and the job ends like one that never lost a node.
TEST_F(MultiNodeTest, ALostNodeIsNamedWithItsRanksAndAReplacementResumesTheJob) {
  const std::string steps = "--steps 1500 --ckpt-every 50 --compute-ms 2";
  const auto single = SingleNodeFinals(steps);
  pid_t survivor = -1, victim = -1;
  const std::string flags = StartWithAShortLease("lost", steps, &survivor, &victim);
  std::optional<nlohmann::json> lost;
  ASSERT_NO_FATAL_FAILURE(LoseNode("lost", victim, &lost));
  // The survivor waits in the next round for a node to come.
  NodeRun a, b;
  ASSERT_NO_FATAL_FAILURE(RunReplacement("lost", flags, steps, survivor, &a, &b));
  std::map<int, std::string> finals = a.finals;
  finals.insert(b.finals.begin(), b.finals.end());
  EXPECT_EQ(finals, single);
  for (const NodeRun* r : {&a, &b}) {
    int last_round = -1;
    for (const auto& x : r->actions)
      if (x.value("action", "") == "rendezvous") last_round = x["round"].get<int>();
    EXPECT_EQ(last_round, 1) << Dump(r->actions);
  }
  EXPECT_TRUE(JobKeys("lost").empty());
}

// Issue 32, item 10: with the default 10 s lease, the survivor's ranks are left waiting in their
// collective (the drill's wait to be stopped; gloo's raise, for a Python rank, is held as an echo:
// HoldFailureEchoes) and the leader blamed them ("every member joined") before node 1's lease ran
// out: node 1 had gone before its first summary arrived, so its ranks were not even members. They
// are, and the verdict waits for the lease: node_lost names the culprit, alone.
TEST_F(MultiNodeTest, WithTheDefaultLeaseALostNodeIsTheCulpritNotTheSurvivorsRank) {
  const std::string steps = "--steps 1500 --ckpt-every 50 --compute-ms 2";
  const auto single = SingleNodeFinals(steps);
  const std::string config = dir_ + "/default-lease.yaml";
  std::ofstream(config) << "rendezvous:\n  join_timeout_seconds: 120\n";  // lease: the default
  const std::string flags = "--max-restarts 2 --config " + config;
  const pid_t survivor = Spawn(AgentCommand("lease", 0, "lease", flags + " --node-rank 0", steps), Out("lease", 0));
  const pid_t victim = Spawn(AgentCommand("lease", 1, "lease", flags + " --node-rank 1", steps), Out("lease", 1));
  std::optional<nlohmann::json> lost;
  ASSERT_NO_FATAL_FAILURE(LoseNode("lease", victim, &lost));  // in 3 s, well before the 10 s lease
  EXPECT_EQ((*lost)["evidence"].value("found_by", ""), "summary_stream") << lost->dump();
  EXPECT_NE((*lost)["message"].get<std::string>().find("did not accept a connection"), std::string::npos)
      << lost->dump();
  NodeRun a, b;
  ASSERT_NO_FATAL_FAILURE(RunReplacement("lease", flags, steps, survivor, &a, &b));
  ASSERT_EQ(a.anomalies.size(), 1u) << Dump(a.anomalies);
  EXPECT_EQ(a.anomalies[0]["kind"], "node_lost") << a.anomalies[0].dump();
  EXPECT_EQ(a.anomalies[0]["ranks"], nlohmann::json::array({2, 3})) << a.anomalies[0].dump();
  // Issue 50, item 4: the restart's detection is the silence the leader measured (named within 3 s
  // of the SIGKILL above), not the 10 s lease.
  const double silent = a.anomalies[0]["evidence"].value("silent_seconds", -1.0);
  EXPECT_GE(silent, 0) << a.anomalies[0].dump();
  EXPECT_LT(silent, 10) << a.anomalies[0].dump();
  int costs = 0;
  for (const auto& x : a.actions) {
    if (x.value("action", "") != "time_lost") continue;
    ++costs;
    EXPECT_EQ(x["cause"], "node_lost") << x.dump();
    EXPECT_NEAR(x["detection_seconds"].get<double>(), silent, 0.5) << x.dump();
  }
  EXPECT_EQ(costs, 1) << Dump(a.actions);
  std::map<int, std::string> finals = a.finals;
  finals.insert(b.finals.begin(), b.finals.end());
  EXPECT_EQ(finals, single);
}

// The lost node's snapshots live on in its peer's memory: node 1's ranks replicate step S to node 0;
// node 1 (agent and ranks) is SIGKILLed and the disk loses every step from S on (as if those
// writes never finished). The replacement, whose memory is empty, receives step S from node 0
// before it launches, and all four ranks resume from it in memory; the job ends like a clean one.
TEST_F(MultiNodeTest, AReplacementResumesFromTheLostNodesReplicaInItsPeersMemory) {
  const std::string steps = "--steps 400 --ckpt-every 50 --compute-ms 20";
  const auto single = SingleNodeFinals(steps);
  pid_t survivor = -1, victim = -1;
  const std::string flags = StartWithAShortLease("peer", steps, &survivor, &victim);
  // As soon as node 1 has replicated a step from 100 on, and node 0's ranks have marked that step
  // of their memory as on disk (ForgetDiskCopies below must come after their marks), it goes.
  int replicated = -1;
  std::vector<int> ranks;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while ((replicated < 100 || DiskMarks("peer", 0, static_cast<uint64_t>(replicated)) < 2) &&
         std::chrono::steady_clock::now() < deadline) {
    NodeRun so_far;
    Read("peer", 1, &so_far);
    for (const auto& a : so_far.actions) {
      if (a.value("action", "") == "launch") ranks = a["pids"].get<std::vector<int>>();
      if (a.value("action", "") == "replicated") replicated = a["step"].get<int>();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(replicated, 100) << "node 1 never replicated a step";
  ASSERT_EQ(ranks.size(), 2u);
  // The job's record, what `lifeline ls` reads, says so: node 1's ranks of that step are on a peer.
  Result<std::vector<ReplicationRecord>> records = ReadReplicationRecords(Env::Default(), dir_ + "/peer.ckpt");
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  bool recorded = false;
  for (const ReplicationRecord& r : *records)
    if (r.first_rank == 2 && r.ranks == 2 && r.world_size == 4)
      recorded = std::find(r.steps.begin(), r.steps.end(), static_cast<uint64_t>(replicated)) != r.steps.end();
  EXPECT_TRUE(recorded) << "no record of ranks 2-3 of step " << replicated << " on a peer";
  kill(victim, SIGKILL);
  for (int pid : ranks) kill(-pid, SIGKILL);
  waitpid(victim, nullptr, 0);
  NodeRun gone;
  Read("peer", 1, &gone);
  for (const auto& a : gone.actions)
    if (a.value("action", "") == "replicated") replicated = a["step"].get<int>();
  // The disk loses step S and everything after it.
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/peer.ckpt")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && std::stoll(name.substr(5)) >= replicated) RemoveWhileWritten(e.path());
  }
  ForgetDiskCopies("peer", 0, static_cast<uint64_t>(replicated));
  NodeRun a, b;
  ASSERT_NO_FATAL_FAILURE(RunReplacement("peer", flags, steps, survivor, &a, &b));
  const std::string resumed = "resumed from step " + std::to_string(replicated) + " (memory tier)";
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE((a.output + b.output).find("rank " + std::to_string(rank) + " " + resumed), std::string::npos)
        << a.output << b.output;
  EXPECT_EQ(Count(a.actions, "action", "sent_resume_step"), 1) << Dump(a.actions);
  EXPECT_EQ(Count(b.actions, "action", "fetched_resume_step"), 1) << Dump(b.actions);
  // The survivor restarted its ranks and says where they resumed from (the replacement's ranks
  // were never restarted: their launch line names the same step and location).
  int resumed_lines = 0;
  for (const auto& x : a.actions) {
    if (x.value("action", "") != "resumed") continue;
    EXPECT_EQ(x.value("source", ""), "peer_memory") << x.dump();
    EXPECT_EQ(x["resumed_from_checkpoint"], replicated) << x.dump();
    ++resumed_lines;
  }
  EXPECT_EQ(resumed_lines, 1) << Dump(a.actions);
  for (const NodeRun* r : {&a, &b}) {
    const nlohmann::json* last_launch = nullptr;
    for (const auto& x : r->actions)
      if (x.value("action", "") == "launch") last_launch = &x;
    ASSERT_NE(last_launch, nullptr);
    EXPECT_EQ((*last_launch)["resume"]["location"], "peer_memory") << last_launch->dump();
    EXPECT_EQ((*last_launch)["resume"]["step"], replicated) << last_launch->dump();
  }
  std::map<int, std::string> finals = a.finals;
  finals.insert(b.finals.begin(), b.finals.end());
  EXPECT_EQ(finals, single);
}

// A replica damaged on its way (LIFELINE_DRILL_DAMAGE_REPLICAS flips a bit of every stream node 1
// sends) is refused by node 0, never counted replicated, never used: when node 1 is lost after the
// disk lost its newest steps, node 0 holds those steps only in part (its own ranks), and the job
// falls back to the newest step on disk, saying why, and ends like a clean run.
TEST_F(MultiNodeTest, AReplicaDamagedInTransitIsRefusedAndTheJobFallsBackToDiskSayingSo) {
  const std::string steps = "--steps 400 --ckpt-every 50 --compute-ms 20";
  const auto single = SingleNodeFinals(steps);
  const std::string config = dir_ + "/damaged.yaml";
  std::ofstream(config) << "rendezvous:\n  lease_seconds: 3\n  join_timeout_seconds: 120\n";
  const std::string flags = "--max-restarts 2 --config " + config;
  const pid_t survivor = Spawn(AgentCommand("damaged", 0, "damaged", flags + " --node-rank 0", steps), Out("damaged", 0));
  std::string damaging = AgentCommand("damaged", 1, "damaged", flags + " --node-rank 1", steps);
  damaging.replace(0, 4, "env LIFELINE_DRILL_DAMAGE_REPLICAS=1 ");  // after the leading "env "
  const pid_t victim = Spawn(damaging, Out("damaged", 1));
  // Node 1 has tried (and failed) to replicate, step 100 is on disk, and node 0's ranks have marked
  // their memory's step 100 as on disk (a mark written after ForgetDiskCopies below would hide the
  // step from the resume: on a slow machine a rank's mark came after the test had looked).
  std::vector<int> ranks;
  std::optional<nlohmann::json> failed;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  for (bool ready = false; !ready && std::chrono::steady_clock::now() < deadline;) {
    NodeRun so_far;
    Read("damaged", 1, &so_far);
    for (const auto& a : so_far.actions) {
      if (a.value("action", "") == "launch") ranks = a["pids"].get<std::vector<int>>();
      if (a.value("action", "") == "replication_failed") failed = a;
    }
    Result<ResumeOffer> offer = FindResumeOffer(Env::Default(), dir_ + "/damaged.ckpt");
    ready = failed && ranks.size() == 2 && offer.ok() && offer->disk_step && *offer->disk_step >= 100 &&
            DiskMarks("damaged", 0, *offer->disk_step) >= 2;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(failed.has_value()) << "node 1 never reported a failed replication";
  EXPECT_NE((*failed)["error"].get<std::string>().find("fails its checksum in transit"), std::string::npos)
      << failed->dump();
  ASSERT_EQ(ranks.size(), 2u);
  kill(victim, SIGKILL);
  for (int pid : ranks) kill(-pid, SIGKILL);
  waitpid(victim, nullptr, 0);
  NodeRun gone;
  Read("damaged", 1, &gone);
  EXPECT_EQ(Count(gone.actions, "action", "replicated"), 0) << "a damaged replica counted: " << Dump(gone.actions);
  // Nothing of node 1's ranks reached node 0's memory.
  for (const auto& tier : std::filesystem::recursive_directory_iterator(dir_ + "/damaged.tier.0")) {
    const std::string name = tier.path().filename().string();
    EXPECT_EQ(name.find(".r000002-"), std::string::npos) << "a damaged replica was kept: " << tier.path();
    EXPECT_EQ(name.find(".r000003-"), std::string::npos) << "a damaged replica was kept: " << tier.path();
  }
  // The disk loses its newest steps: node 0's memory holds a newer step, but only half of it.
  uint64_t kept = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/damaged.ckpt")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) != 0) continue;
    if (std::stoll(name.substr(5)) >= 100) RemoveWhileWritten(e.path());
    else kept = std::max<uint64_t>(kept, std::stoull(name.substr(5)));
  }
  ASSERT_EQ(kept, 50u);
  ForgetDiskCopies("damaged", 0, 100);
  NodeRun a, b;
  ASSERT_NO_FATAL_FAILURE(RunReplacement("damaged", flags, steps, survivor, &a, &b));
  int fallbacks = 0;
  for (const auto& x : a.actions) {
    if (x.value("action", "") == "resumed") {
      EXPECT_EQ(x.value("source", ""), "disk") << x.dump();
      EXPECT_EQ(x["resumed_from_checkpoint"], 50) << x.dump();
    }
    if (x.value("action", "") != "resume_fallback") continue;
    ++fallbacks;
    EXPECT_EQ(x["step"], 50) << x.dump();
    EXPECT_EQ(x["location"], "disk") << x.dump();
    EXPECT_NE(x["reason"].get<std::string>().find("in memory only in part"), std::string::npos) << x.dump();
  }
  EXPECT_EQ(fallbacks, 1) << Dump(a.actions);
  EXPECT_EQ(Count(a.actions, "action", "sent_resume_step"), 0) << Dump(a.actions);
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE((a.output + b.output).find("rank " + std::to_string(rank) + " resumed from step 50 (disk)"),
              std::string::npos)
        << a.output << b.output;
  std::map<int, std::string> finals = a.finals;
  finals.insert(b.finals.begin(), b.finals.end());
  EXPECT_EQ(finals, single);
}

// With --nnodes 1:2 the job goes on without a lost node: the next round forms with the node
// that remains (after the last call), its ranks renumbered into a world of 2, loading the
// checkpoint 4 ranks saved (resharded) and training to the last step.
TEST_F(MultiNodeTest, WithMaxAboveMinTheJobGoesOnWithTheNodesThatRemain) {
  const std::string steps = "--steps 1500 --ckpt-every 50 --compute-ms 2";
  const std::string config = dir_ + "/elastic.yaml";
  std::ofstream(config) << "rendezvous:\n  lease_seconds: 3\n  last_call_seconds: 1\n";
  auto command = [&](int node) {
    std::string c = AgentCommand("elastic", node, "elastic", "--max-restarts 2 --config " + config +
                                                             " --node-rank " + std::to_string(node), steps);
    return c.replace(c.find("--nnodes 2"), 10, "--nnodes 1:2");
  };
  const pid_t survivor = Spawn(command(0), Out("elastic", 0));
  const pid_t victim = Spawn(command(1), Out("elastic", 1));
  std::optional<nlohmann::json> lost;
  ASSERT_NO_FATAL_FAILURE(LoseNode("elastic", victim, &lost));
  NodeRun r;
  r.exit_code = WaitFor(survivor, 120);
  Read("elastic", 0, &r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> rounds;
  for (const auto& a : r.actions)
    if (a.value("action", "") == "rendezvous") rounds.push_back(a);
  ASSERT_EQ(rounds.size(), 2u) << Dump(r.actions);
  EXPECT_EQ(rounds[1]["world_size"], 2) << rounds[1].dump();
  EXPECT_EQ(rounds[1]["nodes"].size(), 1u) << rounds[1].dump();
  ASSERT_EQ(Count(r.actions, "action", "resumed"), 1) << Dump(r.actions);
  for (const auto& a : r.actions) {
    if (a.value("action", "") == "resumed") {
      EXPECT_GE(a["resumed_from_checkpoint"].get<int>(), 100) << a.dump();
    }
  }
  ASSERT_EQ(r.finals.size(), 2u) << r.output;
  for (const auto& [rank, final] : r.finals) EXPECT_EQ(final.rfind("step=1500 ", 0), 0u) << final;
  EXPECT_TRUE(JobKeys("elastic").empty());
}

// Issue 36, item 3: node 1 reaches etcd through a proxy, which stops: node 1 is cut off from
// etcd while node 0 and the leader's summary port still answer. Before its lease runs out node 1
// stops its own ranks (node_lost naming itself, found by itself: the leader renewed its lease
// since), and only then does node 0, finding node 1's lease gone, go on alone (--nnodes 1:2) to
// the end: no two launches train at once.
TEST_F(MultiNodeTest, ANodeCutOffFromEtcdStopsItsOwnRanksBeforeTheOthersGoOnWithoutIt) {
  const std::string steps = "--steps 2000 --ckpt-every 50 --compute-ms 2";
  const std::string config = dir_ + "/cut.yaml";
  std::ofstream(config) << "rendezvous:\n  lease_seconds: 6\n  last_call_seconds: 1\n  join_timeout_seconds: 20\n";
  EtcdProxy proxy(static_cast<uint16_t>(std::stoi(etcd_.endpoint().substr(etcd_.endpoint().rfind(':') + 1))));
  ASSERT_NE(proxy.port(), 0);
  auto command = [&](int node) {
    std::string c = AgentCommand("cut", node, "cut", "--max-restarts 2 --config " + config +
                                                     " --node-rank " + std::to_string(node), steps);
    c.replace(c.find("--nnodes 2"), 10, "--nnodes 1:2");
    if (node == 1) c.replace(c.find(etcd_.endpoint()), etcd_.endpoint().size(), "127.0.0.1:" + std::to_string(proxy.port()));
    return c;
  };
  const pid_t node0 = Spawn(command(0), Out("cut", 0));
  const pid_t node1 = Spawn(command(1), Out("cut", 1));
  // Both train past a checkpoint; then the proxy stops.
  std::vector<int> ranks;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    NodeRun so_far;
    Read("cut", 1, &so_far);
    for (const auto& a : so_far.actions)
      if (a.value("action", "") == "launch") ranks = a["pids"].get<std::vector<int>>();
    Result<ResumeOffer> offer = FindResumeOffer(Env::Default(), dir_ + "/cut.ckpt");
    if (!ranks.empty() && offer.ok() && offer->disk_step && *offer->disk_step >= 100) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(ranks.size(), 2u);
  proxy.Stop();
  NodeRun a;
  a.exit_code = WaitFor(node0, 120);
  Read("cut", 0, &a);
  NodeRun b;
  Read("cut", 1, &b);
  WaitFor(node1, 30);  // it waits for etcd to come back, and gives up after the join timeout
  ASSERT_EQ(a.exit_code, 0) << a.output;
  // Node 1 named itself cut off and stopped its ranks...
  std::optional<nlohmann::json> self;
  for (const auto& x : b.anomalies)
    if (x.value("kind", "") == "node_lost" && x["evidence"].value("found_by", "") == "self") self = x;
  ASSERT_TRUE(self.has_value()) << Dump(b.anomalies) << b.output;
  EXPECT_EQ((*self)["ranks"], nlohmann::json::array({2, 3})) << self->dump();
  EXPECT_NE((*self)["message"].get<std::string>().find("cut off"), std::string::npos) << self->dump();
  std::string stopped_at;
  for (const auto& x : b.actions)
    if (x.value("action", "") == "stop") stopped_at = x.value("time", "");
  ASSERT_FALSE(stopped_at.empty()) << Dump(b.actions);
  for (int pid : ranks) EXPECT_NE(kill(pid, 0), 0) << "rank process " << pid << " of node 1 still runs";
  // ...before node 0 launched its ranks again, alone.
  std::vector<std::string> launches;
  for (const auto& x : a.actions)
    if (x.value("action", "") == "launch") launches.push_back(x.value("time", ""));
  ASSERT_EQ(launches.size(), 2u) << Dump(a.actions);
  EXPECT_LT(stopped_at, launches[1]) << "node 1's ranks stopped at " << stopped_at << ", node 0 relaunched at " << launches[1];
  ASSERT_EQ(a.finals.size(), 2u) << a.output;
  for (const auto& [rank, final] : a.finals) EXPECT_EQ(final.rfind("step=2000 ", 0), 0u) << final;
}

// etcd going away for a few seconds in the middle of training (SIGKILL, then back on the same
// data) changes nothing: the ranks never talk to it, the agents retry.
TEST_F(MultiNodeTest, AnEtcdRestartDuringTheJobIsSurvived) {
  const std::string steps = "--steps 2000 --ckpt-every 100 --compute-ms 2";
  const auto single = SingleNodeFinals(steps);
  std::vector<pid_t> pids;
  for (int node = 0; node < 2; ++node)
    pids.push_back(Spawn(AgentCommand("etcd", node, "etcd", "", steps), Out("etcd", node)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (bool running = false; !running && std::chrono::steady_clock::now() < deadline;) {
    NodeRun so_far;
    Read("etcd", 0, &so_far);
    running = so_far.output.find("checkpoint step=100") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  etcd_.Stop();
  std::this_thread::sleep_for(std::chrono::seconds(4));
  etcd_.Start();
  ASSERT_TRUE(etcd_.ok()) << etcd_.error();
  for (pid_t pid : pids) EXPECT_EQ(waitpid(pid, nullptr, WNOHANG), 0) << "the job ended before etcd came back";
  std::map<int, std::string> finals;
  for (int node = 0; node < 2; ++node) {
    NodeRun r;
    r.exit_code = WaitFor(pids[node], 120);
    Read("etcd", node, &r);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(r.anomalies.empty()) << Dump(r.anomalies);
    EXPECT_EQ(Count(r.actions, "action", "rendezvous"), 1) << Dump(r.actions);
    finals.insert(r.finals.begin(), r.finals.end());
  }
  EXPECT_EQ(finals, single);
  EXPECT_TRUE(JobKeys("etcd").empty());
}

// Issue 32, item 7: etcd away while a node restarts the job ended that node ("cannot open the next
// round in etcd"): its retry lasted one lease. Here rank 1 hangs at step 201; etcd goes away as step
// 200 is saved and stays away 18 s, so the hang (named after 5 s) is acted on while etcd is gone,
// for longer than the 10 s lease. The restart waits for etcd and the job ends like one node.
TEST_F(MultiNodeTest, AnEtcdRestartDuringARestartIsSurvived) {
  const std::string steps = "--steps 400 --ckpt-every 100 --compute-ms 2";
  const auto single = SingleNodeFinals(steps);
  std::vector<pid_t> pids;
  for (int node = 0; node < 2; ++node)
    pids.push_back(Spawn(AgentCommand("blip", node, "blip", "--max-restarts 2", steps + " --fault hang@1:201"),
                         Out("blip", node)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  bool saved = false;
  while (!saved && std::chrono::steady_clock::now() < deadline) {
    Result<ResumeOffer> offer = FindResumeOffer(Env::Default(), dir_ + "/blip.ckpt");
    saved = offer.ok() && offer->disk_step && *offer->disk_step >= 200;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(saved) << "step 200 never reached the disk";
  etcd_.Stop();
  const auto stopped = std::chrono::steady_clock::now();
  // The hang is named while etcd is away, and the restart then waits for etcd.
  std::optional<nlohmann::json> hang;
  while (!hang && std::chrono::steady_clock::now() - stopped < std::chrono::seconds(12)) {
    for (int node = 0; node < 2; ++node) {  // rank 1 runs on the node that joined first
      NodeRun so_far;
      Read("blip", node, &so_far);
      for (const auto& a : so_far.anomalies)
        if (a.value("kind", "") == "hang") hang = a;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(hang.has_value()) << "no hang named while etcd was away";
  std::this_thread::sleep_until(stopped + std::chrono::seconds(18));
  etcd_.Start();
  ASSERT_TRUE(etcd_.ok()) << etcd_.error();
  std::map<int, std::string> finals;
  for (int node = 0; node < 2; ++node) {
    NodeRun r;
    r.exit_code = WaitFor(pids[node], 120);
    Read("blip", node, &r);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Count(r.actions, "action", "give_up"), 0) << Dump(r.actions);
    finals.insert(r.finals.begin(), r.finals.end());
  }
  EXPECT_EQ(finals, single);
  EXPECT_TRUE(JobKeys("blip").empty());
}

// Issue 32, item 14: ranks whose LIFELINE_MEMORY_TIER_DIR differs from their agent's were never
// replicated, and nothing said so. The agent now says it, naming both tiers.
TEST_F(MultiNodeTest, RanksKeepingTheirTierWhereTheAgentDoesNotLookAreSaid) {
  tell_checkpoint_dir_ = false;  // replication starts from what the ranks report
  const std::string steps = "--steps 60 --ckpt-every 20 --compute-ms 10";
  std::vector<pid_t> pids;
  for (int node = 0; node < 2; ++node) {
    std::string cmd = AgentCommand("blind", node, "blind", "", steps);
    const size_t drill = cmd.find(LIFELINE_DRILL_BIN);
    cmd.insert(drill, "env LIFELINE_MEMORY_TIER_DIR=" + dir_ + "/elsewhere." + std::to_string(node) + " ");
    pids.push_back(Spawn(cmd, Out("blind", node)));
  }
  for (int node = 0; node < 2; ++node) {
    NodeRun r;
    r.exit_code = WaitFor(pids[node], 120);
    Read("blind", node, &r);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(Count(r.actions, "action", "replication_blind"), 1) << Dump(r.actions);
    for (const auto& a : r.actions)
      if (a.value("action", "") == "replication_blind") {
        EXPECT_NE(a["ranks_tier"].get<std::string>().find("/elsewhere."), std::string::npos) << a.dump();
      }
    EXPECT_NE(r.output.find("LIFELINE_MEMORY_TIER_DIR differs between the agent and its ranks"), std::string::npos);
  }
}

// Issue 32, item 11: with node 1's clock 2 s behind (the agent's test hook), the leader replayed
// node 1's collectives 2 s off and named a false straggler "2.0 s late". A clean job stays clean.
TEST_F(MultiNodeTest, ANodeWhoseClockIsTwoSecondsBehindRaisesNothing) {
  const std::string steps = "--steps 300 --ckpt-every 100 --compute-ms 5";
  const auto single = SingleNodeFinals(steps, 2);
  std::vector<pid_t> pids;
  for (int node = 0; node < 2; ++node) {  // one rank a node: rank 1 is judged against rank 0 alone
    std::string cmd = AgentCommand("skew", node, "skew", "--node-rank " + std::to_string(node), steps);
    cmd.replace(cmd.find("--nproc-per-node 2"), 18, "--nproc-per-node 1");
    if (node == 1) cmd.replace(0, 4, "env LIFELINE_TEST_CLOCK_OFFSET_MS=-2000 ");  // after the leading "env "
    pids.push_back(Spawn(cmd, Out("skew", node)));
  }
  std::map<int, std::string> finals;
  for (int node = 0; node < 2; ++node) {
    NodeRun r;
    r.exit_code = WaitFor(pids[node], 120);
    Read("skew", node, &r);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(r.anomalies.empty()) << Dump(r.anomalies);
    finals.insert(r.finals.begin(), r.finals.end());
  }
  EXPECT_EQ(finals, single);
}

// Issue 32, item 10: an agent whose round lacks nodes waited up to the join timeout without a word.
// A connection to an agent's summary port that breaks the stream's rules (SPEC §17.2: here a hello
// for another job) is closed, logged in the agent's events log as `summary_refused` naming the peer
// and the rule, and printed as a warning; the job goes on and ends as it would have.
TEST_F(MultiNodeTest, ASummaryConnectionOfAnotherJobIsRefusedLoggedAndTheJobGoesOn) {
  const std::string steps = "--steps 300 --ckpt-every 100 --compute-ms 20";
  const pid_t node0 = Spawn(AgentCommand("refused", 0, "refused", "--node-rank 0", steps), Out("refused", 0));
  const pid_t node1 = Spawn(AgentCommand("refused", 1, "refused", "--node-rank 1", steps), Out("refused", 1));
  // Node 0's summary port, from its round entry, once the round has formed.
  uint16_t port = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (port == 0 && std::chrono::steady_clock::now() < deadline) {
    for (const EtcdKeyValue& kv : JobKeys("refused")) {
      if (kv.key.find("/rounds/0/nodes/") == std::string::npos) continue;
      const nlohmann::json entry = nlohmann::json::parse(kv.value, nullptr, false);
      if (!entry.is_discarded() && entry.value("requested_rank", -1) == 0 && entry.value("summary_port", 0) != 0)
        port = entry["summary_port"].get<uint16_t>();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_NE(port, 0) << "no round entry of node 0 with its summary port";
  Result<int> fd = net::Connect("127.0.0.1", port, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  const std::string hello = "intruder\n0\nsomebody";
  std::string frame(4, '\0');
  const uint32_t length = htonl(static_cast<uint32_t>(1 + hello.size()));
  std::memcpy(frame.data(), &length, 4);
  frame += '\x01';
  frame += hello;
  ASSERT_TRUE(net::SendAll(*fd, frame.data(), frame.size(), "node 0's summary port").ok());
  char byte;
  EXPECT_EQ(recv(*fd, &byte, 1, 0), 0) << "the connection was not closed";
  close(*fd);
  const std::vector<NodeRun> runs = WaitForNodes("refused", {node0, node1});
  const NodeRun &r0 = runs[0], &r1 = runs[1];
  ASSERT_EQ(r0.exit_code, 0) << r0.output;
  ASSERT_EQ(r1.exit_code, 0) << r1.output;
  EXPECT_TRUE(r0.anomalies.empty()) << Dump(r0.anomalies);
  ASSERT_EQ(Count(r0.actions, "action", "summary_refused"), 1) << Dump(r0.actions);
  for (const auto& a : r0.actions) {
    if (a.value("action", "") != "summary_refused") continue;
    const std::string message = a.value("message", "");
    EXPECT_NE(message.find("127.0.0.1"), std::string::npos) << message;
    EXPECT_NE(message.find("another job (intruder)"), std::string::npos) << message;
  }
  EXPECT_NE(r0.output.find("warning"), std::string::npos) << r0.output;
  EXPECT_EQ(Count(r1.actions, "action", "summary_refused"), 0) << Dump(r1.actions);
}

TEST_F(MultiNodeTest, AnAgentWaitingForNodesSaysSo) {
  const std::string config = dir_ + "/short-join.yaml";
  std::ofstream(config) << "rendezvous:\n  join_timeout_seconds: 6\n";
  const int rc = WaitFor(Spawn(AgentCommand("alone", 0, "alone", "--config " + config, "--steps 10"), Out("alone", 0)), 60);
  NodeRun r;
  Read("alone", 0, &r);
  EXPECT_NE(rc, 0) << r.output;
  EXPECT_GE(Count(r.actions, "action", "waiting_for_nodes"), 1) << Dump(r.actions);
  EXPECT_NE(r.output.find("waiting for nodes: 1 of at least 2 nodes joined round 0"), std::string::npos) << r.output;
}

TEST_F(MultiNodeTest, AnUnreachableEtcdIsAClearErrorNamingTheEndpoint) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
  const std::string cmd = std::string(LIFELINE_AGENT_BIN) + " run --nnodes 2 --nproc-per-node 1 --rdzv-endpoint " +
                          endpoint + " --rdzv-id nothing -- /bin/true";
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = WaitFor(Spawn(cmd, Out("unreachable", 0)), 60);
  NodeRun run;
  Read("unreachable", 0, &run);
  EXPECT_EQ(rc, 2) << run.output;
  EXPECT_NE(run.output.find(endpoint), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("unreachable"), std::string::npos) << run.output;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

// Issue 35, item 3: a node whose rank dies at every launch is excluded after its second failure
// (exclude_after 2), and the spare waiting beside the job (--standby) takes its place in the
// third round; the job ends as a clean run of 4 ranks does, the bad node's agent and the spare's
// leave with status 0, and every agent's log says who was excluded, why, and what the restarts cost.
TEST_F(MultiNodeTest, ANodeFailingEveryRoundIsExcludedAfterTwoAndASpareTakesItsPlace) {
  const std::string steps = "--steps 1500 --ckpt-every 50 --compute-ms 2";
  const auto single = SingleNodeFinals(steps);
  const std::string flags = "--max-restarts 4";
  const std::string run_dir = dir_ + "/bad.run.0";
  const pid_t good = Spawn(AgentCommand("bad", 0, "bad", flags + " --node-rank 0 --node-name good-a --run-dir " + run_dir, steps),
                           Out("bad", 0));
  const pid_t bad = Spawn(AgentCommand("bad", 1, "bad", flags + " --node-rank 1 --node-name bad-b",
                                       steps + " --fault crash@2:30 --fault-every-launch"),
                          Out("bad", 1));
  const pid_t spare = Spawn(AgentCommand("bad", 2, "bad", flags + " --standby --node-name spare-c", steps), Out("bad", 2));
  // While the third round runs, the good node's control socket says who was excluded and why,
  // and takes the operator's readmit.
  nlohmann::json status, readmitted;
  const auto ask = [&](const std::string& request) {
    std::string out;
    if (FILE* p = popen((std::string(LIFELINE_AGENT_BIN) + " ctl " + run_dir + "/control.sock " + request + " 2>/dev/null").c_str(), "r")) {
      char buf[4096];
      while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
      pclose(p);
    }
    return nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  };
  for (int status_code = 0; waitpid(good, &status_code, WNOHANG) == 0;) {
    const nlohmann::json s = ask("status");
    if (s.is_object() && s.contains("excluded") && !s["excluded"].empty()) {
      status = s;
      readmitted = ask("readmit bad-b");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(status.is_object()) << "the good node never said a node was excluded";
  EXPECT_EQ(status["excluded"][0]["node"], "bad-b") << status.dump();
  EXPECT_EQ(status["excluded"][0]["failures"], 2) << status.dump();
  EXPECT_NE(status["excluded"][0]["last_cause"].get<std::string>().find("dead"), std::string::npos) << status.dump();
  EXPECT_EQ(status["round"], 2) << status.dump();
  EXPECT_EQ(readmitted.value("ok", false), true) << readmitted.dump();
  std::vector<NodeRun> runs(3);
  const pid_t pids[] = {good, bad, spare};
  for (int n = 0; n < 3; ++n) {
    runs[n].exit_code = WaitFor(pids[n], 180);
    Read("bad", n, &runs[n]);
  }
  for (int n = 0; n < 3; ++n) ASSERT_EQ(runs[n].exit_code, 0) << "node " << n << "\n" << runs[n].output;
  // The job's final state: ranks 0-1 on the good node, 2-3 on the spare in the last round.
  std::map<int, std::string> finals = runs[0].finals;
  finals.insert(runs[2].finals.begin(), runs[2].finals.end());
  EXPECT_EQ(finals, single);
  std::vector<nlohmann::json> rounds;
  for (const auto& a : runs[0].actions)
    if (a.value("action", "") == "rendezvous") rounds.push_back(a);
  ASSERT_EQ(rounds.size(), 3u) << Dump(runs[0].actions);
  EXPECT_TRUE(rounds[1]["excluded"].empty()) << "one failure is not enough: " << rounds[1].dump();
  ASSERT_EQ(rounds[2]["excluded"].size(), 1u) << rounds[2].dump();
  EXPECT_EQ(rounds[2]["excluded"][0]["node"], "bad-b") << rounds[2].dump();
  EXPECT_EQ(rounds[2]["excluded"][0]["failures"], 2) << rounds[2].dump();
  EXPECT_EQ(rounds[2]["excluded"][0]["kept"], false) << rounds[2].dump();
  EXPECT_EQ(Count(runs[0].actions, "action", "node_excluded"), 1) << Dump(runs[0].actions);
  EXPECT_EQ(Count(runs[0].actions, "action", "node_readmitted"), 1) << Dump(runs[0].actions);
  // Both restarts were caused by bad-b's rank 2, and cost something the log accounts for.
  int restarts = 0, costs = 0;
  for (const auto& a : runs[0].actions) {
    if (a.value("action", "") == "time_lost") {
      ++costs;
      EXPECT_GT(a["seconds"].get<double>(), 0) << a.dump();
      for (const char* phase : {"detection", "stop", "backoff", "relaunch", "load", "redo"})
        EXPECT_GE(a[std::string(phase) + "_seconds"].get<double>(), 0) << a.dump();
    }
  }
  for (const auto& log : {runs[0].actions, runs[1].actions})
    for (const auto& a : log)
      if (a.value("action", "") == "restart") {
        ++restarts;
        EXPECT_EQ(a["node"], "bad-b") << a.dump();
      }
  EXPECT_EQ(restarts, 2) << Dump(runs[0].actions) << Dump(runs[1].actions);
  EXPECT_EQ(costs, 2) << Dump(runs[0].actions);
  // The bad node was told, waited as a spare, and left when the job finished without it.
  EXPECT_NE(runs[1].output.find("is excluded from round 2 as bad"), std::string::npos) << runs[1].output;
  EXPECT_EQ(Count(runs[1].actions, "action", "finished_without_this_node"), 1) << Dump(runs[1].actions);
  // The finished line carries the job's time account.
  for (const auto& a : runs[0].actions)
    if (a.value("action", "") == "finished") {
      const double ettr = a["time"]["ettr"].get<double>();
      EXPECT_GT(ettr, 0) << a.dump();
      EXPECT_LT(ettr, 1) << a.dump();
    }
  EXPECT_TRUE(JobKeys("bad").empty());
}

// Issue 35, item 3: the failures are kept per node with the job; an operator's readmit makes the
// earlier ones not count.
TEST_F(MultiNodeTest, AnOperatorReadmitsAnExcludedNode) {
  RendezvousConfig rc;
  rc.endpoint = etcd_.endpoint();
  rc.job = "readmit";
  rc.host = "127.0.0.1";
  rc.node_name = "judge";
  Result<std::unique_ptr<Rendezvous>> r = Rendezvous::Connect(rc);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Rendezvous& z = **r;
  ASSERT_TRUE(z.RecordNodeFailure(0, "flaky", "dead (ranks 2)").ok());
  ASSERT_TRUE(z.RecordNodeFailure(0, "flaky", "dead (ranks 2)").ok());  // the same round again: once
  ASSERT_TRUE(z.BadNodes().ok());
  EXPECT_TRUE(z.BadNodes()->empty()) << "one round's failure";
  ASSERT_TRUE(z.RecordNodeFailure(1, "flaky", "hang (ranks 3)").ok());
  ASSERT_TRUE(z.RecordNodeFailure(1, "steady", "dead (ranks 0)").ok());
  Result<std::vector<ExcludedNode>> bad = z.BadNodes();
  ASSERT_TRUE(bad.ok());
  ASSERT_EQ(bad->size(), 1u);
  EXPECT_EQ((*bad)[0].name, "flaky");
  EXPECT_EQ((*bad)[0].failures, 2u);
  EXPECT_EQ((*bad)[0].last_cause, "hang (ranks 3)");
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the readmit comes after the failures
  ASSERT_TRUE(z.Readmit("flaky").ok());
  EXPECT_TRUE(z.BadNodes()->empty());
  EXPECT_FALSE(z.Readmit("a/b").ok());
  z.Leave(/*finished=*/false);
  EXPECT_TRUE(JobKeys("readmit").empty());
}

}  // namespace multinode_drill_test
}  // namespace lifeline::agent
