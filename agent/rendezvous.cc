#include "agent/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>
#include <zstd.h>

#include "agent/launcher.h"
#include "agent/progress.h"
#include "agent/resume.h"

namespace lifeline::agent {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string FormatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

// A decimal number as the agents write them (rounds, times); nullopt for anything else.
std::optional<uint64_t> ParseDecimal(const std::string& v) {
  if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return static_cast<uint64_t>(std::stoull(v));
}

nlohmann::json OfferJson(const ResumeOffer& o) {
  return {{"directory", o.directory},
          {"disk_step", o.disk_step ? nlohmann::json(*o.disk_step) : nlohmann::json(nullptr)},
          {"disk_steps", o.disk_steps},
          {"memory_steps", o.memory_steps},
          {"memory_incomplete_step",
           o.memory_incomplete_step ? nlohmann::json(*o.memory_incomplete_step) : nlohmann::json(nullptr)}};
}

nlohmann::json NodeJson(const RoundNode& n) {
  nlohmann::json j = {{"id", n.id},           {"host", n.host},
                      {"nproc", n.nproc},     {"requested_rank", n.requested_rank},
                      {"master_port", n.master_port}, {"replica_port", n.replica_port}, {"joined_revision", n.joined_revision},
                      {"summary_port", n.summary_port},
                      {"resume", OfferJson(n.resume)}};
  if (!n.name.empty()) j["name"] = n.name;
  if (n.standby) j["standby"] = true;
  return j;
}

// A node entry or plan node; Corruption naming `what` when it is not one of ours.
Result<RoundNode> ParseNode(const nlohmann::json& j, const std::string& what) {
  try {
    RoundNode n;
    n.id = j.at("id").get<std::string>();
    n.host = j.at("host").get<std::string>();
    n.nproc = j.at("nproc").get<uint32_t>();
    n.requested_rank = j.value("requested_rank", -1);
    n.master_port = j.at("master_port").get<uint32_t>();
    n.replica_port = j.value("replica_port", uint32_t{0});
    n.summary_port = j.value("summary_port", uint32_t{0});
    n.joined_revision = j.value("joined_revision", int64_t{0});
    n.name = j.value("name", "");
    n.standby = j.value("standby", false);
    if (n.name.find('/') != std::string::npos) return Status::Corruption(what, "a node name with '/'");
    // A plan's nodes leave their offers out (the plan says what was chosen, and who holds it).
    if (j.contains("resume")) {
      const nlohmann::json& r = j.at("resume");
      n.resume.directory = r.value("directory", "");
      if (!r.at("disk_step").is_null()) n.resume.disk_step = r.at("disk_step").get<uint64_t>();
      if (r.contains("disk_steps")) n.resume.disk_steps = r.at("disk_steps").get<std::vector<uint64_t>>();
      n.resume.memory_steps = r.at("memory_steps").get<std::vector<uint64_t>>();
      if (r.contains("memory_incomplete_step") && !r["memory_incomplete_step"].is_null())
        n.resume.memory_incomplete_step = r["memory_incomplete_step"].get<uint64_t>();
    }
    if (n.nproc == 0 || n.nproc > 1024) return Status::Corruption(what, "a node with " + std::to_string(n.nproc) + " ranks");
    if (n.master_port == 0 || n.master_port > 65535) return Status::Corruption(what, "a node without a port");
    return n;
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(what, std::string("not a node entry of lifeline-agent: ") + e.what());
  }
}

// The step every node can resume from: the newest step on shared storage as every node that knows
// the checkpoint directory sees it (a node that does not know it yet, such as a replacement, has
// no say), or a newer one that is in every node's memory tier, or in some node's. *note says why
// a newer step some node holds only in part in memory (its own ranks, without a lost node's
// replicas) is passed over; empty otherwise.
// A rollback's round (`before`) looks only at steps below it: each node's newest step on disk below
// it, and its memory steps below it.
void ChooseResume(const std::vector<RoundNode>& nodes, std::optional<uint64_t> before, std::optional<uint64_t>* step,
                  std::string* location, std::string* note) {
  const auto below = [&](uint64_t s) { return !before || s < *before; };
  std::optional<uint64_t> disk;
  bool all_see_disk = true, any_sees = false;
  std::optional<std::set<uint64_t>> common;
  for (const RoundNode& n : nodes) {
    if (!n.resume.directory.empty()) {
      // The newest of its steps below the bound: from the list, or (an entry without one) the newest.
      std::optional<uint64_t> newest;
      for (uint64_t d : n.resume.disk_steps)
        if (below(d) && (!newest || d > *newest)) newest = d;
      if (!newest && n.resume.disk_steps.empty() && n.resume.disk_step && below(*n.resume.disk_step))
        newest = n.resume.disk_step;
      // A node whose few newest steps are all at or past the bound cannot tell what lies below it
      // (the list is cut short, resume.h): no say, as a node that does not know the directory. The
      // directory is shared: the others' view is the same.
      const bool no_say = !newest && before && n.resume.disk_steps.size() >= 2;
      if (!no_say) {
        any_sees = true;
        if (!newest) {
          all_see_disk = false;
        } else {
          disk = disk ? std::min(*disk, *newest) : *newest;
        }
      }
    }
    std::set<uint64_t> mine;
    for (uint64_t m : n.resume.memory_steps)
      if (below(m)) mine.insert(m);
    if (!common) {
      common = std::move(mine);
    } else {
      std::set<uint64_t> both;
      std::set_intersection(common->begin(), common->end(), mine.begin(), mine.end(),
                            std::inserter(both, both.begin()));
      common = std::move(both);
    }
  }
  if (!all_see_disk || !any_sees) disk.reset();
  const std::optional<uint64_t> memory =
      common && !common->empty() ? std::optional<uint64_t>(*common->rbegin()) : std::nullopt;
  // A step complete in some node's memory only (its own ranks and the replicas of a lost node's):
  // the nodes that lack it fetch it from the first node that has it before they launch.
  std::optional<uint64_t> somewhere;
  for (const RoundNode& n : nodes)
    for (uint64_t m : n.resume.memory_steps)
      if (below(m) && (!somewhere || m > *somewhere)) somewhere = m;
  step->reset();
  location->clear();
  // Memory wins a tie with the disk, as the library's Load prefers it: the same bytes, faster.
  if (memory && (!disk || *memory >= *disk) && (!somewhere || *memory >= *somewhere)) {
    *step = memory;
    *location = "memory";
  } else if (somewhere && (!disk || *somewhere > *disk)) {
    *step = somewhere;
    *location = "peer_memory";
  } else if (disk) {
    *step = disk;
    *location = "disk";
  }
  note->clear();
  std::optional<uint64_t> in_part;
  for (const RoundNode& n : nodes)
    if (n.resume.memory_incomplete_step && below(*n.resume.memory_incomplete_step) &&
        (!in_part || *n.resume.memory_incomplete_step > *in_part))
      in_part = n.resume.memory_incomplete_step;
  if (in_part && (!*step || *in_part > **step)) {
    *note = "step " + std::to_string(*in_part) +
            " is in memory only in part (no node holds every rank of it: the ranks of a lost node were not "
            "replicated, or their replicas were damaged or refused); " +
            (*step ? "resuming from step " + std::to_string(**step) + " (" + *location + ")"
                   : std::string("no complete checkpoint anywhere: starting afresh"));
  }
}

nlohmann::json RangesJson(const std::vector<StepRange>& ranges) {
  nlohmann::json out = nlohmann::json::array();
  for (const StepRange& r : ranges) out.push_back({r.first, r.last});
  return out;
}

// [[first, last], ...]; what is not such a pair is left out.
std::vector<StepRange> ParseRanges(const nlohmann::json& j) {
  std::vector<StepRange> out;
  if (!j.is_array()) return out;
  for (const nlohmann::json& r : j)
    if (r.is_array() && r.size() == 2 && r[0].is_number_unsigned() && r[1].is_number_unsigned() &&
        r[0].get<uint64_t>() <= r[1].get<uint64_t>())
      out.push_back({r[0].get<uint64_t>(), r[1].get<uint64_t>()});
  return out;
}

nlohmann::json RollbackJson(const RoundRollback& r) {
  return {{"before", r.before}, {"anomaly_step", r.anomaly_step}, {"anomaly", r.anomaly},
          {"ranks", r.ranks},   {"by", r.by},                     {"skip", RangesJson(r.skip)}};
}

std::optional<RoundRollback> ParseRollback(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("before") || !j["before"].is_number_unsigned()) return std::nullopt;
  RoundRollback r;
  r.before = j["before"].get<uint64_t>();
  if (j.contains("anomaly_step") && j["anomaly_step"].is_number_unsigned()) r.anomaly_step = j["anomaly_step"].get<uint64_t>();
  if (j.contains("anomaly") && j["anomaly"].is_string()) r.anomaly = j["anomaly"].get<std::string>();
  if (j.contains("by") && j["by"].is_string()) r.by = j["by"].get<std::string>();
  if (j.contains("ranks") && j["ranks"].is_array())
    for (const nlohmann::json& k : j["ranks"])
      if (k.is_number_integer()) r.ranks.push_back(k.get<int>());
  if (j.contains("skip")) r.skip = ParseRanges(j["skip"]);
  return r;
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::vector<int> RoundPlan::RanksOf(int group) const {
  std::vector<int> out;
  if (group < 0 || static_cast<size_t>(group) >= nodes.size()) return out;
  int base = 0;
  for (int g = 0; g < group; ++g) base += static_cast<int>(nodes[g].nproc);
  for (uint32_t k = 0; k < nodes[group].nproc; ++k) out.push_back(base + static_cast<int>(k));
  return out;
}

Status ParseNodeRange(const std::string& text, uint32_t* min_nodes, uint32_t* max_nodes) {
  const std::string what = "--nnodes " + text;
  const size_t colon = text.find(':');
  auto number = [&](const std::string& s, uint32_t* out) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = static_cast<uint32_t>(std::stoul(s));
    return *out >= 1;
  };
  if (!number(text.substr(0, colon), min_nodes))
    return Status::InvalidArgument(what, "expected MIN or MIN:MAX, whole numbers from 1");
  *max_nodes = *min_nodes;
  if (colon != std::string::npos && !number(text.substr(colon + 1), max_nodes))
    return Status::InvalidArgument(what, "expected MIN or MIN:MAX, whole numbers from 1");
  if (*max_nodes < *min_nodes) return Status::InvalidArgument(what, "MAX is below MIN");
  return Status::OK();
}

