#include "tools/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "common/host_file.h"
#include "common/http_client.h"
#include "common/json.h"
#include "common/model_spec.h"
#include "common/proto_names.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "common/threads.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/strata.grpc.pb.h"
#include "storage/audit_log.h"
#include "storage/checkpoint_export.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"
#include "storage/idx_reader.h"
#include "storage/s3_file_system.h"
#include "tools/host_check.h"
#include "transport/rdma/rdma_device.h"

namespace strata::tools {
namespace {

using Getenv = std::function<const char*(const char*)>;

// The credentials of this run's gRPC calls (RunCli sets them first), and
// whether they are plain text for want of any (not asked for).
std::shared_ptr<grpc::ChannelCredentials> g_client_creds;
bool g_plaintext_by_default = false;
// The same credentials for the daemons' HTTP endpoints; https when the
// control plane is TLS (an mtls cluster serves HTTPS only).
HttpClientOptions g_http;
bool g_https = false;

// A call's status; an unreachable master while no credentials were found
// gets a hint: an mtls cluster refuses plain text at the TLS handshake.
absl::Status FromCall(const grpc::Status& s, const std::string& peer) {
  absl::Status st = FromGrpcStatus(s, peer);
  if (absl::IsUnavailable(st) && g_plaintext_by_default) {
    return absl::UnavailableError(absl::StrCat(
        st.message(),
        " (no credentials were found, so this was plain text: a cluster with "
        "security.mode mtls needs --tls-dir DIR or STRATA_TLS_DIR; docs/security.md)"));
  }
  return st;
}

std::shared_ptr<grpc::Channel> ControlChannel(const std::string& address) {
  return grpc::CreateChannel(address,
                             g_client_creds ? g_client_creds : grpc::InsecureChannelCredentials());
}

constexpr char kUsage[] =
    "usage: strata <command> [flags]\n"
    "credentials (the commands that call the master; docs/security.md):\n"
    "  --tls-dir DIR      ca.crt, client.crt, client.key (gen-certs.sh user); default\n"
    "                     $STRATA_TLS_DIR, else ~/.strata/tls when it exists\n"
    "  --token-file FILE  a bearer token instead of a client certificate (needs\n"
    "                     DIR/ca.crt); default $STRATA_TOKEN_FILE\n"
    "  --plaintext        no TLS: for a cluster whose config says security.mode:\n"
    "                     plaintext (also the default when no DIR exists)\n"
    "commands:\n"
    "  status   --master HOST:PORT [--json]   cluster view and job progress\n"
    "  top      --master HOST:PORT [--interval 2] [--iterations N] [--json]\n"
    "           live per node: steps/s, samples/s, push and pull GB/s, comm share,\n"
    "           memory (refreshing; N frames then exit, 0 = until interrupted)\n"
    "  logs     NODE --master HOST:PORT [--lines 200] [--json]   a node's recent log lines\n"
    "           (NODE: master, pserver-I, worker-I or a node id)\n"
    "  drain    NODE --master HOST:PORT [--no-wait] [--timeout 600] [--reason TEXT] [--json]\n"
    "           take a node out of the running job and wait until it has left: a\n"
    "           worker finishes its data task; a pserver's partitions go to their\n"
    "           backups (refused when that would lose parameters)\n"
    "  stop     --master HOST:PORT [--no-checkpoint] [--reason TEXT] [--json]\n"
    "           stop the job, after a checkpoint when checkpoints are on\n"
    "  wait     --master HOST:PORT [--timeout SECONDS] [--until running|end] [--progress]\n"
    "           [--progress-only] [--every SECONDS] [--redraw] [--json]\n"
    "           wait for the job to end; exit 0 if it succeeded. --progress shows the\n"
    "           job's progress line every few seconds (--redraw: in place, on a\n"
    "           terminal); --progress-only shows only that, not the end\n"
    "  validate --config FILE [--hosts FILE] [--offline] [--remote-cmd CMD] [--json]\n"
    "           [--remote-all] [--strata-path PATH]\n"
    "           check a config and a host file before a launch: the files, no two\n"
    "           daemons of a host on one port, and (unless --offline) every host:\n"
    "           reached as launch.sh reaches it (CMD HOST 'command', default ssh),\n"
    "           its ports free, the RDMA preflight for the rdma transport\n"
    "  host-check --bind HOST --ports P,... [--rdma true ...] [--json]   one host's checks,\n"
    "           run on that host (by validate)\n"
    "  plan     --config FILE --hosts FILE [--json]   the daemons a launch starts, one a line:\n"
    "           role index host port data_port http_port  (- where unused)\n"
    "  security-config --config FILE [--json]   the config's security section: mode,\n"
    "           tls_dir, token_file (for scripts)\n"
    "  prometheus-config --config FILE --hosts FILE [--interval 5s] [--tls-dir DIR] [--json]\n"
    "           a Prometheus configuration scraping every daemon's /metrics; for\n"
    "           an mtls config over https with the viewer certificate in DIR\n"
    "           (ca.crt, client.crt, client.key; default /etc/prometheus/strata-tls:\n"
    "           gen-certs.sh user --name prometheus --role viewer)\n"
    "  doctor   [--config FILE] [--hosts FILE] [--json]  RDMA preflight of this host: devices,\n"
    "           ports, GIDs, MTU, locked-memory limit against what the job\n"
    "           registers; exit 0 when ready\n"
    "  checkpoint --master HOST:PORT [--stop] [--timeout SECONDS] [--json]\n"
    "           take a checkpoint now and wait for it (--stop: then stop the job)\n"
    "  checkpoint list --dir DIR [--json]     the checkpoints under a checkpoint root\n"
    "           (list, export and verify take --config FILE for an s3:// DIR: its\n"
    "           s3 section names the store; keys from its credentials_file or AWS_*)\n"
    "  checkpoint export --dir DIR --out DIR2 --precision bf16|fp16 [--json]\n"
    "           an inference export: the parameters only, 16 bits each\n"
    "  audit verify --file FILE [--json]   check the master's audit log: every record\n"
    "           chained to the one before (an edit, deletion or reordering is\n"
    "           named by its line); prints the head to compare with the master's\n"
    "  checkpoint verify --dir DIR [--json]   read a checkpoint whole and check every\n"
    "           checksum; exit 0 when it is complete and intact; prints a digest\n"
    "           of the state it restores (equal for equal models)\n";

// --key value / --key=value / --flag
absl::StatusOr<std::map<std::string, std::string>> ParseFlags(const std::vector<std::string>& args,
                                                              size_t from) {
  std::map<std::string, std::string> flags;
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
               key != "progress-only" && key != "redraw" && key != "plaintext") {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("--", key, " needs a value"));
      }
      value = args[++i];
    }
    flags[key] = value;
  }
  return flags;
}

absl::StatusOr<proto::GetStatusResponse> FetchStatus(const std::string& master) {
  auto stub = proto::Master::NewStub(ControlChannel(master));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  proto::GetStatusResponse resp;
  absl::Status s =
      FromCall(stub->GetStatus(&ctx, proto::GetStatusRequest(), &resp), "master " + master);
  if (!s.ok()) return s;
  return resp;
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
    default:
      return "?";
  }
}

}  // namespace

std::string JobProgressLine(const proto::JobStatus& j) {
  std::string s = absl::StrFormat("epoch %d/%d  step %d  tasks %d/%d  samples/s %.0f  loss %.4f",
                                  std::min(j.epoch() + 1, j.epochs()), j.epochs(), j.steps(),
                                  j.tasks_done(), j.tasks_total(), j.samples_per_sec(), j.loss());
  if (j.train_accuracy() > 0) absl::StrAppendFormat(&s, "  accuracy %.3f", j.train_accuracy());
  if (j.has_test_accuracy()) absl::StrAppendFormat(&s, "  test accuracy %.4f", j.test_accuracy());
  if (j.comm_share() > 0) absl::StrAppendFormat(&s, "  comm %.0f%%", 100 * j.comm_share());
  if (j.state() == "evaluating") {
    absl::StrAppend(&s, "  evaluating");
  } else if (j.tasks_done() > 0 && j.tasks_total() > j.tasks_done() && j.wall_seconds() > 0) {
    // The rest at the pace so far (tasks are of one size).
    const double eta = j.wall_seconds() * static_cast<double>(j.tasks_total() - j.tasks_done()) /
                       static_cast<double>(j.tasks_done());
    const int64_t secs = static_cast<int64_t>(eta + 0.5);
    absl::StrAppendFormat(&s, "  eta %d:%02d", secs / 60, secs % 60);
  }
  return s;
}

