// Every Device operation against a plain double-precision loop on random
// inputs, odd sizes included, through the device's own memory and copies.
// Instantiated for the CPU device (always runs) and the CUDA device
// (ctest gpu_device_test, label gpu: skipped, saying why, without a GPU):
// the GPU's kernels are held to the same loops as the CPU's.
#include "worker/device.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "worker/mlp.h"
#include "worker/wide_deep.h"

namespace strata::worker {
namespace {

using ::strata::testing::IsOk;
using ::strata::testing::StatusIs;
using ::testing::HasSubstr;

struct DeviceParam {
  std::string kind;  // cpu | cuda
  Precision precision;
};

std::string ParamName(const ::testing::TestParamInfo<DeviceParam>& info) {
  return info.param.kind + "_" + PrecisionName(info.param.precision);
}

std::vector<float> Random(size_t n, std::mt19937* rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(*rng);
  return v;
}

class DeviceTest : public ::testing::TestWithParam<DeviceParam> {
 protected:
  void SetUp() override {
    if (GetParam().kind == "cpu") {
      device_ = NewCpuDevice(1);
      return;
    }
    std::string why;
    if (VisibleGpus(&why) == 0) GTEST_SKIP() << "no GPU here: " << why;
    auto d = NewCudaDevice(0, GetParam().precision);
    ASSERT_THAT(d.status(), IsOk());
    device_ = std::move(*d);
  }

  // Relative tolerance of the matrix products: fp32 sums in another order,
  // TF32 keeps 10 mantissa bits, bf16 7 (both accumulate in fp32).
  double GemmTolerance() const {
    switch (GetParam().precision) {
      case Precision::kFp32:
        return 1e-5;
      case Precision::kTf32:
        return 3e-3;
      case Precision::kBf16:
        return 2e-2;
    }
    return 0;
  }

  // The activation of the model-step comparisons: ReLU at fp32; tanh at
  // TF32 and bf16, where rounding flips pre-activations near 0 across
  // ReLU's kink and a whole example's delta with them (a real difference of
  // the arithmetic, not of the code).
  Activation StepActivation() const {
    return GetParam().precision == Precision::kFp32 ? Activation::kRelu : Activation::kTanh;
  }

  // A device copy of host data, and back.
  template <typename T>
  T* In(const std::vector<T>& host) {
    arrays_.emplace_back(device_.get());
    EXPECT_THAT(arrays_.back().Reserve(host.size() * sizeof(T)), IsOk());
    T* p = reinterpret_cast<T*>(arrays_.back().data());
    device_->ComputeAfter(device_->Upload(p, host.data(), host.size() * sizeof(T)));
    return p;
  }
  template <typename T>
  std::vector<T> Out(const T* p, size_t n) {
    std::vector<T> host(n);
    EXPECT_THAT(device_->Wait(device_->Download(host.data(), p, n * sizeof(T))), IsOk());
    return host;
  }

