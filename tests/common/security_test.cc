#include "common/security.h"

#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "proto/strata.grpc.pb.h"
#include "tests/testing/read_file.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_certs.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::ReadFileForTesting;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

void Write(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/security_test_certs"));
    ASSERT_THAT(testing::MakeTestCerts(*dir_), IsOk());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string* dir_;
};
std::string* SecurityTest::dir_ = nullptr;

TEST_F(SecurityTest, SecretFilesReadableByOthersAreRefused) {
  const std::string key = *dir_ + "/127.0.0.1/worker.key";
  EXPECT_THAT(CheckSecretFilePermissions(key), IsOk());
  for (mode_t mode : {0640, 0604, 0660, 0644}) {
    chmod(key.c_str(), mode);
    EXPECT_THAT(CheckSecretFilePermissions(key),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(key)))
        << std::oct << mode;
  }
  chmod(key.c_str(), 0600);
  EXPECT_THAT(CheckSecretFilePermissions(*dir_ + "/nope.key"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope.key")));

  // A daemon refuses to start on it.
  chmod(key.c_str(), 0640);
  TlsOptions o;
  o.dir = *dir_ + "/127.0.0.1";
  o.cert_name = "worker";
  auto s = MakeControlPlaneSecurity(o);
  EXPECT_THAT(s.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("worker.key: mode 0640")));
  chmod(key.c_str(), 0600);
  EXPECT_THAT(MakeControlPlaneSecurity(o).status(), IsOk());
  o.cert_name = "nobody";
  EXPECT_THAT(MakeControlPlaneSecurity(o).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("nobody.crt")));
}

TEST_F(SecurityTest, DaemonSecurityNeedsCertificatesUnlessPlaintextIsSaid) {
  SecuritySection section;  // mtls by default
  section.tls_dir = *dir_ + "/no-such-dir";
  EXPECT_THAT(DaemonSecurity(section, "", "master").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-dir/ca.crt")));
  auto tls = DaemonSecurity(section, *dir_ + "/127.0.0.1", "master");  // --tls_dir
  ASSERT_THAT(tls.status(), IsOk());
  EXPECT_FALSE(tls->plaintext);
  EXPECT_EQ(tls->ModeString(), "mtls");
  section.mode = "plaintext";
  auto plain = DaemonSecurity(section, "", "master");
  ASSERT_THAT(plain.status(), IsOk());
  EXPECT_TRUE(plain->plaintext);
  EXPECT_EQ(plain->ModeString(), "plaintext (no authentication)");
}

TEST_F(SecurityTest, CertificatesNameTheirHolder) {
  TlsOptions o;
  o.dir = *dir_ + "/127.0.0.1";
  o.token_file = *dir_ + "/tokens";
  auto auth = Authenticator::Create(o);
  ASSERT_THAT(auth.status(), IsOk());
  auto worker = (*auth)->IdentifyCertificate(ReadFileForTesting(*dir_ + "/127.0.0.1/worker.crt"));
  ASSERT_THAT(worker.status(), IsOk());
  EXPECT_EQ(worker->role, Role::kWorker);
  EXPECT_EQ(worker->name, "worker@127.0.0.1");
  EXPECT_EQ(worker->ToString(), "worker:worker@127.0.0.1");
  auto alice = (*auth)->IdentifyCertificate(ReadFileForTesting(*dir_ + "/users/alice/client.crt"));
  ASSERT_THAT(alice.status(), IsOk());
  EXPECT_EQ(alice->role, Role::kOperator);
  EXPECT_EQ(alice->name, "alice");

  EXPECT_THAT(
      (*auth)->IdentifyCertificate(ReadFileForTesting(*dir_ + "/users/old/client.crt")).status(),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("expired")));
  EXPECT_THAT(
      (*auth)->IdentifyCertificate(ReadFileForTesting(*dir_ + "/mallory/client.crt")).status(),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("'mallory' refused")));
  EXPECT_THAT((*auth)->IdentifyCertificate("not a certificate").status(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("unreadable")));

  // Tokens: the right one, and one character off.
  std::string token = ReadFileForTesting(*dir_ + "/users/carol/token");
  token.pop_back();  // '\n'
  auto carol = (*auth)->IdentifyToken(token);
  ASSERT_THAT(carol.status(), IsOk());
  EXPECT_EQ(carol->ToString(), "operator:carol");
  EXPECT_EQ(carol->source, "token");
  token[0] = token[0] == 'a' ? 'b' : 'a';
  EXPECT_THAT((*auth)->IdentifyToken(token).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("unknown bearer token")));
}

