// strata validate, host-check, plan, security-config, prometheus-config,
// doctor: the commands about configs, host files and hosts, before and
// around a launch.
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config.h"
#include "common/host_file.h"
#include "common/model_spec.h"
#include "common/proto_names.h"
#include "common/status_macros.h"
#include "common/threads.h"
#include "storage/file_system.h"
#include "storage/idx_reader.h"
#include "storage/s3_file_system.h"
#include "tools/cli/commands.h"
#include "tools/host_check.h"
#include "transport/rdma/rdma_device.h"

namespace strata::tools::cli {
namespace {

// What a process of this job registers with the NIC: a worker its
// parameter and gradient tensors (a pserver at most one copy of the model
// plus its state, so this bounds both roles), plus each connection's send
// and receive slots, (recv_slots + 4 + send_slots) * slot_kib, for every
// peer: the larger of the pserver and worker counts of --hosts, or 16.
constexpr int kDefaultRdmaPeers = 16;

// Tables a training script declares (no model.tables) are not known here
// and not counted: a worker whose registration then fails sends and
// receives through copies, with a warning in its log.
uint64_t RegisterBytes(const JobConfig* cfg, int peers) {
  const RdmaSection rdma = cfg ? cfg->cluster.rdma : RdmaSection();
  uint64_t tensors = 0;
  if (cfg != nullptr) {
    uint64_t params = 0;
    for (const auto& t : ModelTables(cfg->model)) params += t.num_elements();
    tensors = 2 * params * sizeof(float);
  }
  const uint64_t per_connection =
      uint64_t(rdma.recv_slots + 4 + rdma.send_slots) * (uint64_t(rdma.slot_kib) << 10);
  return tensors + per_connection * uint64_t(std::max(peers, 1));
}

// The report's "ok" and "findings": [{"ok", "check", "detail", "fix"}...],
// added to `into`.
JsonValue FindingsJson(const transport::rdma::PreflightReport& r,
                       JsonValue into = JsonValue::Object()) {
  JsonValue findings = JsonValue::Array();
  for (const auto& x : r.findings) {
    findings.Append(JsonValue::Object()
                        .Set("ok", JsonValue::Bool(x.ok))
                        .Set("check", JsonValue::String(x.check))
                        .Set("detail", JsonValue::String(x.detail))
                        .Set("fix", JsonValue::String(x.fix)));
  }
  into.Set("ok", JsonValue::Bool(r.ok())).Set("findings", std::move(findings));
  return into;
}

// A preflight report as a result: exit 0 when it passed.
CliResult PreflightResult(const transport::rdma::PreflightReport& r, JsonValue json,
                          std::string text) {
  CliResult result = TextResult(std::move(text), r.ok() ? 0 : 1);
  result.data = FindingsJson(r, std::move(json));
  return result;
}

// The daemons a launch starts from a config and a host file.
struct PlannedDaemon {
  std::string role;
  int index = 0;
  std::string host;
  int port = -1;       // gRPC (-1: none)
  int data_port = -1;  // data plane (-1: none)
  int http_port = -1;
  bool spare = false;  // room to scale (a host file range), not started with the job
};

struct LaunchPlan {
  JobConfig config;
  HostFile hosts;
  std::vector<PlannedDaemon> daemons;
};

// Loads --config and --hosts and lists the daemons. The error is the
// message to show.
absl::StatusOr<LaunchPlan> LoadPlan(const Flags& f, const char* command) {
  if (!f.count("config") || !f.count("hosts")) {
    return absl::InvalidArgumentError(
        absl::StrCat("strata ", command, ": --config FILE and --hosts FILE are required"));
  }
  LaunchPlan plan;
  STRATA_ASSIGN_OR_RETURN(plan.config, LoadJobConfig(f.at("config")));
  STRATA_ASSIGN_OR_RETURN(plan.hosts, LoadHostFile(f.at("hosts")));
  if (absl::Status s =
          CheckClusterSize(plan.config, plan.hosts.total_pservers(), plan.hosts.total_workers());
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(s.message(), " (", f.at("hosts"), ")"));
  }
  if (absl::Status s = CheckMasterHosts(plan.hosts, !plan.config.cluster.etcd.endpoints.empty());
      !s.ok()) {
    return s;
  }
  const auto& p = plan.config.cluster.ports;
  std::vector<PlannedDaemon>& d = plan.daemons;
  // The masters: the first leads at start, the others are standbys.
  int m = 0;
  for (const HostEntry& h : plan.hosts.master_hosts()) {
    d.push_back({"master", m++, h.host, p.master, -1, p.master_http});
  }
  for (const HostSlot& s : plan.hosts.Slots()) {
    const int i = s.index;
    if (s.role == "pserver") {
      d.push_back(
          {s.role, i, s.host, p.pserver + i, p.pserver_data + i, p.pserver_http + i, !s.initial});
    } else {
      d.push_back({s.role, i, s.host, -1, -1, p.worker_http + i, !s.initial});
    }
  }
  return plan;
}

// "host:port", with an IPv6 host in brackets.
std::string HostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return absl::StrCat(v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
}

}  // namespace

