// The daemons' HTTP endpoints under mTLS (docs/security.md, "HTTP
// endpoints"): HttpServer speaking HTTPS with a daemon's certificate,
// SecureHttp's policy, and the HttpFetch client, with certificates made by
// gen-certs.sh.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/http_client.h"
#include "common/http_server.h"
#include "common/security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "openssl/ssl.h"
#include "openssl/x509.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_certs.h"
#include "tests/transport/raw_socket.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

// The policy as docs/security.md states it, written out again so that a
// change to HttpPolicy() must change this table too.
const std::map<std::string, std::set<Role>>& ExpectedHttpPolicy() {
  using R = Role;
  static const auto* p = new std::map<std::string, std::set<Role>>{
      {"/", {R::kAdmin, R::kOperator, R::kViewer}},
      {"/status", {R::kAdmin, R::kOperator, R::kViewer}},
      {"/metrics", {R::kAdmin, R::kOperator, R::kViewer}},
      {"/logs", {R::kAdmin, R::kOperator}},
  };
  return *p;
}

TEST(HttpPolicyTest, EveryRoleAndPathPairIsAsStated) {
  ASSERT_EQ(HttpPolicy().size(), ExpectedHttpPolicy().size());
  for (const auto& [path, roles] : ExpectedHttpPolicy()) {
    for (Role r : AllRoles()) {
      absl::Status s = CheckHttpPolicy(r, path);
      if (roles.count(r)) {
        EXPECT_THAT(s, IsOk()) << RoleName(r) << " " << path;
      } else {
        EXPECT_THAT(s,
                    StatusIs(absl::StatusCode::kPermissionDenied,
                             HasSubstr(absl::StrCat("role ", RoleName(r), " may not GET ", path))));
      }
    }
  }
  // /healthz is public; anything unlisted is denied to everyone.
  for (Role r : AllRoles()) EXPECT_THAT(CheckHttpPolicy(r, "/healthz"), IsOk());
  EXPECT_THAT(CheckHttpPolicy(Role::kAdmin, "/debug"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("not in the policy")));
}

struct Refusal {
  std::string who, peer, path, why;
};

class HttpsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/https_test_certs"));
    ASSERT_THAT(testing::MakeTestCerts(*dir_), IsOk());
  }
  static void TearDownTestSuite() { delete dir_; }

  // A server with the daemon certificate `cert_name` of `host_dir`, the
  // handlers of a daemon, and the token file of the test certificates.
  void StartServer(const std::string& host_dir, const std::string& cert_name = "pserver") {
    TlsOptions o;
    o.dir = host_dir;
    o.cert_name = cert_name;
    o.token_file = *dir_ + "/tokens";
    o.refresh = absl::Seconds(1);
    auto s = MakeControlPlaneSecurity(o);
    ASSERT_THAT(s.status(), IsOk());
    security_ = *std::move(s);
    for (const char* path : {"/", "/status", "/metrics", "/logs", "/healthz"}) {
      server_.Handle(path, [path](const HttpRequest&) {
        return HttpResponse{200, "text/plain", absl::StrCat("served ", path, "\n")};
      });
    }
    ASSERT_THAT(
        SecureHttp(security_, &server_,
                   [this](const std::string& who, const HttpRequest& req, const absl::Status& why) {
                     absl::MutexLock l(&mu_);
                     refusals_.push_back({who, req.peer, req.path, std::string(why.message())});
                   }),
        IsOk());
    ASSERT_THAT(server_.Start("127.0.0.1", 0), IsOk());
  }

  // HttpFetch of https://127.0.0.1:PORT/path as the person in `person_dir`
  // (client.crt), trusting the cluster's CA.
  absl::StatusOr<HttpResult> GetAs(const std::string& person_dir, const std::string& path) {
    HttpClientOptions o;
    o.ca_file = *dir_ + "/ca/ca.crt";
    if (!person_dir.empty()) {
      o.cert_file = person_dir + "/client.crt";
      o.key_file = person_dir + "/client.key";
    }
    return HttpFetch(Url(path), o);
  }
  std::string Url(const std::string& path) const {
    return absl::StrCat("https://127.0.0.1:", server_.port(), path);
  }
  std::vector<Refusal> Refusals() {
    absl::MutexLock l(&mu_);
    return refusals_;
  }

  static std::string* dir_;
  ControlPlaneSecurity security_;
  HttpServer server_;
  absl::Mutex mu_;
  std::vector<Refusal> refusals_ ABSL_GUARDED_BY(mu_);
};
std::string* HttpsTest::dir_ = nullptr;

