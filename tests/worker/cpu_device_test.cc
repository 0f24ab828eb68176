#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "worker/device.h"

namespace strata::worker {
namespace {

using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<float> RandomVector(size_t n, std::mt19937* rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

// C = alpha * op(A) op(B) + beta * C in double, with the storage conventions of
// Device::Gemm: A is stored m x k (or k x m when trans_a), B k x n (or n x k).
std::vector<double> NaiveGemm(bool ta, bool tb, int m, int n, int k, double alpha,
                              const std::vector<float>& a, const std::vector<float>& b, double beta,
                              const std::vector<float>& c) {
  std::vector<double> out(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        const double av =
            ta ? a[static_cast<size_t>(p) * m + i] : a[static_cast<size_t>(i) * k + p];
        const double bv =
            tb ? b[static_cast<size_t>(j) * k + p] : b[static_cast<size_t>(p) * n + j];
        acc += av * bv;
      }
      const size_t idx = static_cast<size_t>(i) * n + j;
      out[idx] = alpha * acc + (beta == 0 ? 0.0 : beta * c[idx]);
    }
  }
  return out;
}

struct GemmCase {
  bool trans_a;
  bool trans_b;
  int m, n, k;
  float alpha, beta;
};

std::string GemmCaseName(const ::testing::TestParamInfo<GemmCase>& info) {
  const GemmCase& c = info.param;
  std::string s = std::string(c.trans_a ? "AT" : "AN") + (c.trans_b ? "BT" : "BN") + "_" +
                  std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
                  "_case" + std::to_string(info.index);
  return s;
}

class CpuDeviceGemmTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CpuDeviceGemmTest, MatchesNaiveTripleLoop) {
  const GemmCase& p = GetParam();
  std::mt19937 rng(1234 + p.m * 31 + p.n * 7 + p.k);
  const auto a = RandomVector(static_cast<size_t>(p.m) * p.k, &rng);
  const auto b = RandomVector(static_cast<size_t>(p.k) * p.n, &rng);
  const auto c0 = RandomVector(static_cast<size_t>(p.m) * p.n, &rng);
  const auto want = NaiveGemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a, b, p.beta, c0);

  auto dev = NewCpuDevice(1);
  std::vector<float> c = c0;
  dev->Gemm(p.trans_a, p.trans_b, p.m, p.n, p.k, p.alpha, a.data(), b.data(), p.beta, c.data());
  ASSERT_EQ(c.size(), want.size());
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_NEAR(c[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "index " << i;
  }
}

std::vector<GemmCase> AllGemmCases() {
  std::vector<GemmCase> cases;
  const int sizes[][3] = {{7, 5, 3}, {1, 1, 1}, {33, 17, 9}, {3, 8, 1}, {1, 6, 11}};
  const float ab[][2] = {{1.f, 0.f}, {1.5f, 0.5f}, {-0.75f, 1.f}, {0.f, 2.f}};
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (const auto& s : sizes) {
        for (const auto& coef : ab) {
          cases.push_back({ta, tb, s[0], s[1], s[2], coef[0], coef[1]});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, CpuDeviceGemmTest, ::testing::ValuesIn(AllGemmCases()),
                         GemmCaseName);

TEST(CpuDeviceTest, GemmTransposeCombinationsAgreeOnSameProduct) {
  // The same product A(2x3) * B(3x2) written four ways must give one answer.
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};       // 2x3
  const std::vector<float> a_t = {1, 4, 2, 5, 3, 6};     // 3x2, = A^T
  const std::vector<float> b = {7, 8, 9, 10, 11, 12};    // 3x2
  const std::vector<float> b_t = {7, 9, 11, 8, 10, 12};  // 2x3, = B^T
  // Row 0: 1*7+2*9+3*11 = 58, 1*8+2*10+3*12 = 64.
  // Row 1: 4*7+5*9+6*11 = 139, 4*8+5*10+6*12 = 154.
  const std::vector<float> want = {58, 64, 139, 154};
  auto dev = NewCpuDevice(1);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> c(4, -1.f);
      dev->Gemm(ta, tb, 2, 2, 3, 1.f, ta ? a_t.data() : a.data(), tb ? b_t.data() : b.data(), 0.f,
                c.data());
      EXPECT_THAT(c, ::testing::ElementsAreArray(want)) << "ta=" << ta << " tb=" << tb;
    }
  }
}

