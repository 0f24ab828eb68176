// RunCli: the table of `strata` commands, the usage made from it, and the
// dispatch. The commands themselves are in commands_*.cc.
#include "tools/cli.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tools/cli/commands.h"
#include "tools/cli/common.h"

namespace strata::tools {
namespace {

using cli::CliResult;
using cli::Invocation;

// One command of the table.
struct Command {
  // "status", or a command and its sub-command ("checkpoint list").
  const char* name;
  // Its usage: the flags, then what it does; lines after the first are
  // indented to the usage's second column. Empty: left out of the usage
  // (a command that only says how to call its sub-commands).
  const char* help;
  CliResult (*run)(const Invocation&);
  // It calls the master, so it needs the credentials.
  bool calls_master = false;
  // It takes a node (`logs NODE`) before its flags.
  bool takes_node = false;
};

// In the order of the usage.
const std::vector<Command>& Commands() {
  static const auto* const kCommands = new std::vector<Command>{
      {"status", "--master HOST:PORT [--json]   cluster view and job progress\n", cli::Status,
       true},
      {"top",
       "--master HOST:PORT [--interval 2] [--iterations N] [--json]\n"
       "           live per node: steps/s, samples/s, push and pull GB/s, comm share,\n"
       "           memory (refreshing; N frames then exit, 0 = until interrupted)\n",
       cli::Top, true},
      {"logs",
       "NODE --master HOST:PORT [--lines 200] [--json]   a node's recent log lines\n"
       "           (NODE: master, pserver-I, worker-I or a node id)\n",
       cli::Logs, true, true},
      {"drain",
       "NODE --master HOST:PORT [--no-wait] [--timeout 600] [--reason TEXT] [--json]\n"
       "           take a node out of the running job and wait until it has left: a\n"
       "           worker finishes its data task; a pserver's partitions go to their\n"
       "           backups (refused when that would lose parameters)\n",
       cli::Drain, true, true},
      {"scale",
       "--master HOST:PORT [--workers N|+k|-k] [--pservers N|+k|-k]\n"
       "           [--autoscale on|off] [--no-wait] [--timeout 600] [--reason TEXT] [--json]\n"
       "           take the running job to N workers: new ones are started by the\n"
       "           provider (launch.sh's, or elastic.provider) on hosts with room\n"
       "           (worker=1..4) and join at a step boundary; removed ones drain.\n"
       "           Waits until the scale is done (exit 1: given up). --autoscale:\n"
       "           the master's autoscaler (elastic.autoscale) on or off\n",
       cli::Scale, true},
      {"stop",
       "--master HOST:PORT [--no-checkpoint] [--reason TEXT] [--json]\n"
       "           stop the job, after a checkpoint when checkpoints are on\n",
       cli::Stop, true},
      {"wait",
       "--master HOST:PORT [--timeout SECONDS] [--until running|end] [--progress]\n"
       "           [--progress-only] [--every SECONDS] [--redraw] [--json]\n"
       "           wait for the job to end; exit 0 if it succeeded. --progress shows the\n"
       "           job's progress line every few seconds (--redraw: in place, on a\n"
       "           terminal); --progress-only shows only that, not the end\n",
       cli::Wait, true},
      {"validate",
       "--config FILE [--hosts FILE] [--offline] [--remote-cmd CMD] [--json]\n"
       "           [--remote-all] [--strata-path PATH]\n"
       "           check a config and a host file before a launch: the files, no two\n"
       "           daemons of a host on one port, and (unless --offline) every host:\n"
       "           reached as launch.sh reaches it (CMD HOST 'command', default ssh),\n"
       "           its ports free, the RDMA preflight for the rdma transport\n",
       cli::Validate},
      {"host-check",
       "--bind HOST --ports P,... [--rdma true ...] [--json]   one host's checks,\n"
       "           run on that host (by validate)\n",
       cli::HostCheck},
      {"plan",
       "--config FILE --hosts FILE [--spare] [--json]   the daemons a launch starts,\n"
       "           one a line: role index host port data_port http_port  (- where\n"
       "           unused); --spare: the host file's room to scale instead\n",
       cli::Plan},
      {"security-config",
       "--config FILE [--json]   the config's security section: mode,\n"
       "           tls_dir, token_file (for scripts)\n",
       cli::SecurityConfig},
      {"prometheus-config",
       "--config FILE --hosts FILE [--interval 5s] [--tls-dir DIR] [--json]\n"
       "           a Prometheus configuration scraping every daemon's /metrics; for\n"
       "           an mtls config over https with the viewer certificate in DIR\n"
       "           (ca.crt, client.crt, client.key; default /etc/prometheus/strata-tls:\n"
       "           gen-certs.sh user --name prometheus --role viewer)\n",
       cli::PrometheusConfig},
      {"doctor",
       "[--config FILE] [--hosts FILE] [--json]  RDMA preflight of this host: devices,\n"
       "           ports, GIDs, MTU, locked-memory limit against what the job\n"
       "           registers; exit 0 when ready\n",
       cli::Doctor},
      {"checkpoint",
       "--master HOST:PORT [--stop] [--timeout SECONDS] [--json]\n"
       "           take a checkpoint now and wait for it (--stop: then stop the job)\n",
       cli::TakeCheckpoint, true},
      {"checkpoint list",
       "--dir DIR [--json]     the checkpoints under a checkpoint root\n"
       "           (list, export and verify take --config FILE for an s3:// DIR: its\n"
       "           s3 section names the store; keys from its credentials_file or AWS_*)\n",
       cli::ListCheckpoints},
      {"checkpoint export",
       "--dir DIR --out DIR2 --precision bf16|fp16 [--json]\n"
       "           an inference export: the parameters only, 16 bits each\n",
       cli::ExportCheckpoint},
      {"audit verify",
       "--file FILE [--json]   check the master's audit log: every record\n"
       "           chained to the one before (an edit, deletion or reordering is\n"
       "           named by its line); prints the head to compare with the master's\n",
       cli::VerifyAudit},
      {"checkpoint verify",
       "--dir DIR [--json]   read a checkpoint whole and check every\n"
       "           checksum; exit 0 when it is complete and intact; prints a digest\n"
       "           of the state it restores (equal for equal models)\n",
       cli::VerifyCheckpoint},
      {"audit", "", cli::AuditUsage},
  };
  return *kCommands;
}

// A command's lines of the usage: "  NAME     help".
std::string CommandUsage(const Command& c) { return absl::StrFormat("  %-8s %s", c.name, c.help); }

std::string Usage() {
  std::string usage =
      "usage: strata <command> [flags]\n"
      "credentials (the commands that call the master; docs/security.md):\n"
      "  --tls-dir DIR      ca.crt, client.crt, client.key (gen-certs.sh user); default\n"
      "                     $STRATA_TLS_DIR, else ~/.strata/tls when it exists\n"
      "  --token-file FILE  a bearer token instead of a client certificate (needs\n"
      "                     DIR/ca.crt); default $STRATA_TOKEN_FILE\n"
      "  --plaintext        no TLS: for a cluster whose config says security.mode:\n"
      "                     plaintext (also the default when no DIR exists)\n"
      "commands:\n";
  for (const Command& c : Commands()) {
    if (*c.help != '\0') usage += CommandUsage(c);
  }
  return usage;
}

// `strata COMMAND --help`: the lines of every form of COMMAND (all of
// "checkpoint ..." for checkpoint); 2 for an unknown one.
int CommandHelp(const std::string& command, std::ostream& out, std::ostream& err) {
  std::string help;
  for (const Command& c : Commands()) {
    const std::string name = c.name;
    if (*c.help != '\0' && (name == command || absl::StartsWith(name, command + " "))) {
      help += CommandUsage(c);
    }
  }
  if (help.empty()) {
    err << "strata: unknown command '" << command << "'\n" << Usage();
    return 2;
  }
  out << "usage: strata " << command << " [flags]\n" << help;
  return 0;
}

// The command args name ("checkpoint list" before "checkpoint"), or null.
const Command* FindCommand(const std::vector<std::string>& args) {
  const Command* found = nullptr;
  for (const Command& c : Commands()) {
    const std::string name = c.name;
    if (args.size() > 1 && name == args[0] + " " + args[1]) return &c;
    if (name == args[0]) found = &c;
  }
  return found;
}

}  // namespace

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           const std::function<const char*(const char*)>& getenv) {
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? err : out) << Usage();
    return args.empty() ? 2 : 0;
  }
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") return CommandHelp(args[0], out, err);
  }
  const Command* command = FindCommand(args);
  // Where the flags start: after a sub-command, or after the node of
  // `logs NODE` and `drain NODE`.
  size_t from = 1;
  if (command != nullptr && absl::StrContains(command->name, ' ')) {
    from = 2;
  } else if (command != nullptr && command->takes_node && args.size() > 1 &&
             args[1].rfind("--", 0) != 0) {
    from = 2;
  }
  auto flags = cli::ParseFlags(args, from);
  if (!flags.ok()) {
    err << "strata " << args[0] << ": " << flags.status().message() << "\n" << Usage();
    return 2;
  }
  if (command == nullptr) {
    err << "strata: unknown command '" << args[0] << "'\n" << Usage();
    return 2;
  }
  const cli::Getenv env = getenv ? getenv : [](const char*) -> const char* { return nullptr; };
  cli::ClusterAccess cluster;
  if (command->calls_master) {
    auto access = cli::ClusterAccessFromFlags(*flags, env);
    if (!access.ok()) {
      err << "strata " << args[0] << ": " << access.status().message() << "\n";
      return 2;
    }
    cluster = *std::move(access);
  }
  const bool json = flags->count("json") > 0;
  const Invocation in{args, *flags, env, cluster, out, json};
  return cli::PrintResult(command->run(in), json, out, err);
}

}  // namespace strata::tools
