#include "agent/supervisor.h"

#include <sys/wait.h>

#include <csignal>

#include <algorithm>
#include <cmath>
#include <utility>

#include "agent/detectors/echo.h"
#include "agent/detectors/evidence.h"
#include "agent/launcher.h"

namespace lifeline::agent {
namespace {

using detail::Seconds;

uint64_t Nanos(double seconds) { return static_cast<uint64_t>(seconds * 1e9); }

// The suffix of an ordinal number: 1st, 2nd, 3rd, 4th, 11th, 21st.
const char* Ordinal(uint32_t n) {
  if (n % 100 >= 11 && n % 100 <= 13) return "th";
  return n % 10 == 1 ? "st" : n % 10 == 2 ? "nd" : n % 10 == 3 ? "rd" : "th";
}

}  // namespace

Supervisor::Supervisor(const AgentConfig& config, Surroundings* around, std::string node_id, double publish_seconds)
    : config_(config),
      around_(around),
      node_id_(std::move(node_id)),
      publish_ns_(Nanos(publish_seconds)),
      detectors_(MakeDetectors(config)),
      rollbacks_(config.rollback),
      timeline_(std::max<size_t>(Timeline::kDefaultSavesKept, config.checkpoint.lag_count + size_t{8})) {
  for (auto& d : detectors_)
    if (auto* r = dynamic_cast<ReplicaDigestDetector*>(d.get())) digests_ = r;
    else if (auto* t = dynamic_cast<TrainingSignalDetector*>(d.get())) signals_ = t;
}

Supervisor::~Supervisor() = default;

void Supervisor::Launched(const SupervisedLaunch& launch) {
  world_ = launch.world;
  rank_base_ = launch.rank_base;
  restart_ = launch.restart;
  launched_ns_ = launch.now_ns;
  plan_ = launch.plan;
  timeline_.Reset(world_, rank_base_);  // the detectors name global ranks
  for (auto& d : detectors_) d->Reset(world_);
  if (job_view_ != nullptr && plan_) job_view_->Reset(static_cast<int>(plan_->world_size));
  merger_.Clear();
  summary_cursors_.clear();  // a new launch numbers its collectives afresh
  // Across nodes the leader compares the replicas' digests; a node alone, its own ranks'.
  if (digests_ != nullptr) digests_->set_folding(MultiNode());
  // ...and the values of a replica group that spans nodes, those of its own.
  if (signals_ != nullptr) signals_->set_job_world(MultiNode() ? static_cast<int>(plan_->world_size) : 0);
  job_signals_.reset();
  digest_out_.clear();
  digest_cursors_.clear();
  answered_.clear();
  job_digests_.reset();
  wait_status_.assign(static_cast<size_t>(world_), 0);
  exited_.assign(static_cast<size_t>(world_), false);
  exited_ns_.assign(static_cast<size_t>(world_), 0);
  exit_hung_.assign(static_cast<size_t>(world_), false);
  named_.clear();
  held_.reset();
  spread_.reset();
  spread_raised_ = false;
  ledger_.Launched(world_, launch.now_ns);
  if (MultiNode()) multi_node_job_ = true;
}

std::string Supervisor::NodeOfRank(int global) const {
  if (plan_) {
    for (size_t g = 0; g < plan_->nodes.size(); ++g) {
      const std::vector<int> ranks = plan_->RanksOf(static_cast<int>(g));
      if (std::find(ranks.begin(), ranks.end(), global) != ranks.end()) return plan_->nodes[g].Name();
    }
    return "";
  }
  return config_.rendezvous.node_name;
}

void Supervisor::RecordFault(const Anomaly& reason, uint64_t now_ns) {
  // When the fault happened: a death when its exit was seen; a hang or a stuck exit when the
  // culprits last said anything; a lost node when the leader last heard of it (found by its summary
  // stream: its newest summary or its connection's close), or a lease before its loss was named
  // (found by its lease: it renewed last then). Issue 50: a loss named within a second was
  // accounted 10 s of detection, the lease, where the leader had measured it.
  uint64_t fault = reason.detected_ns != 0 ? reason.detected_ns : now_ns;
  if (reason.kind == "hang" || reason.kind == "exit_hang") {
    uint64_t last = 0;
    for (int global : reason.ranks)
      if (const int r = LocalRank(global); r >= 0 && r < timeline_.world())
        last = std::max(last, timeline_.rank(r).last_event_ns);
    if (last == 0 && reason.evidence.contains("waited_seconds") && reason.evidence["waited_seconds"].is_number())
      last = fault - std::min(fault, Nanos(reason.evidence["waited_seconds"].get<double>()));
    if (last != 0) fault = std::min(fault, last);
  } else if (reason.kind == "node_lost") {
    const auto silent = reason.evidence.find("silent_seconds");
    const double before = silent != reason.evidence.end() && silent->is_number() && silent->get<double>() >= 0
                              ? silent->get<double>()
                              : config_.rendezvous.lease_seconds;
    fault -= std::min(fault, Nanos(before));
  }
  const std::string node = reason.ranks.empty() ? std::string() : NodeOfRank(reason.ranks.front());
  ledger_.Fault(reason.kind, reason.ranks, node, fault, now_ns);
  if (reason.kind == "elsewhere") return;
  const int sig = reason.evidence.contains("signal") && reason.evidence["signal"].is_number_integer()
                      ? reason.evidence["signal"].get<int>() : 0;
  const bool machine = reason.kind == "node_lost" || reason.kind == "hang" || reason.kind == "exit_hang" ||
                       reason.kind == "sdc_suspect" || (reason.kind == "dead" && (sig == SIGKILL || sig == SIGBUS));
  faults_.push_back({node, machine});
}

bool Supervisor::RequeueMayHelp() const {
  if (faults_.empty()) return false;
  const bool all_machine = std::all_of(faults_.begin(), faults_.end(), [](const Fault& f) { return f.machine; });
  std::set<std::string> nodes;
  for (const Fault& f : faults_) nodes.insert(f.node);
  const bool one_node = multi_node_job_ && nodes.size() == 1 && !nodes.begin()->empty();
  return all_machine || one_node;
}

void Supervisor::StoppedForRound(uint64_t now_ns) { ledger_.Stopped(now_ns, 0); }

void Supervisor::FindExitHangs(uint64_t now_ns, std::vector<Anomaly>* anomalies, PollDecision* out) {
  if (config_.exit_hang_seconds <= 0 || world_ < 2) return;
  uint64_t last_exit = 0;
  int running = 0;
  for (int r = 0; r < world_; ++r) {
    if (!exited_[static_cast<size_t>(r)]) {
      ++running;
      continue;
    }
    const int status = wait_status_[static_cast<size_t>(r)];
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) return;  // a failure: the detectors' matter
    last_exit = std::max(last_exit, exited_ns_[static_cast<size_t>(r)]);
  }
  if (running == 0 || running == world_) return;
  for (int r = 0; r < world_; ++r) {
    if (exited_[static_cast<size_t>(r)] || exit_hung_[static_cast<size_t>(r)]) continue;
    const uint64_t quiet_since = std::max(last_exit, timeline_.rank(r).last_event_ns);
    if (now_ns < quiet_since + Nanos(config_.exit_hang_seconds)) continue;
    exit_hung_[static_cast<size_t>(r)] = true;
    Anomaly a;
    a.kind = "exit_hang";
    a.ranks = {timeline_.GlobalRank(r)};
    a.detected_ns = now_ns;
    a.evidence = {{"seconds_since_others_exited", Seconds(now_ns - last_exit)},
                  {"seconds_since_last_event", timeline_.rank(r).last_event_ns == 0
                                                   ? nlohmann::json(nullptr)
                                                   : nlohmann::json(Seconds(now_ns - timeline_.rank(r).last_event_ns))},
                  {"orderly_exit_recorded", timeline_.rank(r).finished}};
    a.message = "rank " + std::to_string(a.ranks.front()) + " is still alive " +
                std::to_string(static_cast<int>(Seconds(now_ns - last_exit))) +
                " s after every other rank exited 0, with no event since: stuck in its exit (a collective "
                "library's teardown); stopping it, the job ends with the others' status";
    anomalies->push_back(std::move(a));
    out->stop_ranks.push_back(r);
  }
}

