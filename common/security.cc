#include "common/security.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/base/call_once.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_channel.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpc/support/log.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "openssl/crypto.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"
#include "openssl/x509_vfy.h"
#include "openssl/x509v3.h"

namespace strata {
namespace {

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return ss.str();
}

int64_t MtimeNs(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

std::string Sha256(absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<char*>(md), len);
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();  // NOLINT(runtime/int)
  if (e == 0) return "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

// The first value of `nid` in the certificate's subject, "" if none.
std::string SubjectEntry(X509* cert, int nid) {
  X509_NAME* name = X509_get_subject_name(cert);
  const int i = X509_NAME_get_index_by_NID(name, nid, -1);
  if (i < 0) return "";
  ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, data);
  if (n < 0) return "";
  std::string out(reinterpret_cast<char*>(utf8), n);
  OPENSSL_free(utf8);
  return out;
}

// Parses the token table: "name role token" lines, '#' comments.
absl::StatusOr<std::vector<std::pair<std::string, std::pair<Role, std::string>>>> ParseTokens(
    const std::string& path, const std::string& text) {
  std::vector<std::pair<std::string, std::pair<Role, std::string>>> out;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    if (f.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": want 'name role token', got ", f.size(), " field(s)"));
    }
    const Role role = ParseRole(f[1]);
    if (role != Role::kAdmin && role != Role::kOperator && role != Role::kViewer) {
      // (The field is not echoed: a line in the wrong order would put its
      // token in the log.)
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no,
                                                     ": the second field (the role of '", f[0],
                                                     "') is not admin, operator or viewer"));
    }
    if (f[2].size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": the token of '", f[0],
          "' is too short (at least 16 characters; gen-certs.sh token makes 32 bytes)"));
    }
    out.push_back({std::string(f[0]), {role, std::string(f[2])}});
  }
  return out;
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kMaster:
      return "master";
    case Role::kPServer:
      return "pserver";
    case Role::kWorker:
      return "worker";
    case Role::kAdmin:
      return "admin";
    case Role::kOperator:
      return "operator";
    case Role::kViewer:
      return "viewer";
    case Role::kNone:
      break;
  }
  return "none";
}

Role ParseRole(absl::string_view name) {
  for (Role r : AllRoles()) {
    if (name == RoleName(r)) return r;
  }
  return Role::kNone;
}

const std::vector<Role>& AllRoles() {
  static const auto* roles = new std::vector<Role>{Role::kMaster, Role::kPServer,  Role::kWorker,
                                                   Role::kAdmin,  Role::kOperator, Role::kViewer};
  return *roles;
}

std::string Identity::ToString() const {
  if (source == "plaintext") return "plaintext";
  return absl::StrCat(RoleName(role), ":", name);
}

absl::Status CheckSecretFilePermissions(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": missing (", strerror(errno), ")"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": mode ", mode,
        " lets group or others read this secret; refusing to use it (chmod 600 ", path, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const TlsOptions& options) {
  std::unique_ptr<Authenticator> a(new Authenticator(options));
  absl::MutexLock l(&a->mu_);
  STRATA_RETURN_IF_ERROR(a->ReloadLocked(/*force=*/true));
  return a;
}

