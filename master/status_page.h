// The master's status page (GET /): the job's progress, the nodes, the
// partitions and charts of loss, accuracy and throughput over time, as one
// self-contained HTML document. The charts are SVG drawn here; the page has
// no scripts and loads nothing from elsewhere, and refreshes itself.
#ifndef STRATA_MASTER_STATUS_PAGE_H_
#define STRATA_MASTER_STATUS_PAGE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "proto/strata.pb.h"

namespace strata::master {

// `in` with &, <, >, " and ' replaced by character references.
std::string HtmlEscape(absl::string_view in);

struct Chart {
  std::string id;                                 // the svg element's id, e.g. "chart-loss"
  std::string title;                              // "Training loss"
  std::string color;                              // the line's colour, e.g. "#1f77b4"
  std::vector<std::pair<double, double>> points;  // (seconds, value), by time
  // The y axis starts at 0 and ends at y_max when set, else a little above
  // the largest value.
  std::optional<double> y_max;
  // A dashed horizontal line with its label (the final test accuracy).
  std::optional<double> reference;
  std::string reference_label;
};

// One line chart as an <svg> element, width x height pixels, with axes,
// grid lines and tick labels; "no data yet" when there are no points.
std::string SvgLineChart(const Chart& chart, int width = 560, int height = 220);

// The whole page. `now_unix_ms` dates the heartbeats' ages; `refresh_seconds`
// is the page's own reload interval (0: none).
std::string RenderStatusPage(const proto::GetStatusResponse& status, int64_t now_unix_ms,
                             int refresh_seconds);

// Serves the page at GET / of `http` (?refresh=N sets its reload interval,
// 0 none, 5 s by default), from `status` as it is at each request.
void ServeStatusPage(HttpServer* http, std::function<proto::GetStatusResponse()> status,
                     Clock* clock);

}  // namespace strata::master

#endif  // STRATA_MASTER_STATUS_PAGE_H_
