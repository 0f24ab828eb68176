#include "tools/cli/common.h"

#include <unistd.h>

#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/error_reason.h"
#include "common/grpc_status.h"
#include "common/proto_names.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "proto/strata.grpc.pb.h"

namespace strata::tools::cli {

std::shared_ptr<grpc::Channel> ClusterAccess::Channel(const std::string& address) const {
  return grpc::CreateChannel(Leader(address), creds ? creds : grpc::InsecureChannelCredentials());
}

std::string ClusterAccess::Leader(const std::string& masters,
                                  std::optional<proto::GetStatusResponse>* status) const {
  const std::vector<std::string> list = absl::StrSplit(masters, ',', absl::SkipWhitespace());
  if (list.size() <= 1) return masters;
  for (const std::string& m : list) {
    proto::GetStatusResponse resp;
    const absl::Status s = AskStatus(m, &resp);
    if (HasReason(s, proto::REASON_NOT_LEADER)) {
      if (const std::string leader = LeaderOf(s); !leader.empty()) return leader;
      continue;
    }
    // (Any other answer, a refusal too, is the leader's: only it serves.)
    if (s.ok() && status != nullptr) *status = std::move(resp);
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) return m;
  }
  return list[0];
}

absl::Status ClusterAccess::AskStatus(const std::string& master,
                                      proto::GetStatusResponse* resp) const {
  auto stub = proto::Master::NewStub(
      grpc::CreateChannel(master, creds ? creds : grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  return FromGrpcStatus(stub->GetStatus(&ctx, proto::GetStatusRequest(), resp));
}

std::vector<ClusterAccess::MasterRole> ClusterAccess::Masters(
    const std::string& masters, std::optional<proto::GetStatusResponse>* status) const {
  std::vector<MasterRole> out;
  const std::vector<std::string> list = absl::StrSplit(masters, ',', absl::SkipWhitespace());
  for (const std::string& m : list) {
    proto::GetStatusResponse resp;
    const absl::Status s = AskStatus(m, &resp);
    std::string role, leader;
    if (HasReason(s, proto::REASON_NOT_LEADER)) {
      leader = LeaderOf(s);
      role = leader.empty() ? "standby (no leader known)" : "standby";
    } else if (s.ok()) {
      role = "leads";
      if (!status->has_value()) *status = std::move(resp);
    } else if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
      role = absl::StrCat("unreachable (", s.message(), ")");
    } else {
      role = "leads";  // (any other answer is the leader's: only it serves)
    }
    out.push_back({m, std::move(role), std::move(leader)});
  }
  // A leader paused (its lease in etcd not renewed) answers as a standby
  // that knows no leader; the standbys still name it.
  for (MasterRole& r : out) {
    if (r.role != "standby (no leader known)") continue;
    for (const MasterRole& other : out) {
      if (other.leader == r.address) {
        r.role = "leads, paused (its lease in etcd not renewed)";
        break;
      }
    }
  }
  return out;
}

absl::Status ClusterAccess::FromCall(const grpc::Status& s, const std::string& peer) const {
  absl::Status st = FromGrpcStatus(s, peer);
  // An mtls cluster refuses plain text at the TLS handshake.
  if (absl::IsUnavailable(st) && plaintext_by_default) {
    return absl::UnavailableError(absl::StrCat(
        st.message(),
        " (no credentials were found, so this was plain text: a cluster with "
        "security.mode mtls needs --tls-dir DIR or STRATA_TLS_DIR; docs/security.md)"));
  }
  return st;
}

absl::StatusOr<proto::GetStatusResponse> ClusterAccess::FetchStatus(
    const std::string& master) const {
  std::optional<proto::GetStatusResponse> answered;
  const std::string leader = Leader(master, &answered);
  if (answered.has_value()) return *std::move(answered);
  auto stub = proto::Master::NewStub(Channel(leader));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  proto::GetStatusResponse resp;
  absl::Status s =
      FromCall(stub->GetStatus(&ctx, proto::GetStatusRequest(), &resp), "master " + leader);
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<std::string> ClusterAccess::HttpGet(const std::string& url,
                                                   double timeout_seconds) const {
  HttpClientOptions o = http;
  o.timeout = absl::Seconds(timeout_seconds);
  STRATA_ASSIGN_OR_RETURN(HttpResult r, HttpFetch(url, o));
  if (r.status != 200) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": HTTP ", r.status, ": ", r.body));
  }
  return std::move(r.body);
}