CliResult Doctor(const Invocation& in) {
  const Flags& f = in.flags;
  std::optional<JobConfig> cfg;
  if (f.count("config")) {
    auto c = LoadJobConfig(f.at("config"));
    if (!c.ok()) return Failure(2, std::string(c.status().message()));
    cfg = std::move(*c);
  }
  const RdmaSection rdma = cfg ? cfg->cluster.rdma : RdmaSection();
  transport::rdma::RdmaSettings settings;
  settings.device = rdma.device;
  settings.port = rdma.port;
  settings.gid_index = rdma.gid_index;
  int peers = kDefaultRdmaPeers;
  if (f.count("hosts")) {
    auto hosts = LoadHostFile(f.at("hosts"));
    if (!hosts.ok()) return Failure(2, std::string(hosts.status().message()));
    peers = std::max(hosts->total_pservers(), hosts->total_workers());
  }
  auto devices = transport::rdma::ListRdmaDevices();
  if (!devices.ok()) {
    return Failure(1, absl::StrCat("strata doctor: ", devices.status().message()));
  }
  const transport::rdma::PreflightReport report =
      transport::rdma::RdmaPreflight(*devices, settings, transport::rdma::MemlockLimitBytes(),
                                     RegisterBytes(cfg ? &*cfg : nullptr, peers));
  return PreflightResult(report,
                         JsonValue::Object().Set("devices", JsonValue::Int(devices->size())),
                         transport::rdma::FormatRdmaDoctorReport(*devices, report));
}

CliResult Plan(const Invocation& in) {
  auto plan = LoadPlan(in.flags, "plan");
  if (!plan.ok()) return Failure(2, std::string(plan.status().message()));
  // Without --spare the daemons started with the job; with it the room to
  // scale (launch.sh starts those on `strata scale`).
  const bool spare = in.flags.count("spare") > 0;
  std::vector<PlannedDaemon> daemons;
  for (PlannedDaemon& d : plan->daemons) {
    if (d.spare == spare) daemons.push_back(std::move(d));
  }
  JsonValue rows = JsonValue::Array(",\n ");
  for (const PlannedDaemon& d : daemons) {
    rows.Append(JsonValue::Object()
                    .Set("role", JsonValue::String(d.role))
                    .Set("index", JsonValue::Int(d.index))
                    .Set("host", JsonValue::String(d.host))
                    .Set("port", JsonValue::Int(d.port))
                    .Set("data_port", JsonValue::Int(d.data_port))
                    .Set("http_port", JsonValue::Int(d.http_port)));
  }
  CliResult r;
  r.data = std::move(rows);
  r.text = [daemons = std::move(daemons)] {
    auto port = [](int p) { return p < 0 ? std::string("-") : std::to_string(p); };
    std::string s;
    for (const PlannedDaemon& d : daemons) {
      absl::StrAppend(&s, d.role, " ", d.index, " ", d.host, " ", port(d.port), " ",
                      port(d.data_port), " ", port(d.http_port), "\n");
    }
    return s;
  };
  return r;
}

