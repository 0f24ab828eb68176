#include "common/vector_ops.h"

#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Sizes around the vector widths, so the tails are covered.
const size_t kSizes[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 1000, 1027};

TEST(VectorOpsTest, AddIntoMatchesScalarLoop) {
  for (size_t n : kSizes) {
    auto sum = Random(n, 1), x = Random(n, 2);
    auto want = sum;
    for (size_t i = 0; i < n; ++i) want[i] += x[i];
    AddInto(sum.data(), x.data(), n);
    EXPECT_EQ(sum, want) << "n=" << n;
  }
}

TEST(VectorOpsTest, ReluForwardAndBackward) {
  for (size_t n : kSizes) {
    auto x = Random(n, 3), g = Random(n, 4);
    const auto before = x;
    ReluForward(x.data(), n);
    auto want_g = g;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(x[i], before[i] > 0 ? before[i] : 0.f) << "n=" << n << " i=" << i;
      if (!(x[i] > 0)) want_g[i] = 0.f;
    }
    ReluBackward(x.data(), g.data(), n);
    EXPECT_EQ(g, want_g) << "n=" << n;
  }
}

TEST(VectorOpsTest, BiasRowsAndColumnSums) {
  for (size_t rows : {1u, 3u, 17u}) {
    for (size_t cols : {1u, 5u, 9u, 33u}) {
      auto x = Random(rows * cols, 5), bias = Random(cols, 6);
      auto want = x;
      std::vector<double> sums(cols, 0.0);
      for (size_t r = 0; r < rows; ++r) {
        for (size_t c = 0; c < cols; ++c) {
          want[r * cols + c] += bias[c];
          sums[c] += x[r * cols + c];
        }
      }
      std::vector<float> out(cols, 123.f);  // overwritten, not added to
      SumRows(x.data(), out.data(), rows, cols);
      for (size_t c = 0; c < cols; ++c) EXPECT_NEAR(out[c], sums[c], 1e-5) << c;
      AddBiasRows(x.data(), bias.data(), rows, cols);
      EXPECT_EQ(x, want) << rows << "x" << cols;
    }
  }
}

TEST(FlushDenormalsToZeroTest, DenormalsBecomeZeroInThisThreadAndItsChildren) {
  // On a thread of its own: the mode is per thread.
  std::thread([] {
    volatile float tiny = 1e-39f;  // denormal: below FLT_MIN (1.18e-38)
    ASSERT_NE(tiny * 1.0f, 0.f);
    FlushDenormalsToZero();
#if defined(__SSE__)
    EXPECT_EQ(tiny * 1.0f, 0.f);
    volatile float small = 1e-30f;
    EXPECT_EQ(small * 1e-10f, 0.f);                            // a denormal result is flushed too
    std::thread([&] { EXPECT_EQ(tiny * 1.0f, 0.f); }).join();  // inherited
#endif
    EXPECT_EQ(static_cast<float>(1e-30f) * 2.f, 2e-30f);  // normal values unchanged
  }).join();
}

}  // namespace
}  // namespace strata
