// The CUDA device (worker/device.h): cuBLAS for the matrix products, the
// kernels of kernels.cu for the rest. A compute stream runs the math in
// order; a copy stream beside it carries uploads and downloads, ordered
// against the compute stream with events (a Fence is an event's number).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "worker/cuda/kernels.h"
#include "worker/device.h"

namespace strata::worker::cuda {

// A failed CUDA call in Init: FAILED_PRECONDITION naming the GPU and call.
#define RETURN_IF_CUDA(expr, what)                                                \
  do {                                                                            \
    if (cudaError_t e_ = (expr); e_ != cudaSuccess) {                             \
      cudaGetLastError();                                                         \
      return absl::FailedPreconditionError(                                       \
          absl::StrCat("cuda:", gpu_, ": ", what, ": ", cudaGetErrorString(e_))); \
    }                                                                             \
  } while (0)

int VisibleGpuCount(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    if (why == nullptr) return 0;
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
      // No driver at all reads as an old one: look for it.
      void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
      if (driver == nullptr) {
        *why = "this machine has no NVIDIA driver (libcuda.so.1 not found)";
        return 0;
      }
      dlclose(driver);
      if (e == cudaErrorInsufficientDriver) {
        int runtime = 0;
        cudaRuntimeGetVersion(&runtime);
        *why = absl::StrCat("the NVIDIA driver is older than this build's CUDA runtime ",
                            runtime / 1000, ".", runtime % 1000 / 10, " (update the driver)");
        return 0;
      }
    }
    *why = absl::StrCat("the CUDA runtime finds no GPU: ", cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "the CUDA runtime sees 0 GPUs";
  return n;
}

namespace {

// cuBLAS is loaded when a GPU device is made, not linked: a binary that
// never computes on a GPU (every test, every pserver, the RDMA guests'
// copies) does not load its 600 MB. Tried by soname first (the loader's
// path, ldconfig), then in the toolkit this build was made with.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  // (The C++ header overloads cublasGemmEx: the 32-bit-size one.)
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
};

#define STRATA_STR2(x) #x
#define STRATA_STR(x) STRATA_STR2(x)

absl::StatusOr<const Cublas*> LoadCublas() {
  static const absl::StatusOr<const Cublas*>* loaded = [] {
    const std::string soname = "libcublas.so." STRATA_STR(CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    std::string why = lib == nullptr ? dlerror() : "";
#ifdef STRATA_CUDA_LIBRARY_DIR
    if (lib == nullptr) {
      const std::string path = std::string(STRATA_CUDA_LIBRARY_DIR) + "/" + soname;
      lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) why = dlerror();
    }
#endif
    if (lib == nullptr) {
      return new absl::StatusOr<const Cublas*>(absl::FailedPreconditionError(
          absl::StrCat("cannot load cuBLAS (", why, "); install the CUDA toolkit's cuBLAS ", soname,
                       " where the loader finds it (ldconfig, or LD_LIBRARY_PATH)")));
    }
    auto* c = new Cublas;
    bool ok = true;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
      ok = ok && *fn != nullptr;
    };
    sym(&c->create, "cublasCreate_v2");
    sym(&c->destroy, "cublasDestroy_v2");
    sym(&c->set_stream, "cublasSetStream_v2");
    sym(&c->set_math_mode, "cublasSetMathMode");
    sym(&c->gemm_ex, "cublasGemmEx");
    if (!ok) {
      return new absl::StatusOr<const Cublas*>(absl::FailedPreconditionError(
          absl::StrCat(soname, " lacks a function this build needs: ", dlerror())));
    }
    return new absl::StatusOr<const Cublas*>(c);
  }();
  return *loaded;
}

const char* CublasName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}

class CudaDevice : public Device {
 public:
  CudaDevice(int gpu, Precision precision) : gpu_(gpu), precision_(precision) {}

  ~CudaDevice() override {
    cudaSetDevice(gpu_);
    if (compute_ != nullptr) cudaStreamSynchronize(compute_);
    if (copy_ != nullptr) cudaStreamSynchronize(copy_);
    for (auto& [id, ev] : events_) cudaEventDestroy(ev);
    for (cudaEvent_t ev : spare_events_) cudaEventDestroy(ev);
    if (blas_ != nullptr) cublas_->destroy(blas_);
    if (scalars_ != nullptr) cudaFree(scalars_);
    if (host_scalars_ != nullptr) cudaFreeHost(host_scalars_);
    if (bf16_ != nullptr) cudaFree(bf16_);
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
    if (copy_ != nullptr) cudaStreamDestroy(copy_);
  }