Rendezvous::Rendezvous(RendezvousConfig config, std::unique_ptr<EtcdClient> client, std::unique_ptr<EtcdMirror> mirror,
                       std::unique_ptr<SummaryReceiver> summaries)
    : config_(std::move(config)),
      client_(std::move(client)),
      mirror_(std::move(mirror)),
      summaries_(std::move(summaries)),
      prefix_("/lifeline/" + config_.job + "/"),
      node_id_(config_.host + ":" + std::to_string(getpid()) + ":" + NewLaunchNonce().substr(0, 8)),
      node_name_(!config_.node_name.empty() ? config_.node_name : config_.host) {}

Result<std::unique_ptr<Rendezvous>> Rendezvous::Connect(RendezvousConfig config) {
  if (config.job.empty()) return Status::InvalidArgument("--rdzv-id", "a job id is required with --rdzv-endpoint");
  if (config.job.find('/') != std::string::npos)
    return Status::InvalidArgument("--rdzv-id " + config.job, "must not contain '/'");
  if (config.host.empty()) config.host = HostName();
  if (config.node_name.find('/') != std::string::npos)
    return Status::InvalidArgument("--node-name " + config.node_name, "must not contain '/'");
  LL_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client,
                      EtcdClient::Create(config.endpoint, std::max(1.0, config.lease_seconds / 4)));
  if (Status s = client->Ping(); !s.ok())
    return Status::Unavailable("rendezvous", "etcd at " + config.endpoint + " is unreachable (" + s.ToString() +
                                                 "); start etcd or correct --rdzv-endpoint");
  EtcdMirrorOptions mirror_options;
  mirror_options.watch = config.watch;
  mirror_options.poll_seconds = config.poll_seconds;
  mirror_options.request_timeout_seconds = std::max(1.0, config.lease_seconds / 4);
  LL_ASSIGN_OR_RETURN(std::unique_ptr<EtcdMirror> mirror, EtcdMirror::Start(config.endpoint, mirror_options));
  LL_ASSIGN_OR_RETURN(std::unique_ptr<SummaryReceiver> summaries, SummaryReceiver::Start(config.job));
  auto r = std::unique_ptr<Rendezvous>(
      new Rendezvous(std::move(config), std::move(client), std::move(mirror), std::move(summaries)));
  r->sender_ = std::make_unique<SummarySender>(r->config_.job, r->node_id_);
  LL_ASSIGN_OR_RETURN(r->lease_client_, EtcdClient::Create(r->config_.endpoint, std::max(1.0, r->config_.lease_seconds / 4)));
  LL_ASSIGN_OR_RETURN(int64_t lease, r->client_->GrantLease(static_cast<int64_t>(std::max(2.0, r->config_.lease_seconds))));
  r->lease_ = lease;
  LL_RETURN_IF_ERROR(r->client_->PutIfAbsent(r->Key("round"), "0").status());
  r->watcher_ = std::thread([p = r.get()] { p->Watch(); });
  return r;
}

Rendezvous::~Rendezvous() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
}

EtcdTraffic Rendezvous::traffic() const {
  EtcdTraffic t = client_->traffic();
  for (const EtcdTraffic& m : {mirror_->traffic(), lease_client_->traffic()}) {
    t.requests += m.requests;
    t.bytes_sent += m.bytes_sent;
    t.bytes_received += m.bytes_received;
  }
  return t;
}

Result<uint64_t> Rendezvous::CurrentRound() {
  LL_ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> kv, client_->Get(Key("round")));
  if (!kv) return uint64_t{0};
  const std::optional<uint64_t> round = ParseDecimal(kv->value);
  if (!round) return Status::Corruption("etcd key " + Key("round"), "'" + kv->value + "' is not a round number");
  return *round;
}

namespace {

// A plan's value in etcd: the JSON as it is, or, from kPlanCompressFrom bytes, "LLZ" 0x01 and one
// zstd frame of it (docs/multi-node.md: a plan of 2,048 nodes is 685 KB of JSON and 32 KB so;
// every agent of the round receives it through its watch, and a job-sized value to each of 2,048
// watchers was most of what a join cost etcd).
constexpr char kPlanMagic[4] = {'L', 'L', 'Z', '\x01'};
constexpr size_t kPlanCompressFrom = 1024;
constexpr size_t kMaxPlanBytes = 64u << 20;

std::string EncodePlanValue(const std::string& json) {
  if (json.size() < kPlanCompressFrom) return json;
  std::string out(kPlanMagic, sizeof(kPlanMagic));
  out.resize(sizeof(kPlanMagic) + ZSTD_compressBound(json.size()));
  const size_t n = ZSTD_compress(out.data() + sizeof(kPlanMagic), out.size() - sizeof(kPlanMagic), json.data(),
                                 json.size(), 3);
  if (ZSTD_isError(n)) return json;
  out.resize(sizeof(kPlanMagic) + n);
  return out;
}

Result<std::string> DecodePlanValue(const std::string& value, const std::string& what) {
  if (value.size() < sizeof(kPlanMagic) || value.compare(0, sizeof(kPlanMagic), kPlanMagic, sizeof(kPlanMagic)) != 0)
    return value;
  const char* frame = value.data() + sizeof(kPlanMagic);
  const size_t frame_size = value.size() - sizeof(kPlanMagic);
  const unsigned long long size = ZSTD_getFrameContentSize(frame, frame_size);
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN || size > kMaxPlanBytes)
    return Status::Corruption(what, "a compressed plan that is not one zstd frame of at most 64 MiB");
  std::string json(size, '\0');
  const size_t got = ZSTD_decompress(json.data(), json.size(), frame, frame_size);
  if (ZSTD_isError(got) || got != size) return Status::Corruption(what, "a compressed plan that does not decompress");
  return json;
}

}  // namespace

