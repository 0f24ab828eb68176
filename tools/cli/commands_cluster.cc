// strata status, top, logs, drain, stop, wait: the commands that call the
// master of a running cluster.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/proto_names.h"
#include "common/threads.h"
#include "proto/strata.grpc.pb.h"
#include "tools/cli.h"
#include "tools/cli/commands.h"

namespace strata::tools {

std::string JobProgressLine(const proto::JobStatus& j) {
  std::string s = absl::StrFormat("epoch %d/%d  step %d  tasks %d/%d  samples/s %.0f  loss %.4f",
                                  std::min(j.epoch() + 1, j.epochs()), j.epochs(), j.steps(),
                                  j.tasks_done(), j.tasks_total(), j.samples_per_sec(), j.loss());
  if (j.train_accuracy() > 0) absl::StrAppendFormat(&s, "  accuracy %.3f", j.train_accuracy());
  if (j.has_test_accuracy()) absl::StrAppendFormat(&s, "  test accuracy %.4f", j.test_accuracy());
  if (j.comm_share() > 0) absl::StrAppendFormat(&s, "  comm %.0f%%", 100 * j.comm_share());
  if (j.job_state() == proto::JOB_EVALUATING) {
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

namespace cli {
namespace {

// `masters`: each master of a list and what it is (ClusterAccess::Masters),
// or none for one master.
std::string StatusText(const proto::GetStatusResponse& st,
                       const std::vector<ClusterAccess::MasterRole>& masters) {
  std::ostringstream out;
  const proto::JobStatus& j = st.job();
  out << absl::StrFormat(
      "job %s: %s%s  (%s)\n  epoch %d/%d  tasks %d/%d  steps %d  samples %d  "
      "samples/s %.0f  loss %.4f  comm %.0f%%  wall %.1fs  test accuracy %s\n",
      j.name(), j.state(), j.message().empty() ? "" : " - " + j.message(), j.consistency(),
      std::min(j.epoch() + 1, j.epochs()), j.epochs(), j.tasks_done(), j.tasks_total(), j.steps(),
      j.samples(), j.samples_per_sec(), j.loss(), 100 * j.comm_share(), j.wall_seconds(),
      j.has_test_accuracy() ? absl::StrFormat("%.4f", j.test_accuracy()) : "-");
  if (j.job_state() == proto::JOB_WAITING && !j.phase().empty())
    out << "  bring-up: " << j.phase() << "\n";
  if (!j.security().empty()) {
    out << "  security: "
        << (absl::StartsWith(j.security(), "mtls") ? j.security()
                                                   : "PLAINTEXT - no TLS, no authentication")
        << "\n";
  }
  if (!j.audit_head().empty()) {
    out << absl::StrFormat("  audit log: %d records, head %s\n", j.audit_records(), j.audit_head());
  }
  if (!masters.empty()) {
    out << "  masters:";
    for (size_t i = 0; i < masters.size(); ++i) {
      out << (i == 0 ? " " : ", ") << masters[i].address << " " << masters[i].role;
    }
    out << "\n";
  }
  out << absl::StrFormat("  scale: %d worker(s), %d pserver(s) wanted; %s%s\n", j.workers_target(),
                         j.pservers_target(), j.autoscale(),
                         j.scaling().empty() ? "" : "; in progress: " + j.scaling());
  if (j.moves_in_progress() + j.moves_waiting() > 0 || j.moves_done() > 0) {
    out << absl::StrFormat("  partition moves: %d under way, %d waiting, %d done (%.1f MiB)\n",
                           j.moves_in_progress(), j.moves_waiting(), j.moves_done(),
                           static_cast<double>(j.moved_bytes()) / (1 << 20));
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
  return out.str();
}

// One daemon's counters and gauges from its /metrics, by series name
// (labels dropped: the series top reads have none).
struct MetricsSample {
  absl::Time at;
  std::map<std::string, double> values;
  bool ok = false;
};

MetricsSample ScrapeNode(const ClusterAccess& cluster, const proto::NodeInfo& n) {
  MetricsSample m;
  m.at = absl::Now();
  if (n.http_port() <= 0 || n.state() == proto::DEAD || n.state() == proto::DRAINED) return m;
  auto body = cluster.HttpGet(cluster.NodeUrl(n, "/metrics"), 2);
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

// Every node's metrics at once (a hung one costs its 2 s timeout once per
// frame, not once per node); where no thread can start, one after another.
std::map<uint32_t, MetricsSample> ScrapeAll(const ClusterAccess& cluster,
                                            const proto::GetStatusResponse& st) {
  std::vector<const proto::NodeInfo*> nodes;
  for (const auto& n : st.view().members()) nodes.push_back(&n);
  std::vector<MetricsSample> samples(nodes.size());
  std::vector<std::thread> scrapers;
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto scrape = [&, i] { samples[i] = ScrapeNode(cluster, *nodes[i]); };
    if (!TryAddThread(&scrapers, scrape)) scrape();
  }
  for (auto& t : scrapers) t.join();
  std::map<uint32_t, MetricsSample> now;
  for (size_t i = 0; i < nodes.size(); ++i) now[nodes[i]->id()] = std::move(samples[i]);
  return now;
}

// One node's line of `strata top`; -1: unknown.
struct TopRow {
  uint32_t id = 0;
  std::string name, host;
  const char* state = "?";
  bool up = false;  // its /metrics answered
  double steps = -1, samples = -1, push = -1, pull = -1, comm = -1, mem = -1;
};

TopRow MakeTopRow(const proto::NodeInfo& n, const MetricsSample& a, const MetricsSample& b) {
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
  TopRow r;
  r.id = n.id();
  r.name = NodeName(n);
  r.host = n.host();
  r.state = StateName(n.state());
  r.up = b.ok;
  if (n.role() == proto::WORKER) {
    r.steps = rate("strata_worker_steps");
    r.samples = rate("strata_worker_samples");
    r.push = rate("strata_worker_push_bytes_total");
    r.pull = rate("strata_worker_pull_bytes_total");
    r.comm = gauge("strata_worker_comm_share");
  } else if (n.role() == proto::PSERVER) {
    r.push = rate("strata_pserver_bytes_received_total");  // pushes in
    r.pull = rate("strata_pserver_bytes_sent_total");      // pulls out
  }
  r.mem = gauge("process_resident_memory_bytes");
  return r;
}

std::string TopText(const proto::JobStatus& job, const std::vector<TopRow>& rows, double interval,
                    bool tty) {
  // v with `decimals` digits and `unit` after it; "-" when unknown.
  auto col = [](double v, int decimals, const char* unit = "") {
    return v < 0 ? std::string("-") : absl::StrFormat("%.*f%s", decimals, v, unit);
  };
  std::string s = absl::StrFormat(
      "%sstrata top: job %s %s, epoch %d/%d, step %d, %.0f samples/s, comm %.0f%%  "
      "(every %g s)\n",
      tty ? "\x1b[H\x1b[2J" : "", job.name(), job.state(), job.epoch() + 1, job.epochs(),
      job.steps(), job.samples_per_sec(), job.comm_share() * 100, interval);
  constexpr char kRow[] = "%-11s %-16s %-8s %8s %10s %9s %9s %6s %9s\n";
  absl::StrAppendFormat(&s, kRow, "NODE", "HOST", "STATE", "STEPS/S", "SAMPLES/S", "PUSH GB/s",
                        "PULL GB/s", "COMM", "MEMORY");
  for (const TopRow& r : rows) {
    absl::StrAppendFormat(
        &s, kRow, r.name, r.host, r.up ? r.state : "no-http", col(r.steps, 1), col(r.samples, 0),
        col(r.push < 0 ? -1 : r.push / 1e9, 3), col(r.pull < 0 ? -1 : r.pull / 1e9, 3),
        col(r.comm < 0 ? -1 : r.comm * 100, 0, "%"), col(r.mem < 0 ? -1 : r.mem / 1048576, 0, "M"));
  }
  return tty ? s : s + "\n";
}

// A frame of `strata top`: the job's figures and a row per node.
CliResult TopFrame(const proto::JobStatus& job, std::vector<TopRow> rows, double interval,
                   bool tty) {
  JsonValue nodes = JsonValue::Array();
  for (const TopRow& r : rows) {
    nodes.Append(JsonValue::Object()
                     .Set("node", JsonValue::Int(r.id))
                     .Set("name", JsonValue::String(r.name))
                     .Set("host", JsonValue::String(r.host))
                     .Set("state", JsonValue::String(r.state))
                     .Set("up", JsonValue::Bool(r.up))
                     .Set("steps_per_sec", JsonValue::Fixed(r.steps, 3))
                     .Set("samples_per_sec", JsonValue::Fixed(r.samples, 3))
                     .Set("push_gb_per_sec", JsonValue::Fixed(r.push / 1e9, 6))
                     .Set("pull_gb_per_sec", JsonValue::Fixed(r.pull / 1e9, 6))
                     .Set("comm_share", JsonValue::Fixed(r.comm, 4))
                     .Set("memory_bytes", JsonValue::Fixed(r.mem, 0)));
  }
  CliResult frame;
  frame.data = JsonValue::Object()
                   .Set("time_unix_ms", JsonValue::Int(absl::ToUnixMillis(absl::Now())))
                   .Set("job", JsonValue::String(job.name()))
                   .Set("state", JsonValue::String(job.state()))
                   .Set("step", JsonValue::Int(job.steps()))
                   .Set("samples_per_sec", JsonValue::Fixed(job.samples_per_sec(), 2))
                   .Set("comm_share", JsonValue::Fixed(job.comm_share(), 4))
                   .Set("nodes", std::move(nodes));
  frame.text = [job, rows = std::move(rows), interval, tty] {
    return TopText(job, rows, interval, tty);
  };
  return frame;
}

}  // namespace

CliResult Status(const Invocation& in) {
  if (!in.flags.count("master")) {
    return Failure(2, "strata status: --master HOST:PORT is required");
  }
  // A list of masters (a leader and standbys): each asked what it is, the
  // leader's answer kept for the status.
  const std::string& master = in.flags.at("master");
  std::vector<ClusterAccess::MasterRole> masters;
  std::optional<proto::GetStatusResponse> answered;
  absl::StatusOr<proto::GetStatusResponse> st;
  if (master.find(',') == std::string::npos) {
    st = in.cluster.FetchStatus(master);
  } else {
    masters = in.cluster.Masters(master, &answered);
    std::string named;  // the leader a standby named, when none answered as one
    for (const auto& m : masters) {
      if (!m.leader.empty()) named = m.leader;
    }
    if (answered.has_value()) {
      st = *std::move(answered);
    } else if (!named.empty() && named.find(',') == std::string::npos) {
      st = in.cluster.FetchStatus(named);  // (one address: asked directly)
    } else {
      std::string seen;
      for (const auto& m : masters)
        absl::StrAppend(&seen, seen.empty() ? "" : ", ", m.address, " ", m.role);
      st = absl::UnavailableError(absl::StrCat("no master leads now: ", seen));
    }
  }
  if (!st.ok()) return Failure(1, absl::StrCat("strata status: ", st.status().message()));
  CliResult r;
  r.data = JsonValue::FromProto(*st);
  r.text = [st = *std::move(st), masters = std::move(masters)] { return StatusText(st, masters); };
  return r;
}

// strata logs NODE: the node's recent log lines, from its /logs.
CliResult Logs(const Invocation& in) {
  const Flags& f = in.flags;
  if (in.args.size() < 2 || in.args[1].rfind("--", 0) == 0 || !f.count("master")) {
    return Failure(2,
                   "strata logs: usage: strata logs NODE --master HOST:PORT [--lines N]\n"
                   "  NODE: master, pserver-I, worker-I or a node id");
  }
  const std::string& node = in.args[1];
  int lines = 200;
  if (f.count("lines") && (!absl::SimpleAtoi(f.at("lines"), &lines) || lines < 0)) {
    return Failure(2, "strata logs: --lines must be a number >= 0");
  }
  auto st = in.cluster.FetchStatus(f.at("master"));
  if (!st.ok()) return Failure(1, absl::StrCat("strata logs: ", st.status().message()));
  const proto::NodeInfo* n = FindNode(*st, node);
  if (n == nullptr) {
    return Failure(
        1, absl::StrCat("strata logs: no node ", node, " in the cluster of master ", f.at("master"),
                        " (names: master, pserver-I, worker-I, or a node id)"));
  }
  if (n->http_port() <= 0) {
    return Failure(1, absl::StrCat("strata logs: ", node, " serves no HTTP port"));
  }
  auto body = in.cluster.HttpGet(in.cluster.NodeUrl(*n, absl::StrCat("/logs?lines=", lines)));
  if (!body.ok()) {
    return Failure(1, absl::StrCat("strata logs: ", node, " (node ", n->id(), ", ",
                                   StateName(n->state()), "): ", body.status().message()));
  }
  JsonValue json_lines = JsonValue::Array();
  for (absl::string_view line : absl::StrSplit(*body, '\n', absl::SkipEmpty())) {
    json_lines.Append(JsonValue::String(line));
  }
  CliResult r = TextResult(*std::move(body));
  r.data = JsonValue::Object()
               .Set("node", JsonValue::String(NodeName(*n)))
               .Set("node_id", JsonValue::Int(n->id()))
               .Set("state", JsonValue::String(StateName(n->state())))
               .Set("lines", std::move(json_lines));
  return r;
}

// strata top: per node, refreshed: steps/s, samples/s, push and pull GB/s,
// comm share, memory. Each frame is a result of its own.
CliResult Top(const Invocation& in) {
  const Flags& f = in.flags;
  if (!f.count("master")) return Failure(2, "strata top: --master HOST:PORT is required");
  double interval = 2;
  int iterations = 0;
  if (f.count("interval") && (!absl::SimpleAtod(f.at("interval"), &interval) || interval <= 0)) {
    return Failure(2, "strata top: --interval must be a number of seconds > 0");
  }
  if (f.count("iterations") &&
      (!absl::SimpleAtoi(f.at("iterations"), &iterations) || iterations < 0)) {
    return Failure(2, "strata top: --iterations must be a number >= 0 (0: until interrupted)");
  }
  const bool tty = !in.json && IsTerminal(in.out);
  std::map<uint32_t, MetricsSample> before;
  for (int frame = 0; iterations == 0 || frame <= iterations; ++frame) {
    auto st = in.cluster.FetchStatus(f.at("master"));
    if (!st.ok()) return Failure(1, absl::StrCat("strata top: ", st.status().message()));
    std::map<uint32_t, MetricsSample> now = ScrapeAll(in.cluster, *st);
    // The first scrape is only a baseline for the rates.
    if (frame > 0) {
      std::vector<TopRow> rows;
      for (const auto& n : st->view().members()) {
        rows.push_back(MakeTopRow(n, before[n.id()], now[n.id()]));
      }
      PrintReport(TopFrame(st->job(), std::move(rows), interval, tty), in.json, in.out);
    }
    before = std::move(now);
    if (iterations != 0 && frame == iterations) break;
    absl::SleepFor(absl::Seconds(interval));
  }
  return CliResult();
}

// strata stop: the job stops (after a checkpoint when checkpoints are on).
CliResult Stop(const Invocation& in) {
  const Flags& f = in.flags;
  if (!f.count("master")) return Failure(2, "strata stop: --master HOST:PORT is required");
  const std::string& master = f.at("master");
  auto stub = proto::Master::NewStub(in.cluster.Channel(master));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(900)));
  proto::StopRequest req;
  req.set_reason(FlagOr(f, "reason", "strata stop"));
  req.set_no_checkpoint(f.count("no-checkpoint") > 0);
  proto::StopResponse resp;
  absl::Status s = in.cluster.FromCall(stub->Stop(&ctx, req, &resp), "master " + master);
  if (!s.ok()) return Failure(1, absl::StrCat("strata stop: ", s.message()));
  CliResult r;
  r.data = JsonValue::FromProto(resp);
  r.text = [resp] {
    if (!resp.checkpointed()) return std::string("job stopped (no checkpoint)\n");
    return absl::StrCat("job stopped after checkpoint ", resp.checkpoint().seq(), " (",
                        resp.checkpoint().dir(), ", step ", resp.checkpoint().step(), ")\n");
  };
  return r;
}

namespace {

// The node `drain` took out, while it leaves.
struct Draining {
  std::string master;
  std::string name;
  proto::Role role;
  proto::NodeInfo node;  // as last seen
  std::string message;   // the master's answer to Drain
  bool wait = true;      // not --no-wait
  double timeout = 600;  // seconds
};

// Waits until d's node has left (a line redrawn on a terminal with the
// time waited); the result of `strata drain`.
CliResult WaitUntilDrained(const Invocation& in, Draining d) {
  const absl::Time start = absl::Now();
  const bool tty = !in.json && IsTerminal(in.out);
  const uint32_t id = d.node.id();
  auto end_line = [&] {
    if (tty) in.out << "\n";
  };
  while (d.wait && d.node.state() != proto::DRAINED) {
    if (absl::Now() - start > absl::Seconds(d.timeout)) {
      end_line();
      return Failure(
          1, absl::StrCat("strata drain: ", d.name, " has not left after ", d.timeout, " s (state ",
                          StateName(d.node.state()), d.node.draining() ? ", draining" : "", ")"));
    }
    absl::SleepFor(absl::Milliseconds(250));
    auto now = in.cluster.FetchStatus(d.master);
    if (!now.ok()) continue;  // (a master restarting)
    const proto::NodeInfo* m = nullptr;
    for (const auto& x : now->view().members())
      if (x.id() == id) m = &x;
    if (m == nullptr) break;
    d.node = *m;
    if (d.node.state() == proto::DEAD) {
      end_line();
      return Failure(1, absl::StrCat("strata drain: ", d.name,
                                     " died before it had drained (see strata logs ", d.name, ")"));
    }
    const std::string& job = now->job().state();  // (its name)
    if (d.node.state() != proto::DRAINED && IsJobOver(now->job().job_state())) {
      end_line();
      CliResult r =
          TextResult(absl::StrCat("the job ended (", job, ") while ", d.name, " was draining\n"));
      r.data = JsonValue::Object()
                   .Set("node", JsonValue::String(d.name))
                   .Set("node_id", JsonValue::Int(id))
                   .Set("state", JsonValue::String(StateName(d.node.state())))
                   .Set("draining", JsonValue::Bool(true))
                   .Set("job_state", JsonValue::String(job));
      return r;
    }
    if (tty) {
      in.out << absl::StrFormat("\r%s: %s (%.0f s)", d.name,
                                d.role == proto::PSERVER
                                    ? "leaving, waiting for its partitions to move"
                                    : "draining, waiting for it to finish its data task",
                                absl::ToDoubleSeconds(absl::Now() - start))
             << std::flush;
    }
  }
  const double waited = absl::ToDoubleSeconds(absl::Now() - start);
  end_line();
  CliResult r;
  r.data = JsonValue::Object()
               .Set("node", JsonValue::String(d.name))
               .Set("node_id", JsonValue::Int(id))
               .Set("state", JsonValue::String(StateName(d.node.state())))
               .Set("draining", JsonValue::Bool(d.node.draining()))
               .Set("waited_seconds", JsonValue::Fixed(waited, 3))
               .Set("message", JsonValue::String(d.message));
  r.text = [d, waited] {
    if (d.node.state() != proto::DRAINED || !d.wait) return std::string();
    // (A pserver is out of the job at once; its process follows at its
    // next heartbeat.)
    if (d.role == proto::PSERVER) {
      return absl::StrFormat("%s (node %d) is out of the job; its process exits\n", d.name,
                             d.node.id());
    }
    return absl::StrFormat("%s (node %d) has left the job (%.1f s)\n", d.name, d.node.id(), waited);
  };
  return r;
}

}  // namespace

// strata drain NODE: the master takes the node out of the job; then, unless
// --no-wait, wait until it has left (a worker finishes its data task first).
CliResult Drain(const Invocation& in) {
  const Flags& f = in.flags;
  if (in.args.size() < 2 || in.args[1].rfind("--", 0) == 0 || !f.count("master")) {
    return Failure(2,
                   "strata drain: usage: strata drain NODE --master HOST:PORT [--no-wait] "
                   "[--timeout SECONDS] [--reason TEXT] [--json]\n"
                   "  NODE: pserver-I, worker-I or a node id");
  }
  Draining d;
  d.master = f.at("master");
  d.wait = !f.count("no-wait");
  if (f.count("timeout") && (!absl::SimpleAtod(f.at("timeout"), &d.timeout) || d.timeout < 0)) {
    return Failure(2, "strata drain: --timeout must be a number of seconds");
  }
  auto st = in.cluster.FetchStatus(d.master);
  if (!st.ok()) return Failure(1, absl::StrCat("strata drain: ", st.status().message()));
  const proto::NodeInfo* n = FindNode(*st, in.args[1]);
  if (n == nullptr) {
    return Failure(1,
                   absl::StrCat("strata drain: no node ", in.args[1], " in the cluster of master ",
                                d.master, " (names: pserver-I, worker-I, or a node id)"));
  }
  d.role = n->role();
  d.name = NodeName(*n);
  auto stub = proto::Master::NewStub(in.cluster.Channel(d.master));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  proto::DrainRequest req;
  req.set_node_id(n->id());
  req.set_reason(FlagOr(f, "reason", "strata drain"));
  proto::DrainResponse resp;
  absl::Status s = in.cluster.FromCall(stub->Drain(&ctx, req, &resp), "master " + d.master);
  if (!s.ok()) return Failure(1, absl::StrCat("strata drain: ", s.message()));
  if (!in.json) in.out << resp.message() << "\n" << std::flush;
  d.message = resp.message();
  d.node = resp.node();
  return WaitUntilDrained(in, std::move(d));
}

namespace {

// The job's name and state (and message), the result of `strata wait`.
CliResult JobStateResult(const proto::JobStatus& job, bool with_message, int exit_code) {
  CliResult r;
  r.exit_code = exit_code;
  r.data = JsonValue::Object()
               .Set("job", JsonValue::String(job.name()))
               .Set("state", JsonValue::String(job.state()));
  if (with_message) r.data->Set("message", JsonValue::String(job.message()));
  r.text = [job, with_message] {
    if (!with_message) return absl::StrCat("job ", job.name(), " is ", job.state(), "\n");
    return absl::StrCat("job ", job.name(), " ", job.state(),
                        job.message().empty() ? "" : ": " + job.message(), "\n");
  };
  return r;
}

}  // namespace

CliResult Wait(const Invocation& in) {
  const Flags& f = in.flags;
  if (!f.count("master")) return Failure(2, "strata wait: --master HOST:PORT is required");
  double timeout = 3600;
  if (f.count("timeout") && !absl::SimpleAtod(f.at("timeout"), &timeout)) {
    return Failure(2, "strata wait: --timeout must be a number of seconds");
  }
  // --until running: bring-up only (exit 0 once the job runs); its
  // progress is shown (as with --progress for the whole job).
  const std::string until = FlagOr(f, "until", "end");
  if (until != "end" && until != "running") {
    return Failure(2, "strata wait: --until must be 'running' or 'end'");
  }
  // --progress-only: the job's progress line alone, until the job ends
  // (launch.sh shows it while another `strata wait` reports the end).
  const bool only = f.count("progress-only") > 0;
  const bool progress = (until == "running" || f.count("progress") || only) && !in.json;
  // The job's progress line, once training runs: every --every seconds (3
  // by default), or with --redraw (a terminal) redrawn in place twice a
  // second.
  const bool redraw = f.count("redraw") > 0;
  double every = redraw ? 0.5 : 3;
  if (f.count("every") && (!absl::SimpleAtod(f.at("every"), &every) || every <= 0)) {
    return Failure(2, "strata wait: --every must be a positive number of seconds");
  }
  std::ostream& out = in.out;
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
    auto st = in.cluster.FetchStatus(f.at("master"));
    if (!st.ok()) {
      last = st.status();
      absl::SleepFor(absl::Milliseconds(250));
      continue;
    }
    const proto::JobState state = st->job().job_state();
    const bool training = state == proto::JOB_RUNNING || state == proto::JOB_EVALUATING;
    if (progress && !only && st->job().phase() != shown &&
        (state == proto::JOB_WAITING || (until == "end" && training))) {
      shown = st->job().phase();
      // (A phase's own figures change all the time: a line per phase.)
      end_drawn();
      out << (state == proto::JOB_WAITING ? "bring-up: " : "progress: ") << shown << "\n"
          << std::flush;
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
    if (only && IsJobOver(state)) {
      end_drawn();
      CliResult r;
      r.exit_code = state == proto::JOB_SUCCEEDED ? 0 : 1;
      return r;
    }
    if (until == "running" && training) return JobStateResult(st->job(), false, 0);
    if (IsJobOver(state)) {
      end_drawn();
      return JobStateResult(st->job(), true, state == proto::JOB_SUCCEEDED ? 0 : 1);
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  end_drawn();
  return Failure(
      1, absl::StrCat("strata wait: timed out after ", timeout, " s",
                      last.ok() ? "" : absl::StrCat(" (last error: ", last.message(), ")")));
}

}  // namespace cli
}  // namespace strata::tools
