#include "master/status_page.h"

#include <regex>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace strata::master {
namespace {

int Count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// The (x, y) pairs of the chart's series polyline.
std::vector<std::pair<double, double>> SeriesPoints(const std::string& svg) {
  std::smatch m;
  const std::regex re("class=\"series\"[^>]*points=\"([^\"]*)\"");
  std::vector<std::pair<double, double>> out;
  if (!std::regex_search(svg, m, re)) return out;
  for (absl::string_view xy : absl::StrSplit(m[1].str(), ' ')) {
    std::pair<std::string, std::string> p = absl::StrSplit(xy, ',');
    double x, y;
    EXPECT_TRUE(absl::SimpleAtod(p.first, &x) && absl::SimpleAtod(p.second, &y)) << xy;
    out.emplace_back(x, y);
  }
  return out;
}

TEST(HtmlEscapeTest, EscapesMarkup) {
  EXPECT_EQ(HtmlEscape("<a href=\"x\">Tom & 'Jerry'</a>"),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;");
  EXPECT_EQ(HtmlEscape("plain"), "plain");
}

TEST(SvgLineChartTest, NoPointsSaysSo) {
  Chart c{"chart-loss", "Training loss", "#1f77b4", {}, std::nullopt, std::nullopt, ""};
  const std::string svg = SvgLineChart(c);
  EXPECT_TRUE(absl::StartsWith(svg, "<svg id=\"chart-loss\"")) << svg;
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>"));
  EXPECT_TRUE(absl::StrContains(svg, "no data yet"));
  EXPECT_FALSE(absl::StrContains(svg, "class=\"series\""));
}

TEST(SvgLineChartTest, PointsMapIntoThePlotInOrder) {
  Chart c{"chart-loss", "Training loss", "#1f77b4", {}, std::nullopt, std::nullopt, ""};
  c.points = {{0.5, 2.3}, {1.0, 1.2}, {1.5, 0.8}, {2.0, 0.6}, {2.5, 0.55}};
  const int width = 560, height = 220;
  const std::string svg = SvgLineChart(c, width, height);
  const auto pts = SeriesPoints(svg);
  ASSERT_EQ(pts.size(), c.points.size()) << svg;
  for (size_t i = 0; i < pts.size(); ++i) {
    EXPECT_GT(pts[i].first, 0);
    EXPECT_LT(pts[i].first, width);
    EXPECT_GT(pts[i].second, 0);
    EXPECT_LT(pts[i].second, height);
    if (i > 0) {
      EXPECT_GT(pts[i].first, pts[i - 1].first);    // time runs right
      EXPECT_GT(pts[i].second, pts[i - 1].second);  // falling loss runs down (y grows)
    }
  }
  // The largest value stays inside the plot, below its top edge (y = 30).
  EXPECT_GT(pts[0].second, 30);
  EXPECT_TRUE(absl::StrContains(svg, ">now 0.5500<")) << svg;
}

TEST(SvgLineChartTest, FixedAxisAndReferenceLine) {
  Chart c{"chart-accuracy", "Training accuracy", "#2ca02c", {}, 1.0, 0.85, "test 0.8500"};
  c.points = {{1, 0.5}, {2, 0.7}};
  const std::string svg = SvgLineChart(c);
  EXPECT_TRUE(absl::StrContains(svg, "class=\"reference\"")) << svg;
  EXPECT_TRUE(absl::StrContains(svg, ">test 0.8500<"));
  EXPECT_TRUE(absl::StrContains(svg, ">1.0<"));  // the top tick of a 0..1 axis
  EXPECT_EQ(SeriesPoints(svg).size(), 2u);
}

TEST(SvgLineChartTest, OnePointIsADotAndBadValuesAreDropped) {
  Chart c{"chart-throughput", "Samples / s", "#d62728", {}, std::nullopt, std::nullopt, ""};
  c.points = {{1, 12000}, {2, std::nan("")}};
  const std::string svg = SvgLineChart(c);
  EXPECT_TRUE(absl::StrContains(svg, "<circle class=\"series\"")) << svg;
  EXPECT_FALSE(absl::StrContains(svg, "nan"));
  EXPECT_TRUE(absl::StrContains(svg, "k<"));  // thousands as k on the axis
}

proto::GetStatusResponse SampleStatus() {
  proto::GetStatusResponse st;
  proto::ClusterView* v = st.mutable_view();
  v->set_epoch(7);
  auto add = [&](uint32_t id, proto::Role role, int index, proto::NodeState state,
                 const std::string& host) {
    proto::NodeInfo* n = v->add_members();
    n->set_id(id);
    n->set_role(role);
    n->set_index(index);
    n->set_state(state);
    n->set_host(host);
    n->set_grpc_address(host + ":7000");
    n->set_http_port(8000 + id);
    n->set_last_heartbeat_unix_ms(1'000'000 - 1500);
  };
  add(0, proto::MASTER, 0, proto::ALIVE, "10.0.0.1");
  add(1, proto::PSERVER, 0, proto::ALIVE, "10.0.0.2");
  add(2, proto::PSERVER, 1, proto::DEAD, "10.0.0.3");
  add(3, proto::WORKER, 0, proto::ALIVE, "<script>alert(1)</script>");
  proto::TableInfo* t = v->add_tables();
  t->set_id(0);
  t->set_name("fc0.weight");
  for (int i = 0; i < 250; ++i) {
    proto::PartitionInfo* p = v->add_partitions();
    p->set_id(i);
    p->set_table_id(0);
    p->set_offset(i * 100);
    p->set_length(100);
    p->set_owner(1 + i % 2);
    if (i % 2 == 1) p->add_backups(1);
  }
  proto::JobStatus* j = st.mutable_job();
  j->set_name("fashion & friends");
  j->set_state("running");
  j->set_epochs(3);
  j->set_tasks_total(30);
  j->set_tasks_done(12);
  j->set_loss(0.61);
  j->set_train_accuracy(0.78);
  proto::WorkerProgress* w = j->add_workers();
  w->set_node_id(3);
  w->set_step(420);
  w->set_samples_per_sec(15000);
  for (int i = 1; i <= 4; ++i) {
    proto::JobSample* s = j->add_history();
    s->set_t(i * 0.5);
    s->set_loss(2.0 / i);
    s->set_train_accuracy(0.2 * i);
    s->set_samples_per_sec(10000 + i);
  }
  j->add_events("0.1s pserver 1 (node 2) declared dead");
  return st;
}

TEST(RenderStatusPageTest, ShowsJobNodesPartitionsAndCharts) {
  const std::string page = RenderStatusPage(SampleStatus(), 1'000'000, 5);
  EXPECT_TRUE(absl::StartsWith(page, "<!DOCTYPE html>"));
  EXPECT_TRUE(absl::StrContains(page, "<meta http-equiv=\"refresh\" content=\"5\">"));
  EXPECT_TRUE(absl::StrContains(page, "Strata: fashion &amp; friends"));
  EXPECT_TRUE(absl::StrContains(page, "class=\"state state-running\""));
  // No script, and a hostile host name stays text.
  EXPECT_FALSE(absl::StrContains(page, "<script"));
  EXPECT_TRUE(absl::StrContains(page, "&lt;script&gt;alert(1)&lt;/script&gt;"));
  // Every node is a row, with its state and heartbeat age.
  EXPECT_EQ(Count(page, "<tr class=\"node "), 4);
  EXPECT_TRUE(absl::StrContains(page, "3 of 4 alive"));
  EXPECT_TRUE(absl::StrContains(page, "<td class=\"dead\">dead</td>"));
  EXPECT_TRUE(absl::StrContains(page, "1.5 s ago"));
  EXPECT_TRUE(absl::StrContains(page, "125 primary, 125 backup partitions"));  // pserver 0
  EXPECT_TRUE(absl::StrContains(page, "125 primary, 0 backup partitions"));    // pserver 1
  EXPECT_TRUE(absl::StrContains(page, "href=\"http://10.0.0.2:8001/metrics\""));
  // Partitions: 200 rows, then a pointer to the rest.
  EXPECT_TRUE(absl::StrContains(page, "50 more partitions"));
  EXPECT_TRUE(absl::StrContains(page, "[0, 100)"));
  // Three charts, each drawing the four points.
  for (const char* id : {"chart-loss", "chart-accuracy", "chart-throughput"}) {
    const size_t at = page.find(absl::StrCat("<svg id=\"", id, "\""));
    ASSERT_NE(at, std::string::npos) << id;
    const std::string svg = page.substr(at, page.find("</svg>", at) - at + 6);
    EXPECT_EQ(SeriesPoints(svg).size(), 4u) << id;
  }
  EXPECT_TRUE(absl::StrContains(page, "declared dead"));
}

TEST(RenderStatusPageTest, EmptyClusterAndNoRefresh) {
  proto::GetStatusResponse st;
  const std::string page = RenderStatusPage(st, 0, 0);
  EXPECT_FALSE(absl::StrContains(page, "http-equiv=\"refresh\""));
  EXPECT_TRUE(absl::StrContains(page, "state-waiting"));
  EXPECT_TRUE(absl::StrContains(page, "not placed yet"));
  EXPECT_EQ(Count(page, "no data yet"), 3);
}

TEST(RenderStatusPageTest, PlainTextIsSaid) {
  proto::GetStatusResponse st;
  st.mutable_job()->set_security("plaintext (no authentication)");
  std::string page = RenderStatusPage(st, 0, 0);
  EXPECT_TRUE(absl::StrContains(page,
                                "<p id=\"security\" class=\"warning\">Security: "
                                "<strong>plain text</strong>"));
  st.mutable_job()->set_security("mtls");
  page = RenderStatusPage(st, 0, 0);
  EXPECT_TRUE(absl::StrContains(page, "<p id=\"security\">Security: mTLS</p>"));
  EXPECT_FALSE(absl::StrContains(page, "plain text"));
}

// GET / serves the page from the status at each request, its reload
// interval from ?refresh=N: 5 s when absent or not a number, within 0..3600.
TEST(ServeStatusPageTest, RefreshComesFromTheQueryWithinBounds) {
  HttpServer http;
  int requests = 0;
  ServeStatusPage(
      &http,
      [&requests] {
        ++requests;
        return proto::GetStatusResponse();
      },
      RealClock());
  ASSERT_TRUE(http.Start("127.0.0.1", 0).ok());
  auto refresh_of = [&](const std::string& path) {
    absl::StatusOr<std::string> page = HttpGet("127.0.0.1", http.port(), path);
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? *page : std::string();
  };
  EXPECT_TRUE(absl::StrContains(refresh_of("/"), "content=\"5\""));
  EXPECT_TRUE(absl::StrContains(refresh_of("/?refresh=7"), "content=\"7\""));
  EXPECT_TRUE(absl::StrContains(refresh_of("/?refresh=seven"), "content=\"5\""));
  EXPECT_TRUE(absl::StrContains(refresh_of("/?x=1&refresh=99999"), "content=\"3600\""));
  EXPECT_FALSE(absl::StrContains(refresh_of("/?refresh=0"), "http-equiv=\"refresh\""));
  EXPECT_EQ(requests, 5);
  http.Shutdown();
}

}  // namespace
}  // namespace strata::master