// strata security-config --config FILE: the config's security section, for
// scripts (launch.sh): "mode M", "tls_dir D", "token_file F" (- for none).
CliResult SecurityConfig(const Invocation& in) {
  if (!in.flags.count("config")) {
    return Failure(2, "strata security-config: --config FILE is required");
  }
  auto config = LoadJobConfig(in.flags.at("config"));
  if (!config.ok()) {
    return Failure(2, absl::StrCat("strata security-config: ", config.status().message()));
  }
  const SecuritySection s = config->security;
  CliResult r = TextResult(absl::StrCat("mode ", s.mode, "\ntls_dir ", s.tls_dir, "\ntoken_file ",
                                        s.token_file.empty() ? "-" : s.token_file, "\n"));
  r.data = JsonValue::Object()
               .Set("mode", JsonValue::String(s.mode))
               .Set("tls_dir", JsonValue::String(s.tls_dir))
               .Set("token_file", JsonValue::String(s.token_file));
  return r;
}

// strata host-check: the checks of one host, run on it (by validate).
CliResult HostCheck(const Invocation& in) {
  std::vector<std::string> rest;
  for (const std::string& a : in.args) {
    if (a != "--json") rest.push_back(a);
  }
  auto req = ParseHostCheckArgs(rest);
  if (!req.ok()) return Failure(2, absl::StrCat("strata host-check: ", req.status().message()));
  const transport::rdma::PreflightReport r = CheckThisHost(*req);
  return PreflightResult(r, JsonValue::Object(), r.ToString());
}

namespace {

std::string PrometheusText(const LaunchPlan& plan, const Flags& f, const std::string& interval,
                           const std::string& tls, bool https) {
  const std::string& job = plan.config.job.name;
  std::ostringstream out;
  out << "# Prometheus configuration for Strata job '" << job << "', from " << f.at("config")
      << " and " << f.at("hosts") << "\n"
      << "# (strata prometheus-config). Every daemon's /metrics, labelled by role and index.\n"
      << "global:\n"
      << "  scrape_interval: " << interval << "\n"
      << "  evaluation_interval: " << interval << "\n"
      << "scrape_configs:\n"
      << "  - job_name: strata\n"
      << "    metrics_path: /metrics\n";
  if (https) {
    out << "    scheme: https  # security.mode mtls: Prometheus is a viewer\n"
        << "    tls_config:\n"
        << "      ca_file: " << tls << "/ca.crt\n"
        << "      cert_file: " << tls << "/client.crt\n"
        << "      key_file: " << tls << "/client.key\n";
  }
  out << "    static_configs:\n";
  for (const PlannedDaemon& d : plan.daemons) {
    if (d.http_port <= 0) continue;  // no fixed HTTP port: nothing to scrape
    out << "      - targets: ['" << HostPort(d.host, d.http_port) << "']\n"
        << "        labels: {strata_job: '" << job << "', role: " << d.role << ", index: '"
        << d.index << "'}\n";
  }
  return out.str();
}

// The same configuration as JSON (which Prometheus reads as YAML).
JsonValue PrometheusJson(const LaunchPlan& plan, const std::string& interval,
                         const std::string& tls, bool https) {
  JsonValue groups = JsonValue::Array(",\n    ");
  for (const PlannedDaemon& d : plan.daemons) {
    if (d.http_port <= 0) continue;
    groups.Append(JsonValue::Object()
                      .Set("targets", JsonValue::Array().Append(
                                          JsonValue::String(HostPort(d.host, d.http_port))))
                      .Set("labels", JsonValue::Object()
                                         .Set("strata_job", JsonValue::String(plan.config.job.name))
                                         .Set("role", JsonValue::String(d.role))
                                         .Set("index", JsonValue::String(absl::StrCat(d.index)))));
  }
  JsonValue scrape = JsonValue::Object()
                         .Set("job_name", JsonValue::String("strata"))
                         .Set("metrics_path", JsonValue::String("/metrics"));
  if (https) {
    scrape.Set("scheme", JsonValue::String("https"))
        .Set("tls_config", JsonValue::Object()
                               .Set("ca_file", JsonValue::String(tls + "/ca.crt"))
                               .Set("cert_file", JsonValue::String(tls + "/client.crt"))
                               .Set("key_file", JsonValue::String(tls + "/client.key")));
  }
  scrape.Set("static_configs", std::move(groups));
  return JsonValue::Object(",\n ")
      .Set("global", JsonValue::Object()
                         .Set("scrape_interval", JsonValue::String(interval))
                         .Set("evaluation_interval", JsonValue::String(interval)))
      .Set("scrape_configs", JsonValue::Array().Append(std::move(scrape)));
}

}  // namespace