absl::Status Authenticator::ReloadLocked(bool force) {
  const absl::Time now = absl::Now();
  if (!force && now < next_check_) return absl::OkStatus();
  next_check_ = now + options_.refresh;
  const std::string ca_path = options_.dir + "/ca.crt";
  const int64_t ca_mtime = MtimeNs(ca_path);
  if (force || ca_mtime != ca_mtime_ns_) {
    auto pem = ReadSmallFile(ca_path);
    if (!pem.ok()) {
      if (force) return pem.status();
      LOG(WARNING) << "keeping the CA read before: " << pem.status().message();
    } else {
      ca_pem_ = *std::move(pem);
      ca_mtime_ns_ = ca_mtime;
    }
  }
  // Revoked certificates (optional): read again when the file changes.
  const std::string crl_path = options_.dir + "/crl.pem";
  const int64_t crl_mtime = MtimeNs(crl_path);
  if (force || crl_mtime != crl_mtime_ns_) {
    if (crl_mtime < 0) {
      crl_pem_.clear();
    } else if (auto pem = ReadSmallFile(crl_path); pem.ok()) {
      crl_pem_ = *std::move(pem);
      if (!force) LOG(INFO) << "revocation list " << crl_path << " read again";
    } else {
      LOG(WARNING) << "keeping the revocation list read before: " << pem.status().message();
    }
    crl_mtime_ns_ = crl_mtime;
  }
  if (!options_.token_file.empty()) {
    const int64_t mtime = MtimeNs(options_.token_file);
    if (force || mtime != tokens_mtime_ns_) {
      absl::Status s = CheckSecretFilePermissions(options_.token_file);
      absl::StatusOr<std::string> text =
          s.ok() ? ReadSmallFile(options_.token_file) : absl::StatusOr<std::string>(s);
      auto parsed = text.ok() ? ParseTokens(options_.token_file, *text)
                              : decltype(ParseTokens("", ""))(text.status());
      if (!parsed.ok()) {
        if (force) return parsed.status();
        LOG(WARNING) << "keeping the tokens read before: " << parsed.status().message();
      } else {
        tokens_.clear();
        for (auto& [name, rt] : *parsed) tokens_.push_back({name, rt.first, Sha256(rt.second)});
        tokens_mtime_ns_ = mtime;
        if (!force)
          LOG(INFO) << "token file " << options_.token_file << " read again: " << tokens_.size()
                    << " token(s)";
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Identity> Authenticator::IdentifyCertificate(absl::string_view pem) {
  std::string ca, crl;
  {
    absl::MutexLock l(&mu_);
    (void)ReloadLocked(/*force=*/false);
    ca = ca_pem_;
    crl = crl_pem_;
  }
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat("client certificate unreadable: ", OpenSslError()));
  }
  X509_STORE* store = X509_STORE_new();
  BIO* ca_bio = BIO_new_mem_buf(ca.data(), static_cast<int>(ca.size()));
  int cas = 0;
  while (X509* c = PEM_read_bio_X509(ca_bio, nullptr, nullptr, nullptr)) {
    X509_STORE_add_cert(store, c);
    X509_free(c);
    ++cas;
  }
  ERR_clear_error();
  BIO_free(ca_bio);
  if (!crl.empty()) {
    BIO* crl_bio = BIO_new_mem_buf(crl.data(), static_cast<int>(crl.size()));
    int crls = 0;
    while (X509_CRL* c = PEM_read_bio_X509_CRL(crl_bio, nullptr, nullptr, nullptr)) {
      X509_STORE_add_crl(store, c);
      X509_CRL_free(c);
      ++crls;
    }
    ERR_clear_error();
    BIO_free(crl_bio);
    if (crls > 0) X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
  }
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, cert, nullptr);
  X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_CLIENT);
  const bool verified = cas > 0 && X509_verify_cert(ctx) == 1;
  const int err = X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  const std::string cn = SubjectEntry(cert, NID_commonName);
  const std::string ou = SubjectEntry(cert, NID_organizationalUnitName);
  X509_free(cert);
  if (!verified) {
    return absl::UnauthenticatedError(absl::StrCat(
        "client certificate '", cn, "' refused: ",
        cas == 0 ? "no CA certificate to check it against" : X509_verify_cert_error_string(err)));
  }
  const Role role = ParseRole(ou);
  if (role == Role::kNone || cn.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("client certificate '", cn, "' names role '", ou,
                                                   "' (OU): not a Strata role"));
  }
  return Identity{role, cn, "certificate"};
}

absl::StatusOr<Identity> Authenticator::IdentifyToken(absl::string_view token) {
  const std::string digest = Sha256(token);
  absl::MutexLock l(&mu_);
  (void)ReloadLocked(/*force=*/false);
  for (const Token& t : tokens_) {
    if (CRYPTO_memcmp(t.sha256.data(), digest.data(), digest.size()) == 0) {
      return Identity{t.role, t.name, "token"};
    }
  }
  return absl::UnauthenticatedError(options_.token_file.empty()
                                        ? "bearer token given but this server has no token file"
                                        : "unknown bearer token");
}

