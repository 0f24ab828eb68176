// SigV4 against the examples AWS publishes: the Signature Version 4 test
// suite's get-vanilla and the four S3 examples of "Authenticating Requests:
// Using the Authorization Header" (GET with a range, PUT, GET ?lifecycle,
// list with a prefix).
#include "storage/s3_sign.h"

#include <sys/stat.h>

#include <fstream>

#include "gtest/gtest.h"
#include "storage/s3_client.h"

namespace strata::storage {
namespace {

constexpr char kEmptySha[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr char kS3Key[] = "AKIAIOSFODNN7EXAMPLE";
constexpr char kS3Secret[] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

TEST(S3SignTest, Sha256OfKnownStrings) {
  EXPECT_EQ(Sha256Hex(""), kEmptySha);
  EXPECT_EQ(Sha256Hex("Welcome to Amazon S3."),
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
}

TEST(S3SignTest, Md5OfKnownString) {
  // RFC 1321's "abc" vector, base64 of 900150983cd24fb0d6963f7d28e17f72.
  EXPECT_EQ(Md5Base64("abc"), "kAFQmDzST7DWlj99KOF/cg==");
}

TEST(S3SignTest, UriEncodeKeepsUnreservedAndSlashOnlyWhenAsked) {
  EXPECT_EQ(UriEncode("a-Z_0.9~", false), "a-Z_0.9~");
  EXPECT_EQ(UriEncode("/a b/$+=", true), "/a%20b/%24%2B%3D");
  EXPECT_EQ(UriEncode("/a", false), "%2Fa");
  EXPECT_EQ(UriEncode("\xc3\xa9", false), "%C3%A9");
}

TEST(S3SignTest, QueryIsSortedAndEncoded) {
  EXPECT_EQ(EncodeQuery({{"prefix", "a b/"}, {"list-type", "2"}, {"delimiter", "/"}}),
            "delimiter=%2F&list-type=2&prefix=a%20b%2F");
  EXPECT_EQ(EncodeQuery({{"uploads", ""}}), "uploads=");
}

TEST(S3SignTest, TestSuiteGetVanilla) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/";
  r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}};
  r.payload_sha256 = kEmptySha;
  SigV4Signature s = SignV4(r, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                            "us-east-1", "service", "20150830T123600Z");
  EXPECT_EQ(s.canonical_request,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
            "host;x-amz-date\n" +
                std::string(kEmptySha));
  EXPECT_EQ(s.signature, "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request,"
            "SignedHeaders=host;x-amz-date,"
            "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

TEST(S3SignTest, S3GetObjectWithRange) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/test.txt";
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"Range", "bytes=0-9"},
               {"x-amz-content-sha256", kEmptySha},
               {"x-amz-date", "20130524T000000Z"}};
  r.payload_sha256 = kEmptySha;
  SigV4Signature s = SignV4(r, kS3Key, kS3Secret, "us-east-1", "s3", "20130524T000000Z");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(s.signature, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(S3SignTest, S3PutObjectWithReservedCharacterInKey) {
  const std::string body_sha = Sha256Hex("Welcome to Amazon S3.");
  SigV4Request r;
  r.method = "PUT";
  r.path = "/test$file.text";
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
               {"x-amz-date", "20130524T000000Z"},
               {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
               {"x-amz-content-sha256", body_sha}};
  r.payload_sha256 = body_sha;
  SigV4Signature s = SignV4(r, kS3Key, kS3Secret, "us-east-1", "s3", "20130524T000000Z");
  EXPECT_EQ(s.signature, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(S3SignTest, S3GetBucketLifecycle) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/";
  r.query = {{"lifecycle", ""}};
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-date", "20130524T000000Z"},
               {"x-amz-content-sha256", kEmptySha}};
  r.payload_sha256 = kEmptySha;
  SigV4Signature s = SignV4(r, kS3Key, kS3Secret, "us-east-1", "s3", "20130524T000000Z");
  EXPECT_EQ(s.signature, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(S3SignTest, S3ListObjectsWithPrefix) {
  SigV4Request r;
  r.method = "GET";
  r.path = "/";
  r.query = {{"prefix", "J"}, {"max-keys", "2"}};
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-date", "20130524T000000Z"},
               {"x-amz-content-sha256", kEmptySha}};
  r.payload_sha256 = kEmptySha;
  SigV4Signature s = SignV4(r, kS3Key, kS3Secret, "us-east-1", "s3", "20130524T000000Z");
  EXPECT_EQ(s.signature, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(S3SignTest, HeaderValuesAreTrimmedAndSpacesCollapsed) {
  SigV4Request a, b;
  a.method = b.method = "GET";
  a.path = b.path = "/k";
  a.payload_sha256 = b.payload_sha256 = kEmptySha;
  a.headers = {{"Host", "h"}, {"X-Amz-Meta-A", "  one   two "}};
  b.headers = {{"x-amz-meta-a", "one two"}, {"host", "h"}};
  EXPECT_EQ(SignV4(a, "k", "s", "r", "s3", "20200101T000000Z").signature,
            SignV4(b, "k", "s", "r", "s3", "20200101T000000Z").signature);
}

}  // namespace
}  // namespace strata::storage

namespace strata::storage {
namespace {

class S3CredentialsTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    const std::string path = ::testing::TempDir() + "/creds-" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::ofstream(path) << text;
    return path;
  }
  static const char* NoEnv(const char*) { return nullptr; }
};

TEST_F(S3CredentialsTest, ReadsTheFirstProfileOfASharedCredentialsFile) {
  const std::string path = Write(
      "# comment\n[default]\naws_access_key_id = AK1\naws_secret_access_key= SK1 \n"
      "region = eu\n[other]\naws_access_key_id = AK2\n");
  auto c = LoadS3Credentials(path, NoEnv);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key, "AK1");
  EXPECT_EQ(c->secret_key, "SK1");
  EXPECT_EQ(c->source, "file " + path);
}

TEST_F(S3CredentialsTest, FileWithoutTheSecretNamesTheFile) {
  const std::string path = Write("aws_access_key_id = AK1\n");
  auto c = LoadS3Credentials(path, NoEnv);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(path), std::string::npos) << c.status();
}

TEST_F(S3CredentialsTest, BadLineNamesFileAndLine) {
  const std::string path = Write("[default]\naws_access_key_id AK1\n");
  auto c = LoadS3Credentials(path, NoEnv);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(path + ":2"), std::string::npos) << c.status();
}

