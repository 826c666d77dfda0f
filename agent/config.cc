#include "agent/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>

namespace lifeline::agent {

const char* ActionName(Action a) {
  switch (a) {
    case Action::kLog: return "log";
    case Action::kDump: return "dump";
    case Action::kRestart: return "restart";
    case Action::kRollback: return "rollback";
  }
  return "unknown";
}

const char* SkipDataName(RollbackConfig::SkipData s) {
  switch (s) {
    case RollbackConfig::SkipData::kNever: return "never";
    case RollbackConfig::SkipData::kOnRepeat: return "on_repeat";
    case RollbackConfig::SkipData::kAlways: return "always";
  }
  return "unknown";
}

namespace {

// The kinds whose policy may be rollback: faults of the training state, which older state cures
// (an sdc_suspect's is the state a corrupting machine left in one replica).
bool MayRollBack(const std::string& kind) { return kind == "non_finite" || kind == "spike" || kind == "sdc_suspect"; }

// The anomaly kinds a policy may name, in the order messages list them.
constexpr const char* kKinds[] = {"dead",      "hang",       "straggler", "slow_collective", "checkpoint",
                                  "node_lost", "non_finite", "spike",     "disagreement", "sdc_suspect"};

bool IsKnownKind(const std::string& kind) {
  for (const char* k : kKinds) {
    if (kind == k) return true;
  }
  return false;
}

std::string KindList() {
  std::string s;
  for (const char* k : kKinds) {
    if (!s.empty()) s += ", ";
    s += k;
  }
  return s;
}

bool ParseAction(const std::string& text, Action* out) {
  if (text == "log") *out = Action::kLog;
  else if (text == "dump") *out = Action::kDump;
  else if (text == "restart") *out = Action::kRestart;
  else if (text == "rollback") *out = Action::kRollback;
  else return false;
  return true;
}

std::string FormatDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// ---- Loading -------------------------------------------------------------------------------

// Walks the parsed document; every error names the file, the line and the dotted key path.
class YamlReader {
 public:
  explicit YamlReader(const std::string& path) : path_(path) {}

  Status Error(const YAML::Mark& mark, const std::string& key, const std::string& msg) const {
    std::string s = path_;
    // yaml-cpp counts lines from 0; a node built without a position (rare) has line -1.
    if (!mark.is_null() && mark.line >= 0) s += ":" + std::to_string(mark.line + 1);
    s += ": ";
    if (!key.empty()) s += key + ": ";
    s += msg;
    return Status::InvalidArgument(s);
  }

  // An empty value ("key:" with nothing after it) has no useful position of its own (yaml-cpp
  // places it where the next token starts, often the next line), so errors about it point at the key.
  static YAML::Mark MarkOf(const YAML::Node& value, const YAML::Node& key) {
    const YAML::Mark m = value.Mark();
    return (value.IsNull() || m.is_null() || m.line < 0) ? key.Mark() : m;
  }

  static std::string Describe(const YAML::Node& value) {
    switch (value.Type()) {
      case YAML::NodeType::Null: return "an empty value";
      case YAML::NodeType::Sequence: return "a list";
      case YAML::NodeType::Map: return "a map";
      case YAML::NodeType::Scalar: return "'" + value.Scalar() + "'";
      case YAML::NodeType::Undefined: break;
    }
    return "nothing";
  }

  // Calls `fn(key_name, key_node, value_node)` for each entry of the map `node`, rejecting
  // non-string keys and duplicates (yaml-cpp keeps both; the second would silently win).
  Status ForEachEntry(const YAML::Node& node, const std::string& prefix,
                      const std::function<Status(const std::string&, const YAML::Node&, const YAML::Node&)>& fn) const {
    std::set<std::string> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      // Copies: the iterator's pair is a temporary, and a Node is a cheap handle.
      const YAML::Node k = it->first;
      const YAML::Node v = it->second;
      if (!k.IsScalar()) return Error(k.Mark(), prefix, "keys must be plain names, got " + Describe(k));
      const std::string name = k.Scalar();
      const std::string full = prefix.empty() ? name : prefix + "." + name;
      if (!seen.insert(name).second) return Error(k.Mark(), full, "duplicate key");
      LL_RETURN_IF_ERROR(fn(name, k, v));
    }
    return Status::OK();
  }

  Status Double(const YAML::Node& k, const YAML::Node& v, const std::string& key, double* out) const {
    if (!v.IsScalar()) return Error(MarkOf(v, k), key, "expected a number, got " + Describe(v));
    const std::string& text = v.Scalar();
    double d = 0;
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(text.data(), end, d);
    // from_chars accepts "inf" and "nan"; neither is a meaningful duration or ratio.
    if (ec != std::errc() || p != end || !std::isfinite(d)) {
      return Error(MarkOf(v, k), key, "expected a number, got '" + text + "'");
    }
    *out = d;
    return Status::OK();
  }

