// Where a worker's math runs. The MLP calls only these operations, so a CUDA
// device (later issue) slots in beside the CPU one. All matrices are
// row-major float arrays owned by the caller.
#ifndef STRATA_WORKER_DEVICE_H_
#define STRATA_WORKER_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace strata::worker {

enum class Activation { kRelu, kTanh, kSigmoid };
absl::StatusOr<Activation> ParseActivation(const std::string& name);

// Implementations are not thread-safe: one Device per training thread.
class Device {
 public:
  virtual ~Device() = default;
  virtual const char* name() const = 0;

  // C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T;
  // op(A) is m x k, op(B) is k x n. lda, ldb and ldc are the row strides (in
  // elements) of A, B and C as stored, so a block of columns of a larger
  // matrix can take part (the MLP computes a weight's rows block by block).
  virtual void GemmStrided(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                           const float* a, int lda, const float* b, int ldb, float beta,
                           float* c, int ldc) = 0;
  // GemmStrided on densely stored matrices.
  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) {
    GemmStrided(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n,
                beta, c, n);
  }
  // x[rows x cols] += bias[cols] on every row.
  virtual void AddBias(int rows, int cols, const float* bias, float* x) = 0;
  // bias_grad[cols] = column sums of g[rows x cols].
  virtual void ColumnSum(int rows, int cols, const float* g, float* bias_grad) = 0;
  // x = f(x), elementwise.
  virtual void ActivationForward(Activation act, int64_t n, float* x) = 0;
  // g *= f'(.) evaluated from the activation's output y.
  virtual void ActivationBackward(Activation act, int64_t n, const float* y,
                                  float* g) = 0;
  // Softmax cross-entropy over rows of logits[rows x classes] with integer
  // labels. Writes d(sum loss)/d logits into grad (may be nullptr), adds the
  // number of rows whose argmax equals the label to *correct (may be
  // nullptr), and returns the summed loss.
  virtual double SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                     const int32_t* labels, float* grad,
                                     int64_t* correct) = 0;
};

// OpenBLAS-backed CPU device. `threads` sets OpenBLAS's thread count
// (process-wide); 0 leaves it as it is.
std::unique_ptr<Device> NewCpuDevice(int threads = 1);

}  // namespace strata::worker

#endif  // STRATA_WORKER_DEVICE_H_