namespace {

void PrintStatus(const proto::GetStatusResponse& st, std::ostream& out) {
  const proto::JobStatus& j = st.job();
  out << absl::StrFormat(
      "job %s: %s%s  (%s)\n  epoch %d/%d  tasks %d/%d  steps %d  samples %d  "
      "samples/s %.0f  loss %.4f  comm %.0f%%  wall %.1fs  test accuracy %s\n",
      j.name(), j.state(), j.message().empty() ? "" : " - " + j.message(), j.consistency(),
      std::min(j.epoch() + 1, j.epochs()), j.epochs(), j.tasks_done(), j.tasks_total(), j.steps(),
      j.samples(), j.samples_per_sec(), j.loss(), 100 * j.comm_share(), j.wall_seconds(),
      j.has_test_accuracy() ? absl::StrFormat("%.4f", j.test_accuracy()) : "-");
  if (j.state() == "waiting" && !j.phase().empty()) out << "  bring-up: " << j.phase() << "\n";
  if (!j.security().empty()) {
    out << "  security: "
        << (absl::StartsWith(j.security(), "mtls") ? j.security()
                                                   : "PLAINTEXT - no TLS, no authentication")
        << "\n";
  }
  if (!j.audit_head().empty()) {
    out << absl::StrFormat("  audit log: %d records, head %s\n", j.audit_records(), j.audit_head());
  }
  if (j.checkpoint_in_progress() > 0) {
    out << absl::StrFormat(
        "  checkpoint %d in progress: %d of %d pserver(s) written, %.2f MB, %.1f s\n",
        j.checkpoint_in_progress(), j.checkpoint_pservers_done(), j.checkpoint_pservers_total(),
        j.checkpoint_bytes_so_far() / 1e6, j.checkpoint_seconds_so_far());
  }
  const auto& v = st.view();
  out << absl::StrFormat("\ncluster view epoch %d (%s)\n", v.epoch(),
                         v.ready() ? "ready" : "not ready");
  out << absl::StrFormat("%-5s %-8s %-5s %-16s %-9s %-8s %-22s %s\n", "NODE", "ROLE", "INDEX",
                         "HOST", "STATE", "LAST_HB", "DATA/GRPC", "HTTP");
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  std::map<uint32_t, uint64_t> bytes_by_owner;
  for (const auto& p : v.partitions()) bytes_by_owner[p.owner()] += p.length() * 4;
  for (const auto& n : v.members()) {
    const std::string addr = n.data_address().empty() ? n.grpc_address() : n.data_address();
    out << absl::StrFormat("%-5d %-8s %-5d %-16s %-9s %-8s %-22s %d\n", n.id(),
                           NodeRoleName(n.role()), n.index(), n.host(),
                           n.draining() ? "draining" : StateName(n.state()),
                           absl::StrFormat("%.1fs", (now_ms - n.last_heartbeat_unix_ms()) / 1000.0),
                           addr.empty() ? "-" : addr, n.http_port());
  }
  out << absl::StrFormat("\n%-9s %-12s %-10s %-10s %s\n", "PARTITION", "TABLE", "OFFSET", "LENGTH",
                         "OWNER");
  for (const auto& p : v.partitions()) {
    const std::string table =
        p.table_id() < static_cast<uint32_t>(v.tables_size()) ? v.tables(p.table_id()).name() : "?";
    out << absl::StrFormat("%-9d %-12s %-10d %-10d %d\n", p.id(), table, p.offset(), p.length(),
                           p.owner());
  }
  if (!j.workers().empty()) {
    out << absl::StrFormat("\n%-7s %-5s %-6s %-8s %-10s %-10s %-8s %s\n", "WORKER", "NODE", "EPOCH",
                           "STEP", "SAMPLES", "SAMPLES/S", "LOSS", "COMM");
    for (const auto& w : j.workers()) {
      out << absl::StrFormat("%-7d %-5d %-6d %-8d %-10d %-10.0f %-8.4f %.0f%%\n", w.index(),
                             w.node_id(), w.epoch() + 1, w.step(), w.samples(), w.samples_per_sec(),
                             w.loss(), 100 * w.comm_share());
    }
  }
}

int Status(const std::map<std::string, std::string>& f, std::ostream& out, std::ostream& err) {
  auto it = f.find("master");
  if (it == f.end()) {
    err << "strata status: --master HOST:PORT is required\n";
    return 2;
  }
  auto st = FetchStatus(it->second);
  if (!st.ok()) {
    err << "strata status: " << st.status().message() << "\n";
    return 1;
  }
  if (f.count("json")) {
    std::string json;
    google::protobuf::util::JsonPrintOptions o;
    o.always_print_primitive_fields = true;
    o.add_whitespace = true;
    (void)google::protobuf::util::MessageToJsonString(*st, &json, o);
    out << json;
  } else {
    PrintStatus(*st, out);
  }
  return 0;
}

// GET NodeUrl(...); the body of a 200, else an error naming the URL.
absl::StatusOr<std::string> HttpGet(const std::string& url, double timeout_seconds = 5) {
  HttpClientOptions o = g_http;
  o.timeout = absl::Seconds(timeout_seconds);
  STRATA_ASSIGN_OR_RETURN(HttpResult r, HttpFetch(url, o));
  if (r.status != 200) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": HTTP ", r.status, ": ", r.body));
  }
  return std::move(r.body);
}

std::string NodeUrl(const proto::NodeInfo& n, const std::string& path) {
  const bool v6 = n.host().find(':') != std::string::npos;
  return absl::StrCat(g_https ? "https://" : "http://", v6 ? "[" : "", n.host(), v6 ? "]" : "", ":",
                      n.http_port(), path);
}

// The newest instance of "role-index" ("worker-1", "master"), or of node id N.
const proto::NodeInfo* FindNode(const proto::GetStatusResponse& st, const std::string& name) {
  const proto::NodeInfo* found = nullptr;
  uint32_t id = 0;
  const bool by_id = absl::SimpleAtoi(name, &id);
  for (const auto& m : st.view().members()) {
    const std::string full = absl::StrCat(NodeRoleName(m.role()), "-", m.index());
    const bool match =
        by_id ? m.id() == id : full == name || (m.role() == proto::MASTER && name == "master");
    if (match && (found == nullptr || m.id() > found->id())) found = &m;
  }
  return found;
}

// strata logs NODE: the node's recent log lines, from its /logs.
int Logs(const std::vector<std::string>& args, const std::map<std::string, std::string>& f,
         std::ostream& out, std::ostream& err) {
  if (args.size() < 2 || args[1].rfind("--", 0) == 0 || !f.count("master")) {
    err << "strata logs: usage: strata logs NODE --master HOST:PORT [--lines N]\n"
           "  NODE: master, pserver-I, worker-I or a node id\n";
    return 2;
  }
  int lines = 200;
  if (f.count("lines") && (!absl::SimpleAtoi(f.at("lines"), &lines) || lines < 0)) {
    err << "strata logs: --lines must be a number >= 0\n";
    return 2;
  }
  auto st = FetchStatus(f.at("master"));
  if (!st.ok()) {
    err << "strata logs: " << st.status().message() << "\n";
    return 1;
  }
  const proto::NodeInfo* n = FindNode(*st, args[1]);
  if (n == nullptr) {
    err << "strata logs: no node " << args[1] << " in the cluster of master " << f.at("master")
        << " (names: master, pserver-I, worker-I, or a node id)\n";
    return 1;
  }
  if (n->http_port() <= 0) {
    err << "strata logs: " << args[1] << " serves no HTTP port\n";
    return 1;
  }
  auto body = HttpGet(NodeUrl(*n, absl::StrCat("/logs?lines=", lines)));
  if (!body.ok()) {
    err << "strata logs: " << args[1] << " (node " << n->id() << ", " << StateName(n->state())
        << "): " << body.status().message() << "\n";
    return 1;
  }
  if (f.count("json")) {
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(*body, '\n', absl::SkipEmpty())) {
      lines.push_back(absl::StrCat("\"", JsonEscape(line), "\""));
    }
    out << absl::StrFormat(
        "{\"node\": \"%s-%d\", \"node_id\": %d, \"state\": \"%s\", "
        "\"lines\": [%s]}\n",
        NodeRoleName(n->role()), n->index(), n->id(), StateName(n->state()),
        absl::StrJoin(lines, ", "));
    return 0;
  }
  out << *body;
  return 0;
}

// One daemon's counters and gauges from its /metrics, by series name
// (labels dropped: the series top reads have none).
struct MetricsSample {
  absl::Time at;
  std::map<std::string, double> values;
  bool ok = false;
};

MetricsSample ScrapeNode(const proto::NodeInfo& n) {
  MetricsSample m;
  m.at = absl::Now();
  if (n.http_port() <= 0 || n.state() == proto::DEAD || n.state() == proto::DRAINED) return m;
  auto body = HttpGet(NodeUrl(n, "/metrics"), 2);
  if (!body.ok()) return m;
  m.ok = true;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (line.empty() || line[0] == '#' || line.find('{') != absl::string_view::npos) continue;
    const size_t sp = line.rfind(' ');
    double v;
    if (sp != absl::string_view::npos && absl::SimpleAtod(line.substr(sp + 1), &v)) {
      m.values[std::string(line.substr(0, sp))] = v;
    }
  }
  return m;
}