// A Prometheus configuration that scrapes every daemon of the plan.
CliResult PrometheusConfig(const Invocation& in) {
  const Flags& f = in.flags;
  auto plan = LoadPlan(f, "prometheus-config");
  if (!plan.ok()) return Failure(2, std::string(plan.status().message()));
  const std::string interval = FlagOr(f, "interval", "5s");
  if (interval.empty() || interval.find_first_not_of("0123456789") == 0 ||
      interval.find_first_not_of("0123456789smh") != std::string::npos) {
    return Failure(2, absl::StrCat("strata prometheus-config: --interval ", interval,
                                   ": expected a Prometheus duration such as 5s or 1m"));
  }
  // An mtls cluster serves HTTPS only, to people's roles: Prometheus
  // scrapes as a viewer (docs/security.md).
  const bool https = plan->config.security.mode != "plaintext";
  const std::string tls = FlagOr(f, "tls-dir", "/etc/prometheus/strata-tls");
  CliResult r = TextResult(PrometheusText(*plan, f, interval, tls, https));
  r.data = PrometheusJson(*plan, interval, tls, https);
  return r;
}

namespace {

// The remote command of scripts/launch.sh, split into words as bash splits
// an unquoted $REMOTE_CMD.
std::vector<std::string> RemoteCommand(const Flags& f, const Getenv& getenv) {
  std::string cmd = "ssh -o BatchMode=yes -o ConnectTimeout=5";
  if (const char* env = getenv("STRATA_REMOTE_CMD"); env != nullptr && *env) cmd = env;
  if (f.count("remote-cmd")) cmd = f.at("remote-cmd");
  return absl::StrSplit(cmd, absl::ByAnyChar(" \t"), absl::SkipEmpty());
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "strata";
}

// The model against its data (an mlp's first layer against the images'
// pixels, the test set's against the training set's, the labels' count
// against the images'), from the IDX headers alone: an error names the
// config file, the field and the data file. Files this host does not have
// (the data is on the workers' hosts) are left out, saying so in *note.
absl::Status CheckModelAgainstData(const JobConfig& cfg, const std::string& config_path,
                                   storage::FileSystem* fs, std::string* note) {
  if (cfg.model.type != "mlp" || cfg.data.format != "idx") {
    *note = "not checked (only an mlp over IDX files is checked against its data)";
    return absl::OkStatus();
  }
  const DataSection& d = cfg.data;
  std::vector<std::string> missing;
  auto shape = [&](const std::string& path) -> absl::StatusOr<std::vector<uint32_t>> {
    if (!fs->Exists(path)) {
      missing.push_back(path);
      return std::vector<uint32_t>();
    }
    return storage::ReadIdxShape(fs, path);
  };
  const int first = cfg.model.layers.front();
  int64_t checked = 0;
  for (const auto& [images, labels, field] :
       {std::tuple{d.train_images, d.train_labels, "data.train_images"},
        std::tuple{d.test_images, d.test_labels, "data.test_images"}}) {
    STRATA_ASSIGN_OR_RETURN(std::vector<uint32_t> is, shape(images));
    STRATA_ASSIGN_OR_RETURN(std::vector<uint32_t> ls, shape(labels));
    if (!is.empty()) {
      int64_t features = 1;
      for (size_t i = 1; i < is.size(); ++i) features *= is[i];
      if (features != first) {
        return absl::InvalidArgumentError(absl::StrCat(
            config_path, ": model.layers[0] is ", first, " but ", field, " (", images, ") has ",
            features, " features per example (", absl::StrJoin(is.begin() + 1, is.end(), " x "),
            "): the first layer must take the pixels of one image"));
      }
      ++checked;
    }
    if (!is.empty() && !ls.empty() && is[0] != ls[0]) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", field, " (", images,
                                                     ") has ", is[0], " images but its labels (",
                                                     labels, ") ", ls[0]));
    }
  }
  *note = absl::StrCat(
      checked == 2   ? "ok"
      : checked == 1 ? "partly checked"
                     : "not checked",
      " (model.layers[0] = ", first, " features",
      missing.empty() ? "" : absl::StrCat("; not on this host: ", absl::StrJoin(missing, ", ")),
      ")");
  return absl::OkStatus();
}

