#include "lib/src/env/aws_credentials.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace lifeline {
namespace {

using IniFile = std::map<std::string, std::map<std::string, std::string>>;

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

// The sections of an AWS shared file; nullopt when it cannot be opened. Comments (# ;) and lines
// outside a section are skipped; the config file's "[profile NAME]" is stored as "NAME".
std::optional<IniFile> ReadIni(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  IniFile ini;
  std::string line, section;
  bool in_section = false;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = Trim(line.substr(1, line.size() - 2));
      if (section.rfind("profile ", 0) == 0) section = Trim(section.substr(8));
      ini[section];
      in_section = true;
      continue;
    }
    const size_t eq = line.find('=');
    if (!in_section || eq == std::string::npos) continue;
    ini[section][Trim(line.substr(0, eq))] = Trim(line.substr(eq + 1));
  }
  return ini;
}

std::string Get(const std::optional<IniFile>& ini, const std::string& section, const std::string& key) {
  if (!ini) return "";
  auto s = ini->find(section);
  if (s == ini->end()) return "";
  auto v = s->second.find(key);
  return v == s->second.end() ? "" : v->second;
}

}  // namespace

EnvironmentLookup ProcessEnvironment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Result<AwsSettings> LoadAwsSettings(const EnvironmentLookup& lookup) {
  auto env = [&](const char* name) {
    std::optional<std::string> v = lookup(name);
    return v ? *v : std::string();
  };
  std::string home = env("HOME");
  const std::string credentials_path =
      !env("AWS_SHARED_CREDENTIALS_FILE").empty() ? env("AWS_SHARED_CREDENTIALS_FILE") : home + "/.aws/credentials";
  const std::string config_path = !env("AWS_CONFIG_FILE").empty() ? env("AWS_CONFIG_FILE") : home + "/.aws/config";
  std::string profile = env("AWS_PROFILE");
  if (profile.empty()) profile = env("AWS_DEFAULT_PROFILE");
  const bool profile_named = !profile.empty();
  if (profile.empty()) profile = "default";
  const std::optional<IniFile> credentials_file = ReadIni(credentials_path);
  const std::optional<IniFile> config_file = ReadIni(config_path);

  AwsSettings s;
  s.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (s.endpoint.empty()) s.endpoint = env("AWS_ENDPOINT_URL");
  if (s.endpoint.empty()) s.endpoint = Get(config_file, profile, "endpoint_url");
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  if (!s.endpoint.empty() && s.endpoint.rfind("http://", 0) != 0 && s.endpoint.rfind("https://", 0) != 0)
    return Status::InvalidArgument("S3 endpoint '" + s.endpoint + "'", "must start with http:// or https://");

  std::string region = env("AWS_REGION");
  if (region.empty()) region = env("AWS_DEFAULT_REGION");
  if (region.empty()) region = Get(config_file, profile, "region");
  if (!region.empty()) s.region = region;

  s.ca_bundle = env("AWS_CA_BUNDLE");
  if (s.ca_bundle.empty()) s.ca_bundle = Get(config_file, profile, "ca_bundle");

  AwsCredentials& c = s.credentials;
  c.access_key_id = env("AWS_ACCESS_KEY_ID");
  c.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
  if (!c.access_key_id.empty() || !c.secret_access_key.empty()) {
    if (c.access_key_id.empty() || c.secret_access_key.empty())
      return Status::InvalidArgument("AWS credentials from the environment",
                                     "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together");
    c.session_token = env("AWS_SESSION_TOKEN");
    c.source = "environment";
    return s;
  }
  const bool in_credentials = credentials_file && credentials_file->count(profile) > 0;
  const bool in_config = config_file && config_file->count(profile) > 0;
  if (profile_named && !in_credentials && !in_config)
    return Status::InvalidArgument("AWS profile '" + profile + "'", "is in neither " + credentials_path + " nor " + config_path);
  // The credentials file first, then the config file (where the CLI also accepts them).
  for (const auto* file : {&credentials_file, &config_file}) {
    c.access_key_id = Get(*file, profile, "aws_access_key_id");
    c.secret_access_key = Get(*file, profile, "aws_secret_access_key");
    if (c.access_key_id.empty() && c.secret_access_key.empty()) continue;
    const std::string& path = file == &credentials_file ? credentials_path : config_path;
    if (c.access_key_id.empty() || c.secret_access_key.empty())
      return Status::InvalidArgument("AWS profile '" + profile + "' in " + path,
                                     "needs both aws_access_key_id and aws_secret_access_key");
    c.session_token = Get(*file, profile, "aws_session_token");
    c.source = path + " [" + profile + "]";
    return s;
  }
  return Status::NotFound("AWS credentials", "none in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, nor for profile '" +
                                                 profile + "' in " + credentials_path + " or " + config_path);
}

}  // namespace lifeline