TEST_F(HttpsTest, EveryPersonAndPathPairOverTheWireIsAsStated) {
  StartServer(*dir_ + "/127.0.0.1");
  const std::vector<std::pair<std::string, Role>> people = {
      {*dir_ + "/admin", Role::kAdmin},
      {*dir_ + "/users/alice", Role::kOperator},
      {*dir_ + "/users/bob", Role::kViewer},
  };
  int served = 0, refused = 0;
  for (const auto& [person, role] : people) {
    for (const auto& [path, roles] : ExpectedHttpPolicy()) {
      auto r = GetAs(person, path);
      ASSERT_THAT(r.status(), IsOk()) << person << " " << path;
      if (roles.count(role)) {
        EXPECT_EQ(r->status, 200) << RoleName(role) << " " << path << ": " << r->body;
        EXPECT_EQ(r->body, absl::StrCat("served ", path, "\n"));
        ++served;
      } else {
        EXPECT_EQ(r->status, 403) << RoleName(role) << " " << path;
        EXPECT_THAT(r->body, HasSubstr(absl::StrCat("role ", RoleName(role), " may not GET")));
        ++refused;
      }
    }
    // Deny by default: a path the policy does not list, even for admin.
    auto r = GetAs(person, "/debug");
    ASSERT_THAT(r.status(), IsOk());
    EXPECT_EQ(r->status, 403);
  }
  EXPECT_EQ(served, 11);
  EXPECT_EQ(refused, 1);  // the viewer's /logs
  // Refusals carry the caller and its address.
  bool saw_viewer = false;
  for (const Refusal& x : Refusals()) {
    if (x.path == "/logs") {
      saw_viewer = true;
      EXPECT_EQ(x.who, "viewer:bob");
      EXPECT_THAT(x.peer, HasSubstr("127.0.0.1:"));
    }
  }
  EXPECT_TRUE(saw_viewer);
}

TEST_F(HttpsTest, DaemonCertificatesReadNoPersonsPath) {
  StartServer(*dir_ + "/127.0.0.1");
  HttpClientOptions o;
  o.ca_file = *dir_ + "/ca/ca.crt";
  o.cert_file = *dir_ + "/127.0.0.1/worker.crt";
  o.key_file = *dir_ + "/127.0.0.1/worker.key";
  auto r = HttpFetch(Url("/metrics"), o);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->status, 403);
  EXPECT_THAT(r->body, HasSubstr("role worker may not GET /metrics"));
}

TEST_F(HttpsTest, StrangersAreRefusedAndHealthzIsOpen) {
  StartServer(*dir_ + "/127.0.0.1");
  // No credentials.
  auto none = GetAs("", "/status");
  ASSERT_THAT(none.status(), IsOk());
  EXPECT_EQ(none->status, 401);
  EXPECT_THAT(none->body, HasSubstr("no credentials"));
  // An expired certificate; one of another CA.
  auto old = GetAs(*dir_ + "/users/old", "/status");
  ASSERT_THAT(old.status(), IsOk());
  EXPECT_EQ(old->status, 401);
  EXPECT_THAT(old->body, HasSubstr("expired"));
  auto mallory = GetAs(*dir_ + "/mallory", "/metrics");
  ASSERT_THAT(mallory.status(), IsOk());
  EXPECT_EQ(mallory->status, 401);
  // /healthz answers anyone, and says nothing more.
  auto health = GetAs("", "/healthz");
  ASSERT_THAT(health.status(), IsOk());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "served /healthz\n");
  // Every refusal was reported, unauthenticated ones without a name.
  std::vector<Refusal> refusals = Refusals();
  ASSERT_EQ(refusals.size(), 3u);
  for (const Refusal& x : refusals) EXPECT_EQ(x.who, "");
  EXPECT_THAT(refusals[1].why, HasSubstr("expired"));
}

