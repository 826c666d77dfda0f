// libFuzzer target: arbitrary bytes as an S3 store's answer, decoded as the S3 client decodes it
// (lib/src/env/s3_responses.cc over expat): a listing page, an upload listing, a new upload's id, an
// error document. It must never crash or let an exception out, and what it accepts holds to what
// was asked: every key, group and upload it returns lies under the requested prefix (so gc and
// RemoveTree never act outside a checkpoint's prefix on a store's word), a group is longer than the
// prefix, a truncated page names its successor, an upload has an id, an accepted id is not empty.
//
// Input: one byte choosing the prefix ("", "run/", "a/b/" by its value modulo 3), then the body.
// Seeds (tests/fuzz/corpus/s3_response/): answers as SeaweedFS gives them, and an error document.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "lib/src/env/s3_responses.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lifeline;
  if (size == 0) return 0;
  static const char* const kPrefixes[] = {"", "run/", "a/b/"};
  const std::string_view prefix = kPrefixes[data[0] % 3];
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto under = [&prefix](const std::string& key) { return key.compare(0, prefix.size(), prefix) == 0; };

  Result<S3Listing> listing = DecodeObjectListing(body, prefix, "fuzz");
  if (listing.ok()) {
    for (const S3ObjectInfo& o : listing->objects)
      if (!under(o.key)) std::abort();
    for (const std::string& g : listing->common_prefixes)
      if (!under(g) || g.size() <= prefix.size()) std::abort();
    if (listing->truncated && listing->next_continuation_token.empty()) std::abort();
  } else if (listing.status().message().empty()) {
    std::abort();  // a refusal says why
  }
  Result<S3UploadListing> uploads = DecodeUploadListing(body, prefix, "fuzz");
  if (uploads.ok()) {
    for (const S3MultipartUpload& u : uploads->uploads)
      if (!under(u.key) || u.upload_id.empty()) std::abort();
    if (uploads->truncated && uploads->next_key_marker.empty()) std::abort();
  }
  Result<std::string> id = DecodeUploadId(body, "fuzz");
  if (id.ok() && id->empty()) std::abort();
  (void)DecodeErrorDocument(body);
  return 0;
}
