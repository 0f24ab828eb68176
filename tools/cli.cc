#include "tools/cli.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/config.h"
#include "common/crc32c.h"
#include "common/json.h"
#include "common/grpc_status.h"
#include "common/host_file.h"
#include "common/model_spec.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/strata.grpc.pb.h"
#include "storage/checkpoint_export.h"
#include "storage/checkpoint_format.h"
#include "storage/file_system.h"
#include "storage/s3_file_system.h"
#include "transport/rdma/rdma_device.h"

namespace strata::tools {
namespace {

using Getenv = std::function<const char*(const char*)>;

constexpr char kUsage[] =
    "usage: strata <command> [flags]\n"
    "commands:\n"
    "  status   --master HOST:PORT [--json]   cluster view and job progress\n"
    "  top      --master HOST:PORT [--interval 2] [--iterations N] [--json]\n"
    "           live per node: steps/s, samples/s, push and pull GB/s, comm share,\n"
    "           memory (refreshing; N frames then exit, 0 = until interrupted)\n"
    "  logs     NODE --master HOST:PORT [--lines 200]   a node's recent log lines\n"
    "           (NODE: master, pserver-I, worker-I or a node id)\n"
    "  stop     --master HOST:PORT [--no-checkpoint] [--reason TEXT] [--json]\n"
    "           stop the job, after a checkpoint when checkpoints are on\n"
    "  wait     --master HOST:PORT [--timeout SECONDS]\n"
    "           wait for the job to end; exit 0 if it succeeded\n"
    "  validate --config FILE [--hosts FILE]  check a config and a host file\n"
    "  plan     --config FILE --hosts FILE    the daemons a launch starts, one a line:\n"
    "           role index host port data_port http_port  (- where unused)\n"
    "  prometheus-config --config FILE --hosts FILE [--interval 5s]\n"
    "           a Prometheus configuration scraping every daemon's /metrics\n"
    "  doctor   [--config FILE] [--hosts FILE] RDMA preflight of this host: devices,\n"
    "           ports, GIDs, MTU, locked-memory limit against what the job\n"
    "           registers; exit 0 when ready\n"
    "  checkpoint --master HOST:PORT [--stop] [--timeout SECONDS] [--json]\n"
    "           take a checkpoint now and wait for it (--stop: then stop the job)\n"
    "  checkpoint list --dir DIR [--json]     the checkpoints under a checkpoint root\n"
    "           (list, export and verify take --config FILE for an s3:// DIR: its\n"
    "           s3 section names the store; keys from its credentials_file or AWS_*)\n"
    "  checkpoint export --dir DIR --out DIR2 --precision bf16|fp16\n"
    "           an inference export: the parameters only, 16 bits each\n"
    "  checkpoint verify --dir DIR [--json]   read a checkpoint whole and check every\n"
    "           checksum; exit 0 when it is complete and intact; prints a digest\n"
    "           of the state it restores (equal for equal models)\n";

// --key value / --key=value / --flag
absl::StatusOr<std::map<std::string, std::string>> ParseFlags(
    const std::vector<std::string>& args, size_t from) {
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
    } else if (key != "json" && key != "stop" && key != "no-checkpoint") {
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
  auto stub = proto::Master::NewStub(
      grpc::CreateChannel(master, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  proto::GetStatusResponse resp;
  absl::Status s = FromGrpcStatus(stub->GetStatus(&ctx, proto::GetStatusRequest(), &resp),
                                  "master " + master);
  if (!s.ok()) return s;
  return resp;
}

const char* RoleName(proto::Role r) {
  switch (r) {
    case proto::MASTER: return "master";
    case proto::PSERVER: return "pserver";
    case proto::WORKER: return "worker";
    default: return "?";
  }
}
const char* StateName(proto::NodeState s) {
  switch (s) {
    case proto::ALIVE: return "alive";
    case proto::DEAD: return "DEAD";
    case proto::FINISHED: return "finished";
    default: return "?";
  }
}

void PrintStatus(const proto::GetStatusResponse& st, std::ostream& out) {
  const proto::JobStatus& j = st.job();
  out << absl::StrFormat(
      "job %s: %s%s  (%s)\n  epoch %d/%d  tasks %d/%d  steps %d  samples %d  "
      "samples/s %.0f  loss %.4f  comm %.0f%%  wall %.1fs  test accuracy %s\n",
      j.name(), j.state(), j.message().empty() ? "" : " - " + j.message(),
      j.consistency(), std::min(j.epoch() + 1, j.epochs()), j.epochs(), j.tasks_done(),
      j.tasks_total(), j.steps(), j.samples(), j.samples_per_sec(), j.loss(),
      100 * j.comm_share(), j.wall_seconds(),
      j.has_test_accuracy() ? absl::StrFormat("%.4f", j.test_accuracy()) : "-");
  const auto& v = st.view();
  out << absl::StrFormat("\ncluster view epoch %d (%s)\n", v.epoch(),
                         v.ready() ? "ready" : "not ready");
  out << absl::StrFormat("%-5s %-8s %-5s %-16s %-9s %-8s %-22s %s\n", "NODE", "ROLE",
                         "INDEX", "HOST", "STATE", "LAST_HB", "DATA/GRPC", "HTTP");
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  std::map<uint32_t, uint64_t> bytes_by_owner;
  for (const auto& p : v.partitions()) bytes_by_owner[p.owner()] += p.length() * 4;
  for (const auto& n : v.members()) {
    const std::string addr = n.data_address().empty() ? n.grpc_address() : n.data_address();
    out << absl::StrFormat("%-5d %-8s %-5d %-16s %-9s %-8s %-22s %d\n", n.id(),
                           RoleName(n.role()), n.index(), n.host(), StateName(n.state()),
                           absl::StrFormat("%.1fs", (now_ms - n.last_heartbeat_unix_ms()) / 1000.0),
                           addr.empty() ? "-" : addr, n.http_port());
  }
  out << absl::StrFormat("\n%-9s %-12s %-10s %-10s %s\n", "PARTITION", "TABLE", "OFFSET",
                         "LENGTH", "OWNER");
  for (const auto& p : v.partitions()) {
    const std::string table =
        p.table_id() < static_cast<uint32_t>(v.tables_size()) ? v.tables(p.table_id()).name() : "?";
    out << absl::StrFormat("%-9d %-12s %-10d %-10d %d\n", p.id(), table, p.offset(),
                           p.length(), p.owner());
  }
  if (!j.workers().empty()) {
    out << absl::StrFormat("\n%-7s %-5s %-6s %-8s %-10s %-10s %-8s %s\n", "WORKER", "NODE",
                           "EPOCH", "STEP", "SAMPLES", "SAMPLES/S", "LOSS", "COMM");
    for (const auto& w : j.workers()) {
      out << absl::StrFormat("%-7d %-5d %-6d %-8d %-10d %-10.0f %-8.4f %.0f%%\n", w.index(),
                             w.node_id(), w.epoch() + 1, w.step(), w.samples(),
                             w.samples_per_sec(), w.loss(), 100 * w.comm_share());
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

size_t OnHttpBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// GET http://host:port/path; the body of a 200, else an error naming the URL.
absl::StatusOr<std::string> HttpGet(const std::string& url, double timeout_seconds = 5) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_seconds * 1000));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnHttpBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  const CURLcode rc = curl_easy_perform(curl);
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": ", curl_easy_strerror(rc)));
  }
  if (code != 200) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": HTTP ", code, ": ", body));
  }
  return body;
}

