// What the `strata` commands share: the invocation a command is handed,
// flag parsing, and the ways to the cluster (the master's gRPC, the
// daemons' HTTP) with this run's credentials.
#ifndef STRATA_TOOLS_CLI_COMMON_H_
#define STRATA_TOOLS_CLI_COMMON_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/http_client.h"
#include "grpcpp/grpcpp.h"
#include "proto/strata.pb.h"
#include "tools/cli/result.h"

namespace strata::tools::cli {

using Flags = std::map<std::string, std::string>;
using Getenv = std::function<const char*(const char*)>;

// How this run reaches the cluster: the credentials of its gRPC calls and
// of its HTTP requests to the daemons. Built once, by RunCli, for the
// commands that call the master (see ClusterAccessFromFlags); read-only
// after that, so the threads of one command may share it.
struct ClusterAccess {
  std::shared_ptr<grpc::ChannelCredentials> creds;  // null: plain text
  // Plain text for want of any credentials (not asked for): an unreachable
  // master then gets a hint.
  bool plaintext_by_default = false;
  // The same credentials for the daemons' HTTP endpoints; https when the
  // control plane is TLS (an mtls cluster serves HTTPS only).
  HttpClientOptions http;
  bool https = false;

  // `address`: one master's, or several comma-separated (a leader and its
  // standbys, docs/reliability.md): then the channel is the leader's
  // (Leader).
  std::shared_ptr<grpc::Channel> Channel(const std::string& address) const;
  // Of the masters in `masters` (comma-separated), the one that leads: the
  // first that answers, or the leader a standby names. A single address
  // is returned as it is, with no call; when none answers, the first.
  // `status`, when given, is set to the leader's status when the leader
  // answered the status call that found it (nothing to ask again).
  std::string Leader(const std::string& masters,
                     std::optional<proto::GetStatusResponse>* status = nullptr) const;
  // Every master of `masters` (comma-separated), each asked once, in
  // order, and what it is: "leads", "leads, paused ..." (a standby names it
  // but it refuses as one: its lease in etcd not renewed), "standby", or
  // why it did not answer. `status` is set to the leader's status when it
  // answered.
  struct MasterRole {
    std::string address;
    std::string role;
    std::string leader;  // a standby's: the leader it named ("": none)
  };
  std::vector<MasterRole> Masters(const std::string& masters,
                                  std::optional<proto::GetStatusResponse>* status) const;
  // One master's GetStatus, within 3 s (a standby answers NOT_LEADER).
  absl::Status AskStatus(const std::string& master, proto::GetStatusResponse* resp) const;
  // A call's status, naming `peer`.
  absl::Status FromCall(const grpc::Status& s, const std::string& peer) const;
  // The master's GetStatus, within 5 s.
  absl::StatusOr<proto::GetStatusResponse> FetchStatus(const std::string& master) const;
  // GET `url`: the body of a 200, else an error naming the URL.
  absl::StatusOr<std::string> HttpGet(const std::string& url, double timeout_seconds = 5) const;
  // The URL of `path` on the node's HTTP port.
  std::string NodeUrl(const proto::NodeInfo& n, const std::string& path) const;
};

// The credentials from --tls-dir / --token-file / --plaintext, then
// STRATA_TLS_DIR / STRATA_TOKEN_FILE, then ~/.strata/tls; plain text when
// there are none. InvalidArgument for flags that do not go together or a
// directory with nothing to authenticate with.
absl::StatusOr<ClusterAccess> ClusterAccessFromFlags(const Flags& f, const Getenv& env);

// One run of a command: what it was given. A command returns its result
// (RunCli prints it); `out` is for the progress it shows while it waits.
struct Invocation {
  const std::vector<std::string>& args;  // as RunCli got them
  const Flags& flags;
  const Getenv& getenv;  // never null
  // Set up for the commands that call the master only.
  const ClusterAccess& cluster;
  std::ostream& out;
  bool json = false;  // --json
};

// --key value / --key=value / --flag, from args[from] on.
absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args, size_t from);

// Whether `out` is this process's stdout and a terminal (progress is then
// redrawn in place).
bool IsTerminal(const std::ostream& out);

// The flag's value, or `def` when it is not given.
std::string FlagOr(const Flags& f, const std::string& key, const std::string& def);

// "alive", "DEAD", "finished", "drained".
const char* StateName(proto::NodeState s);

// "pserver-1".
std::string NodeName(const proto::NodeInfo& n);

// The newest instance of "role-index" ("worker-1", "master"), or of node id N.
const proto::NodeInfo* FindNode(const proto::GetStatusResponse& st, const std::string& name);

// `path` without its trailing slashes ("/" stays).
std::string WithoutTrailingSlashes(std::string path);

}  // namespace strata::tools::cli

#endif  // STRATA_TOOLS_CLI_COMMON_H_