// strata top: per node, refreshed: steps/s, samples/s, push and pull GB/s,
// comm share, memory.
int Top(const std::map<std::string, std::string>& f, std::ostream& out, std::ostream& err) {
  if (!f.count("master")) {
    err << "strata top: --master HOST:PORT is required\n";
    return 2;
  }
  double interval = 2;
  int iterations = 0;
  if (f.count("interval") && (!absl::SimpleAtod(f.at("interval"), &interval) || interval <= 0)) {
    err << "strata top: --interval must be a number of seconds > 0\n";
    return 2;
  }
  if (f.count("iterations") &&
      (!absl::SimpleAtoi(f.at("iterations"), &iterations) || iterations < 0)) {
    err << "strata top: --iterations must be a number >= 0 (0: until interrupted)\n";
    return 2;
  }
  const bool json = f.count("json") > 0;
  const bool tty = !json && &out == &std::cout && isatty(STDOUT_FILENO);
  std::map<uint32_t, MetricsSample> before;
  for (int frame = 0; iterations == 0 || frame <= iterations; ++frame) {
    auto st = FetchStatus(f.at("master"));
    if (!st.ok()) {
      err << "strata top: " << st.status().message() << "\n";
      return 1;
    }
    // Every node at once (a hung one costs its 2 s timeout once per frame,
    // not once per node); where no thread can start, one after another.
    std::map<uint32_t, MetricsSample> now;
    std::vector<const proto::NodeInfo*> nodes;
    for (const auto& n : st->view().members()) nodes.push_back(&n);
    std::vector<MetricsSample> samples(nodes.size());
    std::vector<std::thread> scrapers;
    for (size_t i = 0; i < nodes.size(); ++i) {
      auto scrape = [&, i] { samples[i] = ScrapeNode(*nodes[i]); };
      if (!TryAddThread(&scrapers, scrape)) scrape();
    }
    for (auto& t : scrapers) t.join();
    for (size_t i = 0; i < nodes.size(); ++i) now[nodes[i]->id()] = std::move(samples[i]);
    // The first scrape is only a baseline for the rates.
    if (frame > 0) {
      const proto::JobStatus& job = st->job();
      std::string rows;
      for (const auto& n : st->view().members()) {
        const MetricsSample& a = before[n.id()];
        const MetricsSample& b = now[n.id()];
        const double dt = a.ok && b.ok ? absl::ToDoubleSeconds(b.at - a.at) : 0;
        auto rate = [&](const char* name) -> double {
          auto x = a.values.find(name), y = b.values.find(name);
          if (dt <= 0 || x == a.values.end() || y == b.values.end()) return -1;
          return std::max(0.0, (y->second - x->second) / dt);
        };
        auto gauge = [&](const char* name) -> double {
          auto y = b.values.find(name);
          return y == b.values.end() ? -1 : y->second;
        };
        double steps = -1, samples = -1, push = -1, pull = -1, comm = -1;
        if (n.role() == proto::WORKER) {
          steps = rate("strata_worker_steps");
          samples = rate("strata_worker_samples");
          push = rate("strata_worker_push_bytes_total");
          pull = rate("strata_worker_pull_bytes_total");
          comm = gauge("strata_worker_comm_share");
        } else if (n.role() == proto::PSERVER) {
          push = rate("strata_pserver_bytes_received_total");  // pushes in
          pull = rate("strata_pserver_bytes_sent_total");      // pulls out
        }
        const double mem = gauge("process_resident_memory_bytes");
        const std::string name = absl::StrCat(NodeRoleName(n.role()), "-", n.index());
        if (json) {
          absl::StrAppendFormat(
              &rows,
              "%s{\"node\": %d, \"name\": \"%s\", \"host\": \"%s\", \"state\": \"%s\", "
              "\"up\": %s, \"steps_per_sec\": %.3f, \"samples_per_sec\": %.3f, "
              "\"push_gb_per_sec\": %.6f, \"pull_gb_per_sec\": %.6f, \"comm_share\": %.4f, "
              "\"memory_bytes\": %.0f}",
              rows.empty() ? "" : ", ", n.id(), name, JsonEscape(n.host()), StateName(n.state()),
              b.ok ? "true" : "false", steps, samples, push / 1e9, pull / 1e9, comm, mem);
        } else {
          // v with `decimals` digits and `unit` after it; "-" when unknown.
          auto col = [](double v, int decimals, const char* unit = "") {
            return v < 0 ? std::string("-") : absl::StrFormat("%.*f%s", decimals, v, unit);
          };
          absl::StrAppendFormat(
              &rows, "%-11s %-16s %-8s %8s %10s %9s %9s %6s %9s\n", name, n.host(),
              b.ok ? StateName(n.state()) : "no-http", col(steps, 1), col(samples, 0),
              col(push < 0 ? -1 : push / 1e9, 3), col(pull < 0 ? -1 : pull / 1e9, 3),
              col(comm < 0 ? -1 : comm * 100, 0, "%"), col(mem < 0 ? -1 : mem / 1048576, 0, "M"));
        }
      }
      if (json) {
        out << absl::StrFormat(
                   "{\"time_unix_ms\": %d, \"job\": \"%s\", \"state\": \"%s\", \"step\": %d, "
                   "\"samples_per_sec\": %.2f, \"comm_share\": %.4f, \"nodes\": [%s]}",
                   absl::ToUnixMillis(absl::Now()), JsonEscape(job.name()), job.state(),
                   job.steps(), job.samples_per_sec(), job.comm_share(), rows)
            << std::endl;
      } else {
        if (tty) out << "\x1b[H\x1b[2J";
        out << absl::StrFormat(
                   "strata top: job %s %s, epoch %d/%d, step %d, %.0f samples/s, comm %.0f%%  "
                   "(every %g s)\n",
                   job.name(), job.state(), job.epoch() + 1, job.epochs(), job.steps(),
                   job.samples_per_sec(), job.comm_share() * 100, interval)
            << absl::StrFormat("%-11s %-16s %-8s %8s %10s %9s %9s %6s %9s\n", "NODE", "HOST",
                               "STATE", "STEPS/S", "SAMPLES/S", "PUSH GB/s", "PULL GB/s", "COMM",
                               "MEMORY")
            << rows << (tty ? "" : "\n") << std::flush;
      }
    }
    before = std::move(now);
    if (iterations != 0 && frame == iterations) break;
    absl::SleepFor(absl::Seconds(interval));
  }
  return 0;
}

std::string JsonOf(const google::protobuf::Message& m);

// strata stop: the job stops (after a checkpoint when checkpoints are on).
int Stop(const std::map<std::string, std::string>& f, std::ostream& out, std::ostream& err) {
  if (!f.count("master")) {
    err << "strata stop: --master HOST:PORT is required\n";
    return 2;
  }
  const std::string& master = f.at("master");
  auto stub = proto::Master::NewStub(ControlChannel(master));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(900)));
  proto::StopRequest req;
  req.set_reason(f.count("reason") ? f.at("reason") : "strata stop");
  req.set_no_checkpoint(f.count("no-checkpoint") > 0);
  proto::StopResponse resp;
  absl::Status s = FromCall(stub->Stop(&ctx, req, &resp), "master " + master);
  if (!s.ok()) {
    err << "strata stop: " << s.message() << "\n";
    return 1;
  }
  if (f.count("json")) {
    out << JsonOf(resp);
  } else if (resp.checkpointed()) {
    out << "job stopped after checkpoint " << resp.checkpoint().seq() << " ("
        << resp.checkpoint().dir() << ", step " << resp.checkpoint().step() << ")\n";
  } else {
    out << "job stopped (no checkpoint)\n";
  }
  return 0;
}

