#include "lib/src/env/s3_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "lib/src/env/s3_responses.h"
#include "lib/src/env/s3_url.h"
#include "lib/src/env/s3_xml.h"

namespace lifeline {

struct S3Client::Request {
  const char* op = "GET";      // what the caller did, for messages: "PUT", "GET range", "list"
  const char* method = "GET";  // GET PUT HEAD DELETE POST
  std::string bucket;
  std::string key;
  std::vector<std::pair<std::string, std::string>> query;  // any order; sorted and encoded when sent
  std::vector<std::string> headers;                        // "Name: value", signed by libcurl
  const void* body = nullptr;                              // PUT and POST
  size_t body_size = 0;
  // Ranged GET straight into the caller's memory: exactly range_size bytes at range_dst.
  void* range_dst = nullptr;
  size_t range_size = 0;
  uint64_t range_offset = 0;
  uint64_t max_body = 16 << 20;  // larger answers are refused (ResourceExhausted)
  // A 2xx answer whose body is an <Error> document is an error (CopyObject, CompleteMultipartUpload).
  bool error_in_ok_body = false;
  bool conditional = false;  // If-None-Match: *, so 412 means "exists"
};

struct S3Client::Response {
  long http = 0;
  std::string body;
  std::string etag;
  std::string request_id;
  uint64_t content_length = 0;
  bool has_content_length = false;
  size_t range_received = 0;
  bool overflow = false;   // more bytes than asked for
  bool retryable = false;  // set by Attempt on failure
};

struct S3Client::Handle {
  CURL* curl = nullptr;
  char error[CURL_ERROR_SIZE] = {0};
  ~Handle() {
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

namespace {

struct Upload {
  const uint8_t* data;
  size_t size;
  size_t pos;
};

size_t ReadBody(char* out, size_t size, size_t nitems, void* user) {
  auto* u = static_cast<Upload*>(user);
  const size_t n = std::min(size * nitems, u->size - u->pos);
  if (n > 0) std::memcpy(out, u->data + u->pos, n);
  u->pos += n;
  return n;
}

int SeekBody(void* user, curl_off_t offset, int origin) {
  auto* u = static_cast<Upload*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > u->size) return CURL_SEEKFUNC_FAIL;
  u->pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

struct Sink {
  S3Client::Response* response;
  const S3Client::Request* request;
};

size_t WriteBody(char* data, size_t size, size_t nmemb, void* user);
size_t OnHeader(char* data, size_t size, size_t nitems, void* user);

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string TrimValue(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
  return std::string(v);
}

bool TransientCurlError(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

// Whether an S3 answer is worth another attempt: the store's own trouble or throttling, never the
// caller's mistake.
bool TransientHttp(long http, const std::string& code) {
  if (code == "SlowDown" || code == "RequestTimeout" || code == "InternalError" || code == "ServiceUnavailable" ||
      code == "ConditionalRequestConflict" || code == "OperationAborted")
    return true;
  return http == 429 || http == 500 || http == 502 || http == 503 || http == 504;
}

constexpr size_t kSmallBodyBytes = 1 << 20;

// This machine's clock, as a signature dates a request (ISO 8601, UTC, to the second).
std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::once_flag curl_init_once;

}  // namespace

namespace {

size_t WriteBody(char* data, size_t size, size_t nmemb, void* user) {
  auto* sink = static_cast<Sink*>(user);
  S3Client::Response* r = sink->response;
  const S3Client::Request* q = sink->request;
  const size_t n = size * nmemb;
  // An error document goes to `body` even for a ranged GET.
  if (q->range_dst != nullptr && r->http >= 200 && r->http < 300) {
    if (r->range_received + n > q->range_size) {
      r->overflow = true;
      return 0;  // aborts the transfer
    }
    std::memcpy(static_cast<uint8_t*>(q->range_dst) + r->range_received, data, n);
    r->range_received += n;
    return n;
  }
  if (r->body.size() + n > q->max_body) {
    r->overflow = true;
    return 0;
  }
  r->body.append(data, n);
  return n;
}

size_t OnHeader(char* data, size_t size, size_t nitems, void* user) {
  auto* r = static_cast<Sink*>(user)->response;
  const size_t n = size * nitems;
  std::string_view line(data, n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new status line (after 100 Continue, a redirect)
    const size_t sp = line.find(' ');
    r->http = sp == std::string_view::npos ? 0 : std::strtol(std::string(line.substr(sp + 1, 3)).c_str(), nullptr, 10);
    r->etag.clear();
    r->has_content_length = false;
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return n;
  const std::string name = Lower(line.substr(0, colon));
  const std::string value = TrimValue(line.substr(colon + 1));
  if (name == "etag") {
    r->etag = value;
  } else if (name == "x-amz-request-id") {
    r->request_id = value;
  } else if (name == "content-length") {
    r->content_length = std::strtoull(value.c_str(), nullptr, 10);
    r->has_content_length = true;
  }
  return n;
}

}  // namespace

Result<S3ClientOptions> S3ClientOptions::LoadFromEnvironment(const EnvironmentLookup& lookup) {
  LL_ASSIGN_OR_RETURN(AwsSettings aws, LoadAwsSettings(lookup));
  S3ClientOptions o;
  o.path_style = !aws.endpoint.empty();
  o.aws = std::move(aws);
  return o;
}

Result<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  std::call_once(curl_init_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  const curl_version_info_data* v = curl_version_info(CURLVERSION_NOW);
  if (v == nullptr || v->version_num < 0x074b00)
    return Status::NotSupported("S3 client", std::string("libcurl ") + (v ? v->version : "?") +
                                                 " cannot sign requests (CURLOPT_AWS_SIGV4 needs 7.75 or newer)");
  if (options.aws.credentials.access_key_id.empty() || options.aws.credentials.secret_access_key.empty())
    return Status::InvalidArgument("S3 client", "no access key id or secret access key");
  std::string endpoint = options.aws.endpoint;
  if (endpoint.empty()) endpoint = "https://s3." + options.aws.region + ".amazonaws.com";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const size_t sep = endpoint.find("://");
  if (sep == std::string::npos || (endpoint.substr(0, sep) != "http" && endpoint.substr(0, sep) != "https") ||
      endpoint.size() == sep + 3 || endpoint.find('/', sep + 3) != std::string::npos)
    return Status::InvalidArgument("S3 endpoint '" + endpoint + "'", "must be http(s)://host[:port] without a path");
  std::unique_ptr<S3Client> client(new S3Client(std::move(options)));
  client->endpoint_ = endpoint;
  client->scheme_ = endpoint.substr(0, sep);
  client->host_ = endpoint.substr(sep + 3);
  return client;
}

S3Client::S3Client(S3ClientOptions options) : options_(std::move(options)) {
  sigv4_ = "aws:amz:" + options_.aws.region + ":s3";
  userpwd_ = options_.aws.credentials.access_key_id + ":" + options_.aws.credentials.secret_access_key;
}

S3Client::~S3Client() = default;

S3ClientStats S3Client::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::unique_ptr<S3Client::Handle> S3Client::Borrow() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      std::unique_ptr<Handle> h = std::move(idle_.back());
      idle_.pop_back();
      return h;
    }
  }
  auto h = std::make_unique<Handle>();
  h->curl = curl_easy_init();
  return h;
}

void S3Client::Return(std::unique_ptr<Handle> handle) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(handle));
}

