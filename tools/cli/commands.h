// The `strata` commands, one function each (the table in cli.cc names
// them). Each returns its result for RunCli to print; see result.h.
#ifndef STRATA_TOOLS_CLI_COMMANDS_H_
#define STRATA_TOOLS_CLI_COMMANDS_H_

#include "tools/cli/common.h"
#include "tools/cli/result.h"

namespace strata::tools::cli {

// The cluster (commands_cluster.cc): they call the master.
CliResult Status(const Invocation& in);
CliResult Top(const Invocation& in);
CliResult Logs(const Invocation& in);
CliResult Drain(const Invocation& in);
CliResult Scale(const Invocation& in);  // (commands_scale.cc)
CliResult Stop(const Invocation& in);
CliResult Wait(const Invocation& in);

// Configs, host files and hosts (commands_config.cc).
CliResult Validate(const Invocation& in);
CliResult HostCheck(const Invocation& in);
CliResult Plan(const Invocation& in);
CliResult SecurityConfig(const Invocation& in);
CliResult PrometheusConfig(const Invocation& in);
CliResult Doctor(const Invocation& in);

// Checkpoints and the audit log (commands_checkpoint.cc). TakeCheckpoint
// calls the master; the others read files.
CliResult TakeCheckpoint(const Invocation& in);
CliResult ListCheckpoints(const Invocation& in);
CliResult ExportCheckpoint(const Invocation& in);
CliResult VerifyCheckpoint(const Invocation& in);
CliResult VerifyAudit(const Invocation& in);
// `strata audit` without its sub-command.
CliResult AuditUsage(const Invocation& in);

}  // namespace strata::tools::cli

#endif  // STRATA_TOOLS_CLI_COMMANDS_H_
