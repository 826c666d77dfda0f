// A local copy of some of etcd's keys, kept current by one streaming watch (the v3 gateway's
// POST /v3/watch), so that the agents learn of a change to their job when it happens and etcd's
// work grows with the changes, not with nodes x time (issue 36).
//
// What is tracked is a list of ranges: a key, or every key under a prefix (a range ending in
// '/'). Track() replaces the list: the mirror reads the ranges once, in one transaction, at
// revision S, then opens one watch stream with a create request per range from S + 1; each event
// updates the copy. A stream that breaks (etcd restarted, a connection reset, a compaction the
// stream fell behind) is replaced the same way: a fresh read, a fresh stream, so nothing is
// missed and nothing is replayed twice. TCP keepalive (2 s idle, 1 s interval) notices a peer that
// went away without closing, and Resync() lets an owner who saw etcd fail elsewhere force a fresh
// read.
//
// The polling mode (`watch` false) reads the ranges every `poll_seconds` instead: the control
// plane as it was before issue 36, for proxies that do not pass streams, and for the load test's
// "before" (tools/bench-etcd).
//
// Thread safety: thread-safe. One thread of its own keeps the copy; readers take a mutex.
#ifndef LIFELINE_AGENT_ETCD_ETCD_MIRROR_H_
#define LIFELINE_AGENT_ETCD_ETCD_MIRROR_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/etcd/etcd_client.h"
#include "lifeline/status.h"

namespace lifeline::agent {

struct EtcdMirrorOptions {
  bool watch = true;                    // false: read the ranges every poll_seconds
  double poll_seconds = 0.25;
  double request_timeout_seconds = 2.0; // the fresh reads, and connecting a stream
};

class EtcdMirror {
 public:
  // Starts the mirror's thread; nothing is read until Track. InvalidArgument for a bad endpoint.
  static Result<std::unique_ptr<EtcdMirror>> Start(std::string endpoint, EtcdMirrorOptions options);
  ~EtcdMirror();
  EtcdMirror(const EtcdMirror&) = delete;
  EtcdMirror& operator=(const EtcdMirror&) = delete;

  // From now on the copy holds exactly these ranges (keys, or prefixes ending in '/'); the same
  // list again changes nothing. Returns at once: ready() says when the copy holds them.
  void Track(std::vector<std::string> ranges);
  // Drops the stream and reads everything afresh (the owner saw etcd fail and come back).
  void Resync();

  // Whether the copy holds the ranges last given to Track, as etcd had them at some revision
  // at or after the Track call.
  bool ready() const;
  // Whether etcd answered the mirror's last read and its stream is open (or its last poll).
  bool connected() const;
  // Grows at every change of the copy; WaitForChange returns when it passed `seen` or after
  // `timeout_seconds`, with the version then.
  uint64_t version() const;
  uint64_t WaitForChange(uint64_t seen, double timeout_seconds) const;

  // The key, when tracked and present.
  std::optional<EtcdKeyValue> Get(std::string_view key) const;
  // Every tracked key starting with `prefix`, in key order.
  std::vector<EtcdKeyValue> Under(std::string_view prefix) const;

  // What the mirror sent and received: fresh reads, and streams opened with what came through them.
  EtcdTraffic traffic() const;
  uint64_t events() const;  // events applied from streams

 private:
  EtcdMirror(std::string endpoint, EtcdMirrorOptions options, std::unique_ptr<EtcdClient> reader);
  void Run();
  // Reads `ranges` afresh into the copy; the revision read at.
  Result<int64_t> ReadAll(const std::vector<std::string>& ranges, uint64_t generation);
  // Streams the changes of `ranges` after `revision` into the copy until the stream breaks, the
  // ranges change or the mirror stops.
  void Stream(const std::vector<std::string>& ranges, int64_t revision, uint64_t generation);
  // One line of the stream (a JSON watch response); false when the stream must be replaced.
  bool ApplyLine(std::string_view line);
  bool Interrupted(uint64_t generation) const;
  static size_t WriteCallback(char* data, size_t size, size_t count, void* self);  // libcurl's, for the stream  // stopping, new ranges, or a resync asked for
  void WaitBeforeRetry(double seconds, uint64_t generation);

  const std::string endpoint_;
  const std::string base_url_;
  const EtcdMirrorOptions options_;
  const std::unique_ptr<EtcdClient> reader_;  // the fresh reads (its own connection)

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stopping_ = false;                   // GUARDED_BY(mu_)
  std::vector<std::string> ranges_;         // GUARDED_BY(mu_)
  uint64_t generation_ = 0;                 // GUARDED_BY(mu_): bumped by Track and Resync
  uint64_t track_generation_ = 0;           // GUARDED_BY(mu_): bumped by Track
  uint64_t ready_track_generation_ = 0;     // GUARDED_BY(mu_): the Track the copy holds
  bool connected_ = false;                  // GUARDED_BY(mu_)
  uint64_t version_ = 0;                    // GUARDED_BY(mu_)
  std::map<std::string, EtcdKeyValue, std::less<>> copy_;  // GUARDED_BY(mu_)
  std::map<std::string, int64_t, std::less<>> deleted_;    // GUARDED_BY(mu_): keys deleted since the last read, at which revision
  EtcdTraffic stream_traffic_;              // GUARDED_BY(mu_)
  uint64_t events_ = 0;                     // GUARDED_BY(mu_)
  void* wakeup_ = nullptr;                  // CURLM* of the stream open now (curl_multi_wakeup), GUARDED_BY(mu_)
  std::string pending_;                     // the stream's bytes not yet a whole line (the thread's own)
  std::thread thread_;
};

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_ETCD_ETCD_MIRROR_H_
