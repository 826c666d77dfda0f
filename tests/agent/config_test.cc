// The agent's YAML configuration: every group is read, absent keys keep their values, and every
// mistake (typo, wrong type, negative count, unknown action, bad syntax) is reported with the file,
// the line and the key instead of being silently ignored. Then the range checks.
#include "agent/config.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace lifeline::agent {
namespace config_test {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lifeline-agentcfg-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `text` to agent.yaml in the test's directory and returns its path.
  std::string Write(const std::string& text) {
    const std::string path = dir_ + "/agent.yaml";
    std::ofstream(path) << text;
    return path;
  }

  // Loads `text` into a default config; returns the status.
  Status Load(const std::string& text, AgentConfig* config) { return LoadAgentConfig(Write(text), config); }

  std::string dir_;
};

// A config that passes validation, to be broken one field at a time.
AgentConfig ValidConfig() {
  AgentConfig c;
  c.command = {"python", "train.py"};
  return c;
}

TEST(ActionNameTest, NamesEveryAction) {
  EXPECT_STREQ(ActionName(Action::kLog), "log");
  EXPECT_STREQ(ActionName(Action::kDump), "dump");
  EXPECT_STREQ(ActionName(Action::kRestart), "restart");
  EXPECT_STREQ(ActionName(Action::kRollback), "rollback");
}

TEST_F(ConfigTest, NonFiniteSpikeAndSdcRollBackByDefaultAndRollbackIsForThemOnly) {
  AgentConfig c;
  EXPECT_EQ(c.policy.at("non_finite"), Action::kRollback);
  EXPECT_EQ(c.policy.at("spike"), Action::kRollback);
  EXPECT_EQ(c.policy.at("sdc_suspect"), Action::kRollback);
  EXPECT_EQ(c.rollback.sdc_per_node, 2u);
  EXPECT_EQ(c.policy.at("disagreement"), Action::kLog);
  EXPECT_EQ(c.rollback.skip_data, RollbackConfig::SkipData::kOnRepeat);
  ASSERT_TRUE(Load("rollback:\n  max_per_checkpoint: 3\n  skip_data: true\npolicy:\n  spike: log\n", &c).ok());
  EXPECT_EQ(c.rollback.max_per_checkpoint, 3u);
  EXPECT_EQ(c.rollback.skip_data, RollbackConfig::SkipData::kAlways);
  EXPECT_EQ(c.policy.at("spike"), Action::kLog);
  ASSERT_TRUE(Load("rollback: {skip_data: never, sdc_per_node: 0}\npolicy: {sdc_suspect: log}\n", &c).ok());
  EXPECT_EQ(c.rollback.skip_data, RollbackConfig::SkipData::kNever);
  EXPECT_EQ(c.rollback.sdc_per_node, 0u);
  EXPECT_EQ(c.policy.at("sdc_suspect"), Action::kLog);

  Status s = Load("policy:\n  hang: rollback\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("agent.yaml:2: policy.hang: rollback is for non_finite, spike and sdc_suspect only"), std::string::npos)
      << s.message();
  s = Load("rollback:\n  skip_data: sometimes\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rollback.skip_data: expected never, on_repeat or always"), std::string::npos) << s.message();

  AgentConfig v = ValidConfig();
  v.rollback.max_per_checkpoint = 0;
  EXPECT_NE(ValidateAgentConfig(v).message().find("rollback.max_per_checkpoint"), std::string::npos);
  v = ValidConfig();
  v.policy["dead"] = Action::kRollback;
  EXPECT_NE(ValidateAgentConfig(v).message().find("policy.dead: rollback is for non_finite, spike and sdc_suspect only"),
            std::string::npos);
}