absl::StatusOr<Identity> Authenticator::Identify(const grpc::ServerContext& ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth != nullptr) {
    std::vector<grpc::string_ref> pem = auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME);
    if (!pem.empty()) {
      return IdentifyCertificate(absl::string_view(pem[0].data(), pem[0].size()));
    }
  }
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it != md.end()) {
    absl::string_view v(it->second.data(), it->second.size());
    if (!absl::ConsumePrefix(&v, "Bearer ")) {
      return absl::UnauthenticatedError("authorization metadata is not 'Bearer <token>'");
    }
    return IdentifyToken(absl::StripAsciiWhitespace(v));
  }
  return absl::UnauthenticatedError("no client certificate and no bearer token");
}

ControlPlaneSecurity ControlPlaneSecurity::Plaintext() {
  ControlPlaneSecurity s;
  s.plaintext = true;
  s.server = grpc::InsecureServerCredentials();
  s.client = grpc::InsecureChannelCredentials();
  s.pserver_client = s.client;
  return s;
}

std::string ControlPlaneSecurity::ModeString() const {
  return plaintext ? "plaintext (no authentication)" : "mtls";
}

absl::StatusOr<Identity> ControlPlaneSecurity::Identify(const grpc::ServerContext& ctx) const {
  if (plaintext) return Identity{Role::kAdmin, "", "plaintext"};
  // (Fails closed: TLS credentials made without a server side.)
  if (auth == nullptr) return absl::UnauthenticatedError("this server cannot check callers");
  return auth->Identify(ctx);
}

absl::Status ControlPlaneSecurity::Permits(const Identity& who, absl::string_view method) const {
  if (plaintext) return absl::OkStatus();
  return CheckRpcPolicy(who.role, method);
}

absl::StatusOr<Identity> ControlPlaneSecurity::Authorize(const grpc::ServerContext& ctx,
                                                         absl::string_view method) const {
  STRATA_ASSIGN_OR_RETURN(Identity who, Identify(ctx));
  STRATA_RETURN_IF_ERROR(Permits(who, method));
  return who;
}

absl::Status CheckServerCertificate(absl::string_view pem, absl::string_view target, Role role,
                                    const std::string& ca_file, const std::string& crl_file) {
  // The host of the target.
  absl::string_view host = target;
  if (absl::ConsumePrefix(&host, "[")) {
    host = host.substr(0, host.find(']'));
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  }
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) {
    return absl::UnauthenticatedError(
        absl::StrCat("the server's certificate is unreadable: ", OpenSslError()));
  }
  const std::string cn = SubjectEntry(cert, NID_commonName);
  const std::string ou = SubjectEntry(cert, NID_organizationalUnitName);
  const std::string h(host);
  const bool covers = X509_check_host(cert, h.data(), h.size(), 0, nullptr) == 1 ||
                      X509_check_ip_asc(cert, h.c_str(), 0) == 1;
  absl::Status s;
  if (!covers) {
    s = absl::UnauthenticatedError(
        absl::StrCat("the server's certificate '", cn, "' does not cover host ", h));
  } else if (ParseRole(ou) != role) {
    s = absl::UnauthenticatedError(absl::StrCat("the server's certificate '", cn, "' is of role '",
                                                ou, "', not ", RoleName(role)));
  } else if (!crl_file.empty()) {
    absl::StatusOr<std::string> crl = ReadSmallFile(crl_file);
    absl::StatusOr<std::string> ca = ReadSmallFile(ca_file);
    if (crl.ok() && ca.ok()) {
      X509_STORE* store = X509_STORE_new();
      BIO* ca_bio = BIO_new_mem_buf(ca->data(), static_cast<int>(ca->size()));
      while (X509* c = PEM_read_bio_X509(ca_bio, nullptr, nullptr, nullptr)) {
        X509_STORE_add_cert(store, c);
        X509_free(c);
      }
      BIO_free(ca_bio);
      BIO* crl_bio = BIO_new_mem_buf(crl->data(), static_cast<int>(crl->size()));
      while (X509_CRL* c = PEM_read_bio_X509_CRL(crl_bio, nullptr, nullptr, nullptr)) {
        X509_STORE_add_crl(store, c);
        X509_CRL_free(c);
      }
      BIO_free(crl_bio);
      ERR_clear_error();
      X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);
      X509_STORE_CTX* ctx = X509_STORE_CTX_new();
      X509_STORE_CTX_init(ctx, store, cert, nullptr);
      X509_STORE_CTX_set_purpose(ctx, X509_PURPOSE_SSL_SERVER);
      if (X509_verify_cert(ctx) != 1) {
        s = absl::UnauthenticatedError(absl::StrCat(
            "the server's certificate '", cn,
            "' refused: ", X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx))));
      }
      X509_STORE_CTX_free(ctx);
      X509_STORE_free(store);
    }
  }
  X509_free(cert);
  return s;
}