// The ports of a plan, by host: no two daemons of one host on the same one.
struct PortUse {
  std::vector<std::string> hosts_in_order;
  std::map<std::string, std::map<int, std::string>> taken;  // host -> port -> whose
  std::map<std::string, bool> needs_rdma;                   // host -> a pserver or worker
  std::vector<std::string> collisions;                      // a line each
  int n_ports = 0;
};

PortUse PortsOfPlan(const LaunchPlan& plan, const std::string& hosts_file) {
  PortUse u;
  for (const PlannedDaemon& d : plan.daemons) {
    if (!u.taken.count(d.host)) u.hosts_in_order.push_back(d.host);
    auto& ports = u.taken[d.host];
    u.needs_rdma[d.host] = u.needs_rdma[d.host] || d.role != "master";
    const std::pair<int, const char*> uses[] = {
        {d.port, "port"}, {d.data_port, "data port"}, {d.http_port, "http port"}};
    for (const auto& [port, what] : uses) {
      if (port <= 0) continue;
      const std::string whose = absl::StrCat(d.role, "-", d.index, "'s ", what);
      auto [it, added] = ports.emplace(port, whose);
      if (!added) {
        u.collisions.push_back(absl::StrCat(hosts_file, ": host ", d.host, ": port ", port,
                                            " would be both ", it->second, " and ", whose));
      } else {
        ++u.n_ports;
      }
    }
  }
  return u;
}

// One host's checks, as validate shows them.
struct HostReport {
  std::string host;
  bool ok = false;
  std::string via = "local";  // or the remote command
  std::string report;         // lines
};

// How validate reaches the hosts: as launch.sh does.
struct HostChecker {
  const LaunchPlan& plan;
  const PortUse& ports;
  std::vector<std::string> remote;  // the remote command's words
  std::string self;                 // the strata of the remote hosts
  bool remote_all = false;

  HostReport Check(const std::string& host) const;
};

HostReport HostChecker::Check(const std::string& host) const {
  const JobConfig& cfg = plan.config;
  HostCheckRequest req;
  req.host = host;
  for (const auto& [port, whose] : ports.taken.at(host)) req.ports.push_back(port);
  req.rdma = cfg.cluster.transport == "rdma" && ports.needs_rdma.at(host);
  req.rdma_settings.device = cfg.cluster.rdma.device;
  req.rdma_settings.port = cfg.cluster.rdma.port;
  req.rdma_settings.gid_index = cfg.cluster.rdma.gid_index;
  req.register_bytes =
      RegisterBytes(&cfg, std::max(plan.hosts.total_pservers(), plan.hosts.total_workers()));
  HostReport h;
  h.host = host;
  if (IsLocalHost(host) && !remote_all) {
    const transport::rdma::PreflightReport r = CheckThisHost(req);
    h.report = r.ToString();
    h.ok = r.ok();
    return h;
  }
  h.via = absl::StrJoin(remote, " ");
  std::vector<std::string> argv = remote;
  argv.push_back(host);
  std::string cmd = ShellQuote(self);
  for (const std::string& a : HostCheckArgs(req)) absl::StrAppend(&cmd, " ", ShellQuote(a));
  argv.push_back(cmd);
  const CommandResult r = RunCommand(argv, absl::Seconds(30));
  std::string output(absl::StripTrailingAsciiWhitespace(r.output));
  if (r.timed_out) {
    h.report = absl::StrCat("FAIL  reach: no answer through `", h.via, "` within 30 s\n");
  } else if (r.exit_code == 255 || r.exit_code < 0) {
    h.report = absl::StrCat("FAIL  reach: cannot reach ", host, " through `", h.via, "`: ", output,
                            "\n        fix: check the host is up and that ",
                            remote.empty() ? "ssh" : remote[0],
                            " logs in without a password (BatchMode)\n");
  } else if (r.exit_code == 127 || r.exit_code == 126) {
    h.report = absl::StrCat("FAIL  install: ", self, " does not run there: ", output,
                            "\n        fix: install Strata at the same path on every host\n");
  } else {
    h.report = absl::StrCat("ok    reach: through `", h.via, "`\n", output, "\n");
    h.ok = r.exit_code == 0;
  }
  return h;
}