TEST_F(S3CredentialsTest, MissingFileIsNotFound) {
  auto c = LoadS3Credentials("/no/such/creds", NoEnv);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("/no/such/creds"), std::string::npos);
}

TEST_F(S3CredentialsTest, EnvironmentWhenNoFile) {
  auto env = [](const char* name) -> const char* {
    if (std::string(name) == "AWS_ACCESS_KEY_ID") return "EK";
    if (std::string(name) == "AWS_SECRET_ACCESS_KEY") return "ES";
    return nullptr;
  };
  auto c = LoadS3Credentials("", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key, "EK");
  EXPECT_EQ(c->secret_key, "ES");
  auto none = LoadS3Credentials("", NoEnv);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
}

TEST_F(S3CredentialsTest, SystemdCredentialBeforeTheEnvironment) {
  const std::string path =
      Write("[default]\naws_access_key_id = SYS\naws_secret_access_key = SYSK\n");
  // The credentials directory holds the file as "s3".
  const std::string dir = path + ".d";
  ::mkdir(dir.c_str(), 0700);  // (there already when the test ran before)
  std::ofstream creds(dir + "/s3");
  creds << "[default]\naws_access_key_id = SYS\naws_secret_access_key = SYSK\n";
  creds.close();
  ASSERT_TRUE(creds.good()) << dir;
  static std::string env_dir;
  env_dir = dir;
  auto env = [](const char* name) -> const char* {
    if (std::string(name) == "CREDENTIALS_DIRECTORY") return env_dir.c_str();
    if (std::string(name) == "AWS_ACCESS_KEY_ID") return "EK";
    if (std::string(name) == "AWS_SECRET_ACCESS_KEY") return "ES";
    return nullptr;
  };
  auto c = LoadS3Credentials("", env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key, "SYS");
  EXPECT_EQ(c->secret_key, "SYSK");
  EXPECT_NE(c->source.find("systemd credential s3"), std::string::npos) << c->source;
  // A config's file still comes first.
  const std::string own = Write("aws_access_key_id = OWN\naws_secret_access_key = OWNK\n");
  EXPECT_EQ(LoadS3Credentials(own, env)->access_key, "OWN");
  // A directory without "s3": the environment.
  env_dir = "/nonexistent-credentials-dir";
  EXPECT_EQ(LoadS3Credentials("", env)->access_key, "EK");
}

TEST(S3UrlTest, ParsesBucketAndKey) {
  std::string b, k;
  ASSERT_TRUE(ParseS3Url("s3://my-bucket/a/b/", &b, &k).ok());
  EXPECT_EQ(b, "my-bucket");
  EXPECT_EQ(k, "a/b");
  ASSERT_TRUE(ParseS3Url("s3://my-bucket", &b, &k).ok());
  EXPECT_EQ(k, "");
  EXPECT_FALSE(ParseS3Url("s3://ab/x", &b, &k).ok());
  EXPECT_FALSE(ParseS3Url("s3://Upper/x", &b, &k).ok());
  EXPECT_FALSE(ParseS3Url("/local/path", &b, &k).ok());
}

}  // namespace
}  // namespace strata::storage