// strata drain NODE: the master takes the node out of the job; then, unless
// --no-wait, wait until it has left (a worker finishes its data task first).
int Drain(const std::vector<std::string>& args, const std::map<std::string, std::string>& f,
          std::ostream& out, std::ostream& err) {
  if (args.size() < 2 || args[1].rfind("--", 0) == 0 || !f.count("master")) {
    err << "strata drain: usage: strata drain NODE --master HOST:PORT [--no-wait] "
           "[--timeout SECONDS] [--reason TEXT] [--json]\n"
           "  NODE: pserver-I, worker-I or a node id\n";
    return 2;
  }
  double timeout = 600;
  if (f.count("timeout") && (!absl::SimpleAtod(f.at("timeout"), &timeout) || timeout < 0)) {
    err << "strata drain: --timeout must be a number of seconds\n";
    return 2;
  }
  const std::string& master = f.at("master");
  const bool json = f.count("json") > 0;
  auto st = FetchStatus(master);
  if (!st.ok()) {
    err << "strata drain: " << st.status().message() << "\n";
    return 1;
  }
  const proto::NodeInfo* n = FindNode(*st, args[1]);
  if (n == nullptr) {
    err << "strata drain: no node " << args[1] << " in the cluster of master " << master
        << " (names: pserver-I, worker-I, or a node id)\n";
    return 1;
  }
  const uint32_t id = n->id();
  const proto::Role role = n->role();
  const std::string name = absl::StrCat(NodeRoleName(n->role()), "-", n->index());
  auto stub = proto::Master::NewStub(ControlChannel(master));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  proto::DrainRequest req;
  req.set_node_id(id);
  req.set_reason(f.count("reason") ? f.at("reason") : "strata drain");
  proto::DrainResponse resp;
  absl::Status s = FromCall(stub->Drain(&ctx, req, &resp), "master " + master);
  if (!s.ok()) {
    err << "strata drain: " << s.message() << "\n";
    return 1;
  }
  if (!json) out << resp.message() << "\n" << std::flush;
  const absl::Time start = absl::Now();
  proto::NodeInfo node = resp.node();
  // Until it has left: a line when its state changes, and on a terminal a
  // line redrawn with the time waited.
  const bool tty = !json && &out == &std::cout && isatty(STDOUT_FILENO);
  while (!f.count("no-wait") && node.state() != proto::DRAINED) {
    if (absl::Now() - start > absl::Seconds(timeout)) {
      if (tty) out << "\n";
      err << "strata drain: " << name << " has not left after " << timeout << " s (state "
          << StateName(node.state()) << (node.draining() ? ", draining" : "") << ")\n";
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(250));
    auto now = FetchStatus(master);
    if (!now.ok()) continue;  // (a master restarting)
    const proto::NodeInfo* m = nullptr;
    for (const auto& x : now->view().members())
      if (x.id() == id) m = &x;
    if (m == nullptr) break;
    node = *m;
    if (node.state() == proto::DEAD) {
      if (tty) out << "\n";
      err << "strata drain: " << name << " died before it had drained (see strata logs " << name
          << ")\n";
      return 1;
    }
    const std::string& job = now->job().state();
    if (node.state() != proto::DRAINED &&
        (job == "succeeded" || job == "failed" || job == "stopped")) {
      if (tty) out << "\n";
      if (json) {
        out << absl::StrFormat(
            "{\"node\": \"%s\", \"node_id\": %d, \"state\": \"%s\", "
            "\"draining\": true, \"job_state\": \"%s\"}\n",
            name, id, StateName(node.state()), job);
      } else {
        out << "the job ended (" << job << ") while " << name << " was draining\n";
      }
      return 0;
    }
    if (tty) {
      out << absl::StrFormat("\r%s: draining, waiting for it to finish its data task (%.0f s)",
                             name, absl::ToDoubleSeconds(absl::Now() - start))
          << std::flush;
    }
  }
  const double waited = absl::ToDoubleSeconds(absl::Now() - start);
  if (tty) out << "\n";
  if (json) {
    out << absl::StrFormat(
        "{\"node\": \"%s\", \"node_id\": %d, \"state\": \"%s\", "
        "\"draining\": %s, \"waited_seconds\": %.3f, \"message\": \"%s\"}\n",
        name, id, StateName(node.state()), node.draining() ? "true" : "false", waited,
        JsonEscape(resp.message()));
  } else if (node.state() == proto::DRAINED && !f.count("no-wait")) {
    if (role == proto::PSERVER) {
      // (Out of the job at once; the process follows at its next heartbeat.)
      out << absl::StrFormat("%s (node %d) is out of the job; its process exits\n", name, id);
    } else {
      out << absl::StrFormat("%s (node %d) has left the job (%.1f s)\n", name, id, waited);
    }
  }
  return 0;
}

