#include "agent/etcd/etcd_mirror.h"

#include <curl/curl.h>

#include <chrono>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

namespace lifeline::agent {
namespace {

bool IsPrefix(const std::string& range) { return !range.empty() && range.back() == '/'; }

bool SameKeyValue(const EtcdKeyValue& a, const EtcdKeyValue& b) {
  return a.key == b.key && a.value == b.value && a.mod_revision == b.mod_revision && a.lease == b.lease;
}

}  // namespace

Result<std::unique_ptr<EtcdMirror>> EtcdMirror::Start(std::string endpoint, EtcdMirrorOptions options) {
  LL_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> reader, EtcdClient::Create(endpoint, options.request_timeout_seconds));
  auto m = std::unique_ptr<EtcdMirror>(new EtcdMirror(std::move(endpoint), options, std::move(reader)));
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

EtcdMirror::EtcdMirror(std::string endpoint, EtcdMirrorOptions options, std::unique_ptr<EtcdClient> reader)
    : endpoint_(std::move(endpoint)),
      base_url_(endpoint_.rfind("http://", 0) == 0 ? endpoint_ : "http://" + endpoint_),
      options_(options),
      reader_(std::move(reader)) {}

EtcdMirror::~EtcdMirror() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (wakeup_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(wakeup_));
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EtcdMirror::Track(std::vector<std::string> ranges) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ranges == ranges_) return;
  ranges_ = std::move(ranges);
  ++generation_;
  ++track_generation_;
  if (wakeup_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(wakeup_));
  cv_.notify_all();
}

void EtcdMirror::Resync() {
  std::lock_guard<std::mutex> lock(mu_);
  ++generation_;
  if (wakeup_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(wakeup_));
  cv_.notify_all();
}

bool EtcdMirror::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_track_generation_ == track_generation_;
}

bool EtcdMirror::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connected_;
}

uint64_t EtcdMirror::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

uint64_t EtcdMirror::WaitForChange(uint64_t seen, double timeout_seconds) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), [&] { return version_ != seen || stopping_; });
  return version_;
}

std::optional<EtcdKeyValue> EtcdMirror::Get(std::string_view key) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = copy_.find(key);
  if (it == copy_.end()) return std::nullopt;
  return it->second;
}

std::vector<EtcdKeyValue> EtcdMirror::Under(std::string_view prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<EtcdKeyValue> out;
  for (auto it = copy_.lower_bound(prefix); it != copy_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    out.push_back(it->second);
  return out;
}

EtcdTraffic EtcdMirror::traffic() const {
  EtcdTraffic t = reader_->traffic();
  std::lock_guard<std::mutex> lock(mu_);
  t.requests += stream_traffic_.requests;
  t.bytes_sent += stream_traffic_.bytes_sent;
  t.bytes_received += stream_traffic_.bytes_received;
  return t;
}

uint64_t EtcdMirror::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

bool EtcdMirror::Interrupted(uint64_t generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_ || generation_ != generation;
}

void EtcdMirror::WaitBeforeRetry(double seconds, uint64_t generation) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return stopping_ || generation_ != generation; });
}

void EtcdMirror::Run() {
  // After a failure the next try waits 0.2 s, doubling to 5 s, each with up to half again at
  // random: a thousand agents whose streams an etcd restart broke do not all come back at once.
  std::mt19937 rng(std::random_device{}());
  int failures = 0;
  auto backoff = [&] {
    const double base = std::min(5.0, 0.2 * static_cast<double>(1 << std::min(failures++, 5)));
    return base * std::uniform_real_distribution<double>(1.0, 1.5)(rng);
  };
  for (;;) {
    std::vector<std::string> ranges;
    uint64_t generation;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !ranges_.empty(); });
      if (stopping_) return;
      ranges = ranges_;
      generation = generation_;
    }
    Result<int64_t> revision = ReadAll(ranges, generation);
    if (!revision.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        connected_ = false;
      }
      WaitBeforeRetry(backoff(), generation);
      continue;
    }
    if (!options_.watch) {
      WaitBeforeRetry(options_.poll_seconds, generation);
      continue;
    }
    const auto began = std::chrono::steady_clock::now();
    Stream(ranges, *revision, generation);
    if (std::chrono::steady_clock::now() - began > std::chrono::seconds(10)) failures = 0;  // it had held
    if (!Interrupted(generation)) {  // broken: read afresh after a moment
      {
        std::lock_guard<std::mutex> lock(mu_);
        connected_ = false;
      }
      WaitBeforeRetry(backoff(), generation);
    } else {
      failures = 0;
    }
  }
}