Result<RoundPlan> Rendezvous::ClosedPlan(uint64_t round, const std::string& text) const {
  const std::string what = "etcd key " + prefix_ + "rounds/" + std::to_string(round) + "/plan";
  LL_ASSIGN_OR_RETURN(const std::string json, DecodePlanValue(text, what));
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("nodes") || !j["nodes"].is_array())
    return Status::Corruption(what, "not a round plan of lifeline-agent");
  RoundPlan plan;
  plan.round = round;
  std::optional<uint64_t> resume_step;
  if (j.contains("resume_step") && j["resume_step"].is_number_unsigned()) resume_step = j["resume_step"].get<uint64_t>();
  for (const nlohmann::json& n : j["nodes"]) {
    LL_ASSIGN_OR_RETURN(RoundNode node, ParseNode(n, what));
    if (resume_step && n.is_object() && n.value("holds_resume_step", false)) node.resume.memory_steps = {*resume_step};
    if (node.id == node_id_) {
      plan.group_rank = static_cast<int>(plan.nodes.size());
      plan.rank_base = plan.world_size;
    }
    plan.world_size += node.nproc;
    plan.nodes.push_back(std::move(node));
  }
  if (plan.nodes.empty()) return Status::Corruption(what, "a round plan with no nodes");
  plan.master_addr = plan.nodes[0].host;
  plan.master_port = plan.nodes[0].master_port;
  try {
    if (j.contains("resume_step") && !j["resume_step"].is_null()) plan.resume_step = j["resume_step"].get<uint64_t>();
    plan.resume_location = j.value("resume_location", "");
    plan.resume_note = j.value("resume_note", "");
    plan.checkpoint_dir = j.value("checkpoint_dir", "");
    plan.launch_id = j.value("launch_id", "");
    if (j.contains("excluded") && j["excluded"].is_array())
      for (const nlohmann::json& e : j["excluded"]) {
        ExcludedNode x;
        x.name = e.value("name", "");
        x.failures = e.value("failures", 0u);
        x.last_cause = e.value("last_cause", "");
        x.kept = e.value("kept", false);
        x.sdc = e.value("sdc", 0u);
        plan.excluded.push_back(std::move(x));
      }
    if (j.contains("spares") && j["spares"].is_array()) plan.spares = j["spares"].get<std::vector<std::string>>();
    if (j.contains("rollback")) plan.rollback = ParseRollback(j["rollback"]);
    if (j.contains("skip_steps")) plan.skip_steps = ParseRanges(j["skip_steps"]);
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(what, std::string("not a round plan of lifeline-agent: ") + e.what());
  }
  return plan;
}

Result<std::vector<ExcludedNode>> Rendezvous::BadNodes() {
  std::vector<ExcludedNode> out;
  if (config_.exclude_after == 0 && config_.exclude_after_sdc == 0) return out;
  LL_ASSIGN_OR_RETURN(std::vector<std::vector<EtcdKeyValue>> read,
                      client_->ReadMany({{Key("node_failures/"), false}, {Key("readmitted/"), false}}));
  std::map<std::string, int64_t> readmitted;
  for (const EtcdKeyValue& kv : read[1])
    if (const std::optional<uint64_t> at = ParseDecimal(kv.value))
      readmitted[kv.key.substr(Key("readmitted/").size())] = static_cast<int64_t>(*at);
  const int64_t since = UnixMillis() - static_cast<int64_t>(config_.exclude_window_seconds * 1000);
  struct Count {
    uint32_t n = 0;
    uint32_t sdc = 0;
    int64_t newest = 0;
    std::string cause;
  };
  std::map<std::string, Count> counts;
  const std::string dir = Key("node_failures/");
  for (const EtcdKeyValue& kv : read[0]) {
    const std::string rest = kv.key.substr(dir.size());  // <name>/<round>
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) continue;
    const std::string name = rest.substr(0, slash);
    const nlohmann::json j = nlohmann::json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("unix_ms") || !j["unix_ms"].is_number_integer()) continue;
    const int64_t at = j["unix_ms"].get<int64_t>();
    const auto re = readmitted.find(name);
    if (at < since || (re != readmitted.end() && at <= re->second)) continue;
    Count& c = counts[name];
    ++c.n;
    if (j.contains("kind") && j["kind"] == "sdc_suspect") ++c.sdc;
    if (at >= c.newest) c.newest = at, c.cause = j.value("cause", "");
  }
  for (const auto& [name, c] : counts) {
    const bool corrupts = config_.exclude_after_sdc > 0 && c.sdc >= config_.exclude_after_sdc;
    if ((config_.exclude_after > 0 && c.n >= config_.exclude_after) || corrupts)
      out.push_back({name, c.n, c.cause, false, corrupts ? c.sdc : 0});
  }
  return out;
}

Status Rendezvous::RecordNodeFailure(uint64_t round, const std::string& node, const std::string& cause,
                                     const std::string& kind) {
  if (node.empty() || node.find('/') != std::string::npos) return Status::OK();
  nlohmann::json j = {{"unix_ms", UnixMillis()}, {"cause", cause}, {"round", round}};
  if (!kind.empty()) j["kind"] = kind;
  return client_->PutIfAbsent(Key("node_failures/" + node + "/" + std::to_string(round)), j.dump()).status();
}

Status Rendezvous::Readmit(const std::string& node) {
  if (node.empty() || node.find('/') != std::string::npos)
    return Status::InvalidArgument("readmit '" + node + "'", "expected a node's name");
  return client_->Put(Key("readmitted/" + node), std::to_string(UnixMillis()));
}