TEST(CpuDeviceTest, GemmBetaOneAccumulatesIntoC) {
  auto dev = NewCpuDevice(1);
  const std::vector<float> a = {1, 2};  // 1x2
  const std::vector<float> b = {3, 4};  // 2x1
  std::vector<float> c = {100.f};
  dev->Gemm(false, false, 1, 1, 2, 2.f, a.data(), b.data(), 1.f, c.data());
  EXPECT_FLOAT_EQ(c[0], 100.f + 2.f * (1 * 3 + 2 * 4));
  dev->Gemm(false, false, 1, 1, 2, 2.f, a.data(), b.data(), 1.f, c.data());
  EXPECT_FLOAT_EQ(c[0], 100.f + 4.f * 11.f);
}

TEST(CpuDeviceTest, GemmBetaZeroOverwritesGarbageInC) {
  // The MLP reuses buffers with beta = 0, so stale contents (even NaN) must not
  // leak into the result.
  auto dev = NewCpuDevice(1);
  std::mt19937 rng(7);
  const int m = 5, n = 4, k = 3;
  const auto a = RandomVector(m * k, &rng);
  const auto b = RandomVector(k * n, &rng);
  std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());
  dev->Gemm(false, false, m, n, k, 1.f, a.data(), b.data(), 0.f, c.data());
  const auto want = NaiveGemm(false, false, m, n, k, 1.0, a, b, 0.0, c);
  for (int i = 0; i < m * n; ++i) {
    ASSERT_FALSE(std::isnan(c[i])) << "index " << i;
    EXPECT_NEAR(c[i], want[i], 1e-5);
  }
}

