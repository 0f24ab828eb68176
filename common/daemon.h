// Process plumbing shared by the daemons' main(): logging set-up and waiting
// for SIGTERM/SIGINT.
#ifndef STRATA_COMMON_DAEMON_H_
#define STRATA_COMMON_DAEMON_H_

#include <functional>
#include <string>
#include <vector>

namespace strata {

// Initialises glog (stderr logging on unless --log_dir given) and the failure
// signal handler, and blocks SIGTERM/SIGINT/SIGPIPE in this and all threads
// created later, so that WaitForTerminationSignal() can take them.
// Call first thing in main(), before any thread starts.
void InitDaemon(const char* argv0);

// The last `n` lines this process logged (at most kRecentLogLines are
// kept from InitDaemon on), oldest first: what a daemon's /logs serves.
inline constexpr int kRecentLogLines = 5000;
std::vector<std::string> RecentLogLines(int n);
// "/logs?lines=N" (default 200): the recent lines as text.
struct HttpRequest;
struct HttpResponse;
HttpResponse LogsPage(const HttpRequest& request);

// The endpoints every daemon serves (docs/operations.md, "HTTP endpoints"):
// /metrics (`metrics` in Prometheus' text format), /healthz ("ok"), /logs
// (LogsPage) and /status (what `status` returns, JSON). `metrics` is
// borrowed and must outlive `http`'s serving. Before http->Start().
class HttpServer;
class MetricsRegistry;
void ServeStandardEndpoints(HttpServer* http, const MetricsRegistry* metrics,
                            std::function<HttpResponse()> status);

// Waits until SIGTERM or SIGINT arrives, or `done()` returns true (polled
// every 100 ms; may be empty). Returns the signal number, or 0 when done().
int WaitForTerminationSignal(const std::function<bool()>& done = {});

}  // namespace strata

#endif  // STRATA_COMMON_DAEMON_H_
