#include "common/data_tasks.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(DataTasksTest, RangesCoverEveryRecordOnceWithAShorterLastTask) {
  auto r = EpochTaskRanges(10, 4, 7, 0);
  std::sort(r.begin(), r.end());
  ASSERT_EQ(r.size(), 3u);
  using Range = std::pair<int64_t, int64_t>;
  EXPECT_EQ(r[0], Range(0, 4));
  EXPECT_EQ(r[1], Range(4, 8));
  EXPECT_EQ(r[2], Range(8, 10));
}

TEST(DataTasksTest, OrderDependsOnSeedAndEpochOnly) {
  EXPECT_EQ(EpochTaskRanges(1000, 10, 3, 1), EpochTaskRanges(1000, 10, 3, 1));
  EXPECT_NE(EpochTaskRanges(1000, 10, 3, 1), EpochTaskRanges(1000, 10, 3, 2));
  EXPECT_NE(EpochTaskRanges(1000, 10, 3, 1), EpochTaskRanges(1000, 10, 4, 1));
}

}  // namespace
}  // namespace strata