TimelineChange Supervisor::Observe(int rank, const trace::Event& event) {
  const TimelineChange change = timeline_.Apply(rank, event);
  if (change.rank >= 0) {
    for (auto& d : detectors_) d->Observe(timeline_, change);
    ledger_.Observe(rank, event);
  }
  return change;
}

void Supervisor::MarkGap(int rank, uint64_t now_ns) { timeline_.MarkGap(rank, now_ns); }

int Supervisor::WaitStatus(int global) const {
  const int r = LocalRank(global);
  return r >= 0 && r < world_ ? wait_status_[static_cast<size_t>(r)] : 0;
}

PollDecision Supervisor::Poll(const PollInput& in) {
  PollDecision out;
  std::vector<Anomaly> anomalies;
  Enter(PollMeter::Part::kDetectors);
  for (const RankExit& e : in.exits) {
    if (e.rank < 0 || e.rank >= world_) continue;
    const bool stopped_here = exit_hung_[static_cast<size_t>(e.rank)];
    // A rank stopped as exit_hang ends as its peers did: its work was done.
    wait_status_[static_cast<size_t>(e.rank)] = stopped_here ? 0 : e.wait_status;
    exited_[static_cast<size_t>(e.rank)] = true;
    exited_ns_[static_cast<size_t>(e.rank)] = in.now_ns;
    timeline_.RankExited(e.rank);
    for (auto& d : detectors_) d->RankExited(timeline_, e.rank, e.wait_status, /*expected=*/stopped_here, in.now_ns, &anomalies);
  }
  for (auto& d : detectors_) d->Poll(timeline_, in.now_ns, &anomalies);
  FindExitHangs(in.now_ns, &anomalies, &out);
  Leave(PollMeter::Part::kDetectors);
  bool moved = false;
  if (in.news != nullptr && plan_) {
    ReadRound(in, &anomalies, &moved, &out);
    HoldFailureEchoes(in, moved, &anomalies, &out);
    HoldSpread(in, moved, &anomalies, &out);
  }
  if (!out.job_ended.empty()) return out;
  if (moved) {
    // Failures of this node's own found as the round moved (HoldFailureEchoes kept only those):
    // named and counted, not acted on; the restart under way covers them.
    out.round_moved = true;
    Name(&anomalies, /*may_restart=*/false, &out);
    Anomaly elsewhere;
    elsewhere.kind = "elsewhere";
    RecordFault(elsewhere, in.now_ns);
    return out;
  }
  ScreenHostNoise(&anomalies, &out);
  Name(&anomalies, /*may_restart=*/true, &out);
  if (out.restart) RecordFault(*out.restart, in.now_ns);
  if (std::optional<RestartCost> cost = ledger_.Settle()) {
    out.records.push_back(cost->ToJson());
    out.restart_cost = std::move(cost);
  }
  // A held failure is decided before the job's end.
  out.ranks_done = !out.restart && !held_ && std::all_of(exited_.begin(), exited_.end(), [](bool e) { return e; });
  return out;
}