std::string NodeUrl(const proto::NodeInfo& n, const std::string& path) {
  const bool v6 = n.host().find(':') != std::string::npos;
  return absl::StrCat("http://", v6 ? "[" : "", n.host(), v6 ? "]" : "", ":", n.http_port(), path);
}

// The newest instance of "role-index" ("worker-1", "master"), or of node id N.
const proto::NodeInfo* FindNode(const proto::GetStatusResponse& st, const std::string& name) {
  const proto::NodeInfo* found = nullptr;
  uint32_t id = 0;
  const bool by_id = absl::SimpleAtoi(name, &id);
  for (const auto& m : st.view().members()) {
    const std::string full = absl::StrCat(RoleName(m.role()), "-", m.index());
    const bool match = by_id ? m.id() == id
                             : full == name || (m.role() == proto::MASTER && name == "master");
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
  if (n.http_port() <= 0 || n.state() == proto::DEAD) return m;
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
  if (f.count("iterations") && (!absl::SimpleAtoi(f.at("iterations"), &iterations) ||
                                iterations < 0)) {
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
    std::map<uint32_t, MetricsSample> now;
    for (const auto& n : st->view().members()) now[n.id()] = ScrapeNode(n);
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
        const std::string name = absl::StrCat(RoleName(n.role()), "-", n.index());
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
          auto col = [](double v, const char* fmt) {
            return v < 0 ? std::string("-") : absl::StrFormat(fmt, v);
          };
          absl::StrAppendFormat(&rows, "%-11s %-16s %-8s %8s %10s %9s %9s %6s %9s\n", name,
                                n.host(), b.ok ? StateName(n.state()) : "no-http",
                                col(steps, "%.1f"), col(samples, "%.0f"),
                                col(push < 0 ? -1 : push / 1e9, "%.3f"),
                                col(pull < 0 ? -1 : pull / 1e9, "%.3f"),
                                col(comm < 0 ? -1 : comm * 100, "%.0f%%"),
                                col(mem < 0 ? -1 : mem / 1048576, "%.0fM"));
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
                               "STATE", "STEPS/S", "SAMPLES/S", "PUSH GB/s", "PULL GB/s",
                               "COMM", "MEMORY")
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
  auto stub = proto::Master::NewStub(grpc::CreateChannel(master, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(900)));
  proto::StopRequest req;
  req.set_reason(f.count("reason") ? f.at("reason") : "strata stop");
  req.set_no_checkpoint(f.count("no-checkpoint") > 0);
  proto::StopResponse resp;
  absl::Status s = FromGrpcStatus(stub->Stop(&ctx, req, &resp), "master " + master);
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
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout);
  absl::Status last;
  while (absl::Now() < deadline) {
    auto st = FetchStatus(it->second);
    if (st.ok()) {
      const std::string& state = st->job().state();
      if (state == "succeeded" || state == "failed" || state == "stopped") {
        out << "job " << st->job().name() << " " << state
            << (st->job().message().empty() ? "" : ": " + st->job().message()) << "\n";
        return state == "succeeded" ? 0 : 1;
      }
    } else {
      last = st.status();
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  err << "strata wait: timed out after " << timeout << " s"
      << (last.ok() ? "" : absl::StrCat(" (last error: ", last.message(), ")")) << "\n";
  return 1;
}

int Validate(const std::map<std::string, std::string>& f, std::ostream& out, std::ostream& err) {
  if (!f.count("config")) {
    err << "strata validate: --config FILE is required\n";
    return 2;
  }
  auto cfg = LoadJobConfig(f.at("config"));
  if (!cfg.ok()) {
    err << cfg.status().message() << "\n";
    return 2;
  }
  uint64_t params = 0;
  std::string sparse;
  for (const auto& t : ModelTables(cfg->model)) {
    params += t.num_elements();
    if (t.sparse) absl::StrAppend(&sparse, sparse.empty() ? "" : ", ", t.name, " (dim ", t.dim, ")");
  }
  out << f.at("config") << ": ok (job '" << cfg->job.name << "', "
      << ConsistencyName(cfg->job.consistency) << ", " << params << " dense parameters"
      << (sparse.empty() ? "" : absl::StrCat("; sparse tables ", sparse, " in ",
                                             cfg->sparse.partitions, " partitions each"))
      << ")\n";
  if (f.count("hosts")) {
    auto hosts = LoadHostFile(f.at("hosts"));
    if (!hosts.ok()) {
      err << hosts.status().message() << "\n";
      return 2;
    }
    out << f.at("hosts") << ": ok (" << hosts->hosts.size() << " host(s), "
        << hosts->total_pservers() << " pserver(s), " << hosts->total_workers()
        << " worker(s))\n";
  }
  return 0;
}

// What a process of this job registers with the NIC: a worker its
// parameter and gradient tensors (a pserver at most one copy of the model
// plus its state, so this bounds both roles), plus each connection's send
// and receive slots, (recv_slots + 4 + send_slots) * slot_kib, for every
// peer: the larger of the pserver and worker counts of --hosts, or 16.
constexpr int kDefaultRdmaPeers = 16;

int Doctor(const std::map<std::string, std::string>& f, std::ostream& out, std::ostream& err) {
  transport::rdma::RdmaSettings settings;
  RdmaSection rdma;  // the defaults, unless --config says otherwise
  uint64_t tensors = 0;
  if (f.count("config")) {
    auto cfg = LoadJobConfig(f.at("config"));
    if (!cfg.ok()) {
      err << cfg.status().message() << "\n";
      return 2;
    }
    rdma = cfg->cluster.rdma;
    uint64_t params = 0;
    for (const auto& t : ModelTables(cfg->model)) params += t.num_elements();
    tensors = 2 * params * sizeof(float);
  }
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
  const uint64_t per_connection =
      uint64_t(rdma.recv_slots + 4 + rdma.send_slots) * (uint64_t(rdma.slot_kib) << 10);
  const uint64_t register_bytes = tensors + per_connection * uint64_t(std::max(peers, 1));
  auto devices = transport::rdma::ListRdmaDevices();
  if (!devices.ok()) {
    err << "strata doctor: " << devices.status().message() << "\n";
    return 1;
  }
  const transport::rdma::PreflightReport report = transport::rdma::RdmaPreflight(
      *devices, settings, transport::rdma::MemlockLimitBytes(), register_bytes);
  out << transport::rdma::FormatRdmaDoctorReport(*devices, report);
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
      d.push_back({"pserver", pi, h.host, p.pserver + pi, p.pserver_data + pi, p.pserver_http + pi});
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
  for (const PlannedDaemon& d : plan->second) {
    out << d.role << " " << d.index << " " << d.host << " " << port(d.port) << " "
        << port(d.data_port) << " " << port(d.http_port) << "\n";
  }
  return 0;
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
  out << "# Prometheus configuration for Strata job '" << job << "', from "
      << f.at("config") << " and " << f.at("hosts") << "\n"
      << "# (strata prometheus-config). Every daemon's /metrics, labelled by role and index.\n"
      << "global:\n"
      << "  scrape_interval: " << interval << "\n"
      << "  evaluation_interval: " << interval << "\n"
      << "scrape_configs:\n"
      << "  - job_name: strata\n"
      << "    metrics_path: /metrics\n"
      << "    static_configs:\n";
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
  auto stub = proto::Master::NewStub(
      grpc::CreateChannel(it->second, grpc::InsecureChannelCredentials()));
  proto::CheckpointRequest req;
  req.set_reason("request");
  req.set_stop_after(f.count("stop") > 0);
  proto::CheckpointResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(timeout)));
  if (!f.count("json")) out << "checkpointing..." << std::flush;
  absl::Status s = FromGrpcStatus(stub->Checkpoint(&ctx, req, &resp), "master " + it->second);
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
std::unique_ptr<storage::FileSystem> CheckpointFileSystem(const std::map<std::string, std::string>& f,
                                                          const Getenv& getenv,
                                                          const std::string& who,
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
                    std::ostream& out,
                    std::ostream& err) {
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
    out << absl::StrFormat("%-8d %-11s %-8d %-12.2f %-10.2f %-12s %s\n", m->seq(),
                           m->incremental() ? "incremental" : "full", m->step(),
                           m->bytes_written() / 1e6, m->raw_bytes() / 1e6,
                           absl::FormatTime("%m-%d %H:%M:%S",
                                            absl::FromUnixMillis(m->created_unix_ms()),
                                            absl::LocalTimeZone()),
                           m->reason());
  }
  if (f.count("json")) out << json << "]\n";
  return 0;
}