std::string ClusterAccess::NodeUrl(const proto::NodeInfo& n, const std::string& path) const {
  const bool v6 = n.host().find(':') != std::string::npos;
  return absl::StrCat(https ? "https://" : "http://", v6 ? "[" : "", n.host(), v6 ? "]" : "", ":",
                      n.http_port(), path);
}

absl::StatusOr<ClusterAccess> ClusterAccessFromFlags(const Flags& f, const Getenv& env) {
  auto from = [&](const char* flag, const char* var) -> std::string {
    if (f.count(flag)) return f.at(flag);
    const char* v = env(var);
    return v != nullptr ? v : "";
  };
  ClusterAccess result;
  TlsOptions o;
  o.dir = from("tls-dir", "STRATA_TLS_DIR");
  o.token_file = from("token-file", "STRATA_TOKEN_FILE");
  if (f.count("plaintext")) {
    if (f.count("tls-dir") || f.count("token-file")) {
      return absl::InvalidArgumentError("--plaintext goes with neither --tls-dir nor --token-file");
    }
    return result;
  }
  if (o.dir.empty()) {
    const char* home = env("HOME");
    const std::string def = home != nullptr ? absl::StrCat(home, "/.strata/tls") : "";
    if (!def.empty() && access((def + "/ca.crt").c_str(), R_OK) == 0) o.dir = def;
  }
  if (o.dir.empty()) {
    if (!o.token_file.empty()) {
      return absl::InvalidArgumentError(
          "a token is sent only over TLS: give --tls-dir DIR with the cluster's ca.crt");
    }
    result.plaintext_by_default = true;
    return result;
  }
  // A client certificate when the directory has one, else the token alone.
  o.cert_name = access((o.dir + "/client.crt").c_str(), R_OK) == 0 ? "client" : "";
  if (o.cert_name.empty() && o.token_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.dir, " has no client.crt and no --token-file is given: nothing to authenticate with"));
  }
  STRATA_ASSIGN_OR_RETURN(ControlPlaneSecurity s, MakeControlPlaneSecurity(o));
  result.creds = s.client;
  result.https = true;
  result.http.ca_file = o.dir + "/ca.crt";
  if (!o.cert_name.empty()) {
    result.http.cert_file = o.dir + "/client.crt";
    result.http.key_file = o.dir + "/client.key";
  }
  if (!o.token_file.empty()) {
    // (MakeControlPlaneSecurity has checked the file's mode and content.)
    std::ifstream in(o.token_file);
    std::string token;
    in >> token;
    result.http.bearer_token = token;
  }
  return result;
}

absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args, size_t from) {
  Flags flags;
  for (size_t i = from; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
    }
    std::string key = a.substr(2), value = "true";
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (key != "json" && key != "stop" && key != "no-checkpoint" && key != "no-wait" &&
               key != "offline" && key != "remote-all" && key != "progress" &&
               key != "progress-only" && key != "redraw" && key != "plaintext" && key != "spare") {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("--", key, " needs a value"));
      }
      value = args[++i];
    }
    flags[key] = value;
  }
  return flags;
}

bool IsTerminal(const std::ostream& out) { return &out == &std::cout && isatty(STDOUT_FILENO); }

std::string FlagOr(const Flags& f, const std::string& key, const std::string& def) {
  auto it = f.find(key);
  return it == f.end() ? def : it->second;
}

const char* StateName(proto::NodeState s) {
  switch (s) {
    case proto::ALIVE:
      return "alive";
    case proto::DEAD:
      return "DEAD";
    case proto::FINISHED:
      return "finished";
    case proto::DRAINED:
      return "drained";
    case proto::JOINING:
      return "joining";
    default:
      return "?";
  }
}

std::string NodeName(const proto::NodeInfo& n) {
  return absl::StrCat(NodeRoleName(n.role()), "-", n.index());
}

const proto::NodeInfo* FindNode(const proto::GetStatusResponse& st, const std::string& name) {
  const proto::NodeInfo* found = nullptr;
  uint32_t id = 0;
  const bool by_id = absl::SimpleAtoi(name, &id);
  for (const auto& m : st.view().members()) {
    const bool match = by_id
                           ? m.id() == id
                           : NodeName(m) == name || (m.role() == proto::MASTER && name == "master");
    if (match && (found == nullptr || m.id() > found->id())) found = &m;
  }
  return found;
}

std::string WithoutTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace strata::tools::cli