namespace {

// gRPC's hook for CheckServerCertificate (after its own chain check; it
// replaces gRPC's host-name check, which it does too).
class ServerCertificateVerifier : public grpc::experimental::ExternalCertificateVerifier {
 public:
  ServerCertificateVerifier(Role role, std::string ca_file, std::string crl_file)
      : role_(role), ca_file_(std::move(ca_file)), crl_file_(std::move(crl_file)) {}
  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    const grpc::string_ref pem = request->peer_cert();
    const grpc::string_ref target = request->target_name();
    absl::Status s = CheckServerCertificate(absl::string_view(pem.data(), pem.size()),
                                            absl::string_view(target.data(), target.size()), role_,
                                            ca_file_, crl_file_);
    if (!s.ok()) {
      LOG_EVERY_N(WARNING, 10) << s.message();
    }
    *sync_status = s.ok()
                       ? grpc::Status::OK
                       : grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(s.message()));
    return true;  // (answered now)
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  const Role role_;
  const std::string ca_file_, crl_file_;
};

// Sends "authorization: Bearer <token>" with every call.
class TokenPlugin : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenPlugin(std::string token) : token_(std::move(token)) {}
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({"authorization", "Bearer " + token_});
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

}  // namespace

absl::StatusOr<Identity> ControlPlaneSecurity::IdentifyHttp(const HttpRequest& req) const {
  if (plaintext) return Identity{Role::kNone, "", "plaintext"};
  if (auth == nullptr) return absl::UnauthenticatedError("this process authenticates no one");
  if (!req.client_cert_pem.empty()) return auth->IdentifyCertificate(req.client_cert_pem);
  absl::string_view a = req.authorization;
  if (a.empty()) {
    return absl::UnauthenticatedError(
        "no credentials: send a client certificate of the cluster's CA or "
        "\"Authorization: Bearer TOKEN\"");
  }
  if (!absl::ConsumePrefix(&a, "Bearer ") && !absl::ConsumePrefix(&a, "bearer ")) {
    return absl::UnauthenticatedError("the Authorization header is not \"Bearer TOKEN\"");
  }
  return auth->IdentifyToken(absl::StripAsciiWhitespace(a));
}