// A client checks the server it called: its certificate covers the host
// dialled, names the role the client expects, and is not revoked.
TEST_F(SecurityTest, ClientsCheckTheServersCertificate) {
  const std::string host = *dir_ + "/127.0.0.1";
  const std::string master = ReadFileForTesting(host + "/master.crt");
  const std::string pserver = ReadFileForTesting(host + "/pserver.crt");
  const std::string ca = host + "/ca.crt";
  EXPECT_THAT(CheckServerCertificate(master, "127.0.0.1:7070", Role::kMaster, ca, ""), IsOk());
  EXPECT_THAT(CheckServerCertificate(master, "127.0.0.1", Role::kMaster, ca, ""), IsOk());
  EXPECT_THAT(CheckServerCertificate(pserver, "127.0.0.1:7200", Role::kPServer, ca, ""), IsOk());
  // A pserver's certificate does not make its host's master.
  EXPECT_THAT(
      CheckServerCertificate(pserver, "127.0.0.1:7070", Role::kMaster, ca, ""),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("is of role 'pserver', not master")));
  EXPECT_THAT(
      CheckServerCertificate(master, "10.9.9.9:7070", Role::kMaster, ca, ""),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("does not cover host 10.9.9.9")));
  EXPECT_THAT(CheckServerCertificate(master, "[::2]:7070", Role::kMaster, ca, ""),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("does not cover host ::2")));
  EXPECT_THAT(CheckServerCertificate("not a certificate", "127.0.0.1", Role::kMaster, ca, ""),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("unreadable")));
  // Revoked: refused by clients that have the CA's revocation list.
  const std::string gen = std::string(STRATA_SOURCE_DIR) + "/scripts/gen-certs.sh";
  const std::string dir = *dir_ + "-revoking-master";
  ASSERT_EQ(std::system(("rm -rf '" + dir + "' && cp -r '" + *dir_ + "' '" + dir + "' && '" + gen +
                         "' revoke --out '" + dir + "' --cert '" + dir +
                         "/127.0.0.1/master.crt' > /dev/null")
                            .c_str()),
            0);
  const std::string crl = dir + "/127.0.0.1/crl.pem";
  EXPECT_THAT(CheckServerCertificate(master, "127.0.0.1:7070", Role::kMaster, ca, crl),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("certificate revoked")));
  EXPECT_THAT(CheckServerCertificate(pserver, "127.0.0.1:7200", Role::kPServer, ca, crl), IsOk());
}

TEST_F(SecurityTest, ARevokedCertificateIsRefused) {
  const std::string gen = std::string(STRATA_SOURCE_DIR) + "/scripts/gen-certs.sh";
  const std::string dir = *dir_ + "-revoking";
  ASSERT_EQ(std::system(("rm -rf '" + dir + "' && cp -r '" + *dir_ + "' '" + dir + "' && '" + gen +
                         "' revoke --out '" + dir + "' --cert '" + dir +
                         "/users/bob/client.crt' > /dev/null")
                            .c_str()),
            0);
  TlsOptions o;
  o.dir = dir + "/127.0.0.1";  // (crl.pem was copied beside ca.crt)
  auto auth = Authenticator::Create(o);
  ASSERT_THAT(auth.status(), IsOk());
  EXPECT_THAT(
      (*auth)->IdentifyCertificate(ReadFileForTesting(dir + "/users/bob/client.crt")).status(),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("certificate revoked")));
  EXPECT_THAT(
      (*auth)->IdentifyCertificate(ReadFileForTesting(dir + "/users/alice/client.crt")).status(),
      IsOk());
}