  absl::Status Init() {
    std::string why;
    const int n = VisibleGpuCount(&why);
    if (n == 0) return absl::FailedPreconditionError(why);
    if (gpu_ < 0 || gpu_ >= n) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker.gpu is ", gpu_, " but this machine has ", n, " GPU(s) (0..", n - 1, ")"));
    }
    RETURN_IF_CUDA(cudaSetDevice(gpu_), "cudaSetDevice");
    cudaDeviceProp prop;
    RETURN_IF_CUDA(cudaGetDeviceProperties(&prop, gpu_), "cudaGetDeviceProperties");
    // The kernels are built for compute capability 8.0 and newer
    // (CMAKE_CUDA_ARCHITECTURES): an older GPU is refused here (auto then
    // takes the CPU) rather than failing at its first kernel.
    if (prop.major < 8) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GPU ", gpu_, " (", prop.name, ") is compute capability ", prop.major, ".", prop.minor,
          "; this build's kernels need 8.0 or newer (Ampere, Hopper and later)"));
    }
    describe_ = absl::StrFormat("cuda:%d (%s, %.1f GiB, sm_%d%d, %s)", gpu_, prop.name,
                                prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor,
                                PrecisionName(precision_));
    RETURN_IF_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "cudaStreamCreate");
    RETURN_IF_CUDA(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate");
    absl::StatusOr<const Cublas*> cublas = LoadCublas();
    if (!cublas.ok()) return cublas.status();
    cublas_ = *cublas;
    if (cublasStatus_t s = cublas_->create(&blas_); s != CUBLAS_STATUS_SUCCESS) {
      blas_ = nullptr;
      return absl::FailedPreconditionError(absl::StrCat("cublasCreate: ", CublasName(s)));
    }
    cublas_->set_stream(blas_, compute_);
    cublas_->set_math_mode(
        blas_, precision_ == Precision::kTf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    // The loss accumulator (double) and the correct count, on the GPU and
    // pinned on the host to read them back.
    // [0, 16) for a loss read at once, [16, 32) for the pending sum.
    RETURN_IF_CUDA(cudaMalloc(&scalars_, 32), "cudaMalloc");
    RETURN_IF_CUDA(cudaMemset(scalars_, 0, 32), "cudaMemset");
    RETURN_IF_CUDA(cudaMallocHost(&host_scalars_, 16), "cudaMallocHost");
    return absl::OkStatus();
  }

  const char* name() const override { return "cuda"; }
  std::string Describe() const override { return describe_; }
  bool host_memory() const override { return false; }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    Use();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: cannot allocate %d bytes of GPU memory (%s; %.2f GiB of %.2f GiB free)", describe_,
          bytes, cudaGetErrorString(e), free_b / 1073741824.0, total_b / 1073741824.0));
    }
    return p;
  }
  void Release(void* p) override {
    if (p == nullptr) return;
    Use();
    cudaFree(p);
  }
  absl::Status PinHost(void* p, size_t bytes) override {
    if (bytes == 0) return absl::OkStatus();
    Use();
    const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();
      return absl::OkStatus();  // someone else's pin: theirs to undo
    }
    if (e == cudaSuccess) pinned_.insert(p);
    return Check(e, "cudaHostRegister");
  }
  void UnpinHost(void* p) override {
    if (pinned_.erase(p) == 0) return;
    Use();
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
  }

  Fence Upload(void* dst, const void* src, size_t bytes) override {
    Use();
    Note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_), "upload");
    return Record(copy_);
  }
  void ComputeAfter(Fence f) override {
    auto it = events_.find(f);
    if (it == events_.end()) return;  // done and forgotten
    Note(cudaStreamWaitEvent(compute_, it->second, 0), "cudaStreamWaitEvent");
  }
  Fence Download(void* dst, const void* src, size_t bytes) override {
    Use();
    const Fence computed = Record(compute_);
    if (auto it = events_.find(computed); it != events_.end()) {  // (else: an error noted)
      Note(cudaStreamWaitEvent(copy_, it->second, 0), "cudaStreamWaitEvent");
    }
    Note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_), "download");
    return Record(copy_);
  }
  bool Done(Fence f) override {
    auto it = events_.find(f);
    if (it == events_.end()) return true;
    const cudaError_t e = cudaEventQuery(it->second);
    if (e == cudaErrorNotReady) {
      // Kept as the thread's last error otherwise, and the next launch's
      // check would take it for its own.
      cudaGetLastError();
      return false;
    }
    Note(e, "cudaEventQuery");
    Forget(it);
    return true;
  }
  absl::Status Wait(Fence f) override {
    auto it = events_.find(f);
    if (it != events_.end()) {
      Note(cudaEventSynchronize(it->second), "cudaEventSynchronize");
      Forget(it);
    }
    return status_;
  }
  absl::Status Synchronize() override {
    Note(cudaStreamSynchronize(copy_), "cudaStreamSynchronize");
    Note(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
    for (auto it = events_.begin(); it != events_.end();) it = Forget(it);
    return status_;
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    Use();
    if (bytes > 0 && dst != src) {
      Note(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_), "copy");
    }
  }
  void Zero(void* dst, size_t bytes) override {
    Use();
    if (bytes > 0) Note(cudaMemsetAsync(dst, 0, bytes, compute_), "cudaMemsetAsync");
  }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
  // same call with A and B swapped.
  void GemmStrided(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                   const float* b, int ldb, float beta, float* c, int ldc) override {
    if (m == 0 || n == 0) return;
    Use();
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (precision_ == Precision::kBf16) {
      // A stored (ta ? k x m : m x k), B (tb ? n x k : k x n): converted to
      // dense bf16 copies, then multiplied with fp32 accumulation.
      const int ar = ta ? k : m, ac = ta ? m : k;
      const int br = tb ? n : k, bc = tb ? k : n;
      // B's copy starts 16-byte aligned, as tensor-core kernels want.
      const size_t b_at = (static_cast<size_t>(ar) * ac + 7) / 8 * 8;
      const size_t need = b_at + static_cast<size_t>(br) * bc;
      if (!GrowBf16(need)) return;
      uint16_t* a16 = bf16_;
      uint16_t* b16 = bf16_ + b_at;
      Note(ToBf16(compute_, ar, ac, a, lda, a16), "ToBf16");
      Note(ToBf16(compute_, br, bc, b, ldb, b16), "ToBf16");
      s = cublas_->gemm_ex(blas_, opb, opa, n, m, k, &alpha, b16, CUDA_R_16BF, bc, a16, CUDA_R_16BF,
                           ac, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
      s = cublas_->gemm_ex(
          blas_, opb, opa, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c,
          CUDA_R_32F, ldc,
          precision_ == Precision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
          CUBLAS_GEMM_DEFAULT);
    }
    if (s != CUBLAS_STATUS_SUCCESS && status_.ok()) {
      status_ = absl::InternalError(
          absl::StrCat(describe_, ": cublasGemmEx (", m, "x", n, "x", k, "): ", CublasName(s)));
    }
  }

  void AddBias(int rows, int cols, const float* bias, float* x) override {
    Note(cuda::AddBias(compute_, rows, cols, bias, x), "AddBias");
  }
  void ColumnSum(int rows, int cols, const float* g, float* out) override {
    Note(cuda::ColumnSum(compute_, rows, cols, g, out), "ColumnSum");
  }
  void ActivationForward(Activation act, int64_t n, float* x) override {
    Note(cuda::ActivationForward(compute_, static_cast<int>(act), n, x), "ActivationForward");
  }
  void ActivationBackward(Activation act, int64_t n, const float* y, float* g) override {
    Note(cuda::ActivationBackward(compute_, static_cast<int>(act), n, y, g), "ActivationBackward");
  }

  double SoftmaxCrossEntropy(int rows, int classes, const float* logits, const int32_t* labels,
                             float* grad, int64_t* correct) override {
    ZeroScalars();
    Note(cuda::SoftmaxCrossEntropy(compute_, rows, classes, logits, labels, grad, LossAcc(),
                                   CorrectAcc()),
         "SoftmaxCrossEntropy");
    return ReadScalars(correct);
  }
  void SoftmaxCrossEntropyPending(int rows, int classes, const float* logits, const int32_t* labels,
                                  float* grad) override {
    Note(cuda::SoftmaxCrossEntropy(compute_, rows, classes, logits, labels, grad, LossAcc() + 2,
                                   CorrectAcc() + 2),
         "SoftmaxCrossEntropy");
  }
  double TakePendingLoss(int64_t* correct) override {
    // The pending sums sit after the immediate ones: loss at byte 16, the
    // count at byte 24.
    Note(cudaMemcpyAsync(host_scalars_, LossAcc() + 2, 16, cudaMemcpyDeviceToHost, compute_),
         "cudaMemcpyAsync");
    Note(cudaMemsetAsync(LossAcc() + 2, 0, 16, compute_), "cudaMemsetAsync");
    Note(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
    double loss;
    unsigned long long hits;
    std::memcpy(&loss, host_scalars_, 8);
    std::memcpy(&hits, static_cast<char*>(host_scalars_) + 8, 8);
    if (correct != nullptr) *correct = static_cast<int64_t>(hits);
    return loss;
  }

  double SigmoidCrossEntropy(int rows, const float* logits, const float* labels, float* grad,
                             int64_t* correct) override {
    ZeroScalars();
    Note(cuda::SigmoidCrossEntropy(compute_, rows, logits, labels, grad, LossAcc(), CorrectAcc()),
         "SigmoidCrossEntropy");
    return ReadScalars(correct);
  }
  void Sigmoid(int64_t n, const float* logits, float* probs) override {
    Note(cuda::Sigmoid(compute_, n, logits, probs), "Sigmoid");
  }
  void GatherRows(int rows, int fields, int dim, const float* table, const uint32_t* slot,
                  float* out, int out_stride) override {
    Note(cuda::GatherRows(compute_, rows, fields, dim, table, slot, out, out_stride), "GatherRows");
  }
  void ScatterAddRows(int rows, int fields, int dim, const float* in, int in_stride,
                      const uint32_t* slot, float* table_grad) override {
    Note(cuda::ScatterAddRows(compute_, rows, fields, dim, in, in_stride, slot, table_grad),
         "ScatterAddRows");
  }

 private:
  // Makes this GPU the calling thread's current one (the worker makes the
  // device on one thread and trains on another).
  void Use() {
    thread_local int current = -1;
    if (current == gpu_) return;
    if (cudaSetDevice(gpu_) == cudaSuccess) {
      current = gpu_;
    } else {
      cudaGetLastError();
    }
  }

  absl::Status Check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return absl::OkStatus();
    cudaGetLastError();
    return absl::InternalError(absl::StrCat(describe_, ": ", what, ": ", cudaGetErrorString(e)));
  }
  // The first error the device meets is kept and returned by Wait and
  // Synchronize (a training step checks them): the math calls return
  // nothing, as on the CPU.
  void Note(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    absl::Status s = Check(e, what);
    if (status_.ok()) {
      LOG(ERROR) << s;
      status_ = std::move(s);
    }
  }

  Fence Record(cudaStream_t stream) {
    cudaEvent_t ev;
    if (!spare_events_.empty()) {
      ev = spare_events_.back();
      spare_events_.pop_back();
    } else if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
               e != cudaSuccess) {
      Note(e, "cudaEventCreate");
      return 0;
    }
    Note(cudaEventRecord(ev, stream), "cudaEventRecord");
    const Fence f = ++next_fence_;
    events_.emplace(f, ev);
    return f;
  }
  std::map<Fence, cudaEvent_t>::iterator Forget(std::map<Fence, cudaEvent_t>::iterator it) {
    spare_events_.push_back(it->second);
    return events_.erase(it);
  }

  bool GrowBf16(size_t elements) {
    if (elements <= bf16_capacity_) return true;
    // The old buffer may still be read by queued products.
    Note(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
    if (bf16_ != nullptr) cudaFree(bf16_);
    bf16_ = nullptr;
    bf16_capacity_ = 0;
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, elements * 2); e != cudaSuccess) {
      Note(e, "cudaMalloc (bf16 inputs)");
      return false;
    }
    bf16_ = static_cast<uint16_t*>(p);
    bf16_capacity_ = elements;
    return true;
  }

  double* LossAcc() { return static_cast<double*>(scalars_); }
  unsigned long long* CorrectAcc() {
    return reinterpret_cast<unsigned long long*>(static_cast<char*>(scalars_) + 8);
  }
  void ZeroScalars() { Note(cudaMemsetAsync(scalars_, 0, 16, compute_), "cudaMemsetAsync"); }
  // The loss (and the count) back on the host: the one wait of a step.
  double ReadScalars(int64_t* correct) {
    Note(cudaMemcpyAsync(host_scalars_, scalars_, 16, cudaMemcpyDeviceToHost, compute_),
         "cudaMemcpyAsync");
    Note(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
    double loss;
    unsigned long long hits;
    std::memcpy(&loss, host_scalars_, 8);
    std::memcpy(&hits, static_cast<char*>(host_scalars_) + 8, 8);
    if (correct != nullptr) *correct += static_cast<int64_t>(hits);
    return loss;
  }

  const int gpu_;
  const Precision precision_;
  std::string describe_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  const Cublas* cublas_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* scalars_ = nullptr;
  void* host_scalars_ = nullptr;
  uint16_t* bf16_ = nullptr;
  size_t bf16_capacity_ = 0;
  std::map<Fence, cudaEvent_t> events_;
  std::set<void*> pinned_;  // host memory this device registered
  std::vector<cudaEvent_t> spare_events_;
  Fence next_fence_ = 0;
  absl::Status status_;
};

#undef RETURN_IF_CUDA

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> NewDevice(int gpu, Precision precision) {
  auto d = std::make_unique<CudaDevice>(gpu, precision);
  absl::Status s = d->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Device>(std::move(d));
}

}  // namespace strata::worker::cuda
