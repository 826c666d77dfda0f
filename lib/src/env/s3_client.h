// S3Client: the S3 API calls Lifeline needs, over libcurl, signed by libcurl itself
// (CURLOPT_AWS_SIGV4), XML answers read with expat.
//
// Every failure is a Status whose message names the endpoint, bucket and key ("s3://b/k at
// http://127.0.0.1:8333: ..."), the S3 error code and message, and never a credential. Codes:
//   NotFound            no such key, no such bucket, no such upload
//   AlreadyExists       a conditional create (If-None-Match: *) found the key taken
//   FailedPrecondition  refused: access denied, a wrong secret, an unknown access key, or a request
//                       time the store finds too far from its clock (RequestTimeTooSkewed: the
//                       message says to check this machine's clock); never retried
//   Unavailable         the store could not be reached or kept answering 5xx/SlowDown/timeouts
//                       after every retry
//   IOError             any other refusal (a 4xx the caller caused)
//   Corruption          an answer that is not what S3 promises (bad XML, a short body)
//
// Retries: transient failures (connection refused or reset, timeouts, a response that stalls below
// `low_speed_bytes_per_second` for `low_speed_seconds`, HTTP 500/502/503/504, 429, SlowDown,
// RequestTimeout) are retried with exponential back-off and full jitter, bounded by `max_backoff_ms`,
// for at most `max_attempts` attempts and `retry_window_ms`. Other 4xx answers are final at once. Every operation is idempotent
// as issued (PUTs carry their whole body; a retried conditional create that finds its own earlier
// success reports AlreadyExists, see PutObject).
//
// Thread safety: every method may be called from any number of threads at once; each call borrows
// a libcurl handle from a pool, so connections are reused across calls, and as many requests run
// in parallel as there are calling threads.
#ifndef LIFELINE_SRC_ENV_S3_CLIENT_H_
#define LIFELINE_SRC_ENV_S3_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lib/src/env/aws_credentials.h"
#include "lifeline/status.h"

namespace lifeline {

struct S3ClientOptions {
  AwsSettings aws;
  // Path-style URLs (endpoint/bucket/key), as S3-compatible stores need; false puts the bucket in
  // the host name (bucket.endpoint-host), as Amazon S3 prefers. LoadFromEnvironment sets it true
  // for a custom endpoint and false for Amazon's.
  bool path_style = true;
  // A transient failure is retried until `max_attempts` attempts were made or `retry_window_ms`
  // has passed since the first: long enough for a gateway restart or a volume server's failover.
  int max_attempts = 30;
  int64_t retry_window_ms = 60000;
  int initial_backoff_ms = 50;
  int max_backoff_ms = 5000;
  long connect_timeout_ms = 10000;
  // A transfer slower than this many bytes per second for this many seconds is abandoned (and
  // retried): a stalled server never hangs a save.
  long low_speed_bytes_per_second = 1024;
  long low_speed_seconds = 30;

  // The endpoint, region and credentials from the environment (LoadAwsSettings), with the
  // defaults above.
  static Result<S3ClientOptions> LoadFromEnvironment(const EnvironmentLookup& lookup = ProcessEnvironment());
};

struct S3ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // with its quotes, as the store sent it
};

struct S3Listing {
  std::vector<S3ObjectInfo> objects;         // keys directly matching (below the delimiter)
  std::vector<std::string> common_prefixes;  // "prefix/sub/" groups when a delimiter was given
  bool truncated = false;
  std::string next_continuation_token;       // pass back to get the next page
};

struct S3MultipartUpload {
  std::string key;
  std::string upload_id;
  std::string initiated;  // ISO 8601, as the store sent it
};

struct S3CompletedPart {
  int part_number = 0;  // 1..10000
  std::string etag;
};

// Counters for tests and diagnostics; read with S3Client::stats().
struct S3ClientStats {
  uint64_t requests = 0;  // HTTP attempts made, retries included
  uint64_t retries = 0;   // attempts that followed a transient failure
};

