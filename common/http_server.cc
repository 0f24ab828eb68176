#include "common/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "openssl/err.h"
#include "openssl/pem.h"
#include "openssl/ssl.h"
#include "openssl/x509.h"

namespace strata {
namespace {

constexpr size_t kMaxRequestBytes = 16 * 1024;
constexpr absl::Duration kRequestReadTimeout = absl::Seconds(2);
constexpr absl::Duration kResponseWriteTimeout = absl::Seconds(2);
constexpr absl::Duration kDrainTimeout = absl::Milliseconds(200);
constexpr int kAcceptPollMs = 100;
constexpr absl::Duration kTlsFileCheckInterval = absl::Seconds(1);

std::string ErrnoText(int err) { return std::strerror(err); }

// Milliseconds left until `deadline`, clamped to [0, INT_MAX].
int MillisLeft(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  int64_t ms = absl::ToInt64Milliseconds(left) + 1;
  return ms > 1 << 30 ? 1 << 30 : static_cast<int>(ms);
}

// Waits for `events` on `fd` until `deadline`. Returns >0 when ready, 0 on
// timeout, <0 with errno set on error.
int PollUntil(int fd, short events, absl::Time deadline) {
  while (true) {
    pollfd pfd{fd, events, 0};
    int rc = poll(&pfd, 1, MillisLeft(deadline));
    if (rc < 0 && errno == EINTR) continue;
    return rc;
  }
}

// Writes all of `data` before `deadline`. Returns 0, ETIMEDOUT, or the errno
// of the failed call.
int SendAll(int fd, absl::string_view data, absl::Time deadline) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return EPIPE;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      int ready = PollUntil(fd, POLLOUT, deadline);
      if (ready == 0) return ETIMEDOUT;
      if (ready < 0) return errno;
      continue;
    }
    return errno;
  }
  return 0;
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 307:
      return "Temporary Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

// Serializes a response; HEAD gets the headers only.
std::string FormatResponse(const HttpResponse& response, bool head_only,
                           const std::string& extra_headers = "") {
  std::string out = absl::StrCat(
      "HTTP/1.1 ", response.status, " ", ReasonPhrase(response.status), "\r\n",
      "Content-Type: ", response.content_type, "\r\n", "Content-Length: ", response.body.size(),
      "\r\n", response.status == 401 ? "WWW-Authenticate: Bearer realm=\"strata\"\r\n" : "",
      response.location.empty() ? "" : absl::StrCat("Location: ", response.location, "\r\n"),
      extra_headers, "Connection: close\r\n\r\n");
  if (!head_only) out += response.body;
  return out;
}

HttpResponse TextResponse(int status, absl::string_view text) {
  HttpResponse response;
  response.status = status;
  response.body = absl::StrCat(text, "\n");
  return response;
}

// Resolves host:port for a stream socket; `passive` for bind().
absl::StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string service = absl::StrCat(port);
  addrinfo* result = nullptr;
  const char* node = host.empty() ? nullptr : host.c_str();
  int rc = getaddrinfo(node, service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolve ", HostPort(host, port), ": ", gai_strerror(rc)));
  }
  return result;
}

std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

int64_t MtimeNs(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// The client's certificate is asked for but judged by the gate (with the
// caller's address at hand), not by the handshake.
int AcceptAnyClientCertificate(int /*ok*/, X509_STORE_CTX* /*ctx*/) { return 1; }

struct SslCtxDeleter {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxDeleter>;

// A server context with the certificate chain and key of these files.
absl::StatusOr<SslCtxPtr> MakeServerContext(const std::string& cert, const std::string& key,
                                            const std::string& ca) {
  ERR_clear_error();
  SslCtxPtr ctx(SSL_CTX_new(TLS_server_method()));
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslErrors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert, ": not a usable certificate: ", OpenSslErrors()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": not a usable key: ", OpenSslErrors()));
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": does not match ", cert));
  }
  // Names the CA in the certificate request, so browsers and curl offer
  // the right certificate.
  if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(ca.c_str())) {
    SSL_CTX_set_client_CA_list(ctx.get(), names);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(ca, ": no CA certificate: ", OpenSslErrors()));
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, AcceptAnyClientCertificate);
  // No resumption: every connection shows its certificate afresh.
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  return ctx;
}