void Supervisor::ReadRound(const PollInput& in, std::vector<Anomaly>* anomalies, bool* moved, PollDecision* out) {
  const RendezvousNews& news = *in.news;
  if (MultiNode()) {
    // This node sees its own ranks only: stragglers, slow collectives and a collective all of
    // them joined are for the job-wide view to judge, where the ranks of other nodes show.
    anomalies->erase(std::remove_if(anomalies->begin(), anomalies->end(), LeftToJobView), anomalies->end());
  }
  if (in.now_ns - published_ns_ >= publish_ns_) {
    Enter(PollMeter::Part::kSummary);
    // Only what the leader has not been sent: the collectives after those of the newest summary it
    // has (news.progress_acked); all of them when it has none of the last few.
    const SampleCursor* after = nullptr;
    uint64_t base = 0;
    for (const auto& [number, cursor] : summary_cursors_)
      if (number == news.progress_acked && number != 0) after = &cursor, base = number;
    std::vector<RankProgress> ranks = SummarizeProgress(timeline_, plan_->group_rank, in.now_ns, after);
    SampleCursor cursor = after != nullptr ? *after : SampleCursor{};
    AdvanceCursor(ranks, &cursor);
    // The digests the leader does not have: after those of the summary it has, else all kept.
    CollectDigests(news, in.now_ns);
    const auto had = digest_cursors_.find(base);
    const uint64_t had_seq = after != nullptr && had != digest_cursors_.end() ? had->second : 0;
    while (!digest_out_.empty() && digest_out_.front().seq <= had_seq) digest_out_.pop_front();
    SummaryFrame frame;
    frame.number = ++summary_number_;
    frame.base = base;
    frame.unix_ms = in.unix_ms;
    frame.ranks = std::move(ranks);
    for (const DigestOut& d : digest_out_) {
      if (d.fold) frame.folds.push_back(*d.fold);
      if (d.detail) frame.details.push_back(*d.detail);
      if (d.values) frame.values.push_back(*d.values);
    }
    out->progress = EncodeSummary(frame);
    summary_cursors_.emplace_back(summary_number_, std::move(cursor));
    while (summary_cursors_.size() > kSummariesRemembered) summary_cursors_.pop_front();
    digest_cursors_[summary_number_] = digest_seq_;
    while (digest_cursors_.size() > kSummariesRemembered) digest_cursors_.erase(digest_cursors_.begin());
    Leave(PollMeter::Part::kSummary);
    published_ns_ = in.now_ns;
  }
  // With one node in the round its own detectors see everything: no second view, no second alarm.
  if (news.leader && !news.progress.empty() && MultiNode()) {
    Enter(PollMeter::Part::kJobView);
    if (job_digests_ == nullptr) job_digests_ = std::make_unique<JobDigestDetector>();
    if (job_signals_ == nullptr)
      job_signals_ = std::make_unique<JobSignalDetector>(config_.training_signals, static_cast<int>(plan_->world_size));
    for (const EtcdKeyValue& kv : news.progress) {  // each node's, oldest first
      Result<SummaryFrame> frame = DecodeSummary(kv.value, kv.key, in.unix_ms);
      if (!frame.ok()) continue;  // not one of ours: no say in the verdict
      constexpr std::string_view kNodePrefix = "summary of node ";
      std::string node = kv.key.rfind(kNodePrefix, 0) == 0 ? kv.key.substr(kNodePrefix.size()) : kv.key;
      for (const RoundNode& n : plan_->nodes)  // as a person knows it: its lasting name
        if (n.id == node) node = n.Name();
      for (const DigestFold& f : frame->folds) job_digests_->AddFold(node, f, in.now_ns);
      for (const DigestDetail& d : frame->details) job_digests_->AddDetail(d);
      for (const ValueReport& v : frame->values) job_signals_->Add(v, in.now_ns);
      merger_.Merge(kv.key, std::move(*frame), in.unix_ms);
    }
    merger_.View(in.unix_ms, &job_progress_);
    if (job_view_ == nullptr) {
      job_view_ = std::make_unique<JobView>(config_);
      job_view_->Reset(static_cast<int>(plan_->world_size));
    }
    job_view_->Update(job_progress_, in.now_ns, anomalies);
    Leave(PollMeter::Part::kJobView);
  }
  if (news.leader && job_digests_ != nullptr && MultiNode()) job_digests_->Poll(in.now_ns, anomalies, &out->digest_queries);
  if (news.leader && job_signals_ != nullptr && MultiNode()) job_signals_->Poll(in.now_ns, anomalies);
  for (const std::string& id : news.lost_nodes) {
    int group = -1;
    for (size_t g = 0; g < plan_->nodes.size(); ++g)
      if (plan_->nodes[g].id == id) group = static_cast<int>(g);
    if (group < 0 || id == node_id_) continue;
    Anomaly a;
    a.kind = "node_lost";
    a.ranks = plan_->RanksOf(group);
    a.evidence = {{"node", id}, {"host", plan_->nodes[group].host}, {"lease_seconds", config_.rendezvous.lease_seconds}};
    const auto how = news.lost_how.find(id);
    if (how != news.lost_how.end()) {  // its summary stream, before its lease (issue 36, item 3)
      a.evidence["found_by"] = "summary_stream";
      a.message = "node " + std::to_string(group) + " (" + id + "): " + how->second + ": its agent or machine is gone";
      const auto silent = news.lost_silent_seconds.find(id);
      if (silent != news.lost_silent_seconds.end()) {
        a.evidence["silent_seconds"] = silent->second;
        a.message += " (nothing heard of it for " + detail::Duration(silent->second) + ")";
      }
    } else {
      a.evidence["found_by"] = "lease";
      a.message = "node " + std::to_string(group) + " (" + id + ") stopped renewing its etcd lease for " +
                  std::to_string(static_cast<int>(config_.rendezvous.lease_seconds)) + " s: its agent or machine is gone";
    }
    a.detected_ns = in.now_ns;
    anomalies->push_back(std::move(a));
  }
  if (!news.isolated.empty()) {  // this node is cut off: its ranks stop before the job goes on without it
    Anomaly a;
    a.kind = "node_lost";
    a.ranks = plan_->RanksOf(plan_->group_rank);
    a.evidence = {{"node", node_id_}, {"found_by", "self"}, {"lease_seconds", config_.rendezvous.lease_seconds}};
    a.message = "this node (" + std::to_string(plan_->group_rank) + ", " + node_id_ + ") is cut off: " + news.isolated +
                "; its ranks are stopped";
    a.detected_ns = in.now_ns;
    anomalies->push_back(std::move(a));
  }
  *moved = news.round.has_value() || !news.give_up.empty();
  out->job_ended = news.give_up;
}