TEST_F(ConfigTest, FullFileSetsEveryGroup) {
  AgentConfig c;
  const Status s = Load(R"(# a complete agent.yaml
nproc: 8
command: [python, train.py, --epochs, 3]
metrics_addr: 127.0.0.1:9400
events_log: /var/log/lifeline/events.jsonl
run_dir: /run/lifeline
job_id: llama-7b
master_addr: 10.0.0.1
master_port: 29600
ring_events: 131072
poll_interval_seconds: 0.05
dump_events: 500
hang:
  floor_seconds: 120
  cap_seconds: 3600
  multiplier: 8
  window: 32
straggler:
  window: 40
  min_lateness_seconds: 0.02
  mad_threshold: 4.5
  min_fraction: 0.8
  cooldown_seconds: 90
slow_collective:
  baseline_window: 100
  recent_window: 20
  factor: 3
  min_excess_seconds: 0.01
  cooldown_seconds: 120
checkpoint:
  lag_factor: 1.5
  lag_count: 4
  cooldown_seconds: 600
restart:
  max_restarts: 5
  grace_seconds: 30
  backoff_initial_seconds: 2
  backoff_multiplier: 3
  backoff_max_seconds: 120
  prestart: false
  prestart_after_seconds: 30
rendezvous:
  endpoint: etcd-0:2379
  id: llama-7b
  min_nodes: 2
  max_nodes: 4
  host: 10.0.0.7
  lease_seconds: 15
  last_call_seconds: 5
  join_timeout_seconds: 600
  failure_grace_seconds: 2.5
replication:
  enabled: false
  bandwidth_mb_per_second: 250
  keep_last: 3
  memory_budget_mb: 4096
  group_size: 3
policy:
  straggler: dump
  hang: log
  checkpoint: restart
)", &c);
  ASSERT_TRUE(s.ok()) << s.ToString();

  EXPECT_EQ(c.nproc, 8u);
  EXPECT_EQ(c.command, (std::vector<std::string>{"python", "train.py", "--epochs", "3"}));
  EXPECT_EQ(c.metrics_addr, "127.0.0.1:9400");
  EXPECT_EQ(c.events_log, "/var/log/lifeline/events.jsonl");
  EXPECT_EQ(c.run_dir, "/run/lifeline");
  EXPECT_EQ(c.job_id, "llama-7b");
  EXPECT_EQ(c.master_addr, "10.0.0.1");
  EXPECT_EQ(c.master_port, 29600u);
  EXPECT_EQ(c.ring_events, 131072u);
  EXPECT_DOUBLE_EQ(c.poll_interval_seconds, 0.05);
  EXPECT_EQ(c.dump_events, 500u);

  EXPECT_DOUBLE_EQ(c.hang.floor_seconds, 120);
  EXPECT_DOUBLE_EQ(c.hang.cap_seconds, 3600);
  EXPECT_DOUBLE_EQ(c.hang.multiplier, 8);
  EXPECT_EQ(c.hang.window, 32u);

  EXPECT_EQ(c.straggler.window, 40u);
  EXPECT_DOUBLE_EQ(c.straggler.min_lateness_seconds, 0.02);
  EXPECT_DOUBLE_EQ(c.straggler.mad_threshold, 4.5);
  EXPECT_DOUBLE_EQ(c.straggler.min_fraction, 0.8);
  EXPECT_DOUBLE_EQ(c.straggler.cooldown_seconds, 90);

  EXPECT_EQ(c.slow_collective.baseline_window, 100u);
  EXPECT_EQ(c.slow_collective.recent_window, 20u);
  EXPECT_DOUBLE_EQ(c.slow_collective.factor, 3);
  EXPECT_DOUBLE_EQ(c.slow_collective.min_excess_seconds, 0.01);
  EXPECT_DOUBLE_EQ(c.slow_collective.cooldown_seconds, 120);

  EXPECT_DOUBLE_EQ(c.checkpoint.lag_factor, 1.5);
  EXPECT_EQ(c.checkpoint.lag_count, 4u);
  EXPECT_DOUBLE_EQ(c.checkpoint.cooldown_seconds, 600);

  EXPECT_EQ(c.restart.max_restarts, 5u);
  EXPECT_DOUBLE_EQ(c.restart.grace_seconds, 30);
  EXPECT_DOUBLE_EQ(c.restart.backoff_initial_seconds, 2);
  EXPECT_DOUBLE_EQ(c.restart.backoff_multiplier, 3);
  EXPECT_DOUBLE_EQ(c.restart.backoff_max_seconds, 120);
  EXPECT_FALSE(c.restart.prestart);
  EXPECT_DOUBLE_EQ(c.restart.prestart_after_seconds, 30);

  EXPECT_EQ(c.rendezvous.endpoint, "etcd-0:2379");
  EXPECT_EQ(c.rendezvous.id, "llama-7b");
  EXPECT_EQ(c.rendezvous.min_nodes, 2u);
  EXPECT_EQ(c.rendezvous.max_nodes, 4u);
  EXPECT_EQ(c.rendezvous.host, "10.0.0.7");
  EXPECT_DOUBLE_EQ(c.rendezvous.lease_seconds, 15);
  EXPECT_DOUBLE_EQ(c.rendezvous.last_call_seconds, 5);
  EXPECT_DOUBLE_EQ(c.rendezvous.join_timeout_seconds, 600);
  EXPECT_DOUBLE_EQ(c.rendezvous.failure_grace_seconds, 2.5);

  EXPECT_FALSE(c.replication.enabled);
  EXPECT_DOUBLE_EQ(c.replication.bandwidth_mb_per_second, 250);
  EXPECT_EQ(c.replication.keep_last, 3u);
  EXPECT_DOUBLE_EQ(c.replication.memory_budget_mb, 4096);
  EXPECT_EQ(c.replication.group_size, 3u);

  EXPECT_EQ(c.policy.at("straggler"), Action::kDump);
  EXPECT_EQ(c.policy.at("hang"), Action::kLog);
  EXPECT_EQ(c.policy.at("checkpoint"), Action::kRestart);
  // Kinds the file does not mention keep their defaults.
  EXPECT_EQ(c.policy.at("dead"), Action::kRestart);
  EXPECT_EQ(c.policy.at("slow_collective"), Action::kLog);

  EXPECT_TRUE(ValidateAgentConfig(c).ok()) << ValidateAgentConfig(c).ToString();
}

