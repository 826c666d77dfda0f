#include "lib/src/env/s3_responses.h"

#include <gtest/gtest.h>

namespace lifeline {
namespace {

const std::string kWhere = "s3://b/run at http://127.0.0.1:1";

std::string Listing(const std::string& inside) {
  return "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">" + inside +
         "</ListBucketResult>";
}

TEST(S3ResponsesTest, AListingPageDecodesKeysSizesGroupsAndTheNextToken) {
  Result<S3Listing> l = DecodeObjectListing(
      Listing("<Contents><Key>run/a.data</Key><Size>4096</Size><ETag>\"e1\"</ETag></Contents>"
              "<CommonPrefixes><Prefix>run/step-1/</Prefix></CommonPrefixes>"
              "<IsTruncated>true</IsTruncated><NextContinuationToken>t2</NextContinuationToken>"),
      "run/", kWhere);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->objects.size(), 1u);
  EXPECT_EQ(l->objects[0].key, "run/a.data");
  EXPECT_EQ(l->objects[0].size, 4096u);
  EXPECT_EQ(l->objects[0].etag, "\"e1\"");
  EXPECT_EQ(l->common_prefixes, std::vector<std::string>{"run/step-1/"});
  EXPECT_TRUE(l->truncated);
  EXPECT_EQ(l->next_continuation_token, "t2");
}

TEST(S3ResponsesTest, AListingReachingOutsideThePrefixIsRefusedNamingTheKey) {
  // A store that answers a listing of run/ with a key of run-2/ or of another tree: acting on it
  // (gc, RemoveTree) would delete outside the checkpoint's prefix.
  for (const std::string& body :
       {Listing("<Contents><Key>run-2/x</Key><Size>1</Size></Contents>"),
        Listing("<Contents><Key>other/run/x</Key><Size>1</Size></Contents>"),
        Listing("<Contents><Key>ru</Key><Size>1</Size></Contents>"),
        Listing("<CommonPrefixes><Prefix>elsewhere/</Prefix></CommonPrefixes>")}) {
    Result<S3Listing> l = DecodeObjectListing(body, "run/", kWhere);
    ASSERT_FALSE(l.ok()) << body;
    EXPECT_TRUE(l.status().IsCorruption()) << l.status().ToString();
    EXPECT_NE(l.status().message().find("outside the prefix 'run/'"), std::string::npos) << l.status().ToString();
    EXPECT_NE(l.status().ToString().find(kWhere), std::string::npos) << l.status().ToString();
  }
}

TEST(S3ResponsesTest, MalformedListingsAreCorruptionNeverGuesses) {
  const std::pair<std::string, std::string> cases[] = {
      {Listing("<Contents><Key>run/a</Key><Size>-1</Size></Contents>"), "the size '-1'"},
      {Listing("<Contents><Key>run/a</Key><Size>99999999999999999999999</Size></Contents>"), "the size"},
      {Listing("<Contents><Key>run/a</Key></Contents>"), "the size ''"},
      {Listing("<IsTruncated>true</IsTruncated>"), "without NextContinuationToken"},
      {"<ListAllMyBucketsResult/>", "listing answered with <ListAllMyBucketsResult>"},
      {"<ListBucketResult><Contents>", "XML"},
      {"", "XML"},
  };
  for (const auto& [body, why] : cases) {
    Result<S3Listing> l = DecodeObjectListing(body, "run/", kWhere);
    ASSERT_FALSE(l.ok()) << body;
    EXPECT_TRUE(l.status().IsCorruption()) << l.status().ToString();
    EXPECT_NE(l.status().ToString().find(why), std::string::npos) << body << ": " << l.status().ToString();
  }
}

TEST(S3ResponsesTest, UploadListingsUploadIdsAndErrorDocuments) {
  Result<S3UploadListing> u = DecodeUploadListing(
      "<ListMultipartUploadsResult><Upload><Key>run/s/0.data</Key><UploadId>u1</UploadId>"
      "<Initiated>2026-11-29T12:00:00Z</Initiated></Upload><IsTruncated>true</IsTruncated>"
      "<NextKeyMarker>run/s/0.data</NextKeyMarker><NextUploadIdMarker>u1</NextUploadIdMarker>"
      "</ListMultipartUploadsResult>",
      "run/", kWhere);
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  ASSERT_EQ(u->uploads.size(), 1u);
  EXPECT_EQ(u->uploads[0].key, "run/s/0.data");
  EXPECT_EQ(u->uploads[0].upload_id, "u1");
  EXPECT_TRUE(u->truncated);
  EXPECT_EQ(u->next_key_marker, "run/s/0.data");
  Result<S3UploadListing> outside = DecodeUploadListing(
      "<ListMultipartUploadsResult><Upload><Key>x/y</Key><UploadId>u1</UploadId></Upload>"
      "</ListMultipartUploadsResult>",
      "run/", kWhere);
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("'x/y'"), std::string::npos) << outside.status().ToString();
  Result<S3UploadListing> no_id = DecodeUploadListing(
      "<ListMultipartUploadsResult><Upload><Key>run/a</Key></Upload></ListMultipartUploadsResult>", "run/", kWhere);
  EXPECT_FALSE(no_id.ok());

  Result<std::string> id = DecodeUploadId(
      "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>run/a</Key><UploadId>abc</UploadId>"
      "</InitiateMultipartUploadResult>",
      kWhere);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "abc");
  EXPECT_FALSE(DecodeUploadId("<InitiateMultipartUploadResult/>", kWhere).ok());
  EXPECT_FALSE(DecodeUploadId("<Error><Code>InternalError</Code></Error>", kWhere).ok());

  std::optional<S3ErrorDocument> e = DecodeErrorDocument(
      "<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message><RequestId>r7</RequestId></Error>");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, "SlowDown");
  EXPECT_EQ(e->message, "Reduce your request rate.");
  EXPECT_EQ(e->request_id, "r7");
  EXPECT_FALSE(DecodeErrorDocument("").has_value());
  EXPECT_FALSE(DecodeErrorDocument("<html>Bad Gateway</html>").has_value());
  EXPECT_FALSE(DecodeErrorDocument("502 Bad Gateway").has_value());
}

}  // namespace
}  // namespace lifeline
