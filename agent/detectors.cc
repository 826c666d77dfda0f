#include "agent/detectors.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "lifeline/status.h"

namespace lifeline::agent {
namespace {

using trace::Event;
using trace::EventType;
using trace::kNoStep;
using trace::Op;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kMadScale = 1.4826;       // MAD to standard deviation, for normal data
constexpr double kMadFloorSeconds = 1e-4;  // identical timings must not give an infinite z
// Collectives (per comm) and steps waiting for their last rank; beyond this the oldest is dropped
// (a rank that never reports them, e.g. events lost to a full ring).
constexpr size_t kMaxPending = 512;

double Seconds(uint64_t ns) { return static_cast<double>(ns) / 1e9; }
double SecondsBetween(uint64_t from, uint64_t to) { return to > from ? Seconds(to - from) : 0.0; }

uint64_t Nanos(double seconds) {
  if (!(seconds > 0)) return 0;
  if (seconds >= 1.8e10) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(seconds * 1e9);
}

double Median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return (lower + upper) / 2;
}

double Mad(const std::vector<double>& v, double median) {
  std::vector<double> dev;
  dev.reserve(v.size());
  for (double x : v) dev.push_back(std::fabs(x - median));
  return Median(std::move(dev));
}

double RobustSigma(const std::vector<double>& v, double median) {
  return kMadScale * std::max(Mad(v, median), kMadFloorSeconds);
}

// JSON has no NaN: an unknown number is null.
nlohmann::json Number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

std::string Fmt(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, x);
  return buf;
}

// "40.2 ms", "5.2 s".
std::string Duration(double seconds) {
  if (!std::isfinite(seconds)) return "?";
  return std::fabs(seconds) < 1 ? Fmt("%.1f ms", seconds * 1e3) : Fmt("%.1f s", seconds);
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

// "rank 2", "ranks 0,1,3".
std::string Ranks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + RankList(ranks);
}

std::string StepSuffix(uint64_t step) { return step == kNoStep ? "" : " at step " + std::to_string(step); }

std::optional<uint64_t> KnownStep(uint64_t step) {
  return step == kNoStep ? std::nullopt : std::optional<uint64_t>(step);
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGCHLD: return "SIGCHLD";
    case SIGCONT: return "SIGCONT";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    case SIGURG: return "SIGURG";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGPROF: return "SIGPROF";
    case SIGWINCH: return "SIGWINCH";
    case SIGIO: return "SIGIO";
    case SIGSYS: return "SIGSYS";
    default: return nullptr;
  }
}

// Which ranks take part in each communicator (see detectors.h).
class CommMembers {
 public:
  void Reset(int world) {
    world_ = world;
    seen_.clear();
  }
  void Saw(uint32_t comm, int rank) {
    if (comm != 0) seen_[comm].insert(rank);
  }
  std::vector<int> Members(uint32_t comm) const {
    std::vector<int> out;
    if (comm == 0) {
      for (int r = 0; r < world_; ++r) out.push_back(r);
    } else if (auto it = seen_.find(comm); it != seen_.end()) {
      out.assign(it->second.begin(), it->second.end());
    }
    return out;
  }

 private:
  int world_ = 0;
  std::map<uint32_t, std::set<int>> seen_;
};