std::string S3Client::Url(const std::string& bucket, const std::string& key, const std::string& query) const {
  std::string url = scheme_ + "://";
  if (options_.path_style) {
    url += host_ + "/" + bucket;
    if (!key.empty()) url += "/" + AwsUriEncode(key, /*keep_slash=*/true);
    else url += "/";
  } else {
    url += bucket + "." + host_ + "/" + AwsUriEncode(key, /*keep_slash=*/true);
  }
  if (!query.empty()) url += "?" + query;
  return url;
}

Status S3Client::Attempt(Handle* handle, const Request& q, Response* r) {
  *r = Response{};
  if (handle->curl == nullptr) return Status::ResourceExhausted("S3 client", "curl_easy_init failed");
  CURL* c = handle->curl;
  curl_easy_reset(c);  // keeps the connection cache
  handle->error[0] = '\0';

  // libcurl 7.88 signs the query string as it stands: it must already be in canonical form
  // (sorted, every value encoded).
  std::vector<std::pair<std::string, std::string>> params = q.query;
  std::sort(params.begin(), params.end());
  std::string query;
  for (const auto& [k, v] : params) {
    if (!query.empty()) query.push_back('&');
    query += AwsUriEncode(k, false) + "=" + AwsUriEncode(v, false);
  }
  const std::string url = Url(q.bucket, q.key, query);

  curl_slist* headers = nullptr;
  // libcurl hashes no streamed body; S3 accepts an unsigned payload (checksums of the format's own
  // guard the bytes, and HTTPS the transport).
  headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  std::string token;
  if (!options_.aws.credentials.session_token.empty()) {
    token = "x-amz-security-token: " + options_.aws.credentials.session_token;
    headers = curl_slist_append(headers, token.c_str());
  }
  std::string range;
  if (q.range_dst != nullptr) {
    range = "Range: bytes=" + std::to_string(q.range_offset) + "-" + std::to_string(q.range_offset + q.range_size - 1);
    headers = curl_slist_append(headers, range.c_str());
  }
  for (const std::string& h : q.headers) headers = curl_slist_append(headers, h.c_str());
  const bool small_put = std::strcmp(q.method, "PUT") == 0 && q.body_size <= kSmallBodyBytes;
  if (small_put) headers = curl_slist_append(headers, "Content-Type: application/octet-stream");

  Upload upload{static_cast<const uint8_t*>(q.body), q.body_size, 0};
  Sink sink{r, &q};
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(c, CURLOPT_USERPWD, userpwd_.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, handle->error);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, options_.connect_timeout_ms);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, options_.low_speed_bytes_per_second);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, options_.low_speed_seconds);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &sink);
  if (!options_.aws.ca_bundle.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, options_.aws.ca_bundle.c_str());
  const std::string method = q.method;
  if (method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (small_put) {
    // Sent as a body of its own size, which libcurl sends without "Expect: 100-continue" (it asks
    // for that on every upload): SeaweedFS stores such a PUT whose client gave up before the answer
    // (a stalled answer, retried) as an empty object, so the retry of a conditional create would
    // find a key it cannot tell from its own.
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(q.body_size));
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, q.body != nullptr ? static_cast<const char*>(q.body) : "");
  } else if (method == "PUT") {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(q.body_size));
    curl_easy_setopt(c, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(c, CURLOPT_READDATA, &upload);
    curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, SeekBody);
    curl_easy_setopt(c, CURLOPT_SEEKDATA, &upload);
  } else if (method == "POST") {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(q.body_size));
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, q.body != nullptr ? static_cast<const char*>(q.body) : "");
  } else if (method == "DELETE") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  long http = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
  r->http = http;

  const std::string where = S3Location{q.bucket, q.key}.ToString() + " at " + endpoint_;
  const std::string op = q.op;
  if (r->overflow) {
    r->retryable = false;
    if (q.range_dst != nullptr)
      return Status::Corruption(where, op + ": the store sent more than the " + std::to_string(q.range_size) +
                                           " bytes asked for");
    return Status::ResourceExhausted(where, op + ": answer larger than " + std::to_string(q.max_body) + " bytes");
  }
  if (rc != CURLE_OK) {
    r->retryable = TransientCurlError(rc);
    const std::string detail = handle->error[0] != '\0' ? handle->error : curl_easy_strerror(rc);
    if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE)
      return Status::FailedPrecondition(where, op + ": TLS certificate not trusted (" + detail +
                                                   "; AWS_CA_BUNDLE names a CA file to trust)");
    return Status::Unavailable(where, op + ": " + detail);
  }
  std::string code, message;
  if (!r->body.empty() && (http >= 300 || q.error_in_ok_body)) {
    if (std::optional<S3ErrorDocument> doc = DecodeErrorDocument(r->body)) {
      code = std::move(doc->code);
      message = std::move(doc->message);
      if (r->request_id.empty()) r->request_id = std::move(doc->request_id);
    }
  }
  if (http >= 200 && http < 300 && code.empty()) {
    if (q.range_dst != nullptr && r->range_received != q.range_size) {
      r->retryable = false;
      return Status::Corruption(where, op + ": short read: " + std::to_string(r->range_received) + " of " +
                                           std::to_string(q.range_size) + " bytes at offset " +
                                           std::to_string(q.range_offset));
    }
    return Status::OK();
  }
  r->retryable = TransientHttp(http, code);
  std::string text = op + ": HTTP " + std::to_string(http);
  if (!code.empty()) text += " " + code;
  if (!message.empty()) text += ": " + message;
  if (!r->request_id.empty()) text += " (request " + r->request_id + ")";
  if (http == 404 || code == "NoSuchKey" || code == "NoSuchBucket" || code == "NoSuchUpload") {
    if (code == "NoSuchBucket") text += "; bucket '" + q.bucket + "' does not exist";
    return Status::NotFound(where, text);
  }
  if (http == 412 && q.conditional) return Status::AlreadyExists(where, text + "; the key exists already");
  if (http == 416 && q.range_dst != nullptr)
    return Status::Corruption(where, "short read at offset " + std::to_string(q.range_offset) + ": " + text);
  if (http == 401 || http == 403 || code == "RequestTimeTooSkewed") {
    // The key id is masked as the AWS CLI shows it: enough to tell identities apart, nothing more.
    const std::string& id = options_.aws.credentials.access_key_id;
    const std::string masked = "****" + (id.size() > 8 ? id.substr(id.size() - 4) : std::string());
    const std::string& source = options_.aws.credentials.source;
    const std::string key = "access key " + masked + " (from " + (source.empty() ? std::string("the options") : source) + ")";
    if (code == "RequestTimeTooSkewed") {
      // The signature carries this machine's clock; a store refuses a request dated too far from its
      // own (15 minutes on S3). Retrying cannot help: only the clock can.
      return Status::FailedPrecondition(where, text + "; the store refused the request's time as skewed from its own "
                                                      "clock: this machine's clock read " + UtcNow() +
                                                      " when the request was signed; check this machine's clock "
                                                      "(NTP, timedatectl)");
    }
    if (code == "SignatureDoesNotMatch")
      return Status::FailedPrecondition(where, text + "; the secret access key does not match " + key +
                                                   ": check the secret (AWS_SECRET_ACCESS_KEY or the profile's "
                                                   "aws_secret_access_key)");
    if (code == "InvalidAccessKeyId")
      return Status::FailedPrecondition(where, text + "; the store knows no " + key);
    return Status::FailedPrecondition(where, text + "; refused for " + key);
  }
  if (r->retryable) return Status::Unavailable(where, text);
  return Status::IOError(where, text);
}

