#include "worker/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
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

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;
using Params = std::vector<std::vector<float>>;

std::string ActName(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return "Relu";
    case Activation::kTanh:
      return "Tanh";
    case Activation::kSigmoid:
      return "Sigmoid";
  }
  return "Unknown";
}

// Independent double-precision forward pass with the documented layout:
// per layer, weight {in, out} row-major (y = x W + b) then bias {out}; the
// activation on every layer but the last; softmax cross-entropy summed over
// the batch.
struct RefResult {
  double loss = 0;
  int64_t correct = 0;
  // Pre-activations of the hidden layers, one vector per hidden layer.
  std::vector<std::vector<double>> hidden_pre;
};

RefResult RefForward(const std::vector<int>& layers, Activation act, const Params& params,
                     const std::vector<float>& x, const std::vector<int32_t>& y, int batch) {
  RefResult res;
  std::vector<double> in(x.begin(), x.end());
  const size_t n_layers = layers.size() - 1;
  for (size_t l = 0; l < n_layers; ++l) {
    const int din = layers[l], dout = layers[l + 1];
    const std::vector<float>& w = params[2 * l];
    const std::vector<float>& b = params[2 * l + 1];
    std::vector<double> out(static_cast<size_t>(batch) * dout);
    for (int r = 0; r < batch; ++r) {
      for (int j = 0; j < dout; ++j) {
        double acc = b[j];
        for (int i = 0; i < din; ++i) acc += in[r * din + i] * w[i * dout + j];
        out[r * dout + j] = acc;
      }
    }
    if (l + 1 < n_layers) {
      res.hidden_pre.push_back(out);
      for (double& v : out) {
        switch (act) {
          case Activation::kRelu:
            v = v > 0 ? v : 0;
            break;
          case Activation::kTanh:
            v = std::tanh(v);
            break;
          case Activation::kSigmoid:
            v = 1 / (1 + std::exp(-v));
            break;
        }
      }
    }
    in = std::move(out);
  }
  const int classes = layers.back();
  for (int r = 0; r < batch; ++r) {
    const double* z = &in[static_cast<size_t>(r) * classes];
    const int argmax = static_cast<int>(std::max_element(z, z + classes) - z);
    const double mx = z[argmax];
    double s = 0;
    for (int c = 0; c < classes; ++c) s += std::exp(z[c] - mx);
    res.loss += std::log(s) + mx - z[y[r]];
    if (argmax == y[r]) ++res.correct;
  }
  return res;
}

void RandomizeParams(const std::vector<int>& layers, Params* params, std::mt19937* rng,
                     float w_scale = 1.f, float b_scale = 0.5f) {
  std::uniform_real_distribution<float> w(-w_scale, w_scale), b(-b_scale, b_scale);
  ASSERT_EQ(params->size(), 2 * (layers.size() - 1));
  for (size_t l = 0; l + 1 < layers.size(); ++l) {
    ASSERT_EQ((*params)[2 * l].size(), static_cast<size_t>(layers[l]) * layers[l + 1]);
    ASSERT_EQ((*params)[2 * l + 1].size(), static_cast<size_t>(layers[l + 1]));
    for (float& v : (*params)[2 * l]) v = w(*rng);
    for (float& v : (*params)[2 * l + 1]) v = b(*rng);
  }
}

std::vector<float> RandomInput(int n, std::mt19937* rng) {
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(*rng);
  return v;
}

// True when every hidden pre-activation keeps a strict sign across the three
// parameter settings, i.e. no relu kink lies between them.
bool SameReluPattern(const RefResult& a, const RefResult& b, const RefResult& c) {
  for (size_t l = 0; l < a.hidden_pre.size(); ++l) {
    for (size_t i = 0; i < a.hidden_pre[l].size(); ++i) {
      const double va = a.hidden_pre[l][i], vb = b.hidden_pre[l][i], vc = c.hidden_pre[l][i];
      if (va == 0 || vb == 0 || vc == 0) return false;
      if ((va > 0) != (vb > 0) || (va > 0) != (vc > 0)) return false;
    }
  }
  return true;
}