TEST_F(HttpsTest, BearerTokensFromTheTokenFile) {
  StartServer(*dir_ + "/127.0.0.1");
  std::string token;
  {
    std::ifstream in(*dir_ + "/users/carol/token");
    in >> token;
  }
  ASSERT_FALSE(token.empty());
  HttpClientOptions o;
  o.ca_file = *dir_ + "/ca/ca.crt";
  o.bearer_token = token;  // carol: operator
  auto logs = HttpFetch(Url("/logs"), o);
  ASSERT_THAT(logs.status(), IsOk());
  EXPECT_EQ(logs->status, 200);
  o.bearer_token = "0123456789abcdef";
  auto wrong = HttpFetch(Url("/logs"), o);
  ASSERT_THAT(wrong.status(), IsOk());
  EXPECT_EQ(wrong->status, 401);
  // The client never sends a token in clear.
  EXPECT_THAT(HttpFetch(absl::StrCat("http://127.0.0.1:", server_.port(), "/logs"), o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("only over https")));
}

TEST_F(HttpsTest, PlainTextIsAnsweredWithAHintAndUntrustedServersFail) {
  StartServer(*dir_ + "/127.0.0.1");
  auto plain = HttpFetch(absl::StrCat("http://127.0.0.1:", server_.port(), "/status"), {});
  ASSERT_THAT(plain.status(), IsOk());
  EXPECT_EQ(plain->status, 400);
  EXPECT_THAT(plain->body, HasSubstr("HTTPS only"));
  // A client trusting another CA does not accept the server.
  HttpClientOptions o;
  o.ca_file = *dir_ + "/foreign/ca/ca.crt";
  o.cert_file = *dir_ + "/admin/client.crt";
  o.key_file = *dir_ + "/admin/client.key";
  EXPECT_THAT(HttpFetch(Url("/status"), o), StatusIs(absl::StatusCode::kUnavailable));
  // The server still serves the next caller.
  auto ok = GetAs(*dir_ + "/admin", "/status");
  ASSERT_THAT(ok.status(), IsOk());
  EXPECT_EQ(ok->status, 200);
}

TEST_F(HttpsTest, AStalledHandshakeDoesNotHoldTheServer) {
  StartServer(*dir_ + "/127.0.0.1");
  // A client that connects and sends half a TLS record, then nothing.
  const int fd = transport::testing::RawConnect(absl::StrCat("127.0.0.1:", server_.port()));
  const char half[] = {0x16, 0x03, 0x01, 0x02};
  ASSERT_EQ(send(fd, half, sizeof(half), MSG_NOSIGNAL), 4);
  // Served once the stalled handshake's deadline (2 s) has passed.
  HttpClientOptions o;
  o.ca_file = *dir_ + "/ca/ca.crt";
  o.cert_file = *dir_ + "/admin/client.crt";
  o.key_file = *dir_ + "/admin/client.key";
  o.timeout = absl::Seconds(10);
  auto r = HttpFetch(Url("/healthz"), o);
  close(fd);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->status, 200);
}

// The serial number of the certificate the server at 127.0.0.1:port shows.
std::string ServedSerial(int port) {
  const int fd = transport::testing::RawConnect(absl::StrCat("127.0.0.1:", port));
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  std::string serial;
  if (SSL_connect(ssl) == 1) {
    if (X509* cert = SSL_get_peer_certificate(ssl)) {
      BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get_serialNumber(cert), nullptr);
      char* hex = BN_bn2hex(bn);
      serial = hex;
      OPENSSL_free(hex);
      BN_free(bn);
      X509_free(cert);
    }
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(fd);
  return serial;
}

TEST_F(HttpsTest, ARenewedCertificateIsServedWithoutARestart) {
  const std::string gen = std::string(STRATA_SOURCE_DIR) + "/scripts/gen-certs.sh";
  const std::string renew =
      absl::StrCat(gen, " node --out ", *dir_, " --host 127.0.0.2 --role pserver > /dev/null 2>&1");
  ASSERT_EQ(std::system(renew.c_str()), 0);
  StartServer(*dir_ + "/127.0.0.2");
  const std::string before = ServedSerial(server_.port());
  ASSERT_FALSE(before.empty());
  ASSERT_EQ(std::system(renew.c_str()), 0);  // a new certificate, same files
  std::string after = before;
  for (int i = 0; i < 50 && after == before; ++i) {  // read again within a second or so
    absl::SleepFor(absl::Milliseconds(100));
    after = ServedSerial(server_.port());
  }
  EXPECT_NE(after, before);
  EXPECT_FALSE(after.empty());
  // And it still serves people.
  auto r = GetAs(*dir_ + "/admin", "/status");
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->status, 200);
}

}  // namespace
}  // namespace strata