TEST(CpuDeviceTest, GemmStridedWorksOnColumnBlocksOfLargerMatrices) {
  // What the MLP does per weight row block: forward out += X[:, r0:r1] W[r0:r1, :]
  // and backward dW[r0:r1, :] = X[:, r0:r1]^T D, X stored with its full width.
  auto dev = NewCpuDevice(1);
  std::mt19937 rng(11);
  const int batch = 7, din = 9, dout = 5;
  const auto x = RandomVector(batch * din, &rng);
  const auto w = RandomVector(din * dout, &rng);
  const auto d = RandomVector(batch * dout, &rng);
  const auto want_out = NaiveGemm(false, false, batch, dout, din, 1.0, x, w, 0.0,
                                  std::vector<float>(batch * dout, 0.f));
  const auto want_dw =
      NaiveGemm(true, false, din, dout, batch, 1.0, x, d, 0.0, std::vector<float>(din * dout, 0.f));
  std::vector<float> out(batch * dout, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> dw(din * dout, std::numeric_limits<float>::quiet_NaN());
  const int bounds[] = {0, 2, 3, 7, 9};  // uneven blocks, one of a single row
  for (int b = 0; b + 1 < 5; ++b) {
    const int r0 = bounds[b], rows = bounds[b + 1] - r0;
    dev->GemmStrided(false, false, batch, dout, rows, 1.f, x.data() + r0, din, w.data() + r0 * dout,
                     dout, b == 0 ? 0.f : 1.f, out.data(), dout);
    dev->GemmStrided(true, false, rows, dout, batch, 1.f, x.data() + r0, din, d.data(), dout, 0.f,
                     dw.data() + r0 * dout, dout);
  }
  for (int i = 0; i < batch * dout; ++i) EXPECT_NEAR(out[i], want_out[i], 1e-5) << i;
  for (int i = 0; i < din * dout; ++i) EXPECT_NEAR(dw[i], want_dw[i], 1e-5) << i;
}

TEST(CpuDeviceTest, NameIsCpu) { EXPECT_STREQ(NewCpuDevice(0)->name(), "cpu"); }

TEST(CpuDeviceTest, AddBiasAddsToEveryRow) {
  auto dev = NewCpuDevice(1);
  std::vector<float> x = {1, 2, 3,   //
                          4, 5, 6};  // 2x3
  const std::vector<float> bias = {10, -1, 0.5f};
  dev->AddBias(2, 3, bias.data(), x.data());
  EXPECT_THAT(x, ::testing::ElementsAre(11, 1, 3.5f, 14, 4, 6.5f));
}

TEST(CpuDeviceTest, AddBiasSingleColumnAndSingleRow) {
  auto dev = NewCpuDevice(1);
  std::vector<float> col = {1, 2, 3};  // 3x1
  const float b1 = -2.f;
  dev->AddBias(3, 1, &b1, col.data());
  EXPECT_THAT(col, ::testing::ElementsAre(-1, 0, 1));
  std::vector<float> row = {1, 2, 3};  // 1x3
  const std::vector<float> b3 = {1, 1, 1};
  dev->AddBias(1, 3, b3.data(), row.data());
  EXPECT_THAT(row, ::testing::ElementsAre(2, 3, 4));
}

TEST(CpuDeviceTest, ColumnSumSumsColumnsAndOverwritesOutput) {
  auto dev = NewCpuDevice(1);
  const std::vector<float> g = {1,  2, 3,    //
                                4,  5, 6,    //
                                -1, 0, 10};  // 3x3
  std::vector<float> out = {99, 99, 99};     // stale values must be replaced
  dev->ColumnSum(3, 3, g.data(), out.data());
  EXPECT_THAT(out, ::testing::ElementsAre(4, 7, 19));
}

TEST(CpuDeviceTest, ColumnSumMatchesNaiveOnRandomOddShape) {
  auto dev = NewCpuDevice(1);
  std::mt19937 rng(11);
  const int rows = 13, cols = 7;
  const auto g = RandomVector(rows * cols, &rng);
  std::vector<float> out(cols, std::numeric_limits<float>::quiet_NaN());
  dev->ColumnSum(rows, cols, g.data(), out.data());
  for (int c = 0; c < cols; ++c) {
    double want = 0;
    for (int r = 0; r < rows; ++r) want += g[r * cols + c];
    EXPECT_NEAR(out[c], want, 1e-5) << "column " << c;
  }
}

double RefForward(Activation act, double x) {
  switch (act) {
    case Activation::kRelu:
      return x > 0 ? x : 0;
    case Activation::kTanh:
      return std::tanh(x);
    case Activation::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
  }
  return 0;
}

// f'(x), computed from the input x rather than the output.
double RefDerivative(Activation act, double x) {
  switch (act) {
    case Activation::kRelu:
      return x > 0 ? 1 : 0;
    case Activation::kTanh: {
      const double ch = std::cosh(x);
      return 1.0 / (ch * ch);
    }
    case Activation::kSigmoid: {
      const double e = std::exp(-x);
      return e / ((1 + e) * (1 + e));
    }
  }
  return 0;
}

class CpuDeviceActivationTest : public ::testing::TestWithParam<Activation> {};

const std::vector<float>& ActivationInputs() {
  static const std::vector<float> xs = {-8.f,  -3.f, -1.f, -0.5f, -0.01f, 0.01f,
                                        0.25f, 0.5f, 1.f,  2.f,   3.5f,   8.f};
  return xs;
}

TEST_P(CpuDeviceActivationTest, ForwardMatchesReference) {
  const Activation act = GetParam();
  auto dev = NewCpuDevice(1);
  std::vector<float> x = ActivationInputs();
  dev->ActivationForward(act, static_cast<int64_t>(x.size()), x.data());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(x[i], RefForward(act, ActivationInputs()[i]), 1e-6)
        << "x = " << ActivationInputs()[i];
  }
}