Status Rendezvous::TryClose(uint64_t round, const std::vector<EtcdKeyValue>& members, bool last_call,
                            const std::vector<std::string>& previous) {
  const size_t previous_size = previous.size();
  std::vector<RoundNode> nodes;
  for (const EtcdKeyValue& kv : members) {
    const nlohmann::json j = nlohmann::json::parse(kv.value, nullptr, /*allow_exceptions=*/false);
    Result<RoundNode> node = ParseNode(j, "etcd key " + kv.key);
    if (!node.ok()) continue;  // not an agent's entry: not a member
    node->joined_revision = kv.create_revision;
    nodes.push_back(std::move(*node));
  }
  // Asked-for ranks first, in that order; then by arrival.
  std::stable_sort(nodes.begin(), nodes.end(), [](const RoundNode& a, const RoundNode& b) {
    const bool ra = a.requested_rank >= 0, rb = b.requested_rank >= 0;
    if (ra != rb) return ra;
    if (ra && a.requested_rank != b.requested_rank) return a.requested_rank < b.requested_rank;
    return a.joined_revision < b.joined_revision;
  });
  // The bad nodes are left out while the others make MIN.
  std::vector<ExcludedNode> bad;
  if (config_.exclude_after > 0 || config_.exclude_after_sdc > 0) {
    Result<std::vector<ExcludedNode>> found = BadNodes();
    if (!found.ok()) return found.status();
    bad = std::move(*found);
  }
  const auto is_bad = [&](const RoundNode& n) {
    return std::any_of(bad.begin(), bad.end(), [&](const ExcludedNode& x) { return x.name == n.Name(); });
  };
  std::vector<RoundNode> regular, spares, excluded;
  for (RoundNode& n : nodes) (is_bad(n) ? excluded : n.standby ? spares : regular).push_back(std::move(n));
  // Spares fill the places the others leave empty: the previous round's (the first round's: MIN).
  // At once only the places of nodes excluded now; a place whose node is merely late (stopping
  // its ranks, backing off) is its own until the last call.
  size_t excluded_places = 0;
  for (const std::string& name : previous)
    if (std::any_of(bad.begin(), bad.end(), [&](const ExcludedNode& x) { return x.name == name; })) ++excluded_places;
  const size_t target = std::min<size_t>(config_.max_nodes, std::max<size_t>(config_.min_nodes, previous_size));
  std::vector<RoundNode> placed = regular;
  if (placed.size() > config_.max_nodes) placed.resize(config_.max_nodes);
  const size_t spare_room = last_call ? target : std::min(target, placed.size() + excluded_places);
  size_t spares_used = 0;
  while (placed.size() < spare_room && spares_used < spares.size()) placed.push_back(spares[spares_used++]);
  const bool full = regular.size() >= config_.max_nodes || (previous_size > 0 && placed.size() >= previous_size);
  bool kept_bad = false;
  if (placed.size() < config_.min_nodes) {
    // Too few without the bad nodes: after the last call, they are kept rather than the job stopped.
    if (!last_call) return Status::OK();
    // A node that corrupts data is never kept: the job would train on it knowingly.
    const auto corrupts = [&](const RoundNode& n) {
      return std::any_of(bad.begin(), bad.end(), [&](const ExcludedNode& x) { return x.name == n.Name() && x.sdc > 0; });
    };
    std::vector<std::string> left_out;
    for (RoundNode& n : excluded) {
      if (placed.size() >= config_.min_nodes) break;
      if (corrupts(n)) {
        left_out.push_back(n.Name());
        continue;
      }
      placed.push_back(std::move(n));
      kept_bad = true;
    }
    if (placed.size() < config_.min_nodes && !left_out.empty()) {
      std::string names;
      for (const std::string& n : left_out) names += (names.empty() ? "" : ", ") + n;
      return GiveUp("node" + std::string(left_out.size() > 1 ? "s " : " ") + names +
                    " held replicas unlike the others' (sdc_suspect) " + std::to_string(config_.exclude_after_sdc) +
                    " times or more and " + (left_out.size() > 1 ? "are" : "is") + " left out, and without " +
                    (left_out.size() > 1 ? "them" : "it") + " round " + std::to_string(round) + " has " +
                    std::to_string(placed.size()) + " of the " + std::to_string(config_.min_nodes) +
                    " nodes it needs (no spare took the place): take the node out of service and resubmit, or add a "
                    "spare (--standby)");
    }
    if (placed.size() < config_.min_nodes) return Status::OK();
  } else if (!full && !last_call) {
    return Status::OK();
  }
  // A rollback's round, and the job's skipped steps: read at the close, so that the plan carries
  // them to every node.
  LL_ASSIGN_OR_RETURN(std::vector<std::vector<EtcdKeyValue>> carried,
                      client_->ReadMany({{Key("rounds/" + std::to_string(round) + "/rollback"), false},
                                         {Key("skip_steps"), false}}));
  std::optional<RoundRollback> rollback;
  for (const EtcdKeyValue& kv : carried[0])
    if (kv.key == Key("rounds/" + std::to_string(round) + "/rollback"))
      rollback = ParseRollback(nlohmann::json::parse(kv.value, nullptr, /*allow_exceptions=*/false));
  std::vector<StepRange> skip_steps;
  for (const EtcdKeyValue& kv : carried[1])
    if (kv.key == Key("skip_steps")) skip_steps = ParseRanges(nlohmann::json::parse(kv.value, nullptr, false));
  std::optional<uint64_t> step;
  std::string location, note;
  ChooseResume(placed, rollback ? std::optional<uint64_t>(rollback->before) : std::nullopt, &step, &location, &note);
  // Every agent reads the plan once a round: each node as the others need it (about 200 bytes:
  // at 2,048 nodes 0.4 MB, where the entries with their offers came to 0.9 MB), whether it holds
  // the resume step in memory in place of its offer.
  nlohmann::json plan = {{"nodes", nlohmann::json::array()}};
  for (const RoundNode& n : placed) {
    nlohmann::json entry = NodeJson(n);
    entry.erase("resume");
    entry.erase("joined_revision");
    if (step && std::count(n.resume.memory_steps.begin(), n.resume.memory_steps.end(), *step))
      entry["holds_resume_step"] = true;
    plan["nodes"].push_back(std::move(entry));
  }
  nlohmann::json out_bad = nlohmann::json::array();
  for (const ExcludedNode& x : bad) {
    const bool kept = kept_bad && std::any_of(placed.begin(), placed.end(), [&](const RoundNode& n) { return n.Name() == x.name; });
    out_bad.push_back({{"name", x.name}, {"failures", x.failures}, {"last_cause", x.last_cause}, {"kept", kept}});
    if (x.sdc > 0) out_bad.back()["sdc"] = x.sdc;
  }
  if (!out_bad.empty()) plan["excluded"] = out_bad;
  nlohmann::json unplaced = nlohmann::json::array();
  for (size_t k = spares_used; k < spares.size(); ++k) unplaced.push_back(spares[k].Name());
  if (!unplaced.empty()) plan["spares"] = unplaced;
  plan["resume_step"] = step ? nlohmann::json(*step) : nlohmann::json(nullptr);
  plan["resume_location"] = location;
  if (!note.empty()) plan["resume_note"] = note;
  if (rollback) plan["rollback"] = RollbackJson(*rollback);
  if (!skip_steps.empty()) plan["skip_steps"] = RangesJson(skip_steps);
  std::string directory;
  for (const RoundNode& n : placed)
    if (directory.empty()) directory = n.resume.directory;
  plan["checkpoint_dir"] = directory;
  plan["launch_id"] = config_.job + ":" + NewLaunchNonce() + ":" + std::to_string(round);
  plan["closed_by"] = node_id_;
  return client_->PutIfAbsent(Key("rounds/" + std::to_string(round) + "/plan"), EncodePlanValue(plan.dump())).status();
}

Result<bool> Rendezvous::EndedWithout(uint64_t round, size_t planned) {
  const std::vector<EtcdKeyValue> done = mirror_->Under(Key("rounds/" + std::to_string(round) + "/finished/"));
  return planned > 0 && done.size() >= planned;
}

void Rendezvous::Refocus() {
  std::lock_guard<std::mutex> refocusing(refocus_mu_);
  std::vector<std::string> ranges = {Key("round"), Key("give_up")};
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::optional<uint64_t> focus = in_round_ ? std::optional<uint64_t>(my_round_) : joining_;
    if (focus) {
      const std::string dir = Key("rounds/" + std::to_string(*focus) + "/");
      // The plan (every node's entry: the largest value of the job) only until it is read.
      if (in_round_) ranges.insert(ranges.end(), {dir + "leader", dir + "digest_queries/"});
      else ranges.insert(ranges.end(), {dir + "closer", dir + "plan"});
      // The round's entries for whoever judges them: the closer before the plan, the leader after.
      if ((!in_round_ && closer_ && !unplaced_) || (in_round_ && leader_)) ranges.push_back(dir + "nodes/");
      if ((in_round_ && leader_) || unplaced_) ranges.push_back(dir + "finished/");
    }
  }
  mirror_->Track(std::move(ranges));
}

Result<uint64_t> Rendezvous::MirroredRound() const {
  const std::optional<EtcdKeyValue> kv = mirror_->Get(Key("round"));
  if (!kv) return uint64_t{0};
  const std::optional<uint64_t> round = ParseDecimal(kv->value);
  if (!round) return Status::Corruption("etcd key " + Key("round"), "'" + kv->value + "' is not a round number");
  return *round;
}

