// Where a worker's math runs: the CPU (OpenBLAS) or an NVIDIA GPU (CUDA and
// cuBLAS, worker/cuda/). The models call only these operations.
//
// Memory: every array argument of the math below is device memory, from
// Allocate (or, on the CPU, where device memory is host memory, any host
// array). Matrices are row-major float arrays. Scalar results (a loss, a
// count of correct predictions) come back to the host.
//
// Order: the device runs its work in the order it is issued, on a compute
// stream; Upload and Download run on a copy stream beside it, so a layer's
// parameters can arrive, and a layer's gradient leave, while other layers
// compute. A Fence marks the end of a copy. On the CPU everything is done
// when the call returns and every fence is complete.
#ifndef STRATA_WORKER_DEVICE_H_
#define STRATA_WORKER_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::worker {

enum class Activation { kRelu, kTanh, kSigmoid };
absl::StatusOr<Activation> ParseActivation(const std::string& name);

// The arithmetic of the matrix products on a GPU: fp32, TF32 tensor cores
// (fp32 in and out, inputs rounded to 10 mantissa bits), or bf16 inputs
// converted on the GPU with fp32 accumulation. The CPU computes fp32 always.
enum class Precision { kFp32, kTf32, kBf16 };
absl::StatusOr<Precision> ParsePrecision(const std::string& name);
const char* PrecisionName(Precision p);

// Implementations are not thread-safe: one Device per training thread.
class Device {
 public:
  using Fence = uint64_t;

  virtual ~Device() = default;
  virtual const char* name() const = 0;
  // What it is, for logs: "cpu (OpenBLAS, 1 thread)", "cuda:0 (NVIDIA H200,
  // 139.8 GiB, sm_90, tf32)".
  virtual std::string Describe() const = 0;
  // True when device memory is host memory (the CPU): the models then
  // compute on their host arrays and copy nothing.
  virtual bool host_memory() const = 0;

  // ---- Memory ----
  // `bytes` of device memory (contents undefined), or RESOURCE_EXHAUSTED
  // naming the size and what is free.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Release(void* p) = 0;
  // Pins host memory so copies from and to it run asynchronously (the GPU's
  // copy engine reads it directly); nothing on the CPU. Unpin before the
  // memory is freed.
  virtual absl::Status PinHost(void* p, size_t bytes) = 0;
  virtual void UnpinHost(void* p) = 0;

  // ---- Copies and order ----
  // Host -> device on the copy stream; `src` must stay as it is until the
  // fence is done. Compute issued after ComputeAfter(f) waits for it.
  virtual Fence Upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void ComputeAfter(Fence f) = 0;
  // Device -> host on the copy stream, after all compute issued so far.
  virtual Fence Download(void* dst, const void* src, size_t bytes) = 0;
  virtual bool Done(Fence f) = 0;
  // Until the fence is done; an error the device met on the way (a failed
  // kernel, a lost GPU) is returned here and by Synchronize.
  virtual absl::Status Wait(Fence f) = 0;
  // Until all issued work is done.
  virtual absl::Status Synchronize() = 0;
  // Device -> device on the compute stream, and zero-filling.
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void Zero(void* dst, size_t bytes) = 0;

  // ---- Math ----
  // C[m x n] = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T;
  // op(A) is m x k, op(B) is k x n. lda, ldb and ldc are the row strides (in
  // elements) of A, B and C as stored, so a block of columns of a larger
  // matrix can take part (the MLP computes a weight's rows block by block).
  virtual void GemmStrided(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                           const float* a, int lda, const float* b, int ldb, float beta, float* c,
                           int ldc) = 0;
  // GemmStrided on densely stored matrices.
  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) {
    GemmStrided(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c,
                n);
  }
  // x[rows x cols] += bias[cols] on every row.
  virtual void AddBias(int rows, int cols, const float* bias, float* x) = 0;
  // bias_grad[cols] = column sums of g[rows x cols].
  virtual void ColumnSum(int rows, int cols, const float* g, float* bias_grad) = 0;
  // x = f(x), elementwise.
  virtual void ActivationForward(Activation act, int64_t n, float* x) = 0;
  // g *= f'(.) evaluated from the activation's output y.
  virtual void ActivationBackward(Activation act, int64_t n, const float* y, float* g) = 0;
  // Softmax cross-entropy over rows of logits[rows x classes] with integer
  // labels. Writes d(sum loss)/d logits into grad (may be nullptr), adds the
  // number of rows whose argmax equals the label to *correct (a host
  // counter; may be nullptr), and returns the summed loss.
  virtual double SoftmaxCrossEntropy(int rows, int classes, const float* logits,
                                     const int32_t* labels, float* grad, int64_t* correct) = 0;
  // SoftmaxCrossEntropy with the loss (and the count of rows predicted
  // right) left on the device, added to running sums that TakePendingLoss
  // returns (waiting for them) and clears: a training step then waits for
  // nothing in its middle. The CPU adds them up at once. `correct` may be
  // nullptr.
  virtual void SoftmaxCrossEntropyPending(int rows, int classes, const float* logits,
                                          const int32_t* labels, float* grad) = 0;
  virtual double TakePendingLoss(int64_t* correct) = 0;
  // Binary cross-entropy of logits[rows] against labels in {0, 1}:
  // softplus(z) - y z summed (returned); grad = sigmoid(z) - y (may be
  // nullptr); *correct counts (z > 0) == (y > 0.5) (may be nullptr).
  virtual double SigmoidCrossEntropy(int rows, const float* logits, const float* labels,
                                     float* grad, int64_t* correct) = 0;
  // probs[i] = sigmoid(logits[i]).
  virtual void Sigmoid(int64_t n, const float* logits, float* probs) = 0;
  // Embedding gather: for each row r and field f,
  //   out[r * out_stride + f * dim + (0..dim)] = table[slot[r * fields + f] * dim + (0..dim)].
  virtual void GatherRows(int rows, int fields, int dim, const float* table, const uint32_t* slot,
                          float* out, int out_stride) = 0;
  // Its gradient, scatter-added: for each row r and field f,
  //   table_grad[slot[r * fields + f] * dim + (0..dim)] += in[r * in_stride + f * dim + (0..dim)].
  // Rows that share a slot add up (in any order on a GPU).
  virtual void ScatterAddRows(int rows, int fields, int dim, const float* in, int in_stride,
                              const uint32_t* slot, float* table_grad) = 0;
};