TEST_P(CpuDeviceActivationTest, BackwardFromOutputMatchesAnalyticDerivative) {
  const Activation act = GetParam();
  auto dev = NewCpuDevice(1);
  const std::vector<float>& xs = ActivationInputs();
  std::vector<float> y = xs;
  dev->ActivationForward(act, static_cast<int64_t>(y.size()), y.data());
  std::mt19937 rng(3);
  const auto g0 = RandomVector(xs.size(), &rng, -2.f, 2.f);
  std::vector<float> g = g0;
  dev->ActivationBackward(act, static_cast<int64_t>(g.size()), y.data(), g.data());
  for (size_t i = 0; i < g.size(); ++i) {
    const double want = g0[i] * RefDerivative(act, xs[i]);
    EXPECT_NEAR(g[i], want, 1e-5 * (1 + std::abs(want))) << "x = " << xs[i];
  }
}

TEST_P(CpuDeviceActivationTest, BackwardMatchesFiniteDifferenceOfForward) {
  const Activation act = GetParam();
  auto dev = NewCpuDevice(1);
  const double eps = 1e-3;
  for (float x : ActivationInputs()) {
    const float xp = static_cast<float>(x + eps), xm = static_cast<float>(x - eps);
    float y = x, yp = xp, ym = xm;
    dev->ActivationForward(act, 1, &y);
    dev->ActivationForward(act, 1, &yp);
    dev->ActivationForward(act, 1, &ym);
    float g = 1.f;
    dev->ActivationBackward(act, 1, &y, &g);
    const double fd = (static_cast<double>(yp) - ym) / (static_cast<double>(xp) - xm);
    EXPECT_NEAR(g, fd, 2e-3) << "x = " << x;
  }
}

TEST_P(CpuDeviceActivationTest, ZeroLengthIsNoOp) {
  auto dev = NewCpuDevice(1);
  float x = 5.f, g = 7.f;
  dev->ActivationForward(GetParam(), 0, &x);
  dev->ActivationBackward(GetParam(), 0, &x, &g);
  EXPECT_EQ(x, 5.f);
  EXPECT_EQ(g, 7.f);
}

INSTANTIATE_TEST_SUITE_P(AllActivations, CpuDeviceActivationTest,
                         ::testing::Values(Activation::kRelu, Activation::kTanh,
                                           Activation::kSigmoid),
                         [](const ::testing::TestParamInfo<Activation>& info) {
                           switch (info.param) {
                             case Activation::kRelu:
                               return std::string("Relu");
                             case Activation::kTanh:
                               return std::string("Tanh");
                             case Activation::kSigmoid:
                               return std::string("Sigmoid");
                           }
                           return std::string("Unknown");
                         });

TEST(CpuDeviceTest, ReluForwardClampsNegativesAndKeepsPositives) {
  auto dev = NewCpuDevice(1);
  std::vector<float> x = {-2.f, 0.f, 3.f};
  dev->ActivationForward(Activation::kRelu, 3, x.data());
  EXPECT_THAT(x, ::testing::ElementsAre(0.f, 0.f, 3.f));
  std::vector<float> g = {5.f, 5.f, 5.f};
  dev->ActivationBackward(Activation::kRelu, 3, x.data(), g.data());
  EXPECT_THAT(g, ::testing::ElementsAre(0.f, 0.f, 5.f));
}

