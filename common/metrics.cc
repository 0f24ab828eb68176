#include "common/metrics.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace strata {
namespace {

// Adds `v` to `a`. std::atomic<double>::fetch_add is C++20; a CAS loop does
// the same lock-free.
void AtomicAdd(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed,
                                  std::memory_order_relaxed)) {
  }
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*.
bool IsValidMetricName(const std::string& name) {
  if (name.empty()) return false;
  if (!IsNameStart(name[0]) && name[0] != ':') return false;
  for (char c : name) {
    if (!IsNameStart(c) && !IsDigit(c) && c != ':') return false;
  }
  return true;
}

// Label names: [a-zA-Z_][a-zA-Z0-9_]*.
bool IsValidLabelName(const std::string& name) {
  if (name.empty() || !IsNameStart(name[0])) return false;
  for (char c : name) {
    if (!IsNameStart(c) && !IsDigit(c)) return false;
  }
  return true;
}

void CheckNames(const std::string& name, const MetricLabels& labels) {
  CHECK(IsValidMetricName(name)) << "invalid metric name '" << name << "'";
  for (const auto& [key, value] : labels) {
    CHECK(IsValidLabelName(key)) << "invalid label name '" << key << "' on metric " << name;
  }
}

// HELP text escapes backslash and newline.
std::string EscapeHelp(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Label values also escape the double quote.
std::string EscapeLabelValue(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Integral values print without a fraction ("3"), others with the shortest
// precision that reads back to the same double; specials as Prometheus spells
// them.
std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    // "-0" reads oddly; it is zero.
    return std::string(buf) == "-0" ? "0" : std::string(buf);
  }
  char buf[40];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string FormatLabels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : labels) {
    if (!first) out += ",";
    first = false;
    absl::StrAppend(&out, key, "=\"", EscapeLabelValue(value), "\"");
  }
  out += "}";
  return out;
}

}  // namespace

void Counter::Increment(double v) {
  DCHECK_GE(v, 0.0) << "counters only go up";
  AtomicAdd(value_, v);
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i + 1 < bounds_.size(); ++i) {
    CHECK_LT(bounds_[i], bounds_[i + 1]) << "histogram bounds must ascend";
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

std::vector<double> Histogram::LatencyBounds() {
  std::vector<double> b;
  for (double v = 50e-6; v < 15; v *= 2) b.push_back(v);
  return b;
}

std::vector<double> Histogram::ByteBounds() {
  std::vector<double> b;
  for (double v = 1024; v <= (1 << 30); v *= 4) b.push_back(v);
  return b;
}

// One metric name: its help, type and one series per label set. Exactly one
// of counter / gauge / callback is set in each series.
struct MetricsRegistry::Family {
  struct Series {
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::function<double()> callback;
    std::unique_ptr<Histogram> histogram;
  };

  std::string help;
  std::string type;  // "counter", "gauge" or "histogram"
  std::map<MetricLabels, Series> series;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family* MetricsRegistry::FamilyLocked(const std::string& name,
                                                       const std::string& help, const char* type) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    auto family = std::make_unique<Family>();
    family->help = help;
    family->type = type;
    it = families_.emplace(name, std::move(family)).first;
  }
  CHECK_EQ(it->second->type, type) << "metric " << name << " registered as " << it->second->type
                                   << ", now asked for as " << type;
  return it->second.get();
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help,
                                     const MetricLabels& labels) {
  CheckNames(name, labels);
  absl::MutexLock lock(&mu_);
  Family* family = FamilyLocked(name, help, "counter");
  Family::Series& series = family->series[labels];
  if (series.counter == nullptr) series.counter = std::make_unique<Counter>();
  return series.counter.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                 const MetricLabels& labels) {
  CheckNames(name, labels);
  absl::MutexLock lock(&mu_);
  Family* family = FamilyLocked(name, help, "gauge");
  Family::Series& series = family->series[labels];
  CHECK(!series.callback) << "metric " << name << FormatLabels(labels)
                          << " is already a callback gauge";
  if (series.gauge == nullptr) series.gauge = std::make_unique<Gauge>();
  return series.gauge.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         std::vector<double> bounds, const MetricLabels& labels) {
  CheckNames(name, labels);
  CHECK(labels.count("le") == 0) << "histogram " << name << ": 'le' is its own label";
  absl::MutexLock lock(&mu_);
  Family* family = FamilyLocked(name, help, "histogram");
  Family::Series& series = family->series[labels];
  if (series.histogram == nullptr)
    series.histogram = std::make_unique<Histogram>(std::move(bounds));
  return series.histogram.get();
}