class S3Client {
 public:
  // NotSupported when the libcurl in use cannot sign requests (before 7.75); InvalidArgument for an
  // endpoint that is not http(s)://host[:port].
  static Result<std::unique_ptr<S3Client>> Create(S3ClientOptions options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // PUT /bucket. OK when it exists already and is ours.
  Status CreateBucket(const std::string& bucket);

  // PUT of a whole object. With `if_none_match` the store creates the key only if it is absent
  // (If-None-Match: *): AlreadyExists otherwise. A store that ignores the header overwrites; the
  // SeaweedFS of tools/seaweedfs honours it (s3_client_test checks). A retried conditional PUT
  // whose first attempt succeeded but whose answer was lost reports AlreadyExists: a caller that
  // must tell the two apart reads the object back.
  Status PutObject(const std::string& bucket, const std::string& key, std::string_view data,
                   bool if_none_match = false);
  // The whole object; ResourceExhausted when it is larger than max_bytes.
  Result<std::string> GetObject(const std::string& bucket, const std::string& key, uint64_t max_bytes);
  // Exactly n bytes at `offset` into dst (a ranged GET). Corruption ("short read") when the object
  // ends before offset + n.
  Status GetObjectRange(const std::string& bucket, const std::string& key, uint64_t offset, void* dst, size_t n);
  // HEAD: size and ETag. NotFound when absent.
  Result<S3ObjectInfo> HeadObject(const std::string& bucket, const std::string& key);
  // DELETE. OK when the key is absent (S3 does not tell).
  Status DeleteObject(const std::string& bucket, const std::string& key);
  // Server-side copy of a whole object (up to 5 GiB) within a bucket.
  Status CopyObject(const std::string& bucket, const std::string& from_key, const std::string& to_key);
  // One page of ListObjectsV2 (at most max_keys entries, 1000 at most by S3's rule).
  Result<S3Listing> ListObjectsPage(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                                    const std::string& continuation_token, int max_keys = 1000);
  // Every page; ResourceExhausted past max_entries objects and prefixes together.
  Result<S3Listing> ListObjects(const std::string& bucket, const std::string& prefix, const std::string& delimiter,
                                size_t max_entries = 10'000'000);

  // Multipart upload: create (returns the upload id), parts of at least 5 MiB but the last
  // (returns the part's ETag), complete (parts in increasing part_number; the object becomes
  // visible, whole, at once), abort (frees the parts; OK when the upload is already gone).
  // Complete with `if_none_match` creates the key only if it is absent (AlreadyExists otherwise),
  // where the store supports it.
  Result<std::string> CreateMultipartUpload(const std::string& bucket, const std::string& key);
  Result<std::string> UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                 int part_number, const void* data, size_t size);
  Status CompleteMultipartUpload(const std::string& bucket, const std::string& key, const std::string& upload_id,
                                 const std::vector<S3CompletedPart>& parts, bool if_none_match = false);
  Status AbortMultipartUpload(const std::string& bucket, const std::string& key, const std::string& upload_id);
  // Uploads begun and neither completed nor aborted under `prefix` (what garbage collection aborts).
  Result<std::vector<S3MultipartUpload>> ListMultipartUploads(const std::string& bucket, const std::string& prefix);

  const std::string& endpoint() const { return endpoint_; }
  const S3ClientOptions& options() const { return options_; }
  S3ClientStats stats() const;

  struct Request;   // one call's method, resource, headers and body; defined in s3_client.cc
  struct Response;  // status, headers and body of the last attempt
  struct Handle;    // a pooled libcurl easy handle

 private:
  explicit S3Client(S3ClientOptions options);
  // Performs `request` with retries; OK with `response` filled for a 2xx answer, else the mapped error.
  Status Execute(const Request& request, Response* response);
  Status Attempt(Handle* handle, const Request& request, Response* response);
  std::unique_ptr<Handle> Borrow();
  void Return(std::unique_ptr<Handle> handle);
  std::string Url(const std::string& bucket, const std::string& key, const std::string& query) const;

  const S3ClientOptions options_;
  std::string endpoint_;  // without a trailing slash
  std::string scheme_;    // "http" or "https"
  std::string host_;      // host[:port]
  std::string sigv4_;     // "aws:amz:REGION:s3"
  std::string userpwd_;   // "key:secret", handed to libcurl only

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Handle>> idle_;  // GUARDED_BY(mu_)
  S3ClientStats stats_;                        // GUARDED_BY(mu_)
};

}  // namespace lifeline

#endif  // LIFELINE_SRC_ENV_S3_CLIENT_H_
