// Process plumbing shared by the daemons' main(): logging set-up and waiting
// for SIGTERM/SIGINT.
#ifndef STRATA_COMMON_DAEMON_H_
#define STRATA_COMMON_DAEMON_H_

#include <functional>

namespace strata {

// Initialises glog (stderr logging on unless --log_dir given) and the failure
// signal handler, and blocks SIGTERM/SIGINT/SIGPIPE in this and all threads
// created later, so that WaitForTerminationSignal() can take them.
// Call first thing in main(), before any thread starts.
void InitDaemon(const char* argv0);

// Waits until SIGTERM or SIGINT arrives, or `done()` returns true (polled
// every 100 ms; may be empty). Returns the signal number, or 0 when done().
int WaitForTerminationSignal(const std::function<bool()>& done = {});

}  // namespace strata

#endif  // STRATA_COMMON_DAEMON_H_