void MetricsRegistry::AddCallbackCounter(const std::string& name, const std::string& help,
                                         std::function<double()> fn, const MetricLabels& labels) {
  CHECK(fn) << "callback counter " << name << " needs a function";
  CheckNames(name, labels);
  absl::MutexLock lock(&mu_);
  Family* family = FamilyLocked(name, help, "counter");
  Family::Series& series = family->series[labels];
  CHECK(series.counter == nullptr)
      << "metric " << name << FormatLabels(labels) << " is already a counter";
  series.callback = std::move(fn);
}

void MetricsRegistry::AddCallbackGauge(const std::string& name, const std::string& help,
                                       std::function<double()> fn, const MetricLabels& labels) {
  CHECK(fn) << "callback gauge " << name << " needs a function";
  CheckNames(name, labels);
  absl::MutexLock lock(&mu_);
  Family* family = FamilyLocked(name, help, "gauge");
  Family::Series& series = family->series[labels];
  CHECK(series.gauge == nullptr) << "metric " << name << FormatLabels(labels)
                                 << " is already a gauge";
  // Registering the same (name, labels) again replaces the function.
  series.callback = std::move(fn);
}

std::string MetricsRegistry::RenderPrometheus() const {
  // Snapshot under the lock, read values outside it: callbacks may take
  // their own locks, or even use this registry.
  struct SeriesView {
    std::string labels;
    MetricLabels label_map;  // histograms add "le"
    const Histogram* histogram = nullptr;
    const Counter* counter = nullptr;
    const Gauge* gauge = nullptr;
    std::function<double()> callback;
  };
  struct FamilyView {
    std::string name;
    std::string help;
    std::string type;
    std::vector<SeriesView> series;
  };
  std::vector<FamilyView> views;
  {
    absl::MutexLock lock(&mu_);
    views.reserve(families_.size());
    for (const auto& [name, family] : families_) {  // std::map: sorted
      FamilyView view{name, family->help, family->type, {}};
      view.series.reserve(family->series.size());
      for (const auto& [labels, series] : family->series) {
        view.series.push_back(SeriesView{FormatLabels(labels), labels, series.histogram.get(),
                                         series.counter.get(), series.gauge.get(),
                                         series.callback});
      }
      views.push_back(std::move(view));
    }
  }

  std::string out;
  for (const FamilyView& view : views) {
    absl::StrAppend(&out, "# HELP ", view.name, " ", EscapeHelp(view.help), "\n");
    absl::StrAppend(&out, "# TYPE ", view.name, " ", view.type, "\n");
    for (const SeriesView& s : view.series) {
      if (s.histogram != nullptr) {
        const std::vector<uint64_t> counts = s.histogram->BucketCounts();
        const std::vector<double>& bounds = s.histogram->bounds();
        uint64_t cumulative = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          cumulative += counts[i];
          MetricLabels with_le = s.label_map;
          with_le["le"] = i < bounds.size() ? FormatValue(bounds[i]) : "+Inf";
          absl::StrAppend(&out, view.name, "_bucket", FormatLabels(with_le), " ", cumulative, "\n");
        }
        // The count is the +Inf bucket's (read once: the two agree).
        absl::StrAppend(&out, view.name, "_sum", s.labels, " ", FormatValue(s.histogram->sum()),
                        "\n");
        absl::StrAppend(&out, view.name, "_count", s.labels, " ", cumulative, "\n");
        continue;
      }
      double value = 0.0;
      if (s.counter != nullptr) {
        value = s.counter->value();
      } else if (s.gauge != nullptr) {
        value = s.gauge->value();
      } else if (s.callback) {
        value = s.callback();
      }
      absl::StrAppend(&out, view.name, s.labels, " ", FormatValue(value), "\n");
    }
  }
  return out;
}