int VerifyCheckpoint(const std::map<std::string, std::string>& f, const Getenv& getenv,
                    std::ostream& out,
                     std::ostream& err) {
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
      auto streams =
          storage::ReadBlockFile(fs.get(), storage::JoinPath(root, file.path()), &file);
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
      for (size_t i = 0; h.row_bytes() >= 8 && i + h.row_bytes() <= recs.size(); i += h.row_bytes()) {
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
    out << absl::StrFormat("{\"dir\": \"%s\", \"ok\": true, \"seq\": %d, \"step\": %d, "
                           "\"files\": %d, \"state_digest\": \"%08x\"}\n",
                           dir, m->seq(), m->step(), files, digest);
    return 0;
  }
  out << absl::StrFormat("%s: ok (%s, job '%s', step %d, %d partitions, %d files checked; "
                         "state digest %08x)\n",
                         dir, m->incremental() ? "incremental" : "full", m->job(), m->step(),
                         m->partitions_size(), files, digest);
  return 0;
}

int ExportCheckpoint(const std::map<std::string, std::string>& f, const Getenv& getenv,
                    std::ostream& out,
                     std::ostream& err) {
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
  out << absl::StrFormat("%s: %s export of %s (job '%s', step %d, %d partitions): %.2f MB\n", dst,
                         m->precision(), dir, m->job(), m->step(), m->partitions_size(),
                         m->bytes_written() / 1e6);
  return 0;
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
  // "checkpoint list|verify": a sub-command before the flags.
  const bool sub = args[0] == "checkpoint" && args.size() > 1 &&
                   (args[1] == "list" || args[1] == "verify" || args[1] == "export");
  // "logs NODE": the node before the flags.
  const bool positional = args[0] == "logs" && args.size() > 1 && args[1].rfind("--", 0) != 0;
  auto flags = ParseFlags(args, sub || positional ? 2 : 1);
  if (!flags.ok()) {
    err << "strata " << args[0] << ": " << flags.status().message() << "\n" << kUsage;
    return 2;
  }
  const std::string& cmd = args[0];
  if (cmd == "status") return Status(*flags, out, err);
  if (cmd == "top") return Top(*flags, out, err);
  if (cmd == "stop") return Stop(*flags, out, err);
  if (cmd == "logs") return Logs(args, *flags, out, err);
  if (cmd == "wait") return Wait(*flags, out, err);
  if (cmd == "validate") return Validate(*flags, out, err);
  if (cmd == "plan") return Plan(*flags, out, err);
  if (cmd == "prometheus-config") return PrometheusConfig(*flags, out, err);
  if (cmd == "doctor") return Doctor(*flags, out, err);
  if (cmd == "checkpoint") {
    const Getenv env = getenv ? getenv : [](const char*) -> const char* { return nullptr; };
    if (sub && args[1] == "list") return ListCheckpoints(*flags, env, out, err);
    if (sub && args[1] == "verify") return VerifyCheckpoint(*flags, env, out, err);
    if (sub && args[1] == "export") return ExportCheckpoint(*flags, env, out, err);
    return TakeCheckpoint(*flags, out, err);
  }
  err << "strata: unknown command '" << cmd << "'\n" << kUsage;
  return 2;
}

}  // namespace strata::tools