template <typename Map>
void DropOldest(Map* m) {
  while (m->size() > kMaxPending) m->erase(m->begin());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// dead

struct DeadRankDetector::State {
  struct RankState {
    uint64_t last_step_begun = kNoStep;
    uint64_t last_event_ns = 0;
    bool orderly_exit = false;  // kProcessExit seen
    bool reported = false;
  };
  std::vector<RankState> ranks;
};

DeadRankDetector::DeadRankDetector() : state_(std::make_unique<State>()) {}
DeadRankDetector::~DeadRankDetector() = default;

void DeadRankDetector::Reset(int world) { state_->ranks.assign(static_cast<size_t>(std::max(world, 0)), {}); }

void DeadRankDetector::Observe(int rank, const Event& event) {
  if (rank < 0 || rank >= static_cast<int>(state_->ranks.size())) return;
  State::RankState& r = state_->ranks[rank];
  r.last_event_ns = std::max(r.last_event_ns, event.time_ns);
  if (event.type == EventType::kStepBegin) r.last_step_begun = event.step;
  if (event.type == EventType::kProcessExit) r.orderly_exit = true;
}

void DeadRankDetector::RankExited(int rank, int wait_status, bool expected, uint64_t now_ns,
                                  std::vector<Anomaly>* out) {
  if (expected || rank < 0) return;
  const bool signaled = WIFSIGNALED(wait_status);
  const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 0;
  if (!signaled && code == 0) return;  // an exit 0 may be a rank finishing early
  State::RankState none;
  State::RankState& r = rank < static_cast<int>(state_->ranks.size()) ? state_->ranks[rank] : none;
  if (r.reported) return;
  r.reported = true;

  Anomaly a;
  a.kind = "dead";
  a.ranks = {rank};
  a.step = KnownStep(r.last_step_begun);
  a.detected_ns = now_ns;
  std::string how;
  if (signaled) {
    const int sig = WTERMSIG(wait_status);
    const char* name = SignalName(sig);
    const std::string sig_name = name != nullptr ? name : "signal " + std::to_string(sig);
    a.evidence["signal"] = sig;
    a.evidence["signal_name"] = sig_name;
    if (WCOREDUMP(wait_status)) a.evidence["core_dumped"] = true;
    how = "died (" + sig_name + (WCOREDUMP(wait_status) ? ", core dumped)" : ")");
  } else {
    a.evidence["exit_code"] = code;
    how = "exited with status " + std::to_string(code);
  }
  a.evidence["orderly_exit_recorded"] = r.orderly_exit;
  if (r.last_event_ns != 0) a.evidence["seconds_since_last_event"] = SecondsBetween(r.last_event_ns, now_ns);
  a.message = "rank " + std::to_string(rank) + " " + how + StepSuffix(r.last_step_begun);
  out->push_back(std::move(a));
}

// ---------------------------------------------------------------------------------------------
// hang

struct HangDetector::State {
  struct Open {
    uint64_t begin_ns = 0;
    Op op = Op::kOther;
    uint64_t step = kNoStep;
    bool posted = false;
  };
  struct RankState {
    bool alive = true;
    bool finished = false;  // kProcessExit seen: no more steps expected
    uint64_t last_event_ns = 0;
    uint64_t step = kNoStep;
    bool step_open = false;
    uint64_t step_begin_ns = 0;
    uint64_t step_reported_begin_ns = 0;  // the open step already reported as a stall
    std::map<uint32_t, uint64_t> last_begun;               // per comm
    std::map<uint32_t, std::map<uint64_t, Open>> open;     // per comm, per seq: begun, not ended
  };

  HangConfig config;
  int world = 0;
  std::vector<RankState> ranks;
  CommMembers members;
  std::map<std::pair<uint32_t, Op>, std::deque<uint64_t>> collective_history;  // per-rank durations
  std::deque<uint64_t> step_history;
  std::map<uint32_t, uint64_t> reported_through;  // per comm: open seqs up to this were reported

  // Per-rank durations: the window of `window` operations holds world x window of them.
  size_t HistoryCapacity() const { return static_cast<size_t>(std::max<uint32_t>(config.window, 1)) * std::max(world, 1); }

  void Remember(std::deque<uint64_t>* history, uint64_t duration) {
    history->push_back(duration);
    while (history->size() > HistoryCapacity()) history->pop_front();
  }

  uint64_t Timeout(const std::deque<uint64_t>* history) const {
    double longest = 0;
    if (history != nullptr && !history->empty()) longest = Seconds(*std::max_element(history->begin(), history->end()));
    const double t = std::min(std::max(config.multiplier * longest, config.floor_seconds), config.cap_seconds);
    return Nanos(t);
  }

  bool CheckCollectives(uint64_t now, std::vector<Anomaly>* out, bool* any_open);
  void CheckSteps(uint64_t now, std::vector<Anomaly>* out);
};

HangDetector::HangDetector(const HangConfig& config) : state_(std::make_unique<State>()) { state_->config = config; }
HangDetector::~HangDetector() = default;

void HangDetector::Reset(int world) {
  const HangConfig config = state_->config;
  *state_ = State{};
  state_->config = config;
  state_->world = std::max(world, 0);
  state_->ranks.assign(static_cast<size_t>(state_->world), {});
  state_->members.Reset(state_->world);
}

void HangDetector::Observe(int rank, const Event& e) {
  State& s = *state_;
  if (rank < 0 || rank >= s.world) return;
  State::RankState& r = s.ranks[rank];
  r.last_event_ns = std::max(r.last_event_ns, e.time_ns);
  switch (e.type) {
    case EventType::kStepBegin:
      r.step = e.step;
      r.step_open = true;
      r.step_begin_ns = e.time_ns;
      break;
    case EventType::kStepEnd:
      if (r.step_open && e.time_ns >= r.step_begin_ns) s.Remember(&s.step_history, e.time_ns - r.step_begin_ns);
      r.step_open = false;
      break;
    case EventType::kCollectiveBegin: {
      s.members.Saw(e.comm, rank);
      uint64_t& last = r.last_begun[e.comm];
      last = std::max(last, e.seq);
      auto& open = r.open[e.comm];
      open[e.seq] = State::Open{e.time_ns, e.op, e.step, false};
      DropOldest(&open);
      break;
    }
    case EventType::kCollectivePosted: {
      auto comm = r.open.find(e.comm);
      if (comm == r.open.end()) break;
      if (auto it = comm->second.find(e.seq); it != comm->second.end()) it->second.posted = true;
      break;
    }
    case EventType::kCollectiveEnd: {
      auto comm = r.open.find(e.comm);
      if (comm == r.open.end()) break;
      auto it = comm->second.find(e.seq);
      if (it == comm->second.end()) break;
      if (e.time_ns >= it->second.begin_ns)
        s.Remember(&s.collective_history[{e.comm, it->second.op}], e.time_ns - it->second.begin_ns);
      // Older seqs on this comm have completed too; their End was lost.
      comm->second.erase(comm->second.begin(), std::next(it));
      break;
    }
    case EventType::kProcessExit:
      r.finished = true;
      r.step_open = false;
      break;
    default:
      break;
  }
}

void HangDetector::RankExited(int rank, int, bool, uint64_t, std::vector<Anomaly>*) {
  if (rank >= 0 && rank < state_->world) state_->ranks[rank].alive = false;
}

bool HangDetector::State::CheckCollectives(uint64_t now, std::vector<Anomaly>* out, bool* any_open) {
  // comm -> seq -> the live ranks inside it.
  std::map<uint32_t, std::map<uint64_t, std::vector<int>>> inside;
  for (int rank = 0; rank < world; ++rank) {
    if (!ranks[rank].alive) continue;
    for (const auto& [comm, seqs] : ranks[rank].open)
      for (const auto& [seq, open] : seqs) inside[comm][seq].push_back(rank);
  }
  *any_open = !inside.empty();
  bool fired = false;
  for (const auto& [comm, seqs] : inside) {
    const uint64_t through = reported_through.count(comm) ? reported_through[comm] : 0;
    for (const auto& [seq, in] : seqs) {
      if (seq <= through) continue;
      const State::Open* first = nullptr;
      for (int rank : in) {
        const State::Open& o = ranks[rank].open[comm][seq];
        if (first == nullptr || o.begin_ns < first->begin_ns) first = &o;
      }
      const auto history = collective_history.find({comm, first->op});
      const std::deque<uint64_t>* h = history == collective_history.end() ? nullptr : &history->second;
      const uint64_t timeout = Timeout(h);
      const uint64_t waited = now > first->begin_ns ? now - first->begin_ns : 0;
      if (waited <= timeout) continue;

      std::vector<int> live_members;
      std::vector<int> exited;
      for (int m : members.Members(comm)) (ranks[m].alive ? live_members : exited).push_back(m);
      std::vector<int> never_joined;
      for (int m : live_members) {
        auto it = ranks[m].last_begun.find(comm);
        if (it == ranks[m].last_begun.end() || it->second < seq) never_joined.push_back(m);
      }
      std::vector<int> not_posted;
      for (int rank : in)
        if (!ranks[rank].open[comm][seq].posted) not_posted.push_back(rank);

      std::vector<int> culprits;
      std::vector<int> waiting;
      std::string what;
      const std::string name =
          std::string(trace::OpName(first->op)) + " #" + std::to_string(seq) + " (comm " + std::to_string(comm) + ")";
      if (!never_joined.empty()) {
        culprits = never_joined;
        waiting = in;
        what = Ranks(culprits) + " never joined " + name + StepSuffix(first->step) + "; " + Ranks(waiting) +
               " waited " + Duration(Seconds(waited));
      } else if (!not_posted.empty() && not_posted.size() < in.size()) {
        culprits = not_posted;
        for (int rank : in)
          if (!std::binary_search(culprits.begin(), culprits.end(), rank)) waiting.push_back(rank);
        what = Ranks(culprits) + " never posted " + (culprits.size() == 1 ? "its" : "their") + " part of " + name +
               StepSuffix(first->step) + "; " + Ranks(waiting) + " waited " + Duration(Seconds(waited));
      } else {
        culprits = in;
        waiting = in;
        what = Ranks(culprits) + " stuck in " + name + StepSuffix(first->step) + " for " + Duration(Seconds(waited)) +
               " (every member joined it; no rank stands out)";
      }
      if (!exited.empty()) what += "; exited: " + RankList(exited);

      Anomaly a;
      a.kind = "hang";
      a.ranks = culprits;
      a.step = KnownStep(first->step);
      a.seq = seq;
      a.comm = comm;
      a.op = trace::OpName(first->op);
      a.evidence["timeout_seconds"] = Seconds(timeout);
      a.evidence["waited_seconds"] = Seconds(waited);
      a.evidence["waiting_ranks"] = waiting;
      a.evidence["history_size"] = h == nullptr ? 0 : h->size();
      if (!exited.empty()) a.evidence["exited_ranks"] = exited;
      a.message = what;
      a.detected_ns = now;
      out->push_back(std::move(a));
      // Every seq open on this comm now belongs to this stall.
      reported_through[comm] = seqs.rbegin()->first;
      fired = true;
      break;
    }
  }
  return fired;
}

void HangDetector::State::CheckSteps(uint64_t now, std::vector<Anomaly>* out) {
  const uint64_t timeout = Timeout(&step_history);
  uint64_t waited = 0;
  bool stalled = false;
  std::vector<int> participants;
  for (int rank = 0; rank < world; ++rank) {
    const RankState& r = ranks[rank];
    if (!r.alive || r.finished || r.step == kNoStep) continue;
    participants.push_back(rank);
    if (!r.step_open || r.step_begin_ns == r.step_reported_begin_ns || now <= r.step_begin_ns) continue;
    waited = std::max(waited, now - r.step_begin_ns);
    if (now - r.step_begin_ns > timeout) stalled = true;
  }
  if (!stalled) return;

  uint64_t lowest = kNoStep;
  for (int rank : participants) lowest = std::min(lowest, ranks[rank].step);
  std::vector<int> culprits;
  std::vector<int> others;
  std::string what;
  uint64_t longest_silence = 0;
  for (int rank : participants)
    longest_silence = std::max(longest_silence, now > ranks[rank].last_event_ns ? now - ranks[rank].last_event_ns : 0);
  bool all_same = true;
  for (int rank : participants) all_same = all_same && ranks[rank].step == lowest;
  for (int rank : participants) {
    const uint64_t silence = now > ranks[rank].last_event_ns ? now - ranks[rank].last_event_ns : 0;
    // At one step, the culprits are those silent about as long as the most silent one.
    const bool culprit = all_same ? 2 * silence >= longest_silence : ranks[rank].step == lowest;
    (culprit ? culprits : others).push_back(rank);
  }
  if (!all_same) {
    what = Ranks(culprits) + " stuck at step " + std::to_string(lowest) + " for " + Duration(Seconds(waited)) +
           " with no collective open; " + Ranks(others) + " went on";
  } else {
    what = Ranks(culprits) + " silent for " + Duration(Seconds(longest_silence)) + " in step " + std::to_string(lowest) +
           " (open " + Duration(Seconds(waited)) + ", no collective open)" +
           (others.empty() ? "" : "; " + Ranks(others) + " still report");
  }
  for (RankState& r : ranks)
    if (r.step_open) r.step_reported_begin_ns = r.step_begin_ns;

  Anomaly a;
  a.kind = "hang";
  a.ranks = culprits;
  a.step = KnownStep(lowest);
  a.evidence["timeout_seconds"] = Seconds(timeout);
  a.evidence["waited_seconds"] = Seconds(waited);
  a.evidence["waiting_ranks"] = others;
  a.evidence["history_size"] = step_history.size();
  a.evidence["silent_seconds"] = Seconds(longest_silence);
  a.message = what;
  a.detected_ns = now;
  out->push_back(std::move(a));
}

void HangDetector::Poll(uint64_t now_ns, std::vector<Anomaly>* out) {
  bool any_open = false;
  state_->CheckCollectives(now_ns, out, &any_open);
  // A step with a collective open somewhere is the collective's business.
  if (!any_open) state_->CheckSteps(now_ns, out);
}

// ---------------------------------------------------------------------------------------------
// straggler

namespace {

// One collective (lateness) or one step (compute): a value per rank, NaN where it has none.
struct Entry {
  uint32_t comm = 0;
  uint64_t seq = 0;
  uint64_t step = kNoStep;
  Op op = Op::kOther;
  std::vector<double> value;  // begin offsets (seconds) or compute times
};

// One rank over a window of entries.
struct Verdict {
  size_t judged = 0;    // entries in which the rank and at least one peer have a value
  size_t outliers = 0;
  std::vector<double> own_excess, peer_excess, own_value, peer_value, z;
  double fraction() const { return judged == 0 ? 0 : static_cast<double>(outliers) / judged; }
};

Verdict Judge(const std::deque<Entry>& entries, int rank, const StragglerConfig& c) {
  Verdict v;
  for (const Entry& e : entries) {
    if (rank >= static_cast<int>(e.value.size()) || std::isnan(e.value[rank])) continue;
    std::vector<double> all;
    for (double x : e.value)
      if (!std::isnan(x)) all.push_back(x);
    if (all.size() < 2) continue;
    ++v.judged;
    const double x = e.value[rank];
    double excess;
    double z = kNaN;
    bool outlier;
    double centre;
    if (all.size() == 2) {
      // No spread to measure: the peer is the reference.
      centre = all[0] + all[1] - x;
      excess = x - centre;
      outlier = excess > c.min_lateness_seconds;
    } else {
      centre = Median(all);
      excess = x - centre;
      z = excess / RobustSigma(all, centre);
      outlier = excess > c.min_lateness_seconds && z > c.mad_threshold;
    }
    if (outlier) ++v.outliers;
    v.own_excess.push_back(excess);
    v.own_value.push_back(x);
    if (std::isfinite(z)) v.z.push_back(z);
    for (size_t p = 0; p < e.value.size(); ++p) {
      if (static_cast<int>(p) == rank || std::isnan(e.value[p])) continue;
      v.peer_excess.push_back(e.value[p] - centre);
      v.peer_value.push_back(e.value[p]);
    }
  }
  return v;
}

}  // namespace

struct StragglerDetector::State {
  struct Begins {
    Op op = Op::kOther;
    uint64_t step = kNoStep;
    std::vector<uint64_t> begin_ns;  // per rank; 0: not yet
  };
  struct RankState {
    bool alive = true;
    bool step_open = false;
    uint64_t step = kNoStep;
    uint64_t step_begin_ns = 0;
    bool compute_taken = false;  // this step's first collective seen
    bool reported = false;
    uint64_t reported_ns = 0;
  };

  StragglerConfig config;
  int world = 0;
  std::vector<RankState> ranks;
  CommMembers members;
  std::map<uint32_t, std::map<uint64_t, Begins>> pending_begins;
  std::map<uint64_t, std::vector<double>> pending_compute;  // per step
  std::map<uint32_t, std::deque<Entry>> lateness;          // per comm
  std::deque<Entry> compute;
  bool dirty = false;

  void Push(std::deque<Entry>* window, Entry e) {
    window->push_back(std::move(e));
    while (window->size() > std::max<uint32_t>(config.window, 1)) window->pop_front();
    dirty = true;
  }
  void OnBegin(int rank, const Event& e);
};

void StragglerDetector::State::OnBegin(int rank, const Event& e) {
  members.Saw(e.comm, rank);
  auto& comm = pending_begins[e.comm];
  Begins& b = comm[e.seq];
  if (b.begin_ns.empty()) {
    b.begin_ns.assign(static_cast<size_t>(world), 0);
    b.op = e.op;
    b.step = e.step;
  }
  b.begin_ns[rank] = e.time_ns;
  std::vector<int> live;
  bool complete = true;
  for (int m : members.Members(e.comm)) {
    if (!ranks[m].alive) continue;
    live.push_back(m);
    complete = complete && b.begin_ns[m] != 0;
  }
  if (complete) {
    if (live.size() >= 2) {
      uint64_t first = std::numeric_limits<uint64_t>::max();
      for (int m : live) first = std::min(first, b.begin_ns[m]);
      Entry entry{e.comm, e.seq, b.step, b.op, std::vector<double>(static_cast<size_t>(world), kNaN)};
      for (int m : live) entry.value[m] = Seconds(b.begin_ns[m] - first);
      Push(&lateness[e.comm], std::move(entry));
    }
    comm.erase(e.seq);
  }
  DropOldest(&comm);

  RankState& r = ranks[rank];
  if (r.step_open && !r.compute_taken && e.time_ns >= r.step_begin_ns) {
    r.compute_taken = true;
    std::vector<double>& c = pending_compute[r.step];
    if (c.empty()) c.assign(static_cast<size_t>(world), kNaN);
    c[rank] = Seconds(e.time_ns - r.step_begin_ns);
    size_t have = 0, alive = 0;
    for (int m = 0; m < world; ++m) {
      if (!ranks[m].alive) continue;
      ++alive;
      if (!std::isnan(c[m])) ++have;
    }
    if (have == alive) {
      if (have >= 2) Push(&compute, Entry{e.comm, e.seq, r.step, e.op, c});
      pending_compute.erase(r.step);
    }
    DropOldest(&pending_compute);
  }
}

StragglerDetector::StragglerDetector(const StragglerConfig& config) : state_(std::make_unique<State>()) {
  state_->config = config;
}
StragglerDetector::~StragglerDetector() = default;

void StragglerDetector::Reset(int world) {
  const StragglerConfig config = state_->config;
  *state_ = State{};
  state_->config = config;
  state_->world = std::max(world, 0);
  state_->ranks.assign(static_cast<size_t>(state_->world), {});
  state_->members.Reset(state_->world);
}

void StragglerDetector::Observe(int rank, const Event& e) {
  State& s = *state_;
  if (rank < 0 || rank >= s.world) return;
  State::RankState& r = s.ranks[rank];
  switch (e.type) {
    case EventType::kStepBegin:
      r.step_open = true;
      r.step = e.step;
      r.step_begin_ns = e.time_ns;
      r.compute_taken = false;
      break;
    case EventType::kStepEnd:
    case EventType::kProcessExit:
      r.step_open = false;
      break;
    case EventType::kCollectiveBegin:
      s.OnBegin(rank, e);
      break;
    default:
      break;
  }
}

void StragglerDetector::RankExited(int rank, int, bool, uint64_t, std::vector<Anomaly>*) {
  if (rank >= 0 && rank < state_->world) state_->ranks[rank].alive = false;
}

void StragglerDetector::Poll(uint64_t now_ns, std::vector<Anomaly>* out) {
  State& s = *state_;
  if (!s.dirty) return;
  s.dirty = false;
  const StragglerConfig& c = s.config;
  const size_t window = std::max<uint32_t>(c.window, 1);

  struct Finding {
    int rank;
    Verdict late, comp;
    const Entry* latest;  // the newest entry of the comm judged for lateness
    double score;
  };
  std::vector<Finding> found;
  for (int rank = 0; rank < s.world; ++rank) {
    const State::RankState& r = s.ranks[rank];
    if (!r.alive) continue;
    if (r.reported && now_ns - std::min(now_ns, r.reported_ns) < Nanos(c.cooldown_seconds)) continue;
    Verdict late;
    const Entry* latest = nullptr;
    for (const auto& [comm, entries] : s.lateness) {
      Verdict v = Judge(entries, rank, c);
      if (v.judged < window) continue;
      if (latest == nullptr || v.fraction() > late.fraction()) {
        late = std::move(v);
        latest = &entries.back();
      }
    }
    Verdict comp = Judge(s.compute, rank, c);
    const bool by_late = late.judged >= window && late.fraction() >= c.min_fraction;
    const bool by_comp = comp.judged >= window && comp.fraction() >= c.min_fraction;
    if (!by_late && !by_comp) continue;
    if (latest == nullptr && !s.compute.empty()) latest = &s.compute.back();
    found.push_back({rank, std::move(late), std::move(comp), latest, 0});
    Finding& f = found.back();
    f.score = std::max(by_late ? f.late.fraction() : 0.0, by_comp ? f.comp.fraction() : 0.0);
  }
  if (found.empty()) return;

  Anomaly a;
  a.kind = "straggler";
  a.detected_ns = now_ns;
  const Finding* worst = &found[0];
  for (const Finding& f : found)
    if (f.score > worst->score) worst = &f;
  nlohmann::json per_rank = nlohmann::json::object();
  std::vector<std::string> clauses;
  std::string op_name;
  if (worst->latest != nullptr) {
    op_name = trace::OpName(worst->latest->op);
    a.step = KnownStep(worst->latest->step);
    a.seq = worst->latest->seq;
    a.comm = worst->latest->comm;
    a.op = op_name;
  }
  for (Finding& f : found) {
    a.ranks.push_back(f.rank);
    s.ranks[f.rank].reported = true;
    s.ranks[f.rank].reported_ns = now_ns;
    const bool by_comp = f.comp.judged >= window && f.comp.fraction() >= c.min_fraction &&
                         f.comp.fraction() >= (f.late.judged >= window ? f.late.fraction() : 0.0);
    const Verdict& basis = by_comp ? f.comp : f.late;
    nlohmann::json e;
    e["lateness_median_seconds"] = Number(Median(f.late.own_excess));
    e["peers_lateness_median_seconds"] = Number(Median(f.late.peer_excess));
    e["compute_median_seconds"] = Number(Median(f.comp.own_value));
    e["peers_compute_median_seconds"] = Number(Median(f.comp.peer_value));
    e["z"] = Number(Median(basis.z));
    e["window"] = window;
    e["fraction"] = basis.fraction();
    e["basis"] = by_comp ? "compute" : "lateness";
    std::string clause = "rank " + std::to_string(f.rank) + " is " +
                         Duration(Median(f.late.own_excess)) + " late into " +
                         (op_name.empty() ? std::string("collectives") : op_name) + " (peers " +
                         Duration(Median(f.late.peer_excess)) + ")";
    if (!f.comp.own_value.empty())
      clause += ", computes " + Duration(Median(f.comp.own_value)) + " per step (peers " +
                Duration(Median(f.comp.peer_value)) + ")";
    clause += ", an outlier in " + std::to_string(basis.outliers) + " of the last " + std::to_string(basis.judged) +
              (by_comp ? " steps" : " collectives");
    clauses.push_back(clause);
    if (&f == worst) a.evidence = e;
    per_rank[std::to_string(f.rank)] = std::move(e);
  }
  a.evidence["per_rank"] = std::move(per_rank);
  a.message = "straggler" + StepSuffix(a.step.value_or(kNoStep)) + ": ";
  for (size_t i = 0; i < clauses.size(); ++i) a.message += (i ? "; " : "") + clauses[i];
  out->push_back(std::move(a));
}

// ---------------------------------------------------------------------------------------------
// slow_collective

struct SlowCollectiveDetector::State {
  struct Record {
    Op op = Op::kOther;
    uint64_t step = kNoStep;
    std::vector<uint64_t> begin, posted, end;  // per rank; 0: not yet
  };
  struct Sample {
    uint64_t seq = 0;
    uint64_t step = kNoStep;
    double duration = 0;
    std::vector<double> posted_delay;  // per rank; NaN without a CollectivePosted
  };
  struct OpStats {
    std::vector<double> baseline;
    std::deque<Sample> recent;
    bool dirty = false;
    bool reported = false;
    uint64_t reported_ns = 0;
  };

  SlowCollectiveConfig config;
  int world = 0;
  std::vector<bool> alive;
  CommMembers members;
  std::map<uint32_t, std::map<uint64_t, Record>> pending;
  std::map<std::pair<uint32_t, Op>, OpStats> stats;

  Record& Touch(uint32_t comm, uint64_t seq) {
    Record& rec = pending[comm][seq];
    if (rec.begin.empty()) {
      rec.begin.assign(static_cast<size_t>(world), 0);
      rec.posted.assign(static_cast<size_t>(world), 0);
      rec.end.assign(static_cast<size_t>(world), 0);
    }
    return rec;
  }
  void MaybeComplete(uint32_t comm, uint64_t seq);
  void Check(uint32_t comm, Op op, OpStats* st, uint64_t now, std::vector<Anomaly>* out);
};

void SlowCollectiveDetector::State::MaybeComplete(uint32_t comm, uint64_t seq) {
  auto& recs = pending[comm];
  const Record& rec = recs[seq];
  std::vector<int> live;
  for (int m : members.Members(comm)) {
    if (!alive[m]) continue;
    if (rec.begin[m] == 0 || rec.end[m] == 0) return;
    live.push_back(m);
  }
  if (live.empty()) return;
  uint64_t last_begin = 0, last_end = 0;
  Sample sample;
  sample.seq = seq;
  sample.step = rec.step;
  sample.posted_delay.assign(static_cast<size_t>(world), kNaN);
  for (int m : live) {
    last_begin = std::max(last_begin, rec.begin[m]);
    last_end = std::max(last_end, rec.end[m]);
    if (rec.posted[m] != 0) sample.posted_delay[m] = SecondsBetween(rec.begin[m], rec.posted[m]);
  }
  sample.duration = SecondsBetween(last_begin, last_end);
  OpStats& st = stats[{comm, rec.op}];
  if (st.baseline.size() < std::max<uint32_t>(config.baseline_window, 1)) {
    st.baseline.push_back(sample.duration);
  } else {
    st.recent.push_back(std::move(sample));
    while (st.recent.size() > std::max<uint32_t>(config.recent_window, 1)) st.recent.pop_front();
    st.dirty = true;
  }
  recs.erase(seq);
}

void SlowCollectiveDetector::State::Check(uint32_t comm, Op op, OpStats* st, uint64_t now,
                                          std::vector<Anomaly>* out) {
  const SlowCollectiveConfig& c = config;
  if (st->recent.size() < std::max<uint32_t>(c.recent_window, 1)) return;
  if (st->reported && now - std::min(now, st->reported_ns) < Nanos(c.cooldown_seconds)) return;
  const double base = Median(st->baseline);
  std::vector<double> durations;
  for (const Sample& s : st->recent) durations.push_back(s.duration);
  const double recent = Median(durations);
  if (!(recent > c.factor * base && recent - base > c.min_excess_seconds)) return;

  // Each rank's median posted delay over the recent window, against its peers'.
  std::vector<std::pair<int, double>> delays;
  for (int r = 0; r < world; ++r) {
    std::vector<double> v;
    for (const Sample& s : st->recent)
      if (!std::isnan(s.posted_delay[r])) v.push_back(s.posted_delay[r]);
    if (!v.empty() && 2 * v.size() >= st->recent.size()) delays.push_back({r, Median(v)});
  }
  std::vector<int> culprits;
  nlohmann::json culprit_delays = nlohmann::json::object();
  double peers_for_message = kNaN;
  if (delays.size() >= 2) {
    double top = -1, second = -1;
    for (const auto& [r, d] : delays) {
      if (d > top) {
        second = top;
        top = d;
      } else if (d > second) {
        second = d;
      }
    }
    for (const auto& [r, d] : delays) {
      std::vector<double> peers;
      for (const auto& [p, dp] : delays)
        if (p != r) peers.push_back(dp);
      const double peer_median = Median(peers);
      const double z = (d - peer_median) / RobustSigma(peers, peer_median);
      const bool clear_max = d == top && top - second > c.min_excess_seconds;
      if (d - peer_median > c.min_excess_seconds && (z > 3 || clear_max)) {
        culprits.push_back(r);
        culprit_delays[std::to_string(r)] = d;
      }
    }
    std::vector<double> others;
    for (const auto& [r, d] : delays)
      if (!std::binary_search(culprits.begin(), culprits.end(), r)) others.push_back(d);
    peers_for_message = Median(others);
  }

  const std::string name = std::string(trace::OpName(op)) + " on comm " + std::to_string(comm);
  Anomaly a;
  a.kind = "slow_collective";
  a.ranks = culprits;
  a.step = KnownStep(st->recent.back().step);
  a.seq = st->recent.back().seq;
  a.comm = comm;
  a.op = trace::OpName(op);
  a.evidence["baseline_median_seconds"] = base;
  a.evidence["recent_median_seconds"] = recent;
  a.evidence["factor"] = base > 0 ? Number(recent / base) : nlohmann::json(nullptr);
  a.evidence["factor_threshold"] = c.factor;
  a.evidence["baseline_window"] = st->baseline.size();
  a.evidence["recent_window"] = st->recent.size();
  a.evidence["posted_delay_median_seconds"] = culprit_delays;
  a.evidence["peers_posted_delay_median_seconds"] = Number(peers_for_message);
  std::string what = name + " slowed to " + Duration(recent) + " (median of the last " +
                     std::to_string(st->recent.size()) + ", baseline " + Duration(base) +
                     (base > 0 ? ", x" + Fmt("%.1f", recent / base) : std::string()) + ")";
  if (culprits.empty()) {
    what += ": no rank stands out, the whole communicator is slow";
  } else {
    std::string each;
    for (int r : culprits)
      each += (each.empty() ? "" : ", ") + Duration(culprit_delays[std::to_string(r)].get<double>());
    what += ": " + Ranks(culprits) + " post" + (culprits.size() == 1 ? "s " : " ") + (culprits.size() == 1 ? "its" : "their") +
            " part " + each + " after entering (peers " + Duration(peers_for_message) + ")";
  }
  a.message = what + StepSuffix(st->recent.back().step);
  a.detected_ns = now;
  out->push_back(std::move(a));
  st->reported = true;
  st->reported_ns = now;
}

SlowCollectiveDetector::SlowCollectiveDetector(const SlowCollectiveConfig& config) : state_(std::make_unique<State>()) {
  state_->config = config;
}
SlowCollectiveDetector::~SlowCollectiveDetector() = default;

void SlowCollectiveDetector::Reset(int world) {
  const SlowCollectiveConfig config = state_->config;
  *state_ = State{};
  state_->config = config;
  state_->world = std::max(world, 0);
  state_->alive.assign(static_cast<size_t>(state_->world), true);
  state_->members.Reset(state_->world);
}

void SlowCollectiveDetector::Observe(int rank, const Event& e) {
  State& s = *state_;
  if (rank < 0 || rank >= s.world) return;
  switch (e.type) {
    case EventType::kCollectiveBegin: {
      s.members.Saw(e.comm, rank);
      State::Record& rec = s.Touch(e.comm, e.seq);
      if (std::all_of(rec.begin.begin(), rec.begin.end(), [](uint64_t t) { return t == 0; })) {
        rec.op = e.op;
        rec.step = e.step;
      }
      rec.begin[rank] = e.time_ns;
      DropOldest(&s.pending[e.comm]);
      break;
    }
    case EventType::kCollectivePosted:
      s.Touch(e.comm, e.seq).posted[rank] = e.time_ns;
      break;
    case EventType::kCollectiveEnd:
      s.Touch(e.comm, e.seq).end[rank] = e.time_ns;
      s.MaybeComplete(e.comm, e.seq);
      DropOldest(&s.pending[e.comm]);
      break;
    default:
      break;
  }
}

void SlowCollectiveDetector::RankExited(int rank, int, bool, uint64_t, std::vector<Anomaly>*) {
  if (rank >= 0 && rank < state_->world) state_->alive[rank] = false;
}

void SlowCollectiveDetector::Poll(uint64_t now_ns, std::vector<Anomaly>* out) {
  for (auto& [key, st] : state_->stats) {
    if (!st.dirty) continue;
    st.dirty = false;
    state_->Check(key.first, key.second, &st, now_ns, out);
  }
}

// ---------------------------------------------------------------------------------------------
// checkpoint

struct CheckpointDetector::State {
  struct Save {
    uint64_t step = kNoStep;
    uint64_t begin_ns = 0;
    uint64_t persisted_ns = 0;  // 0: not yet
    uint64_t interval_ns = 0;   // since the previous save began; 0: the first save seen
  };
  struct RankState {
    bool alive = true;
    std::deque<Save> saves;  // by begin time
    bool reported = false;
    uint64_t reported_ns = 0;
  };
  struct Failure {
    int rank;
    uint64_t step;
    uint64_t code;
  };

  CheckpointConfig config;
  int world = 0;
  std::vector<RankState> ranks;
  std::vector<Failure> failures;  // not yet reported
  struct Fallback {
    int rank;
    uint64_t skipped_step;
    uint64_t loaded_step;
    bool memory;
  };
  std::vector<Fallback> fallbacks;  // not yet reported

  size_t Keep() const { return static_cast<size_t>(config.lag_count) + 8; }
  void Add(RankState* r, Save save) {
    if (!r->saves.empty()) {
      const Save& prev = r->saves.back();
      if (save.begin_ns <= prev.begin_ns) return;  // out of order: cannot place it
      save.interval_ns = save.begin_ns - prev.begin_ns;
    }
    r->saves.push_back(save);
    while (r->saves.size() > Keep()) r->saves.pop_front();
  }
  void ReportFailures(uint64_t now, std::vector<Anomaly>* out);
  void CheckLag(uint64_t now, std::vector<Anomaly>* out);
};

CheckpointDetector::CheckpointDetector(const CheckpointConfig& config) : state_(std::make_unique<State>()) {
  state_->config = config;
}
CheckpointDetector::~CheckpointDetector() = default;

void CheckpointDetector::Reset(int world) {
  const CheckpointConfig config = state_->config;
  *state_ = State{};
  state_->config = config;
  state_->world = std::max(world, 0);
  state_->ranks.assign(static_cast<size_t>(state_->world), {});
}

void CheckpointDetector::Observe(int rank, const Event& e) {
  State& s = *state_;
  if (rank < 0 || rank >= s.world) return;
  State::RankState& r = s.ranks[rank];
  auto find = [&r](uint64_t step) {
    return std::find_if(r.saves.rbegin(), r.saves.rend(), [step](const State::Save& x) { return x.step == step; });
  };
  switch (e.type) {
    case EventType::kCheckpointBegin:
      if (find(e.step) == r.saves.rend()) s.Add(&r, State::Save{e.step, e.time_ns, 0, 0});
      break;
    case EventType::kCheckpointPersisted: {
      auto it = find(e.step);
      if (it != r.saves.rend()) {
        if (it->persisted_ns == 0) it->persisted_ns = std::max(e.time_ns, it->begin_ns);
      } else if (e.duration_ns > 0 && e.time_ns > e.duration_ns) {
        s.Add(&r, State::Save{e.step, e.time_ns - e.duration_ns, e.time_ns, 0});
      }
      break;
    }
    case EventType::kCheckpointFallback:
      s.fallbacks.push_back({rank, e.step, e.bytes, e.aux == 1});
      break;
    case EventType::kCheckpointFailed: {
      s.failures.push_back({rank, e.step, e.aux});
      auto it = find(e.step);
      if (it != r.saves.rend() && it->persisted_ns == 0) r.saves.erase(std::next(it).base());
      break;
    }
    default:
      break;
  }
}

void CheckpointDetector::RankExited(int rank, int, bool, uint64_t, std::vector<Anomaly>*) {
  if (rank >= 0 && rank < state_->world) state_->ranks[rank].alive = false;
}

void CheckpointDetector::State::ReportFailures(uint64_t now, std::vector<Anomaly>* out) {
  // A load that passed over a damaged checkpoint: one anomaly per skipped step, naming the ranks.
  std::map<std::pair<uint64_t, bool>, std::vector<const Fallback*>> skipped;
  for (const Fallback& f : fallbacks) skipped[{f.skipped_step, f.memory}].push_back(&f);
  for (const auto& [key, list] : skipped) {
    Anomaly a;
    a.kind = "checkpoint";
    a.step = KnownStep(key.first);
    a.detected_ns = now;
    for (const Fallback* f : list) a.ranks.push_back(f->rank);
    std::sort(a.ranks.begin(), a.ranks.end());
    a.ranks.erase(std::unique(a.ranks.begin(), a.ranks.end()), a.ranks.end());
    const uint64_t loaded = list.front()->loaded_step;
    a.evidence["fallback"] = true;
    a.evidence["skipped_step"] = key.first;
    a.evidence["loaded_step"] = loaded;
    a.evidence["location"] = key.second ? "memory" : "disk";
    a.message = std::string("the checkpoint of step ") + std::to_string(key.first) + (key.second ? " in memory" : " on disk") +
                " could not be loaded by " + Ranks(a.ranks) + ", which loaded step " + std::to_string(loaded) + " instead";
    out->push_back(std::move(a));
  }
  fallbacks.clear();
  std::map<uint64_t, std::vector<Failure>> by_step;
  for (const Failure& f : failures) by_step[f.step].push_back(f);
  failures.clear();
  for (auto& [step, list] : by_step) {
    std::sort(list.begin(), list.end(), [](const Failure& a, const Failure& b) { return a.rank < b.rank; });
    Anomaly a;
    a.kind = "checkpoint";
    a.step = KnownStep(step);
    a.detected_ns = now;
    nlohmann::json codes = nlohmann::json::object();
    for (const Failure& f : list) {
      if (a.ranks.empty() || a.ranks.back() != f.rank) a.ranks.push_back(f.rank);
      codes[std::to_string(f.rank)] = f.code;
    }
    const uint64_t code = list.front().code;
    const char* code_name = StatusCodeName(static_cast<StatusCode>(code));
    a.evidence["status_code"] = code;
    a.evidence["status"] = code_name;
    a.evidence["status_codes"] = codes;
    a.message = "checkpoint" + (step == kNoStep ? std::string() : " of step " + std::to_string(step)) +
                " failed on " + Ranks(a.ranks) + ": " + code_name + " (code " + std::to_string(code) + ")";
    out->push_back(std::move(a));
  }
}

void CheckpointDetector::State::CheckLag(uint64_t now, std::vector<Anomaly>* out) {
  const size_t need = std::max<uint32_t>(config.lag_count, 1);
  std::vector<int> lagging;
  nlohmann::json per_rank = nlohmann::json::object();
  nlohmann::json first;
  uint64_t newest_step = kNoStep;
  std::string detail;
  for (int rank = 0; rank < world; ++rank) {
    RankState& r = ranks[rank];
    if (!r.alive) continue;
    if (r.reported && now - std::min(now, r.reported_ns) < Nanos(config.cooldown_seconds)) continue;
    std::vector<const Save*> run;  // newest first
    size_t pending = 0;
    for (auto it = r.saves.rbegin(); it != r.saves.rend() && run.size() < need; ++it) {
      if (it->interval_ns == 0) break;  // the first save seen: no cadence to compare with
      const double limit = config.lag_factor * Seconds(it->interval_ns);
      const uint64_t end = it->persisted_ns != 0 ? it->persisted_ns : now;
      const bool late = SecondsBetween(it->begin_ns, end) > limit;
      if (late) {
        run.push_back(&*it);
        if (it->persisted_ns == 0) ++pending;
        continue;
      }
      // The newest save, still within its time, decides nothing yet.
      if (it->persisted_ns == 0 && run.empty() && it == r.saves.rbegin()) continue;
      break;
    }
    if (run.size() < need) continue;
    std::reverse(run.begin(), run.end());
    std::vector<double> persist, intervals;
    for (const Save* s : run) {
      persist.push_back(SecondsBetween(s->begin_ns, s->persisted_ns != 0 ? s->persisted_ns : now));
      intervals.push_back(Seconds(s->interval_ns));
    }
    nlohmann::json e;
    e["persist_seconds"] = persist;
    e["interval_seconds"] = Median(intervals);
    e["lag_factor"] = config.lag_factor;
    e["unpersisted"] = pending;
    if (lagging.empty()) {
      first = e;
      newest_step = run.back()->step;
      std::string list;
      for (size_t i = 0; i < run.size(); ++i)
        list += (list.empty() ? "" : ", ") + Duration(persist[i]) + (run[i]->persisted_ns == 0 ? "+" : "");
      detail = "the last " + std::to_string(run.size()) + " saves took " + list + " to persist" +
               (pending ? " (+: not yet persisted)" : "") + " with " + Duration(Median(intervals)) +
               " between saves";
    }
    per_rank[std::to_string(rank)] = std::move(e);
    lagging.push_back(rank);
    r.reported = true;
    r.reported_ns = now;
  }
  if (lagging.empty()) return;
  Anomaly a;
  a.kind = "checkpoint";
  a.ranks = lagging;
  a.step = KnownStep(newest_step);
  a.evidence = first;
  a.evidence["per_rank"] = per_rank;
  a.message = "checkpoint persistence cannot keep up on " + Ranks(lagging) + ": " +
              (lagging.size() == 1 ? "" : "on rank " + std::to_string(lagging.front()) + ", ") + detail +
              (newest_step == kNoStep ? "" : " (newest: step " + std::to_string(newest_step) + ")");
  a.detected_ns = now;
  out->push_back(std::move(a));
}

void CheckpointDetector::Poll(uint64_t now_ns, std::vector<Anomaly>* out) {
  state_->ReportFailures(now_ns, out);
  state_->CheckLag(now_ns, out);
}

// ---------------------------------------------------------------------------------------------

std::vector<std::unique_ptr<Detector>> MakeDetectors(const AgentConfig& config) {
  std::vector<std::unique_ptr<Detector>> out;
  out.push_back(std::make_unique<DeadRankDetector>());
  out.push_back(std::make_unique<HangDetector>(config.hang));
  out.push_back(std::make_unique<StragglerDetector>(config.straggler));
  out.push_back(std::make_unique<SlowCollectiveDetector>(config.slow_collective));
  out.push_back(std::make_unique<CheckpointDetector>(config.checkpoint));
  for (auto& d : out) d->Reset(static_cast<int>(config.nproc));
  return out;
}

}  // namespace lifeline::agent