Result<RoundPlan> Rendezvous::Join(const ResumeOffer& offer, const std::function<bool()>& stop,
                                   const std::function<void(const std::string&)>& waiting) {
  Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(config_.join_timeout_seconds));
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_round_ = false;
    joining_.reset();
    closer_ = false;
    unplaced_ = false;
  }
  Refocus();
  Status last_error;
  std::optional<uint64_t> round;
  std::string entry_key;
  size_t seen_members = 0;
  bool members_known = false;     // seen_members counts (this node closes, or it asked etcd)
  Clock::time_point last_change = Clock::now();
  Clock::time_point last_count{};  // the closer's last count of the entries in etcd
  bool closed_without_me = false;
  size_t planned_without_me = 0;  // the nodes of the round that closed without this node
  std::vector<std::string> previous;  // the names of the nodes of the round before the one joined
  std::string unplaced_note;      // why this node was not placed, once said
  // One look at the mirror (and what follows from it): the plan once the round closed with this
  // node in it, nullopt to look again.
  auto step = [&]() -> Result<std::optional<RoundPlan>> {
    if (!mirror_->ready()) {
      if (!mirror_->connected()) return Status::Unavailable("etcd at " + config_.endpoint, "not answering");
      return std::optional<RoundPlan>();
    }
    if (const std::optional<EtcdKeyValue> gave_up = mirror_->Get(Key("give_up")))
      return Status::Aborted("job " + config_.job, "another node ended it: " + gave_up->value);
    LL_ASSIGN_OR_RETURN(uint64_t current, MirroredRound());
    if (!round || current > *round) {  // (re)join the job's current round
      if (!entry_key.empty()) client_->Delete(entry_key).IgnoreError();
      round = current;
      closed_without_me = false;
      RoundNode me;
      me.id = node_id_;
      me.host = config_.host;
      me.nproc = config_.nproc_per_node;
      me.requested_rank = config_.node_rank;
      me.master_port = PickFreePort();
      me.replica_port = config_.replica_port;
      me.summary_port = summaries_->port();
      me.name = node_name_;
      me.standby = config_.standby;
      me.resume = offer;
      entry_key = Key("rounds/" + std::to_string(*round) + "/nodes/" + node_id_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        node_entry_key_ = entry_key;
        node_entry_ = NodeJson(me).dump();
        joining_ = *round;
        closer_ = false;
        unplaced_ = false;
      }
      LL_RETURN_IF_ERROR(client_->Put(entry_key, NodeJson(me).dump(), lease_.load()));
      seen_members = 0;
      members_known = false;
      last_change = Clock::now();
      previous.clear();
      if (*round > 0) {
        LL_ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> prev, client_->Get(Key("rounds/" + std::to_string(*round - 1) + "/plan")));
        if (prev) {
          Result<RoundPlan> p = ClosedPlan(*round - 1, prev->value);
          if (p.ok())
            for (const RoundNode& n : p->nodes) previous.push_back(n.Name());
        }
      }
      Refocus();
      return std::optional<RoundPlan>();
    }
    const std::string round_dir = "rounds/" + std::to_string(*round) + "/";
    if (closed_without_me) {  // wait for the next round, or the job's end
      LL_ASSIGN_OR_RETURN(bool ended, EndedWithout(*round, planned_without_me));
      if (!ended) return std::optional<RoundPlan>();
      RoundPlan done;
      done.round = *round;
      done.finished = true;
      return std::optional<RoundPlan>(std::move(done));
    }
    if (const std::optional<EtcdKeyValue> plan_kv = mirror_->Get(Key(round_dir + "plan"))) {
      LL_ASSIGN_OR_RETURN(RoundPlan plan, ClosedPlan(*round, plan_kv->value));
      if (plan.group_rank >= 0) return std::optional<RoundPlan>(std::move(plan));
      closed_without_me = true;  // full, or closed before this node came: the next round
      planned_without_me = plan.nodes.size();
      {
        std::lock_guard<std::mutex> lock(mu_);
        unplaced_ = true;
      }
      Refocus();
      std::string note = "round " + std::to_string(*round) + " formed without this node (" + node_name_ + ")";
      for (const ExcludedNode& x : plan.excluded)
        if (x.name == node_name_)
          note = "this node (" + node_name_ + ") is excluded from round " + std::to_string(*round) + " as bad: its ranks caused " +
                 std::to_string(x.failures) + " restarts within " +
                 std::to_string(static_cast<int>(config_.exclude_window_seconds)) + " s (last: " + x.last_cause +
                 "); it waits as a spare until an operator readmits it (lifeline-agent ctl SOCKET readmit " + node_name_ +
                 ") or the job ends";
      if (config_.standby && note.find("excluded") == std::string::npos)
        note = "this node (" + node_name_ + ") is a spare, not placed in round " + std::to_string(*round) +
               "; it waits for a place or the job's end";
      if (waiting && note != unplaced_note) waiting(note);
      unplaced_note = note;
      return std::optional<RoundPlan>();
    }
    // One agent closes the round: the first to claim it, or the first after its claim lapsed.
    const std::optional<EtcdKeyValue> closer = mirror_->Get(Key(round_dir + "closer"));
    if (!closer) {
      LL_RETURN_IF_ERROR(client_->PutIfAbsent(Key(round_dir + "closer"), node_id_, lease_.load()).status());
      return std::optional<RoundPlan>();  // the mirror says who won
    }
    bool closing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing = closer->value == node_id_;
      if (closing != closer_) {
        closer_ = closing;
        members_known = false;
      }
    }
    if (!closing) return std::optional<RoundPlan>();
    Refocus();
    if (!mirror_->ready()) return std::optional<RoundPlan>();
    const std::vector<EtcdKeyValue> members = mirror_->Under(Key(round_dir + "nodes/"));
    if (!members_known || members.size() != seen_members) {
      seen_members = members.size();
      members_known = true;
      last_change = Clock::now();
    }
    // The closer counts what its copy holds. A copy short of an entry etcd holds (a stream that
    // missed it, or a mirror pointed at stale ranges: see Refocus) would keep the round waiting
    // until the 10 s fresh read below (issue 50 saw a round of two nodes close 9 s after both
    // joined; not reproduced here): while the copy has been still for a second short of MAX, etcd
    // is asked for the count alone (once a second, one agent per round), and a copy behind it is
    // read afresh.
    if (members.size() < config_.max_nodes && SecondsSince(last_change) >= 1 && SecondsSince(last_count) >= 1) {
      last_count = Clock::now();
      Result<int64_t> n = client_->CountPrefix(Key(round_dir + "nodes/"));
      if (n.ok() && static_cast<size_t>(*n) > members.size()) mirror_->Resync();
    }
    if (members.size() >= config_.min_nodes || members.size() >= config_.max_nodes)
      LL_RETURN_IF_ERROR(TryClose(*round, members, SecondsSince(last_change) >= config_.last_call_seconds, previous));
    return std::optional<RoundPlan>();
  };
  const Clock::time_point began = Clock::now();
  Clock::time_point said{};
  uint64_t seen = mirror_->version();
  while (Clock::now() < deadline) {
    if (stop && stop()) return Status::Aborted("rendezvous", "the agent was stopped");
    const bool tell = !closed_without_me && SecondsSince(began) >= 2 && (said == Clock::time_point{} || SecondsSince(said) >= 10);
    if (tell) {
      said = Clock::now();
      // A round still waiting after 10 s is read afresh, whoever asked to be told: whatever a
      // stream might have missed (one slurm_kill run waited 10 minutes on a closer that counted 1
      // of 2 nodes; at 2,048 agents a few in a thousand waited out their join on a plan their
      // streams never brought) costs 10 s. A node that does not close the round follows a few keys.
      if (SecondsSince(began) >= 10) mirror_->Resync();
    }
    if (tell && waiting) {
      if (!members_known && round) {  // the closer counts; the others ask etcd, once per message
        Result<int64_t> n = client_->CountPrefix(Key("rounds/" + std::to_string(*round) + "/nodes/"));
        if (n.ok()) seen_members = static_cast<size_t>(*n);
      }
      waiting(std::to_string(seen_members) + " of at least " + std::to_string(config_.min_nodes) +
              " nodes joined round " + (round ? std::to_string(*round) : std::string("?")) + "; waiting up to " +
              std::to_string(static_cast<int>(config_.join_timeout_seconds - SecondsSince(began))) + " s more" +
              (last_error.ok() ? std::string() : " (etcd: " + last_error.ToString() + ")"));
    }
    Result<std::optional<RoundPlan>> looked = step();
    if (closed_without_me) deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                         std::chrono::duration<double>(config_.join_timeout_seconds));
    if (looked.ok() && looked->has_value() && (*looked)->finished) return std::move(**looked);
    if (looked.ok() && looked->has_value()) {
      RoundPlan plan = std::move(**looked);
      {
        std::lock_guard<std::mutex> lock(mu_);
        my_round_ = plan.round;
        my_group_ = plan.group_rank;
        auto nodes = std::make_shared<std::vector<std::string>>();
        summary_to_.clear();
        for (const RoundNode& n : plan.nodes) {
          nodes->push_back(n.id);
          summary_to_[n.id] = {n.host, n.summary_port};
        }
        my_nodes_ = std::move(nodes);
        in_round_ = true;
        joining_.reset();
        closer_ = false;
        leader_ = false;
        progress_out_.clear();
        own_summary_.clear();
        news_ = RendezvousNews{};
        reported_lost_.clear();
      }
      Refocus();
      return plan;
    }
    if (!looked.ok()) {
      if (looked.status().code() == StatusCode::kAborted || looked.status().IsCorruption()) return looked.status();
      last_error = looked.status();  // etcd restarting: keep trying until the deadline
    } else {
      last_error = Status::OK();
    }
    // Woken by a change the mirror saw, or after 100 ms (the closer's last-call clock) or 250 ms
    // (`stop`, the waiting messages).
    seen = mirror_->WaitForChange(seen, members_known ? 0.1 : 0.25);
  }
  std::string why = "round " + (round ? std::to_string(*round) : std::string("?")) + " of job " + config_.job +
                    " did not form within " + std::to_string(static_cast<int>(config_.join_timeout_seconds)) +
                    " s: " + std::to_string(seen_members) + " of at least " + std::to_string(config_.min_nodes) +
                    " nodes joined";
  if (!last_error.ok()) why += "; last etcd error: " + last_error.ToString();
  return Status::Unavailable("rendezvous", why);
}

