#include "common/daemon.h"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <deque>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/vector_ops.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

namespace strata {
namespace {

// Keeps the last kRecentLogLines log lines in memory.
class LogRing : public google::LogSink {
 public:
  void send(google::LogSeverity severity, const char* /*full_filename*/, const char* base_filename,
            int line, const google::LogMessageTime& time, const char* message,
            size_t message_len) override {
    std::string text = ToString(severity, base_filename, line, time, message, message_len);
    absl::MutexLock l(&mu_);
    lines_.push_back(std::move(text));
    if (lines_.size() > static_cast<size_t>(kRecentLogLines)) lines_.pop_front();
  }
  std::vector<std::string> Last(int n) {
    absl::MutexLock l(&mu_);
    const size_t k = std::min(lines_.size(), static_cast<size_t>(std::max(n, 0)));
    return std::vector<std::string>(lines_.end() - k, lines_.end());
  }

 private:
  absl::Mutex mu_;
  std::deque<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

LogRing* Ring() {
  static LogRing* ring = new LogRing;  // lives as long as the process
  return ring;
}

}  // namespace

std::vector<std::string> RecentLogLines(int n) { return Ring()->Last(n); }

HttpResponse LogsPage(const HttpRequest& request) {
  int n = 200;
  for (absl::string_view kv : absl::StrSplit(request.query, '&')) {
    if (absl::ConsumePrefix(&kv, "lines=") && (!absl::SimpleAtoi(kv, &n) || n < 0)) {
      return HttpResponse{400, "text/plain; charset=utf-8",
                          "lines must be a number of lines >= 0\n"};
    }
  }
  std::string body = absl::StrJoin(RecentLogLines(n), "\n");
  if (!body.empty()) body += "\n";
  return HttpResponse{200, "text/plain; charset=utf-8", std::move(body)};
}

void ServeStandardEndpoints(HttpServer* http, const MetricsRegistry* metrics,
                            std::function<HttpResponse()> status) {
  http->Handle("/metrics", [metrics](const HttpRequest&) {
    return HttpResponse{200, "text/plain; version=0.0.4", metrics->RenderPrometheus()};
  });
  http->Handle("/logs", LogsPage);  // this process's recent log lines
  http->Handle("/healthz", [](const HttpRequest&) {
    return HttpResponse{200, "text/plain", "ok\n"};
  });
  http->Handle("/status", [status = std::move(status)](const HttpRequest&) { return status(); });
}

void InitDaemon(const char* argv0) {
  FlushDenormalsToZero();  // before any thread: they inherit it
  if (FLAGS_log_dir.empty()) FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv0);
  google::InstallFailureSignalHandler();
  google::AddLogSink(Ring());
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal(const std::function<bool()>& done) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  while (true) {
    timespec ts{0, 100 * 1000 * 1000};
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGTERM || sig == SIGINT) return sig;
    if (done && done()) return 0;
  }
}

}  // namespace strata
