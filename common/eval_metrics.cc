#include "common/eval_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "glog/logging.h"

namespace strata {

double Auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  CHECK_EQ(scores.size(), labels.size()) << "Auc: scores and labels differ";
  const size_t n = scores.size();
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return scores[a] < scores[b]; });

  // Sum of the (1-based, tie-averaged) ranks of the positives.
  double positive_rank_sum = 0;
  int64_t positives = 0;
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    // Ranks i+1 .. j share their average.
    const double average_rank = 0.5 * static_cast<double>(i + 1 + j);
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        positive_rank_sum += average_rank;
        ++positives;
      }
    }
    i = j;
  }
  const int64_t negatives = static_cast<int64_t>(n) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  const double p = static_cast<double>(positives);
  const double u = positive_rank_sum - p * (p + 1) / 2;
  return u / (p * static_cast<double>(negatives));
}

double LogLoss(const std::vector<float>& probs, const std::vector<float>& labels) {
  CHECK_EQ(probs.size(), labels.size()) << "LogLoss: probs and labels differ";
  if (probs.empty()) return 0;
  constexpr double kEps = 1e-7;
  double sum = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double p = std::clamp(static_cast<double>(probs[i]), kEps, 1 - kEps);
    sum -= labels[i] > 0.5f ? std::log(p) : std::log1p(-p);
  }
  return sum / static_cast<double>(probs.size());
}

}  // namespace strata