Result<uint64_t> Rendezvous::OpenNextRound(uint64_t round, const RoundRollback* rollback) {
  // etcd away (a restart, an election, a slow disk) must not end the job: the restart waits for it
  // as long as the round's join would. A swap that went through but whose answer was lost is seen
  // by the retry: the round has moved, the swap does not apply, and the round is read below.
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                        std::chrono::duration<double>(config_.join_timeout_seconds));
  if (rollback != nullptr) {
    // Before the round moves, so that its closer finds them. Two nodes rolling back at once (a NaN
    // reaches every rank through the all-reduce) write the same bound or near it: the first stays.
    for (int attempt = 0;; ++attempt) {
      // The job's list with this node's added (another node's rollback may have added its own).
      std::vector<StepRange> skip = rollback->skip;
      Result<std::optional<EtcdKeyValue>> had = client_->Get(Key("skip_steps"));
      Status s = had.status();
      if (s.ok() && had->has_value())
        for (const StepRange& r : ParseRanges(nlohmann::json::parse((*had)->value, nullptr, false)))
          if (std::find(skip.begin(), skip.end(), r) == skip.end()) skip.push_back(r);
      if (s.ok()) s = client_->Put(Key("skip_steps"), RangesJson(skip).dump());
      if (s.ok()) s = client_->PutIfAbsent(Key("rounds/" + std::to_string(round + 1) + "/rollback"),
                                           RollbackJson(*rollback).dump()).status();
      if (s.ok()) break;
      if (!s.IsUnavailable() || Clock::now() >= deadline) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(200 << std::min(attempt, 3), 1000)));
    }
  }
  for (int attempt = 0;; ++attempt) {
    Status s = client_->CompareAndSwap(Key("round"), std::to_string(round), std::to_string(round + 1)).status();
    if (s.ok()) break;
    if (!s.IsUnavailable() || Clock::now() >= deadline) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(200 << std::min(attempt, 3), 1000)));
  }
  for (;;) {  // and the round it opened (or another node did)
    Result<uint64_t> current = CurrentRound();
    if (current.ok() || !current.status().IsUnavailable() || Clock::now() >= deadline) {
      std::lock_guard<std::mutex> lock(mu_);
      in_round_ = false;  // the lost-node watch ends with the round
      return current;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

Status Rendezvous::GiveUp(const std::string& reason) {
  return client_->PutIfAbsent(Key("give_up"), reason).status();
}

Status Rendezvous::ReportFailure(uint64_t round, uint64_t unix_ms) {
  return client_->PutIfAbsent(Key("rounds/" + std::to_string(round) + "/failures/" + node_id_),
                              std::to_string(unix_ms), lease_.load())
      .status();
}

Status Rendezvous::AskDigests(uint64_t round, const DigestQuery& query) {
  const nlohmann::json j = {{"step", query.step}, {"ranks", query.ranks}};
  return client_->Put(Key("rounds/" + std::to_string(round) + "/digest_queries/" + std::to_string(query.step)), j.dump(),
                      lease_.load());
}

Result<std::vector<std::string>> Rendezvous::NodesWithoutFailure(uint64_t round, const std::vector<std::string>& nodes) {
  const std::string base = "rounds/" + std::to_string(round) + "/";
  LL_ASSIGN_OR_RETURN(std::vector<std::vector<EtcdKeyValue>> read,
                      client_->ReadMany({{Key(base + "failures/"), true}, {Key(base + "finished/"), true}}));
  std::set<std::string> said;
  const std::string dirs[2] = {Key(base + "failures/"), Key(base + "finished/")};
  for (size_t k = 0; k < 2; ++k)
    for (const EtcdKeyValue& kv : read[k]) said.insert(kv.key.substr(dirs[k].size()));
  std::vector<std::string> silent;
  for (const std::string& n : nodes)
    if (!said.count(n)) silent.push_back(n);
  return silent;
}

Result<bool> Rendezvous::FailedEarlierElsewhere(uint64_t round, uint64_t unix_ms) {
  const std::string dir = Key("rounds/" + std::to_string(round) + "/failures/");
  LL_ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> reports, client_->GetPrefix(dir));
  // etcd orders the reports on one clock, its revision: each node reports the moment it sees its
  // failure, so the order of the keys' creation is the order of the failures, whatever the nodes'
  // wall clocks say (one 2 s behind would otherwise make its echo look first). The times in the
  // values decide only when this node's own report is missing.
  int64_t mine = 0;
  for (const EtcdKeyValue& kv : reports)
    if (kv.key.substr(dir.size()) == node_id_) mine = kv.create_revision;
  for (const EtcdKeyValue& kv : reports) {
    const std::string node = kv.key.substr(dir.size());
    if (node == node_id_) continue;
    if (mine > 0) {
      if (kv.create_revision > 0 && kv.create_revision < mine) return true;
      continue;
    }
    const std::optional<uint64_t> at = ParseDecimal(kv.value);
    if (!at) continue;  // not one of ours
    if (*at < unix_ms || (*at == unix_ms && node < node_id_)) return true;
  }
  return false;
}

RendezvousNews Rendezvous::TakeNews() {
  std::lock_guard<std::mutex> lock(mu_);
  RendezvousNews out = news_;
  out.summary_errors = summaries_->ErrorsSince(&summary_errors_seen_);
  if (in_round_) {
    for (const EtcdKeyValue& kv : mirror_->Under(Key("rounds/" + std::to_string(my_round_) + "/digest_queries/"))) {
      try {
        const nlohmann::json j = nlohmann::json::parse(kv.value);
        DigestQuery q;
        q.step = j.at("step").get<uint64_t>();
        for (const nlohmann::json& r : j.at("ranks")) q.ranks.push_back(r.get<int>());
        out.digest_queries.push_back(std::move(q));
      } catch (const std::exception&) {
        // not one of ours: no answer
      }
    }
  }
  // A summary acknowledged on a connection since replaced is not the new connection's; one the
  // leader took for its own, not another leader's.
  out.progress_acked = (acked_.first == 0 ? out.leader : acked_.first == sender_->connections()) ? acked_.second : 0;
  news_.round.reset();
  news_.lost_nodes.clear();
  news_.lost_how.clear();
  news_.lost_silent_seconds.clear();
  news_.isolated.clear();
  news_.progress.clear();
  return out;
}

void Rendezvous::PublishProgress(std::string summary) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_out_ = std::move(summary);
}