  Status Unsigned(const YAML::Node& k, const YAML::Node& v, const std::string& key, uint64_t max,
                  uint64_t* out) const {
    if (!v.IsScalar()) return Error(MarkOf(v, k), key, "expected a non-negative integer, got " + Describe(v));
    const std::string& text = v.Scalar();
    if (!text.empty() && text[0] == '-') {
      return Error(MarkOf(v, k), key, "must not be negative, got '" + text + "'");
    }
    uint64_t n = 0;
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(text.data(), end, n);
    if (ec == std::errc::result_out_of_range || (ec == std::errc() && p == end && n > max)) {
      return Error(MarkOf(v, k), key, "'" + text + "' is larger than " + std::to_string(max));
    }
    if (ec != std::errc() || p != end) {
      return Error(MarkOf(v, k), key, "expected a non-negative integer, got '" + text + "'");
    }
    *out = n;
    return Status::OK();
  }

  Status U32(const YAML::Node& k, const YAML::Node& v, const std::string& key, uint32_t* out) const {
    uint64_t n = 0;
    LL_RETURN_IF_ERROR(Unsigned(k, v, key, std::numeric_limits<uint32_t>::max(), &n));
    *out = static_cast<uint32_t>(n);
    return Status::OK();
  }

  Status U64(const YAML::Node& k, const YAML::Node& v, const std::string& key, uint64_t* out) const {
    return Unsigned(k, v, key, std::numeric_limits<uint64_t>::max(), out);
  }

  // YAML 1.1's booleans, as yaml-cpp reads them: true/false, yes/no, on/off (any case).
  Status Bool(const YAML::Node& k, const YAML::Node& v, const std::string& key, bool* out) const {
    bool b = false;
    if (!v.IsScalar() || !YAML::convert<bool>::decode(v, b)) {
      return Error(MarkOf(v, k), key, "expected true or false, got " + Describe(v));
    }
    *out = b;
    return Status::OK();
  }

  // "key:" with no value means the empty string: the natural way to write "none" for an address
  // or a file.
  Status String(const YAML::Node& k, const YAML::Node& v, const std::string& key, std::string* out) const {
    if (v.IsNull()) {
      out->clear();
      return Status::OK();
    }
    if (!v.IsScalar()) return Error(MarkOf(v, k), key, "expected a string, got " + Describe(v));
    *out = v.Scalar();
    return Status::OK();
  }

  Status StringList(const YAML::Node& k, const YAML::Node& v, const std::string& key,
                    std::vector<std::string>* out) const {
    if (!v.IsSequence()) return Error(MarkOf(v, k), key, "expected a list of strings, got " + Describe(v));
    std::vector<std::string> items;
    for (size_t i = 0; i < v.size(); ++i) {
      const YAML::Node item = v[i];
      if (!item.IsScalar()) {
        return Error(MarkOf(item, k), key + "[" + std::to_string(i) + "]",
                     "expected a string, got " + Describe(item));
      }
      items.push_back(item.Scalar());
    }
    *out = std::move(items);
    return Status::OK();
  }

  // A group such as "hang:"; an empty group is allowed and changes nothing.
  Status Group(const YAML::Node& k, const YAML::Node& v, const std::string& name,
               const std::function<Status(const std::string&, const YAML::Node&, const YAML::Node&)>& fn) const {
    if (v.IsNull()) return Status::OK();
    if (!v.IsMap()) return Error(MarkOf(v, k), name, "expected a map of " + name + " settings, got " + Describe(v));
    return ForEachEntry(v, name, fn);
  }

  Status UnknownKey(const YAML::Node& k, const std::string& key) const {
    return Error(k.Mark(), key, "unknown key");
  }