Status S3Client::Execute(const Request& request, Response* response) {
  std::unique_ptr<Handle> handle = Borrow();
  thread_local std::minstd_rand jitter(std::random_device{}());
  Status s;
  const int max_attempts = std::max(1, options_.max_attempts);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.retry_window_ms);
  int attempt = 1;
  for (;; ++attempt) {
    s = Attempt(handle.get(), request, response);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.requests;
      if (attempt > 1) ++stats_.retries;
    }
    if (s.ok() || !response->retryable || attempt >= max_attempts || std::chrono::steady_clock::now() >= deadline)
      break;
    // Full jitter: a uniform wait up to the exponential bound, so that many ranks throttled together
    // do not come back together.
    const int64_t bound = std::min<int64_t>(options_.max_backoff_ms,
                                            static_cast<int64_t>(options_.initial_backoff_ms) << std::min(attempt - 1, 20));
    std::uniform_int_distribution<int64_t> wait(bound / 4, std::max<int64_t>(bound / 4, bound));
    std::this_thread::sleep_for(std::chrono::milliseconds(wait(jitter)));
  }
  Return(std::move(handle));
  if (!s.ok() && response->retryable) return s.Annotate("gave up after " + std::to_string(attempt) + " attempts");
  return s;
}

Status S3Client::CreateBucket(const std::string& bucket) {
  Request q;
  q.op = "create bucket";
  q.method = "PUT";
  q.bucket = bucket;
  Response r;
  Status s = Execute(q, &r);
  if (!s.ok() && s.message().find("BucketAlreadyOwnedByYou") != std::string::npos) return Status::OK();
  return s;
}