  std::unique_ptr<Device> device_;
  std::vector<DeviceArray<char>> arrays_;
};

struct GemmShape {
  bool ta, tb;
  int m, n, k;
};

TEST_P(DeviceTest, GemmMatchesTheTripleLoopForOddShapesAndStrides) {
  std::mt19937 rng(7);
  const std::vector<GemmShape> shapes = {{false, false, 1, 1, 1},     {false, false, 7, 13, 5},
                                         {true, false, 33, 65, 17},   {false, true, 31, 10, 129},
                                         {true, true, 5, 3, 257},     {false, false, 64, 128, 784},
                                         {true, false, 784, 128, 64}, {false, true, 64, 784, 128}};
  for (const GemmShape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << (s.ta ? "A^T " : "A ") << (s.tb ? "B^T " : "B ") << s.m
                                      << "x" << s.n << "x" << s.k);
    // A and B are blocks of wider matrices (row strides lda, ldb > their
    // widths), as the MLP's row blocks are.
    const int a_rows = s.ta ? s.k : s.m, a_cols = s.ta ? s.m : s.k;
    const int b_rows = s.tb ? s.n : s.k, b_cols = s.tb ? s.k : s.n;
    const int lda = a_cols + 3, ldb = b_cols + 2, ldc = s.n + 1;
    const auto a = Random(static_cast<size_t>(a_rows) * lda, &rng);
    const auto b = Random(static_cast<size_t>(b_rows) * ldb, &rng);
    const auto c0 = Random(static_cast<size_t>(s.m) * ldc, &rng);
    const float alpha = 0.75f, beta = 0.5f;
    float* da = In(a);
    float* db = In(b);
    float* dc = In(c0);
    device_->GemmStrided(s.ta, s.tb, s.m, s.n, s.k, alpha, da, lda, db, ldb, beta, dc, ldc);
    const auto c = Out(dc, c0.size());
    double worst = 0;
    for (int i = 0; i < s.m; ++i) {
      for (int j = 0; j < s.n; ++j) {
        double acc = 0, mag = 0;
        for (int p = 0; p < s.k; ++p) {
          const double av =
              s.ta ? a[static_cast<size_t>(p) * lda + i] : a[static_cast<size_t>(i) * lda + p];
          const double bv =
              s.tb ? b[static_cast<size_t>(j) * ldb + p] : b[static_cast<size_t>(p) * ldb + j];
          acc += av * bv;
          mag += std::abs(av * bv);
        }
        const size_t idx = static_cast<size_t>(i) * ldc + j;
        const double want = alpha * acc + beta * c0[idx];
        worst = std::max(worst,
                         std::abs(c[idx] - want) / (alpha * mag + std::abs(beta * c0[idx]) + 1e-6));
      }
      // The padding between rows is not written.
      for (int j = s.n; j < ldc; ++j) {
        const size_t idx = static_cast<size_t>(i) * ldc + j;
        ASSERT_EQ(c[idx], c0[idx]) << "wrote outside the block at row " << i;
      }
    }
    EXPECT_LE(worst, GemmTolerance());
  }
}

TEST_P(DeviceTest, BiasColumnSumAndActivationsMatchTheLoops) {
  std::mt19937 rng(11);
  for (const auto& [rows, cols] :
       std::vector<std::pair<int, int>>{{1, 1}, {3, 37}, {1000, 33}, {17, 1}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols);
    const auto x = Random(static_cast<size_t>(rows) * cols, &rng, -3.f, 3.f);
    const auto bias = Random(cols, &rng);
    float* dx = In(x);
    device_->AddBias(rows, cols, In(bias), dx);
    const auto added = Out(dx, x.size());
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r) * cols + c;
        ASSERT_FLOAT_EQ(added[i], x[i] + bias[c]);
      }
    }
    float* sums = In(std::vector<float>(cols, 9.f));
    device_->ColumnSum(rows, cols, dx, sums);
    const auto got = Out(sums, cols);
    for (int c = 0; c < cols; ++c) {
      double want = 0;
      for (int r = 0; r < rows; ++r) want += added[static_cast<size_t>(r) * cols + c];
      ASSERT_NEAR(got[c], want, 1e-4 * rows) << "column " << c;
    }
    for (Activation act : {Activation::kRelu, Activation::kTanh, Activation::kSigmoid}) {
      SCOPED_TRACE(static_cast<int>(act));
      float* y = In(x);
      device_->ActivationForward(act, static_cast<int64_t>(x.size()), y);
      const auto fy = Out(y, x.size());
      const auto g0 = Random(x.size(), &rng);
      float* g = In(g0);
      device_->ActivationBackward(act, static_cast<int64_t>(x.size()), y, g);
      const auto fg = Out(g, x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double v = x[i];
        const double want = act == Activation::kRelu   ? std::max(0.0, v)
                            : act == Activation::kTanh ? std::tanh(v)
                                                       : 1 / (1 + std::exp(-v));
        ASSERT_NEAR(fy[i], want, 1e-6) << i;
        const double d = act == Activation::kRelu   ? (fy[i] > 0 ? 1.0 : 0.0)
                         : act == Activation::kTanh ? 1 - double(fy[i]) * fy[i]
                                                    : double(fy[i]) * (1 - fy[i]);
        ASSERT_NEAR(fg[i], g0[i] * d, 1e-6) << i;
      }
    }
  }
}