// The hosts' checks at once (32 at a time), their reports in order.
std::vector<HostReport> CheckHosts(const HostChecker& checker,
                                   const std::vector<std::string>& hosts) {
  std::vector<HostReport> reports(hosts.size());
  auto check = [&](size_t i) { reports[i] = checker.Check(hosts[i]); };
  constexpr size_t kAtOnce = 32;
  for (size_t from = 0; from < hosts.size(); from += kAtOnce) {
    std::vector<std::thread> checks;
    for (size_t i = from; i < std::min(hosts.size(), from + kAtOnce); ++i) {
      if (!TryAddThread(&checks, [&check, i] { check(i); })) check(i);
    }
    for (auto& t : checks) t.join();
  }
  return reports;
}

// What validate found.
struct ValidateReport {
  std::string config_file, job, consistency;
  uint64_t params = 0;
  bool script_tables = false;  // declared by the training script: none here
  std::string sparse;          // "name (dim D), ..."
  int sparse_partitions = 0;
  std::string data_note;
  // With --hosts:
  bool has_hosts = false;
  std::string hosts_file;
  size_t n_hosts = 0;
  int pservers = 0, workers = 0;
  int n_ports = 0;
  size_t port_hosts = 0;
  std::vector<HostReport> checks;  // none with --offline
};

std::string ValidateText(const ValidateReport& v) {
  std::string text =
      absl::StrCat(v.config_file, ": ok (job '", v.job, "', ", v.consistency, ", ",
                   v.script_tables ? "tables declared by the training script"
                                   : absl::StrCat(v.params, " dense parameters"),
                   v.sparse.empty() ? ""
                                    : absl::StrCat("; sparse tables ", v.sparse, " in ",
                                                   v.sparse_partitions, " partitions each"),
                   ")\n");
  absl::StrAppend(&text, "model against data: ", v.data_note, "\n");
  if (!v.has_hosts) return text;
  absl::StrAppend(&text, v.hosts_file, ": ok (", v.n_hosts, " host(s), ", v.pservers,
                  " pserver(s), ", v.workers, " worker(s))\n");
  absl::StrAppend(&text, "ports: ok (", v.n_ports, " ports on ", v.port_hosts,
                  " host(s), no two daemons share one)\n");
  for (const HostReport& h : v.checks) {
    absl::StrAppend(&text, h.host, ": ", h.ok ? "ok" : "FAILED", "\n");
    for (absl::string_view line : absl::StrSplit(h.report, '\n', absl::SkipEmpty())) {
      absl::StrAppend(&text, "  ", line, "\n");
    }
  }
  return text;
}

JsonValue ValidateJson(const ValidateReport& v) {
  JsonValue js = JsonValue::Object();
  js.Set("config", JsonValue::Object()
                       .Set("file", JsonValue::String(v.config_file))
                       .Set("ok", JsonValue::Bool(true))
                       .Set("job", JsonValue::String(v.job))
                       .Set("dense_parameters", JsonValue::Int(v.params))
                       .Set("tables_declared_by_script", JsonValue::Bool(v.script_tables)))
      .Set("data", JsonValue::String(v.data_note));
  if (!v.has_hosts) return js;
  js.Set("hosts", JsonValue::Object()
                      .Set("file", JsonValue::String(v.hosts_file))
                      .Set("ok", JsonValue::Bool(true))
                      .Set("hosts", JsonValue::Int(v.n_hosts))
                      .Set("pservers", JsonValue::Int(v.pservers))
                      .Set("workers", JsonValue::Int(v.workers)));
  JsonValue checks = JsonValue::Array();
  for (const HostReport& h : v.checks) {
    JsonValue lines = JsonValue::Array();
    for (absl::string_view line : absl::StrSplit(h.report, '\n', absl::SkipEmpty())) {
      lines.Append(JsonValue::String(line));
    }
    checks.Append(JsonValue::Object()
                      .Set("host", JsonValue::String(h.host))
                      .Set("ok", JsonValue::Bool(h.ok))
                      .Set("via", JsonValue::String(h.via))
                      .Set("lines", std::move(lines)));
  }
  js.Set("checks", std::move(checks));
  return js;
}