void Supervisor::CollectDigests(const RendezvousNews& news, uint64_t now_ns) {
  if (digests_ == nullptr || !digests_->folding()) return;  // a single-node launch
  if (signals_ != nullptr)
    for (ValueReport& v : signals_->TakeValueReports()) digest_out_.push_back({++digest_seq_, std::nullopt, std::nullopt, std::move(v)});
  for (const DigestFold& f : digests_->TakeFolds(timeline_, now_ns)) digest_out_.push_back({++digest_seq_, f, std::nullopt});
  for (const DigestQuery& q : news.digest_queries) {
    for (int global : q.ranks) {
      const int r = LocalRank(global);
      if (r < 0 || r >= world_ || !answered_.insert({q.step, global}).second) continue;
      if (std::optional<DigestDetail> d = digests_->Detail(timeline_, global, q.step))
        digest_out_.push_back({++digest_seq_, std::nullopt, std::move(*d)});
    }
  }
  // Bounded: a leader that takes nothing for long (gone) does not grow this node.
  constexpr size_t kMaxDigestOut = 4096;
  while (digest_out_.size() > kMaxDigestOut) digest_out_.pop_front();
}

void Supervisor::HoldSpread(const PollInput& in, bool moved, std::vector<Anomaly>* anomalies, PollDecision* out) {
  if (!MultiNode()) return;
  for (auto it = anomalies->begin(); it != anomalies->end();) {
    const bool spread = it->kind == "non_finite" && it->evidence.value("rank_own_value", true) == false;
    if (!spread) {
      ++it;
      continue;
    }
    if (!spread_ && !spread_raised_) spread_ = HeldSpread{std::move(*it), in.now_ns};
    it = anomalies->erase(it);
  }
  if (!spread_) return;
  if (moved) {
    out->records.push_back({{"action", "echo"},
                            {"anomaly", "non_finite"},  // not "kind": a record of that key is an anomaly raised
                            {"ranks", spread_->anomaly.ranks},
                            {"step", spread_->anomaly.step ? nlohmann::json(*spread_->anomaly.step) : nlohmann::json(nullptr)},
                            {"message", spread_->anomaly.message +
                                            ", spread by the all-reduce: the round moved on another node (not counted)"}});
    spread_.reset();
    spread_raised_ = true;
    return;
  }
  const bool leader = in.news != nullptr && in.news->leader;
  const double hold = kSpreadHoldSeconds + (leader ? 0 : kSpreadBackupSeconds);
  if (in.now_ns < spread_->since_ns + Nanos(hold)) return;
  Anomaly a = std::move(spread_->anomaly);
  spread_.reset();
  spread_raised_ = true;
  a.evidence["decided_by"] = leader ? "leader" : "node";
  a.message += leader ? "; no node's rank had a non-finite value of its own: the round's leader acts for the job"
                      : "; neither a node whose rank's own value went bad nor the round's leader acted within " +
                            detail::Duration(hold) + ": this node does";
  anomalies->push_back(std::move(a));
}