TEST_P(DeviceTest, SoftmaxCrossEntropyMatchesTheLoopForManyClassCounts) {
  std::mt19937 rng(13);
  for (const auto& [rows, classes] :
       std::vector<std::pair<int, int>>{{1, 1}, {5, 10}, {130, 37}, {3, 1000}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows, " << classes << " classes");
    const auto z = Random(static_cast<size_t>(rows) * classes, &rng, -8.f, 8.f);
    std::vector<int32_t> labels(rows);
    for (int32_t& l : labels) l = static_cast<int32_t>(rng() % classes);
    float* grad = In(std::vector<float>(z.size(), 0.f));
    int64_t correct = 3;  // added to
    const double loss =
        device_->SoftmaxCrossEntropy(rows, classes, In(z), In(labels), grad, &correct);
    const auto g = Out(grad, z.size());
    double want_loss = 0;
    int64_t want_correct = 3;
    for (int r = 0; r < rows; ++r) {
      const float* zr = z.data() + static_cast<size_t>(r) * classes;
      const int arg = static_cast<int>(std::max_element(zr, zr + classes) - zr);
      double sum = 0;
      for (int c = 0; c < classes; ++c) sum += std::exp(double(zr[c]) - zr[arg]);
      want_loss += std::log(sum) - (zr[labels[r]] - zr[arg]);
      want_correct += arg == labels[r];
      for (int c = 0; c < classes; ++c) {
        const double p = std::exp(double(zr[c]) - zr[arg]) / sum - (c == labels[r]);
        ASSERT_NEAR(g[static_cast<size_t>(r) * classes + c], p, 1e-6) << r << "," << c;
      }
    }
    EXPECT_NEAR(loss, want_loss, 1e-6 * rows);
    EXPECT_EQ(correct, want_correct);
  }
}

TEST_P(DeviceTest, APendingLossAndCountAreTheSumsOfTheirCrossEntropiesTakenOnce) {
  std::mt19937 rng(41);
  const int rows = 33, classes = 7;
  const auto z1 = Random(static_cast<size_t>(rows) * classes, &rng, -4.f, 4.f);
  const auto z2 = Random(static_cast<size_t>(rows) * classes, &rng, -4.f, 4.f);
  std::vector<int32_t> labels(rows);
  for (int32_t& l : labels) l = static_cast<int32_t>(rng() % classes);
  const int32_t* dl = In(labels);
  const float* d1 = In(z1);
  const float* d2 = In(z2);
  float* g = In(std::vector<float>(z1.size(), 0.f));
  int64_t want_correct = 0;
  const double want = device_->SoftmaxCrossEntropy(rows, classes, d1, dl, nullptr, &want_correct) +
                      device_->SoftmaxCrossEntropy(rows, classes, d2, dl, nullptr, &want_correct);
  ASSERT_GT(want_correct, 0);  // (random logits still hit some labels)
  device_->SoftmaxCrossEntropyPending(rows, classes, d1, dl, g);
  device_->SoftmaxCrossEntropyPending(rows, classes, d2, dl, g);
  // An immediate one in between does not disturb the pending sum.
  (void)device_->SoftmaxCrossEntropy(rows, classes, d1, dl, nullptr, nullptr);
  int64_t correct = -1;
  EXPECT_NEAR(device_->TakePendingLoss(&correct), want, 1e-9 * std::abs(want));
  EXPECT_EQ(correct, want_correct);
  EXPECT_EQ(device_->TakePendingLoss(&correct), 0.0);
  EXPECT_EQ(correct, 0);
  EXPECT_EQ(device_->TakePendingLoss(nullptr), 0.0);
}

TEST_P(DeviceTest, SigmoidCrossEntropyAndSigmoidMatchTheLoop) {
  std::mt19937 rng(17);
  for (int rows : {1, 31, 32, 33, 1000}) {
    SCOPED_TRACE(rows);
    const auto z = Random(rows, &rng, -20.f, 20.f);
    std::vector<float> y(rows);
    for (float& v : y) v = static_cast<float>(rng() % 2);
    float* grad = In(std::vector<float>(rows, 0.f));
    int64_t correct = 0;
    const double loss = device_->SigmoidCrossEntropy(rows, In(z), In(y), grad, &correct);
    const auto g = Out(grad, rows);
    float* probs = In(std::vector<float>(rows, 0.f));
    device_->Sigmoid(rows, In(z), probs);
    const auto p = Out(probs, rows);
    double want = 0;
    int64_t want_correct = 0;
    for (int i = 0; i < rows; ++i) {
      const double s = 1 / (1 + std::exp(-double(z[i])));
      want +=
          std::log1p(std::exp(-std::abs(double(z[i])))) + std::max(0.0, double(z[i])) - y[i] * z[i];
      want_correct += (z[i] > 0) == (y[i] > 0.5f);
      ASSERT_NEAR(g[i], s - y[i], 1e-6) << i;
      ASSERT_NEAR(p[i], s, 1e-6) << i;
    }
    EXPECT_NEAR(loss, want, 1e-6 * rows);
    EXPECT_EQ(correct, want_correct);
  }
}

TEST_P(DeviceTest, EmbeddingGatherAndScatterAddMatchTheLoop) {
  std::mt19937 rng(19);
  for (const auto& [rows, fields, dim] :
       std::vector<std::tuple<int, int, int>>{{1, 1, 1}, {7, 26, 8}, {65, 3, 5}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows, " << fields << " fields, dim " << dim);
    const int unique = 5;  // few keys: many rows share one
    const auto table = Random(static_cast<size_t>(unique) * dim, &rng);
    std::vector<uint32_t> slot(static_cast<size_t>(rows) * fields);
    for (uint32_t& s : slot) s = rng() % unique;
    const int stride = fields * dim + 13;  // the deep input's row: embeddings, then 13 more
    float* out = In(std::vector<float>(static_cast<size_t>(rows) * stride, -1.f));
    const uint32_t* dslot = In(slot);
    device_->GatherRows(rows, fields, dim, In(table), dslot, out, stride);
    const auto got = Out(out, static_cast<size_t>(rows) * stride);
    const auto in = Random(static_cast<size_t>(rows) * stride, &rng);
    float* grad = In(std::vector<float>(static_cast<size_t>(unique) * dim, 0.f));
    device_->ScatterAddRows(rows, fields, dim, In(in), stride, dslot, grad);
    const auto g = Out(grad, static_cast<size_t>(unique) * dim);
    std::vector<double> want(g.size(), 0.0);
    for (int r = 0; r < rows; ++r) {
      for (int f = 0; f < fields; ++f) {
        const uint32_t s = slot[static_cast<size_t>(r) * fields + f];
        for (int k = 0; k < dim; ++k) {
          const size_t o = static_cast<size_t>(r) * stride + f * dim + k;
          ASSERT_EQ(got[o], table[static_cast<size_t>(s) * dim + k]);
          want[static_cast<size_t>(s) * dim + k] += in[o];
        }
      }
      for (int k = fields * dim; k < stride; ++k) {
        ASSERT_EQ(got[static_cast<size_t>(r) * stride + k], -1.f) << "gather wrote past its fields";
      }
    }
    for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], want[i], 1e-4) << i;
  }
}