std::string PeerAddress(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  } else if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  }
  return HostPort(host, port);
}

}  // namespace

// The TLS context, rebuilt when its files change.
struct HttpServer::Tls {
  std::string cert, key, ca;
  SslCtxPtr ctx;
  int64_t cert_mtime = -1, key_mtime = -1, ca_mtime = -1;
  absl::Time next_check;

  // Builds the context anew when a file changed since the last build (at
  // most once per kTlsFileCheckInterval); keeps the old one when the new
  // files cannot be used (renewal half-done), saying why.
  void MaybeReload() {
    const absl::Time now = absl::Now();
    if (now < next_check) return;
    next_check = now + kTlsFileCheckInterval;
    const int64_t c = MtimeNs(cert), k = MtimeNs(key), a = MtimeNs(ca);
    if (c == cert_mtime && k == key_mtime && a == ca_mtime) return;
    auto fresh = MakeServerContext(cert, key, ca);
    if (!fresh.ok()) {
      LOG(WARNING) << "https: keeping the certificate in use: " << fresh.status().message();
      return;
    }
    ctx = *std::move(fresh);
    cert_mtime = c;
    key_mtime = k;
    ca_mtime = a;
    LOG(INFO) << "https: certificate " << cert << " read again";
  }
};

// One accepted connection: reads and writes with deadlines, plain or TLS.
class HttpServer::Conn {
 public:
  explicit Conn(int fd) : fd_(fd) {}
  ~Conn() {
    if (ssl_ != nullptr) SSL_free(ssl_);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // The TLS handshake, done by `deadline`; errors say why (logged by the
  // caller at low verbosity: scanners and probes fail it all day).
  absl::Status AcceptTls(SSL_CTX* ctx, absl::Time deadline) {
    ERR_clear_error();
    ssl_ = SSL_new(ctx);
    if (ssl_ == nullptr || SSL_set_fd(ssl_, fd_) != 1) {
      return absl::InternalError("SSL_new: " + OpenSslErrors());
    }
    while (true) {
      ERR_clear_error();
      const int rc = SSL_accept(ssl_);
      if (rc == 1) return absl::OkStatus();
      const int err = SSL_get_error(ssl_, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        const int ready = PollUntil(fd_, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
        if (ready == 0) return absl::DeadlineExceededError("TLS handshake not done in time");
        if (ready < 0) return absl::UnavailableError(ErrnoText(errno));
        continue;
      }
      return absl::UnavailableError("TLS handshake: " + OpenSslErrors());
    }
  }

  // The client's certificate as PEM, "" when it sent none.
  std::string PeerCertificatePem() const {
    if (ssl_ == nullptr) return "";
    X509* cert = SSL_get_peer_certificate(ssl_);
    if (cert == nullptr) return "";
    std::string pem;
    BIO* bio = BIO_new(BIO_s_mem());
    if (bio != nullptr && PEM_write_bio_X509(bio, cert) == 1) {
      char* data = nullptr;
      const long n = BIO_get_mem_data(bio, &data);
      if (n > 0) pem.assign(data, static_cast<size_t>(n));
    }
    BIO_free(bio);
    X509_free(cert);
    return pem;
  }

  // >0: bytes read; 0: the client closed; -1: an error; -2: the deadline.
  ssize_t Read(char* buf, size_t size, absl::Time deadline) {
    while (true) {
      if (ssl_ == nullptr) {
        const int ready = PollUntil(fd_, POLLIN, deadline);
        if (ready <= 0) return ready == 0 ? -2 : -1;
        const ssize_t n = recv(fd_, buf, size, MSG_DONTWAIT);
        if (n >= 0) return n;
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
        return -1;
      }
      ERR_clear_error();
      const int n = SSL_read(ssl_, buf, static_cast<int>(size));
      if (n > 0) return n;
      const int err = SSL_get_error(ssl_, n);
      if (err == SSL_ERROR_ZERO_RETURN) return 0;
      if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) return -1;
      const int ready = PollUntil(fd_, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
      if (ready <= 0) return ready == 0 ? -2 : -1;
    }
  }

  // 0, ETIMEDOUT, or the errno (EPIPE for a TLS failure).
  int WriteAll(absl::string_view data, absl::Time deadline) {
    if (ssl_ == nullptr) return SendAll(fd_, data, deadline);
    while (!data.empty()) {
      ERR_clear_error();
      const int n = SSL_write(ssl_, data.data(), static_cast<int>(data.size()));
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      const int err = SSL_get_error(ssl_, n);
      if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) return EPIPE;
      const int ready = PollUntil(fd_, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
      if (ready == 0) return ETIMEDOUT;
      if (ready < 0) return errno;
    }
    return 0;
  }

  // Sends `response` and ends the connection gracefully: close_notify over
  // TLS, a half-close, then a brief drain of what the client still sends so
  // close() does not reset the connection under the response.
  void Respond(const HttpResponse& response, bool head_only, const std::string& extra_headers) {
    int err = WriteAll(FormatResponse(response, head_only, extra_headers),
                       absl::Now() + kResponseWriteTimeout);
    if (err != 0) {
      VLOG(1) << "http server: sending a " << response.status << " response: " << ErrnoText(err);
      return;
    }
    if (ssl_ != nullptr) {
      ERR_clear_error();
      SSL_shutdown(ssl_);
    }
    shutdown(fd_, SHUT_WR);
    const absl::Time drain_deadline = absl::Now() + kDrainTimeout;
    char buf[4096];
    while (PollUntil(fd_, POLLIN, drain_deadline) > 0) {
      ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0) break;
      if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) break;
    }
  }

