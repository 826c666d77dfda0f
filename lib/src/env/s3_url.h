// s3:// paths: the names Lifeline gives objects ("s3://bucket/prefix/step-.../file"), and the
// percent-encoding S3 requests need.
#ifndef LIFELINE_SRC_ENV_S3_URL_H_
#define LIFELINE_SRC_ENV_S3_URL_H_

#include <string>
#include <string_view>

#include "lifeline/status.h"

namespace lifeline {

inline constexpr std::string_view kS3Scheme = "s3://";

// A bucket and a key ("" for the bucket itself). Keys never begin or end with '/' and never hold an
// empty, "." or ".." segment: a path names one object or one prefix, and no spelling of it can reach
// another.
struct S3Location {
  std::string bucket;
  std::string key;

  // "s3://bucket/key" (or "s3://bucket" for an empty key).
  std::string ToString() const;
};

// True when `path` starts with "s3://".
bool IsS3Path(std::string_view path);

// Parses "s3://bucket[/key]". Trailing slashes are dropped. InvalidArgument naming the path for
// another scheme, a bucket name S3 refuses (3 to 63 of a-z 0-9 . -, starting and ending with a
// letter or digit), an empty, "." or ".." segment, or a key over 1024 bytes.
Result<S3Location> ParseS3Path(std::string_view path);

// Percent-encodes `s` as SigV4 canonical requests do: every byte but A-Z a-z 0-9 - _ . ~ becomes
// %XX (upper-case hex); '/' is kept when `keep_slash` (object paths) and encoded otherwise (query
// values).
std::string AwsUriEncode(std::string_view s, bool keep_slash);

}  // namespace lifeline

#endif  // LIFELINE_SRC_ENV_S3_URL_H_