TEST_P(DeviceTest, CopiesZeroAndFencesKeepTheirOrder) {
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  ASSERT_THAT(device_->PinHost(host.data(), host.size() * sizeof(float)), IsOk());
  float* a = In(host);
  float* b = In(std::vector<float>(host.size(), 0.f));
  device_->Copy(b, a, host.size() * sizeof(float));
  device_->Zero(a, 10 * sizeof(float));
  const auto got_b = Out(b, host.size());
  const auto got_a = Out(a, host.size());
  EXPECT_EQ(got_b, host);
  for (size_t i = 0; i < host.size(); ++i) ASSERT_EQ(got_a[i], i < 10 ? 0.f : host[i]) << i;
  // A download issued after compute sees it; its fence is done once waited.
  device_->AddBias(1, 1000, b, a);
  std::vector<float> back(host.size());
  const Device::Fence f = device_->Download(back.data(), a, back.size() * sizeof(float));
  ASSERT_THAT(device_->Wait(f), IsOk());
  EXPECT_TRUE(device_->Done(f));
  EXPECT_EQ(back[500], 1000.f);
  EXPECT_THAT(device_->Synchronize(), IsOk());
  device_->UnpinHost(host.data());
}

// Asking whether a copy is done while it is not must leave nothing behind
// that a later kernel launch would take for its own error.
TEST_P(DeviceTest, AskingAboutAnUnfinishedFenceLeavesNoErrorBehind) {
  std::mt19937 rng(31);
  const int n = 1024;
  float* a = In(Random(static_cast<size_t>(n) * n, &rng));
  float* c = In(std::vector<float>(static_cast<size_t>(n) * n, 0.f));
  std::vector<float> back(static_cast<size_t>(n) * n);
  device_->Gemm(false, false, n, n, n, 1.f, a, a, 0.f, c);
  const Device::Fence f = device_->Download(back.data(), c, back.size() * sizeof(float));
  for (int i = 0; i < 100 && !device_->Done(f); ++i) {
  }
  device_->AddBias(n, n, c, c);  // a launch after the question
  EXPECT_THAT(device_->Wait(f), IsOk());
  EXPECT_THAT(device_->Synchronize(), IsOk());
}

