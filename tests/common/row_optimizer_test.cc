#include "common/row_optimizer.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr double kTol = 1e-5;

// A row of two elements and three updates shared by every case.
const std::vector<float> kInitial = {1.0f, -2.0f};
const std::vector<std::vector<float>> kGrads = {{0.5f, -1.0f}, {1.0f, 1.0f}, {-0.25f, 0.5f}};

RowOptimizerSection Section(const std::string& type, double lr) {
  RowOptimizerSection c;
  c.type = type;
  c.learning_rate = lr;
  return c;
}

// Applies kGrads one update at a time (t = 1, 2, 3) and checks the row
// after each against `expected[t - 1]`.
void RunUpdates(const RowOptimizerSection& c, const std::vector<std::vector<double>>& expected) {
  auto opt = RowOptimizer::Create(c);
  ASSERT_TRUE(opt.ok()) << opt.status();
  const int dim = static_cast<int>(kInitial.size());
  std::vector<float> w = kInitial;
  std::vector<float> state((*opt)->slots() * dim, -1.f);
  (*opt)->InitState(state.data(), dim);
  for (size_t t = 1; t <= kGrads.size(); ++t) {
    (*opt)->Apply(w.data(), state.data(), kGrads[t - 1].data(), 1.f, dim, t);
    for (int j = 0; j < dim; ++j) {
      EXPECT_NEAR(w[j], expected[t - 1][j], kTol) << c.type << " update " << t << " element " << j;
    }
  }
}

TEST(RowOptimizerTest, Sgd) {
  // w -= 0.1 g: 1 - 0.05 = 0.95, -2 + 0.1 = -1.9; then -0.1, -0.1; then +0.025, -0.05.
  RunUpdates(Section("sgd", 0.1), {{0.95, -1.9}, {0.85, -2.0}, {0.875, -2.05}});
}

TEST(RowOptimizerTest, AdagradStartsFromItsInitialAccumulator) {
  RowOptimizerSection c = Section("adagrad", 0.1);
  c.initial_accumulator = 0.1;
  // Update 1, element 0: a = 0.1 + 0.25 = 0.35; w = 1 - 0.1 * 0.5 / sqrt(0.35) = 0.9154846.
  // Element 1: a = 0.1 + 1 = 1.1; w = -2 + 0.1 * 1 / sqrt(1.1) = -1.9046537.
  RunUpdates(c, {{0.9154846, -1.9046537}, {0.8294183, -1.9736603}, {0.8504534, -2.0062767}});
}

TEST(RowOptimizerTest, AdamUsesTheRowsOwnUpdateCount) {
  // Update 1: m = 0.1 g, v = 0.001 g^2, bias-corrected m/sqrt(v) = sign(g):
  // w = 1 - 0.1 = 0.9 and -2 + 0.1 = -1.9.
  RunUpdates(Section("adam", 0.1), {{0.9, -1.9}, {0.8034818, -1.9052632}, {0.7446211, -1.9304066}});
}

TEST(RowOptimizerTest, FtrlProximal) {
  RowOptimizerSection c = Section("ftrl", 0.1);  // alpha
  c.ftrl_beta = 1.0;
  c.l1 = 0.1;
  c.l2 = 0.5;
  // Update 1, element 0: n = 0.25, sigma = (0.5 - 0) / 0.1 = 5, z = 0.5 - 5 * 1 = -4.5;
  // w = -(-4.5 + 0.1) / ((1 + 0.5) / 0.1 + 0.5) = 4.4 / 15.5 = 0.2838710.
  RunUpdates(c, {{0.2838710, -0.9219512}, {0.2377462, -0.9625321}, {0.2491324, -0.9821400}});
}

TEST(RowOptimizerTest, FtrlL1KeepsWeakWeightsAtZero) {
  RowOptimizerSection c = Section("ftrl", 0.1);
  c.l1 = 10.0;  // |z| stays below it
  auto opt = RowOptimizer::Create(c);
  ASSERT_TRUE(opt.ok());
  float w = 0.f;
  float state[2];
  (*opt)->InitState(state, 1);
  for (uint32_t t = 1; t <= 5; ++t) {
    const float g = 0.3f;
    (*opt)->Apply(&w, state, &g, 1.f, 1, t);
    EXPECT_EQ(w, 0.f);
  }
}

TEST(RowOptimizerTest, GradScaleMultipliesTheGradient) {
  auto opt = RowOptimizer::Create(Section("sgd", 1.0));
  ASSERT_TRUE(opt.ok());
  float w = 1.f;
  const float g = 4.f;
  (*opt)->Apply(&w, nullptr, &g, 0.25f, 1, 1);  // the mean of a sum over 4 samples
  EXPECT_FLOAT_EQ(w, 0.f);
}

TEST(RowOptimizerTest, SlotsPerType) {
  EXPECT_EQ((*RowOptimizer::Create(Section("sgd", 1)))->slots(), 0);
  EXPECT_EQ((*RowOptimizer::Create(Section("adagrad", 1)))->slots(), 1);
  EXPECT_EQ((*RowOptimizer::Create(Section("adam", 1)))->slots(), 2);
  EXPECT_EQ((*RowOptimizer::Create(Section("ftrl", 1)))->slots(), 2);
  auto bad = RowOptimizer::Create(Section("momentum", 1));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("momentum"), std::string::npos);
}

}  // namespace
}  // namespace strata