absl::StatusOr<ControlPlaneSecurity> MakeControlPlaneSecurity(const TlsOptions& options) {
  if (options.plaintext) return ControlPlaneSecurity::Plaintext();
  if (options.dir.empty()) {
    return absl::InvalidArgumentError(
        "security.mode is mtls but no certificate directory is given (--tls_dir or "
        "security.tls_dir; scripts/gen-certs.sh makes one)");
  }
  const std::string ca = options.dir + "/ca.crt";
  STRATA_RETURN_IF_ERROR(ReadSmallFile(ca).status());
  const int refresh_s = std::max<int64_t>(1, absl::ToInt64Seconds(options.refresh));
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  std::pair<std::string, std::string> cert_files;
  if (!options.cert_name.empty()) {
    const std::string crt = absl::StrCat(options.dir, "/", options.cert_name, ".crt");
    const std::string key = absl::StrCat(options.dir, "/", options.cert_name, ".key");
    STRATA_RETURN_IF_ERROR(ReadSmallFile(crt).status());
    STRATA_RETURN_IF_ERROR(CheckSecretFilePermissions(key));
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(key, crt, ca,
                                                                                    refresh_s);
    cert_files = {crt, key};
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(ca, refresh_s);
  }
  ControlPlaneSecurity s;
  s.plaintext = false;
  for (const Role server : {Role::kMaster, Role::kPServer}) {
    grpc::experimental::TlsChannelCredentialsOptions o;
    o.set_certificate_provider(provider);
    o.watch_root_certs();
    if (!options.cert_name.empty()) o.watch_identity_key_cert_pairs();
    o.set_certificate_verifier(
        grpc::experimental::ExternalCertificateVerifier::Create<ServerCertificateVerifier>(
            server, ca, options.dir + "/crl.pem"));
    o.set_check_call_host(false);  // (the verifier checks the host)
    auto creds = grpc::experimental::TlsCredentials(o);
    if (creds == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.dir, ": TLS client credentials failed"));
    }
    (server == Role::kMaster ? s.client : s.pserver_client) = std::move(creds);
  }
  std::string token_for_client;
  if (options.cert_name.empty() || options.cert_name == "client") {
    // A client: a token file holds this client's token.
    if (!options.token_file.empty()) {
      STRATA_RETURN_IF_ERROR(CheckSecretFilePermissions(options.token_file));
      STRATA_ASSIGN_OR_RETURN(std::string t, ReadSmallFile(options.token_file));
      token_for_client = std::string(absl::StripAsciiWhitespace(t));
      if (token_for_client.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(options.token_file, ": empty token"));
      }
      for (auto* creds : {&s.client, &s.pserver_client}) {
        *creds = grpc::CompositeChannelCredentials(
            *creds,
            grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenPlugin>(token_for_client)));
      }
    }
  }
  if (!options.cert_name.empty() && options.cert_name != "client") {
    grpc::experimental::TlsServerCredentialsOptions o(provider);
    o.watch_root_certs();
    o.watch_identity_key_cert_pairs();
    // The Authenticator verifies client certificates per call, so that a
    // refusal is answered and audited with the caller's address instead
    // of failing the handshake unseen; TLS still proves the key.
    o.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY);
    s.server = grpc::experimental::TlsServerCredentials(o);
    if (s.server == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.dir, ": TLS server credentials failed"));
    }
    TlsOptions auth_options = options;
    STRATA_ASSIGN_OR_RETURN(auto auth, Authenticator::Create(auth_options));
    s.auth = std::move(auth);
    s.cert_file = cert_files.first;
    s.key_file = cert_files.second;
    s.ca_file = ca;
  }
  return s;
}

int CertificateIndex(const std::string& name) {
  absl::string_view who = absl::string_view(name).substr(0, name.find('@'));
  const size_t dash = who.rfind('-');
  int index = -1;
  if (dash == absl::string_view::npos || !absl::SimpleAtoi(who.substr(dash + 1), &index) ||
      index < 0) {
    return -1;
  }
  return index;
}