Status S3Client::PutObject(const std::string& bucket, const std::string& key, std::string_view data,
                           bool if_none_match) {
  Request q;
  q.op = if_none_match ? "conditional PUT" : "PUT";
  q.method = "PUT";
  q.bucket = bucket;
  q.key = key;
  q.body = data.data() != nullptr ? data.data() : "";
  q.body_size = data.size();
  q.conditional = if_none_match;
  if (if_none_match) q.headers.push_back("If-None-Match: *");
  Response r;
  return Execute(q, &r);
}

Result<std::string> S3Client::GetObject(const std::string& bucket, const std::string& key, uint64_t max_bytes) {
  Request q;
  q.op = "GET";
  q.bucket = bucket;
  q.key = key;
  q.max_body = max_bytes;
  Response r;
  Status s = Execute(q, &r);
  if (s.code() == StatusCode::kResourceExhausted)
    return Status::ResourceExhausted(S3Location{bucket, key}.ToString(),
                                     "object larger than " + std::to_string(max_bytes) + " bytes");
  LL_RETURN_IF_ERROR(s);
  return std::move(r.body);
}

Status S3Client::GetObjectRange(const std::string& bucket, const std::string& key, uint64_t offset, void* dst,
                                size_t n) {
  if (n == 0) return Status::OK();
  Request q;
  q.op = "GET range";
  q.bucket = bucket;
  q.key = key;
  q.range_dst = dst;
  q.range_size = n;
  q.range_offset = offset;
  Response r;
  return Execute(q, &r);
}

