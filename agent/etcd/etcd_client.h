// A small client of etcd's v3 API, spoken through etcd's own JSON gateway (POST /v3/kv/range,
// /v3/kv/put, /v3/kv/txn, /v3/lease/...; keys and values base64, 64-bit integers as strings) with
// libcurl. The agents of a multi-node job meet and act together through it (agent/rendezvous.h);
// nothing in training depends on it.
//
// Every call is bounded by the request timeout and fails with Unavailable naming the endpoint when
// etcd cannot be reached, so a caller's loop never waits on a dead or restarting etcd for longer.
// One HTTP connection is kept open and reused.
//
// Thread safety: thread-safe; calls are serialized on the one connection.
#ifndef LIFELINE_AGENT_ETCD_ETCD_CLIENT_H_
#define LIFELINE_AGENT_ETCD_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lifeline/internal/base64.h"  // the gateway carries bytes as base64
#include "lifeline/status.h"

namespace lifeline::agent {

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: none
};

// What a client has sent and received, for the agents' own traffic figures.
struct EtcdTraffic {
  uint64_t requests = 0;
  uint64_t bytes_sent = 0;      // request bodies and headers
  uint64_t bytes_received = 0;  // response bodies and headers
};

class EtcdClient {
 public:
  // `endpoint`: "HOST:PORT" or "http://HOST:PORT". Nothing is contacted here.
  static Result<std::unique_ptr<EtcdClient>> Create(std::string endpoint, double request_timeout_seconds = 2.0);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }

  // One cheap request (the cluster's status): OK when etcd answers.
  Status Ping();

  // A lease of `ttl_seconds`; keys put with it vanish when it is not kept alive.
  Result<int64_t> GrantLease(int64_t ttl_seconds);
  // Renews `lease` for its whole TTL. NotFound when it has already expired or was revoked.
  Status KeepAlive(int64_t lease);
  // Ends `lease` now, deleting its keys. An expired lease is not an error.
  Status RevokeLease(int64_t lease);

  Status Put(std::string_view key, std::string_view value, int64_t lease = 0);
  // The key, or nullopt when it does not exist.
  Result<std::optional<EtcdKeyValue>> Get(std::string_view key);
  // Every key starting with `prefix`, in key order; `revision` receives the store's revision.
  Result<std::vector<EtcdKeyValue>> GetPrefix(std::string_view prefix, int64_t* revision = nullptr);
  // How many keys start with `prefix` (etcd counts; no key travels).
  Result<int64_t> CountPrefix(std::string_view prefix);
  // Several reads in one request (a transaction with no condition), all at one revision: for
  // each of `ranges`, the key itself, or every key under it when it ends with '/' (keys only,
  // with empty values, when `keys_only`); `revision` receives the revision they were read at.
  struct Range {
    std::string key;
    bool keys_only = false;
  };
  Result<std::vector<std::vector<EtcdKeyValue>>> ReadMany(const std::vector<Range>& ranges, int64_t* revision = nullptr);

  // Deletes every key starting with `prefix`; returns how many were deleted.
  Result<int64_t> DeletePrefix(std::string_view prefix);
  Status Delete(std::string_view key);

  // Puts `value` at `key` only when the key does not exist; true when this call created it.
  Result<bool> PutIfAbsent(std::string_view key, std::string_view value, int64_t lease = 0);
  // Puts `value` at `key` only when the key holds `expected`; true when this call replaced it.
  Result<bool> CompareAndSwap(std::string_view key, std::string_view expected, std::string_view value);

  EtcdTraffic traffic() const;
  // Whether the last request ran out of its time (etcd slow, or a network that drops) rather than
  // failing at once (nothing listens, the connection was reset) or answering.
  bool last_timed_out() const;

 private:
  EtcdClient(std::string endpoint, std::string base_url, double timeout_seconds);
  // POSTs `body` to `path` ("/v3/kv/range") and returns the decoded JSON answer.
  Result<nlohmann::json> Call(std::string_view path, const nlohmann::json& body);
  Result<bool> Transaction(const nlohmann::json& compare, const nlohmann::json& on_success);

  const std::string endpoint_;
  const std::string base_url_;
  const double timeout_seconds_;
  mutable std::mutex mu_;
  void* curl_ = nullptr;  // CURL*, GUARDED_BY(mu_)
  EtcdTraffic traffic_;   // GUARDED_BY(mu_)
  bool last_timed_out_ = false;  // GUARDED_BY(mu_)
};

// An int64 field of a gateway answer (written as a JSON string; left out when zero).
int64_t GatewayInt64(const nlohmann::json& j, const char* name);

// A key-value as the gateway writes it (base64 key and value, revisions as strings); Corruption
// for one that is not.
Result<EtcdKeyValue> DecodeKeyValue(const nlohmann::json& kv);

// The key just past every key starting with `prefix` (etcd's range_end for a prefix).
std::string PrefixEnd(std::string_view prefix);

}  // namespace lifeline::agent

#endif  // LIFELINE_AGENT_ETCD_ETCD_CLIENT_H_