CliResult ValidateResult(ValidateReport v, int exit_code) {
  CliResult r;
  r.exit_code = exit_code;
  r.data = ValidateJson(v);
  r.text = [v = std::move(v)] { return ValidateText(v); };
  return r;
}

// The config alone: the file, and the model against its data.
absl::StatusOr<ValidateReport> ValidateConfig(const Invocation& in) {
  const std::string& path = in.flags.at("config");
  STRATA_ASSIGN_OR_RETURN(JobConfig cfg, LoadJobConfig(path));
  auto data_fs = storage::NewFileSystemForConfig(cfg.s3, in.getenv);
  if (!data_fs.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("strata validate: ", data_fs.status().message()));
  }
  ValidateReport v;
  STRATA_RETURN_IF_ERROR(CheckModelAgainstData(cfg, path, data_fs->get(), &v.data_note));
  v.config_file = path;
  v.job = cfg.job.name;
  v.consistency = ConsistencyName(cfg.job.consistency);
  v.sparse_partitions = cfg.sparse.partitions;
  v.script_tables = ScriptDeclaresTables(cfg.model);
  for (const auto& t : ModelTables(cfg.model)) {
    v.params += t.num_elements();
    if (t.sparse) {
      absl::StrAppend(&v.sparse, v.sparse.empty() ? "" : ", ", t.name, " (dim ", t.dim, ")");
    }
  }
  return v;
}

}  // namespace

// strata validate: the config, the host file, the plan's ports (no two
// daemons of a host on one port) and, unless --offline, each host: reached
// (locally or through the remote command), its ports free, and the RDMA
// preflight when the transport is rdma. Exit 2: a bad file or a port
// collision; 1: a host failed its checks.
CliResult Validate(const Invocation& in) {
  const Flags& f = in.flags;
  if (!f.count("config")) return Failure(2, "strata validate: --config FILE is required");
  auto v = ValidateConfig(in);
  if (!v.ok()) return Failure(2, std::string(v.status().message()));
  if (!f.count("hosts")) return ValidateResult(*std::move(v), 0);
  auto plan = LoadPlan(f, "validate");
  if (!plan.ok()) return Failure(2, std::string(plan.status().message()));
  v->has_hosts = true;
  v->hosts_file = f.at("hosts");
  v->n_hosts = plan->hosts.hosts.size();
  v->pservers = plan->hosts.total_pservers();
  v->workers = plan->hosts.total_workers();
  const PortUse ports = PortsOfPlan(*plan, f.at("hosts"));
  if (!ports.collisions.empty()) {
    return Failure(2, absl::StrCat(absl::StrJoin(ports.collisions, "\n"),
                                   "\nstrata validate: move cluster.ports in ", f.at("config"),
                                   " (pserver and worker ports count up from their base, one "
                                   "per instance)"));
  }
  v->n_ports = ports.n_ports;
  v->port_hosts = ports.hosts_in_order.size();
  if (f.count("offline")) return ValidateResult(*std::move(v), 0);
  // The strata of the remote hosts: at this one's path, unless --strata-path.
  const HostChecker checker{*plan, ports, RemoteCommand(f, in.getenv),
                            FlagOr(f, "strata-path", SelfPath()), f.count("remote-all") > 0};
  v->checks = CheckHosts(checker, ports.hosts_in_order);
  const int failed =
      std::count_if(v->checks.begin(), v->checks.end(), [](const HostReport& h) { return !h.ok; });
  CliResult r = ValidateResult(*std::move(v), failed > 0 ? 1 : 0);
  if (failed > 0) {
    r.error = absl::StrCat("strata validate: ", failed, " of ", ports.hosts_in_order.size(),
                           " host(s) failed their checks (above)");
  }
  return r;
}

}  // namespace strata::tools::cli
