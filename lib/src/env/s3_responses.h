// The XML bodies of an S3 store's answers, decoded: a page of ListObjectsV2, a page of
// ListMultipartUploads, the UploadId of CreateMultipartUpload, the <Error> document of a refusal.
// Pure functions of the bytes, so that what a broken or hostile store sends is checked in one
// place: S3Client calls them, and the fuzz target s3_response_fuzz feeds them anything.
//
// A listing is held to what was asked: a key or common prefix outside the requested prefix, a size
// that is not a decimal number, a truncated page without the marker of the next one are Corruption
// naming `where`. Nothing outside a checkpoint's prefix is ever acted on (read, listed as a child,
// deleted by gc or RemoveTree) on the word of a store that answers with it.
#ifndef LIFELINE_SRC_ENV_S3_RESPONSES_H_
#define LIFELINE_SRC_ENV_S3_RESPONSES_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/src/env/s3_client.h"
#include "lifeline/status.h"

namespace lifeline {

// A ListObjectsV2 page (<ListBucketResult>) of the keys under `prefix`.
Result<S3Listing> DecodeObjectListing(std::string_view body, std::string_view prefix, const std::string& where);

// A ListMultipartUploads page (<ListMultipartUploadsResult>) of the uploads under `prefix`.
struct S3UploadListing {
  std::vector<S3MultipartUpload> uploads;
  bool truncated = false;
  std::string next_key_marker;        // pass back with next_upload_id_marker for the next page
  std::string next_upload_id_marker;
};
Result<S3UploadListing> DecodeUploadListing(std::string_view body, std::string_view prefix, const std::string& where);

// The UploadId of a CreateMultipartUpload answer (<InitiateMultipartUploadResult>).
Result<std::string> DecodeUploadId(std::string_view body, const std::string& where);

// The store's reason for a refusal: an <Error> document's Code, Message and RequestId. nullopt for a
// body that is not one (empty, not XML, another document).
struct S3ErrorDocument {
  std::string code;
  std::string message;
  std::string request_id;
};
std::optional<S3ErrorDocument> DecodeErrorDocument(std::string_view body);

}  // namespace lifeline

#endif  // LIFELINE_SRC_ENV_S3_RESPONSES_H_
