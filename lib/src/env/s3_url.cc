#include "lib/src/env/s3_url.h"

namespace lifeline {
namespace {

bool ValidBucketName(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(b.front()) || !alnum(b.back())) return false;
  for (char c : b)
    if (!alnum(c) && c != '-' && c != '.') return false;
  return b.find("..") == std::string_view::npos;
}

}  // namespace

std::string S3Location::ToString() const {
  std::string s(kS3Scheme);
  s += bucket;
  if (!key.empty()) {
    s.push_back('/');
    s += key;
  }
  return s;
}

bool IsS3Path(std::string_view path) { return path.substr(0, kS3Scheme.size()) == kS3Scheme; }

Result<S3Location> ParseS3Path(std::string_view path) {
  const std::string shown(path);
  if (!IsS3Path(path)) return Status::InvalidArgument(shown, "is not an s3:// path");
  std::string_view rest = path.substr(kS3Scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  const size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (!ValidBucketName(loc.bucket))
    return Status::InvalidArgument(shown, "bucket name '" + loc.bucket + "' is not one S3 accepts");
  if (slash == std::string_view::npos) return loc;
  std::string_view key = rest.substr(slash + 1);
  if (key.size() > 1024) return Status::InvalidArgument(shown, "key longer than 1024 bytes");
  for (size_t begin = 0; begin <= key.size();) {
    size_t end = key.find('/', begin);
    if (end == std::string_view::npos) end = key.size();
    const std::string_view segment = key.substr(begin, end - begin);
    if (segment.empty() || segment == "." || segment == "..")
      return Status::InvalidArgument(shown, "an empty, '.' or '..' path segment");
    if (segment.find('\0') != std::string_view::npos) return Status::InvalidArgument(shown, "a NUL byte in the key");
    begin = end + 1;
  }
  loc.key = std::string(key);
  return loc;
}

std::string AwsUriEncode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3 / 2);
  for (unsigned char c : s) {
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                            c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace lifeline
