// A small HTTP/1.1 server for /metrics, /healthz and /status, plus a blocking
// GET client used by tests. One accept thread; each connection is served on
// that thread (requests are tiny and handlers fast), with a deadline on the
// TLS handshake and the request so a slow client cannot hold it for long.
// GET and HEAD only; "Connection: close" after each response.
//
// With EnableTls() it speaks HTTPS only (a plain-text request gets a 400
// saying so), asks the client for a certificate and hands it to the gate,
// which decides who may read what (docs/security.md, "HTTP endpoints").
#ifndef STRATA_COMMON_HTTP_SERVER_H_
#define STRATA_COMMON_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace strata {

struct HttpRequest {
  std::string method;           // "GET"
  std::string path;             // "/status" (without the query)
  std::string query;            // "a=1&b=2" or ""
  std::string peer;             // the client's "address:port"
  std::string authorization;    // the Authorization header's value, or ""
  std::string client_cert_pem;  // over TLS: the client's certificate, or ""
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;           // (a 401 gets "WWW-Authenticate: Bearer" added)
  std::string location = {};  // a redirect's Location header ("": none)
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;
// Runs before any handler: nullopt serves the request, a response refuses it.
using HttpGate = std::function<std::optional<HttpResponse>(const HttpRequest&)>;

// Thread safety: Handle(), SetGate() and EnableTls() before Start() only;
// Start/Shutdown from one thread.
class HttpServer {
 public:
  HttpServer();
  ~HttpServer();  // calls Shutdown()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Registers a handler for an exact path. Unknown paths get 404.
  void Handle(const std::string& path, HttpHandler handler);
  // Every request passes `gate` first (unknown paths too).
  void SetGate(HttpGate gate);
  // Serves HTTPS (TLS 1.2+) with the PEM certificate and key in these files,
  // read again when they change (checked at most once a second), so a
  // renewed certificate is served without a restart. Clients are asked for
  // a certificate of the CA in `ca_file` but not refused without one: the
  // gate sees it (HttpRequest::client_cert_pem) and decides. Errors name
  // the file that cannot be used.
  absl::Status EnableTls(const std::string& cert_file, const std::string& key_file,
                         const std::string& ca_file);
  bool tls() const { return tls_ != nullptr; }

  // Binds host:port (port 0 picks a free port) and starts serving.
  // Errors: the bind/listen failure, naming the address.
  absl::Status Start(const std::string& host, int port);
  int port() const { return port_; }

  // Stops accepting, joins the thread. Idempotent.
  void Shutdown();

 private:
  struct Tls;  // the OpenSSL context and its files (http_server.cc)
  class Conn;  // one connection, plain or TLS

  void Serve();
  void ServeConnection(Conn& conn, const std::string& peer);

  std::map<std::string, HttpHandler> handlers_;
  HttpGate gate_;
  std::unique_ptr<Tls> tls_;
  int listen_fd_ = -1;
  int port_ = 0;
  absl::Notification stop_;
  std::thread thread_;
};

// "host:port", an IPv6 literal bracketed ("[fd00::1]:7071").
std::string HostPort(const std::string& host, int port);

// GET http://host:port/path; returns the body of a 200 response, or an error
// (Unavailable for connection errors, naming host:port; Internal with the
// status code for non-200 responses).
absl::StatusOr<std::string> HttpGet(const std::string& host, int port, const std::string& path,
                                    absl::Duration timeout = absl::Seconds(5));

}  // namespace strata

#endif  // STRATA_COMMON_HTTP_SERVER_H_
