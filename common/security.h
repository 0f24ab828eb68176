// Who may talk to a Strata daemon over the control plane (gRPC), and what
// each caller may do (docs/security.md).
//
// Every daemon's gRPC server and every channel between daemons is TLS with
// certificates of the cluster's CA, made by scripts/gen-certs.sh. The
// certificate names its holder: OU is the role (master, pserver, worker for
// daemons; admin, operator, viewer for people), CN the name
// ("worker@10.0.0.7", "alice"). People may instead present a bearer token
// from the server's token file. A caller's identity is taken from the
// verified certificate or token only, never from a request field.
//
// Each RPC method is allowed for a stated set of roles (RpcPolicy());
// anything not listed is denied.
//
// Plain text (no TLS, no authentication, everything allowed) exists only
// when the config says `security.mode: plaintext`; the daemons then say so
// in their log, in `strata status` and on the status page.
#ifndef STRATA_COMMON_SECURITY_H_
#define STRATA_COMMON_SECURITY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/http_server.h"
#include "grpcpp/grpcpp.h"

namespace strata {

enum class Role { kNone, kMaster, kPServer, kWorker, kAdmin, kOperator, kViewer };
// "master", ..., "viewer"; "none".
const char* RoleName(Role role);
// The role named `name` (as RoleName gives it), or kNone.
Role ParseRole(absl::string_view name);
// Every role but kNone, daemons first.
const std::vector<Role>& AllRoles();

// A caller, as the server established it.
struct Identity {
  Role role = Role::kNone;
  std::string name;    // certificate CN or token name; "" in plain text
  std::string source;  // "certificate" | "token" | "plaintext"
  // "worker:worker@10.0.0.7" (role:name), for logs and the audit log.
  std::string ToString() const;
};

// The control plane's settings for one process.
struct TlsOptions {
  bool plaintext = false;
  // ca.crt plus this process's <cert_name>.crt and <cert_name>.key.
  std::string dir;
  // "master", "pserver", "worker" for daemons; "client" for the CLI; "" for
  // a client with no certificate (it then needs a token).
  std::string cert_name;
  // Servers: the token table ("name role token" lines), "" = none.
  // Clients: a file holding this client's token, "" = none.
  std::string token_file;
  // How often certificate, CA and token files are read again.
  absl::Duration refresh = absl::Seconds(60);
};

// OK when the file at `path` is a regular file readable by its owner only
// (no group or other permission bits); FailedPrecondition naming the file
// and its mode otherwise, NotFound when it is missing.
absl::Status CheckSecretFilePermissions(const std::string& path);

// The CA, and the certificates and tokens a server accepts. Re-reads its
// files when they change (checked at most once per `refresh`), so renewed
// certificates and edited token files take effect without a restart.
// Thread-safe.
class Authenticator {
 public:
  // Reads dir/ca.crt and the token file (if any). Errors name the file.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(const TlsOptions& options);
  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // The caller of the RPC in `ctx`: its client certificate, verified against
  // the CA (chain, validity dates, the role in OU; not revoked when dir/crl.pem
  // exists: gen-certs.sh revoke), else the bearer token of
  // its "authorization" metadata. Unauthenticated with the reason (no
  // credentials, untrusted or expired certificate, unknown token).
  absl::StatusOr<Identity> Identify(const grpc::ServerContext& ctx);
  // The same check on a PEM certificate or a token (tests, HTTP).
  absl::StatusOr<Identity> IdentifyCertificate(absl::string_view pem);
  absl::StatusOr<Identity> IdentifyToken(absl::string_view token);