int Wait(const std::map<std::string, std::string>& f, std::ostream& out, std::ostream& err) {
  auto it = f.find("master");
  if (it == f.end()) {
    err << "strata wait: --master HOST:PORT is required\n";
    return 2;
  }
  double timeout = 3600;
  if (f.count("timeout") && !absl::SimpleAtod(f.at("timeout"), &timeout)) {
    err << "strata wait: --timeout must be a number of seconds\n";
    return 2;
  }
  // --until running: bring-up only (exit 0 once the job runs); its
  // progress is shown (as with --progress for the whole job).
  const std::string until = f.count("until") ? f.at("until") : "end";
  if (until != "end" && until != "running") {
    err << "strata wait: --until must be 'running' or 'end'\n";
    return 2;
  }
  // --progress-only: the job's progress line alone, until the job ends
  // (launch.sh shows it while another `strata wait` reports the end).
  const bool only = f.count("progress-only") > 0;
  const bool progress = (until == "running" || f.count("progress") || only) && !f.count("json");
  // The job's progress line, once training runs: every --every seconds (3
  // by default), or with --redraw (a terminal) redrawn in place twice a
  // second.
  const bool redraw = f.count("redraw") > 0;
  double every = redraw ? 0.5 : 3;
  if (f.count("every") && (!absl::SimpleAtod(f.at("every"), &every) || every <= 0)) {
    err << "strata wait: --every must be a positive number of seconds\n";
    return 2;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout);
  absl::Status last;
  std::string shown;
  absl::Time next_line = absl::InfinitePast();
  bool drawn = false;  // a redrawn line is on the screen, without its newline
  auto end_drawn = [&]() {
    if (drawn) out << "\n";
    drawn = false;
  };
  while (absl::Now() < deadline) {
    auto st = FetchStatus(it->second);
    if (st.ok()) {
      const std::string& state = st->job().state();
      const bool training = state == "running" || state == "evaluating";
      if (progress && !only && st->job().phase() != shown &&
          (state == "waiting" || (until == "end" && training))) {
        shown = st->job().phase();
        // (A phase's own figures change all the time: a line per phase.)
        end_drawn();
        out << (state == "waiting" ? "bring-up: " : "progress: ") << shown << "\n" << std::flush;
      }
      // (From the first step on: before it the figures are all zero.)
      if (progress && until == "end" && training && st->job().steps() > 0 &&
          absl::Now() >= next_line) {
        next_line = absl::Now() + absl::Seconds(every);
        if (redraw) {
          out << "\r\033[K";
          drawn = true;
        }
        out << "progress: " << JobProgressLine(st->job()) << (redraw ? "" : "\n") << std::flush;
      }
      if (only && (state == "succeeded" || state == "failed" || state == "stopped")) {
        end_drawn();
        return state == "succeeded" ? 0 : 1;
      }
      if (until == "running" && (state == "running" || state == "evaluating")) {
        if (f.count("json")) {
          out << absl::StrFormat("{\"job\": \"%s\", \"state\": \"%s\"}\n",
                                 JsonEscape(st->job().name()), state);
        } else {
          out << "job " << st->job().name() << " is " << state << "\n";
        }
        return 0;
      }
      if (state == "succeeded" || state == "failed" || state == "stopped") {
        end_drawn();
        if (f.count("json")) {
          out << absl::StrFormat("{\"job\": \"%s\", \"state\": \"%s\", \"message\": \"%s\"}\n",
                                 JsonEscape(st->job().name()), state,
                                 JsonEscape(st->job().message()));
        } else {
          out << "job " << st->job().name() << " " << state
              << (st->job().message().empty() ? "" : ": " + st->job().message()) << "\n";
        }
        return state == "succeeded" ? 0 : 1;
      }
    } else {
      last = st.status();
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  end_drawn();
  err << "strata wait: timed out after " << timeout << " s"
      << (last.ok() ? "" : absl::StrCat(" (last error: ", last.message(), ")")) << "\n";
  return 1;
}

// What a process of this job registers with the NIC: a worker its
// parameter and gradient tensors (a pserver at most one copy of the model
// plus its state, so this bounds both roles), plus each connection's send
// and receive slots, (recv_slots + 4 + send_slots) * slot_kib, for every
// peer: the larger of the pserver and worker counts of --hosts, or 16.
constexpr int kDefaultRdmaPeers = 16;

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

// {"ok": ..., "findings": [{"ok", "check", "detail", "fix"}...]}
std::string FindingsJson(const transport::rdma::PreflightReport& r) {
  std::string out = absl::StrCat("{\"ok\": ", r.ok() ? "true" : "false", ", \"findings\": [");
  for (size_t i = 0; i < r.findings.size(); ++i) {
    const auto& x = r.findings[i];
    absl::StrAppend(&out, i ? ", " : "", "{\"ok\": ", x.ok ? "true" : "false", ", \"check\": \"",
                    JsonEscape(x.check), "\", \"detail\": \"", JsonEscape(x.detail),
                    "\", \"fix\": \"", JsonEscape(x.fix), "\"}");
  }
  return out + "]}";
}

int Doctor(const std::map<std::string, std::string>& f, std::ostream& out, std::ostream& err) {
  std::optional<JobConfig> cfg;
  if (f.count("config")) {
    auto c = LoadJobConfig(f.at("config"));
    if (!c.ok()) {
      err << c.status().message() << "\n";
      return 2;
    }
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
    if (!hosts.ok()) {
      err << hosts.status().message() << "\n";
      return 2;
    }
    peers = std::max(hosts->total_pservers(), hosts->total_workers());
  }
  auto devices = transport::rdma::ListRdmaDevices();
  if (!devices.ok()) {
    err << "strata doctor: " << devices.status().message() << "\n";
    return 1;
  }
  const transport::rdma::PreflightReport report =
      transport::rdma::RdmaPreflight(*devices, settings, transport::rdma::MemlockLimitBytes(),
                                     RegisterBytes(cfg ? &*cfg : nullptr, peers));
  if (f.count("json")) {
    std::string json = FindingsJson(report);
    json.insert(1, absl::StrCat("\"devices\": ", devices->size(), ", "));
    out << json << "\n";
  } else {
    out << transport::rdma::FormatRdmaDoctorReport(*devices, report);
  }
  return report.ok() ? 0 : 1;
}

// The daemons a launch starts from a config and a host file.
struct PlannedDaemon {
  std::string role;
  int index = 0;
  std::string host;
  int port = -1;       // gRPC (-1: none)
  int data_port = -1;  // data plane (-1: none)
  int http_port = -1;
};

// Loads both files and lists the daemons; prints the error and returns
// nullopt when either file is bad.
std::optional<std::pair<JobConfig, std::vector<PlannedDaemon>>> LoadPlan(
    const std::map<std::string, std::string>& f, const char* command, std::ostream& err) {
  if (!f.count("config") || !f.count("hosts")) {
    err << "strata " << command << ": --config FILE and --hosts FILE are required\n";
    return std::nullopt;
  }
  auto cfg = LoadJobConfig(f.at("config"));
  if (!cfg.ok()) {
    err << cfg.status().message() << "\n";
    return std::nullopt;
  }
  auto hosts = LoadHostFile(f.at("hosts"));
  if (!hosts.ok()) {
    err << hosts.status().message() << "\n";
    return std::nullopt;
  }
  const auto& p = cfg->cluster.ports;
  std::vector<PlannedDaemon> d;
  d.push_back({"master", 0, hosts->master_host().host, p.master, -1, p.master_http});
  int pi = 0, wi = 0;
  for (const auto& h : hosts->hosts) {
    for (int i = 0; i < h.pservers; ++i, ++pi) {
      d.push_back(
          {"pserver", pi, h.host, p.pserver + pi, p.pserver_data + pi, p.pserver_http + pi});
    }
  }
  for (const auto& h : hosts->hosts) {
    for (int i = 0; i < h.workers; ++i, ++wi) {
      d.push_back({"worker", wi, h.host, -1, -1, p.worker_http + wi});
    }
  }
  return std::make_pair(std::move(*cfg), std::move(d));
}

int Plan(const std::map<std::string, std::string>& f, std::ostream& out, std::ostream& err) {
  auto plan = LoadPlan(f, "plan", err);
  if (!plan) return 2;
  auto port = [](int p) { return p < 0 ? std::string("-") : std::to_string(p); };
  if (f.count("json")) {
    std::vector<std::string> rows;
    for (const PlannedDaemon& d : plan->second) {
      rows.push_back(
          absl::StrFormat("{\"role\": \"%s\", \"index\": %d, \"host\": \"%s\", \"port\": %d, "
                          "\"data_port\": %d, \"http_port\": %d}",
                          d.role, d.index, JsonEscape(d.host), d.port, d.data_port, d.http_port));
    }
    out << "[" << absl::StrJoin(rows, ",\n ") << "]\n";
    return 0;
  }
  for (const PlannedDaemon& d : plan->second) {
    out << d.role << " " << d.index << " " << d.host << " " << port(d.port) << " "
        << port(d.data_port) << " " << port(d.http_port) << "\n";
  }
  return 0;
}

// strata security-config --config FILE: the config's security section, for
// scripts (launch.sh): "mode M", "tls_dir D", "token_file F" (- for none).
int SecurityConfig(const std::map<std::string, std::string>& f, std::ostream& out,
                   std::ostream& err) {
  if (!f.count("config")) {
    err << "strata security-config: --config FILE is required\n";
    return 2;
  }
  auto config = LoadJobConfig(f.at("config"));
  if (!config.ok()) {
    err << "strata security-config: " << config.status().message() << "\n";
    return 2;
  }
  const SecuritySection& s = config->security;
  if (f.count("json")) {
    out << absl::StrFormat("{\"mode\": \"%s\", \"tls_dir\": \"%s\", \"token_file\": \"%s\"}\n",
                           JsonEscape(s.mode), JsonEscape(s.tls_dir), JsonEscape(s.token_file));
    return 0;
  }
  out << "mode " << s.mode << "\ntls_dir " << s.tls_dir << "\ntoken_file "
      << (s.token_file.empty() ? "-" : s.token_file) << "\n";
  return 0;
}

// The remote command of scripts/launch.sh, split into words as bash splits
// an unquoted $REMOTE_CMD.
std::vector<std::string> RemoteCommand(const std::map<std::string, std::string>& f,
                                       const Getenv& getenv) {
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

// strata validate: the config, the host file, the plan's ports (no two
// daemons of a host on one port) and, unless --offline, each host: reached
// (locally or through the remote command), its ports free, and the RDMA
// preflight when the transport is rdma. Exit 2: a bad file or a port
// collision; 1: a host failed its checks.
//
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

int Validate(const std::map<std::string, std::string>& f, const Getenv& getenv, std::ostream& out,
             std::ostream& err) {
  if (!f.count("config")) {
    err << "strata validate: --config FILE is required\n";
    return 2;
  }
  const bool json = f.count("json") > 0;
  auto cfg = LoadJobConfig(f.at("config"));
  if (!cfg.ok()) {
    err << cfg.status().message() << "\n";
    return 2;
  }
  auto data_fs = storage::NewFileSystemForConfig(cfg->s3, getenv);
  if (!data_fs.ok()) {
    err << "strata validate: " << data_fs.status().message() << "\n";
    return 2;
  }
  std::string data_note;
  if (absl::Status s = CheckModelAgainstData(*cfg, f.at("config"), data_fs->get(), &data_note);
      !s.ok()) {
    err << s.message() << "\n";
    return 2;
  }
  uint64_t params = 0;
  std::string sparse;
  for (const auto& t : ModelTables(cfg->model)) {
    params += t.num_elements();
    if (t.sparse)
      absl::StrAppend(&sparse, sparse.empty() ? "" : ", ", t.name, " (dim ", t.dim, ")");
  }
  std::string text =
      absl::StrCat(f.at("config"), ": ok (job '", cfg->job.name, "', ",
                   ConsistencyName(cfg->job.consistency), ", ", params, " dense parameters",
                   sparse.empty() ? ""
                                  : absl::StrCat("; sparse tables ", sparse, " in ",
                                                 cfg->sparse.partitions, " partitions each"),
                   ")\n");
  absl::StrAppend(&text, "model against data: ", data_note, "\n");
  std::string js = absl::StrFormat(
      "{\"config\": {\"file\": \"%s\", \"ok\": true, \"job\": \"%s\", \"dense_parameters\": %d}"
      ", \"data\": \"%s\"",
      JsonEscape(f.at("config")), JsonEscape(cfg->job.name), params, JsonEscape(data_note));
  auto finish = [&](int rc) {
    if (json) {
      out << js << "}\n";
    } else {
      out << text;
    }
    return rc;
  };
  if (!f.count("hosts")) return finish(0);
  auto hosts = LoadHostFile(f.at("hosts"));
  if (!hosts.ok()) {
    err << hosts.status().message() << "\n";
    return 2;
  }
  absl::StrAppend(&text, f.at("hosts"), ": ok (", hosts->hosts.size(), " host(s), ",
                  hosts->total_pservers(), " pserver(s), ", hosts->total_workers(),
                  " worker(s))\n");
  absl::StrAppendFormat(&js,
                        ", \"hosts\": {\"file\": \"%s\", \"ok\": true, \"hosts\": %d, "
                        "\"pservers\": %d, \"workers\": %d}",
                        JsonEscape(f.at("hosts")), hosts->hosts.size(), hosts->total_pservers(),
                        hosts->total_workers());
  auto plan = LoadPlan(f, "validate", err);
  if (!plan) return 2;
  // Ports: no two daemons of one host on the same port.
  std::vector<std::string> hosts_in_order;
  std::map<std::string, std::map<int, std::string>> taken;  // host -> port -> whose
  std::map<std::string, bool> host_needs_rdma;
  std::vector<std::string> collisions;
  int n_ports = 0;
  for (const PlannedDaemon& d : plan->second) {
    if (!taken.count(d.host)) hosts_in_order.push_back(d.host);
    auto& ports = taken[d.host];
    host_needs_rdma[d.host] = host_needs_rdma[d.host] || d.role != "master";
    const std::pair<int, const char*> uses[] = {
        {d.port, "port"}, {d.data_port, "data port"}, {d.http_port, "http port"}};
    for (const auto& [port, what] : uses) {
      if (port <= 0) continue;
      const std::string whose = absl::StrCat(d.role, "-", d.index, "'s ", what);
      auto [it, added] = ports.emplace(port, whose);
      if (!added) {
        collisions.push_back(absl::StrCat(f.at("hosts"), ": host ", d.host, ": port ", port,
                                          " would be both ", it->second, " and ", whose));
      } else {
        ++n_ports;
      }
    }
  }
  if (!collisions.empty()) {
    for (const std::string& c : collisions) err << c << "\n";
    err << "strata validate: move cluster.ports in " << f.at("config")
        << " (pserver and worker ports count up from their base, one per instance)\n";
    return 2;
  }
  absl::StrAppend(&text, "ports: ok (", n_ports, " ports on ", hosts_in_order.size(),
                  " host(s), no two daemons share one)\n");
  if (f.count("offline")) {
    absl::StrAppend(&js, ", \"checks\": []");
    return finish(0);
  }
  // Each host, as launch.sh reaches it.
  const bool remote_all = f.count("remote-all") > 0;
  const bool rdma = cfg->cluster.transport == "rdma";
  const std::vector<std::string> remote = RemoteCommand(f, getenv);
  // The strata of the remote hosts: at this one's path, unless --strata-path.
  const std::string self = f.count("strata-path") ? f.at("strata-path") : SelfPath();
  // The hosts' checks run at once (32 at a time), their reports in order.
  const size_t n_hosts = hosts_in_order.size();
  std::vector<std::string> reports(n_hosts), hows(n_hosts, "local");
  std::vector<char> oks(n_hosts, 0);
  auto check_host = [&](size_t hi) {
    const std::string& host = hosts_in_order[hi];
    HostCheckRequest req;
    req.host = host;
    for (const auto& [port, whose] : taken.at(host)) req.ports.push_back(port);
    req.rdma = rdma && host_needs_rdma.at(host);
    req.rdma_settings.device = cfg->cluster.rdma.device;
    req.rdma_settings.port = cfg->cluster.rdma.port;
    req.rdma_settings.gid_index = cfg->cluster.rdma.gid_index;
    req.register_bytes =
        RegisterBytes(&*cfg, std::max(hosts->total_pservers(), hosts->total_workers()));
    std::string& report = reports[hi];
    std::string& how = hows[hi];
    bool ok = false;
    if (IsLocalHost(host) && !remote_all) {
      const transport::rdma::PreflightReport r = CheckThisHost(req);
      report = r.ToString();
      ok = r.ok();
    } else {
      how = absl::StrJoin(remote, " ");
      std::vector<std::string> argv = remote;
      argv.push_back(host);
      std::string cmd = ShellQuote(self);
      for (const std::string& a : HostCheckArgs(req)) absl::StrAppend(&cmd, " ", ShellQuote(a));
      argv.push_back(cmd);
      const CommandResult r = RunCommand(argv, absl::Seconds(30));
      std::string output(absl::StripTrailingAsciiWhitespace(r.output));
      if (r.timed_out) {
        report = absl::StrCat("FAIL  reach: no answer through `", how, "` within 30 s\n");
      } else if (r.exit_code == 255 || r.exit_code < 0) {
        report = absl::StrCat("FAIL  reach: cannot reach ", host, " through `", how, "`: ", output,
                              "\n        fix: check the host is up and that ",
                              remote.empty() ? "ssh" : remote[0],
                              " logs in without a password (BatchMode)\n");
      } else if (r.exit_code == 127 || r.exit_code == 126) {
        report = absl::StrCat("FAIL  install: ", self, " does not run there: ", output,
                              "\n        fix: install Strata at the same path on every host\n");
      } else {
        report = absl::StrCat("ok    reach: through `", how, "`\n", output, "\n");
        ok = r.exit_code == 0;
      }
    }
    oks[hi] = ok;
  };
  constexpr size_t kAtOnce = 32;
  for (size_t from = 0; from < n_hosts; from += kAtOnce) {
    std::vector<std::thread> checks;
    for (size_t hi = from; hi < std::min(n_hosts, from + kAtOnce); ++hi) {
      if (!TryAddThread(&checks, [&check_host, hi] { check_host(hi); })) check_host(hi);
    }
    for (auto& t : checks) t.join();
  }
  int failed = 0;
  absl::StrAppend(&js, ", \"checks\": [");
  for (size_t hi = 0; hi < n_hosts; ++hi) {
    const std::string& host = hosts_in_order[hi];
    const std::string& report = reports[hi];
    const std::string& how = hows[hi];
    const bool ok = oks[hi];
    failed += !ok;
    absl::StrAppend(&text, host, ": ", ok ? "ok" : "FAILED", "\n");
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(report, '\n', absl::SkipEmpty())) {
      absl::StrAppend(&text, "  ", line, "\n");
      lines.push_back(absl::StrCat("\"", JsonEscape(line), "\""));
    }
    absl::StrAppendFormat(&js, "%s{\"host\": \"%s\", \"ok\": %s, \"via\": \"%s\", \"lines\": [%s]}",
                          hi ? ", " : "", JsonEscape(host), ok ? "true" : "false", JsonEscape(how),
                          absl::StrJoin(lines, ", "));
  }
  absl::StrAppend(&js, "]");
  const int rc = finish(failed > 0 ? 1 : 0);
  if (failed > 0) {
    out.flush();  // (the report before the verdict, when both go to one file)
    err << "strata validate: " << failed << " of " << hosts_in_order.size()
        << " host(s) failed their checks (above)\n";
  }
  return rc;
}

// strata host-check: the checks of one host, run on it (by validate).
int HostCheck(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::vector<std::string> rest;
  bool json = false;
  for (const std::string& a : args) {
    if (a == "--json") {
      json = true;
    } else {
      rest.push_back(a);
    }
  }
  auto req = ParseHostCheckArgs(rest);
  if (!req.ok()) {
    err << "strata host-check: " << req.status().message() << "\n";
    return 2;
  }
  const transport::rdma::PreflightReport r = CheckThisHost(*req);
  out << (json ? FindingsJson(r) + "\n" : r.ToString());
  return r.ok() ? 0 : 1;
}

// A Prometheus configuration that scrapes every daemon of the plan.
int PrometheusConfig(const std::map<std::string, std::string>& f, std::ostream& out,
                     std::ostream& err) {
  auto plan = LoadPlan(f, "prometheus-config", err);
  if (!plan) return 2;
  const std::string interval = f.count("interval") ? f.at("interval") : "5s";
  if (interval.empty() || interval.find_first_not_of("0123456789") == 0 ||
      interval.find_first_not_of("0123456789smh") != std::string::npos) {
    err << "strata prometheus-config: --interval " << interval
        << ": expected a Prometheus duration such as 5s or 1m\n";
    return 2;
  }
  const std::string& job = plan->first.job.name;
  // An mtls cluster serves HTTPS only, to people's roles: Prometheus
  // scrapes as a viewer (docs/security.md).
  const bool https = plan->first.security.mode != "plaintext";
  const std::string tls = f.count("tls-dir") ? f.at("tls-dir") : "/etc/prometheus/strata-tls";
  if (f.count("json")) {
    // The same configuration as JSON (which Prometheus reads as YAML).
    std::vector<std::string> groups;
    for (const PlannedDaemon& d : plan->second) {
      if (d.http_port <= 0) continue;
      const bool v6 = d.host.find(':') != std::string::npos;
      groups.push_back(
          absl::StrFormat("{\"targets\": [\"%s%s%s:%d\"], \"labels\": {\"strata_job\": \"%s\", "
                          "\"role\": \"%s\", \"index\": \"%d\"}}",
                          v6 ? "[" : "", JsonEscape(d.host), v6 ? "]" : "", d.http_port,
                          JsonEscape(job), d.role, d.index));
    }
    const std::string scheme =
        https ? absl::StrFormat(
                    "\"scheme\": \"https\", \"tls_config\": {\"ca_file\": \"%s/ca.crt\", "
                    "\"cert_file\": \"%s/client.crt\", \"key_file\": \"%s/client.key\"},\n   ",
                    JsonEscape(tls), JsonEscape(tls), JsonEscape(tls))
              : "";
    out << absl::StrFormat(
        "{\"global\": {\"scrape_interval\": \"%s\", \"evaluation_interval\": \"%s\"},\n"
        " \"scrape_configs\": [{\"job_name\": \"strata\", \"metrics_path\": \"/metrics\",\n"
        "   %s\"static_configs\": [\n    %s]}]}\n",
        interval, interval, scheme, absl::StrJoin(groups, ",\n    "));
    return 0;
  }
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
  for (const PlannedDaemon& d : plan->second) {
    if (d.http_port <= 0) continue;  // no fixed HTTP port: nothing to scrape
    const bool v6 = d.host.find(':') != std::string::npos;
    out << "      - targets: ['" << (v6 ? "[" : "") << d.host << (v6 ? "]" : "") << ":"
        << d.http_port << "']\n"
        << "        labels: {strata_job: '" << job << "', role: " << d.role << ", index: '"
        << d.index << "'}\n";
  }
  return 0;
}

std::string JsonOf(const google::protobuf::Message& m) {
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(m, &json, o);
  return json;
}

int TakeCheckpoint(const std::map<std::string, std::string>& f, std::ostream& out,
                   std::ostream& err) {
  auto it = f.find("master");
  if (it == f.end()) {
    err << "strata checkpoint: --master HOST:PORT is required\n";
    return 2;
  }
  double timeout = 900;
  if (f.count("timeout") && !absl::SimpleAtod(f.at("timeout"), &timeout)) {
    err << "strata checkpoint: --timeout must be a number of seconds\n";
    return 2;
  }
  auto stub = proto::Master::NewStub(ControlChannel(it->second));
  proto::CheckpointRequest req;
  req.set_reason("request");
  req.set_stop_after(f.count("stop") > 0);
  proto::CheckpointResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(timeout)));
  if (!f.count("json")) out << "checkpointing..." << std::flush;
  // Progress while it is written: the pservers done and their bytes, from
  // the master's status (a line redrawn on a terminal, else a line each
  // time a pserver is done).
  absl::Notification done;
  std::thread progress;
  const bool tty = &out == &std::cout && isatty(STDOUT_FILENO);
  if (!f.count("json")) {
    progress = std::thread([&] {
      int shown = -1;
      while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(300))) {
        auto st = FetchStatus(it->second);
        if (!st.ok() || st->job().checkpoint_in_progress() == 0) continue;
        const proto::JobStatus& j = st->job();
        const std::string line = absl::StrFormat(
            "checkpoint %d: %d of %d pserver(s) written, %.2f MB, %.1f s",
            j.checkpoint_in_progress(), j.checkpoint_pservers_done(), j.checkpoint_pservers_total(),
            j.checkpoint_bytes_so_far() / 1e6, j.checkpoint_seconds_so_far());
        if (tty) {
          out << "\r" << line << "\x1b[K" << std::flush;
        } else if (j.checkpoint_pservers_done() != shown) {
          out << "\n  " << line << std::flush;
        }
        shown = j.checkpoint_pservers_done();
      }
      if (tty) out << "\r\x1b[K";
      if (shown >= 0 && !tty) out << "\n";
    });
  }
  absl::Status s = FromCall(stub->Checkpoint(&ctx, req, &resp), "master " + it->second);
  done.Notify();
  if (progress.joinable()) progress.join();
  if (!s.ok()) {
    if (!f.count("json")) out << "\n";
    err << "strata checkpoint: " << s.message() << "\n";
    return 1;
  }
  if (f.count("json")) {
    out << JsonOf(resp);
  } else {
    out << absl::StrFormat(" checkpoint %d (%s)%s: %.2f MB written in %.2f s: %s\n", resp.seq(),
                           resp.incremental() ? "incremental" : "full",
                           resp.step() ? absl::StrCat(" at step ", resp.step()) : "",
                           resp.bytes_written() / 1e6, resp.write_seconds(), resp.dir());
  }
  return 0;
}

