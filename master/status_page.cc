#include "master/status_page.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json.h"
#include "common/proto_names.h"

namespace strata::master {
namespace {

// Partition rows shown before the table is cut short (a sparse table may
// have thousands of virtual partitions; /status has them all).
constexpr int kMaxPartitionRows = 200;
constexpr int kMaxEvents = 50;

const char* StateText(proto::NodeState s) {
  switch (s) {
    case proto::ALIVE:
      return "alive";
    case proto::DEAD:
      return "dead";
    case proto::DRAINED:
      return "drained";
    case proto::FINISHED:
      return "finished";
    default:  // (JOINING: registered while the job runs, not yet training)
      return "joining";
  }
}

// A step of 1, 2 or 5 times a power of ten giving about `target` steps
// over `range`.
double NiceStep(double range, int target) {
  if (!(range > 0)) return 1;
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

// A value on an axis whose ticks are `step` apart: as many decimals as the
// step needs, thousands as k and millions as M.
std::string TickLabel(double v, double step) {
  const double a = std::abs(v);
  if (a >= 1e6 && step >= 1e5) return absl::StrFormat("%gM", std::round(v / 1e5) / 10);
  if (a >= 1e3 && step >= 100) return absl::StrFormat("%gk", std::round(v / 100) / 10);
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return absl::StrFormat("%.*f", std::min(decimals, 6), v);
}

// Seconds on the time axis: 45s, 12m, 1.5h.
std::string TimeLabel(double s) {
  if (s < 60) return absl::StrFormat("%gs", std::round(s * 10) / 10);
  if (s < 3600) return absl::StrFormat("%gm", std::round(s / 6) / 10);
  return absl::StrFormat("%gh", std::round(s / 360) / 10);
}

// A step for the time axis that falls on round seconds, minutes or hours.
double TimeStep(double range) {
  static const double kSteps[] = {1,   2,   5,    10,   15,   30,    60,    120,   300,
                                  600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400};
  for (double s : kSteps) {
    if (range / s <= 6) return s;
  }
  return NiceStep(range, 6);
}

std::string FormatValue(double v) {
  const double a = std::abs(v);
  if (a >= 1e6) return absl::StrFormat("%.2fM", v / 1e6);
  if (a >= 1e4) return absl::StrFormat("%.1fk", v / 1e3);
  if (a >= 100) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.4f", v);
}

std::string Duration(double seconds) {
  if (seconds < 120) return absl::StrFormat("%.1f s", seconds);
  if (seconds < 7200) return absl::StrFormat("%.1f min", seconds / 60);
  return absl::StrFormat("%.2f h", seconds / 3600);
}

std::string Cell(absl::string_view text, absl::string_view cls = "") {
  return absl::StrCat(cls.empty() ? "<td>" : absl::StrCat("<td class=\"", cls, "\">"),
                      HtmlEscape(text), "</td>");
}

constexpr absl::string_view kStyle = R"css(
body { font: 14px/1.4 system-ui, sans-serif; margin: 20px 28px; color: #1d2330; background: #f7f8fa; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 22px 0 8px; }
.state { display: inline-block; padding: 1px 8px; border-radius: 10px; font-weight: 600; color: #fff; background: #6b7280; }
.state-running, .state-evaluating { background: #2563eb; }
.state-succeeded { background: #15803d; }
.state-failed { background: #b91c1c; }
.state-stopped, .state-waiting { background: #a16207; }
.warning { background: #fef3c7; border: 1px solid #d97706; border-radius: 6px; padding: 6px 10px; }
.kv { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 6px 18px; margin: 10px 0; }
.kv div { background: #fff; border: 1px solid #e3e6eb; border-radius: 6px; padding: 6px 10px; }
.kv span { display: block; color: #6b7280; font-size: 12px; }
.charts { display: flex; flex-wrap: wrap; gap: 14px; }
.charts svg { background: #fff; border: 1px solid #e3e6eb; border-radius: 6px; }
table { border-collapse: collapse; background: #fff; border: 1px solid #e3e6eb; }
th, td { padding: 4px 10px; border-bottom: 1px solid #eef0f3; text-align: left; white-space: nowrap; }
th { background: #eef1f5; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.alive { color: #15803d; font-weight: 600; }
td.dead { color: #b91c1c; font-weight: 600; }
td.joining, td.draining { color: #a16207; font-weight: 600; }
td.drained, td.finished { color: #6b7280; font-weight: 600; }
.message { color: #b91c1c; font-weight: 600; }
.note { color: #6b7280; }
footer { margin-top: 24px; color: #6b7280; font-size: 12px; }
)css";

std::string JobSection(const proto::JobStatus& j, const proto::ClusterView& view) {
  std::vector<std::pair<std::string, std::string>> kv = {
      {"epoch", absl::StrFormat("%d / %d", std::min(j.epoch() + 1, j.epochs()), j.epochs())},
      {"data tasks",
       absl::StrFormat("%d / %d (%.0f%%)", j.tasks_done(), j.tasks_total(),
                       j.tasks_total() ? 100.0 * j.tasks_done() / j.tasks_total() : 0.0)},
      {"steps", absl::StrCat(j.steps())},
      {"samples", absl::StrCat(j.samples())},
      {"samples/s", FormatValue(j.samples_per_sec())},
      {"training loss", FormatValue(j.loss())},
      {"training accuracy", absl::StrFormat("%.4f", j.train_accuracy())},
      {"comm share", absl::StrFormat("%.0f%%", 100 * j.comm_share())},
      {"wall time", Duration(j.wall_seconds())},
      {"consistency", j.consistency()},
      {"view epoch", absl::StrCat(view.epoch())},
      {"checkpoints", j.checkpoints() == 0
                          ? std::string("none")
                          : absl::StrFormat("%d (last #%d at step %d)", j.checkpoints(),
                                            j.last_checkpoint_seq(), j.last_checkpoint_step())},
  };
  if (j.has_test_accuracy()) {
    kv.emplace_back("test accuracy", absl::StrFormat("%.4f", j.test_accuracy()));
  }
  if (j.has_test_auc()) kv.emplace_back("test AUC", absl::StrFormat("%.4f", j.test_auc()));
  if (j.checkpoint_failures() > 0) {
    kv.emplace_back("checkpoint failures", absl::StrCat(j.checkpoint_failures()));
  }
  if (j.resumed_from_seq() > 0) {
    kv.emplace_back("resumed from", absl::StrCat("checkpoint #", j.resumed_from_seq()));
  }
  if (j.failovers() + j.partitions_restored() + j.tasks_requeued() > 0) {
    kv.emplace_back("recovery",
                    absl::StrFormat("%d failovers, %d restored, %d tasks requeued", j.failovers(),
                                    j.partitions_restored(), j.tasks_requeued()));
  }
  std::string out = "<section id=\"job\"><div class=\"kv\">";
  for (const auto& [k, v] : kv) {
    absl::StrAppend(&out, "<div><span>", HtmlEscape(k), "</span>", HtmlEscape(v), "</div>");
  }
  absl::StrAppend(&out, "</div>");
  if (!j.message().empty()) {
    absl::StrAppend(&out, "<p class=\"message\">", HtmlEscape(j.message()), "</p>");
  }
  absl::StrAppend(&out, "</section>\n");
  return out;
}

std::string ChartsSection(const proto::JobStatus& j) {
  Chart loss{"chart-loss", "Training loss", "#1f77b4", {}, std::nullopt, std::nullopt, ""};
  Chart acc{"chart-accuracy", "Accuracy", "#2ca02c", {}, 1.0, std::nullopt, ""};
  Chart sps{"chart-throughput", "Samples / s", "#d62728", {}, std::nullopt, std::nullopt, ""};
  for (const proto::JobSample& s : j.history()) {
    loss.points.emplace_back(s.t(), s.loss());
    acc.points.emplace_back(s.t(), s.train_accuracy());
    sps.points.emplace_back(s.t(), s.samples_per_sec());
  }
  acc.title = "Training accuracy";
  if (j.has_test_accuracy()) {
    acc.reference = j.test_accuracy();
    acc.reference_label = absl::StrFormat("test %.4f", j.test_accuracy());
  }
  return absl::StrCat("<section id=\"charts\"><h2>Over time</h2><div class=\"charts\">",
                      SvgLineChart(loss), SvgLineChart(acc), SvgLineChart(sps),
                      "</div></section>\n");
}

std::string NodeLabel(const std::map<uint32_t, const proto::NodeInfo*>& nodes, uint32_t id) {
  auto it = nodes.find(id);
  if (it == nodes.end()) return absl::StrCat("node ", id);
  return absl::StrCat(NodeRoleName(it->second->role()), " ", it->second->index(), " (node ", id,
                      ")");
}

std::string NodesSection(const proto::GetStatusResponse& st, int64_t now_ms) {
  std::map<uint32_t, const proto::WorkerProgress*> progress;
  for (const auto& w : st.job().workers()) progress[w.node_id()] = &w;
  std::map<uint32_t, std::pair<int, int>> held;  // pserver -> (primary, backup)
  for (const auto& p : st.view().partitions()) {
    held[p.owner()].first++;
    for (uint32_t b : p.backups()) held[b].second++;
  }
  std::vector<const proto::NodeInfo*> nodes;
  for (const auto& n : st.view().members()) nodes.push_back(&n);
  std::stable_sort(nodes.begin(), nodes.end(), [](const auto* a, const auto* b) {
    return std::make_pair(static_cast<int>(a->role()), a->index()) <
           std::make_pair(static_cast<int>(b->role()), b->index());
  });
  int alive = 0;
  // (A worker with no more data tasks is up too.)
  for (const auto* n : nodes) {
    alive +=
        n->state() == proto::ALIVE || n->state() == proto::FINISHED || n->state() == proto::JOINING;
  }
  std::string out = absl::StrFormat(
      "<section id=\"nodes\"><h2>Nodes <span class=\"note\">%d of %d alive</span></h2>"
      "<table id=\"nodes-table\"><thead><tr><th>role</th><th>index</th><th>node</th>"
      "<th>host</th><th>address</th><th>state</th><th>heartbeat</th><th>work</th>"
      "<th>samples/s</th><th>loss</th><th>comm</th><th>pages</th></tr></thead><tbody>",
      alive, static_cast<int>(nodes.size()));
  for (const proto::NodeInfo* n : nodes) {
    const std::string state = n->draining() ? "draining" : StateText(n->state());
    std::string age = "-";
    if (n->last_heartbeat_unix_ms() > 0) {
      age = absl::StrFormat("%.1f s ago",
                            std::max<int64_t>(0, now_ms - n->last_heartbeat_unix_ms()) / 1000.0);
    }
    std::string address = n->grpc_address();
    if (!n->data_address().empty()) absl::StrAppend(&address, ", data ", n->data_address());
    std::string work = "", rate = "", loss = "", comm = "";
    if (n->role() == proto::PSERVER) {
      const auto& h = held[n->id()];
      work = absl::StrFormat("%d primary, %d backup partitions", h.first, h.second);
    } else if (auto it = progress.find(n->id()); it != progress.end()) {
      const proto::WorkerProgress& w = *it->second;
      work = absl::StrFormat("epoch %d, step %d, %d samples", w.epoch() + 1, w.step(), w.samples());
      rate = FormatValue(w.samples_per_sec());
      loss = FormatValue(w.loss());
      comm = absl::StrFormat("%.0f%%", 100 * w.comm_share());
    }
    std::string pages = "-";
    if (n->http_port() > 0 && !n->host().empty()) {
      const bool v6 = n->host().find(':') != std::string::npos;
      // (An mtls cluster's daemons serve HTTPS only.)
      const bool https = absl::StartsWith(st.job().security(), "mtls");
      const std::string base = absl::StrCat(https ? "https://" : "http://", v6 ? "[" : "",
                                            n->host(), v6 ? "]" : "", ":", n->http_port());
      pages = absl::StrCat("<a href=\"", HtmlEscape(base), "/metrics\">metrics</a> <a href=\"",
                           HtmlEscape(base), "/logs\">logs</a>");
    }
    absl::StrAppend(&out, "<tr class=\"node ", NodeRoleName(n->role()), "\">",
                    Cell(NodeRoleName(n->role())), Cell(absl::StrCat(n->index()), "num"),
                    Cell(absl::StrCat(n->id()), "num"), Cell(n->host()), Cell(address),
                    Cell(state, state), Cell(age, "num"), Cell(work), Cell(rate, "num"),
                    Cell(loss, "num"), Cell(comm, "num"), "<td>", pages, "</td></tr>");
  }
  absl::StrAppend(&out, "</tbody></table></section>\n");
  return out;
}

std::string PartitionsSection(const proto::ClusterView& view) {
  std::map<uint32_t, const proto::NodeInfo*> nodes;
  for (const auto& n : view.members()) nodes[n.id()] = &n;
  std::map<uint32_t, const proto::TableInfo*> tables;
  for (const auto& t : view.tables()) tables[t.id()] = &t;
  std::string out = absl::StrFormat(
      "<section id=\"partitions\"><h2>Partitions <span class=\"note\">%d in %d tables</span>"
      "</h2>",
      view.partitions_size(), view.tables_size());
  if (view.partitions_size() == 0) {
    absl::StrAppend(&out,
                    "<p class=\"note\">not placed yet: waiting for the pservers</p>"
                    "</section>\n");
    return out;
  }
  absl::StrAppend(&out,
                  "<table id=\"partitions-table\"><thead><tr><th>partition</th>"
                  "<th>table</th><th>range</th><th>primary</th><th>backups</th>"
                  "</tr></thead><tbody>");
  int rows = 0;
  for (const proto::PartitionInfo& p : view.partitions()) {
    if (rows++ == kMaxPartitionRows) break;
    auto t = tables.find(p.table_id());
    const bool sparse = t != tables.end() && t->second->sparse();
    const std::string name =
        t == tables.end() ? absl::StrCat("table ", p.table_id()) : t->second->name();
    const std::string range =
        sparse ? absl::StrFormat("hash bucket %d of %d", p.offset(), t->second->partitions())
               : absl::StrFormat("[%d, %d)", p.offset(), p.offset() + p.length());
    std::vector<std::string> backups;
    for (uint32_t b : p.backups()) backups.push_back(NodeLabel(nodes, b));
    absl::StrAppend(&out, "<tr>", Cell(absl::StrCat(p.id()), "num"), Cell(name), Cell(range),
                    Cell(NodeLabel(nodes, p.owner())),
                    Cell(backups.empty() ? "-" : absl::StrJoin(backups, ", ")), "</tr>");
  }
  absl::StrAppend(&out, "</tbody></table>");
  if (view.partitions_size() > kMaxPartitionRows) {
    absl::StrAppend(&out, "<p class=\"note\">", view.partitions_size() - kMaxPartitionRows,
                    " more partitions: see <a href=\"/status\">/status</a></p>");
  }
  absl::StrAppend(&out, "</section>\n");
  return out;
}

std::string EventsSection(const proto::JobStatus& j) {
  if (j.events_size() == 0) return "";
  std::string out = "<section id=\"events\"><h2>Events</h2><ol>";
  const int first = std::max(0, j.events_size() - kMaxEvents);
  for (int i = first; i < j.events_size(); ++i) {
    absl::StrAppend(&out, "<li>", HtmlEscape(j.events(i)), "</li>");
  }
  absl::StrAppend(&out, "</ol></section>\n");
  return out;
}

}  // namespace

std::string HtmlEscape(absl::string_view in) { return MarkupEscape(in); }

std::string SvgLineChart(const Chart& c, int width, int height) {
  const double x0 = 58, x1 = width - 18, y0 = 30, y1 = height - 30;
  std::string out = absl::StrFormat(
      "<svg id=\"%s\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
      "height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\"><title>%s</title>"
      "<text x=\"%g\" y=\"18\" font-size=\"13\" font-weight=\"600\" fill=\"#1d2330\">%s</text>",
      HtmlEscape(c.id), width, height, width, height, HtmlEscape(c.title), x0, HtmlEscape(c.title));
  std::vector<std::pair<double, double>> pts;
  for (const auto& p : c.points) {
    if (std::isfinite(p.first) && std::isfinite(p.second)) pts.push_back(p);
  }
  if (pts.empty()) {
    absl::StrAppend(&out,
                    absl::StrFormat("<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" "
                                    "fill=\"none\" stroke=\"#d0d5dd\"/>"
                                    "<text class=\"empty\" x=\"%g\" y=\"%g\" font-size=\"13\" "
                                    "fill=\"#6b7280\" text-anchor=\"middle\">no data yet</text>",
                                    x0, y0, x1 - x0, y1 - y0, (x0 + x1) / 2, (y0 + y1) / 2),
                    "</svg>");
    return out;
  }
  double t_max = 0, v_max = 0;
  for (const auto& [t, v] : pts) {
    t_max = std::max(t_max, t);
    v_max = std::max(v_max, v);
  }
  if (c.reference.has_value()) v_max = std::max(v_max, *c.reference);
  if (t_max <= 0) t_max = 1;
  double y_top = c.y_max.value_or(0);
  const double y_step = NiceStep(c.y_max.has_value() ? y_top : (v_max > 0 ? v_max : 1), 4);
  if (!c.y_max.has_value()) y_top = y_step * std::ceil((v_max > 0 ? v_max * 1.05 : 1) / y_step);
  const double x_step = TimeStep(t_max);
  const double x_top = x_step * std::ceil(t_max / x_step - 1e-9);
  auto X = [&](double t) { return x0 + (x1 - x0) * t / x_top; };
  auto Y = [&](double v) { return y1 - (y1 - y0) * std::clamp(v / y_top, 0.0, 1.0); };
  // Grid and ticks.
  for (double v = 0; v <= y_top + y_step / 2; v += y_step) {
    absl::StrAppend(
        &out, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                              "stroke=\"#eceef2\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
                              "fill=\"#6b7280\" text-anchor=\"end\">%s</text>",
                              x0, Y(v), x1, Y(v), x0 - 6, Y(v) + 4, TickLabel(v, y_step)));
  }
  for (double t = 0; t <= x_top + x_step / 2; t += x_step) {
    absl::StrAppend(
        &out, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                              "stroke=\"#eceef2\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
                              "fill=\"#6b7280\" text-anchor=\"middle\">%s</text>",
                              X(t), y0, X(t), y1, X(t), y1 + 16, TimeLabel(t)));
  }
  absl::StrAppend(&out, absl::StrFormat("<polyline fill=\"none\" stroke=\"#9aa3b2\" "
                                        "points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\"/>",
                                        x0, y0, x0, y1, x1, y1));
  if (c.reference.has_value()) {
    absl::StrAppend(
        &out, absl::StrFormat("<line class=\"reference\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                              "y2=\"%.1f\" stroke=\"#7c3aed\" stroke-dasharray=\"5 4\"/>"
                              "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#7c3aed\" "
                              "text-anchor=\"end\">%s</text>",
                              x0, Y(*c.reference), x1, Y(*c.reference), x1 - 4, Y(*c.reference) - 5,
                              HtmlEscape(c.reference_label)));
  }
  // The series: a line through the points (a dot when there is one).
  std::vector<std::string> coords;
  for (const auto& [t, v] : pts) coords.push_back(absl::StrFormat("%.1f,%.1f", X(t), Y(v)));
  if (pts.size() == 1) {
    absl::StrAppend(&out, absl::StrFormat("<circle class=\"series\" cx=\"%.1f\" cy=\"%.1f\" "
                                          "r=\"3.5\" fill=\"%s\"/>",
                                          X(pts[0].first), Y(pts[0].second), HtmlEscape(c.color)));
  } else {
    absl::StrAppend(&out, "<polyline class=\"series\" fill=\"none\" stroke=\"", HtmlEscape(c.color),
                    "\" stroke-width=\"2\" stroke-linejoin=\"round\" points=\"",
                    absl::StrJoin(coords, " "), "\"/>");
  }
  absl::StrAppend(&out, absl::StrFormat("<text x=\"%.1f\" y=\"18\" font-size=\"12\" "
                                        "fill=\"%s\" text-anchor=\"end\">now %s</text></svg>",
                                        x1, HtmlEscape(c.color), FormatValue(pts.back().second)));
  return out;
}

std::string RenderStatusPage(const proto::GetStatusResponse& st, int64_t now_unix_ms,
                             int refresh_seconds) {
  const proto::JobStatus& j = st.job();
  const std::string state = j.state().empty() ? "waiting" : j.state();
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">";
  if (refresh_seconds > 0) {
    absl::StrAppend(&out, "<meta http-equiv=\"refresh\" content=\"", refresh_seconds, "\">");
  }
  absl::StrAppend(&out, "<title>Strata: ", HtmlEscape(j.name()), " (", HtmlEscape(state),
                  ")</title><style>", kStyle,
                  "</style></head>\n<body>\n<header><h1>Strata: ", HtmlEscape(j.name()),
                  "</h1><span id=\"job-state\" class=\"state state-", HtmlEscape(state), "\">",
                  HtmlEscape(state), "</span></header>\n");
  if (!j.security().empty() && !absl::StartsWith(j.security(), "mtls")) {
    // docs/security.md: plain text only when the config says so, and said.
    absl::StrAppend(&out,
                    "<p id=\"security\" class=\"warning\">Security: <strong>plain text</strong>: "
                    "no TLS and no authentication on the control plane; anyone who reaches "
                    "its ports may act on this job (config: security.mode: plaintext).</p>\n");
  } else if (!j.security().empty()) {
    absl::StrAppend(&out, "<p id=\"security\">Security: ",
                    absl::StrContains(j.security(), "sealed") ? "mTLS, data plane sealed" : "mTLS",
                    "</p>\n");
  }
  if (j.workers_target() > 0) {
    absl::StrAppend(&out, "<p id=\"scale\">Scale: ", j.workers_target(), " worker(s), ",
                    j.pservers_target(), " pserver(s) wanted; ", HtmlEscape(j.autoscale()),
                    j.scaling().empty() ? "" : "; in progress: ", HtmlEscape(j.scaling()),
                    "</p>\n");
  }
  if (j.moves_in_progress() + j.moves_waiting() > 0 || j.moves_done() > 0) {
    absl::StrAppend(&out, "<p id=\"moves\">Partition moves: ", j.moves_in_progress(),
                    " under way, ", j.moves_waiting(), " waiting, ", j.moves_done(), " done (",
                    absl::StrFormat("%.1f", static_cast<double>(j.moved_bytes()) / (1 << 20)),
                    " MiB)</p>\n");
  }
  absl::StrAppend(&out, JobSection(j, st.view()), ChartsSection(j), NodesSection(st, now_unix_ms),
                  PartitionsSection(st.view()), EventsSection(j));
  absl::StrAppend(&out, "<footer>",
                  refresh_seconds > 0
                      ? absl::StrCat("This page reloads every ", refresh_seconds, " s. ")
                      : std::string(),
                  "Machine-readable: <a href=\"/status\">/status</a> (JSON), "
                  "<a href=\"/metrics\">/metrics</a>, <a href=\"/logs\">/logs</a>.</footer>\n"
                  "</body></html>\n");
  return out;
}

void ServeStatusPage(HttpServer* http, std::function<proto::GetStatusResponse()> status,
                     Clock* clock) {
  http->Handle("/", [status = std::move(status), clock](const HttpRequest& req) {
    int refresh = 5;
    for (absl::string_view kv : absl::StrSplit(req.query, '&')) {
      if (absl::ConsumePrefix(&kv, "refresh=") && !absl::SimpleAtoi(kv, &refresh)) refresh = 5;
    }
    return HttpResponse{
        200, "text/html; charset=utf-8",
        RenderStatusPage(status(), absl::ToUnixMillis(clock->Now()), std::clamp(refresh, 0, 3600))};
  });
}

}  // namespace strata::master
