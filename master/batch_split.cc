#include "master/batch_split.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace strata::master {

void BatchSplitter::Observe(uint32_t node, uint64_t samples, double compute_seconds) {
  auto [it, added] = speeds_.try_emplace(node);
  Speed& s = it->second;
  if (added || samples < s.samples || compute_seconds < s.compute) {
    // New, or a restarted worker counting from 0 again: a fresh start.
    s.samples = samples;
    s.compute = compute_seconds;
    return;
  }
  const double span = compute_seconds - s.compute;
  if (span < options_.window_seconds) return;
  const double rate = static_cast<double>(samples - s.samples) / span;
  // Smoothed over the last few windows: a worker's speed changes (another
  // job on its host, a throttled device) and is followed within seconds.
  s.rate = s.rate == 0 ? rate : 0.5 * s.rate + 0.5 * rate;
  s.samples = samples;
  s.compute = compute_seconds;
}

void BatchSplitter::Forget(uint32_t node) { speeds_.erase(node); }

double BatchSplitter::SpeedOf(uint32_t node) const {
  auto it = speeds_.find(node);
  return it != speeds_.end() ? it->second.rate : 0;
}

bool BatchSplitter::SpeedDrifted(const std::vector<uint32_t>& workers) const {
  for (uint32_t w : workers) {
    const double now = SpeedOf(w);
    auto it = split_rates_.find(w);
    const double then = it != split_rates_.end() ? it->second : 0;
    if ((now == 0) != (then == 0)) return true;  // measured since
    if (then > 0 && std::abs(now / then - 1) > options_.drift) return true;
  }
  return false;
}

const std::map<uint32_t, int64_t>& BatchSplitter::Split(int64_t global,
                                                        const std::vector<uint32_t>& workers,
                                                        absl::Time now, bool* remade) {
  *remade = workers != split_workers_ || global != split_global_ ||
            (now - made_at_ >= options_.min_interval && SpeedDrifted(workers));
  if (!*remade) return split_;
  made_at_ = now;
  // Weights: the measured speeds, the mean of those for the unmeasured.
  std::vector<double> weight(workers.size());
  double known = 0;
  int n_known = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    weight[i] = SpeedOf(workers[i]);
    if (weight[i] > 0) {
      known += weight[i];
      ++n_known;
    }
  }
  const double fill = n_known > 0 ? known / n_known : 1.0;
  for (double& w : weight) w = w > 0 ? w : fill;
  const double total = std::accumulate(weight.begin(), weight.end(), 0.0);
  // Largest remainder: floors first, then one more record to the largest
  // fractions, so the shares sum to global exactly.
  const int64_t floor_each = global >= static_cast<int64_t>(workers.size()) ? 1 : 0;
  const int64_t spread = global - floor_each * static_cast<int64_t>(workers.size());
  std::vector<int64_t> share(workers.size());
  std::vector<std::pair<double, size_t>> rest;
  int64_t given = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    const double exact = static_cast<double>(spread) * weight[i] / total;
    share[i] = floor_each + static_cast<int64_t>(std::floor(exact));
    given += share[i];
    rest.emplace_back(exact - std::floor(exact), i);
  }
  std::sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (size_t k = 0; given < global && k < rest.size(); ++k, ++given) ++share[rest[k].second];

  split_.clear();
  split_rates_.clear();
  for (size_t i = 0; i < workers.size(); ++i) {
    split_[workers[i]] = share[i];
    split_rates_[workers[i]] = SpeedOf(workers[i]);
  }
  split_workers_ = workers;
  split_global_ = global;
  return split_;
}

}  // namespace strata::master