void Supervisor::LetGoAsEcho(Anomaly echo, const std::string& why, PollDecision* out) {
  out->records.push_back({{"action", "echo"}, {"ranks", echo.ranks}, {"message", echo.message + ", " + why + " (not counted)"}});
  out->echoes.push_back(std::move(echo));
}

void Supervisor::HoldFailureEchoes(const PollInput& in, bool moved, std::vector<Anomaly>* anomalies, PollDecision* out) {
  if (!MultiNode()) return;
  const uint64_t now = in.now_ns;
  if (moved) {
    if (held_) {
      LetGoAsEcho(std::move(held_->anomaly), "after a failure on another node", out);
      held_.reset();
    }
    // This poll's failures: possible echoes are let go as such; failures of their own stay in
    // `anomalies`, to be named (not acted on) as the ranks stop (agent/detectors/echo.h).
    std::vector<Anomaly> echoes;
    SortFailuresAsTheRoundMoves(anomalies, [this](int global) { return WaitStatus(global); }, &echoes);
    for (Anomaly& e : echoes) LetGoAsEcho(std::move(e), "as the round moved", out);
    return;
  }
  const double grace = config_.rendezvous.failure_grace_seconds;
  // A node lost while a failure of ours was held: that failure was the lost node's echo (its ranks'
  // connections closed), and the lost node is the culprit.
  const bool node_lost = std::any_of(anomalies->begin(), anomalies->end(),
                                     [](const Anomaly& a) { return a.kind == "node_lost"; });
  if (node_lost && held_) {
    LetGoAsEcho(std::move(held_->anomaly), "after a node was lost", out);
    held_.reset();
  }
  for (auto it = anomalies->begin(); it != anomalies->end();) {
    if (node_lost && it->kind == "dead") {  // this poll's echoes of the same loss
      LetGoAsEcho(std::move(*it), "as a node was lost", out);
      it = anomalies->erase(it);
      continue;
    }
    if (it->kind != "dead") {
      ++it;
      continue;
    }
    const int64_t at = in.unix_ms;
    around_->ReportFailure(plan_->round, static_cast<uint64_t>(at)).IgnoreError();  // keeps the earliest
    // A rank that exited with a status or aborted may have been failed by a peer elsewhere (gloo
    // and NCCL raise when a connection closes); one killed by another signal was not.
    bool may_echo = grace > 0;
    for (int global : it->ranks) {
      const int r = LocalRank(global);
      if (r < 0 || r >= world_) {
        may_echo = false;
        continue;
      }
      if (!MayBeEcho(*it, wait_status_[static_cast<size_t>(r)])) may_echo = false;
    }
    if (!may_echo) {
      ++it;
      continue;
    }
    if (!held_) {
      held_ = HeldFailure{std::move(*it), at, now};
    } else {  // a rank of this node failing after it: its echo, as on a single node
      nlohmann::json& after = held_->anomaly.evidence["failed_after"];
      for (int r : it->ranks) after.push_back(r);
    }
    it = anomalies->erase(it);
  }
  if (!held_ || now - held_->since_ns < Nanos(grace)) return;
  // etcd is asked four times a second, not at every poll: a lost node holds the failures of every
  // node that talked to it, and a thousand agents polling etcd 100 times a second each would be
  // the control plane's worst moment.
  if (held_->asked_ns != 0 && now - held_->asked_ns < Nanos(0.25)) return;
  held_->asked_ns = now;
  // Still here after the grace: act, unless another node failed first and is about to (it gets
  // a few graces more, in case its agent is gone).
  Result<bool> earlier = around_->FailedEarlierElsewhere(plan_->round, static_cast<uint64_t>(held_->unix_ms));
  const bool waited_long = now - held_->since_ns >= Nanos(4 * grace);
  if (earlier.ok() && *earlier && !waited_long) return;
  // A node of the round that reported no failure, while ours may be an echo, may be a machine that
  // is gone (its ranks cannot report; gloo fails ours within a second): its lease decides, so the
  // failure is held until that lease would have expired, and node_lost then names the culprit.
  // Nodes that are alive report their own echoes within the grace, and release it at once.
  if (!earlier.ok() || !*earlier) {
    std::vector<std::string> others;
    for (const RoundNode& n : plan_->nodes)
      if (n.id != node_id_) others.push_back(n.id);
    Result<std::vector<std::string>> silent = around_->NodesWithoutFailure(plan_->round, others);
    const double lease_wait = config_.rendezvous.lease_seconds + 2 * grace;
    if (silent.ok() && !silent->empty() && now - held_->since_ns < Nanos(lease_wait)) {
      held_->anomaly.evidence["waited_for_nodes"] = *silent;
      return;
    }
  }
  held_->anomaly.evidence["held_seconds"] = Seconds(now - held_->since_ns);
  anomalies->push_back(std::move(held_->anomaly));
  held_.reset();
}