 private:
  std::string path_;
};

Status ReadDocument(const YamlReader& r, const YAML::Node& root, AgentConfig* c) {
  using Node = YAML::Node;
  return r.ForEachEntry(root, "", [&](const std::string& name, const Node& k, const Node& v) -> Status {
    if (name == "nproc") return r.U32(k, v, name, &c->nproc);
    if (name == "command") return r.StringList(k, v, name, &c->command);
    if (name == "metrics_addr") return r.String(k, v, name, &c->metrics_addr);
    if (name == "events_log") return r.String(k, v, name, &c->events_log);
    if (name == "run_dir") return r.String(k, v, name, &c->run_dir);
    if (name == "job_id") return r.String(k, v, name, &c->job_id);
    if (name == "checkpoint_dir") return r.String(k, v, name, &c->checkpoint_dir);
    if (name == "master_addr") return r.String(k, v, name, &c->master_addr);
    if (name == "master_port") return r.U32(k, v, name, &c->master_port);
    if (name == "ring_events") return r.U64(k, v, name, &c->ring_events);
    if (name == "poll_interval_seconds") return r.Double(k, v, name, &c->poll_interval_seconds);
    if (name == "dump_events") return r.U32(k, v, name, &c->dump_events);
    if (name == "exit_hang_seconds") return r.Double(k, v, name, &c->exit_hang_seconds);
    if (name == "python_tracing") return r.Bool(k, v, name, &c->python_tracing);
    if (name == "python_step_from") return r.String(k, v, name, &c->python_step_from);

    if (name == "hang") {
      HangConfig& h = c->hang;
      return r.Group(k, v, name, [&](const std::string& f, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + f;
        if (f == "floor_seconds") return r.Double(fk, fv, key, &h.floor_seconds);
        if (f == "cap_seconds") return r.Double(fk, fv, key, &h.cap_seconds);
        if (f == "multiplier") return r.Double(fk, fv, key, &h.multiplier);
        if (f == "window") return r.U32(fk, fv, key, &h.window);
        return r.UnknownKey(fk, key);
      });
    }
    if (name == "straggler") {
      StragglerConfig& s = c->straggler;
      return r.Group(k, v, name, [&](const std::string& f, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + f;
        if (f == "window") return r.U32(fk, fv, key, &s.window);
        if (f == "min_lateness_seconds") return r.Double(fk, fv, key, &s.min_lateness_seconds);
        if (f == "mad_threshold") return r.Double(fk, fv, key, &s.mad_threshold);
        if (f == "min_fraction") return r.Double(fk, fv, key, &s.min_fraction);
        if (f == "cooldown_seconds") return r.Double(fk, fv, key, &s.cooldown_seconds);
        return r.UnknownKey(fk, key);
      });
    }
    if (name == "slow_collective") {
      SlowCollectiveConfig& s = c->slow_collective;
      return r.Group(k, v, name, [&](const std::string& f, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + f;
        if (f == "baseline_window") return r.U32(fk, fv, key, &s.baseline_window);
        if (f == "recent_window") return r.U32(fk, fv, key, &s.recent_window);
        if (f == "factor") return r.Double(fk, fv, key, &s.factor);
        if (f == "min_excess_seconds") return r.Double(fk, fv, key, &s.min_excess_seconds);
        if (f == "cooldown_seconds") return r.Double(fk, fv, key, &s.cooldown_seconds);
        return r.UnknownKey(fk, key);
      });
    }
    if (name == "checkpoint") {
      CheckpointConfig& cp = c->checkpoint;
      return r.Group(k, v, name, [&](const std::string& f, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + f;
        if (f == "lag_factor") return r.Double(fk, fv, key, &cp.lag_factor);
        if (f == "lag_count") return r.U32(fk, fv, key, &cp.lag_count);
        if (f == "lag_min_seconds") return r.Double(fk, fv, key, &cp.lag_min_seconds);
        if (f == "cooldown_seconds") return r.Double(fk, fv, key, &cp.cooldown_seconds);
        return r.UnknownKey(fk, key);
      });
    }
    if (name == "training_signals") {
      TrainingSignalConfig& ts = c->training_signals;
      return r.Group(k, v, name, [&](const std::string& f, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + f;
        if (f == "watched") return r.StringList(fk, fv, key, &ts.watched);
        if (f == "non_finite_in_a_row") return r.U32(fk, fv, key, &ts.non_finite_in_a_row);
        if (f == "window") return r.U32(fk, fv, key, &ts.window);
        if (f == "warmup_steps") return r.U32(fk, fv, key, &ts.warmup_steps);
        if (f == "spike_threshold") return r.Double(fk, fv, key, &ts.spike_threshold);
        if (f == "spike_confirm") return r.U32(fk, fv, key, &ts.spike_confirm);
        if (f == "spike_single_threshold") return r.Double(fk, fv, key, &ts.spike_single_threshold);
        if (f == "spike_min_rise") return r.Double(fk, fv, key, &ts.spike_min_rise);
        if (f == "spread_floor") return r.Double(fk, fv, key, &ts.spread_floor);
        if (f == "replicated") return r.StringList(fk, fv, key, &ts.replicated);
        if (f == "replica_group_size") return r.U32(fk, fv, key, &ts.replica_group_size);
        if (f == "hold_seconds") return r.Double(fk, fv, key, &ts.hold_seconds);
        return r.UnknownKey(fk, key);
      });
    }
    if (name == "restart") {
      RestartConfig& rs = c->restart;
      return r.Group(k, v, name, [&](const std::string& f, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + f;
        if (f == "max_restarts") return r.U32(fk, fv, key, &rs.max_restarts);
        if (f == "grace_seconds") return r.Double(fk, fv, key, &rs.grace_seconds);
        if (f == "backoff_initial_seconds") return r.Double(fk, fv, key, &rs.backoff_initial_seconds);
        if (f == "backoff_multiplier") return r.Double(fk, fv, key, &rs.backoff_multiplier);
        if (f == "backoff_max_seconds") return r.Double(fk, fv, key, &rs.backoff_max_seconds);
        if (f == "prestart") return r.Bool(fk, fv, key, &rs.prestart);
        if (f == "prestart_after_seconds") return r.Double(fk, fv, key, &rs.prestart_after_seconds);
        return r.UnknownKey(fk, key);
      });
    }
    if (name == "rollback") {
      RollbackConfig& rb = c->rollback;
      return r.Group(k, v, name, [&](const std::string& f, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + f;
        if (f == "max_per_checkpoint") return r.U32(fk, fv, key, &rb.max_per_checkpoint);
        if (f == "sdc_per_node") return r.U32(fk, fv, key, &rb.sdc_per_node);
        if (f == "skip_data") {
          // true and false as YAML spells them, or the three words.
          const std::string t = fv.IsScalar() ? fv.Scalar() : "";
          if (t == "never" || t == "false" || t == "no" || t == "off") rb.skip_data = RollbackConfig::SkipData::kNever;
          else if (t == "on_repeat") rb.skip_data = RollbackConfig::SkipData::kOnRepeat;
          else if (t == "always" || t == "true" || t == "yes" || t == "on") rb.skip_data = RollbackConfig::SkipData::kAlways;
          else return r.Error(YamlReader::MarkOf(fv, fk), key,
                              "expected never, on_repeat or always (false, true), got " + YamlReader::Describe(fv));
          return Status::OK();
        }
        return r.UnknownKey(fk, key);
      });
    }
    if (name == "replication") {
      ReplicationConfig& rp = c->replication;
      return r.Group(k, v, name, [&](const std::string& f, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + f;
        if (f == "enabled") return r.Bool(fk, fv, key, &rp.enabled);
        if (f == "bandwidth_mb_per_second") return r.Double(fk, fv, key, &rp.bandwidth_mb_per_second);
        if (f == "keep_last") return r.U32(fk, fv, key, &rp.keep_last);
        if (f == "memory_budget_mb") return r.Double(fk, fv, key, &rp.memory_budget_mb);
        if (f == "group_size") return r.U32(fk, fv, key, &rp.group_size);
        return r.UnknownKey(fk, key);
      });
    }
    if (name == "rendezvous") {
      RendezvousSettings& z = c->rendezvous;
      return r.Group(k, v, name, [&](const std::string& f, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + f;
        if (f == "endpoint") return r.String(fk, fv, key, &z.endpoint);
        if (f == "id") return r.String(fk, fv, key, &z.id);
        if (f == "min_nodes") return r.U32(fk, fv, key, &z.min_nodes);
        if (f == "max_nodes") return r.U32(fk, fv, key, &z.max_nodes);
        if (f == "host") return r.String(fk, fv, key, &z.host);
        if (f == "node_name") return r.String(fk, fv, key, &z.node_name);
        if (f == "standby") return r.Bool(fk, fv, key, &z.standby);
        if (f == "exclude_after") return r.U32(fk, fv, key, &z.exclude_after);
        if (f == "exclude_window_seconds") return r.Double(fk, fv, key, &z.exclude_window_seconds);
        if (f == "lease_seconds") return r.Double(fk, fv, key, &z.lease_seconds);
        if (f == "last_call_seconds") return r.Double(fk, fv, key, &z.last_call_seconds);
        if (f == "join_timeout_seconds") return r.Double(fk, fv, key, &z.join_timeout_seconds);
        if (f == "watch") return r.Bool(fk, fv, key, &z.watch);
        if (f == "failure_grace_seconds") return r.Double(fk, fv, key, &z.failure_grace_seconds);
        return r.UnknownKey(fk, key);
      });
    }
    if (name == "policy") {
      return r.Group(k, v, name, [&](const std::string& kind, const Node& fk, const Node& fv) -> Status {
        const std::string key = name + "." + kind;
        if (!IsKnownKind(kind)) {
          return r.Error(fk.Mark(), key, "unknown anomaly kind '" + kind + "' (expected one of " + KindList() + ")");
        }
        if (!fv.IsScalar()) {
          return r.Error(YamlReader::MarkOf(fv, fk), key,
                         "expected an action (log, dump, restart or rollback), got " + YamlReader::Describe(fv));
        }
        Action a;
        if (!ParseAction(fv.Scalar(), &a)) {
          return r.Error(fv.Mark(), key, "unknown action '" + fv.Scalar() + "' (expected log, dump, restart or rollback)");
        }
        if (a == Action::kRollback && !MayRollBack(kind)) {
          return r.Error(fv.Mark(), key, "rollback is for non_finite, spike and sdc_suspect only: a " + kind +
                                             " anomaly is not cured by older training state (use restart)");
        }
        c->policy[kind] = a;
        return Status::OK();
      });
    }
    return r.UnknownKey(k, name);
  });
}

// Where the documents of a YAML stream start, without building them. yaml-cpp 0.7's LoadAll never
// returns for some malformed input: a ',' outside a flow collection is never consumed, so each
// parse yields another empty document at the same place, and memory grows until bad_alloc.
class DocumentStarts : public YAML::EventHandler {
 public:
  const std::vector<YAML::Mark>& starts() const { return starts_; }
  void OnDocumentStart(const YAML::Mark& mark) override { starts_.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  std::vector<YAML::Mark> starts_;
};

}  // namespace

Status LoadAgentConfig(const std::string& path, AgentConfig* config) {
  // Read the file ourselves so a missing or unreadable file gets errno's verdict (NotFound for
  // ENOENT), not yaml-cpp's generic BadFile exception.
  std::string text;
  {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, path);
    if (S_ISDIR(st.st_mode)) return Status::InvalidArgument(path, "is a directory, not a YAML file");
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::FromErrno(errno != 0 ? errno : EACCES, path);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) return Status::IOError(path, "read failed");
    text = ss.str();
  }

  const YamlReader reader(path);
  // yaml-cpp reports through exceptions; none may leave this function.
  try {
    // At most two documents are looked at: enough to refuse a second one, and bounded (see
    // DocumentStarts).
    DocumentStarts documents;
    {
      std::istringstream in(text);
      YAML::Parser parser(in);
      while (documents.starts().size() < 2 && parser.HandleNextDocument(documents)) {
      }
    }
    if (documents.starts().size() > 1) {
      const YAML::Mark& second = documents.starts()[1];
      if (second.pos == documents.starts()[0].pos && static_cast<size_t>(second.pos) < text.size())
        return reader.Error(second, "", "YAML syntax error: unexpected '" + text.substr(second.pos, 1) + "'");
      return reader.Error(second, "", "more than one YAML document; the agent reads one");
    }
    const YAML::Node root = YAML::Load(text);
    if (root.IsNull()) return Status::OK();  // an empty file changes nothing
    if (!root.IsMap()) {
      return reader.Error(root.Mark(), "", "expected a map of settings at the top level, got " +
                                               YamlReader::Describe(root));
    }
    // Work on a copy so that a file with an error leaves `config` exactly as it was.
    AgentConfig updated = *config;
    LL_RETURN_IF_ERROR(ReadDocument(reader, root, &updated));
    *config = std::move(updated);
    return Status::OK();
  } catch (const YAML::ParserException& e) {
    return reader.Error(e.mark, "", "YAML syntax error: " + e.msg);
  } catch (const YAML::Exception& e) {
    return reader.Error(e.mark, "", e.msg);
  }
}