Result<int64_t> EtcdMirror::ReadAll(const std::vector<std::string>& ranges, uint64_t generation) {
  std::vector<EtcdClient::Range> read;
  for (const std::string& r : ranges) read.push_back({r});
  uint64_t track_generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    track_generation = track_generation_;
  }
  int64_t revision = 0;
  LL_ASSIGN_OR_RETURN(std::vector<std::vector<EtcdKeyValue>> got, reader_->ReadMany(read, &revision));
  std::map<std::string, EtcdKeyValue, std::less<>> fresh;
  for (std::vector<EtcdKeyValue>& kvs : got)
    for (EtcdKeyValue& kv : kvs) {
      std::string key = kv.key;
      fresh.emplace(std::move(key), std::move(kv));
    }
  std::lock_guard<std::mutex> lock(mu_);
  if (generation_ != generation) return revision;  // new ranges meanwhile: read again
  const bool same = fresh.size() == copy_.size() &&
                    std::equal(fresh.begin(), fresh.end(), copy_.begin(),
                               [](const auto& a, const auto& b) { return SameKeyValue(a.second, b.second); });
  if (!same) copy_ = std::move(fresh);
  deleted_.clear();
  if (!same || ready_track_generation_ != track_generation) ++version_;
  ready_track_generation_ = track_generation;
  connected_ = !options_.watch;  // a stream is connected once etcd created its watches
  cv_.notify_all();
  return revision;
}

void EtcdMirror::Stream(const std::vector<std::string>& ranges, int64_t revision, uint64_t generation) {
  // One create request per range, all in one body: the gateway has no way to add one to a stream
  // it already holds, so new ranges are a new stream.
  std::string body;
  for (const std::string& r : ranges) {
    nlohmann::json create = {{"key", Base64Encode(r)}, {"start_revision", std::to_string(revision + 1)}};
    if (IsPrefix(r)) create["range_end"] = Base64Encode(PrefixEnd(r));
    body += nlohmann::json{{"create_request", create}}.dump();
  }
  CURLM* multi = curl_multi_init();
  CURL* easy = curl_easy_init();
  if (multi == nullptr || easy == nullptr) {
    if (easy != nullptr) curl_easy_cleanup(easy);
    if (multi != nullptr) curl_multi_cleanup(multi);
    return;
  }
  const std::string url = base_url_ + "/v3/watch";
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  const long connect_ms = static_cast<long>(options_.request_timeout_seconds * 1000);
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_POST, 1L);
  curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &EtcdMirror::WriteCallback);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, this);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_PROXY, "");
  // A peer that vanished without closing (a machine gone, a partition) is noticed in seconds.
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPIDLE, 2L);
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPINTVL, 1L);
  curl_multi_add_handle(multi, easy);
  pending_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    wakeup_ = multi;
    ++stream_traffic_.requests;
    stream_traffic_.bytes_sent += body.size();
  }
  const auto began = std::chrono::steady_clock::now();
  for (;;) {
    if (Interrupted(generation)) break;
    int running = 0;
    if (curl_multi_perform(multi, &running) != CURLM_OK || running == 0) break;  // ended or refused
    // No watch created for long: not an etcd that streams (a busy one answers within seconds).
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!connected_ && std::chrono::steady_clock::now() - began > std::chrono::seconds(30)) break;
    }
    curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    wakeup_ = nullptr;
  }
  curl_multi_remove_handle(multi, easy);
  curl_easy_cleanup(easy);
  curl_multi_cleanup(multi);
  curl_slist_free_all(headers);
}

bool EtcdMirror::ApplyLine(std::string_view line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  const auto result = j.find("result");
  if (result == j.end() || !result->is_object()) return false;  // an error, or not a watch response
  // A watch etcd ended (its start was compacted away, or it was cancelled): read afresh.
  if (result->value("canceled", false) || GatewayInt64(*result, "compact_revision") > 0) return false;
  if (result->value("created", false)) {
    std::lock_guard<std::mutex> lock(mu_);
    connected_ = true;
    cv_.notify_all();
    return true;
  }
  const auto events = result->find("events");
  if (events == result->end() || !events->is_array() || events->empty()) return true;  // progress
  std::lock_guard<std::mutex> lock(mu_);
  for (const nlohmann::json& e : *events) {
    if (!e.is_object() || !e.contains("kv")) return false;
    Result<EtcdKeyValue> kv = DecodeKeyValue(e["kv"]);
    if (!kv.ok()) return false;
    const auto it = copy_.find(kv->key);
    const auto gone = deleted_.find(kv->key);
    // A repeated event (no newer than what the copy holds, or than the key's deletion) changes nothing.
    if (it != copy_.end() && it->second.mod_revision >= kv->mod_revision) continue;
    if (gone != deleted_.end() && gone->second >= kv->mod_revision) continue;
    if (e.value("type", "PUT") == "DELETE") {
      if (it != copy_.end()) copy_.erase(it);
      deleted_[kv->key] = kv->mod_revision;
    } else {
      if (gone != deleted_.end()) deleted_.erase(gone);
      std::string key = kv->key;
      copy_[std::move(key)] = std::move(*kv);
    }
    ++events_;
  }
  ++version_;
  cv_.notify_all();
  return true;
}

size_t EtcdMirror::WriteCallback(char* data, size_t size, size_t count, void* self) {
  EtcdMirror* m = static_cast<EtcdMirror*>(self);
  const size_t n = size * count;
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    m->stream_traffic_.bytes_received += n;
  }
  std::string& pending = m->pending_;
  pending.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    const std::string_view line(pending.data() + start, nl - start);
    if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
    if (!m->ApplyLine(line)) return 0;  // ends the transfer: the stream is replaced
  }
  pending.erase(0, start);
  if (pending.size() > (64u << 20)) return 0;  // no line that long comes from etcd
  return n;
}

}  // namespace lifeline::agent