 private:
  const int fd_;
  SSL* ssl_ = nullptr;
};

HttpServer::HttpServer() = default;
HttpServer::~HttpServer() { Shutdown(); }

void HttpServer::Handle(const std::string& path, HttpHandler handler) {
  CHECK(!thread_.joinable()) << "Handle() must be called before Start()";
  handlers_[path] = std::move(handler);
}

void HttpServer::SetGate(HttpGate gate) {
  CHECK(!thread_.joinable()) << "SetGate() must be called before Start()";
  gate_ = std::move(gate);
}

absl::Status HttpServer::EnableTls(const std::string& cert_file, const std::string& key_file,
                                   const std::string& ca_file) {
  if (thread_.joinable()) return absl::FailedPreconditionError("EnableTls() after Start()");
  auto tls = std::make_unique<Tls>();
  tls->cert = cert_file;
  tls->key = key_file;
  tls->ca = ca_file;
  tls->cert_mtime = MtimeNs(cert_file);
  tls->key_mtime = MtimeNs(key_file);
  tls->ca_mtime = MtimeNs(ca_file);
  STRATA_ASSIGN_OR_RETURN(tls->ctx, MakeServerContext(cert_file, key_file, ca_file));
  tls->next_check = absl::Now() + kTlsFileCheckInterval;
  tls_ = std::move(tls);
  return absl::OkStatus();
}

absl::Status HttpServer::Start(const std::string& host, int port) {
  if (listen_fd_ >= 0 || thread_.joinable() || stop_.HasBeenNotified()) {
    return absl::FailedPreconditionError("HttpServer already started");
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid port ", port, " for ", HostPort(host, port)));
  }
  absl::StatusOr<addrinfo*> resolved = Resolve(host, port, /*passive=*/true);
  if (!resolved.ok()) return resolved.status();
  addrinfo* addrs = *resolved;

  std::string last_error = "no addresses";
  int fd = -1;
  for (addrinfo* ai = addrs; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = absl::StrCat("socket: ", ErrnoText(errno));
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      last_error = absl::StrCat("bind: ", ErrnoText(errno));
    } else if (listen(fd, SOMAXCONN) != 0) {
      last_error = absl::StrCat("listen: ", ErrnoText(errno));
    } else {
      break;  // bound and listening
    }
    close(fd);
    fd = -1;
  }
  freeaddrinfo(addrs);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("http server on ", HostPort(host, port), ": ", last_error));
  }

  sockaddr_storage bound;
  socklen_t len = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(
        absl::StrCat("getsockname for ", HostPort(host, port), ": ", ErrnoText(err)));
  }
  if (bound.ss_family == AF_INET6) {
    port_ = ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  } else {
    port_ = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  listen_fd_ = fd;
  thread_ = std::thread([this] { Serve(); });
  VLOG(1) << "http server listening on " << HostPort(host, port_);
  return absl::OkStatus();
}

