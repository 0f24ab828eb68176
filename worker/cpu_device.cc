#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

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

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "tf32") return Precision::kTf32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown precision '", name, "' (fp32, tf32 or bf16)"));
}

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kBf16:
      return "bf16";
  }
  return "?";
}

namespace {

class CpuDevice : public Device {
 public:
  explicit CpuDevice(int threads) {
    if (threads > 0) openblas_set_num_threads(threads);
  }
  const char* name() const override { return "cpu"; }
  std::string Describe() const override {
    const int t = openblas_get_num_threads();
    return absl::StrCat("cpu (OpenBLAS, ", t, t == 1 ? " thread)" : " threads)");
  }
  bool host_memory() const override { return true; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    // Cache-line aligned, as the GPU's allocations are (and never null).
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
    }
    return p;
  }
  void Release(void* p) override { std::free(p); }
  absl::Status PinHost(void*, size_t) override { return absl::OkStatus(); }
  void UnpinHost(void*) override {}

  // Copies are done at once; every fence is complete.
  Fence Upload(void* dst, const void* src, size_t bytes) override {
    if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
    return 0;
  }
  void ComputeAfter(Fence) override {}
  Fence Download(void* dst, const void* src, size_t bytes) override {
    if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
    return 0;
  }
  bool Done(Fence) override { return true; }
  absl::Status Wait(Fence) override { return absl::OkStatus(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  void Copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src && bytes > 0) std::memmove(dst, src, bytes);
  }
  void Zero(void* dst, size_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }

  void GemmStrided(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                   const float* b, int ldb, float beta, float* c, int ldc) override {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, lda, b, ldb, beta, c, ldc);
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

  void ActivationBackward(Activation act, int64_t n, const float* y, float* g) override {
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

  double SoftmaxCrossEntropy(int rows, int classes, const float* logits, const int32_t* labels,
                             float* grad, int64_t* correct) override {
    double loss = 0;
    for (int r = 0; r < rows; ++r) {
      const float* z = logits + static_cast<int64_t>(r) * classes;
      int argmax = 0;
      float mx = z[0];
      for (int c = 1; c < classes; ++c) {
        if (z[c] > mx) {
          mx = z[c];
          argmax = c;
        }
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

  void SoftmaxCrossEntropyPending(int rows, int classes, const float* logits, const int32_t* labels,
                                  float* grad) override {
    pending_loss_ += SoftmaxCrossEntropy(rows, classes, logits, labels, grad, &pending_correct_);
  }
  double TakePendingLoss(int64_t* correct) override {
    const double loss = pending_loss_;
    if (correct != nullptr) *correct = pending_correct_;
    pending_loss_ = 0;
    pending_correct_ = 0;
    return loss;
  }

  double SigmoidCrossEntropy(int rows, const float* logits, const float* labels, float* grad,
                             int64_t* correct) override {
    double loss = 0;
    for (int r = 0; r < rows; ++r) {
      const double z = logits[r];
      const double softplus = z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z));
      loss += softplus - labels[r] * z;
      if (grad != nullptr) grad[r] = static_cast<float>(1.0 / (1.0 + std::exp(-z)) - labels[r]);
      if (correct != nullptr && (z > 0) == (labels[r] > 0.5f)) ++*correct;
    }
    return loss;
  }

  void Sigmoid(int64_t n, const float* logits, float* probs) override {
    for (int64_t i = 0; i < n; ++i) probs[i] = 1.f / (1.f + std::exp(-logits[i]));
  }

  void GatherRows(int rows, int fields, int dim, const float* table, const uint32_t* slot,
                  float* out, int out_stride) override {
    for (int r = 0; r < rows; ++r) {
      float* o = out + static_cast<int64_t>(r) * out_stride;
      for (int f = 0; f < fields; ++f) {
        std::memcpy(o + static_cast<int64_t>(f) * dim,
                    table + static_cast<int64_t>(slot[static_cast<int64_t>(r) * fields + f]) * dim,
                    sizeof(float) * dim);
      }
    }
  }

  void ScatterAddRows(int rows, int fields, int dim, const float* in, int in_stride,
                      const uint32_t* slot, float* table_grad) override {
    for (int r = 0; r < rows; ++r) {
      const float* d = in + static_cast<int64_t>(r) * in_stride;
      for (int f = 0; f < fields; ++f) {
        float* g =
            table_grad + static_cast<int64_t>(slot[static_cast<int64_t>(r) * fields + f]) * dim;
        const float* s = d + static_cast<int64_t>(f) * dim;
        for (int k = 0; k < dim; ++k) g[k] += s[k];
      }
    }
  }

 private:
  double pending_loss_ = 0;
  int64_t pending_correct_ = 0;
};

}  // namespace

std::unique_ptr<Device> NewCpuDevice(int threads) { return std::make_unique<CpuDevice>(threads); }

}  // namespace strata::worker
