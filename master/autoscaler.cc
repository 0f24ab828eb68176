#include "master/autoscaler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata::master {

std::optional<double> Autoscaler::Rate(absl::Time now, absl::Duration window) const {
  // The newest point at least `window` old, and the newest of all.
  const std::pair<absl::Time, uint64_t>* from = nullptr;
  for (const auto& p : history_) {
    if (p.first <= now - window) from = &p;
  }
  if (from == nullptr || history_.empty()) return std::nullopt;
  const auto& to = history_.back();
  const double secs = absl::ToDoubleSeconds(to.first - from->first);
  if (secs <= 0) return std::nullopt;
  return static_cast<double>(to.second - std::min(to.second, from->second)) / secs;
}

std::optional<Autoscaler::Decision> Autoscaler::Tick(const Input& in) {
  history_.emplace_back(in.now, in.samples);
  const absl::Duration window = absl::Seconds(e_.measure_seconds);
  const absl::Duration keep = 2 * window + absl::Seconds(e_.cooldown_seconds);
  while (history_.size() > 2 && history_[1].first < in.now - keep) history_.pop_front();
  if (was_scaling_ && !in.scaling) {
    last_scale_end_ = in.now;
    if (measuring_.has_value() && measuring_->since == absl::InfiniteFuture()) {
      measuring_->since = in.now;
    }
  }
  was_scaling_ = in.scaling;
  // Pservers gone (drained, dead) leave their windows; a scale restarts
  // them all (the load is the new shape's once it is over).
  for (auto it = pservers_.begin(); it != pservers_.end();) {
    const bool serving =
        std::find(in.pservers.begin(), in.pservers.end(), it->first) != in.pservers.end();
    if (!serving && it->second.last_beat < in.now - 2 * absl::Seconds(e_.pserver_signal_seconds)) {
      it = pservers_.erase(it);
      continue;
    }
    if (in.scaling || !serving) {
      it->second.samples.clear();
      it->second.since = absl::InfiniteFuture();
    }
    ++it;
  }
  if (!enabled_ || in.state != proto::JOB_RUNNING || in.scaling) return std::nullopt;
  // The gain of the worker added last, once it has trained for a window.
  if (measuring_.has_value() && measuring_->since != absl::InfiniteFuture() &&
      in.now - measuring_->since >= window) {
    const Measuring m = *measuring_;
    measuring_.reset();
    if (const std::optional<double> after = Rate(in.now, window)) {
      const double per_worker = m.rate_before / std::max(1, m.workers_before);
      const double gain = per_worker > 0 ? (*after - m.rate_before) / per_worker : 1.0;
      growth_stopped_ = gain < e_.min_gain;
      return Decision{
          proto::WORKER, 0,
          absl::StrFormat(
              "autoscale: the worker added took samples/s from %.0f to %.0f, "
              "%.0f%% of a worker's average (elastic.min_gain %.0f%%): %s",
              m.rate_before, *after, 100 * gain, 100 * e_.min_gain,
              growth_stopped_ ? "growing no further" : "growing on while the queue is deep")};
    }
  }
  if (in.now - last_decision_ < absl::Seconds(e_.cooldown_seconds)) return std::nullopt;
  // Workers idle at the tail: released.
  if (in.pending == 0 && in.idle > 0 && in.workers > e_.min_workers) {
    const int release = std::min(in.idle, in.workers - e_.min_workers);
    last_decision_ = in.now;
    return Decision{proto::WORKER, -release,
                    absl::StrFormat("autoscale: %d worker(s) idle at the job's tail "
                                    "(no data task left for them): releasing %d",
                                    in.idle, release)};
  }
  // A deep queue: one more worker, measured before and after.
  const uint64_t deep = static_cast<uint64_t>(e_.queue_per_worker) * std::max(1, in.workers);
  if (growth_stopped_ || measuring_.has_value() || in.workers >= in.most || in.pending < deep ||
      in.now - last_scale_end_ < window) {
    return PServerTick(in);
  }
  const std::optional<double> before = Rate(in.now, window);
  if (!before.has_value()) return PServerTick(in);
  measuring_ = Measuring{*before, in.workers, absl::InfiniteFuture()};
  last_decision_ = in.now;
  return Decision{proto::WORKER, 1,
                  absl::StrFormat("autoscale: the data-task queue is deep (%d tasks pending "
                                  "for %d worker(s), elastic.queue_per_worker %d): adding a "
                                  "worker (%.0f samples/s before it)",
                                  in.pending, in.workers, e_.queue_per_worker, *before)};
}

void Autoscaler::PServerBeat(uint32_t node, absl::Time now, const proto::HeartbeatRequest& beat) {
  PServerWindow& w = pservers_[node];
  if (w.since == absl::InfiniteFuture()) w.since = now;  // (a window starts)
  const double secs = absl::ToDoubleSeconds(now - w.last_beat);
  if (w.last_beat != absl::InfinitePast() && secs > 0.05) {
    Sample s;
    s.at = now;
    s.queue = static_cast<double>(beat.apply_queue());
    s.cpu = beat.cpu_cores() > 0
                ? std::max(0.0, beat.cpu_seconds() - w.last_cpu_seconds) / secs / beat.cpu_cores()
                : 0;
    s.memory = beat.memory_limit_bytes() > 0 ? static_cast<double>(beat.rss_bytes()) /
                                                   static_cast<double>(beat.memory_limit_bytes())
                                             : 0;
    w.samples.push_back(s);
    const absl::Duration period = absl::Seconds(e_.pserver_signal_seconds);
    while (w.samples.size() > 1 && w.samples.front().at < now - period) w.samples.pop_front();
  } else if (secs <= 0.05 && w.last_beat != absl::InfinitePast()) {
    return;  // (too close to the last for a CPU share: the next one counts)
  }
  w.last_beat = now;
  w.last_cpu_seconds = beat.cpu_seconds();
}

