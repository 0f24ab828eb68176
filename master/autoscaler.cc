#include "master/autoscaler.h"

#include <algorithm>

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
          0, absl::StrFormat(
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
    return Decision{-release, absl::StrFormat("autoscale: %d worker(s) idle at the job's tail "
                                              "(no data task left for them): releasing %d",
                                              in.idle, release)};
  }
  // A deep queue: one more worker, measured before and after.
  const uint64_t deep = static_cast<uint64_t>(e_.queue_per_worker) * std::max(1, in.workers);
  if (growth_stopped_ || measuring_.has_value() || in.workers >= in.most || in.pending < deep ||
      in.now - last_scale_end_ < window) {
    return std::nullopt;
  }
  const std::optional<double> before = Rate(in.now, window);
  if (!before.has_value()) return std::nullopt;
  measuring_ = Measuring{*before, in.workers, absl::InfiniteFuture()};
  last_decision_ = in.now;
  return Decision{1, absl::StrFormat("autoscale: the data-task queue is deep (%d tasks pending "
                                     "for %d worker(s), elastic.queue_per_worker %d): adding a "
                                     "worker (%.0f samples/s before it)",
                                     in.pending, in.workers, e_.queue_per_worker, *before)};
}

void Autoscaler::Refused() { measuring_.reset(); }

void Autoscaler::SetEnabled(bool on) {
  enabled_ = on;
  if (!on) measuring_.reset();
}

std::string Autoscaler::Describe() const {
  if (!enabled_) return "autoscale off";
  if (measuring_.has_value()) return "autoscale on, measuring the worker it added";
  if (growth_stopped_) return "autoscale on, not growing (the last worker added gained too little)";
  return "autoscale on";
}

}  // namespace strata::master
