#include "agent/etcd/etcd_client.h"

#include <curl/curl.h>

#include <cstdlib>
#include <utility>

namespace lifeline::agent {
namespace {

size_t AppendBody(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

void InitCurlOnce() {
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  (void)init;
}

}  // namespace

// The gateway writes int64 fields as JSON strings, and leaves out fields that are zero.
int64_t GatewayInt64(const nlohmann::json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
  return 0;
}

Result<EtcdKeyValue> DecodeKeyValue(const nlohmann::json& kv) {
  EtcdKeyValue out;
  Result<std::string> key = Base64Decode(kv.value("key", ""));
  Result<std::string> value = Base64Decode(kv.value("value", ""));
  if (!key.ok() || !value.ok()) return Status::Corruption("etcd answer", "a key or value that is not base64");
  out.key = std::move(*key);
  out.value = std::move(*value);
  out.create_revision = GatewayInt64(kv, "create_revision");
  out.mod_revision = GatewayInt64(kv, "mod_revision");
  out.lease = GatewayInt64(kv, "lease");
  return out;
}

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key (etcd's "\0" range end)
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(std::string endpoint, double request_timeout_seconds) {
  std::string base = endpoint;
  if (base.rfind("https://", 0) == 0)
    return Status::InvalidArgument("etcd endpoint " + endpoint, "https is not supported; use http://HOST:PORT");
  if (base.rfind("http://", 0) != 0) base = "http://" + base;
  while (!base.empty() && base.back() == '/') base.pop_back();
  const std::string hostport = base.substr(7);
  if (hostport.empty() || hostport.find('/') != std::string::npos || hostport.find(':') == std::string::npos)
    return Status::InvalidArgument("etcd endpoint " + endpoint, "expected HOST:PORT");
  InitCurlOnce();
  auto client = std::unique_ptr<EtcdClient>(new EtcdClient(std::move(endpoint), std::move(base), request_timeout_seconds));
  if (client->curl_ == nullptr) return Status::IOError("etcd endpoint " + client->endpoint_, "cannot start libcurl");
  return client;
}

EtcdClient::EtcdClient(std::string endpoint, std::string base_url, double timeout_seconds)
    : endpoint_(std::move(endpoint)), base_url_(std::move(base_url)), timeout_seconds_(timeout_seconds) {
  curl_ = curl_easy_init();
}

EtcdClient::~EtcdClient() {
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

EtcdTraffic EtcdClient::traffic() const {
  std::lock_guard<std::mutex> lock(mu_);
  return traffic_;
}

Result<nlohmann::json> EtcdClient::Call(std::string_view path, const nlohmann::json& body) {
  const std::string url = base_url_ + std::string(path);
  const std::string request = body.dump();
  std::string response;
  long http = 0;
  CURLcode rc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CURL* c = static_cast<CURL*>(curl_);
    curl_easy_reset(c);
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(request.size()));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &AppendBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_seconds_ * 1000));
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_seconds_ * 1000));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for timeouts: the agent owns its signals
    curl_easy_setopt(c, CURLOPT_PROXY, "");     // etcd is reached directly, whatever http_proxy says
    rc = curl_easy_perform(c);
    last_timed_out_ = rc == CURLE_OPERATION_TIMEDOUT;
    curl_slist_free_all(headers);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    curl_off_t sent = 0;
    long request_header_bytes = 0, response_header_bytes = 0;
    curl_easy_getinfo(c, CURLINFO_SIZE_UPLOAD_T, &sent);
    curl_easy_getinfo(c, CURLINFO_REQUEST_SIZE, &request_header_bytes);
    curl_easy_getinfo(c, CURLINFO_HEADER_SIZE, &response_header_bytes);
    ++traffic_.requests;
    traffic_.bytes_sent += static_cast<uint64_t>(sent) + static_cast<uint64_t>(request_header_bytes);
    traffic_.bytes_received += response.size() + static_cast<uint64_t>(response_header_bytes);
  }
  const std::string what = "etcd at " + endpoint_;
  if (rc != CURLE_OK) return Status::Unavailable(what, std::string(path) + ": " + curl_easy_strerror(rc));
  nlohmann::json answer = nlohmann::json::parse(response, nullptr, /*allow_exceptions=*/false);
  if (http != 200) {
    std::string message = !answer.is_discarded() && answer.is_object() ? answer.value("message", "") : "";
    if (message.empty()) message = response.substr(0, 200);
    const std::string text = std::string(path) + ": HTTP " + std::to_string(http) + ": " + message;
    if (http == 404) return Status::NotFound(what, text);
    if (http >= 500) return Status::Unavailable(what, text);
    return Status::InvalidArgument(what, text);
  }
  if (answer.is_discarded() || !answer.is_object())
    return Status::Corruption(what, std::string(path) + ": an answer that is not a JSON object");
  return answer;
}

bool EtcdClient::last_timed_out() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_timed_out_;
}

Status EtcdClient::Ping() { return Call("/v3/maintenance/status", nlohmann::json::object()).status(); }

Result<int64_t> EtcdClient::GrantLease(int64_t ttl_seconds) {
  LL_ASSIGN_OR_RETURN(nlohmann::json a, Call("/v3/lease/grant", {{"TTL", std::to_string(ttl_seconds)}}));
  const int64_t id = GatewayInt64(a, "ID");
  if (id == 0) return Status::Unavailable("etcd at " + endpoint_, "lease grant: " + a.value("error", "no lease id"));
  return id;
}