namespace {

// Fields of /proc/self/stat after the command (which may hold spaces):
// index 0 is the state (field 3 of proc(5)).
std::vector<std::string> ProcSelfStat() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream rest(text.substr(close + 1));
  for (std::string f; rest >> f;) fields.push_back(f);
  return fields;
}

double ProcStatField(int proc5_field) {  // 1-based, as proc(5) numbers them
  const std::vector<std::string> f = ProcSelfStat();
  const size_t i = static_cast<size_t>(proc5_field - 3);
  return i < f.size() ? std::strtod(f[i].c_str(), nullptr) : 0;
}

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("btime ", 0) == 0) return std::strtod(line.c_str() + 6, nullptr);
  }
  return 0;
}

}  // namespace

namespace {

// The directory of this process's cgroup (v2), "" when there is none.
std::string OwnCgroupDir() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("0::", 0) == 0) return absl::StrCat("/sys/fs/cgroup", line.substr(3));
  }
  return "";
}

// The first line of `path`, "" when it cannot be read.
std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

double ProcessCpuSeconds() {
  static const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (ProcStatField(14) + ProcStatField(15)) / ticks;
}

double ProcessResidentBytes() {
  static const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  std::ifstream in("/proc/self/statm");
  double size = 0, resident = 0;
  in >> size >> resident;
  return resident * page;
}

double MemoryLimitBytes() {
  double limit =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const std::string dir = OwnCgroupDir();
  if (!dir.empty()) {
    const std::string max = FirstLine(dir + "/memory.max");
    if (!max.empty() && max != "max") {
      const double v = std::strtod(max.c_str(), nullptr);
      if (v > 0) limit = std::min(limit, v);
    }
  }
  return limit;
}

double CpuLimitCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  double cores = sched_getaffinity(0, sizeof(set), &set) == 0
                     ? CPU_COUNT(&set)
                     : static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN));
  const std::string dir = OwnCgroupDir();
  if (!dir.empty()) {
    // "max 100000" (no quota) or "QUOTA PERIOD" in microseconds.
    std::istringstream in(FirstLine(dir + "/cpu.max"));
    std::string quota;
    double period = 0;
    if (in >> quota >> period && quota != "max" && period > 0) {
      const double q = std::strtod(quota.c_str(), nullptr) / period;
      if (q > 0) cores = std::min(cores, q);
    }
  }
  return std::max(cores, 0.01);
}

void AddProcessMetrics(MetricsRegistry* registry) {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  registry->AddCallbackGauge("process_resident_memory_bytes", "Resident memory size in bytes",
                             [] { return ProcessResidentBytes(); });
  registry->AddCallbackGauge("process_virtual_memory_bytes", "Virtual memory size in bytes",
                             [] { return ProcStatField(23); });
  registry->AddCallbackCounter("process_cpu_seconds_total",
                               "User and system CPU time spent in seconds",
                               [] { return ProcessCpuSeconds(); });
  registry->AddCallbackGauge("process_open_fds", "Open file descriptors", [] {
    double n = 0;
    if (DIR* d = opendir("/proc/self/fd")) {
      while (readdir(d) != nullptr) ++n;
      closedir(d);
      n -= 3;  // ".", ".." and the directory's own descriptor
    }
    return n;
  });
  const double start = BootTimeSeconds() + ProcStatField(22) / ticks;
  registry->AddCallbackGauge("process_start_time_seconds",
                             "Start time of the process since the Unix epoch in seconds",
                             [start] { return start; });
}

}  // namespace strata