TEST(CpuDeviceTest, SoftmaxCrossEntropyMatchesHandComputedExample) {
  // Row 0: logits [1, 2, 3], label 0.
  //   shifted by max 3: [-2, -1, 0]; exp: [0.135335, 0.367879, 1]; sum 1.503215
  //   log-sum-exp (shifted) = ln 1.503215 = 0.407606
  //   loss0 = 0.407606 - (1 - 3) = 2.407606
  //   softmax = [0.090031, 0.244728, 0.665241]
  //   grad0 = softmax - onehot(0) = [-0.909969, 0.244728, 0.665241]
  //   argmax 2 != label 0: not correct.
  // Row 1: logits [2, 0, 0], label 0.
  //   shifted: [0, -2, -2]; exp: [1, 0.135335, 0.135335]; sum 1.270671
  //   loss1 = ln 1.270671 - 0 = 0.239545
  //   softmax = [0.786986, 0.106507, 0.106507]
  //   grad1 = [-0.213014, 0.106507, 0.106507]
  //   argmax 0 == label 0: correct.
  // Summed loss = 2.407606 + 0.239545 = 2.647151.
  auto dev = NewCpuDevice(1);
  const std::vector<float> logits = {1, 2, 3, 2, 0, 0};
  const std::vector<int32_t> labels = {0, 0};
  std::vector<float> grad(6, 42.f);
  int64_t correct = 0;
  const double loss =
      dev->SoftmaxCrossEntropy(2, 3, logits.data(), labels.data(), grad.data(), &correct);
  EXPECT_NEAR(loss, 2.647151, 1e-5);
  const std::vector<float> want = {-0.909969f, 0.244728f, 0.665241f,
                                   -0.213014f, 0.106507f, 0.106507f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(grad[i], want[i], 1e-5) << "index " << i;
  EXPECT_EQ(correct, 1);
}

TEST(CpuDeviceTest, SoftmaxCrossEntropyGradientRowsSumToZero) {
  auto dev = NewCpuDevice(1);
  std::mt19937 rng(5);
  const int rows = 6, classes = 5;
  const auto logits = RandomVector(rows * classes, &rng, -4.f, 4.f);
  const std::vector<int32_t> labels = {0, 1, 2, 3, 4, 2};
  std::vector<float> grad(rows * classes);
  dev->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), grad.data(), nullptr);
  for (int r = 0; r < rows; ++r) {
    double s = 0;
    for (int c = 0; c < classes; ++c) {
      const float g = grad[r * classes + c];
      s += g;
      if (c == labels[r]) {
        EXPECT_LT(g, 0.f);
        EXPECT_GE(g, -1.f);
      } else {
        EXPECT_GT(g, 0.f);
        EXPECT_LE(g, 1.f);
      }
    }
    EXPECT_NEAR(s, 0.0, 1e-6) << "row " << r;
  }
}

TEST(CpuDeviceTest, SoftmaxCrossEntropyGradientMatchesFiniteDifference) {
  auto dev = NewCpuDevice(1);
  std::mt19937 rng(9);
  const int rows = 3, classes = 4;
  auto logits = RandomVector(rows * classes, &rng, -2.f, 2.f);
  const std::vector<int32_t> labels = {3, 0, 1};
  std::vector<float> grad(rows * classes);
  dev->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), grad.data(), nullptr);
  const float eps = 1e-2f;
  for (int i = 0; i < rows * classes; ++i) {
    const float saved = logits[i];
    logits[i] = saved + eps;
    const double lp =
        dev->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), nullptr, nullptr);
    logits[i] = saved - eps;
    const double lm =
        dev->SoftmaxCrossEntropy(rows, classes, logits.data(), labels.data(), nullptr, nullptr);
    logits[i] = saved;
    EXPECT_NEAR(grad[i], (lp - lm) / (2 * eps), 1e-4) << "index " << i;
  }
}

TEST(CpuDeviceTest, SoftmaxCrossEntropyIsStableForLargeLogits) {
  auto dev = NewCpuDevice(1);
  // Row 0: [1000, 0, -1000], label 0 -> softmax ~ onehot(0): loss ~ 0, grad ~ 0.
  // Row 1: same logits, label 1 -> loss = 1000 + ln(1 + e^-1000 + e^-2000) ~ 1000.
  // Row 2: [1000, 1000, 1000], label 2 -> uniform: loss ln 3, grad [1/3, 1/3, -2/3].
  const std::vector<float> logits = {1000, 0, -1000, 1000, 0, -1000, 1000, 1000, 1000};
  const std::vector<int32_t> labels = {0, 1, 2};
  std::vector<float> grad(9);
  int64_t correct = 0;
  const double loss =
      dev->SoftmaxCrossEntropy(3, 3, logits.data(), labels.data(), grad.data(), &correct);
  ASSERT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, 1000.0 + std::log(3.0), 1e-6);
  for (float g : grad) ASSERT_TRUE(std::isfinite(g));
  const std::vector<float> want = {0, 0, 0, 1, -1, 0, 1.f / 3, 1.f / 3, -2.f / 3};
  for (int i = 0; i < 9; ++i) EXPECT_NEAR(grad[i], want[i], 1e-6) << "index " << i;
  // Row 0 is right; row 1 (argmax 0, label 1) is wrong; row 2 depends on tie
  // breaking, so check it separately below.
  int64_t c0 = 0;
  dev->SoftmaxCrossEntropy(2, 3, logits.data(), labels.data(), nullptr, &c0);
  EXPECT_EQ(c0, 1);

  const std::vector<float> very_negative = {-1000, -1001, -1002};
  const int32_t label = 2;
  const double l2 = dev->SoftmaxCrossEntropy(1, 3, very_negative.data(), &label, nullptr, nullptr);
  // = 2 + ln(1 + e^-1 + e^-2)
  EXPECT_NEAR(l2, 2.0 + std::log(1 + std::exp(-1.0) + std::exp(-2.0)), 1e-6);
}