Autoscaler::Means Autoscaler::Average(const PServerWindow& w) {
  Means m;
  for (const Sample& s : w.samples) {
    m.queue += s.queue;
    m.cpu += s.cpu;
    m.memory += s.memory;
  }
  const double n = static_cast<double>(std::max<size_t>(1, w.samples.size()));
  m.queue /= n;
  m.cpu /= n;
  m.memory /= n;
  return m;
}

std::optional<Autoscaler::Decision> Autoscaler::PServerTick(const Input& in) {
  const absl::Duration period = absl::Seconds(e_.pserver_signal_seconds);
  std::vector<std::pair<uint32_t, Means>> loads;
  for (uint32_t id : in.pservers) {
    auto it = pservers_.find(id);
    // Every pserver measured for a whole window, or no decision.
    if (it == pservers_.end() || it->second.samples.empty() || in.now - it->second.since < period) {
      return std::nullopt;
    }
    loads.emplace_back(id, Average(it->second));
  }
  if (loads.empty()) return std::nullopt;
  const int n = static_cast<int>(loads.size());
  const int secs = e_.pserver_signal_seconds;
  auto restart = [&] {
    for (auto& [id, w] : pservers_) {
      w.samples.clear();
      w.since = absl::InfiniteFuture();
    }
    last_decision_ = in.now;
  };
  for (const auto& [id, m] : loads) {
    std::string over;
    if (m.queue >= e_.pserver_queue_high) {
      over = absl::StrFormat("apply queue %.1f (elastic.pserver_queue_high %.1f)", m.queue,
                             e_.pserver_queue_high);
    } else if (m.cpu >= e_.pserver_cpu_high) {
      over = absl::StrFormat("CPU %.0f%% of its cores (elastic.pserver_cpu_high %.0f%%)",
                             100 * m.cpu, 100 * e_.pserver_cpu_high);
    } else if (m.memory >= e_.pserver_memory_high) {
      over = absl::StrFormat("memory %.0f%% of its limit (elastic.pserver_memory_high %.0f%%)",
                             100 * m.memory, 100 * e_.pserver_memory_high);
    }
    if (over.empty()) continue;
    if (n >= in.most_pservers) return std::nullopt;  // (at the most there may be)
    restart();
    return Decision{proto::PSERVER, 1,
                    absl::StrFormat("autoscale: pserver node %d averaged %s over %d s: adding a "
                                    "pserver (%d -> %d)",
                                    id, over, secs, n, n + 1)};
  }
  if (n <= in.least_pservers) return std::nullopt;
  Means sum, top;
  for (const auto& [id, m] : loads) {
    if (m.queue >= e_.pserver_queue_low || m.cpu >= e_.pserver_cpu_low ||
        m.memory >= e_.pserver_memory_low) {
      return std::nullopt;
    }
    sum.queue += m.queue;
    sum.cpu += m.cpu;
    sum.memory += m.memory;
    top.queue = std::max(top.queue, m.queue);
    top.cpu = std::max(top.cpu, m.cpu);
    top.memory = std::max(top.memory, m.memory);
  }
  // The others take the load of the one removed: they must stay under
  // the highs (or the next window adds it back).
  const double rest = n - 1;
  if (sum.queue / rest >= e_.pserver_queue_high || sum.cpu / rest >= e_.pserver_cpu_high ||
      sum.memory / rest >= e_.pserver_memory_high) {
    return std::nullopt;
  }
  restart();
  return Decision{
      proto::PSERVER, -1,
      absl::StrFormat("autoscale: every pserver under elastic.pserver_*_low over %d s (the "
                      "highest: apply queue %.1f, CPU %.0f%%, memory %.0f%%): removing a pserver "
                      "(%d -> %d), its partitions moved to the others first",
                      secs, top.queue, 100 * top.cpu, 100 * top.memory, n, n - 1)};
}

std::string Autoscaler::PServerLoad() const {
  if (pservers_.empty()) return "";
  Means top;
  bool any = false;
  for (const auto& [id, w] : pservers_) {
    if (w.samples.empty()) continue;
    const Means m = Average(w);
    top.queue = std::max(top.queue, m.queue);
    top.cpu = std::max(top.cpu, m.cpu);
    top.memory = std::max(top.memory, m.memory);
    any = true;
  }
  if (!any) return "";
  return absl::StrFormat("pservers (the highest): apply queue %.1f, CPU %.0f%%, memory %.0f%%",
                         top.queue, 100 * top.cpu, 100 * top.memory);
}

void Autoscaler::Refused() { measuring_.reset(); }

void Autoscaler::SetEnabled(bool on) {
  enabled_ = on;
  if (!on) measuring_.reset();
}

std::string Autoscaler::Describe() const {
  if (!enabled_) return "autoscale off";
  if (measuring_.has_value()) return "autoscale on, measuring the worker it added";
  std::string s = growth_stopped_
                      ? "autoscale on, not growing (the last worker added gained too little)"
                      : "autoscale on";
  if (const std::string load = PServerLoad(); !load.empty()) absl::StrAppend(&s, "; ", load);
  return s;
}

}  // namespace strata::master