// OpenBLAS-backed CPU device. `threads` sets OpenBLAS's thread count
// (process-wide); 0 leaves it as it is.
std::unique_ptr<Device> NewCpuDevice(int threads = 1);

// Whether this build has the CUDA device (STRATA_WITH_CUDA), and how many
// GPUs the CUDA runtime sees (0 without a driver or a GPU; *why says why).
bool CudaCompiledIn();
int VisibleGpus(std::string* why = nullptr);

// The CUDA device on GPU `gpu`: FAILED_PRECONDITION naming the reason when
// this build has no CUDA, the machine no GPU or driver, or no GPU `gpu`.
absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int gpu, Precision precision);

// The worker's device from its config (worker.device): "cpu", "cuda" (an
// error, naming the reason, when there is no usable GPU) or "auto" (the GPU
// when there is one, else the CPU; *note says which and why).
struct DeviceChoice {
  std::string device = "auto";  // auto | cpu | cuda
  int gpu = 0;
  Precision precision = Precision::kFp32;
  int cpu_threads = 1;
};
absl::StatusOr<std::unique_ptr<Device>> NewDevice(const DeviceChoice& choice,
                                                  std::string* note = nullptr);

// Pins every non-empty tensor of a model's parameters or gradients for the
// device's copies (nothing on the CPU). A failure is logged: unpinned, the
// copies still work, only slower. UnpinTensors undoes it.
void PinTensors(Device* device, std::vector<std::vector<float>>* tensors);
void UnpinTensors(Device* device, std::vector<std::vector<float>>* tensors);
// A model's parameters and gradients, pinned (PinModelTensors) and, at its
// end, unpinned once the device has finished with them (UnpinModelTensors:
// it waits for the device first; nothing on the CPU).
void PinModelTensors(Device* device, std::vector<std::vector<float>>* params,
                     std::vector<std::vector<float>>* grads);
void UnpinModelTensors(Device* device, std::vector<std::vector<float>>* params,
                       std::vector<std::vector<float>>* grads);

// A typed array of device memory, released with its owner.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(Device* device) : device_(device) {}
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      Free();
      device_ = o.device_;
      data_ = o.data_;
      capacity_ = o.capacity_;
      o.data_ = nullptr;
      o.capacity_ = 0;
    }
    return *this;
  }
  ~DeviceArray() { Free(); }

  // Room for at least n elements; contents are lost when it grows.
  absl::Status Reserve(size_t n) {
    if (n <= capacity_) return absl::OkStatus();
    Free();
    absl::StatusOr<void*> p = device_->Allocate(n * sizeof(T));
    if (!p.ok()) return p.status();
    data_ = static_cast<T*>(*p);
    capacity_ = n;
    return absl::OkStatus();
  }
  T* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  size_t bytes() const { return capacity_ * sizeof(T); }

 private:
  void Free() {
    if (data_ != nullptr) device_->Release(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  Device* device_ = nullptr;
  T* data_ = nullptr;
  size_t capacity_ = 0;
};

// Device arrays for each of a model's tensors, sized once: nothing when
// *d_params is not empty. RESOURCE_EXHAUSTED (naming the size) when the
// device has no room.
absl::Status ReserveModelArrays(Device* device, const std::vector<std::vector<float>>& params,
                                const std::vector<std::vector<float>>& grads,
                                std::vector<DeviceArray<float>>* d_params,
                                std::vector<DeviceArray<float>>* d_grads);

}  // namespace strata::worker

#endif  // STRATA_WORKER_DEVICE_H_
