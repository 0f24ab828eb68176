// A small HTTP/1.1 server for /metrics, /healthz and /status, plus a blocking
// GET client used by the CLI and tests. One accept thread; each connection
// is served on that thread (requests are tiny and handlers fast), with a
// read timeout so a slow client cannot hold it for long. GET and HEAD only;
// "Connection: close" after each response.
#ifndef STRATA_COMMON_HTTP_SERVER_H_
#define STRATA_COMMON_HTTP_SERVER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace strata {

struct HttpRequest {
  std::string method;  // "GET"
  std::string path;    // "/status" (without the query)
  std::string query;   // "a=1&b=2" or ""
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

// Thread safety: Handle() before Start() only; Start/Shutdown from one thread.
class HttpServer {
 public:
  HttpServer() = default;
  ~HttpServer();  // calls Shutdown()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Registers a handler for an exact path. Unknown paths get 404.
  void Handle(const std::string& path, HttpHandler handler);

  // Binds host:port (port 0 picks a free port) and starts serving.
  // Errors: the bind/listen failure, naming the address.
  absl::Status Start(const std::string& host, int port);
  int port() const { return port_; }

  // Stops accepting, joins the thread. Idempotent.
  void Shutdown();

 private:
  void Serve();
  void ServeConnection(int fd);

  std::map<std::string, HttpHandler> handlers_;
  int listen_fd_ = -1;
  int port_ = 0;
  absl::Notification stop_;
  std::thread thread_;
};

// GET http://host:port/path; returns the body of a 200 response, or an error
// (Unavailable for connection errors, naming host:port; Internal with the
// status code for non-200 responses).
absl::StatusOr<std::string> HttpGet(const std::string& host, int port,
                                    const std::string& path,
                                    absl::Duration timeout = absl::Seconds(5));

}  // namespace strata

#endif  // STRATA_COMMON_HTTP_SERVER_H_
