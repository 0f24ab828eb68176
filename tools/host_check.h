// The per-host checks of `strata validate --hosts` (docs/operations.md):
// before anything starts, each host of the plan must be reachable, the
// ports its daemons will listen on must be free there, and, for the rdma
// transport, it must pass the RDMA preflight of `strata doctor`. A local
// host is checked in this process; a remote one by running
// `strata host-check` there through the remote command (ssh), as
// scripts/launch.sh reaches it.
#ifndef STRATA_TOOLS_HOST_CHECK_H_
#define STRATA_TOOLS_HOST_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/rdma/rdma_device.h"

namespace strata::tools {

struct HostCheckRequest {
  std::string host;        // the address the daemons bind
  std::vector<int> ports;  // every port a daemon of the plan listens on there
  bool rdma = false;       // run the RDMA preflight too
  transport::rdma::RdmaSettings rdma_settings;
  uint64_t register_bytes = 0;  // what a process registers with the NIC
};

// The checks, run on the host itself: one finding per port ("port 7000":
// free, or in use / not an address of this host) and the RDMA preflight's
// findings when asked.
transport::rdma::PreflightReport CheckThisHost(const HostCheckRequest& req);

// The arguments of `strata host-check` that make the same request.
std::vector<std::string> HostCheckArgs(const HostCheckRequest& req);
// Parses them back (the flags of `strata host-check`); errors name the flag.
absl::StatusOr<HostCheckRequest> ParseHostCheckArgs(const std::vector<std::string>& args);

// What launch.sh runs locally: localhost, 127.x.x.x, ::1.
bool IsLocalHost(const std::string& host);

struct CommandResult {
  int exit_code = -1;  // -1: it could not start or was killed at the timeout
  bool timed_out = false;
  std::string output;  // stdout and stderr together
};
// Runs argv (no shell) with stdin from /dev/null, killing it after `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv, absl::Duration timeout);

// The shell-quoted form of `s` ('...' with embedded quotes escaped).
std::string ShellQuote(const std::string& s);

}  // namespace strata::tools

#endif  // STRATA_TOOLS_HOST_CHECK_H_