absl::StatusOr<ControlPlaneSecurity> DaemonSecurity(const SecuritySection& section,
                                                    const std::string& tls_dir,
                                                    const std::string& base_cert_name, int index) {
  if (section.mode == "plaintext") {
    LOG(WARNING) << "security.mode is plaintext: the control plane has no TLS and no "
                    "authentication; anyone who reaches its ports may act on the job";
    return ControlPlaneSecurity::Plaintext();
  }
  TlsOptions o;
  o.dir = tls_dir.empty() ? section.tls_dir : tls_dir;
  // The instance's own certificate when there is one.
  std::string cert_name = base_cert_name;
  if (index >= 0) {
    const std::string own = absl::StrCat(base_cert_name, "-", index);
    if (access(absl::StrCat(o.dir, "/", own, ".crt").c_str(), R_OK) == 0) cert_name = own;
  }
  o.cert_name = cert_name;
  o.refresh = absl::Seconds(section.refresh_seconds);
  // People's tokens are for the servers people call: the master, and a
  // pserver's status or any daemon's HTTP endpoints when the file is on
  // its host too.
  if (!section.token_file.empty()) {
    struct stat st;
    if (cert_name == "master" || stat(section.token_file.c_str(), &st) == 0) {
      o.token_file = section.token_file;
    }
  }
  auto s = MakeControlPlaneSecurity(o);
  if (!s.ok()) {
    return absl::Status(
        s.status().code(),
        absl::StrCat("security (mtls): ", s.status().message(),
                     " (security.mode is mtls unless the config says plaintext: make the "
                     "certificates with scripts/gen-certs.sh, or see docs/security.md)"));
  }
  LOG(INFO) << "control plane: mTLS, certificate " << o.dir << "/" << cert_name << ".crt"
            << (o.token_file.empty() ? "" : ", tokens from " + o.token_file);
  return s;
}

void ApplyServerLimits(grpc::ServerBuilder* builder, int connect_ms) {
  builder->SetMaxReceiveMessageSize(kMaxControlMessageBytes);
  builder->AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, kMaxControlMetadataBytes);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  // A client that holds a connection and does nothing loses it (nodes call
  // at every heartbeat; the CLI's are short).
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 5 * 60 * 1000);
  // A connection that has not finished its TLS handshake in this long is
  // closed (gRPC's default is 120 s: a peer could hold many half-open
  // ones); room for a slow handshake (cluster.control_connect_ms) is kept.
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              std::max(10000, 2 * connect_ms));
  grpc::ResourceQuota quota("strata-control-plane");
  quota.SetMaxThreads(kMaxControlThreads);
  builder->SetResourceQuota(quota);
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartControlServer(
    const std::string& who, const std::string& host, int port,
    const std::shared_ptr<grpc::ServerCredentials>& credentials, grpc::Service* service,
    int connect_ms, int* bound_port) {
  grpc::ServerBuilder builder;
  const std::string addr = absl::StrCat(host, ":", port);
  builder.AddListeningPort(addr, credentials, bound_port);
  ApplyServerLimits(&builder, connect_ms);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *bound_port == 0) {
    return absl::UnavailableError(absl::StrCat(
        who, ": cannot listen on ", addr, " (the port in use, or not an address of this host?)"));
  }
  return server;
}

namespace {

struct TlsFailureListeners {
  absl::Mutex mu;
  int next_id ABSL_GUARDED_BY(mu) = 0;
  std::map<int, std::function<void(const std::string&)>> listeners ABSL_GUARDED_BY(mu);
};

TlsFailureListeners& Listeners() {
  static auto* l = new TlsFailureListeners;  // (never destroyed: gRPC may log at exit)
  return *l;
}

void GrpcLogToGlog(gpr_log_func_args* args) {
  const google::LogSeverity severity =
      args->severity == GPR_LOG_SEVERITY_ERROR ? google::GLOG_ERROR : google::GLOG_INFO;
  google::LogMessage(args->file, args->line, severity).stream() << "grpc: " << args->message;
  const std::string reason = TlsFailureReason(args->message);
  if (reason.empty()) return;
  TlsFailureListeners& l = Listeners();
  absl::MutexLock lock(&l.mu);
  for (const auto& [id, listener] : l.listeners) listener(reason);
}

}  // namespace

std::string TlsFailureReason(absl::string_view message) {
  // "Handshake failed with fatal error SSL_ERROR_SSL: error:0A00010B:SSL
  // routines::wrong version number." (gRPC 1.51, tsi).
  if (!absl::StrContains(message, "Handshake failed")) return "";
  absl::string_view why = message;
  if (const size_t at = why.rfind("::"); at != absl::string_view::npos) {
    why = why.substr(at + 2);
  } else if (const size_t colon = why.rfind(": "); colon != absl::string_view::npos) {
    why = why.substr(colon + 2);
  }
  why = absl::StripAsciiWhitespace(why);
  absl::ConsumeSuffix(&why, ".");
  std::string reason = absl::StrCat("TLS handshake failed: ", why);
  if (absl::StrContains(why, "wrong version number") || absl::StrContains(why, "http request") ||
      absl::StrContains(why, "packet length too long")) {
    absl::StrAppend(&reason, " (not TLS: a plain-text client?)");
  }
  return reason;
}