void Supervisor::ScreenHostNoise(std::vector<Anomaly>* anomalies, PollDecision* out) {
  // The slow-collective detector's own finding first, whatever the host's pressure reads (issue 50:
  // a host busy with other jobs paged "the whole communicator is slow" at x2.0): the ranks' work
  // between collectives slowed as much as the collectives.
  for (auto it = anomalies->begin(); it != anomalies->end();) {
    if (it->kind != "slow_collective" || !it->ranks.empty() || !it->evidence.value("host_busy", false)) {
      ++it;
      continue;
    }
    out->records.push_back({{"action", "not_paged"},
                            {"anomaly", it->kind},
                            {"ranks", it->ranks},
                            {"message", it->message},
                            {"evidence", it->evidence},
                            {"reason", "the ranks' own work between their collectives slowed as much as the collectives: "
                                       "a host busy with other processes, not a slow communicator"}});
    it = anomalies->erase(it);
  }
  bool maybe_noise = false;
  for (const Anomaly& a : *anomalies)
    maybe_noise |= a.kind == "straggler" || a.kind == "slow_collective" || a.kind == "checkpoint";
  if (!maybe_noise) return;
  const HostCpu host = around_->SampleHostCpu();
  for (const Anomaly& a : TakeHostNoise(host, anomalies))
    out->records.push_back({{"action", "not_paged"},
                            {"anomaly", a.kind},  // not "kind": a line with "kind" is an anomaly raised
                            {"ranks", a.ranks},
                            {"message", a.message},
                            {"evidence", a.evidence},
                            {"reason", "this host's CPUs are saturated (" + host.Describe() +
                                           "): within what a process waiting for a core is delayed, not a fault of the job"}});
}

void Supervisor::Name(std::vector<Anomaly>* anomalies, bool may_restart, PollDecision* out) {
  for (Anomaly& a : *anomalies) {
    if (a.kind == "hang" || a.kind == "dead") named_.insert(a.ranks.begin(), a.ranks.end());
    // One fault, one alarm: a checkpoint anomaly of ranks this launch already named hung or dead
    // is that fault's consequence (their saves stop with them), logged with it, not raised again.
    const bool folded = a.kind == "checkpoint" && !a.ranks.empty() &&
                        std::all_of(a.ranks.begin(), a.ranks.end(), [this](int r) { return named_.count(r) > 0; });
    if (folded) {
      out->records.push_back({{"action", "folded"}, {"anomaly", a.kind}, {"ranks", a.ranks}, {"message", a.message},
                              {"reason", "these ranks were already named hung or dead in this launch"}});
      continue;
    }
    RaisedAnomaly raised;
    nlohmann::json& line = raised.record;
    line = {{"kind", a.kind}, {"ranks", a.ranks}, {"evidence", a.evidence}, {"message", a.message}};
    line["step"] = a.step ? nlohmann::json(*a.step) : nlohmann::json(nullptr);
    if (a.seq) line["seq"] = *a.seq;
    if (a.comm) line["comm"] = *a.comm;
    if (!a.op.empty()) line["op"] = a.op;
    // How long the culprits had been silent when the verdict came: the detection latency.
    uint64_t last = 0;
    for (int global : a.ranks)
      if (const int r = LocalRank(global); r >= 0 && r < timeline_.world())
        last = std::max(last, timeline_.rank(r).last_event_ns);
    if (!node_id_.empty()) line["node"] = node_id_;
    if (last > 0 && a.detected_ns >= last) line["culprit_silent_seconds"] = Seconds(a.detected_ns - last);
    const auto it = config_.policy.find(a.kind);
    raised.action = it != config_.policy.end() ? it->second : Action::kLog;
    line["policy"] = ActionName(raised.action);
    if (raised.action == Action::kRollback && may_restart && !out->restart) {
      // Named and logged, and the ranks train on, where a rollback cannot be chosen: with no
      // checkpoint directory known, what a relaunch loads cannot be chosen, and starting over from
      // scratch is not the agent's call. (A multi-node job rolls back through its next round,
      // which carries the bound: rendezvous.h, RoundRollback.)
      std::string why;
      if (!a.step) {
        why = "the anomaly names no step to roll back before";
      } else if (!around_->CheckpointDirKnown()) {
        why = "no checkpoint directory is known (--checkpoint-dir, or a Checkpointer the ranks opened)";
      }
      if (!why.empty()) {
        line["not_acted_on"] = why + ": the ranks train on";
        raised.action = Action::kLog;
      }
    }
    if (may_restart && (raised.action == Action::kRestart || raised.action == Action::kRollback) && !out->restart) {
      out->restart = a;
      out->rollback = raised.action == Action::kRollback;
    }
    raised.anomaly = std::move(a);
    out->raised.push_back(std::move(raised));
  }
  anomalies->clear();
}