 private:
  struct Token {
    std::string name;
    Role role;
    std::string sha256;  // of the token
  };
  explicit Authenticator(TlsOptions options) : options_(std::move(options)) {}
  absl::Status ReloadLocked(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TlsOptions options_;
  absl::Mutex mu_;
  std::string ca_pem_ ABSL_GUARDED_BY(mu_);
  std::string crl_pem_ ABSL_GUARDED_BY(mu_);  // dir/crl.pem, "" when there is none
  int64_t crl_mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<Token> tokens_ ABSL_GUARDED_BY(mu_);
  int64_t ca_mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t tokens_mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// A daemon's or client's control-plane credentials, made once in main.
struct ControlPlaneSecurity {
  bool plaintext = true;
  std::shared_ptr<grpc::ServerCredentials> server;  // for servers
  // For channels to the master (every daemon's and the CLI's), and the
  // master's to pservers: each checks that the server's certificate names
  // that role and covers the host dialled (CheckServerCertificate).
  std::shared_ptr<grpc::ChannelCredentials> client;
  std::shared_ptr<grpc::ChannelCredentials> pserver_client;
  const std::shared_ptr<grpc::ChannelCredentials>& ForPServers() const {
    return pserver_client != nullptr ? pserver_client : client;
  }
  std::shared_ptr<Authenticator> auth;  // null in plain text
  // A server's own certificate, key and CA files (for HTTPS); "" otherwise.
  std::string cert_file, key_file, ca_file;

  // Insecure credentials; every caller is allowed (tests, plaintext mode).
  static ControlPlaneSecurity Plaintext();
  // "mtls" or "plaintext (no authentication)".
  std::string ModeString() const;
  // The caller of `ctx` (Unauthenticated with the reason). Plain text: an
  // identity of source "plaintext".
  absl::StatusOr<Identity> Identify(const grpc::ServerContext& ctx) const;
  // Whether `who` may call `method` (a full gRPC name,
  // "/strata.proto.Master/Stop"): PermissionDenied with the reason. Plain
  // text: always.
  absl::Status Permits(const Identity& who, absl::string_view method) const;
  // Both.
  absl::StatusOr<Identity> Authorize(const grpc::ServerContext& ctx,
                                     absl::string_view method) const;
  // The caller of an HTTP request: its client certificate, else the bearer
  // token of its Authorization header. Plain text: "plaintext".
  absl::StatusOr<Identity> IdentifyHttp(const HttpRequest& req) const;
};

// What a client checks of the server it called, beyond gRPC's chain
// verification: `pem` (its certificate) covers the host of `target`
// ("host", "host:port" or "[v6]:port": a DNS name or IP address in its
// subjectAltName), names `role` in its OU, and is not on the revocation
// list `crl_file` ("" or a missing file: none) of the CA `ca_file`.
// Unauthenticated naming what does not match.
absl::Status CheckServerCertificate(absl::string_view pem, absl::string_view target, Role role,
                                    const std::string& ca_file, const std::string& crl_file);

// Builds the credentials: in TLS mode reads dir/ca.crt and, unless
// cert_name is empty, dir/<cert_name>.crt and .key (the key refused when
// group or others may read it). Servers ask for a client certificate but
// verify it themselves (Authenticator), so refusals can be logged and
// audited with the caller's address.
absl::StatusOr<ControlPlaneSecurity> MakeControlPlaneSecurity(const TlsOptions& options);

// A daemon's credentials from the config's security section: its
// certificate `cert_name` ("master", "pserver", "worker") in `tls_dir`, or
// security.tls_dir when that is empty; the instance's own
// `<cert_name>-<index>` when the directory has it (gen-certs.sh makes one
// per instance). Logs the mode (plain text as a warning). Errors name the
// file and what is wrong with it.
absl::StatusOr<ControlPlaneSecurity> DaemonSecurity(const SecuritySection& section,
                                                    const std::string& tls_dir,
                                                    const std::string& cert_name, int index = -1);

// The instance index a daemon certificate's name binds it to: N for
// "worker-N@host", -1 for a host-wide "worker@host".
int CertificateIndex(const std::string& name);

// Limits of every control-plane server (docs/security.md): a bound on a
// received message, on metadata, on concurrent calls per connection, on
// handler threads, and idle connections closed.
inline constexpr int kMaxControlMessageBytes = 32 << 20;
inline constexpr int kMaxControlMetadataBytes = 8 << 10;
inline constexpr int kMaxStreamsPerConnection = 16;
inline constexpr int kMaxControlThreads = 256;
// `connect_ms`: cluster.control_connect_ms (a slow TLS handshake is given
// twice that, and at least 10 s).
void ApplyServerLimits(grpc::ServerBuilder* builder, int connect_ms);
// A control-plane server of `service` (borrowed; outlives the server) on
// host:port (0: a free one) with `credentials` and ApplyServerLimits's
// limits; its bound port in *bound_port. UNAVAILABLE naming `who` and the
// address when it cannot listen (the port in use).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartControlServer(
    const std::string& who, const std::string& host, int port,
    const std::shared_ptr<grpc::ServerCredentials>& credentials, grpc::Service* service,
    int connect_ms, int* bound_port);

// gRPC refuses a caller whose TLS handshake fails (plain text, not TLS at
// all, no cipher in common) before any handler runs, and only logs it,
// without the peer's address. ListenForTlsFailures routes gRPC's log
// lines of this process through glog (from the first call on) and hands
// each failed handshake's reason ("wrong version number: not TLS (a
// plain-text client?)") to `listener`, on a gRPC thread: it must not block.
// The id stops it (StopListeningForTlsFailures waits for a call in progress).
int ListenForTlsFailures(std::function<void(const std::string& reason)> listener);
void StopListeningForTlsFailures(int id);
// The reason ListenForTlsFailures gives for gRPC's log line `message`, or
// "" when it is not a failed handshake.
std::string TlsFailureReason(absl::string_view message);

// The host of a gRPC peer ("ipv4:10.0.0.7:5123" -> "10.0.0.7",
// "ipv6:[::1]:5123" -> "::1").
std::string PeerHost(absl::string_view grpc_peer);

// Calls in progress per peer host, at most `limit` at once: one host
// cannot hold more than its share of a server's handler threads. (gRPC
// 1.51 has no cap on a peer's connections; this bounds what they can do.)
// Thread-safe.
class PeerCallLimiter {
 public:
  explicit PeerCallLimiter(int limit) : limit_(limit) {}
  PeerCallLimiter(const PeerCallLimiter&) = delete;
  PeerCallLimiter& operator=(const PeerCallLimiter&) = delete;