// ---- Validation ----------------------------------------------------------------------------
//
// Bounds, and why:
//   nproc                      1..1024 local ranks (more is certainly a typo on one machine)
//   command                    non-empty, and the program name is not ""
//   master_addr                non-empty; master_port 0..65535 (0: pick a free port)
//   metrics_addr               empty, or HOST:PORT / [IPV6]:PORT with a non-empty host, port 0..65535
//   ring_events                64..2^30 per rank (the ring's own limits: rounded up to a power of
//                              two, at least 64; a reader refuses more than 2^30; 64 bytes each)
//   poll_interval_seconds      (0, 1]: slower polling would make the rings overflow and the
//                              detectors late
//   dump_events                >= 1
//   exit_hang_seconds          >= 0 (0: never)
//   rendezvous                 an endpoint (HOST:PORT) needs an id without '/'; 1 <= min_nodes <=
//                              max_nodes; more than one node needs an endpoint; lease 2..3600 s
//                              (etcd's own minimum TTL is a few seconds); exclude_window > 0; a
//                              node_name without '/'
//   python_step_from           empty, "optimizer" or "none"
//   hang                       0 < floor <= cap, multiplier >= 1, window >= 1
//   straggler                  window >= 3 (a "share of the window" needs a few samples),
//                              min_lateness >= 0, mad_threshold > 0, min_fraction in (0, 1],
//                              cooldown >= 0
//   slow_collective            baseline_window >= 1, recent_window >= 1, factor >= 1,
//                              min_excess >= 0, cooldown >= 0
//   checkpoint                 lag_factor > 0, lag_count >= 1, lag_min >= 0, cooldown >= 0
//   training_signals           window >= 3, non_finite_in_a_row >= 1, spike_confirm >= 1,
//                              0 < spike_threshold <= spike_single_threshold, spike_min_rise >= 0,
//                              spread_floor >= 0, hold >= 0
//   restart                    grace >= 0, backoff_initial >= 0, backoff_multiplier >= 1,
//                              backoff_max >= backoff_initial, prestart_after >= 0
//   rollback                   max_per_checkpoint >= 1
//   policy                     an action for every known kind and no other kind; rollback for
//                              non_finite, spike and sdc_suspect only
// Every duration is at most kMaxSeconds, so converting it to nanoseconds cannot overflow.
// Comparisons are written so that NaN fails them (a value can come from the command line).