std::string Supervisor::RepeatableFailure(const Anomaly& reason, uint64_t now_ns, const std::vector<RankEnd>& ends) const {
  if (reason.kind != "dead") return "";
  // Where: before the first step (no rank began one, and, for ranks that are not traced, within a
  // minute of the launch), else the step the failed ranks were in, which a relaunch resumed from a
  // checkpoint reaches again when the failure is the script's.
  bool stepped = false;
  for (const RankTimeline& v : timeline_.ranks()) stepped = stepped || v.began_step;
  if (!stepped && now_ns - launched_ns_ > 60'000'000'000ull) return "";
  uint64_t step = 0;
  // Which ranks the detector named first varies between launches; how they failed does not.
  std::set<std::string> ways;
  for (int global : reason.ranks) {
    const int r = LocalRank(global);
    if (r < 0 || static_cast<size_t>(r) >= ends.size()) return "";
    const RankEnd& p = ends[static_cast<size_t>(r)];
    // A rank killed by a signal may have been killed from outside: not a failure of the command.
    if (!WIFEXITED(p.wait_status)) return "";
    const RankTimeline& v = timeline_.rank(r);
    if (stepped && v.step != trace::kNoStep) step = std::max(step, v.step);
    ways.insert(DescribeWaitStatus(p.wait_status) + (p.last_line.empty() ? "" : ", last line: " + p.last_line));
  }
  std::string out = (stepped ? "at step " + std::to_string(step) : std::string("before its first step")) +
                    " the same way at two launches in a row (";
  bool first = true;
  for (const std::string& w : ways) {
    out += (first ? "" : "; ") + w;
    first = false;
  }
  return out + ")";
}

std::string Supervisor::IncurableFailure(const std::vector<RankEnd>& ends) const {
  // The library reports a checkpoint it cannot save as FailedPrecondition when the operator must
  // change something: the directory is a file, cannot be written, another job saves into it, the
  // pieces of a save cannot form a loadable checkpoint. A rank that ended on one fails the same
  // way at every launch.
  for (size_t r = 0; r < ends.size() && static_cast<int>(r) < timeline_.world(); ++r) {
    const RankEnd& p = ends[r];
    if (!WIFEXITED(p.wait_status) || WEXITSTATUS(p.wait_status) == 0) continue;
    if (timeline_.rank(static_cast<int>(r)).save_failure_code != static_cast<uint64_t>(StatusCode::kFailedPrecondition))
      continue;
    return "rank " + std::to_string(rank_base_ + static_cast<int>(r)) +
           " ended on a checkpoint failure no relaunch cures (FailedPrecondition: " + DescribeWaitStatus(p.wait_status) +
           (p.last_line.empty() ? "" : ", last line: " + p.last_line) + "; its error is in its output above)";
  }
  return "";
}

RestartPlan Supervisor::PlanRestart(const Anomaly& reason, uint64_t now_ns, const std::vector<RankEnd>& ends) {
  RestartPlan plan;
  if (std::string incurable = IncurableFailure(ends); !incurable.empty()) {
    plan.give_up = incurable + "; relaunching will not help";
    plan.job_wide = true;
    plan.incurable = true;
    return plan;
  }
  // A command that fails the same way at two launches in a row, before its first step (an import
  // error, a bad argument, a missing file) or at the same step (a bug that a resume from the same
  // checkpoint meets again), would only burn the budget with back-off.
  const std::string failure = RepeatableFailure(reason, now_ns, ends);
  if (!failure.empty() && failure == repeated_failure_) {
    plan.give_up = "the command failed " + failure + "; relaunching will not help";
    return plan;
  }
  repeated_failure_ = failure;
  const RestartConfig& r = config_.restart;
  if (restart_ >= r.max_restarts) {
    plan.give_up = "restart budget spent (" + std::to_string(r.max_restarts) + " restarts); last anomaly: " +
                   reason.kind + ": " + reason.message;
    plan.job_wide = true;
    return plan;
  }
  // A launch that ran (every rank began a step, or it lived a minute) and then failed is relaunched
  // at once: a fault once in a while costs no wait. Launches failing in a row without getting that
  // far back off, longer each time: whatever fails them may need a moment to pass.
  failed_in_a_row_ = LaunchRan(now_ns) ? 0 : failed_in_a_row_ + 1;
  plan.backoff_seconds =
      failed_in_a_row_ == 0
          ? 0.0
          : std::min(r.backoff_max_seconds, r.backoff_initial_seconds * std::pow(r.backoff_multiplier, failed_in_a_row_ - 1));
  ledger_.Stopped(now_ns, plan.backoff_seconds);
  return plan;
}

RollbackPlan Supervisor::PlanRollback(const Anomaly& reason, uint64_t now_ns, const std::vector<RankEnd>& ends,
                                      const std::vector<ResumableStep>& listing) {
  RollbackPlan plan;
  uint64_t reached = 0;
  for (const RankTimeline& v : timeline_.ranks())
    if (v.step != trace::kNoStep) reached = std::max(reached, v.step);
  plan.decision = rollbacks_.Decide(reason, reached, listing);
  RollbackDecision& d = plan.decision;
  std::vector<std::string> nodes;
  for (int global : reason.ranks) {
    const std::string node = NodeOfRank(global);
    if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
  }
  for (const std::string& node : nodes)
    if (!node.empty()) d.nodes.push_back(node);
  if (reason.kind == "sdc_suspect" && d.give_up.empty() && config_.rollback.sdc_per_node > 0) {
    // Counted per node, once per anomaly (without a majority it names every replica compared,
    // often ranks of one node).
    bool out = false;
    for (const std::string& node : nodes) {
      const uint32_t n = rollbacks_.CountSdc(node);
      d.sdc_on_node = std::max(d.sdc_on_node, n);
      if (n >= config_.rollback.sdc_per_node && !out) {
        out = true;
        d.node_out = node;
      }
    }
    if (out && !plan_) {
      // One node is the whole job: it cannot be left out and the job go on elsewhere. Relaunching on
      // it would train on a machine known to corrupt; the operator drains it and resubmits. (A job
      // with a rendezvous, even of one node, leaves that to its next round: a spare may take the
      // place, and without one the round's closer ends the job, rendezvous.h.)
      std::vector<int> on_node;
      for (int global : reason.ranks)
        if (NodeOfRank(global) == d.node_out) on_node.push_back(global);
      const std::string name = d.node_out.empty() ? std::string("this node") : "node " + d.node_out;
      d.give_up = "sdc_suspect at step " + std::to_string(d.anomaly_step) + ": " + name + " (rank" +
                  (on_node.size() > 1 ? "s " : " ") + detail::RankList(on_node) + ") held a replica unlike the others' for the " +
                  std::to_string(d.sdc_on_node) + Ordinal(d.sdc_on_node) +
                  " time (rollback.sdc_per_node: " + std::to_string(config_.rollback.sdc_per_node) +
                  "): its machine corrupts data; a single-node job cannot leave it out, so the job stops here: take " +
                  name + " out of service (e.g. drain it in the scheduler) and resubmit";
    }
  }
  if (!d.give_up.empty()) {
    plan.restart.give_up = plan.decision.give_up;
    plan.restart.job_wide = true;
    plan.restart.incurable = true;  // a requeue resumes from the same checkpoint and meets it again
    return plan;
  }
  plan.restart = PlanRestart(reason, now_ns, ends);
  return plan;
}

bool Supervisor::LaunchRan(uint64_t now_ns) const {
  return now_ns - launched_ns_ >= kRanSeconds * 1'000'000'000ull ||
         (!timeline_.ranks().empty() && std::all_of(timeline_.ranks().begin(), timeline_.ranks().end(),
                                                    [](const RankTimeline& v) { return v.began_step; }));
}

JobEnd Supervisor::Conclude() const {
  JobEnd end;
  std::vector<int> failed;
  for (int r = 0; r < world_; ++r) {
    const int status = wait_status_[static_cast<size_t>(r)];
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) failed.push_back(r);
  }
  if (!failed.empty()) {
    end.give_up = "ranks " + detail::RankList(failed) + " failed and the policy restarts none";
    return end;
  }
  end.finished = true;
  // Ranks that all end with 0 can still have lost the job's final state: a save that failed (into
  // a directory another job holds, a full disk) with none persisted after it.
  std::vector<int> unsaved;
  uint64_t unsaved_step = 0;
  uint64_t unsaved_code = 0;
  for (int r = 0; r < timeline_.world(); ++r) {
    const RankTimeline& t = timeline_.rank(r);
    if (t.failed_save_step == trace::kNoStep) continue;
    unsaved.push_back(rank_base_ + r);
    unsaved_step = std::max(unsaved_step, t.failed_save_step);
    unsaved_code = t.failed_save_code;
  }
  if (!unsaved.empty())
    end.give_up = "every rank ended with status 0, but the last checkpoint of ranks " + detail::RankList(unsaved) +
                  " failed (step " + std::to_string(unsaved_step) + ": " +
                  StatusCodeName(static_cast<StatusCode>(unsaved_code)) +
                  ", see the ranks' output) and no later one was saved: the job's final state is not in the checkpoint";
  return end;
}

}  // namespace lifeline::agent