Status Rendezvous::RenewOrRejoin(bool* regranted) {
  Status s = lease_client_->KeepAlive(lease_.load());
  if (!s.IsNotFound()) return s;
  *regranted = true;
  // The lease expired (etcd was away longer than its TTL): a new one, and this node's entry again
  // so the round it is in still counts it.
  LL_ASSIGN_OR_RETURN(int64_t lease, client_->GrantLease(static_cast<int64_t>(std::max(2.0, config_.lease_seconds))));
  lease_ = lease;
  std::string key, entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    key = node_entry_key_;
    entry = node_entry_;
  }
  return key.empty() ? Status::OK() : client_->Put(key, entry, lease);
}

void Rendezvous::Watch() {
  Clock::time_point last_renewal = Clock::now();
  Clock::time_point last_progress = Clock::now();
  bool renewed = true;  // the last renewal went through
  bool resync_due = false;  // since the last renewal that went through: one failed at once, or the lease ran out
  Clock::time_point last_try = Clock::now();
  Clock::time_point last_hello{};  // the last try to connect to the leader before a summary
  Clock::time_point last_leader_contact = Clock::now();  // a summary sent, or a connection made
  uint64_t seen = 0;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    // Woken by a change the mirror saw, or for the clocks below (none reads etcd): every 100 ms
    // on the leader, which looks for lost nodes, every 250 ms elsewhere.
    bool leading;
    {
      std::lock_guard<std::mutex> lock(mu_);
      leading = leader_;
    }
    seen = mirror_->WaitForChange(seen, leading ? 0.1 : 0.25);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    // A renewal every lease/3; after one that failed, the next half a second later (not at every
    // wake: a busy etcd is not asked more).
    if (SecondsSince(last_renewal) >= config_.lease_seconds / 3 && (renewed || SecondsSince(last_try) >= 0.5)) {
      last_try = Clock::now();
      bool regranted = false;
      renewed = RenewOrRejoin(&regranted).ok();
      if (renewed) last_renewal = Clock::now();
      if (regranted || (!renewed && !lease_client_->last_timed_out())) resync_due = true;
      // etcd was gone (refused, reset) and answers again, or it no longer had this node's lease: a
      // stream that outlived the outage may have missed nothing, or everything (an etcd restored
      // from a backup); a fresh read settles it. A renewal that only took too long (etcd busy)
      // leaves the stream whole: no read of the whole job on top of a busy etcd (at 2,048 nodes,
      // that read after every late renewal was most of etcd's load).
      if (renewed && resync_due) {
        mirror_->Resync();
        resync_due = false;
      }
    }
    uint64_t mine;
    bool in_round;
    int my_group;
    std::shared_ptr<const std::vector<std::string>> nodes_now;
    bool leader;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine = my_round_;
      in_round = in_round_;
      nodes_now = my_nodes_;
      my_group = my_group_;
      leader = leader_ && in_round_;
    }
    const std::vector<std::string>& nodes = *nodes_now;
    // About once a second: this node's progress out, straight to the leader (not through etcd),
    // and (the leader) everyone's in, as its receiver holds them.
    const std::string round_dir = "rounds/" + std::to_string(mine) + "/";
    bool reachable = renewed;
    std::optional<std::vector<EtcdKeyValue>> progress;
    if (in_round && SecondsSince(last_progress) >= config_.progress_seconds) {
      last_progress = Clock::now();
      std::string summary, leader_id;
      std::pair<std::string, uint32_t> to;
      {
        std::lock_guard<std::mutex> lock(mu_);
        summary.swap(progress_out_);
        if (leader) own_summary_ = summary.empty() ? own_summary_ : summary;
        if (const std::optional<EtcdKeyValue> l = mirror_->Get(Key(round_dir + "leader"))) leader_id = l->value;
        const auto it = summary_to_.find(leader_id);
        if (it != summary_to_.end()) to = it->second;
      }
      const uint64_t connection = sender_->connections();
      if (!summary.empty() && !leader && to.second != 0 &&
          sender_->Send(to.first, static_cast<uint16_t>(to.second), mine, summary, 1.0, last_renewal).ok()) {
        last_leader_contact = Clock::now();  // a failed one: the next retries
        // The leader has this summary, and what it follows if that went on the same connection;
        // one that follows a summary sent on another connection is not whole there: the next is.
        uint64_t base = 0;
        const uint64_t number = SummaryNumber(summary, &base);
        std::lock_guard<std::mutex> lock(mu_);
        const bool whole = base == 0 || (sender_->connections() == connection && acked_.first == connection);
        acked_ = {sender_->connections(), whole ? number : 0};
      }
      if (leader) {
        std::vector<EtcdKeyValue> all;
        for (ReceivedSummary& r : summaries_->TakeSummaries(mine))
          for (std::string& frame : r.frames_pending) all.push_back({"summary of node " + r.node, std::move(frame)});
        std::lock_guard<std::mutex> lock(mu_);
        if (!own_summary_.empty()) all.push_back({"summary of node " + node_id_, own_summary_});
        acked_ = {0, SummaryNumber(own_summary_)};  // its own: the leader has each at once
        progress = std::move(all);
      }
    }
    // A follower connects to its leader as soon as it knows it, before its first summary: a node
    // lost early is then a connection closed, not a silence.
    if (in_round && !leader && !connected_to_leader_round_.has_value() && SecondsSince(last_hello) >= 1) {
      last_hello = Clock::now();
      std::pair<std::string, uint32_t> to;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (const std::optional<EtcdKeyValue> l = mirror_->Get(Key(round_dir + "leader"))) {
          const auto it = summary_to_.find(l->value);
          if (it != summary_to_.end() && l->value != node_id_) to = it->second;
        }
      }
      if (to.second != 0 && sender_->Connect(to.first, static_cast<uint16_t>(to.second), mine).ok()) {
        connected_to_leader_round_ = mine;
        last_leader_contact = Clock::now();
      }
    }
    if (connected_to_leader_round_ && *connected_to_leader_round_ != mine) connected_to_leader_round_.reset();
    summaries_->set_last_renewal(last_renewal);
    std::string cut_off;
    if (in_round && nodes.size() > 1 && (!isolated_round_ || *isolated_round_ != mine))
      cut_off = CutOff(mine, leader, nodes.size(), SecondsSince(last_renewal), last_leader_contact);
    if (!cut_off.empty()) isolated_round_ = mine;
    const bool ready = mirror_->ready();
    reachable = reachable && mirror_->connected();
    std::optional<uint64_t> round;
    if (ready) {
      Result<uint64_t> r = MirroredRound();
      if (r.ok()) round = *r;
    }
    const std::optional<EtcdKeyValue> leader_kv = ready && in_round ? mirror_->Get(Key(round_dir + "leader")) : std::nullopt;
    // No leader yet: the node of group rank 0 takes it at once; the others only when it has been
    // missing for a lease (that node is gone), so the leader is predictable. A leader that was
    // there and is gone (its lease ran out, or it left) is replaced at once, by whoever is first:
    // the new one follows the round's entries and names the old one lost, if it was.
    if (ready && in_round && leader_seen_round_ && *leader_seen_round_ != mine) leader_seen_round_.reset();
    if (ready && in_round && !leader_kv) {
      if (leader_missing_since_ == Clock::time_point{}) leader_missing_since_ = Clock::now();
      if (my_group == 0 || leader_seen_round_ || SecondsSince(leader_missing_since_) >= config_.lease_seconds)
        client_->PutIfAbsent(Key(round_dir + "leader"), node_id_, lease_.load()).status().IgnoreError();
    } else if (ready && in_round) {
      leader_missing_since_ = Clock::time_point{};
      leader_seen_round_ = mine;
    }
    const bool now_leader = leader_kv && leader_kv->value == node_id_;
    // The leader's view of its round's entries: alive (nodes/, leased) or finished; and the nodes
    // its summary receiver shows gone, confirmed by a probe, without waiting for their leases.
    std::set<std::string> present, finished;
    std::map<std::string, std::string> gone;
    std::map<std::string, double> silent;
    if (leader && ready) {
      for (const char* dir : {"nodes/", "finished/"}) {
        const std::string prefix = Key(round_dir + dir);
        for (const EtcdKeyValue& kv : mirror_->Under(prefix)) {
          present.insert(kv.key.substr(prefix.size()));
          if (dir[0] == 'f') finished.insert(kv.key.substr(prefix.size()));
        }
      }
      gone = FindLostByStream(mine, nodes, finished, &silent);
    }
    bool refocus = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      news_.etcd_unreachable = !reachable;
      if (!cut_off.empty() && in_round_ && my_round_ == mine) news_.isolated = cut_off;
      if (!ready) continue;
      if (round && in_round && *round > mine) news_.round = *round;
      if (const std::optional<EtcdKeyValue> g = mirror_->Get(Key("give_up"))) news_.give_up = g->value;
      if (in_round && in_round_ && my_round_ == mine) {
        refocus = leader_ != now_leader;
        if (now_leader && !leader_) leading_since_ = Clock::now();
        leader_ = now_leader;
        news_.leader = leader_;
        if (progress)  // appended: the frames of a summary are merged in order, none skipped
          news_.progress.insert(news_.progress.end(), std::make_move_iterator(progress->begin()),
                                std::make_move_iterator(progress->end()));
        // Judged only once the mirror holds the entries (it follows them from the moment this
        // node leads).
        if (leader && !refocus) {
          for (const std::string& id : nodes) {
            const auto how = gone.find(id);
            if ((present.count(id) && how == gone.end()) || std::count(reported_lost_.begin(), reported_lost_.end(), id))
              continue;
            reported_lost_.push_back(id);
            news_.lost_nodes.push_back(id);
            if (how != gone.end() && present.count(id)) {
              news_.lost_how[id] = how->second;
              if (const auto q = silent.find(id); q != silent.end()) news_.lost_silent_seconds[id] = q->second;
            }
          }
        }
      }
    }
    if (refocus) Refocus();
  }
}

