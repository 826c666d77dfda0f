#include "agent/scheduler_env.h"

#include <dirent.h>
#include <sched.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "agent/rendezvous.h"

namespace lifeline::agent {
namespace {

constexpr size_t kMaxHosts = 100000;

std::optional<uint64_t> Decimal(const std::string& v, uint64_t max) {
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  const uint64_t n = std::stoull(v);
  if (n > max) return std::nullopt;
  return n;
}

class Reader {
 public:
  Reader(const EnvLookup& lookup, SchedulerJob* job) : lookup_(lookup), job_(job) {}

  // The variable's value when set and not empty.
  std::optional<std::string> Get(const char* name) {
    const char* v = lookup_(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    job_->read.emplace_back(name, v);
    return std::string(v);
  }
  Status Number(const char* name, uint64_t max, std::optional<uint64_t>* out) {
    const std::optional<std::string> v = Get(name);
    if (!v) return Status::OK();
    *out = Decimal(*v, max);
    if (!*out)
      return Status::InvalidArgument(std::string(name) + "=" + *v, "expected a whole number up to " + std::to_string(max));
    return Status::OK();
  }

 private:
  const EnvLookup& lookup_;
  SchedulerJob* job_;
};

uint32_t CountGpus() {
  uint32_t n = 0;
  if (DIR* d = opendir("/dev")) {
    while (dirent* e = readdir(d)) {
      const char* name = e->d_name;
      if (std::strncmp(name, "nvidia", 6) == 0 && name[6] != '\0' &&
          std::strspn(name + 6, "0123456789") == std::strlen(name + 6))
        ++n;
    }
    closedir(d);
  }
  return n;
}

Status ReadSlurm(Reader& env, SchedulerJob* job) {
  const std::optional<std::string> id = env.Get("SLURM_JOB_ID");
  if (!id) return Status::OK();
  job->schedulers.push_back("slurm");
  job->job_id = "slurm-" + *id;
  std::optional<uint64_t> nodes, step_nodes, node_id, requeues, step_tasks;
  LL_RETURN_IF_ERROR(env.Number("SLURM_NNODES", 100000, &nodes));
  LL_RETURN_IF_ERROR(env.Number("SLURM_STEP_NUM_NODES", 100000, &step_nodes));
  LL_RETURN_IF_ERROR(env.Number("SLURM_STEP_NUM_TASKS", 10000000, &step_tasks));
  LL_RETURN_IF_ERROR(env.Number("SLURM_NODEID", 100000, &node_id));
  LL_RETURN_IF_ERROR(env.Number("SLURM_RESTART_COUNT", 1000000, &requeues));
  const std::optional<std::string> step = env.Get("SLURM_STEP_ID");
  if (step_nodes) nodes = step_nodes;  // srun on part of the allocation: the step's nodes
  if (step_nodes && step_tasks && *step_tasks != *step_nodes)
    return Status::InvalidArgument(
        "SLURM_STEP_NUM_TASKS=" + std::to_string(*step_tasks),
        "lifeline-agent runs once per node (" + std::to_string(*step_nodes) +
            " nodes in this step): start it with srun --ntasks-per-node=1 and give it the ranks with --nproc-per-node");
  if (nodes && *nodes > 1 && !step)
    return Status::InvalidArgument(
        "SLURM_NNODES=" + std::to_string(*nodes),
        "a job of several nodes needs one lifeline-agent on each: run it under srun --ntasks-per-node=1 "
        "(not in the batch script itself, which runs on the first node only)");
  if (nodes) job->min_nodes = job->max_nodes = static_cast<uint32_t>(*nodes);
  if (node_id) job->node_rank = static_cast<int>(*node_id);
  if (requeues) job->requeues = static_cast<uint32_t>(*requeues);
  job->rdzv_id = "slurm-" + *id + "-" + std::to_string(requeues.value_or(0));
  if (const std::optional<std::string> name = env.Get("SLURMD_NODENAME")) job->node_name = *name;
  std::optional<std::string> list = env.Get("SLURM_JOB_NODELIST");
  if (!list) list = env.Get("SLURM_NODELIST");
  if (list) {
    Result<std::vector<std::string>> hosts = ExpandHostList(*list);
    if (!hosts.ok()) return hosts.status().Annotate("SLURM_JOB_NODELIST");
    job->hosts = std::move(*hosts);
  }
  return Status::OK();
}

Status ReadTorchrun(Reader& env, SchedulerJob* job) {
  bool any = false;
  if (const std::optional<std::string> n = env.Get("PET_NNODES")) {
    uint32_t lo = 0, hi = 0;
    if (Status s = ParseNodeRange(*n, &lo, &hi); !s.ok())
      return Status::InvalidArgument("PET_NNODES=" + *n, "expected MIN or MIN:MAX, whole numbers from 1");
    job->min_nodes = lo;
    job->max_nodes = hi;
    any = true;
  }
  if (const std::optional<std::string> n = env.Get("PET_NPROC_PER_NODE")) {
    LL_ASSIGN_OR_RETURN(uint32_t nproc, ParseNprocPerNode(*n, "PET_NPROC_PER_NODE=" + *n));
    job->nproc = nproc;
    any = true;
  }
  std::optional<uint64_t> rank, port, restarts;
  LL_RETURN_IF_ERROR(env.Number("PET_NODE_RANK", 100000, &rank));
  LL_RETURN_IF_ERROR(env.Number("PET_MASTER_PORT", 65535, &port));
  LL_RETURN_IF_ERROR(env.Number("PET_MAX_RESTARTS", 1000000, &restarts));
  if (rank) job->node_rank = static_cast<int>(*rank);
  if (port) job->master_port = static_cast<uint32_t>(*port);
  if (restarts) job->max_restarts = static_cast<uint32_t>(*restarts);
  any = any || rank || port || restarts;
  if (const std::optional<std::string> backend = env.Get("PET_RDZV_BACKEND")) {
    any = true;
    if (*backend != "etcd" && *backend != "etcd-v2")
      return Status::InvalidArgument(
          "PET_RDZV_BACKEND=" + *backend,
          "lifeline-agent's nodes meet in etcd (its v3 API): use rdzvBackend etcd or etcd-v2 and an etcd endpoint");
  }
  if (const std::optional<std::string> v = env.Get("PET_RDZV_ENDPOINT")) job->rdzv_endpoint = *v, any = true;
  if (const std::optional<std::string> v = env.Get("PET_RDZV_ID")) job->rdzv_id = *v, any = true;
  if (const std::optional<std::string> v = env.Get("PET_MASTER_ADDR")) job->master_addr = *v, any = true;
  if (const std::optional<std::string> conf = env.Get("PET_RDZV_CONF")) {
    // torchrun's rendezvous options, KEY=VALUE,...: the timeouts map onto the agent's rounds.
    any = true;
    size_t start = 0;
    const std::string text = *conf + ",";
    for (size_t comma = text.find(','); comma != std::string::npos; start = comma + 1, comma = text.find(',', start)) {
      const std::string item = text.substr(start, comma - start);
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      const std::string key = item.substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
      if (key != "join_timeout" && key != "last_call_timeout") continue;  // torchrun's others mean nothing here
      const std::optional<uint64_t> seconds = Decimal(value, 10'000'000);
      if (!seconds)
        return Status::InvalidArgument("PET_RDZV_CONF=" + *conf, key + ": expected whole seconds, got '" + value + "'");
      (key == "join_timeout" ? job->join_timeout_seconds : job->last_call_seconds) = static_cast<double>(*seconds);
    }
  }
  if (const std::optional<std::string> v = env.Get("PET_STANDALONE")) {
    any = true;
    job->standalone = *v != "0" && *v != "false" && *v != "False";
  }
  if (any) job->schedulers.push_back("torchrun");
  return Status::OK();
}

}  // namespace

Result<uint32_t> ParseNprocPerNode(const std::string& value, const std::string& what) {
  if (value == "auto" || value == "gpu") {
    const uint32_t gpus = CountGpus();
    if (gpus > 0) return gpus;
    if (value == "gpu") return Status::InvalidArgument(what, "no GPU on this machine (/dev/nvidia0...)");
    return 1u;
  }
  if (value == "cpu") {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    return static_cast<uint32_t>(std::max(1, n));
  }
  const std::optional<uint64_t> n = Decimal(value, 1024);
  if (!n || *n == 0) return Status::InvalidArgument(what, "expected 1..1024 ranks, auto, gpu or cpu");
  return static_cast<uint32_t>(*n);
}

Result<std::vector<std::string>> ExpandHostList(const std::string& text) {
  const auto bad = [&](const std::string& why) { return Status::InvalidArgument("host list '" + text + "'", why); };
  // Split at the commas outside brackets.
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) return bad("a ']' without its '['");
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
      continue;
    }
    cur += c;
  }
  if (depth != 0) return bad("a '[' without its ']'");
  items.push_back(cur);
  std::vector<std::string> out;
  for (const std::string& item : items) {
    if (item.empty()) continue;
    // Expand the first bracket, then the rest of the name recursively (rack[1-2]-n[1-2]).
    std::vector<std::string> names = {""};
    size_t pos = 0;
    while (pos < item.size()) {
      const size_t open = item.find('[', pos);
      const std::string literal = item.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
      for (std::string& n : names) n += literal;
      if (open == std::string::npos) break;
      const size_t close = item.find(']', open);
      std::vector<std::string> parts;
      std::string inner = item.substr(open + 1, close - open - 1) + ",";
      std::vector<std::string> expanded;
      size_t start = 0;
      for (size_t comma = inner.find(','); comma != std::string::npos; start = comma + 1, comma = inner.find(',', start)) {
        const std::string range = inner.substr(start, comma - start);
        const size_t dash = range.find('-');
        const std::string lo_text = range.substr(0, dash);
        const std::string hi_text = dash == std::string::npos ? lo_text : range.substr(dash + 1);
        const std::optional<uint64_t> lo = Decimal(lo_text, 999999999), hi = Decimal(hi_text, 999999999);
        if (!lo || !hi || *hi < *lo) return bad("'" + range + "' is not a range of numbers");
        if (*hi - *lo >= kMaxHosts) return bad("more than " + std::to_string(kMaxHosts) + " hosts");
        for (uint64_t k = *lo; k <= *hi; ++k) {
          std::string num = std::to_string(k);
          if (num.size() < lo_text.size()) num.insert(0, lo_text.size() - num.size(), '0');  // node[01-10]
          expanded.push_back(num);
        }
      }
      std::vector<std::string> next;
      for (const std::string& n : names)
        for (const std::string& e : expanded) next.push_back(n + e);
      if (next.size() > kMaxHosts) return bad("more than " + std::to_string(kMaxHosts) + " hosts");
      names = std::move(next);
      pos = close + 1;
    }
    out.insert(out.end(), names.begin(), names.end());
    if (out.size() > kMaxHosts) return bad("more than " + std::to_string(kMaxHosts) + " hosts");
  }
  return out;
}