TEST_P(DeviceTest, TooLargeAnAllocationIsResourceExhaustedNamingTheSize) {
  if (GetParam().kind == "cpu") GTEST_SKIP() << "the CPU's allocator may overcommit";
  EXPECT_THAT(device_->Allocate(size_t{1} << 50),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("1125899906842624 bytes")));
}

// One MLP training step on this device against the CPU's, with the hooks a
// worker uses (row blocks, gradients sent as they are ready).
TEST_P(DeviceTest, OneMlpStepMatchesTheCpu) {
  const std::vector<int> layers = {37, 64, 33, 10};
  auto cpu = NewCpuDevice(1);
  Mlp want(layers, StepActivation(), cpu.get());
  Mlp got(layers, StepActivation(), device_.get());
  std::mt19937 rng(23);
  for (size_t t = 0; t < want.params().size(); ++t) {
    want.params()[t] = Random(want.params()[t].size(), &rng, -0.3f, 0.3f);
    got.params()[t] = want.params()[t];
  }
  got.SetPartitionStarts(0, {0, 10 * 64, 20 * 64});
  const int batch = 29;
  const auto x = Random(static_cast<size_t>(batch) * layers[0], &rng);
  std::vector<int32_t> y(batch);
  for (int32_t& v : y) v = static_cast<int32_t>(rng() % 10);
  std::vector<std::pair<int, uint64_t>> ready;
  Mlp::Hooks hooks;
  hooks.grads_ready = [&](int t, uint64_t end) {
    // What is announced is on the host already.
    ready.emplace_back(t, end);
    return absl::OkStatus();
  };
  absl::StatusOr<double> loss = got.TrainStep(x.data(), y.data(), batch, hooks);
  ASSERT_THAT(loss.status(), IsOk());
  const double want_loss = want.TrainStep(x.data(), y.data(), batch).value();
  EXPECT_NEAR(*loss, want_loss, 1e-3 * std::abs(want_loss) + 1e-4);
  const double tol = GetParam().precision == Precision::kFp32 ? 1e-4 : 3e-2;
  for (size_t t = 0; t < want.grads().size(); ++t) {
    double scale = 0;
    for (float v : want.grads()[t]) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < want.grads()[t].size(); ++i) {
      ASSERT_NEAR(got.grads()[t][i], want.grads()[t][i], tol * (scale + 1e-3))
          << "table " << t << " element " << i;
    }
  }
  // Every table's gradient was announced whole: the weights block by block.
  std::vector<uint64_t> announced(want.grads().size(), 0);
  for (const auto& [t, end] : ready) {
    EXPECT_GE(end, announced[t]);
    announced[t] = end;
  }
  for (size_t t = 0; t < announced.size(); ++t) EXPECT_EQ(announced[t], want.grads()[t].size());
  double l = 0, wl = 0;
  int64_t c = 0, wc = 0;
  ASSERT_THAT(got.Evaluate(x.data(), y.data(), batch, &l, &c), IsOk());
  ASSERT_THAT(want.Evaluate(x.data(), y.data(), batch, &wl, &wc), IsOk());
  EXPECT_NEAR(l, wl, 1e-3 * std::abs(wl) + 1e-4);
}