  // Holds one call's place until destroyed.
  class Slot {
   public:
    Slot() = default;
    Slot(PeerCallLimiter* owner, std::string host) : owner_(owner), host_(std::move(host)) {}
    Slot(Slot&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), host_(std::move(o.host_)) {}
    Slot& operator=(Slot&&) = delete;
    ~Slot() {
      if (owner_ != nullptr) owner_->Leave(host_);
    }

   private:
    PeerCallLimiter* owner_ = nullptr;
    std::string host_;
  };

  // A place for a call from `grpc_peer`; ResourceExhausted naming the host
  // when it has `limit` calls in progress already.
  absl::StatusOr<Slot> Enter(absl::string_view grpc_peer);
  int in_progress(absl::string_view host) const;

 private:
  void Leave(const std::string& host);
  const int limit_;
  mutable absl::Mutex mu_;
  std::map<std::string, int, std::less<>> calls_ ABSL_GUARDED_BY(mu_);
};
inline constexpr int kMaxCallsPerPeerHost = 64;

// The policy: each method's allowed roles. Methods are full gRPC names.
const std::map<std::string, std::vector<Role>>& RpcPolicy();
// OK when `role` may call `method`; PermissionDenied naming both otherwise
// (also for a method the policy does not list).
absl::Status CheckRpcPolicy(Role role, absl::string_view method);

// The HTTP endpoints' policy: each path's allowed roles. "/healthz" is
// open to anyone without credentials (it answers "ok" and nothing else:
// liveness probes).
const std::map<std::string, std::vector<Role>>& HttpPolicy();
inline constexpr absl::string_view kPublicHttpPath = "/healthz";
// OK when `role` may GET `path`; PermissionDenied naming both otherwise
// (also for a path the policy does not list).
absl::Status CheckHttpPolicy(Role role, absl::string_view path);

// Called for each refused HTTP request: the caller ("" when it could not
// be authenticated), the request, and why.
using HttpRefusalHook =
    std::function<void(const std::string& who, const HttpRequest& req, const absl::Status& why)>;

// A daemon's HTTP endpoints under its security: HTTPS with its own
// certificate, every request checked against HttpPolicy() (401 without
// valid credentials, 403 for a role the path does not allow). Refusals go
// to `on_refused`, or (when it is null) to the log, at most once a second
// per client host and path. Plain text: the server is left as it is.
absl::Status SecureHttp(const ControlPlaneSecurity& security, HttpServer* http,
                        HttpRefusalHook on_refused = nullptr);

}  // namespace strata

#endif  // STRATA_COMMON_SECURITY_H_