int ListenForTlsFailures(std::function<void(const std::string& reason)> listener) {
  static absl::once_flag routed;
  absl::call_once(routed, [] { gpr_set_log_function(GrpcLogToGlog); });
  TlsFailureListeners& l = Listeners();
  absl::MutexLock lock(&l.mu);
  const int id = l.next_id++;
  l.listeners.emplace(id, std::move(listener));
  return id;
}

void StopListeningForTlsFailures(int id) {
  TlsFailureListeners& l = Listeners();
  absl::MutexLock lock(&l.mu);
  l.listeners.erase(id);
}

std::string PeerHost(absl::string_view peer) {
  if (absl::ConsumePrefix(&peer, "ipv4:") || absl::ConsumePrefix(&peer, "ipv6:")) {
    peer = peer.substr(0, peer.rfind(':'));
    absl::ConsumePrefix(&peer, "[");
    absl::ConsumeSuffix(&peer, "]");
  }
  return std::string(peer);
}

absl::StatusOr<PeerCallLimiter::Slot> PeerCallLimiter::Enter(absl::string_view grpc_peer) {
  std::string host = PeerHost(grpc_peer);
  absl::MutexLock l(&mu_);
  int& n = calls_[host];
  if (n >= limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(host, " has ", n, " calls in progress already (at most ", limit_, " a host)"));
  }
  ++n;
  return Slot(this, std::move(host));
}

int PeerCallLimiter::in_progress(absl::string_view host) const {
  absl::MutexLock l(&mu_);
  auto it = calls_.find(host);
  return it == calls_.end() ? 0 : it->second;
}

void PeerCallLimiter::Leave(const std::string& host) {
  absl::MutexLock l(&mu_);
  auto it = calls_.find(host);
  if (it != calls_.end() && --it->second <= 0) calls_.erase(it);
}

const std::map<std::string, std::vector<Role>>& RpcPolicy() {
  using R = Role;
  static const auto* policy = new std::map<std::string, std::vector<Role>>{
      // Membership and work: the daemons that do them.
      {"/strata.proto.Master/Register", {R::kPServer, R::kWorker}},
      {"/strata.proto.Master/Heartbeat", {R::kPServer, R::kWorker}},
      {"/strata.proto.Master/LeaseTask", {R::kWorker}},
      {"/strata.proto.Master/CompleteTask", {R::kWorker}},
      {"/strata.proto.Master/ReportProgress", {R::kWorker}},
      {"/strata.proto.Master/ReportSuspect", {R::kPServer, R::kWorker}},
      {"/strata.proto.Master/DeclareTables", {R::kWorker}},
      // Reading the cluster's state: every daemon and every person.
      {"/strata.proto.Master/GetClusterView",
       {R::kPServer, R::kWorker, R::kAdmin, R::kOperator, R::kViewer}},
      {"/strata.proto.Master/GetStatus",
       {R::kPServer, R::kWorker, R::kAdmin, R::kOperator, R::kViewer}},
      // Operating a running job.
      {"/strata.proto.Master/Checkpoint", {R::kAdmin, R::kOperator}},
      {"/strata.proto.Master/Drain", {R::kAdmin, R::kOperator}},
      {"/strata.proto.Master/Scale", {R::kAdmin, R::kOperator}},
      // Ending it.
      {"/strata.proto.Master/Stop", {R::kAdmin}},
      // The pservers' admin service: driven by the master.
      {"/strata.proto.PServerAdmin/AssignPartitions", {R::kMaster}},
      {"/strata.proto.PServerAdmin/CheckpointPartitions", {R::kMaster}},
      {"/strata.proto.PServerAdmin/GetStatus", {R::kMaster, R::kAdmin, R::kOperator, R::kViewer}},
  };
  return *policy;
}