TEST_F(ConfigTest, PartialFileKeepsEverythingElse) {
  AgentConfig c;
  c.command = {"from", "the", "command", "line"};
  c.nproc = 4;  // as if set before the file was read
  ASSERT_TRUE(Load("hang:\n  floor_seconds: 30\nrestart:\n  max_restarts: 0\n", &c).ok());

  EXPECT_DOUBLE_EQ(c.hang.floor_seconds, 30);
  EXPECT_EQ(c.restart.max_restarts, 0u);

  const AgentConfig defaults;
  EXPECT_EQ(c.nproc, 4u);
  EXPECT_EQ(c.command, (std::vector<std::string>{"from", "the", "command", "line"}));
  EXPECT_DOUBLE_EQ(c.hang.cap_seconds, defaults.hang.cap_seconds);
  EXPECT_DOUBLE_EQ(c.hang.multiplier, defaults.hang.multiplier);
  EXPECT_EQ(c.hang.window, defaults.hang.window);
  EXPECT_DOUBLE_EQ(c.restart.grace_seconds, defaults.restart.grace_seconds);
  EXPECT_EQ(c.master_addr, defaults.master_addr);
  EXPECT_EQ(c.master_port, defaults.master_port);
  EXPECT_EQ(c.straggler.window, defaults.straggler.window);
  EXPECT_EQ(c.policy, defaults.policy);
}