// Local paths, and s3:// ones through the s3 section of --config. Null
// (after saying why on `err`) when the config or the keys are bad.
std::unique_ptr<storage::FileSystem> CheckpointFileSystem(
    const std::map<std::string, std::string>& f, const Getenv& getenv, const std::string& who,
    std::ostream& err) {
  S3Section s3;
  if (f.count("config")) {
    auto config = LoadJobConfig(f.at("config"));
    if (!config.ok()) {
      err << who << ": " << config.status().message() << "\n";
      return nullptr;
    }
    s3 = config->s3;
  }
  auto fs = storage::NewFileSystemForConfig(s3, getenv);
  if (!fs.ok()) {
    err << who << ": " << fs.status().message() << "\n";
    return nullptr;
  }
  return std::move(*fs);
}

int ListCheckpoints(const std::map<std::string, std::string>& f, const Getenv& getenv,
                    std::ostream& out, std::ostream& err) {
  if (!f.count("dir")) {
    err << "strata checkpoint list: --dir DIR (the checkpoint root) is required\n";
    return 2;
  }
  auto fs = CheckpointFileSystem(f, getenv, "strata checkpoint list", err);
  if (fs == nullptr) return 2;
  auto all = storage::ListCheckpoints(fs.get(), f.at("dir"));
  if (!all.ok()) {
    err << "strata checkpoint list: " << all.status().message() << "\n";
    return 1;
  }
  if (!f.count("json")) {
    out << absl::StrFormat("%-8s %-11s %-8s %-12s %-10s %-12s %s\n", "SEQ", "KIND", "STEP",
                           "WRITTEN_MB", "RAW_MB", "CREATED", "REASON");
  }
  std::string json = "[";
  for (const auto& e : *all) {
    auto m = storage::ReadManifest(fs.get(), e.dir);
    if (f.count("json")) {
      if (json.size() > 1) json += ",\n";
      json += m.ok() ? JsonOf(*m)
                     : absl::StrFormat("{\"seq\": %d, \"error\": \"%s\"}", e.seq,
                                       JsonEscape(m.status().message()));
      continue;
    }
    if (!m.ok()) {
      out << absl::StrFormat("%-8d %-11s %s\n", e.seq, e.complete ? "BAD" : "unfinished",
                             e.complete ? m.status().message() : "no MANIFEST");
      continue;
    }
    out << absl::StrFormat(
        "%-8d %-11s %-8d %-12.2f %-10.2f %-12s %s\n", m->seq(),
        m->incremental() ? "incremental" : "full", m->step(), m->bytes_written() / 1e6,
        m->raw_bytes() / 1e6,
        absl::FormatTime("%m-%d %H:%M:%S", absl::FromUnixMillis(m->created_unix_ms()),
                         absl::LocalTimeZone()),
        m->reason());
  }
  if (f.count("json")) out << json << "]\n";
  return 0;
}

