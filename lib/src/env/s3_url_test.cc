// s3:// paths, SigV4 percent-encoding, the XML of S3 answers and where credentials come from: the
// pure parts of the S3 driver, without a store.
#include "lib/src/env/s3_url.h"

#include <cstdio>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "lib/src/env/aws_credentials.h"
#include "lib/src/env/s3_xml.h"

namespace lifeline {
namespace s3_url_test {

TEST(S3PathTest, ParsesBucketAndKeyAndRefusesEscapes) {
  Result<S3Location> l = ParseS3Path("s3://my-bucket/ckpt/run1/");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ("my-bucket", l->bucket);
  EXPECT_EQ("ckpt/run1", l->key);
  EXPECT_EQ("s3://my-bucket/ckpt/run1", l->ToString());
  EXPECT_EQ("", ParseS3Path("s3://my-bucket").value_or(S3Location{"x", "y"}).key);
  for (const char* bad : {"/local/dir", "s3://", "s3://UPPER/x", "s3://ab/x", "s3://b..c/x", "s3://bucket/a//b",
                          "s3://bucket/a/../b", "s3://bucket/./b", "gs://bucket/x"}) {
    Result<S3Location> r = ParseS3Path(bad);
    EXPECT_EQ(StatusCode::kInvalidArgument, r.status().code()) << bad;
    if (!r.ok()) {
      EXPECT_NE(std::string::npos, r.status().message().find(bad)) << r.status().ToString();
    }
  }
  EXPECT_TRUE(IsS3Path("s3://b/k"));
  EXPECT_FALSE(IsS3Path("/s3://b/k"));
}

TEST(S3PathTest, EncodesAsSigV4Wants) {
  EXPECT_EQ("a/b%20c%2Bd~e_f.g-h", AwsUriEncode("a/b c+d~e_f.g-h", true));
  EXPECT_EQ("a%2Fb%3D%26", AwsUriEncode("a/b=&", false));
  EXPECT_EQ("%C3%BC", AwsUriEncode("\xc3\xbc", true));
}

TEST(S3XmlTest, ReadsErrorsAndListingsAndRefusesMalformedXml) {
  Result<XmlElement> e = ParseXml(
      "<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>Reduce &amp; retry</Message></Error>", "test");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ("Error", e->name);
  EXPECT_EQ("SlowDown", e->ChildText("Code"));
  EXPECT_EQ("Reduce & retry", e->ChildText("Message"));
  EXPECT_EQ("", e->ChildText("Missing"));
  Result<XmlElement> l = ParseXml(
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Contents><Key>a</Key></Contents>"
      "<Contents><Key>b</Key></Contents><CommonPrefixes><Prefix>d/</Prefix></CommonPrefixes></ListBucketResult>",
      "test");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ("ListBucketResult", l->name) << "namespace dropped";
  ASSERT_EQ(3u, l->children.size());
  EXPECT_EQ("b", l->children[1].ChildText("Key"));
  EXPECT_TRUE(ParseXml("<a><b></a>", "answer of x").status().IsCorruption());
  EXPECT_TRUE(ParseXml("", "x").status().IsCorruption());
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "<a>";
  EXPECT_TRUE(ParseXml(deep, "x").status().IsCorruption());
  EXPECT_EQ("&lt;a&gt; &amp; &quot;&apos;", XmlEscape("<a> & \"'"));
}

class AwsSettingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lifeline-aws-XXXXXX";
    ASSERT_NE(nullptr, mkdtemp(tmpl));
    home_ = tmpl;
    vars_["HOME"] = home_;
  }
  void TearDown() override { std::system(("rm -rf '" + home_ + "'").c_str()); }
  void Write(const std::string& name, const std::string& text) {
    std::system(("mkdir -p '" + home_ + "/.aws'").c_str());
    std::ofstream(home_ + "/.aws/" + name) << text;
  }
  Result<AwsSettings> Load() {
    return LoadAwsSettings([this](const char* name) -> std::optional<std::string> {
      auto it = vars_.find(name);
      if (it == vars_.end()) return std::nullopt;
      return it->second;
    });
  }
  std::string home_;
  std::map<std::string, std::string> vars_;
};

TEST_F(AwsSettingsTest, EnvironmentWinsOverFiles) {
  Write("credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n");
  vars_["AWS_ACCESS_KEY_ID"] = "ENVKEY";
  vars_["AWS_SECRET_ACCESS_KEY"] = "envsecret";
  vars_["AWS_SESSION_TOKEN"] = "token";
  vars_["AWS_ENDPOINT_URL"] = "http://127.0.0.1:8333/";
  vars_["AWS_REGION"] = "eu-west-1";
  vars_["AWS_CA_BUNDLE"] = "/etc/ca.pem";
  Result<AwsSettings> s = Load();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ("ENVKEY", s->credentials.access_key_id);
  EXPECT_EQ("envsecret", s->credentials.secret_access_key);
  EXPECT_EQ("token", s->credentials.session_token);
  EXPECT_EQ("http://127.0.0.1:8333", s->endpoint);
  EXPECT_EQ("eu-west-1", s->region);
  EXPECT_EQ("/etc/ca.pem", s->ca_bundle);
  EXPECT_EQ("environment", s->credentials.source);
}

TEST_F(AwsSettingsTest, ProfilesFromTheSharedFiles) {
  Write("credentials",
        "# comment\n[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = defsecret\n\n"
        "[prod]\naws_access_key_id=PRODKEY\naws_secret_access_key=prodsecret\naws_session_token=tok\n");
  Write("config", "[default]\nregion = us-west-2\n[profile prod]\nregion = ap-south-1\nendpoint_url = https://s3.example\n");
  Result<AwsSettings> d = Load();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ("DEFKEY", d->credentials.access_key_id);
  EXPECT_EQ("us-west-2", d->region);
  EXPECT_EQ("", d->endpoint);
  vars_["AWS_PROFILE"] = "prod";
  Result<AwsSettings> p = Load();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ("PRODKEY", p->credentials.access_key_id);
  EXPECT_EQ("prodsecret", p->credentials.secret_access_key);
  EXPECT_EQ("tok", p->credentials.session_token);
  EXPECT_EQ("ap-south-1", p->region);
  EXPECT_EQ("https://s3.example", p->endpoint);
  vars_["AWS_PROFILE"] = "nope";
  EXPECT_EQ(StatusCode::kInvalidArgument, Load().status().code());
}

TEST_F(AwsSettingsTest, MissingOrHalfCredentialsAreClearErrorsWithoutSecrets) {
  Result<AwsSettings> none = Load();
  EXPECT_TRUE(none.status().IsNotFound()) << none.status().ToString();
  EXPECT_NE(std::string::npos, none.status().message().find(".aws/credentials")) << none.status().ToString();
  vars_["AWS_SECRET_ACCESS_KEY"] = "only-the-secret";
  Result<AwsSettings> half = Load();
  EXPECT_EQ(StatusCode::kInvalidArgument, half.status().code());
  EXPECT_EQ(std::string::npos, half.status().ToString().find("only-the-secret"));
  vars_.erase("AWS_SECRET_ACCESS_KEY");
  vars_["AWS_ACCESS_KEY_ID"] = "K";
  vars_["AWS_SECRET_ACCESS_KEY"] = "S";
  vars_["AWS_ENDPOINT_URL"] = "ftp://x";
  EXPECT_EQ(StatusCode::kInvalidArgument, Load().status().code());
}

}  // namespace s3_url_test
}  // namespace lifeline