void HttpServer::Shutdown() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  // Wakes the accept loop's poll() at once (Linux); the poll timeout bounds
  // the wait otherwise.
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
  }
}

void HttpServer::Serve() {
  // A TLS write to a closed connection must not raise SIGPIPE (tests and
  // tools have no handler; daemons block it already).
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  while (!stop_.HasBeenNotified()) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    int rc = poll(&pfd, 1, kAcceptPollMs);
    if (rc < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "http server poll: " << ErrnoText(errno);
      return;
    }
    if (rc == 0 || stop_.HasBeenNotified()) continue;
    sockaddr_storage from;
    socklen_t from_len = sizeof(from);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &from_len,
                     SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK || err == ECONNABORTED ||
          err == EPROTO) {
        continue;
      }
      LOG(WARNING) << "http server accept: " << ErrnoText(err);
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        // Out of resources: back off instead of spinning.
        stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100));
        continue;
      }
      return;
    }
    const std::string peer = PeerAddress(from);
    {
      Conn conn(fd);
      if (tls_ == nullptr) {
        ServeConnection(conn, peer);
      } else {
        // The handshake and the request share one deadline, so a client
        // that stalls either cannot hold the (only) serving thread.
        const absl::Time deadline = absl::Now() + kRequestReadTimeout;
        tls_->MaybeReload();
        unsigned char first = 0;
        const bool readable = PollUntil(fd, POLLIN, deadline) > 0;
        const ssize_t n = readable ? recv(fd, &first, 1, MSG_PEEK | MSG_DONTWAIT) : -1;
        if (n == 1 && first != 0x16) {
          // Not a TLS handshake record: a plain-text request, answered so.
          conn.Respond(TextResponse(400, "this port speaks HTTPS only: use https://"), false, "");
        } else if (n == 1) {
          absl::Status s = conn.AcceptTls(tls_->ctx.get(), deadline);
          if (s.ok()) {
            ServeConnection(conn, peer);
          } else {
            VLOG(1) << "https: from " << peer << ": " << s.message();
          }
        }
      }
    }
    close(fd);
  }
}

void HttpServer::ServeConnection(Conn& conn, const std::string& peer) {
  // The whole request must arrive within kRequestReadTimeout, so a client
  // trickling bytes cannot hold the (only) serving thread.
  const absl::Time read_deadline = absl::Now() + kRequestReadTimeout;
  std::string request;
  size_t header_end = std::string::npos;
  bool too_large = false;
  char buf[4096];
  while (true) {
    const ssize_t n = conn.Read(buf, sizeof(buf), read_deadline);
    if (n <= 0) {
      if (n == -2 && !request.empty()) {
        conn.Respond(TextResponse(408, "request timeout"), false, "");
      }
      return;  // closed before a full request, or an error
    }
    // Search only the new bytes (plus 3 for a split terminator).
    size_t search_from = request.size() >= 3 ? request.size() - 3 : 0;
    request.append(buf, static_cast<size_t>(n));
    header_end = request.find("\r\n\r\n", search_from);
    if (header_end != std::string::npos) {
      too_large = header_end + 4 > kMaxRequestBytes;
      break;
    }
    if (request.size() > kMaxRequestBytes) {
      too_large = true;
      break;
    }
  }
  if (too_large) {
    conn.Respond(TextResponse(431, "request too large"), false, "");
    return;
  }

  // Request line: METHOD SP request-target SP HTTP-version.
  absl::string_view head(request.data(), header_end);
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() || parts[1][0] != '/' ||
      !absl::StartsWith(parts[2], "HTTP/")) {
    conn.Respond(TextResponse(400, "bad request"), false, "");
    return;
  }
  HttpRequest req;
  req.method = std::string(parts[0]);
  absl::string_view target = parts[1];
  size_t q = target.find('?');
  req.path = std::string(target.substr(0, q));
  if (q != absl::string_view::npos) {
    req.query = std::string(target.substr(q + 1));
  }
  req.peer = peer;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(lines[i].substr(0, colon)),
                               "Authorization")) {
      req.authorization = std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
  }
  req.client_cert_pem = conn.PeerCertificatePem();

  const bool head_only = req.method == "HEAD";
  if (req.method != "GET" && !head_only) {
    conn.Respond(TextResponse(405, "method not allowed"), false, "Allow: GET, HEAD\r\n");
    return;
  }
  if (gate_) {
    if (std::optional<HttpResponse> refused = gate_(req)) {
      conn.Respond(*refused, head_only, "");
      return;
    }
  }
  auto it = handlers_.find(req.path);
  HttpResponse response = it == handlers_.end() ? TextResponse(404, "not found") : it->second(req);
  conn.Respond(response, head_only, "");
}