std::string Rendezvous::CutOff(uint64_t round, bool leader, size_t nodes, double since_renewal,
                               Clock::time_point last_leader_contact) {
  // The lease runs out `lease_seconds` after the last renewal; the others may then go on without
  // this node. Its ranks are stopped before: a margin of a renewal's interval (at most 1.5 s).
  const double interval = config_.lease_seconds / 3;
  const double margin = std::min(1.5, interval);
  if (since_renewal < config_.lease_seconds - margin) return "";
  const Clock::time_point mine = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                                    std::chrono::duration<double>(since_renewal));
  // Another node that renewed more than one renewal's interval (and some slack) after this one
  // last could reaches etcd where this one does not: in an outage of etcd, no node renews after
  // it began, and this node renewed at most an interval before that.
  const auto later = [&](Clock::time_point theirs) {
    return std::chrono::duration<double>(theirs - mine).count() > interval + 0.5;
  };
  const std::string etcd = "this node has not reached etcd for " + FormatSeconds(since_renewal) + " s (lease " +
                           FormatSeconds(config_.lease_seconds) + " s)";
  if (!leader) {
    const std::optional<Clock::time_point> theirs = sender_->leader_renewed();
    if (theirs && later(*theirs)) return etcd + " while the round's leader did since: the job will go on without it";
    if (SecondsSince(last_leader_contact) >= 2 * config_.progress_seconds)
      return etcd + ", nor the round's leader for " + FormatSeconds(SecondsSince(last_leader_contact)) + " s";
    return "";  // the leader is cut off from etcd as long: etcd is away for all, and back soon
  }
  size_t heard = 0, reach = 0;
  for (const ReceivedSummary& r : summaries_->Summaries(round, /*with_text=*/false)) {
    if (!r.connected || r.frames == 0 || SecondsSince(r.received) >= 3 * config_.progress_seconds) continue;
    ++heard;
    const Clock::time_point theirs = r.received - std::chrono::duration_cast<Clock::duration>(
                                                      std::chrono::duration<double>(r.etcd_age));
    reach += later(theirs) ? 1 : 0;
  }
  if (heard == 0) return etcd + ", nor heard from any of the round's " + std::to_string(nodes - 1) + " other nodes";
  if (2 * reach > heard)
    return etcd + " while " + std::to_string(reach) + " of the " + std::to_string(heard) +
           " nodes heard from did since: the job will go on without this node (its leader)";
  return "";
}

std::map<std::string, std::string> Rendezvous::FindLostByStream(uint64_t round, const std::vector<std::string>& nodes,
                                                                const std::set<std::string>& finished,
                                                                std::map<std::string, double>* silent) {
  std::map<std::string, std::string> out;
  // Summaries come every progress_seconds: twice that without one is a node to look at, once the
  // senders had the time to find a new leader.
  const double quiet = 2 * config_.progress_seconds;
  const double leading = SecondsSince(leading_since_);
  if (leading < quiet) return out;
  std::map<std::string, ReceivedSummary> got;
  for (ReceivedSummary& r : summaries_->Summaries(round, /*with_text=*/false)) got[r.node] = std::move(r);
  std::vector<std::string> suspects, why;
  std::vector<Clock::time_point> last_sign;  // the suspect's newest frame, or its connection's close
  std::vector<std::pair<std::string, uint16_t>> targets;
  for (const std::string& id : nodes) {
    if (id == node_id_ || finished.count(id)) continue;
    const auto it = got.find(id);
    std::string w;
    // Never heard of in this round: silent at least since this node leads it.
    const Clock::time_point sign = it == got.end() ? leading_since_ : std::max(it->second.received, it->second.closed);
    if (it == got.end()) {
      w = "it sent the leader no summary in " + FormatSeconds(leading) + " s";
    } else if (!it->second.connected) {
      w = "its summary connection to the leader closed";
    } else if (const double age = SecondsSince(it->second.received); age > quiet) {
      w = "it sent the leader no summary for " + FormatSeconds(age) + " s";
    } else {
      continue;
    }
    const auto p = probed_.find(id);
    if (p != probed_.end() && SecondsSince(p->second) < 0.5) continue;
    std::pair<std::string, uint32_t> to;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto t = summary_to_.find(id);
      if (t != summary_to_.end()) to = t->second;
    }
    if (to.second == 0) continue;  // an agent without a summary port: its lease decides
    suspects.push_back(id);
    why.push_back(std::move(w));
    last_sign.push_back(sign);
    targets.emplace_back(to.first, static_cast<uint16_t>(to.second));
  }
  if (suspects.empty()) return out;
  // A probe tells a node gone (nothing listens: refused; no machine: no answer) from one merely
  // late (its agent busy, its connection being made again).
  const std::vector<Status> probes = ProbeAll(targets, 0.5);
  for (size_t k = 0; k < suspects.size(); ++k) {
    probed_[suspects[k]] = Clock::now();
    if (!probes[k].ok()) {
      out[suspects[k]] = why[k] + ", and its agent did not accept a connection (" + probes[k].ToString() + ")";
      (*silent)[suspects[k]] = SecondsSince(last_sign[k]);  // after the probe: as of the verdict
    }
  }
  return out;
}

void Rendezvous::Leave(bool finished) {
  uint64_t round;
  bool in_round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    round = my_round_;
    in_round = in_round_;
    in_round_ = false;
  }
  if (watcher_.joinable()) watcher_.join();
  // Finished is not lost: the others must not restart the job when this node's lease ends.
  if (finished && in_round)
    client_->Put(Key("rounds/" + std::to_string(round) + "/finished/" + node_id_), "1").IgnoreError();
  client_->RevokeLease(lease_.load()).IgnoreError();
  // The last agent out removes the job's keys; one still in (its entry is leased) keeps them.
  // Agents are in the job's current round, or still in this node's (about to move): counted by
  // etcd, so a thousand agents leaving read no thousand entries each.
  Result<uint64_t> current = CurrentRound();
  if (!current.ok()) return;
  for (uint64_t r : {round, *current}) {
    Result<int64_t> left = client_->CountPrefix(Key("rounds/" + std::to_string(r) + "/nodes/"));
    if (!left.ok() || *left > 0) return;
  }
  client_->DeletePrefix(prefix_).status().IgnoreError();
}

}  // namespace lifeline::agent
