#include "common/daemon.h"

#include <signal.h>
#include <time.h>

#include "gflags/gflags.h"
#include "glog/logging.h"

namespace strata {

void InitDaemon(const char* argv0) {
  if (FLAGS_log_dir.empty()) FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv0);
  google::InstallFailureSignalHandler();
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