Result<SchedulerJob> ReadSchedulerEnv(const EnvLookup& lookup) {
  SchedulerJob job;
  Reader env(lookup, &job);
  LL_RETURN_IF_ERROR(ReadSlurm(env, &job));
  // torchrun's variables second: each one wins over Slurm's for its setting.
  SchedulerJob pet;
  Reader pet_env(lookup, &pet);
  LL_RETURN_IF_ERROR(ReadTorchrun(pet_env, &pet));
  if (pet.schedulers.empty()) return job;
  job.schedulers.push_back("torchrun");
  job.read.insert(job.read.end(), pet.read.begin(), pet.read.end());
  if (pet.min_nodes) job.min_nodes = pet.min_nodes, job.max_nodes = pet.max_nodes;
  if (pet.node_rank) job.node_rank = pet.node_rank;
  if (pet.nproc) job.nproc = pet.nproc;
  if (pet.max_restarts) job.max_restarts = pet.max_restarts;
  if (pet.master_port) job.master_port = pet.master_port;
  if (!pet.master_addr.empty()) job.master_addr = pet.master_addr;
  if (!pet.rdzv_endpoint.empty()) job.rdzv_endpoint = pet.rdzv_endpoint;
  if (!pet.rdzv_id.empty()) job.rdzv_id = pet.rdzv_id;
  job.standalone = pet.standalone;
  job.join_timeout_seconds = pet.join_timeout_seconds;
  job.last_call_seconds = pet.last_call_seconds;
  return job;
}

void ApplySchedulerJob(const SchedulerJob& job, AgentConfig* config) {
  RendezvousSettings& z = config->rendezvous;
  if (job.nproc) config->nproc = *job.nproc;
  if (job.max_restarts) config->restart.max_restarts = *job.max_restarts;
  if (job.master_port) config->master_port = *job.master_port;
  if (!job.master_addr.empty()) config->master_addr = job.master_addr;
  if (!job.job_id.empty()) config->job_id = job.job_id;
  if (!job.node_name.empty()) z.node_name = job.node_name;
  if (job.standalone) return;  // one node: no rendezvous, whatever else was said
  if (job.min_nodes) z.min_nodes = *job.min_nodes, z.max_nodes = *job.max_nodes;
  if (job.join_timeout_seconds) z.join_timeout_seconds = *job.join_timeout_seconds;
  if (job.last_call_seconds) z.last_call_seconds = *job.last_call_seconds;
  if (job.node_rank) z.node_rank = *job.node_rank;
  if (!job.rdzv_endpoint.empty()) z.endpoint = job.rdzv_endpoint;
  if (!job.rdzv_id.empty()) z.id = job.rdzv_id;
}

}  // namespace lifeline::agent
