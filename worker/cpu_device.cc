#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/vector_ops.h"
#include "worker/device.h"

namespace strata::worker {

absl::StatusOr<Activation> ParseActivation(const std::string& name) {
  if (name == "relu") return Activation::kRelu;
  if (name == "tanh") return Activation::kTanh;
  if (name == "sigmoid") return Activation::kSigmoid;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown activation '", name, "' (relu, tanh or sigmoid)"));
}

namespace {

class CpuDevice : public Device {
 public:
  explicit CpuDevice(int threads) {
    if (threads > 0) openblas_set_num_threads(threads);
  }
  const char* name() const override { return "cpu"; }

  void GemmStrided(bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c,
                   int ldc) override {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
  }

  void AddBias(int rows, int cols, const float* bias, float* x) override {
    AddBiasRows(x, bias, rows, cols);
  }

  void ColumnSum(int rows, int cols, const float* g, float* out) override {
    SumRows(g, out, rows, cols);
  }

  void ActivationForward(Activation act, int64_t n, float* x) override {
    switch (act) {
      case Activation::kRelu:
        ReluForward(x, n);
        break;
      case Activation::kTanh:
        for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i]);
        break;
      case Activation::kSigmoid:
        for (int64_t i = 0; i < n; ++i) x[i] = 1.f / (1.f + std::exp(-x[i]));
        break;
    }
  }

  void ActivationBackward(Activation act, int64_t n, const float* y,
                          float* g) override {
    switch (act) {
      case Activation::kRelu:
        ReluBackward(y, g, n);
        break;
      case Activation::kTanh:
        for (int64_t i = 0; i < n; ++i) g[i] *= 1.f - y[i] * y[i];
        break;
      case Activation::kSigmoid:
        for (int64_t i = 0; i < n; ++i) g[i] *= y[i] * (1.f - y[i]);
        break;
    }
  }

  double SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                             const int32_t* labels, float* grad,
                             int64_t* correct) override {
    double loss = 0;
    for (int r = 0; r < rows; ++r) {
      const float* z = logits + static_cast<int64_t>(r) * classes;
      int argmax = 0;
      float mx = z[0];
      for (int c = 1; c < classes; ++c) {
        if (z[c] > mx) { mx = z[c]; argmax = c; }
      }
      double sum = 0;
      for (int c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - mx));
      const double log_sum = std::log(sum);
      loss += log_sum - static_cast<double>(z[labels[r]] - mx);
      if (correct != nullptr && argmax == labels[r]) ++*correct;
      if (grad != nullptr) {
        float* gr = grad + static_cast<int64_t>(r) * classes;
        for (int c = 0; c < classes; ++c) {
          gr[c] = static_cast<float>(std::exp(static_cast<double>(z[c] - mx) - log_sum));
        }
        gr[labels[r]] -= 1.f;
      }
    }
    return loss;
  }
};

}  // namespace

std::unique_ptr<Device> NewCpuDevice(int threads) {
  return std::make_unique<CpuDevice>(threads);
}

}  // namespace strata::worker
