#include "common/data_tasks.h"

#include <algorithm>
#include <random>

namespace strata {

std::vector<std::pair<int64_t, int64_t>> EpochTaskRanges(int64_t records, int64_t task_records,
                                                         uint64_t seed, int epoch) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t b = 0; b < records; b += task_records) {
    ranges.emplace_back(b, std::min(records, b + task_records));
  }
  std::mt19937_64 rng(seed * 1000003 + epoch);
  std::shuffle(ranges.begin(), ranges.end(), rng);
  return ranges;
}

}  // namespace strata