Result<S3ObjectInfo> S3Client::HeadObject(const std::string& bucket, const std::string& key) {
  Request q;
  q.op = "HEAD";
  q.method = "HEAD";
  q.bucket = bucket;
  q.key = key;
  Response r;
  LL_RETURN_IF_ERROR(Execute(q, &r));
  if (!r.has_content_length)
    return Status::Corruption(S3Location{bucket, key}.ToString() + " at " + endpoint_, "HEAD without Content-Length");
  return S3ObjectInfo{key, r.content_length, r.etag};
}

Status S3Client::DeleteObject(const std::string& bucket, const std::string& key) {
  Request q;
  q.op = "DELETE";
  q.method = "DELETE";
  q.bucket = bucket;
  q.key = key;
  Response r;
  Status s = Execute(q, &r);
  return s.IsNotFound() && s.message().find("NoSuchBucket") == std::string::npos ? Status::OK() : s;
}

Status S3Client::CopyObject(const std::string& bucket, const std::string& from_key, const std::string& to_key) {
  Request q;
  q.op = "copy";
  q.method = "PUT";
  q.bucket = bucket;
  q.key = to_key;
  q.body = "";
  q.headers.push_back("x-amz-copy-source: " + AwsUriEncode("/" + bucket + "/" + from_key, /*keep_slash=*/true));
  q.error_in_ok_body = true;
  Response r;
  return Execute(q, &r).Annotate("copying from " + S3Location{bucket, from_key}.ToString());
}

Result<S3Listing> S3Client::ListObjectsPage(const std::string& bucket, const std::string& prefix,
                                            const std::string& delimiter, const std::string& continuation_token,
                                            int max_keys) {
  Request q;
  q.op = "list";
  q.bucket = bucket;
  q.key = "";
  q.query = {{"list-type", "2"}, {"max-keys", std::to_string(max_keys)}};
  if (!prefix.empty()) q.query.emplace_back("prefix", prefix);
  if (!delimiter.empty()) q.query.emplace_back("delimiter", delimiter);
  if (!continuation_token.empty()) q.query.emplace_back("continuation-token", continuation_token);
  Response r;
  const std::string where = S3Location{bucket, prefix}.ToString() + " at " + endpoint_;
  LL_RETURN_IF_ERROR(Execute(q, &r).Annotate("listing " + S3Location{bucket, prefix}.ToString()));
  return DecodeObjectListing(r.body, prefix, where);
}