int VerifyCheckpoint(const std::map<std::string, std::string>& f, const Getenv& getenv,
                     std::ostream& out, std::ostream& err) {
  if (!f.count("dir")) {
    err << "strata checkpoint verify: --dir DIR (a checkpoint directory) is required\n";
    return 2;
  }
  auto fs = CheckpointFileSystem(f, getenv, "strata checkpoint verify", err);
  if (fs == nullptr) return 2;
  std::string dir = f.at("dir");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  auto m = storage::ReadManifest(fs.get(), dir);
  if (!m.ok()) {
    err << "strata checkpoint verify: " << m.status().message() << "\n";
    return 1;
  }
  const std::string root = storage::ParentDir(dir);
  absl::Status s = storage::CheckManifestFiles(fs.get(), root, *m);
  int files = 0;
  // The digest of the state the checkpoint restores (the chains applied),
  // independent of how it was written: two checkpoints of the same model
  // and optimizer state have the same one.
  uint32_t digest = 0;
  for (const auto& p : m->partitions()) {
    std::string dense;
    std::map<uint64_t, std::string> rows;
    std::string pending;
    uint64_t version = 0;
    for (const auto& file : p.files()) {
      if (!s.ok()) break;
      auto streams = storage::ReadBlockFile(fs.get(), storage::JoinPath(root, file.path()), &file);
      ++files;
      if (!streams.ok()) {
        s = streams.status();
        break;
      }
      proto::CheckpointPartitionHeader h;
      if (!h.ParseFromString((*streams)[storage::BlockType::kHeader])) {
        s = absl::DataLossError(absl::StrCat(storage::JoinPath(root, file.path()),
                                             ": partition header does not parse"));
        break;
      }
      version = h.version();
      if (!h.sparse()) {
        dense = (*streams)[storage::BlockType::kDenseValues] +
                (*streams)[storage::BlockType::kOptimizerState];
        continue;
      }
      const std::string& del = (*streams)[storage::BlockType::kSparseDeletes];
      for (size_t i = 0; i + 8 <= del.size(); i += 8) {
        uint64_t key;
        std::memcpy(&key, del.data() + i, 8);
        rows.erase(key);
      }
      const std::string& recs = (*streams)[storage::BlockType::kSparseRows];
      for (size_t i = 0; h.row_bytes() >= 8 && i + h.row_bytes() <= recs.size();
           i += h.row_bytes()) {
        uint64_t key;
        std::memcpy(&key, recs.data() + i, 8);
        rows[key] = recs.substr(i, h.row_bytes());
      }
      pending = (*streams)[storage::BlockType::kSparsePending];
    }
    uint32_t c = Crc32cExtend(digest, reinterpret_cast<const char*>(&version), sizeof(version));
    c = Crc32cExtend(c, dense.data(), dense.size());
    for (const auto& [key, rec] : rows) c = Crc32cExtend(c, rec.data(), rec.size());
    digest = Crc32cExtend(c, pending.data(), pending.size());
  }
  if (!s.ok()) {
    err << "strata checkpoint verify: " << s.message() << "\n";
    return 1;
  }
  if (f.count("json")) {
    out << absl::StrFormat(
        "{\"dir\": \"%s\", \"ok\": true, \"seq\": %d, \"step\": %d, "
        "\"files\": %d, \"state_digest\": \"%08x\"}\n",
        JsonEscape(dir), m->seq(), m->step(), files, digest);
    return 0;
  }
  out << absl::StrFormat(
      "%s: ok (%s, job '%s', step %d, %d partitions, %d files checked; "
      "state digest %08x)\n",
      dir, m->incremental() ? "incremental" : "full", m->job(), m->step(), m->partitions_size(),
      files, digest);
  return 0;
}

