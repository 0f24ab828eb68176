#include "common/metrics.h"

#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(MetricsTest, EmptyRegistryRendersNothing) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.RenderPrometheus(), "");
}

TEST(MetricsTest, RendersCounterAndGaugeSortedByName) {
  MetricsRegistry registry;
  Gauge* gauge = registry.GetGauge("strata_queue_depth", "Queued requests.");
  Counter* counter =
      registry.GetCounter("strata_requests_total", "Requests served.");
  Counter* bytes = registry.GetCounter("strata_bytes_total", "Bytes sent.");
  counter->Increment();
  counter->Increment(2);
  bytes->Increment(1.5);
  gauge->Set(7);
  gauge->Add(-2.25);

  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP strata_bytes_total Bytes sent.\n"
            "# TYPE strata_bytes_total counter\n"
            "strata_bytes_total 1.5\n"
            "# HELP strata_queue_depth Queued requests.\n"
            "# TYPE strata_queue_depth gauge\n"
            "strata_queue_depth 4.75\n"
            "# HELP strata_requests_total Requests served.\n"
            "# TYPE strata_requests_total counter\n"
            "strata_requests_total 3\n");
  EXPECT_EQ(counter->value(), 3.0);
  EXPECT_EQ(gauge->value(), 4.75);
}

TEST(MetricsTest, RendersLabelsSortedByKeyAndSeriesSortedByLabels) {
  MetricsRegistry registry;
  registry
      .GetCounter("rpc_total", "RPCs.", {{"method", "push"}, {"code", "ok"}})
      ->Increment(4);
  registry
      .GetCounter("rpc_total", "RPCs.", {{"method", "pull"}, {"code", "ok"}})
      ->Increment(2);
  registry.GetCounter("rpc_total", "RPCs.")->Increment();

  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP rpc_total RPCs.\n"
            "# TYPE rpc_total counter\n"
            "rpc_total 1\n"
            "rpc_total{code=\"ok\",method=\"pull\"} 2\n"
            "rpc_total{code=\"ok\",method=\"push\"} 4\n");
}

TEST(MetricsTest, CallbackGaugeIsReadAtRenderTime) {
  MetricsRegistry registry;
  std::atomic<int> calls{0};
  double value = 1.0;
  registry.AddCallbackGauge("uptime_seconds", "Seconds since start.",
                            [&] {
                              ++calls;
                              return value;
                            },
                            {{"role", "pserver"}});
  EXPECT_EQ(calls.load(), 0);

  value = 12.5;
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP uptime_seconds Seconds since start.\n"
            "# TYPE uptime_seconds gauge\n"
            "uptime_seconds{role=\"pserver\"} 12.5\n");
  value = 13;
  EXPECT_THAT(registry.RenderPrometheus(),
              ::testing::HasSubstr("uptime_seconds{role=\"pserver\"} 13\n"));
  EXPECT_EQ(calls.load(), 2);
}

TEST(MetricsTest, CallbackGaugeMayUseTheRegistry) {
  MetricsRegistry registry;
  Counter* c = registry.GetCounter("a_total", "A.");
  c->Increment(5);
  registry.AddCallbackGauge("b", "Twice a.", [&] {
    return 2 * registry.GetCounter("a_total", "A.")->value();
  });
  EXPECT_THAT(registry.RenderPrometheus(), ::testing::HasSubstr("\nb 10\n"));
}

TEST(MetricsTest, SameNameAndLabelsReturnSameObject) {
  MetricsRegistry registry;
  Counter* a = registry.GetCounter("c_total", "C.", {{"k", "v"}});
  Counter* b = registry.GetCounter("c_total", "C.", {{"k", "v"}});
  Counter* other = registry.GetCounter("c_total", "C.", {{"k", "w"}});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);

  Gauge* g1 = registry.GetGauge("g", "G.");
  Gauge* g2 = registry.GetGauge("g", "G.");
  EXPECT_EQ(g1, g2);
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry registry;
  registry
      .GetGauge("path_info", "Line one\nback\\slash \"quoted\".",
                {{"path", "C:\\dir\n\"x\""}})
      ->Set(1);
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP path_info Line one\\nback\\\\slash \"quoted\".\n"
            "# TYPE path_info gauge\n"
            "path_info{path=\"C:\\\\dir\\n\\\"x\\\"\"} 1\n");
}

TEST(MetricsTest, FormatsSpecialAndFractionalValues) {
  MetricsRegistry registry;
  registry.GetGauge("a", "A.")->Set(std::numeric_limits<double>::infinity());
  registry.GetGauge("b", "B.")->Set(-std::numeric_limits<double>::infinity());
  registry.GetGauge("c", "C.")->Set(std::numeric_limits<double>::quiet_NaN());
  registry.GetGauge("d", "D.")->Set(0.1);
  registry.GetGauge("e", "E.")->Set(-3);
  registry.GetGauge("f", "F.")->Set(1e20);
  const std::string text = registry.RenderPrometheus();
  EXPECT_THAT(text, ::testing::HasSubstr("\na +Inf\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("\nb -Inf\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("\nc NaN\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("\nd 0.1\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("\ne -3\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("\nf 1e+20\n"));
}

TEST(MetricsTest, ConcurrentIncrementsAreNotLost) {
  MetricsRegistry registry;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&registry] {
      Counter* c = registry.GetCounter("hits_total", "Hits.");
      Gauge* g = registry.GetGauge("level", "Level.");
      for (int i = 0; i < kPerThread; ++i) {
        c->Increment();
        g->Add(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(registry.GetCounter("hits_total", "Hits.")->value(),
            kThreads * kPerThread);
  EXPECT_EQ(registry.GetGauge("level", "Level.")->value(),
            kThreads * kPerThread * 0.5);
}

TEST(MetricsDeathTest, SameNameWithTwoTypesIsAProgrammerError) {
  MetricsRegistry registry;
  registry.GetCounter("x_total", "X.");
  EXPECT_DEATH(registry.GetGauge("x_total", "X."), "x_total");
}

TEST(MetricsDeathTest, InvalidNameIsAProgrammerError) {
  MetricsRegistry registry;
  EXPECT_DEATH(registry.GetCounter("1bad", "Bad."), "1bad");
  EXPECT_DEATH(registry.GetCounter("ok", "Ok.", {{"bad-label", "v"}}),
               "bad-label");
}

}  // namespace
}  // namespace strata
