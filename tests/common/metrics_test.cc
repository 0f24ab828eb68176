#include "common/metrics.h"

#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
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
  Counter* counter = registry.GetCounter("strata_requests_total", "Requests served.");
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
  registry.GetCounter("rpc_total", "RPCs.", {{"method", "push"}, {"code", "ok"}})->Increment(4);
  registry.GetCounter("rpc_total", "RPCs.", {{"method", "pull"}, {"code", "ok"}})->Increment(2);
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
  registry.AddCallbackGauge("b", "Twice a.",
                            [&] { return 2 * registry.GetCounter("a_total", "A.")->value(); });
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
  registry.GetGauge("path_info", "Line one\nback\\slash \"quoted\".", {{"path", "C:\\dir\n\"x\""}})
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

TEST(MetricsTest, HistogramRendersCumulativeBucketsSumAndCount) {
  MetricsRegistry registry;
  Histogram* h = registry.GetHistogram("strata_push_seconds", "Push latency.", {0.25, 1, 4},
                                       {{"peer", "ps0"}});
  for (double v : {0.125, 0.25, 0.5, 2.0, 2.0, 8.0}) h->Observe(v);
  EXPECT_EQ(registry.GetHistogram("strata_push_seconds", "", {}, {{"peer", "ps0"}}), h);
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP strata_push_seconds Push latency.\n"
            "# TYPE strata_push_seconds histogram\n"
            "strata_push_seconds_bucket{le=\"0.25\",peer=\"ps0\"} 2\n"
            "strata_push_seconds_bucket{le=\"1\",peer=\"ps0\"} 3\n"
            "strata_push_seconds_bucket{le=\"4\",peer=\"ps0\"} 5\n"
            "strata_push_seconds_bucket{le=\"+Inf\",peer=\"ps0\"} 6\n"
            "strata_push_seconds_sum{peer=\"ps0\"} 12.875\n"
            "strata_push_seconds_count{peer=\"ps0\"} 6\n");
  EXPECT_EQ(h->count(), 6u);
}

TEST(MetricsTest, HistogramDefaultBoundsAreReadable) {
  const std::vector<double> latency = Histogram::LatencyBounds();
  ASSERT_FALSE(latency.empty());
  EXPECT_DOUBLE_EQ(latency.front(), 50e-6);
  EXPECT_GT(latency.back(), 10.0);
  MetricsRegistry registry;
  registry.GetHistogram("strata_x_seconds", "x", latency)->Observe(0.0003);
  const std::string text = registry.RenderPrometheus();
  EXPECT_THAT(text, ::testing::HasSubstr("strata_x_seconds_bucket{le=\"0.0004\"} 1\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("strata_x_seconds_bucket{le=\"0.0002\"} 0\n"));
  EXPECT_EQ(Histogram::ByteBounds().front(), 1024.0);
}

TEST(MetricsTest, CallbackCounterIsTypedCounter) {
  MetricsRegistry registry;
  double n = 4;
  registry.AddCallbackCounter("strata_things_total", "Things.", [&n] { return n; });
  n = 9;
  EXPECT_EQ(registry.RenderPrometheus(),
            "# HELP strata_things_total Things.\n"
            "# TYPE strata_things_total counter\n"
            "strata_things_total 9\n");
}

TEST(MetricsTest, ConcurrentObservationsAreNotLost) {
  MetricsRegistry registry;
  Histogram* h = registry.GetHistogram("strata_h", "h", {1, 2});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([h] {
      for (int i = 0; i < 10000; ++i) h->Observe(i % 3);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(h->count(), 40000u);
  const std::vector<uint64_t> counts = h->BucketCounts();
  EXPECT_EQ(counts[0] + counts[1] + counts[2], 40000u);
  EXPECT_DOUBLE_EQ(h->sum(), 4 * (3333 * 1 + 3333 * 2));
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
  EXPECT_EQ(registry.GetCounter("hits_total", "Hits.")->value(), kThreads * kPerThread);
  EXPECT_EQ(registry.GetGauge("level", "Level.")->value(), kThreads * kPerThread * 0.5);
}

// What a pserver's heartbeat tells the autoscaler of its process.
TEST(ProcessStatsTest, CpuTimeGrowsWithWorkAndTheLimitsAreThoseOfTheMachineAtMost) {
  const double before = ProcessCpuSeconds();
  volatile double x = 0;
  const absl::Time until = absl::Now() + absl::Milliseconds(100);
  while (absl::Now() < until) x = x + 1;
  EXPECT_GT(ProcessCpuSeconds(), before);
  EXPECT_GT(ProcessResidentBytes(), 1 << 20);
  EXPECT_GE(MemoryLimitBytes(), ProcessResidentBytes());
  EXPECT_GT(CpuLimitCores(), 0);
  EXPECT_LE(CpuLimitCores(), std::thread::hardware_concurrency());
}

TEST(MetricsDeathTest, SameNameWithTwoTypesIsAProgrammerError) {
  MetricsRegistry registry;
  registry.GetCounter("x_total", "X.");
  EXPECT_DEATH(registry.GetGauge("x_total", "X."), "x_total");
}

TEST(MetricsDeathTest, InvalidNameIsAProgrammerError) {
  MetricsRegistry registry;
  EXPECT_DEATH(registry.GetCounter("1bad", "Bad."), "1bad");
  EXPECT_DEATH(registry.GetCounter("ok", "Ok.", {{"bad-label", "v"}}), "bad-label");
}

}  // namespace
}  // namespace strata