namespace {

constexpr double kMaxSeconds = 1e7;  // about 116 days

Status Bad(const std::string& field, const std::string& rule, const std::string& got) {
  return Status::InvalidArgument(field + ": must be " + rule + ", got " + got);
}

Status CheckSeconds(const std::string& field, double v, bool allow_zero) {
  const bool ok = allow_zero ? (v >= 0 && v <= kMaxSeconds) : (v > 0 && v <= kMaxSeconds);
  if (!ok) {
    return Bad(field, std::string(allow_zero ? ">= 0" : "> 0") + " and <= " + FormatDouble(kMaxSeconds) + " seconds",
               FormatDouble(v));
  }
  return Status::OK();
}

Status CheckAtLeast(const std::string& field, double v, double min) {
  if (!(v >= min && std::isfinite(v))) return Bad(field, ">= " + FormatDouble(min), FormatDouble(v));
  return Status::OK();
}

Status CheckCountAtLeast(const std::string& field, uint64_t v, uint64_t min) {
  if (v < min) return Bad(field, ">= " + std::to_string(min), std::to_string(v));
  return Status::OK();
}

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
  }
  return true;
}

Status CheckHostPort(const std::string& field, const std::string& addr) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(field + ": '" + addr + "' is not HOST:PORT (" + why + ")");
  };
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return bad("no ':PORT'");
  const std::string host = addr.substr(0, colon);
  const std::string port = addr.substr(colon + 1);
  if (host.empty()) return bad("the host is empty; use 0.0.0.0 for every interface");
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad("unterminated '[' in the host");
  } else if (host.find(':') != std::string::npos) {
    return bad("write an IPv6 address as [ADDRESS]:PORT");
  }
  for (char ch : host) {
    if (ch == ' ' || ch == '\t' || ch == '/') return bad("the host contains '" + std::string(1, ch) + "'");
  }
  if (!AllDigits(port) || port.size() > 5 || std::stoul(port) > 65535) return bad("the port must be 0..65535");
  return Status::OK();
}

}  // namespace

