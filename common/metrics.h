// Metrics registry rendered in the Prometheus text exposition format
// (version 0.0.4). Counters and gauges, optionally with constant labels.
#ifndef STRATA_COMMON_METRICS_H_
#define STRATA_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace strata {

// Monotonic counter. Thread-safe, lock-free.
class Counter {
 public:
  void Increment(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Settable gauge. Thread-safe, lock-free.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Distribution of observed values in fixed buckets (Prometheus histogram:
// cumulative `le` buckets, _sum and _count). Thread-safe, lock-free.
class Histogram {
 public:
  // Upper bounds, ascending and finite; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Per-bucket (not cumulative) counts, bounds().size() + 1 of them.
  std::vector<uint64_t> BucketCounts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

  // Seconds from 50 us to about 13 s, doubling: request latencies.
  static std::vector<double> LatencyBounds();
  // Bytes from 1 KiB to 1 GiB, by 4: message and checkpoint sizes.
  static std::vector<double> ByteBounds();

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0.0};
  std::atomic<uint64_t> count_{0};
};

using MetricLabels = std::map<std::string, std::string>;

// Owns all metrics it hands out; returned pointers live as long as the
// registry. Asking twice for the same (name, labels) returns the same object.
// Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; a name is registered with one
// type only (CHECK-fails otherwise: a programmer error). Thread-safe.
class MetricsRegistry {
 public:
  // Out of line: Family is a complete type only in metrics.cc.
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  Counter* GetCounter(const std::string& name, const std::string& help,
                      const MetricLabels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help,
                  const MetricLabels& labels = {});
  // The first call for a (name, labels) sets the bounds; later calls get
  // the same histogram whatever bounds they pass.
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          std::vector<double> bounds, const MetricLabels& labels = {});
  // A counter whose value is read by calling `fn` at render time (a count
  // kept elsewhere); same rules as AddCallbackGauge.
  void AddCallbackCounter(const std::string& name, const std::string& help,
                          std::function<double()> fn, const MetricLabels& labels = {});
  // A gauge whose value is read by calling `fn` at render time. `fn` must be
  // thread-safe and stay callable for the registry's lifetime.
  void AddCallbackGauge(const std::string& name, const std::string& help,
                        std::function<double()> fn, const MetricLabels& labels = {});

  // "# HELP", "# TYPE" and sample lines for every metric, sorted by name.
  std::string RenderPrometheus() const;

 private:
  struct Family;
  Family* FamilyLocked(const std::string& name, const std::string& help, const char* type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
};

// The standard process metrics, read from /proc at render time:
// process_resident_memory_bytes, process_virtual_memory_bytes,
// process_cpu_seconds_total, process_open_fds, process_start_time_seconds.
void AddProcessMetrics(MetricsRegistry* registry);

// This process's CPU time (user and system) so far, and its resident
// memory, from /proc/self.
double ProcessCpuSeconds();
double ProcessResidentBytes();
// What this process may use: the host's memory (or its cgroup's
// memory.max where lower), and the CPUs it may run on (or its cgroup's
// cpu.max quota where lower), in cores.
double MemoryLimitBytes();
double CpuLimitCores();

}  // namespace strata

#endif  // STRATA_COMMON_METRICS_H_