// Batches prefetched while another step computes give the steps they would
// have given copied up at their turn (on the CPU Prefetch does nothing).
TEST_P(DeviceTest, PrefetchedBatchesGiveTheSameSteps) {
  const std::vector<int> layers = {21, 16, 4};
  Mlp plain(layers, StepActivation(), device_.get());
  Mlp ahead(layers, StepActivation(), device_.get());
  std::mt19937 rng(37);
  for (size_t t = 0; t < plain.params().size(); ++t) {
    plain.params()[t] = Random(plain.params()[t].size(), &rng, -0.3f, 0.3f);
    ahead.params()[t] = plain.params()[t];
  }
  std::vector<std::vector<float>> xs;
  std::vector<std::vector<int32_t>> ys;
  for (int k = 0; k < 3; ++k) {
    xs.push_back(Random(9 * 21, &rng));
    ys.emplace_back(9);
    for (int32_t& v : ys.back()) v = static_cast<int32_t>(rng() % 4);
  }
  ASSERT_THAT(ahead.Prefetch(xs[0].data(), ys[0].data(), 9), IsOk());
  for (int k = 0; k < 3; ++k) {
    if (k + 1 < 3) ASSERT_THAT(ahead.Prefetch(xs[k + 1].data(), ys[k + 1].data(), 9), IsOk());
    auto a = ahead.TrainStep(xs[k].data(), ys[k].data(), 9, Mlp::Hooks());
    auto p = plain.TrainStep(xs[k].data(), ys[k].data(), 9, Mlp::Hooks());
    ASSERT_THAT(a.status(), IsOk());
    ASSERT_THAT(p.status(), IsOk());
    EXPECT_EQ(*a, *p) << "step " << k;
    for (size_t t = 0; t < plain.grads().size(); ++t) EXPECT_EQ(ahead.grads()[t], plain.grads()[t]);
  }
  // A prefetched batch that never gets its step is dropped; the next step
  // copies its own.
  ASSERT_THAT(ahead.Prefetch(xs[2].data(), ys[2].data(), 9), IsOk());
  ahead.DropPrefetched();
  auto a = ahead.TrainStep(xs[0].data(), ys[0].data(), 9, Mlp::Hooks());
  auto p = plain.TrainStep(xs[0].data(), ys[0].data(), 9, Mlp::Hooks());
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_EQ(*a, *p);
}