TEST_F(SecurityTest, BadTokenFilesAreNamed) {
  const std::string path = *dir_ + "/bad-tokens";
  TlsOptions o;
  o.dir = *dir_ + "/127.0.0.1";
  o.token_file = path;
  Write(path, "# people\nalice admin 0123456789abcdef0123\nbob root 0123456789abcdef0123\n", 0600);
  EXPECT_THAT(Authenticator::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("bad-tokens:3: the second field (the role of 'bob')")));
  Write(path, "alice admin short\n", 0600);
  EXPECT_THAT(Authenticator::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad-tokens:1: the token")));
  Write(path, "alice admin 0123456789abcdef0123 extra\n", 0600);
  EXPECT_THAT(Authenticator::Create(o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad-tokens:1: want")));
  Write(path, "alice admin 0123456789abcdef0123\n", 0644);
  EXPECT_THAT(Authenticator::Create(o).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("mode 0644")));
}

// The policy, written out again here: each method and the roles that may
// call it. A change to RpcPolicy() must be made in both places.
const std::map<std::string, std::set<Role>>& ExpectedPolicy() {
  using R = Role;
  static const auto* p = new std::map<std::string, std::set<Role>>{
      {"/strata.proto.Master/Register", {R::kPServer, R::kWorker}},
      {"/strata.proto.Master/Heartbeat", {R::kPServer, R::kWorker}},
      {"/strata.proto.Master/GetClusterView",
       {R::kPServer, R::kWorker, R::kAdmin, R::kOperator, R::kViewer}},
      {"/strata.proto.Master/LeaseTask", {R::kWorker}},
      {"/strata.proto.Master/CompleteTask", {R::kWorker}},
      {"/strata.proto.Master/ReportProgress", {R::kWorker}},
      {"/strata.proto.Master/GetStatus",
       {R::kPServer, R::kWorker, R::kAdmin, R::kOperator, R::kViewer}},
      {"/strata.proto.Master/Checkpoint", {R::kAdmin, R::kOperator}},
      {"/strata.proto.Master/Stop", {R::kAdmin}},
      {"/strata.proto.Master/Drain", {R::kAdmin, R::kOperator}},
      {"/strata.proto.Master/Scale", {R::kAdmin, R::kOperator}},
      {"/strata.proto.Master/ReportSuspect", {R::kPServer, R::kWorker}},
      {"/strata.proto.Master/DeclareTables", {R::kWorker}},
      {"/strata.proto.PServerAdmin/AssignPartitions", {R::kMaster}},
      {"/strata.proto.PServerAdmin/GetStatus", {R::kMaster, R::kAdmin, R::kOperator, R::kViewer}},
      {"/strata.proto.PServerAdmin/CheckpointPartitions", {R::kMaster}},
  };
  return *p;
}

// Every method of every service, from the protos themselves.
std::vector<std::string> AllMethods() {
  std::vector<std::string> out;
  // (Through a message of the file: that links the file's descriptor in.)
  const google::protobuf::FileDescriptor* file = proto::RegisterRequest::descriptor()->file();
  EXPECT_EQ(file->service_count(), 2);
  for (const char* name : {"Master", "PServerAdmin"}) {
    const auto* service = file->FindServiceByName(name);
    if (service == nullptr) {
      ADD_FAILURE() << "no service " << name;
      continue;
    }
    for (int i = 0; i < service->method_count(); ++i) {
      out.push_back(absl::StrCat("/", service->full_name(), "/", service->method(i)->name()));
    }
  }
  return out;
}

TEST(RpcPolicyTest, EveryRoleAndMethodPairIsAsStated) {
  const std::vector<std::string> methods = AllMethods();
  ASSERT_EQ(methods.size(), ExpectedPolicy().size()) << "a method without a stated policy";
  int allowed = 0, denied = 0;
  for (const std::string& m : methods) {
    ASSERT_TRUE(ExpectedPolicy().count(m)) << m;
    for (Role r : AllRoles()) {
      const bool want = ExpectedPolicy().at(m).count(r) > 0;
      absl::Status s = CheckRpcPolicy(r, m);
      if (want) {
        EXPECT_THAT(s, IsOk()) << RoleName(r) << " " << m;
        ++allowed;
      } else {
        EXPECT_THAT(s,
                    StatusIs(absl::StatusCode::kPermissionDenied,
                             HasSubstr(absl::StrCat("role ", RoleName(r), " may not call ", m))));
        ++denied;
      }
    }
    EXPECT_THAT(CheckRpcPolicy(Role::kNone, m), StatusIs(absl::StatusCode::kPermissionDenied));
  }
  EXPECT_EQ(allowed + denied, static_cast<int>(methods.size() * AllRoles().size()));
  // Deny by default: a method the policy does not know.
  EXPECT_THAT(CheckRpcPolicy(Role::kAdmin, "/strata.proto.Master/Unknown"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("not in the policy")));
}

TEST_F(SecurityTest, EachInstanceHasACertificateOfItsOwn) {
  // gen-certs.sh cluster: one per pserver and worker of the host file,
  // numbered as the launch plan does; the daemon of that index takes it.
  const std::string host = *dir_ + "/127.0.0.1";
  std::string subject = ReadFileForTesting(host + "/worker-0.crt");
  ASSERT_FALSE(subject.empty());
  auto auth = Authenticator::Create(TlsOptions{false, host, "", "", absl::Seconds(60)});
  ASSERT_THAT(auth.status(), IsOk());
  auto who = (*auth)->IdentifyCertificate(subject);
  ASSERT_THAT(who.status(), IsOk());
  EXPECT_EQ(who->ToString(), "worker:worker-0@127.0.0.1");
  EXPECT_EQ(CertificateIndex(who->name), 0);
  EXPECT_EQ(CertificateIndex("worker@127.0.0.1"), -1);
  EXPECT_EQ(CertificateIndex("pserver-12@10.0.0.7"), 12);
  SecuritySection section;
  section.tls_dir = host;
  auto own = DaemonSecurity(section, "", "worker", 0);
  ASSERT_THAT(own.status(), IsOk());
  EXPECT_EQ(own->cert_file, host + "/worker-0.crt");
  auto shared = DaemonSecurity(section, "", "worker", 3);  // none for index 3
  ASSERT_THAT(shared.status(), IsOk());
  EXPECT_EQ(shared->cert_file, host + "/worker.crt");
}

TEST(PeerCallLimiterTest, CallsInProgressAreCappedPerHost) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.7:5123"), "10.0.0.7");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5123"), "::1");
  EXPECT_EQ(PeerHost("unix:/tmp/s"), "unix:/tmp/s");
  PeerCallLimiter limiter(3);
  std::vector<PeerCallLimiter::Slot> held;
  for (int port = 1; port <= 3; ++port) {
    auto slot = limiter.Enter(absl::StrCat("ipv4:10.0.0.7:", port));
    ASSERT_THAT(slot.status(), IsOk());
    held.push_back(*std::move(slot));
  }
  EXPECT_EQ(limiter.in_progress("10.0.0.7"), 3);
  // A fourth connection of the same host waits its turn; another host not.
  EXPECT_THAT(limiter.Enter("ipv4:10.0.0.7:4").status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("10.0.0.7 has 3 calls in progress already (at most 3 a host)")));
  EXPECT_THAT(limiter.Enter("ipv4:10.0.0.8:1").status(), IsOk());
  held.pop_back();  // a call ends
  EXPECT_EQ(limiter.in_progress("10.0.0.7"), 2);
  EXPECT_THAT(limiter.Enter("ipv4:10.0.0.7:4").status(), IsOk());
  held.clear();
  EXPECT_EQ(limiter.in_progress("10.0.0.7"), 0);
}