Result<S3Listing> S3Client::ListObjects(const std::string& bucket, const std::string& prefix,
                                        const std::string& delimiter, size_t max_entries) {
  S3Listing all;
  std::string token;
  do {
    LL_ASSIGN_OR_RETURN(S3Listing page, ListObjectsPage(bucket, prefix, delimiter, token));
    for (S3ObjectInfo& o : page.objects) all.objects.push_back(std::move(o));
    for (std::string& p : page.common_prefixes) all.common_prefixes.push_back(std::move(p));
    if (all.objects.size() + all.common_prefixes.size() > max_entries)
      return Status::ResourceExhausted(S3Location{bucket, prefix}.ToString(),
                                       "more than " + std::to_string(max_entries) + " entries");
    token = page.truncated ? page.next_continuation_token : std::string();
  } while (!token.empty());
  return all;
}

Result<std::string> S3Client::CreateMultipartUpload(const std::string& bucket, const std::string& key) {
  Request q;
  q.op = "create multipart upload";
  q.method = "POST";
  q.bucket = bucket;
  q.key = key;
  q.query = {{"uploads", ""}};
  Response r;
  LL_RETURN_IF_ERROR(Execute(q, &r));
  const std::string where = S3Location{bucket, key}.ToString() + " at " + endpoint_;
  return DecodeUploadId(r.body, where);
}

Result<std::string> S3Client::UploadPart(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, int part_number, const void* data,
                                         size_t size) {
  Request q;
  q.op = "upload part";
  q.method = "PUT";
  q.bucket = bucket;
  q.key = key;
  q.query = {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}};
  q.body = data;
  q.body_size = size;
  Response r;
  LL_RETURN_IF_ERROR(Execute(q, &r).Annotate("part " + std::to_string(part_number)));
  if (r.etag.empty())
    return Status::Corruption(S3Location{bucket, key}.ToString() + " at " + endpoint_,
                              "part " + std::to_string(part_number) + " stored without an ETag");
  return r.etag;
}

Status S3Client::CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id, const std::vector<S3CompletedPart>& parts,
                                         bool if_none_match) {
  std::string body = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (const S3CompletedPart& p : parts)
    body += "<Part><PartNumber>" + std::to_string(p.part_number) + "</PartNumber><ETag>" + XmlEscape(p.etag) +
            "</ETag></Part>";
  body += "</CompleteMultipartUpload>";
  Request q;
  q.op = if_none_match ? "conditional complete multipart upload" : "complete multipart upload";
  q.method = "POST";
  q.bucket = bucket;
  q.key = key;
  q.query = {{"uploadId", upload_id}};
  q.body = body.data();
  q.body_size = body.size();
  q.headers.push_back("Content-Type: application/xml");
  q.error_in_ok_body = true;
  q.conditional = if_none_match;
  if (if_none_match) q.headers.push_back("If-None-Match: *");
  Response r;
  return Execute(q, &r);
}

Status S3Client::AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                      const std::string& upload_id) {
  Request q;
  q.op = "abort multipart upload";
  q.method = "DELETE";
  q.bucket = bucket;
  q.key = key;
  q.query = {{"uploadId", upload_id}};
  Response r;
  Status s = Execute(q, &r);
  return s.IsNotFound() && s.message().find("NoSuchBucket") == std::string::npos ? Status::OK() : s;
}

Result<std::vector<S3MultipartUpload>> S3Client::ListMultipartUploads(const std::string& bucket,
                                                                      const std::string& prefix) {
  std::vector<S3MultipartUpload> out;
  std::string key_marker, id_marker;
  const std::string where = S3Location{bucket, prefix}.ToString() + " at " + endpoint_;
  for (;;) {
    Request q;
    q.op = "list multipart uploads";
    q.bucket = bucket;
    q.query = {{"uploads", ""}};
    if (!prefix.empty()) q.query.emplace_back("prefix", prefix);
    if (!key_marker.empty()) q.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) q.query.emplace_back("upload-id-marker", id_marker);
    Response r;
    LL_RETURN_IF_ERROR(Execute(q, &r));
    LL_ASSIGN_OR_RETURN(S3UploadListing page, DecodeUploadListing(r.body, prefix, where));
    for (S3MultipartUpload& u : page.uploads) out.push_back(std::move(u));
    if (!page.truncated) break;
    if (page.next_key_marker == key_marker && page.next_upload_id_marker == id_marker)
      return Status::Corruption(where, "a truncated upload listing without a new marker");
    key_marker = std::move(page.next_key_marker);
    id_marker = std::move(page.next_upload_id_marker);
  }
  return out;
}

}  // namespace lifeline