// strata audit verify --file FILE: the audit log's chain, whole.
int VerifyAudit(const std::map<std::string, std::string>& f, std::ostream& out, std::ostream& err) {
  if (!f.count("file")) {
    err << "strata audit verify: --file FILE is required\n";
    return 2;
  }
  const std::string& path = f.at("file");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    err << "strata audit verify: cannot read " << path << "\n";
    return 2;
  }
  std::stringstream contents;
  contents << in.rdbuf();
  auto head = storage::VerifyAuditLog(contents.str(), path);
  if (!head.ok()) {
    if (f.count("json")) {
      out << absl::StrFormat("{\"file\": \"%s\", \"ok\": false, \"error\": \"%s\"}\n",
                             JsonEscape(path), JsonEscape(head.status().message()));
    }
    err << "strata audit verify: " << head.status().message() << "\n";
    return 1;
  }
  if (f.count("json")) {
    out << absl::StrFormat("{\"file\": \"%s\", \"ok\": true, \"records\": %d, \"head\": \"%s\"}\n",
                           JsonEscape(path), head->seq, head->hash);
  } else {
    out << absl::StrFormat("%s: ok: %d records, each chained to the one before; head %d %s\n", path,
                           head->seq, head->seq, head->hash);
  }
  return 0;
}

int ExportCheckpoint(const std::map<std::string, std::string>& f, const Getenv& getenv,
                     std::ostream& out, std::ostream& err) {
  if (!f.count("dir") || !f.count("out") || !f.count("precision")) {
    err << "strata checkpoint export: --dir DIR --out DIR2 --precision bf16|fp16 are required\n";
    return 2;
  }
  auto precision = storage::ParsePrecision(f.at("precision"));
  if (!precision.ok()) {
    err << "strata checkpoint export: " << precision.status().message() << "\n";
    return 2;
  }
  auto fs = CheckpointFileSystem(f, getenv, "strata checkpoint export", err);
  if (fs == nullptr) return 2;
  std::string dir = f.at("dir"), dst = f.at("out");
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  while (dst.size() > 1 && dst.back() == '/') dst.pop_back();
  auto m = storage::ExportCheckpoint(fs.get(), dir, dst, *precision);
  if (!m.ok()) {
    err << "strata checkpoint export: " << m.status().message() << "\n";
    return 1;
  }
  if (f.count("json")) {
    out << JsonOf(*m);
    return 0;
  }
  out << absl::StrFormat("%s: %s export of %s (job '%s', step %d, %d partitions): %.2f MB\n", dst,
                         m->precision(), dir, m->job(), m->step(), m->partitions_size(),
                         m->bytes_written() / 1e6);
  return 0;
}

// The credentials from --tls-dir / --token-file / --plaintext, then
// STRATA_TLS_DIR / STRATA_TOKEN_FILE, then ~/.strata/tls; plain text when
// there are none.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentials(
    const std::map<std::string, std::string>& f, const Getenv& env) {
  auto from = [&](const char* flag, const char* var) -> std::string {
    if (f.count(flag)) return f.at(flag);
    const char* v = env(var);
    return v != nullptr ? v : "";
  };
  TlsOptions o;
  o.dir = from("tls-dir", "STRATA_TLS_DIR");
  o.token_file = from("token-file", "STRATA_TOKEN_FILE");
  if (f.count("plaintext")) {
    if (f.count("tls-dir") || f.count("token-file")) {
      return absl::InvalidArgumentError("--plaintext goes with neither --tls-dir nor --token-file");
    }
    return grpc::InsecureChannelCredentials();
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
    g_plaintext_by_default = true;
    return grpc::InsecureChannelCredentials();
  }
  // A client certificate when the directory has one, else the token alone.
  o.cert_name = access((o.dir + "/client.crt").c_str(), R_OK) == 0 ? "client" : "";
  if (o.cert_name.empty() && o.token_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.dir, " has no client.crt and no --token-file is given: nothing to authenticate with"));
  }
  STRATA_ASSIGN_OR_RETURN(ControlPlaneSecurity s, MakeControlPlaneSecurity(o));
  g_https = true;
  g_http.ca_file = o.dir + "/ca.crt";
  if (!o.cert_name.empty()) {
    g_http.cert_file = o.dir + "/client.crt";
    g_http.key_file = o.dir + "/client.key";
  }
  if (!o.token_file.empty()) {
    // (MakeControlPlaneSecurity has checked the file's mode and content.)
    std::ifstream in(o.token_file);
    std::string token;
    in >> token;
    g_http.bearer_token = token;
  }
  return s.client;
}

}  // namespace

int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           const std::function<const char*(const char*)>& getenv) {
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? err : out) << kUsage;
    return args.empty() ? 2 : 0;
  }
  // COMMAND --help (or -h): that command's lines of the usage.
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] != "--help" && args[i] != "-h") continue;
    std::string help;
    bool in = false;
    for (absl::string_view line : absl::StrSplit(kUsage, '\n')) {
      const bool entry = line.size() > 2 && line.substr(0, 2) == "  " && line[2] != ' ';
      if (entry) in = absl::StartsWith(line.substr(2), args[0] + " ");
      if (in) absl::StrAppend(&help, line, "\n");
    }
    if (help.empty()) {
      err << "strata: unknown command '" << args[0] << "'\n" << kUsage;
      return 2;
    }
    out << "usage: strata " << args[0] << " [flags]\n" << help;
    return 0;
  }
  // "checkpoint list|verify|export", "audit verify": a sub-command before the flags.
  const bool sub = (args[0] == "checkpoint" && args.size() > 1 &&
                    (args[1] == "list" || args[1] == "verify" || args[1] == "export")) ||
                   (args[0] == "audit" && args.size() > 1 && args[1] == "verify");
  // "logs NODE": the node before the flags.
  const bool positional =
      (args[0] == "logs" || args[0] == "drain") && args.size() > 1 && args[1].rfind("--", 0) != 0;
  auto flags = ParseFlags(args, sub || positional ? 2 : 1);
  if (!flags.ok()) {
    err << "strata " << args[0] << ": " << flags.status().message() << "\n" << kUsage;
    return 2;
  }
  const std::string& cmd = args[0];
  const Getenv env = getenv ? getenv : [](const char*) -> const char* { return nullptr; };
  // The commands that call the master: their credentials.
  if (cmd == "status" || cmd == "top" || cmd == "stop" || cmd == "logs" || cmd == "drain" ||
      cmd == "wait" || (cmd == "checkpoint" && !sub)) {
    g_plaintext_by_default = false;
    g_https = false;
    g_http = HttpClientOptions();
    auto creds = ClientCredentials(*flags, env);
    if (!creds.ok()) {
      err << "strata " << cmd << ": " << creds.status().message() << "\n";
      return 2;
    }
    g_client_creds = *std::move(creds);
  }
  if (cmd == "status") return Status(*flags, out, err);
  if (cmd == "top") return Top(*flags, out, err);
  if (cmd == "stop") return Stop(*flags, out, err);
  if (cmd == "logs") return Logs(args, *flags, out, err);
  if (cmd == "drain") return Drain(args, *flags, out, err);
  if (cmd == "host-check") return HostCheck(args, out, err);
  if (cmd == "wait") return Wait(*flags, out, err);
  if (cmd == "validate") return Validate(*flags, env, out, err);
  if (cmd == "plan") return Plan(*flags, out, err);
  if (cmd == "security-config") return SecurityConfig(*flags, out, err);
  if (cmd == "prometheus-config") return PrometheusConfig(*flags, out, err);
  if (cmd == "doctor") return Doctor(*flags, out, err);
  if (cmd == "audit") {
    if (!sub) {
      err << "strata audit: usage: strata audit verify --file FILE [--json]\n";
      return 2;
    }
    return VerifyAudit(*flags, out, err);
  }
  if (cmd == "checkpoint") {
    if (sub && args[1] == "list") return ListCheckpoints(*flags, env, out, err);
    if (sub && args[1] == "verify") return VerifyCheckpoint(*flags, env, out, err);
    if (sub && args[1] == "export") return ExportCheckpoint(*flags, env, out, err);
    return TakeCheckpoint(*flags, out, err);
  }
  err << "strata: unknown command '" << cmd << "'\n" << kUsage;
  return 2;
}

}  // namespace strata::tools