absl::StatusOr<std::string> HttpGet(const std::string& host, int port, const std::string& path,
                                    absl::Duration timeout) {
  const std::string address = HostPort(host, port);
  const std::string url = absl::StrCat("http://", address, path);
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<addrinfo*> resolved = Resolve(host, port, /*passive=*/false);
  if (!resolved.ok()) return resolved.status();
  addrinfo* addrs = *resolved;

  // Connect, non-blocking so the timeout applies.
  int fd = -1;
  std::string last_error = "no addresses";
  for (addrinfo* ai = addrs; ai != nullptr; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last_error = ErrnoText(errno);
      continue;
    }
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      int ready = PollUntil(fd, POLLOUT, deadline);
      if (ready == 0) {
        last_error = absl::StrCat("timed out after ", absl::FormatDuration(timeout));
      } else if (ready < 0) {
        last_error = ErrnoText(errno);
      } else {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0) {
          rc = 0;
        } else {
          last_error = ErrnoText(err);
        }
      }
    } else if (rc != 0) {
      last_error = ErrnoText(errno);
    }
    if (rc == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(addrs);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("connect to ", address, ": ", last_error));
  }

  const std::string request = absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", address,
                                           "\r\nConnection: close\r\nAccept: */*\r\n\r\n");
  if (int err = SendAll(fd, request, deadline); err != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("send GET ", url, ": ", ErrnoText(err)));
  }

  std::string response;
  char buf[16384];
  while (true) {
    int ready = PollUntil(fd, POLLIN, deadline);
    if (ready == 0) {
      close(fd);
      return absl::UnavailableError(
          absl::StrCat("GET ", url, ": timed out after ", absl::FormatDuration(timeout)));
    }
    if (ready < 0) {
      int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat("GET ", url, ": poll: ", ErrnoText(err)));
    }
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      int err = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat("GET ", url, ": recv: ", ErrnoText(err)));
    }
    if (n == 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);

  // Status line, headers, body.
  size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat("GET ", url, ": connection closed before the end of the headers (",
                     response.size(), " bytes received)"));
  }
  absl::string_view head(response.data(), header_end);
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  std::vector<absl::string_view> status_parts = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  int status = 0;
  if (status_parts.size() < 2 || !absl::StartsWith(status_parts[0], "HTTP/") ||
      !absl::SimpleAtoi(status_parts[1], &status)) {
    return absl::InternalError(
        absl::StrCat("GET ", url, ": malformed status line '", lines[0], "'"));
  }
  std::string body = response.substr(header_end + 4);
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    absl::string_view name = absl::StripAsciiWhitespace(lines[i].substr(0, colon));
    if (!absl::EqualsIgnoreCase(name, "Content-Length")) continue;
    uint64_t length = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)), &length)) {
      return absl::InternalError(absl::StrCat("GET ", url, ": malformed header '", lines[i], "'"));
    }
    if (body.size() < length) {
      return absl::UnavailableError(absl::StrCat("GET ", url, ": body truncated: Content-Length ",
                                                 length, ", received ", body.size(), " bytes"));
    }
    body.resize(length);
  }
  if (status != 200) {
    std::string reason = status_parts.size() > 2 ? std::string(status_parts[2]) : "";
    return absl::InternalError(
        absl::StrCat("GET ", url, ": HTTP ", status, reason.empty() ? "" : " ", reason));
  }
  return body;
}

std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace strata
