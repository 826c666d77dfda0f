// Where an S3 client's endpoint, region and credentials come from: the standard AWS environment
// variables and shared files, read the way the AWS CLI and SDKs read them.
//
// Credentials are secrets: nothing here logs them, and no Status built here contains them.
#ifndef LIFELINE_SRC_ENV_AWS_CREDENTIALS_H_
#define LIFELINE_SRC_ENV_AWS_CREDENTIALS_H_

#include <functional>
#include <optional>
#include <string>

#include "lifeline/status.h"

namespace lifeline {

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials (STS) only; sent as x-amz-security-token
  std::string source;         // where they were found, for messages: "environment", "~/.aws/credentials [prod]"
};

struct AwsSettings {
  // "scheme://host[:port]" with no path. Empty means Amazon S3 itself, https://s3.<region>.amazonaws.com.
  std::string endpoint;
  std::string region = "us-east-1";
  AwsCredentials credentials;
  // A PEM file of certificate authorities to trust instead of the system's (a private CA, a
  // self-signed test certificate); empty: the system's.
  std::string ca_bundle;
};

// Looks up one environment variable; the seam that lets tests set an environment of their own.
using EnvironmentLookup = std::function<std::optional<std::string>(const char* name)>;
// The process's environment (getenv).
EnvironmentLookup ProcessEnvironment();

// Reads, first found wins:
//   endpoint     AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, `endpoint_url` of the profile in the config file
//   region       AWS_REGION, AWS_DEFAULT_REGION, `region` of the profile in the config file, us-east-1
//   credentials  AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), else the profile's
//                aws_access_key_id / aws_secret_access_key / aws_session_token in the credentials file
//   CA bundle    AWS_CA_BUNDLE, `ca_bundle` of the profile in the config file
// The profile is AWS_PROFILE, else AWS_DEFAULT_PROFILE, else "default"; the files are
// AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials) and AWS_CONFIG_FILE (~/.aws/config).
// InvalidArgument when an access key has no secret (or the reverse), or a named profile is
// missing; NotFound when no credentials are found anywhere, saying where it looked.
Result<AwsSettings> LoadAwsSettings(const EnvironmentLookup& lookup);

}  // namespace lifeline

#endif  // LIFELINE_SRC_ENV_AWS_CREDENTIALS_H_
