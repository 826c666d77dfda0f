// The progress summaries of a multi-node job (agent/progress.h), sent by each node straight to the
// round's leader over TCP instead of through etcd (issue 36, item 2): etcd keeps the job's
// membership, and a summary a second from every node never touches it.
//
// Every agent of a multi-node job listens (SummaryReceiver, a port it advertises in its round
// entry); a node that is not the leader sends its summary about once a second (SummarySender) to
// the leader it finds in the plan. The wire, one TCP connection per sender, is a sequence of frames:
//   u32  length of the rest, big-endian (at most kMaxSummaryFrame)
//   u8   kind: 1 hello, 2 summary
//   hello:   the text "<job>\n<round>\n<node id>" (the first frame, once per connection)
//   summary: u8 how long ago the sender last renewed its etcd lease, in tenths of a second (255:
//            that long or longer), then the summary (formats/SPEC.md §17) compressed with zstd,
//            one zstd frame
// Each summary is answered with one byte: how long ago the leader last renewed its lease, in the
// same tenths. So a node cut off from etcd can tell whether it alone is (the others renewed after it
// could not: it stops its ranks before its lease runs out) or etcd is away for all (it goes on).
// A frame that breaks these rules closes its connection, naming the peer in
// `errors()`; the receiver keeps each node's summaries for its round until the leader takes them
// (a summary may carry only what the one before it did not), when the newest came, and whether the
// node's connection is open (what the leader needs to notice a node gone quiet).
//
// Thread safety: both are thread-safe; the receiver runs one thread of its own.
#ifndef LIFELINE_AGENT_SUMMARY_STREAM_H_
#define LIFELINE_AGENT_SUMMARY_STREAM_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lifeline/status.h"

namespace lifeline::agent {

inline constexpr uint32_t kMaxSummaryFrame = 16u << 20;    // compressed
inline constexpr size_t kMaxSummaryBytes = 64u << 20;      // decompressed

// Tenths of a second since `t`, as the wire carries them (0 to 255), and back.
uint8_t TenthsSince(std::chrono::steady_clock::time_point t);
std::chrono::steady_clock::time_point TenthsBefore(std::chrono::steady_clock::time_point now, uint8_t tenths);

// A node's newest summary as the leader holds it.
struct ReceivedSummary {
  std::string node;          // the sender's node id
  std::string summary;       // the summary text ("" until the first comes: connected only)
  std::chrono::steady_clock::time_point received{};
  bool connected = false;    // its connection is open now
  std::chrono::steady_clock::time_point closed{};  // when its connection last closed ({}: never)
  double etcd_age = 0;       // how long before its newest summary it had last renewed its lease (s)
  uint64_t frames = 0;
  uint64_t wire_bytes = 0;   // compressed bytes received from it
  // The summaries that came since the leader last took them (TakeSummaries), oldest first, at most
  // kMaxPendingSummaries: the older ones are dropped (and counted) when the leader does not read.
  std::vector<std::string> frames_pending;
  uint64_t frames_dropped = 0;
};

inline constexpr size_t kMaxPendingSummaries = 16;

class SummaryReceiver {
 public:
  // Listens on `port` (0: any free one) of every interface, for the summaries of job `job`.
  static Result<std::unique_ptr<SummaryReceiver>> Start(std::string job, uint16_t port = 0);
  ~SummaryReceiver();
  SummaryReceiver(const SummaryReceiver&) = delete;
  SummaryReceiver& operator=(const SummaryReceiver&) = delete;

  uint16_t port() const { return port_; }
  // Every node that sent a summary for `round`, with its newest one (without its text: just when
  // it came and whether the connection is open, cheap to ask often).
  std::vector<ReceivedSummary> Summaries(uint64_t round, bool with_text = true) const;
  // The nodes of `round` with summaries not taken yet, each with them (frames_pending), taken.
  std::vector<ReceivedSummary> TakeSummaries(uint64_t round);
  // Connections closed for breaking the wire's rules, each naming the peer and why (the newest 16).
  std::vector<std::string> errors() const;
  // The errors refused since the caller last asked (`*seen`: how many it has been told of; at most
  // the newest 16), for the agent's log.
  std::vector<std::string> ErrorsSince(uint64_t* seen) const;
  uint64_t wire_bytes() const;
  // What the leader answers each summary with: when it last renewed its lease.
  void set_last_renewal(std::chrono::steady_clock::time_point t) { last_renewal_ns_ = t.time_since_epoch().count(); }

 private:
  SummaryReceiver(std::string job, int listen_fd, uint16_t port);
  void Run();

  struct Peer;
  const std::string job_;
  const int listen_fd_;
  const uint16_t port_;
  int wake_[2] = {-1, -1};  // a pipe: the destructor wakes the thread
  std::atomic<int64_t> last_renewal_ns_{0};  // steady clock
  mutable std::mutex mu_;
  std::map<uint64_t, std::map<std::string, ReceivedSummary>> by_round_;  // GUARDED_BY(mu_)
  std::vector<std::string> errors_;                                     // GUARDED_BY(mu_)
  uint64_t errors_total_ = 0;                                           // GUARDED_BY(mu_)
  uint64_t wire_bytes_ = 0;                                             // GUARDED_BY(mu_)
  std::thread thread_;
};

class SummarySender {
 public:
  SummarySender(std::string job, std::string node_id);
  ~SummarySender();
  SummarySender(const SummarySender&) = delete;
  SummarySender& operator=(const SummarySender&) = delete;

  // Sends `summary` as this node's for `round` to the leader at host:port, connecting (again) when
  // the leader or the round changed or the connection broke; bounded by `timeout_seconds`.
  // Unavailable naming the leader when it cannot be reached.
  // `last_renewal`: when this node last renewed its lease, for the leader.
  Status Send(const std::string& host, uint16_t port, uint64_t round, const std::string& summary,
              double timeout_seconds = 1.0,
              std::chrono::steady_clock::time_point last_renewal = std::chrono::steady_clock::now());
  // When the leader last renewed its lease, as of its newest answer (nullopt: none yet).
  std::optional<std::chrono::steady_clock::time_point> leader_renewed() const;
  // Connects (and says hello) without a summary yet: the leader hears of this node from the start.
  Status Connect(const std::string& host, uint16_t port, uint64_t round, double timeout_seconds = 1.0);
  uint64_t wire_bytes() const { return wire_bytes_; }
  // How many connections it has made (1 the first): a summary sent on one the leader has since
  // lost is not on the leader's new one.
  uint64_t connections() const { return connections_; }

 private:
  void Close();
  Status ConnectLocked(const std::string& host, uint16_t port, uint64_t round,
                       std::chrono::steady_clock::time_point deadline, double timeout_seconds);
  const std::string job_;
  const std::string node_id_;
  mutable std::mutex mu_;
  int fd_ = -1;             // GUARDED_BY(mu_)
  std::string to_;          // GUARDED_BY(mu_): "host:port round" of the open connection
  void* zstd_ = nullptr;    // ZSTD_CCtx*, GUARDED_BY(mu_)
  std::atomic<uint64_t> wire_bytes_{0};
  std::atomic<uint64_t> connections_{0};
  std::optional<std::chrono::steady_clock::time_point> leader_renewed_;  // GUARDED_BY(mu_)
};

// Whether each of `targets` (host, port) accepts a TCP connection within `timeout_seconds`, all
// tried at once: OK, or why not (refused: nothing listens, the agent is gone; no answer: the
// machine or its network is).
std::vector<Status> ProbeAll(const std::vector<std::pair<std::string, uint16_t>>& targets, double timeout_seconds);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_SUMMARY_STREAM_H_