const std::map<std::string, std::vector<Role>>& HttpPolicy() {
  using R = Role;
  static const auto* policy = new std::map<std::string, std::vector<Role>>{
      // Reading state and metrics: every person (Prometheus scrapes as a
      // viewer).
      {"/", {R::kAdmin, R::kOperator, R::kViewer}},  // the status page
      {"/status", {R::kAdmin, R::kOperator, R::kViewer}},
      {"/metrics", {R::kAdmin, R::kOperator, R::kViewer}},
      // Log lines may name files, hosts and peers: those who operate.
      {"/logs", {R::kAdmin, R::kOperator}},
  };
  return *policy;
}

absl::Status CheckHttpPolicy(Role role, absl::string_view path) {
  if (path == kPublicHttpPath) return absl::OkStatus();
  auto it = HttpPolicy().find(std::string(path));
  if (it == HttpPolicy().end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("GET ", path, " is not in the policy: denied to every role"));
  }
  std::string allowed;
  for (Role r : it->second) {
    if (r == role) return absl::OkStatus();
    absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", RoleName(r));
  }
  return absl::PermissionDeniedError(
      absl::StrCat("role ", RoleName(role), " may not GET ", path, " (allowed: ", allowed, ")"));
}

absl::Status SecureHttp(const ControlPlaneSecurity& security, HttpServer* http,
                        HttpRefusalHook on_refused) {
  if (security.plaintext) return absl::OkStatus();
  if (security.cert_file.empty()) {
    return absl::FailedPreconditionError("HTTPS needs this daemon's certificate (none loaded)");
  }
  STRATA_RETURN_IF_ERROR(http->EnableTls(security.cert_file, security.key_file, security.ca_file));
  if (on_refused == nullptr) {
    struct Limiter {
      absl::Mutex mu;
      std::map<std::string, absl::Time> last ABSL_GUARDED_BY(mu);
    };
    auto limiter = std::make_shared<Limiter>();
    on_refused = [limiter](const std::string& who, const HttpRequest& req,
                           const absl::Status& why) {
      const std::string host(absl::string_view(req.peer).substr(0, req.peer.rfind(':')));
      {
        absl::MutexLock l(&limiter->mu);
        absl::Time& last = limiter->last[absl::StrCat(host, " ", req.path)];
        const absl::Time now = absl::Now();
        if (now - last < absl::Seconds(1)) return;
        last = now;
        if (limiter->last.size() > 4096) limiter->last.clear();  // (bounded)
      }
      LOG(WARNING) << "https: refused GET " << req.path << " from " << req.peer
                   << (who.empty() ? "" : " (" + who + ")") << ": " << why.message();
    };
  }
  http->SetGate([security, on_refused](const HttpRequest& req) -> std::optional<HttpResponse> {
    if (req.path == kPublicHttpPath) return std::nullopt;
    absl::StatusOr<Identity> who = security.IdentifyHttp(req);
    absl::Status why = who.ok() ? CheckHttpPolicy(who->role, req.path) : who.status();
    if (why.ok()) return std::nullopt;
    on_refused(who.ok() ? who->ToString() : "", req, why);
    HttpResponse r;
    r.status = absl::IsUnauthenticated(why) ? 401 : 403;
    r.body = absl::StrCat(why.message(), "\n");
    return r;
  });
  return absl::OkStatus();
}

absl::Status CheckRpcPolicy(Role role, absl::string_view method) {
  auto it = RpcPolicy().find(std::string(method));
  if (it == RpcPolicy().end()) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, " is not in the policy: denied to every role"));
  }
  for (Role r : it->second) {
    if (r == role) return absl::OkStatus();
  }
  std::string allowed;
  for (Role r : it->second) absl::StrAppend(&allowed, allowed.empty() ? "" : ", ", RoleName(r));
  return absl::PermissionDeniedError(
      absl::StrCat("role ", RoleName(role), " may not call ", method, " (allowed: ", allowed, ")"));
}

}  // namespace strata