Status ValidateAgentConfig(const AgentConfig& c) {
  if (c.nproc < 1 || c.nproc > 1024) return Bad("nproc", "1..1024", std::to_string(c.nproc));
  if (c.command.empty()) return Status::InvalidArgument("command: no command to run (give it after \"--\")");
  if (c.command[0].empty()) return Status::InvalidArgument("command: the program name is empty");
  if (c.master_addr.empty()) return Status::InvalidArgument("master_addr: must not be empty");
  if (c.master_port > 65535) return Bad("master_port", "0..65535", std::to_string(c.master_port));
  const RendezvousSettings& z = c.rendezvous;
  if (!z.endpoint.empty()) {
    LL_RETURN_IF_ERROR(CheckHostPort("rendezvous.endpoint", z.endpoint.rfind("http://", 0) == 0 ? z.endpoint.substr(7) : z.endpoint));
    if (z.id.empty()) return Status::InvalidArgument("rendezvous.id: a job id is required with an endpoint (--rdzv-id)");
    if (z.id.find('/') != std::string::npos) return Status::InvalidArgument("rendezvous.id: must not contain '/'");
  }
  if (z.min_nodes < 1 || z.max_nodes < z.min_nodes || z.max_nodes > 100000)
    return Bad("rendezvous.min_nodes/max_nodes", "1 <= min <= max <= 100000",
               std::to_string(z.min_nodes) + ":" + std::to_string(z.max_nodes));
  if (z.endpoint.empty() && z.max_nodes > 1)
    return Status::InvalidArgument("rendezvous: more than one node needs an etcd endpoint (--rdzv-endpoint)");
  if (!(z.lease_seconds >= 2 && z.lease_seconds <= 3600)) return Bad("rendezvous.lease_seconds", "2..3600", FormatDouble(z.lease_seconds));
  if (!(z.last_call_seconds >= 0 && z.last_call_seconds <= 3600))
    return Bad("rendezvous.last_call_seconds", "0..3600", FormatDouble(z.last_call_seconds));
  if (!(z.join_timeout_seconds > 0)) return Bad("rendezvous.join_timeout_seconds", "> 0", FormatDouble(z.join_timeout_seconds));
  if (!(z.failure_grace_seconds >= 0 && z.failure_grace_seconds <= 60))
    return Bad("rendezvous.failure_grace_seconds", "0..60", FormatDouble(z.failure_grace_seconds));
  LL_RETURN_IF_ERROR(CheckSeconds("rendezvous.exclude_window_seconds", z.exclude_window_seconds, /*allow_zero=*/false));
  if (z.node_name.find('/') != std::string::npos)
    return Status::InvalidArgument("rendezvous.node_name: must not contain '/', got '" + z.node_name + "'");
  if (z.standby && z.endpoint.empty())
    return Status::InvalidArgument("rendezvous.standby: a spare node needs an etcd endpoint (--rdzv-endpoint)");
  const ReplicationConfig& rp = c.replication;
  if (!(rp.bandwidth_mb_per_second >= 0 && std::isfinite(rp.bandwidth_mb_per_second)))
    return Bad("replication.bandwidth_mb_per_second", ">= 0", FormatDouble(rp.bandwidth_mb_per_second));
  if (rp.keep_last < 1) return Bad("replication.keep_last", ">= 1", std::to_string(rp.keep_last));
  if (rp.group_size == 1 || rp.group_size > 64)
    return Bad("replication.group_size", "0 (a ring) or 2 to 64", std::to_string(rp.group_size));
  if (!(rp.memory_budget_mb >= 0 && std::isfinite(rp.memory_budget_mb)))
    return Bad("replication.memory_budget_mb", ">= 0", FormatDouble(rp.memory_budget_mb));
  if (!c.metrics_addr.empty()) LL_RETURN_IF_ERROR(CheckHostPort("metrics_addr", c.metrics_addr));
  if (c.ring_events < 64 || c.ring_events > (uint64_t{1} << 30)) {
    return Bad("ring_events", "64..1073741824", std::to_string(c.ring_events));
  }
  if (!(c.poll_interval_seconds > 0 && c.poll_interval_seconds <= 1)) {
    return Bad("poll_interval_seconds", "> 0 and <= 1", FormatDouble(c.poll_interval_seconds));
  }
  LL_RETURN_IF_ERROR(CheckCountAtLeast("dump_events", c.dump_events, 1));
  LL_RETURN_IF_ERROR(CheckSeconds("exit_hang_seconds", c.exit_hang_seconds, /*allow_zero=*/true));
  if (!c.python_step_from.empty() && c.python_step_from != "optimizer" && c.python_step_from != "none") {
    return Bad("python_step_from", "\"optimizer\" or \"none\"", "'" + c.python_step_from + "'");
  }

  const HangConfig& h = c.hang;
  LL_RETURN_IF_ERROR(CheckSeconds("hang.floor_seconds", h.floor_seconds, /*allow_zero=*/false));
  LL_RETURN_IF_ERROR(CheckSeconds("hang.cap_seconds", h.cap_seconds, false));
  if (h.floor_seconds > h.cap_seconds) {
    return Status::InvalidArgument("hang.floor_seconds: " + FormatDouble(h.floor_seconds) +
                                   " is above hang.cap_seconds " + FormatDouble(h.cap_seconds));
  }
  LL_RETURN_IF_ERROR(CheckAtLeast("hang.multiplier", h.multiplier, 1));
  LL_RETURN_IF_ERROR(CheckCountAtLeast("hang.window", h.window, 1));

  const StragglerConfig& s = c.straggler;
  LL_RETURN_IF_ERROR(CheckCountAtLeast("straggler.window", s.window, 3));
  LL_RETURN_IF_ERROR(CheckSeconds("straggler.min_lateness_seconds", s.min_lateness_seconds, true));
  if (!(s.mad_threshold > 0 && std::isfinite(s.mad_threshold))) {
    return Bad("straggler.mad_threshold", "> 0", FormatDouble(s.mad_threshold));
  }
  if (!(s.min_fraction > 0 && s.min_fraction <= 1)) {
    return Bad("straggler.min_fraction", "> 0 and <= 1", FormatDouble(s.min_fraction));
  }
  LL_RETURN_IF_ERROR(CheckSeconds("straggler.cooldown_seconds", s.cooldown_seconds, true));

  const SlowCollectiveConfig& sc = c.slow_collective;
  LL_RETURN_IF_ERROR(CheckCountAtLeast("slow_collective.baseline_window", sc.baseline_window, 1));
  LL_RETURN_IF_ERROR(CheckCountAtLeast("slow_collective.recent_window", sc.recent_window, 1));
  LL_RETURN_IF_ERROR(CheckAtLeast("slow_collective.factor", sc.factor, 1));
  LL_RETURN_IF_ERROR(CheckSeconds("slow_collective.min_excess_seconds", sc.min_excess_seconds, true));
  LL_RETURN_IF_ERROR(CheckSeconds("slow_collective.cooldown_seconds", sc.cooldown_seconds, true));

  const CheckpointConfig& cp = c.checkpoint;
  if (!(cp.lag_factor > 0 && std::isfinite(cp.lag_factor))) {
    return Bad("checkpoint.lag_factor", "> 0", FormatDouble(cp.lag_factor));
  }
  LL_RETURN_IF_ERROR(CheckCountAtLeast("checkpoint.lag_count", cp.lag_count, 1));
  LL_RETURN_IF_ERROR(CheckSeconds("checkpoint.lag_min_seconds", cp.lag_min_seconds, true));
  LL_RETURN_IF_ERROR(CheckSeconds("checkpoint.cooldown_seconds", cp.cooldown_seconds, true));

  const TrainingSignalConfig& ts = c.training_signals;
  LL_RETURN_IF_ERROR(CheckCountAtLeast("training_signals.window", ts.window, 3));
  LL_RETURN_IF_ERROR(CheckCountAtLeast("training_signals.non_finite_in_a_row", ts.non_finite_in_a_row, 1));
  LL_RETURN_IF_ERROR(CheckCountAtLeast("training_signals.spike_confirm", ts.spike_confirm, 1));
  if (!(ts.spike_threshold > 0 && std::isfinite(ts.spike_threshold))) {
    return Bad("training_signals.spike_threshold", "> 0", FormatDouble(ts.spike_threshold));
  }
  if (!(ts.spike_single_threshold >= ts.spike_threshold && std::isfinite(ts.spike_single_threshold))) {
    return Bad("training_signals.spike_single_threshold", ">= spike_threshold", FormatDouble(ts.spike_single_threshold));
  }
  if (!(ts.spike_min_rise >= 0 && std::isfinite(ts.spike_min_rise))) {
    return Bad("training_signals.spike_min_rise", ">= 0", FormatDouble(ts.spike_min_rise));
  }
  if (!(ts.spread_floor >= 0 && std::isfinite(ts.spread_floor))) {
    return Bad("training_signals.spread_floor", ">= 0", FormatDouble(ts.spread_floor));
  }
  LL_RETURN_IF_ERROR(CheckSeconds("training_signals.hold_seconds", ts.hold_seconds, true));

  const RestartConfig& r = c.restart;
  LL_RETURN_IF_ERROR(CheckSeconds("restart.grace_seconds", r.grace_seconds, true));
  LL_RETURN_IF_ERROR(CheckSeconds("restart.backoff_initial_seconds", r.backoff_initial_seconds, true));
  LL_RETURN_IF_ERROR(CheckSeconds("restart.prestart_after_seconds", r.prestart_after_seconds, true));
  LL_RETURN_IF_ERROR(CheckAtLeast("restart.backoff_multiplier", r.backoff_multiplier, 1));
  LL_RETURN_IF_ERROR(CheckSeconds("restart.backoff_max_seconds", r.backoff_max_seconds, true));
  if (r.backoff_max_seconds < r.backoff_initial_seconds) {
    return Status::InvalidArgument("restart.backoff_max_seconds: " + FormatDouble(r.backoff_max_seconds) +
                                   " is below restart.backoff_initial_seconds " +
                                   FormatDouble(r.backoff_initial_seconds));
  }

  LL_RETURN_IF_ERROR(CheckCountAtLeast("rollback.max_per_checkpoint", c.rollback.max_per_checkpoint, 1));

  for (const auto& [kind, action] : c.policy) {
    if (!IsKnownKind(kind)) {
      return Status::InvalidArgument("policy." + kind + ": unknown anomaly kind (expected one of " + KindList() + ")");
    }
    if (action != Action::kLog && action != Action::kDump && action != Action::kRestart && action != Action::kRollback) {
      return Status::InvalidArgument("policy." + kind + ": not a known action");
    }
    if (action == Action::kRollback && !MayRollBack(kind)) {
      return Status::InvalidArgument("policy." + kind + ": rollback is for non_finite, spike and sdc_suspect only (use restart)");
    }
  }
  for (const char* kind : kKinds) {
    if (c.policy.count(kind) == 0) return Status::InvalidArgument(std::string("policy.") + kind + ": no action given");
  }
  return Status::OK();
}

}  // namespace lifeline::agent
