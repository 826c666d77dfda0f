// The scheduler's environment into the agent's settings: Slurm's and torchrun's (Kubeflow's) variables.
#include "agent/scheduler_env.h"

#include <map>
#include <string>

#include <gtest/gtest.h>

namespace lifeline::agent {
namespace scheduler_env_test {

Result<SchedulerJob> Read(const std::map<std::string, std::string>& env) {
  return ReadSchedulerEnv([&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(HostListTest, ExpandsRangesWithTheirZeroPaddingAndSeveralBrackets) {
  Result<std::vector<std::string>> hosts = ExpandHostList("node[01-03,10],gpu-a,rack[1-2]-n[7-8]");
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  EXPECT_EQ(*hosts, (std::vector<std::string>{"node01", "node02", "node03", "node10", "gpu-a", "rack1-n7", "rack1-n8",
                                              "rack2-n7", "rack2-n8"}));
  EXPECT_EQ(*ExpandHostList("solo"), std::vector<std::string>{"solo"});
}

TEST(HostListTest, MalformedListsAreClearErrorsNamingTheText) {
  for (const char* bad : {"node[1-3", "node1-3]", "node[3-1]", "node[a-b]", "node[0-999999]"}) {
    Result<std::vector<std::string>> hosts = ExpandHostList(bad);
    ASSERT_FALSE(hosts.ok()) << bad;
    EXPECT_NE(hosts.status().ToString().find(bad), std::string::npos) << hosts.status().ToString();
  }
}

TEST(SchedulerEnvTest, SlurmStepOfTwoNodesGivesTheNodeCountRankNameAndARendezvousIdPerRequeue) {
  Result<SchedulerJob> job = Read({{"SLURM_JOB_ID", "4242"},
                                   {"SLURM_NNODES", "2"},
                                   {"SLURM_STEP_ID", "0"},
                                   {"SLURM_STEP_NUM_NODES", "2"},
                                   {"SLURM_STEP_NUM_TASKS", "2"},
                                   {"SLURM_NODEID", "1"},
                                   {"SLURMD_NODENAME", "gpu07"},
                                   {"SLURM_JOB_NODELIST", "gpu[06-07]"},
                                   {"SLURM_RESTART_COUNT", "2"}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  AgentConfig config;
  config.rendezvous.endpoint = "etcd:2379";  // from the command line in real use
  ApplySchedulerJob(*job, &config);
  EXPECT_EQ(config.rendezvous.min_nodes, 2u);
  EXPECT_EQ(config.rendezvous.max_nodes, 2u);
  EXPECT_EQ(config.rendezvous.node_rank, 1);
  EXPECT_EQ(config.rendezvous.node_name, "gpu07");
  EXPECT_EQ(config.rendezvous.id, "slurm-4242-2");  // a requeued job meets afresh
  EXPECT_EQ(config.job_id, "slurm-4242");
  EXPECT_EQ(job->hosts, (std::vector<std::string>{"gpu06", "gpu07"}));
  EXPECT_EQ(job->requeues, 2u);
  EXPECT_EQ(job->schedulers, std::vector<std::string>{"slurm"});
}

TEST(SchedulerEnvTest, SlurmMisuseIsRefusedWithWhatToDo) {
  // Two agents per node would each launch the node's ranks.
  Result<SchedulerJob> two_per_node = Read({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_STEP_ID", "0"},
                                            {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NUM_TASKS", "4"}});
  ASSERT_FALSE(two_per_node.ok());
  EXPECT_NE(two_per_node.status().ToString().find("--ntasks-per-node=1"), std::string::npos);
  // The batch script of a two-node job runs on the first node only.
  Result<SchedulerJob> outside_srun = Read({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "2"}});
  ASSERT_FALSE(outside_srun.ok());
  EXPECT_NE(outside_srun.status().ToString().find("srun"), std::string::npos);
  // A one-node job may run the agent in the batch script itself.
  EXPECT_TRUE(Read({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "1"}}).ok());
  Result<SchedulerJob> bad = Read({{"SLURM_JOB_ID", "1"}, {"SLURM_NNODES", "two"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("SLURM_NNODES=two"), std::string::npos);
}

TEST(SchedulerEnvTest, KubeflowElasticVariablesFormTheJob) {
  Result<SchedulerJob> job = Read({{"PET_NNODES", "2:4"},
                                   {"PET_NPROC_PER_NODE", "8"},
                                   {"PET_RDZV_BACKEND", "etcd-v2"},
                                   {"PET_RDZV_ENDPOINT", "etcd-client:2379"},
                                   {"PET_RDZV_ID", "llama-70b"},
                                   {"PET_MAX_RESTARTS", "5"}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  AgentConfig config;
  ApplySchedulerJob(*job, &config);
  EXPECT_EQ(config.nproc, 8u);
  EXPECT_EQ(config.rendezvous.min_nodes, 2u);
  EXPECT_EQ(config.rendezvous.max_nodes, 4u);
  EXPECT_EQ(config.rendezvous.node_rank, -1);  // elastic: in the order the nodes join
  EXPECT_EQ(config.rendezvous.endpoint, "etcd-client:2379");
  EXPECT_EQ(config.rendezvous.id, "llama-70b");
  EXPECT_EQ(config.restart.max_restarts, 5u);
  EXPECT_EQ(job->schedulers, std::vector<std::string>{"torchrun"});
}

TEST(SchedulerEnvTest, TorchrunsRendezvousTimeoutsMapOntoTheRounds) {
  Result<SchedulerJob> job = Read({{"PET_RDZV_CONF", "join_timeout=1200,last_call_timeout=60,read_timeout=5"}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  AgentConfig config;
  ApplySchedulerJob(*job, &config);
  EXPECT_EQ(config.rendezvous.join_timeout_seconds, 1200);
  EXPECT_EQ(config.rendezvous.last_call_seconds, 60);
  Result<SchedulerJob> bad = Read({{"PET_RDZV_CONF", "join_timeout=soon"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("join_timeout"), std::string::npos);
}

TEST(SchedulerEnvTest, AStaticPyTorchJobGivesTheNodeRankAndMaster) {
  Result<SchedulerJob> job = Read({{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "2"},
                                   {"PET_MASTER_ADDR", "job-master-0"}, {"PET_MASTER_PORT", "23456"}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  AgentConfig config;
  ApplySchedulerJob(*job, &config);
  EXPECT_EQ(config.rendezvous.node_rank, 1);
  EXPECT_EQ(config.master_addr, "job-master-0");
  EXPECT_EQ(config.master_port, 23456u);
}

TEST(SchedulerEnvTest, ABackendOtherThanEtcdIsAClearError) {
  Result<SchedulerJob> job = Read({{"PET_RDZV_BACKEND", "c10d"}, {"PET_RDZV_ENDPOINT", "master:29400"}});
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().ToString().find("PET_RDZV_BACKEND=c10d"), std::string::npos);
  EXPECT_NE(job.status().ToString().find("etcd"), std::string::npos);
  EXPECT_FALSE(Read({{"PET_NNODES", "3:1"}}).ok());
  EXPECT_FALSE(Read({{"PET_NPROC_PER_NODE", "0"}}).ok());
}

TEST(SchedulerEnvTest, TorchrunVariablesWinOverSlurmsForTheirSetting) {
  Result<SchedulerJob> job = Read({{"SLURM_JOB_ID", "7"}, {"SLURM_NNODES", "1"}, {"SLURM_NODEID", "0"},
                                   {"PET_RDZV_ID", "mine"}, {"PET_NPROC_PER_NODE", "4"}});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  AgentConfig config;
  ApplySchedulerJob(*job, &config);
  EXPECT_EQ(config.rendezvous.id, "mine");
  EXPECT_EQ(config.nproc, 4u);
  EXPECT_EQ(job->schedulers, (std::vector<std::string>{"slurm", "torchrun"}));
}

TEST(SchedulerEnvTest, StandaloneMeansOneNodeWhateverElseWasSaid) {
  Result<SchedulerJob> job = Read({{"PET_STANDALONE", "1"}, {"PET_NNODES", "2"}, {"PET_RDZV_ENDPOINT", "e:1"}});
  ASSERT_TRUE(job.ok());
  AgentConfig config;
  ApplySchedulerJob(*job, &config);
  EXPECT_TRUE(config.rendezvous.endpoint.empty());
  EXPECT_EQ(config.rendezvous.max_nodes, 1u);
}

TEST(SchedulerEnvTest, NoSchedulerChangesNothing) {
  Result<SchedulerJob> job = Read({});
  ASSERT_TRUE(job.ok());
  EXPECT_TRUE(job->schedulers.empty());
  AgentConfig config, untouched;
  ApplySchedulerJob(*job, &config);
  EXPECT_EQ(config.nproc, untouched.nproc);
  EXPECT_EQ(config.rendezvous.id, untouched.rendezvous.id);
  EXPECT_EQ(config.job_id, untouched.job_id);
}

TEST(NprocPerNodeTest, NumbersAndTorchrunsWords) {
  EXPECT_EQ(*ParseNprocPerNode("8", "x"), 8u);
  EXPECT_GE(*ParseNprocPerNode("cpu", "x"), 1u);
  EXPECT_GE(*ParseNprocPerNode("auto", "x"), 1u);
  EXPECT_FALSE(ParseNprocPerNode("1025", "x").ok());
  EXPECT_FALSE(ParseNprocPerNode("many", "x").ok());
}

}  // namespace scheduler_env_test
}  // namespace lifeline::agent