// One Wide & Deep step (embeddings gathered and scatter-added, the wide
// part, sigmoid cross-entropy) on this device against the CPU's.
TEST_P(DeviceTest, OneWideDeepStepMatchesTheCpu) {
  ModelSection model;
  model.type = "wide_deep";
  model.embedding_dim = 5;
  model.hidden = {16, 7};
  auto cpu = NewCpuDevice(1);
  WideDeep want(model, StepActivation(), cpu.get());
  WideDeep got(model, StepActivation(), device_.get());
  std::mt19937 rng(29);
  for (size_t t = 0; t < want.params().size(); ++t) {
    want.params()[t] = Random(want.params()[t].size(), &rng, -0.3f, 0.3f);
    got.params()[t] = want.params()[t];
  }
  const int batch = 37;
  const size_t unique = 11;
  const auto dense = Random(static_cast<size_t>(batch) * kCtrDenseFeatures, &rng);
  std::vector<uint32_t> slot(static_cast<size_t>(batch) * kCtrFields);
  for (uint32_t& s : slot) s = rng() % unique;
  std::vector<float> labels(batch);
  for (float& l : labels) l = static_cast<float>(rng() % 2);
  const auto wide_rows = Random(unique, &rng);
  const auto emb_rows = Random(unique * model.embedding_dim, &rng);
  std::vector<float> wg, eg, want_wg, want_eg;
  auto loss = got.TrainStep(dense.data(), slot.data(), labels.data(), batch, wide_rows.data(),
                            emb_rows.data(), unique, &wg, &eg);
  ASSERT_THAT(loss.status(), IsOk());
  auto want_loss = want.TrainStep(dense.data(), slot.data(), labels.data(), batch, wide_rows.data(),
                                  emb_rows.data(), unique, &want_wg, &want_eg);
  ASSERT_THAT(want_loss.status(), IsOk());
  const double tol = GetParam().precision == Precision::kFp32 ? 1e-4 : 3e-2;
  EXPECT_NEAR(*loss, *want_loss, tol * std::abs(*want_loss) + 1e-4);
  auto close = [&](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    double scale = 0;
    for (float v : b) scale = std::max(scale, double(std::abs(v)));
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_NEAR(a[i], b[i], tol * (scale + 1e-3)) << what << " " << i;
    }
  };
  close(wg, want_wg, "wide gradient");
  close(eg, want_eg, "embedding gradient");
  for (size_t t = 0; t < want.grads().size(); ++t) {
    close(got.grads()[t], want.grads()[t], "dense table");
  }
  std::vector<float> p(batch), want_p(batch);
  ASSERT_THAT(
      got.Predict(dense.data(), slot.data(), batch, wide_rows.data(), emb_rows.data(), p.data()),
      IsOk());
  ASSERT_THAT(want.Predict(dense.data(), slot.data(), batch, wide_rows.data(), emb_rows.data(),
                           want_p.data()),
              IsOk());
  close(p, want_p, "probability");
}

INSTANTIATE_TEST_SUITE_P(Cpu, DeviceTest, ::testing::Values(DeviceParam{"cpu", Precision::kFp32}),
                         ParamName);
INSTANTIATE_TEST_SUITE_P(Cuda, DeviceTest,
                         ::testing::Values(DeviceParam{"cuda", Precision::kFp32},
                                           DeviceParam{"cuda", Precision::kTf32},
                                           DeviceParam{"cuda", Precision::kBf16}),
                         ParamName);

// Choosing the device (worker.device).
TEST(NewDeviceTest, CpuIsAlwaysThereAndCudaWithoutAGpuSaysWhy) {
  DeviceChoice cpu;
  cpu.device = "cpu";
  auto d = NewDevice(cpu);
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_STREQ((*d)->name(), "cpu");

  std::string why;
  const bool gpu = VisibleGpus(&why) > 0;
  DeviceChoice cuda;
  cuda.device = "cuda";
  auto c = NewDevice(cuda);
  if (gpu) {
    ASSERT_THAT(c.status(), IsOk());
    EXPECT_STREQ((*c)->name(), "cuda");
  } else {
    EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("worker.device is cuda but " + why)));
    EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("set worker.device: cpu or auto")));
  }
  DeviceChoice autoc;
  std::string note;
  auto a = NewDevice(autoc, &note);
  ASSERT_THAT(a.status(), IsOk());
  EXPECT_STREQ((*a)->name(), gpu ? "cuda" : "cpu");
  EXPECT_THAT(note, HasSubstr("device auto: "));
  if (!gpu) EXPECT_THAT(note, HasSubstr(why));

  DeviceChoice bad;
  bad.device = "tpu";
  EXPECT_THAT(NewDevice(bad).status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("unknown worker.device 'tpu'")));
  DeviceChoice no_such_gpu;
  no_such_gpu.device = "cuda";
  no_such_gpu.gpu = 99;
  EXPECT_THAT(NewDevice(no_such_gpu).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("worker.device is cuda")));
}

TEST(NewDeviceTest, PrecisionNamesRoundTrip) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
    auto parsed = ParsePrecision(PrecisionName(p));
    ASSERT_THAT(parsed.status(), IsOk());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_THAT(ParsePrecision("fp16").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fp32, tf32 or bf16")));
}

}  // namespace
}  // namespace strata::worker