TEST(CpuDeviceTest, SoftmaxCrossEntropyCountsArgmaxMatchesAndAccumulates) {
  auto dev = NewCpuDevice(1);
  const std::vector<float> logits = {0.1f, 0.9f, 0.0f,   // argmax 1
                                     5.0f, -1.f, 2.0f,   // argmax 0
                                     -3.f, -2.f, -1.f,   // argmax 2
                                     0.0f, 0.0f, 7.0f};  // argmax 2
  const std::vector<int32_t> labels = {1, 0, 1, 2};      // rows 0, 1, 3 correct
  int64_t correct = 10;                                  // added to, not overwritten
  dev->SoftmaxCrossEntropy(4, 3, logits.data(), labels.data(), nullptr, &correct);
  EXPECT_EQ(correct, 13);
}

TEST(CpuDeviceTest, SoftmaxCrossEntropyLossIndependentOfGradAndCorrectPointers) {
  auto dev = NewCpuDevice(1);
  const std::vector<float> logits = {0.3f, -0.2f, 1.1f, 0.0f};
  const std::vector<int32_t> labels = {1, 0};
  std::vector<float> grad(4);
  int64_t correct = 0;
  const double a = dev->SoftmaxCrossEntropy(2, 2, logits.data(), labels.data(), nullptr, nullptr);
  const double b =
      dev->SoftmaxCrossEntropy(2, 2, logits.data(), labels.data(), grad.data(), &correct);
  EXPECT_DOUBLE_EQ(a, b);
  // Row 0: ln(e^0.3 + e^-0.2) - (-0.2); row 1: ln(e^1.1 + 1) - 1.1.
  const double want =
      std::log(std::exp(0.3) + std::exp(-0.2)) + 0.2 + std::log(std::exp(1.1) + 1.0) - 1.1;
  EXPECT_NEAR(a, want, 1e-6);
  EXPECT_EQ(correct, 1);  // row 0 argmax 0 != 1; row 1 argmax 0 == 0
}

TEST(CpuDeviceTest, ParseActivationAcceptsKnownNames) {
  STRATA_ASSERT_OK_AND_ASSIGN(Activation relu, ParseActivation("relu"));
  EXPECT_EQ(relu, Activation::kRelu);
  STRATA_ASSERT_OK_AND_ASSIGN(Activation tanh_act, ParseActivation("tanh"));
  EXPECT_EQ(tanh_act, Activation::kTanh);
  STRATA_ASSERT_OK_AND_ASSIGN(Activation sigmoid, ParseActivation("sigmoid"));
  EXPECT_EQ(sigmoid, Activation::kSigmoid);
}

TEST(CpuDeviceTest, ParseActivationRejectsUnknownNames) {
  EXPECT_THAT(ParseActivation("gelu"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("gelu")));
  EXPECT_THAT(ParseActivation(""), StatusIs(absl::StatusCode::kInvalidArgument));
  // Names are case-sensitive and exact.
  EXPECT_THAT(ParseActivation("ReLU"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseActivation("relu "), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace strata::worker
