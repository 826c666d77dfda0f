#include "lib/src/env/s3_responses.h"

#include <cstdint>
#include <utility>

#include "lib/src/env/s3_xml.h"

namespace lifeline {

namespace {

bool HasPrefix(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// A decimal size; nullopt for anything else (empty, a sign, a letter, more than 64 bits).
std::optional<uint64_t> DecimalSize(std::string_view text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

Status Outside(const std::string& where, std::string_view what, std::string_view key, std::string_view prefix) {
  return Status::Corruption(where, "the listing holds " + std::string(what) + " '" + std::string(key) +
                                       "', outside the prefix '" + std::string(prefix) + "' asked for");
}

}  // namespace

Result<S3Listing> DecodeObjectListing(std::string_view body, std::string_view prefix, const std::string& where) {
  LL_ASSIGN_OR_RETURN(XmlElement doc, ParseXml(body, where));
  if (doc.name != "ListBucketResult") return Status::Corruption(where, "listing answered with <" + doc.name + ">");
  S3Listing out;
  for (const XmlElement& e : doc.children) {
    if (e.name == "Contents") {
      S3ObjectInfo o;
      o.key = e.ChildText("Key");
      if (!HasPrefix(o.key, prefix)) return Outside(where, "the key", o.key, prefix);
      const std::optional<uint64_t> size = DecimalSize(e.ChildText("Size"));
      if (!size) return Status::Corruption(where, "the listing gives key '" + o.key + "' the size '" +
                                                      e.ChildText("Size") + "'");
      o.size = *size;
      o.etag = e.ChildText("ETag");
      out.objects.push_back(std::move(o));
    } else if (e.name == "CommonPrefixes") {
      std::string group = e.ChildText("Prefix");
      if (!HasPrefix(group, prefix) || group.size() == prefix.size())
        return Outside(where, "the group", group, prefix);
      out.common_prefixes.push_back(std::move(group));
    }
  }
  out.truncated = doc.ChildText("IsTruncated") == "true";
  out.next_continuation_token = doc.ChildText("NextContinuationToken");
  if (out.truncated && out.next_continuation_token.empty())
    return Status::Corruption(where, "a truncated listing without NextContinuationToken");
  return out;
}

Result<S3UploadListing> DecodeUploadListing(std::string_view body, std::string_view prefix,
                                            const std::string& where) {
  LL_ASSIGN_OR_RETURN(XmlElement doc, ParseXml(body, where));
  if (doc.name != "ListMultipartUploadsResult")
    return Status::Corruption(where, "upload listing answered with <" + doc.name + ">");
  S3UploadListing out;
  for (const XmlElement& e : doc.children) {
    if (e.name != "Upload") continue;
    S3MultipartUpload u{e.ChildText("Key"), e.ChildText("UploadId"), e.ChildText("Initiated")};
    if (!HasPrefix(u.key, prefix)) return Outside(where, "an upload of the key", u.key, prefix);
    if (u.upload_id.empty()) return Status::Corruption(where, "an upload of the key '" + u.key + "' without an UploadId");
    out.uploads.push_back(std::move(u));
  }
  out.truncated = doc.ChildText("IsTruncated") == "true";
  out.next_key_marker = doc.ChildText("NextKeyMarker");
  out.next_upload_id_marker = doc.ChildText("NextUploadIdMarker");
  if (out.truncated && out.next_key_marker.empty())
    return Status::Corruption(where, "a truncated upload listing without NextKeyMarker");
  return out;
}

Result<std::string> DecodeUploadId(std::string_view body, const std::string& where) {
  LL_ASSIGN_OR_RETURN(XmlElement doc, ParseXml(body, where));
  if (doc.name != "InitiateMultipartUploadResult")
    return Status::Corruption(where, "multipart upload created with <" + doc.name + ">");
  std::string id = doc.ChildText("UploadId");
  if (id.empty()) return Status::Corruption(where, "multipart upload created without an UploadId");
  return id;
}

std::optional<S3ErrorDocument> DecodeErrorDocument(std::string_view body) {
  if (body.empty()) return std::nullopt;
  Result<XmlElement> doc = ParseXml(body, "");
  if (!doc.ok() || doc->name != "Error") return std::nullopt;
  return S3ErrorDocument{doc->ChildText("Code"), doc->ChildText("Message"), doc->ChildText("RequestId")};
}

}  // namespace lifeline