Status EtcdClient::KeepAlive(int64_t lease) {
  LL_ASSIGN_OR_RETURN(nlohmann::json a, Call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}));
  const nlohmann::json result = a.value("result", nlohmann::json::object());
  if (GatewayInt64(result, "TTL") <= 0) return Status::NotFound("etcd lease " + std::to_string(lease), "expired");
  return Status::OK();
}

Status EtcdClient::RevokeLease(int64_t lease) {
  Status s = Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}).status();
  return s.IsNotFound() ? Status::OK() : s;
}

Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  nlohmann::json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  return Call("/v3/kv/put", body).status();
}

Result<std::optional<EtcdKeyValue>> EtcdClient::Get(std::string_view key) {
  LL_ASSIGN_OR_RETURN(nlohmann::json a, Call("/v3/kv/range", {{"key", Base64Encode(key)}}));
  const nlohmann::json kvs = a.value("kvs", nlohmann::json::array());
  if (!kvs.is_array() || kvs.empty()) return std::optional<EtcdKeyValue>();
  LL_ASSIGN_OR_RETURN(EtcdKeyValue kv, DecodeKeyValue(kvs[0]));
  return std::optional<EtcdKeyValue>(std::move(kv));
}

Result<std::vector<EtcdKeyValue>> EtcdClient::GetPrefix(std::string_view prefix, int64_t* revision) {
  LL_ASSIGN_OR_RETURN(nlohmann::json a,
                      Call("/v3/kv/range", {{"key", Base64Encode(prefix)}, {"range_end", Base64Encode(PrefixEnd(prefix))}}));
  if (revision != nullptr) *revision = GatewayInt64(a.value("header", nlohmann::json::object()), "revision");
  std::vector<EtcdKeyValue> out;
  const nlohmann::json kvs = a.value("kvs", nlohmann::json::array());
  if (!kvs.is_array()) return out;
  for (const nlohmann::json& kv : kvs) {
    LL_ASSIGN_OR_RETURN(EtcdKeyValue decoded, DecodeKeyValue(kv));
    out.push_back(std::move(decoded));
  }
  return out;
}

Result<int64_t> EtcdClient::CountPrefix(std::string_view prefix) {
  LL_ASSIGN_OR_RETURN(nlohmann::json a, Call("/v3/kv/range", {{"key", Base64Encode(prefix)},
                                                             {"range_end", Base64Encode(PrefixEnd(prefix))},
                                                             {"count_only", true}}));
  return GatewayInt64(a, "count");
}

Result<std::vector<std::vector<EtcdKeyValue>>> EtcdClient::ReadMany(const std::vector<Range>& ranges, int64_t* revision) {
  nlohmann::json ops = nlohmann::json::array();
  for (const Range& r : ranges) {
    nlohmann::json range = {{"key", Base64Encode(r.key)}};
    if (!r.key.empty() && r.key.back() == '/') range["range_end"] = Base64Encode(PrefixEnd(r.key));
    if (r.keys_only) range["keys_only"] = true;
    ops.push_back({{"request_range", range}});
  }
  LL_ASSIGN_OR_RETURN(nlohmann::json a, Call("/v3/kv/txn", {{"success", ops}}));
  if (revision != nullptr) *revision = GatewayInt64(a.value("header", nlohmann::json::object()), "revision");
  const nlohmann::json responses = a.value("responses", nlohmann::json::array());
  if (!responses.is_array() || responses.size() != ranges.size())
    return Status::Corruption("etcd at " + endpoint_, "a transaction answered " + std::to_string(responses.size()) +
                                                         " reads of " + std::to_string(ranges.size()));
  std::vector<std::vector<EtcdKeyValue>> out;
  for (const nlohmann::json& r : responses) {
    out.emplace_back();
    const nlohmann::json kvs = r.value("response_range", nlohmann::json::object()).value("kvs", nlohmann::json::array());
    if (!kvs.is_array()) continue;
    for (const nlohmann::json& kv : kvs) {
      LL_ASSIGN_OR_RETURN(EtcdKeyValue decoded, DecodeKeyValue(kv));
      out.back().push_back(std::move(decoded));
    }
  }
  return out;
}

Result<int64_t> EtcdClient::DeletePrefix(std::string_view prefix) {
  LL_ASSIGN_OR_RETURN(nlohmann::json a, Call("/v3/kv/deleterange", {{"key", Base64Encode(prefix)},
                                                                  {"range_end", Base64Encode(PrefixEnd(prefix))}}));
  return GatewayInt64(a, "deleted");
}

Status EtcdClient::Delete(std::string_view key) {
  return Call("/v3/kv/deleterange", {{"key", Base64Encode(key)}}).status();
}

Result<bool> EtcdClient::Transaction(const nlohmann::json& compare, const nlohmann::json& on_success) {
  LL_ASSIGN_OR_RETURN(nlohmann::json a, Call("/v3/kv/txn", {{"compare", nlohmann::json::array({compare})},
                                                           {"success", nlohmann::json::array({on_success})}}));
  return a.value("succeeded", false);
}

Result<bool> EtcdClient::PutIfAbsent(std::string_view key, std::string_view value, int64_t lease) {
  nlohmann::json put = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return Transaction({{"key", Base64Encode(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}},
                     {{"request_put", put}});
}

Result<bool> EtcdClient::CompareAndSwap(std::string_view key, std::string_view expected, std::string_view value) {
  return Transaction(
      {{"key", Base64Encode(key)}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", Base64Encode(expected)}},
      {{"request_put", {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}}}});
}

}  // namespace lifeline::agent
