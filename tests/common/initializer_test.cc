#include "common/initializer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace strata {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::Each;
using ::testing::Eq;
using ::testing::HasSubstr;

InitSpec Glorot(uint64_t fan_in, uint64_t fan_out, uint32_t table_id, uint64_t seed) {
  InitSpec s;
  s.init = "glorot_uniform";
  s.fan_in = fan_in;
  s.fan_out = fan_out;
  s.table_id = table_id;
  s.seed = seed;
  return s;
}

std::vector<float> Slice(const InitSpec& spec, uint64_t offset, uint64_t n) {
  std::vector<float> out(n, -123.f);
  EXPECT_THAT(InitializeSlice(spec, offset, n, out.data()), IsOk());
  return out;
}

TEST(InitializerTest, ZerosOverwritesEveryElement) {
  InitSpec spec;
  spec.init = "zeros";
  spec.fan_in = 3;
  spec.fan_out = 5;
  // Slice() pre-fills with -123, so each 0 was written.
  EXPECT_THAT(Slice(spec, 0, 64), Each(Eq(0.f)));
  EXPECT_THAT(Slice(spec, 1000, 7), Each(Eq(0.f)));
}

TEST(InitializerTest, GlorotUniformStaysWithinLimitAndCentresOnZero) {
  // limit = sqrt(6 / (784 + 256)) = sqrt(0.00576923) = 0.0759555
  const InitSpec spec = Glorot(784, 256, 0, 1);
  const double limit = std::sqrt(6.0 / (784 + 256));
  ASSERT_NEAR(limit, 0.0759555, 1e-6);
  const uint64_t n = 200000;
  const std::vector<float> v = Slice(spec, 0, n);
  // Rounding to float is monotonic, so |x| <= float(limit) exactly.
  const float bound = static_cast<float>(limit);
  double sum = 0;
  for (float x : v) {
    ASSERT_GE(x, -bound);
    ASSERT_LE(x, bound);
    sum += x;
  }
  // Uniform on [-L, L]: sd of the mean = L / sqrt(3 n) = 0.0759555 / 774.6
  // = 9.8e-5. Allow 0.001 (about 10 sd).
  EXPECT_NEAR(sum / n, 0.0, 1e-3);
  // The values really spread over the range: within 1% of both ends.
  EXPECT_LT(*std::min_element(v.begin(), v.end()), -0.99 * limit);
  EXPECT_GT(*std::max_element(v.begin(), v.end()), 0.99 * limit);
  // Not all the same (a constant would also pass the bounds).
  EXPECT_NE(v[0], v[1]);
}

TEST(InitializerTest, TorchDefaultIsUniformOverOneOverRootFanIn) {
  // nn.Linear / nn.Conv*d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)); fan_out unused.
  InitSpec spec = Glorot(400, 7, 2, 3);
  spec.init = "torch_default";
  const float bound = static_cast<float>(1.0 / std::sqrt(400.0));  // 0.05
  const std::vector<float> v = Slice(spec, 0, 100000);
  for (float x : v) {
    ASSERT_GE(x, -bound);
    ASSERT_LE(x, bound);
  }
  EXPECT_LT(*std::min_element(v.begin(), v.end()), -0.99 * bound);
  EXPECT_GT(*std::max_element(v.begin(), v.end()), 0.99 * bound);
}

TEST(InitializerTest, SliceValuesDoNotDependOnHowTheTableIsCut) {
  const InitSpec spec = Glorot(100, 10, 3, 42);
  const std::vector<float> whole = Slice(spec, 0, 1000);
  // Two cuts at different places; each element must equal the one-call value.
  for (uint64_t cut : {1u, 300u, 999u}) {
    const std::vector<float> a = Slice(spec, 0, cut);
    const std::vector<float> b = Slice(spec, cut, 1000 - cut);
    for (uint64_t i = 0; i < cut; ++i) {
      ASSERT_EQ(a[i], whole[i]) << "cut " << cut << " element " << i;
    }
    for (uint64_t i = cut; i < 1000; ++i) {
      ASSERT_EQ(b[i - cut], whole[i]) << "cut " << cut << " element " << i;
    }
  }
  // A slice in the middle, as a second pserver would create it.
  const std::vector<float> mid = Slice(spec, 517, 20);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(mid[i], whole[517 + i]);
}

TEST(InitializerTest, SameSpecGivesSameValues) {
  EXPECT_EQ(Slice(Glorot(8, 8, 1, 7), 0, 50), Slice(Glorot(8, 8, 1, 7), 0, 50));
}

// Counts equal elements between two slices.
int CountEqual(const std::vector<float>& a, const std::vector<float>& b) {
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] == b[i];
  return n;
}

TEST(InitializerTest, SeedChangesValues) {
  const auto a = Slice(Glorot(8, 8, 1, 7), 0, 100);
  const auto b = Slice(Glorot(8, 8, 1, 8), 0, 100);
  EXPECT_EQ(CountEqual(a, b), 0);
}

TEST(InitializerTest, TableIdChangesValues) {
  // Two tables of the same shape and seed must not start identical.
  const auto a = Slice(Glorot(8, 8, 0, 7), 0, 100);
  const auto b = Slice(Glorot(8, 8, 1, 7), 0, 100);
  EXPECT_EQ(CountEqual(a, b), 0);
}

TEST(InitializerTest, UnknownInitializerIsInvalidArgumentNamingIt) {
  InitSpec spec = Glorot(8, 8, 0, 1);
  spec.init = "he_normal";
  float out[4];
  EXPECT_THAT(InitializeSlice(spec, 0, 4, out),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'he_normal'")));
}

}  // namespace
}  // namespace strata
