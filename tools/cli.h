// The operator CLI `strata`: status, wait, validate, plan, doctor, checkpoint.
#ifndef STRATA_TOOLS_CLI_H_
#define STRATA_TOOLS_CLI_H_

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "proto/strata.pb.h"

namespace strata::tools {

// Runs `strata <args...>` (args excludes the program name), writing to
// out/err. Returns the process exit code: 0 ok, 1 failure (job failed,
// unreachable master), 2 usage or invalid input. `getenv` (main passes
// ::getenv) is the environment the CLI reads, and the only one: the object
// store's AWS_* keys when a config names no credentials file,
// STRATA_TLS_DIR, STRATA_TOKEN_FILE, HOME (for ~/.strata/tls) and
// STRATA_REMOTE_CMD; null means an empty environment.
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           const std::function<const char*(const char*)>& getenv = nullptr);

// The job's progress in one line, as `strata wait --progress` (and so
// scripts/launch.sh) shows it: epoch, step, tasks, samples/s, loss, the
// workers' training accuracy, the test accuracy once known, the
// communication share, and the time left at the pace so far.
std::string JobProgressLine(const proto::JobStatus& job);

}  // namespace strata::tools

#endif  // STRATA_TOOLS_CLI_H_
