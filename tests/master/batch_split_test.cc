#include "master/batch_split.h"

#include <cstdint>
#include <map>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace strata::master {
namespace {

using Split = std::map<uint32_t, int64_t>;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(BatchSplitterTest, EvenUntilMeasuredThenInProportionToTheSpeeds) {
  BatchSplitter s;
  bool remade = false;
  EXPECT_EQ(s.Split(128, {5, 9}, kT0, &remade), (Split{{5, 64}, {9, 64}}));
  EXPECT_TRUE(remade);
  EXPECT_EQ(s.Split(128, {5, 9}, kT0, &remade), (Split{{5, 64}, {9, 64}}));
  EXPECT_FALSE(remade);
  // Worker 5 computes 3000 samples/s, worker 9 1000.
  s.Observe(5, 0, 0);
  s.Observe(9, 0, 0);
  s.Observe(5, 3000, 1.0);
  s.Observe(9, 1000, 1.0);
  EXPECT_DOUBLE_EQ(s.SpeedOf(5), 3000);
  // Measured now, but a split is remade for a speed at most every 10 s.
  EXPECT_EQ(s.Split(128, {5, 9}, kT0 + absl::Seconds(9), &remade), (Split{{5, 64}, {9, 64}}));
  EXPECT_FALSE(remade);
  EXPECT_EQ(s.Split(128, {5, 9}, kT0 + absl::Seconds(10), &remade), (Split{{5, 96}, {9, 32}}));
  EXPECT_TRUE(remade);
  // A window shorter than half a second of compute is not a sample yet.
  s.Observe(9, 1100, 1.2);
  EXPECT_DOUBLE_EQ(s.SpeedOf(9), 1000);
  // Small drifts (under 15%) keep the split; the shares always sum up.
  s.Observe(9, 1550, 1.5);  // 1100 samples/s, smoothed to 1050
  EXPECT_EQ(s.Split(128, {5, 9}, kT0 + absl::Seconds(60), &remade), (Split{{5, 96}, {9, 32}}));
  EXPECT_FALSE(remade);
}

TEST(BatchSplitterTest, SharesSumToTheGlobalBatchAndNobodyGetsNone) {
  BatchSplitter s;
  s.Observe(1, 0, 0);
  s.Observe(2, 0, 0);
  s.Observe(3, 0, 0);
  s.Observe(1, 100000, 1.0);
  s.Observe(2, 10, 1.0);
  s.Observe(3, 333, 1.0);
  bool remade = false;
  const Split split = s.Split(100, {1, 2, 3}, kT0, &remade);
  int64_t sum = 0;
  for (const auto& [w, share] : split) {
    EXPECT_GE(share, 1) << "worker " << w;
    sum += share;
  }
  EXPECT_EQ(sum, 100);
  EXPECT_GT(split.at(1), split.at(3));
  EXPECT_GE(split.at(3), split.at(2));
}

TEST(BatchSplitterTest, ANewWorkerGetsTheMeanSpeedAndARestartCountsAfresh) {
  BatchSplitter s;
  s.Observe(1, 0, 0);
  s.Observe(1, 2000, 1.0);
  s.Observe(2, 0, 0);
  s.Observe(2, 1000, 1.0);
  bool remade = false;
  // Worker 3 is not measured: it counts at the mean (1500).
  EXPECT_EQ(s.Split(90, {1, 2, 3}, kT0, &remade), (Split{{1, 40}, {2, 20}, {3, 30}}));
  // Worker 2 restarted: its counters went back; the old speed stands
  // until a new window is measured.
  s.Observe(2, 10, 0.01);
  EXPECT_DOUBLE_EQ(s.SpeedOf(2), 1000);
  // One that leaves is forgotten.
  s.Forget(1);
  EXPECT_DOUBLE_EQ(s.SpeedOf(1), 0);
  // A change of the workers remakes it at once.
  EXPECT_EQ(s.Split(90, {2, 3}, kT0 + absl::Seconds(1), &remade), (Split{{2, 45}, {3, 45}}));
  EXPECT_TRUE(remade);
}

}  // namespace
}  // namespace strata::master