// A device that computes on the CPU as if it were a GPU (its own memory,
// copies through Upload and Download) and that, once told, fails every
// wait as a lost GPU does.
class LosingDevice final : public Device {
 public:
  LosingDevice() : cpu_(NewCpuDevice(1)) {}
  void Lose() { lost_ = true; }
  const char* name() const override { return "losing"; }
  std::string Describe() const override { return "losing (tests)"; }
  bool host_memory() const override { return false; }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return cpu_->Allocate(bytes); }
  void Release(void* p) override { cpu_->Release(p); }
  absl::Status PinHost(void*, size_t) override { return absl::OkStatus(); }
  void UnpinHost(void*) override {}
  Fence Upload(void* dst, const void* src, size_t bytes) override {
    return cpu_->Upload(dst, src, bytes);
  }
  void ComputeAfter(Fence f) override { cpu_->ComputeAfter(f); }
  Fence Download(void* dst, const void* src, size_t bytes) override {
    return cpu_->Download(dst, src, bytes);
  }
  bool Done(Fence f) override { return !lost_ && cpu_->Done(f); }
  absl::Status Wait(Fence f) override { return lost_ ? Lost() : cpu_->Wait(f); }
  absl::Status Synchronize() override { return lost_ ? Lost() : cpu_->Synchronize(); }
  void Copy(void* dst, const void* src, size_t bytes) override { cpu_->Copy(dst, src, bytes); }
  void Zero(void* dst, size_t bytes) override { cpu_->Zero(dst, bytes); }
  void GemmStrided(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                   const float* b, int ldb, float beta, float* c, int ldc) override {
    cpu_->GemmStrided(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void AddBias(int rows, int cols, const float* bias, float* x) override {
    cpu_->AddBias(rows, cols, bias, x);
  }
  void ColumnSum(int rows, int cols, const float* g, float* bias_grad) override {
    cpu_->ColumnSum(rows, cols, g, bias_grad);
  }
  void ActivationForward(Activation act, int64_t n, float* x) override {
    cpu_->ActivationForward(act, n, x);
  }
  void ActivationBackward(Activation act, int64_t n, const float* y, float* g) override {
    cpu_->ActivationBackward(act, n, y, g);
  }
  double SoftmaxCrossEntropy(int rows, int classes, const float* logits, const int32_t* labels,
                             float* grad, int64_t* correct) override {
    return cpu_->SoftmaxCrossEntropy(rows, classes, logits, labels, grad, correct);
  }
  void SoftmaxCrossEntropyPending(int rows, int classes, const float* logits, const int32_t* labels,
                                  float* grad) override {
    cpu_->SoftmaxCrossEntropyPending(rows, classes, logits, labels, grad);
  }
  double TakePendingLoss(int64_t* correct) override { return cpu_->TakePendingLoss(correct); }
  double SigmoidCrossEntropy(int rows, const float* logits, const float* labels, float* grad,
                             int64_t* correct) override {
    return cpu_->SigmoidCrossEntropy(rows, logits, labels, grad, correct);
  }
  void Sigmoid(int64_t n, const float* logits, float* probs) override {
    cpu_->Sigmoid(n, logits, probs);
  }
  void GatherRows(int rows, int fields, int dim, const float* table, const uint32_t* slot,
                  float* out, int out_stride) override {
    cpu_->GatherRows(rows, fields, dim, table, slot, out, out_stride);
  }
  void ScatterAddRows(int rows, int fields, int dim, const float* in, int in_stride,
                      const uint32_t* slot, float* table_grad) override {
    cpu_->ScatterAddRows(rows, fields, dim, in, in_stride, slot, table_grad);
  }

 private:
  static absl::Status Lost() { return absl::InternalError("device lost (simulated)"); }
  std::unique_ptr<Device> cpu_;
  bool lost_ = false;
};

// Found by a review: the step without hooks (the worker's --local path)
// aborted the process on a device error; it is a Status now.
TEST(MlpTest, ADeviceErrorInAStepIsAStatusNotACrash) {
  LosingDevice dev;
  Mlp mlp({2, 3}, Activation::kRelu, &dev);
  const std::vector<float> x = {1.f, -1.f, 0.5f, 2.f};
  const std::vector<int32_t> y = {0, 2};
  ASSERT_TRUE(mlp.TrainStep(x.data(), y.data(), 2).ok());  // works until the device is lost
  dev.Lose();
  const absl::StatusOr<double> loss = mlp.TrainStep(x.data(), y.data(), 2);
  EXPECT_THAT(loss.status(), StatusIs(absl::StatusCode::kInternal, HasSubstr("device lost")));
}

TEST(MlpTest, ParamsAreWeightInByOutThenBiasPerLayer) {
  auto dev = NewCpuDevice(1);
  Mlp mlp({5, 4, 3, 2}, Activation::kTanh, dev.get());
  const Params& p = mlp.params();
  ASSERT_EQ(p.size(), 6u);
  EXPECT_EQ(p[0].size(), 5u * 4);
  EXPECT_EQ(p[1].size(), 4u);
  EXPECT_EQ(p[2].size(), 4u * 3);
  EXPECT_EQ(p[3].size(), 3u);
  EXPECT_EQ(p[4].size(), 3u * 2);
  EXPECT_EQ(p[5].size(), 2u);
  ASSERT_EQ(mlp.grads().size(), p.size());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(mlp.grads()[i].size(), p[i].size());
}

TEST(MlpTest, SingleLayerLossAndGradsMatchHandComputation) {
  // layers {2, 3}: logits = x W + b, W row-major {in=2, out=3}.
  //   W = [[1, 2, 3], [4, 5, 6]], b = [0.5, -1, 0], x = [1, -1]
  //   logits = [1-4+0.5, 2-5-1, 3-6+0] = [-2.5, -4, -3]
  //   label 0: loss = ln(e^-2.5 + e^-4 + e^-3) + 2.5
  //   dlogits = softmax - onehot(0); dW = x^T dlogits; db = dlogits.
  auto dev = NewCpuDevice(1);
  Mlp mlp({2, 3}, Activation::kRelu, dev.get());
  mlp.params()[0] = {1, 2, 3, 4, 5, 6};
  mlp.params()[1] = {0.5f, -1, 0};
  const std::vector<float> x = {1, -1};
  const std::vector<int32_t> y = {0};
  const double z[3] = {-2.5, -4, -3};
  const double s = std::exp(z[0]) + std::exp(z[1]) + std::exp(z[2]);
  const double want_loss = std::log(s) - z[0];
  const double d[3] = {std::exp(z[0]) / s - 1, std::exp(z[1]) / s, std::exp(z[2]) / s};

  EXPECT_NEAR(mlp.TrainStep(x.data(), y.data(), 1).value(), want_loss, 1e-6);
  const Params& g = mlp.grads();
  for (int j = 0; j < 3; ++j) {
    EXPECT_NEAR(g[0][0 * 3 + j], x[0] * d[j], 1e-6) << "dW[0][" << j << "]";
    EXPECT_NEAR(g[0][1 * 3 + j], x[1] * d[j], 1e-6) << "dW[1][" << j << "]";
    EXPECT_NEAR(g[1][j], d[j], 1e-6) << "db[" << j << "]";
  }

  double loss = 0;
  int64_t correct = 0;
  ASSERT_THAT(mlp.Evaluate(x.data(), y.data(), 1, &loss, &correct), IsOk());
  EXPECT_NEAR(loss, want_loss, 1e-6);
  EXPECT_EQ(correct, 1);  // argmax of [-2.5, -4, -3] is 0
}

class MlpGradientTest : public ::testing::TestWithParam<Activation> {};

TEST_P(MlpGradientTest, GradsMatchCentralFiniteDifferencesOfSummedLoss) {
  const Activation act = GetParam();
  const std::vector<int> layers = {5, 4, 3, 3};
  const int batch = 4;
  auto dev = NewCpuDevice(1);
  Mlp mlp(layers, act, dev.get());
  std::mt19937 rng(2024 + static_cast<int>(act));
  RandomizeParams(layers, &mlp.params(), &rng);
  const std::vector<float> x = RandomInput(batch * layers[0], &rng);
  const std::vector<int32_t> y = {0, 2, 1, 2};

  const double loss = mlp.TrainStep(x.data(), y.data(), batch).value();
  // The returned loss is the SUM over the batch, and the forward pass matches
  // an independent double-precision reference.
  const RefResult base = RefForward(layers, act, mlp.params(), x, y, batch);
  ASSERT_NEAR(loss, base.loss, 1e-4 * (1 + base.loss));
  const Params analytic = mlp.grads();

  const float eps = 1e-3f;
  int checked = 0, skipped = 0, total = 0;
  Params& p = mlp.params();
  for (size_t t = 0; t < p.size(); ++t) {
    double tensor_abs = 0;
    for (size_t i = 0; i < p[t].size(); ++i) {
      ++total;
      tensor_abs += std::abs(analytic[t][i]);
      const float saved = p[t][i];
      const float up = saved + eps, down = saved - eps;
      const double h = static_cast<double>(up) - down;

      p[t][i] = up;
      const double lp = mlp.TrainStep(x.data(), y.data(), batch).value();
      const RefResult rp = RefForward(layers, act, p, x, y, batch);
      p[t][i] = down;
      const double lm = mlp.TrainStep(x.data(), y.data(), batch).value();
      const RefResult rm = RefForward(layers, act, p, x, y, batch);
      p[t][i] = saved;

      if (act == Activation::kRelu && !SameReluPattern(base, rp, rm)) {
        ++skipped;
        continue;
      }
      ++checked;
      const double ana = analytic[t][i];
      // Finite difference of the Mlp's own (float) loss.
      const double fd = (lp - lm) / h;
      EXPECT_LE(std::abs(fd - ana), std::max(1e-3, 1e-2 * std::abs(ana)))
          << ActName(act) << " tensor " << t << " index " << i << ": fd " << fd << " analytic "
          << ana;
      // Same, from the double-precision reference loss: a tighter check.
      const double ref_fd = (rp.loss - rm.loss) / h;
      EXPECT_LE(std::abs(ref_fd - ana), std::max(2e-4, 2e-3 * std::abs(ana)))
          << ActName(act) << " tensor " << t << " index " << i << ": ref fd " << ref_fd
          << " analytic " << ana;
    }
    // Guard against a vacuous check (e.g. all-dead relu units).
    EXPECT_GT(tensor_abs, 1e-3) << ActName(act) << " tensor " << t << " has zero grads";
  }
  EXPECT_GE(checked, total * 9 / 10) << "skipped " << skipped << " of " << total;
}

INSTANTIATE_TEST_SUITE_P(AllActivations, MlpGradientTest,
                         ::testing::Values(Activation::kRelu, Activation::kTanh,
                                           Activation::kSigmoid),
                         [](const ::testing::TestParamInfo<Activation>& info) {
                           return ActName(info.param);
                         });

TEST(MlpTest, GradsAreSumOfPerExampleGrads) {
  const std::vector<int> layers = {5, 4, 3, 3};
  const int batch = 4;
  auto dev = NewCpuDevice(1);
  Mlp mlp(layers, Activation::kTanh, dev.get());
  std::mt19937 rng(77);
  RandomizeParams(layers, &mlp.params(), &rng);
  const std::vector<float> x = RandomInput(batch * layers[0], &rng);
  const std::vector<int32_t> y = {1, 0, 2, 1};

  Params sum;
  for (const auto& p : mlp.params()) sum.emplace_back(p.size(), 0.f);
  double loss_sum = 0;
  for (int r = 0; r < batch; ++r) {
    loss_sum += mlp.TrainStep(&x[r * layers[0]], &y[r], 1).value();
    for (size_t t = 0; t < sum.size(); ++t) {
      for (size_t i = 0; i < sum[t].size(); ++i) sum[t][i] += mlp.grads()[t][i];
    }
  }
  const double loss = mlp.TrainStep(x.data(), y.data(), batch).value();
  EXPECT_NEAR(loss, loss_sum, 1e-5);
  for (size_t t = 0; t < sum.size(); ++t) {
    for (size_t i = 0; i < sum[t].size(); ++i) {
      EXPECT_NEAR(mlp.grads()[t][i], sum[t][i], 1e-5) << "tensor " << t << " index " << i;
    }
  }
}

TEST(MlpTest, ReuseAcrossBatchSizesMatchesFreshModel) {
  // Buffers are reused between calls; a smaller batch after a larger one must
  // not see stale data.
  const std::vector<int> layers = {5, 4, 3, 3};
  auto dev = NewCpuDevice(1);
  std::mt19937 rng(13);
  Mlp used(layers, Activation::kRelu, dev.get());
  RandomizeParams(layers, &used.params(), &rng);
  Mlp fresh(layers, Activation::kRelu, dev.get());
  fresh.params() = used.params();

  const std::vector<float> big = RandomInput(6 * layers[0], &rng);
  const std::vector<int32_t> big_y = {0, 1, 2, 0, 1, 2};
  used.TrainStep(big.data(), big_y.data(), 6).value();

  const std::vector<float> small = RandomInput(2 * layers[0], &rng);
  const std::vector<int32_t> small_y = {2, 0};
  const double a = used.TrainStep(small.data(), small_y.data(), 2).value();
  const double b = fresh.TrainStep(small.data(), small_y.data(), 2).value();
  EXPECT_DOUBLE_EQ(a, b);
  for (size_t t = 0; t < used.grads().size(); ++t) {
    EXPECT_THAT(used.grads()[t], ::testing::Pointwise(::testing::FloatEq(), fresh.grads()[t]))
        << "tensor " << t;
  }
}

class MlpEvaluateTest : public ::testing::TestWithParam<Activation> {};

TEST_P(MlpEvaluateTest, LossEqualsTrainStepLossAndCorrectCountsArgmax) {
  const Activation act = GetParam();
  const std::vector<int> layers = {5, 4, 3, 3};
  const int batch = 8;
  auto dev = NewCpuDevice(1);
  Mlp mlp(layers, act, dev.get());
  std::mt19937 rng(99 + static_cast<int>(act));
  RandomizeParams(layers, &mlp.params(), &rng, 2.f, 1.f);
  const std::vector<float> x = RandomInput(batch * layers[0], &rng);
  const std::vector<int32_t> y = {0, 1, 2, 0, 1, 2, 2, 0};

  const double train_loss = mlp.TrainStep(x.data(), y.data(), batch).value();
  const Params grads_before = mlp.grads();
  double loss = 1.5;  // Evaluate adds to these
  int64_t correct = 3;
  ASSERT_THAT(mlp.Evaluate(x.data(), y.data(), batch, &loss, &correct), IsOk());
  EXPECT_NEAR(loss - 1.5, train_loss, 1e-9 * (1 + train_loss));

  const RefResult ref = RefForward(layers, act, mlp.params(), x, y, batch);
  EXPECT_EQ(correct - 3, ref.correct);
  EXPECT_NEAR(loss - 1.5, ref.loss, 1e-4 * (1 + ref.loss));
  // Evaluate is forward-only.
  EXPECT_EQ(mlp.grads(), grads_before);

  // With labels set to each example's predicted class every row is correct,
  // and with labels set away from it none is.
  std::vector<int32_t> predicted(batch), wrong(batch);
  {
    // Recover argmax per row via single-row evaluations: the row is correct
    // for exactly one label.
    for (int r = 0; r < batch; ++r) {
      int hits = 0;
      for (int32_t c = 0; c < layers.back(); ++c) {
        double l = 0;
        int64_t k = 0;
        ASSERT_THAT(mlp.Evaluate(&x[r * layers[0]], &c, 1, &l, &k), IsOk());
        if (k == 1) {
          predicted[r] = c;
          ++hits;
        }
      }
      ASSERT_EQ(hits, 1) << "row " << r;
      wrong[r] = (predicted[r] + 1) % layers.back();
    }
  }
  double l = 0;
  int64_t all = 0, none = 0;
  ASSERT_THAT(mlp.Evaluate(x.data(), predicted.data(), batch, &l, &all), IsOk());
  ASSERT_THAT(mlp.Evaluate(x.data(), wrong.data(), batch, &l, &none), IsOk());
  EXPECT_EQ(all, batch);
  EXPECT_EQ(none, 0);
}

INSTANTIATE_TEST_SUITE_P(AllActivations, MlpEvaluateTest,
                         ::testing::Values(Activation::kRelu, Activation::kTanh,
                                           Activation::kSigmoid),
                         [](const ::testing::TestParamInfo<Activation>& info) {
                           return ActName(info.param);
                         });

class MlpTrainingTest : public ::testing::TestWithParam<Activation> {};

TEST_P(MlpTrainingTest, SgdOnSeparableDataDrivesLossDown) {
  const Activation act = GetParam();
  // Three well-separated Gaussian blobs in 2-D.
  const std::vector<int> layers = {2, 8, 3};
  const int per_class = 8, classes = 3, batch = per_class * classes;
  const float centers[3][2] = {{2.f, 0.f}, {-1.f, 1.7f}, {-1.f, -1.7f}};
  std::mt19937 rng(31 + static_cast<int>(act));
  std::normal_distribution<float> noise(0.f, 0.3f);
  std::vector<float> x;
  std::vector<int32_t> y;
  for (int c = 0; c < classes; ++c) {
    for (int i = 0; i < per_class; ++i) {
      x.push_back(centers[c][0] + noise(rng));
      x.push_back(centers[c][1] + noise(rng));
      y.push_back(c);
    }
  }

  auto dev = NewCpuDevice(1);
  Mlp mlp(layers, act, dev.get());
  RandomizeParams(layers, &mlp.params(), &rng, 0.5f, 0.1f);

  double initial_loss = 0;
  int64_t initial_correct = 0;
  ASSERT_THAT(mlp.Evaluate(x.data(), y.data(), batch, &initial_loss, &initial_correct), IsOk());

  const float lr = 0.5f;
  double prev = 0;
  for (int step = 0; step < 300; ++step) {
    prev = mlp.TrainStep(x.data(), y.data(), batch).value();
    ASSERT_TRUE(std::isfinite(prev)) << "step " << step;
    for (size_t t = 0; t < mlp.params().size(); ++t) {
      auto& p = mlp.params()[t];
      const auto& g = mlp.grads()[t];
      for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * g[i] / batch;
    }
  }

  double final_loss = 0;
  int64_t final_correct = 0;
  ASSERT_THAT(mlp.Evaluate(x.data(), y.data(), batch, &final_loss, &final_correct), IsOk());
  EXPECT_LE(final_loss, prev + 1e-6);  // last step did not increase it
  EXPECT_LT(final_loss, initial_loss / 5) << "initial " << initial_loss;
  EXPECT_LT(final_loss / batch, 0.1);
  EXPECT_EQ(final_correct, batch);
}

INSTANTIATE_TEST_SUITE_P(AllActivations, MlpTrainingTest,
                         ::testing::Values(Activation::kRelu, Activation::kTanh,
                                           Activation::kSigmoid),
                         [](const ::testing::TestParamInfo<Activation>& info) {
                           return ActName(info.param);
                         });

TEST(MlpTest, PartitionStartsCutWeightsIntoRowBlocks) {
  auto dev = NewCpuDevice(1);
  Mlp mlp({10, 4, 3}, Activation::kRelu, dev.get());
  EXPECT_THAT(mlp.row_blocks(0), ::testing::ElementsAre(0, 10));
  // Partitions of the 10x4 weight starting at elements 0, 12 (row 3), 22
  // (mid-row 5: its block starts at row 5) and 36 (row 9).
  mlp.SetPartitionStarts(0, {0, 12, 22, 36});
  EXPECT_THAT(mlp.row_blocks(0), ::testing::ElementsAre(0, 3, 5, 9, 10));
  // Bias tables are never cut; a table out of range is ignored.
  mlp.SetPartitionStarts(1, {0, 2});
  mlp.SetPartitionStarts(7, {0, 2});
  EXPECT_THAT(mlp.row_blocks(1), ::testing::ElementsAre(0, 4));
  // One partition per row of a tall weight: merged to at most kMaxRowBlocks.
  Mlp tall({64, 2}, Activation::kRelu, dev.get());
  std::vector<uint64_t> starts;
  for (uint64_t r = 0; r < 64; ++r) starts.push_back(2 * r);
  tall.SetPartitionStarts(0, starts);
  EXPECT_EQ(tall.row_blocks(0).size(), Mlp::kMaxRowBlocks + 1u);
  EXPECT_EQ(tall.row_blocks(0).front(), 0);
  EXPECT_EQ(tall.row_blocks(0).back(), 64);
}

TEST(MlpTest, RowBlocksGiveTheSameStepAsWholeWeights) {
  const std::vector<int> layers = {13, 7, 5, 3};
  auto dev = NewCpuDevice(1);
  std::mt19937 rng(21);
  Mlp whole(layers, Activation::kTanh, dev.get());
  RandomizeParams(layers, &whole.params(), &rng);
  Mlp blocked(layers, Activation::kTanh, dev.get());
  blocked.params() = whole.params();
  blocked.SetPartitionStarts(0, {0, 7 * 2, 7 * 5 + 3, 7 * 11});
  blocked.SetPartitionStarts(2, {0, 5 * 4});
  ASSERT_EQ(blocked.row_blocks(0).size(), 5u);
  const int batch = 6;
  const std::vector<float> x = RandomInput(batch * layers[0], &rng);
  const std::vector<int32_t> y = {0, 1, 2, 2, 1, 0};
  const double a = whole.TrainStep(x.data(), y.data(), batch).value();
  const double b = blocked.TrainStep(x.data(), y.data(), batch).value();
  EXPECT_NEAR(a, b, 1e-5);
  for (size_t t = 0; t < whole.grads().size(); ++t) {
    for (size_t i = 0; i < whole.grads()[t].size(); ++i) {
      EXPECT_NEAR(whole.grads()[t][i], blocked.grads()[t][i], 1e-5) << t << " " << i;
    }
  }
}

TEST(MlpTest, HooksFollowTheDataThatEachBlockNeedsAndProduces) {
  // The worker's overlap rests on these promises: a block's parameters are
  // asked for before it is read, a gradient prefix is final when announced
  // (it is sent at once), and parameters are released only after their
  // last read (the next step's pull may then overwrite them).
  const std::vector<int> layers = {6, 4, 3};
  auto dev = NewCpuDevice(1);
  std::mt19937 rng(5);
  Mlp mlp(layers, Activation::kRelu, dev.get());
  RandomizeParams(layers, &mlp.params(), &rng);
  mlp.SetPartitionStarts(0, {0, 8, 16});  // rows 0-1, 2-3, 4-5
  const Params params = mlp.params();
  const int batch = 4;
  const std::vector<float> x = RandomInput(batch * layers[0], &rng);
  const std::vector<int32_t> y = {0, 1, 2, 1};
  Mlp reference(layers, Activation::kRelu, dev.get());
  reference.params() = params;
  reference.TrainStep(x.data(), y.data(), batch).value();

  std::vector<std::string> events;
  std::vector<uint64_t> available(4, 0), sent(4, 0);
  std::vector<bool> released(4, false);
  Params snapshot(4);
  Mlp::Hooks hooks;
  hooks.need_params = [&](int t, uint64_t end) {
    events.push_back("need " + std::to_string(t) + " " + std::to_string(end));
    EXPECT_GE(end, available[t]) << "need_params for table " << t << " shrank";
    available[t] = end;
    return absl::OkStatus();
  };
  hooks.after_forward = [&]() {
    events.push_back("forward done");
    for (size_t t = 0; t < 4; ++t) EXPECT_EQ(available[t], params[t].size()) << t;
    return absl::OkStatus();
  };
  hooks.grads_ready = [&](int t, uint64_t end) {
    events.push_back("grads " + std::to_string(t) + " " + std::to_string(end));
    EXPECT_GT(end, sent[t]);
    // The announced prefix is already the final gradient.
    for (uint64_t i = 0; i < end; ++i) {
      EXPECT_NEAR(mlp.grads()[t][i], reference.grads()[t][i], 1e-5) << t << " " << i;
    }
    sent[t] = end;
    return absl::OkStatus();
  };
  hooks.params_released = [&](int t) {
    events.push_back("released " + std::to_string(t));
    released[t] = true;
    // Scribble over released parameters, as a pull landing early would.
    std::fill(mlp.params()[t].begin(), mlp.params()[t].end(), 1e6f);
    return absl::OkStatus();
  };
  auto loss = mlp.TrainStep(x.data(), y.data(), batch, hooks);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_THAT(events,
              ::testing::ElementsAre("need 0 8", "need 0 16", "need 0 24", "need 1 4", "need 2 12",
                                     "need 3 3", "forward done", "grads 3 3", "released 3",
                                     "grads 2 12", "released 2", "grads 1 4", "released 1",
                                     "grads 0 8", "grads 0 16", "grads 0 24", "released 0"));
  for (size_t t = 0; t < 4; ++t) {
    EXPECT_TRUE(released[t]) << t;
    EXPECT_EQ(sent[t], params[t].size()) << t;
    for (size_t i = 0; i < params[t].size(); ++i) {
      ASSERT_NEAR(mlp.grads()[t][i], reference.grads()[t][i], 1e-5) << t << " " << i;
    }
  }

  // A failing hook stops the step with its status.
  hooks.need_params = [](int, uint64_t) { return absl::UnavailableError("no pserver"); };
  EXPECT_EQ(mlp.TrainStep(x.data(), y.data(), batch, hooks).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(MlpTest, RecomputationGivesTheSameStepWithLessActivationMemory) {
  // Seven layers; a segment's outputs are recomputed in the backward pass
  // from the last kept one. Released parameters are scribbled over (as an
  // early pull would): recomputation must read them before their release.
  const std::vector<int> layers = {20, 16, 16, 16, 16, 16, 16, 5};
  auto dev = NewCpuDevice(1);
  std::mt19937 rng(9);
  Params params;
  {
    Mlp init(layers, Activation::kTanh, dev.get());
    RandomizeParams(layers, &init.params(), &rng);
    params = init.params();
  }
  const int batch = 12;
  const std::vector<float> x = RandomInput(batch * layers[0], &rng);
  std::vector<int32_t> y(batch);
  for (int32_t& v : y) v = static_cast<int32_t>(rng() % 5);
  Mlp reference(layers, Activation::kTanh, dev.get());
  reference.params() = params;
  const double want = reference.TrainStep(x.data(), y.data(), batch).value();
  const Mlp::ActivationMemory full = reference.activation_memory();
  EXPECT_EQ(full.held, full.without_recompute);
  EXPECT_EQ(full.without_recompute, uint64_t{batch} * (16 * 6 + 5) * sizeof(float));
  for (int every : {2, 3, 4}) {
    SCOPED_TRACE(every);
    Mlp mlp(layers, Activation::kTanh, dev.get());
    mlp.SetRecompute(every);
    mlp.params() = params;
    Mlp::Hooks hooks;
    hooks.params_released = [&](int t) {
      std::fill(mlp.params()[t].begin(), mlp.params()[t].end(), 1e6f);
      return absl::OkStatus();
    };
    auto loss = mlp.TrainStep(x.data(), y.data(), batch, hooks);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(*loss, want, 1e-9 * std::abs(want));
    for (size_t t = 0; t < params.size(); ++t) {
      for (size_t i = 0; i < params[t].size(); ++i) {
        ASSERT_EQ(mlp.grads()[t][i], reference.grads()[t][i]) << t << " " << i;
      }
    }
    const Mlp::ActivationMemory m = mlp.activation_memory();
    EXPECT_EQ(m.without_recompute, full.without_recompute);
    EXPECT_LT(m.held, full.held);
  }
  // Every other layer kept: 3 of the 6 hidden outputs and the logits, plus
  // one slot for the layer being recomputed.
  Mlp half(layers, Activation::kTanh, dev.get());
  half.SetRecompute(2);
  half.params() = params;
  half.TrainStep(x.data(), y.data(), batch).value();
  EXPECT_EQ(half.activation_memory().held, uint64_t{batch} * (16 * 4 + 5) * sizeof(float));
  // Off again: everything kept.
  half.SetRecompute(0);
  half.TrainStep(x.data(), y.data(), batch).value();
  EXPECT_EQ(half.activation_memory().held, full.held);
}

}  // namespace
}  // namespace strata::worker