// Python tracing is on unless the file (or --no-python-tracing) turns it off.
TEST_F(ConfigTest, PythonTracingKeys) {
  AgentConfig c;
  EXPECT_TRUE(c.python_tracing);
  EXPECT_EQ(c.python_step_from, "");
  ASSERT_TRUE(Load("python_tracing: false\npython_step_from: none\n", &c).ok());
  EXPECT_FALSE(c.python_tracing);
  EXPECT_EQ(c.python_step_from, "none");
  ASSERT_TRUE(Load("python_tracing: yes\n", &c).ok());
  EXPECT_TRUE(c.python_tracing);

  const Status s = Load("python_tracing: maybe\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("agent.yaml:1: python_tracing: expected true or false, got 'maybe'"), std::string::npos)
      << s.message();
  EXPECT_TRUE(c.python_tracing);  // untouched by the failed load

  AgentConfig v = ValidConfig();
  for (const char* ok : {"", "optimizer", "none"}) {
    v.python_step_from = ok;
    EXPECT_TRUE(ValidateAgentConfig(v).ok()) << ok;
  }
}

TEST_F(ConfigTest, EmptyFileChangesNothing) {
  AgentConfig c;
  c.nproc = 3;
  ASSERT_TRUE(Load("# nothing yet\n", &c).ok());
  EXPECT_EQ(c.nproc, 3u);
}

TEST_F(ConfigTest, UnknownKeyNamesFileLineAndKey) {
  AgentConfig c;
  const Status s = Load("nproc: 2\nhang:\n  floor_seconds: 10\n  flor_seconds: 20\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(dir_ + "/agent.yaml:4: hang.flor_seconds: unknown key"), std::string::npos)
      << s.message();

  const Status top = Load("nproc: 2\n\nnprocs: 4\n", &c);
  ASSERT_EQ(top.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(top.message().find("agent.yaml:3: nprocs: unknown key"), std::string::npos) << top.message();
}

TEST_F(ConfigTest, ErrorLeavesConfigUntouched) {
  AgentConfig c;
  ASSERT_FALSE(Load("nproc: 7\nbogus: 1\n", &c).ok());
  EXPECT_EQ(c.nproc, 1u);  // not half-applied
}

TEST_F(ConfigTest, WrongTypeNamesLineKeyAndValue) {
  AgentConfig c;
  Status s = Load("nproc: 2\nhang:\n  floor_seconds: abc\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("agent.yaml:3: hang.floor_seconds: expected a number, got 'abc'"), std::string::npos)
      << s.message();

  s = Load("nproc: 2.5\n", &c);
  EXPECT_NE(s.message().find("agent.yaml:1: nproc: expected a non-negative integer, got '2.5'"), std::string::npos)
      << s.message();

  s = Load("command: python train.py\n", &c);
  EXPECT_NE(s.message().find("command: expected a list of strings"), std::string::npos) << s.message();

  s = Load("hang: 5\n", &c);
  EXPECT_NE(s.message().find("hang: expected a map"), std::string::npos) << s.message();

  s = Load("master_port: 99999999999\n", &c);
  EXPECT_NE(s.message().find("master_port: '99999999999' is larger than"), std::string::npos) << s.message();

  s = Load("poll_interval_seconds: .nan\n", &c);
  EXPECT_NE(s.message().find("poll_interval_seconds: expected a number"), std::string::npos) << s.message();
}

TEST_F(ConfigTest, NegativeCountIsAnError) {
  AgentConfig c;
  const Status s = Load("restart:\n  max_restarts: -1\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("agent.yaml:2: restart.max_restarts: must not be negative"), std::string::npos)
      << s.message();
  EXPECT_EQ(c.restart.max_restarts, 3u);  // not wrapped around to 4 billion
}

TEST_F(ConfigTest, DuplicateKeyIsAnError) {
  AgentConfig c;
  const Status s = Load("nproc: 2\nnproc: 4\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("agent.yaml:2: nproc: duplicate key"), std::string::npos) << s.message();
}

TEST_F(ConfigTest, BadActionAndBadKind) {
  AgentConfig c;
  Status s = Load("policy:\n  hang: reboot\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("agent.yaml:2: policy.hang: unknown action 'reboot'"), std::string::npos)
      << s.message();
  EXPECT_EQ(c.policy.at("hang"), Action::kRestart);

  s = Load("policy:\n  deadlock: log\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("policy.deadlock: unknown anomaly kind"), std::string::npos) << s.message();
}

TEST_F(ConfigTest, SyntaxErrorNamesFileAndLine) {
  AgentConfig c;
  const Status s = Load("nproc: 2\nmaster_addr: a: b\nhang:\n  floor_seconds: 3\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(dir_ + "/agent.yaml:2: YAML syntax error"), std::string::npos) << s.message();
}

// Found by tests/fuzz/agent_config_fuzz: a stray ',' made yaml-cpp's LoadAll produce empty
// documents forever, so the agent hung, then died of bad_alloc, instead of reporting the file.
TEST_F(ConfigTest, StrayCommaIsASyntaxErrorNotAHang) {
  AgentConfig c;
  Status s = Load(",", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(dir_ + "/agent.yaml:1: YAML syntax error: unexpected ','"), std::string::npos)
      << s.message();

  s = Load("# settings\n\n,\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("agent.yaml:3: YAML syntax error"), std::string::npos) << s.message();
  EXPECT_EQ(c.nproc, 1u);
}

TEST_F(ConfigTest, SecondDocumentIsAnError) {
  AgentConfig c;
  const Status s = Load("nproc: 2\n---\nnproc: 4\n", &c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("agent.yaml:2: more than one YAML document"), std::string::npos) << s.message();
  EXPECT_EQ(c.nproc, 1u);
}

TEST_F(ConfigTest, MissingFileIsNotFound) {
  AgentConfig c;
  const std::string path = dir_ + "/no-such.yaml";
  const Status s = LoadAgentConfig(path, &c);
  EXPECT_TRUE(s.IsNotFound()) << s.ToString();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
}

TEST(ValidateTest, DefaultsWithACommandAreValid) {
  const Status s = ValidateAgentConfig(ValidConfig());
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(ValidateTest, FloorAboveCap) {
  AgentConfig c = ValidConfig();
  c.hang.floor_seconds = 100;
  c.hang.cap_seconds = 50;
  const Status s = ValidateAgentConfig(c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hang.floor_seconds"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("hang.cap_seconds"), std::string::npos) << s.message();
}

TEST(ValidateTest, NprocZeroAndTooMany) {
  AgentConfig c = ValidConfig();
  c.nproc = 0;
  Status s = ValidateAgentConfig(c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("nproc"), std::string::npos) << s.message();
  c.nproc = 1025;
  EXPECT_FALSE(ValidateAgentConfig(c).ok());
  c.nproc = 1024;
  EXPECT_TRUE(ValidateAgentConfig(c).ok());
}

TEST(ValidateTest, EmptyCommand) {
  AgentConfig c = ValidConfig();
  c.command.clear();
  const Status s = ValidateAgentConfig(c);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("command"), std::string::npos) << s.message();
}

// Each broken field is named in the message.
TEST(ValidateTest, OtherBoundsNameTheField) {
  struct Case {
    const char* field;
    void (*breakit)(AgentConfig*);
  };
  const Case cases[] = {
      {"hang.floor_seconds", [](AgentConfig* c) { c->hang.floor_seconds = 0; }},
      {"hang.multiplier", [](AgentConfig* c) { c->hang.multiplier = 0.5; }},
      {"hang.window", [](AgentConfig* c) { c->hang.window = 0; }},
      {"straggler.window", [](AgentConfig* c) { c->straggler.window = 2; }},
      {"straggler.min_fraction", [](AgentConfig* c) { c->straggler.min_fraction = 1.5; }},
      {"slow_collective.recent_window", [](AgentConfig* c) { c->slow_collective.recent_window = 0; }},
      {"checkpoint.lag_count", [](AgentConfig* c) { c->checkpoint.lag_count = 0; }},
      {"restart.grace_seconds", [](AgentConfig* c) { c->restart.grace_seconds = -1; }},
      {"restart.backoff_multiplier", [](AgentConfig* c) { c->restart.backoff_multiplier = 0.9; }},
      {"restart.prestart_after_seconds", [](AgentConfig* c) { c->restart.prestart_after_seconds = -1; }},
      {"rendezvous.lease_seconds", [](AgentConfig* c) { c->rendezvous.lease_seconds = 1; }},
      {"rendezvous.failure_grace_seconds", [](AgentConfig* c) { c->rendezvous.failure_grace_seconds = -1; }},
      {"rendezvous.failure_grace_seconds", [](AgentConfig* c) { c->rendezvous.failure_grace_seconds = 61; }},
      {"replication.keep_last", [](AgentConfig* c) { c->replication.keep_last = 0; }},
      {"replication.group_size", [](AgentConfig* c) { c->replication.group_size = 1; }},
      {"replication.group_size", [](AgentConfig* c) { c->replication.group_size = 65; }},
      {"ring_events", [](AgentConfig* c) { c->ring_events = 63; }},
      {"poll_interval_seconds", [](AgentConfig* c) { c->poll_interval_seconds = 0; }},
      {"poll_interval_seconds", [](AgentConfig* c) { c->poll_interval_seconds = 2; }},
      {"poll_interval_seconds", [](AgentConfig* c) { c->poll_interval_seconds = std::nan(""); }},
      {"metrics_addr", [](AgentConfig* c) { c->metrics_addr = "localhost"; }},
      {"metrics_addr", [](AgentConfig* c) { c->metrics_addr = "localhost:70000"; }},
      {"metrics_addr", [](AgentConfig* c) { c->metrics_addr = "localhost:http"; }},
      {"master_port", [](AgentConfig* c) { c->master_port = 65536; }},
      {"policy.hang", [](AgentConfig* c) { c->policy.erase("hang"); }},
      {"python_step_from", [](AgentConfig* c) { c->python_step_from = "epoch"; }},
  };
  for (const Case& tc : cases) {
    AgentConfig c = ValidConfig();
    tc.breakit(&c);
    const Status s = ValidateAgentConfig(c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << tc.field;
    EXPECT_NE(s.message().find(tc.field), std::string::npos) << tc.field << ": " << s.message();
  }
}

TEST(ValidateTest, AcceptsGoodMetricsAddresses) {
  for (const char* addr : {"127.0.0.1:9400", "0.0.0.0:0", "[::1]:9400", "node-3.cluster:65535"}) {
    AgentConfig c = ValidConfig();
    c.metrics_addr = addr;
    const Status s = ValidateAgentConfig(c);
    EXPECT_TRUE(s.ok()) << addr << ": " << s.ToString();
  }
}

}  // namespace config_test
}  // namespace lifeline::agent