TEST(TlsFailureTest, GrpcsHandshakeFailuresAreToldApart) {
  EXPECT_EQ(TlsFailureReason("Handshake failed with fatal error SSL_ERROR_SSL: "
                             "error:0A00010B:SSL routines::wrong version number."),
            "TLS handshake failed: wrong version number (not TLS: a plain-text client?)");
  EXPECT_EQ(TlsFailureReason("Handshake failed with fatal error SSL_ERROR_SSL: "
                             "error:0A0000C1:SSL routines::no shared cipher."),
            "TLS handshake failed: no shared cipher");
  EXPECT_EQ(TlsFailureReason("Handshake failed with fatal error SSL_ERROR_SYSCALL: EOF"),
            "TLS handshake failed: EOF");
  EXPECT_EQ(TlsFailureReason("Connection refused"), "");
}

TEST(RpcPolicyTest, RoleNames) {
  for (Role r : AllRoles()) EXPECT_EQ(ParseRole(RoleName(r)), r);
  EXPECT_EQ(ParseRole("root"), Role::kNone);
  EXPECT_EQ(ParseRole(""), Role::kNone);
}

// A control-plane server that cannot listen says who and where.
TEST(StartControlServerTest, AnAddressItCannotListenOnIsUnavailableNamingIt) {
  proto::PServerAdmin::Service service;
  int port = 0;
  auto server = StartControlServer("pserver", "203.0.113.250", 0, grpc::InsecureServerCredentials(),
                                   &service, 1000, &port);
  EXPECT_THAT(server.status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("pserver: cannot listen on 203.0.113.250:0 (the port in use, or "
                                 "not an address of this host?)")));
  auto ok = StartControlServer("master", "127.0.0.1", 0, grpc::InsecureServerCredentials(),
                               &service, 1000, &port);
  ASSERT_THAT(ok.status(), IsOk());
  EXPECT_GT(port, 0);
  (*ok)->Shutdown();
}

}  // namespace
}  // namespace strata
