// The GPU device's own kernels (worker/cuda/kernels.h). Each one matches
// the CPU device's loop of the same name (worker/cpu_device.cc); the tests
// of tests/worker/device_test.cc hold them to it.
#include <cuda_bf16.h>

#include "worker/cuda/kernels.h"

namespace strata::worker::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

// Blocks for n elements in a grid-stride loop: enough to fill the GPU,
// never more than the grid allows.
unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

__global__ void AddBiasKernel(int64_t n, int cols, const float* __restrict__ bias,
                              float* __restrict__ x) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += bias[i % cols];
  }
}

// A block sums 32 columns: its 32 x 8 threads each add every eighth row of
// one column (a warp reads 32 neighbouring floats of a row), then the eight
// partial sums of each column are added in shared memory.
__global__ void ColumnSumKernel(int rows, int cols, const float* __restrict__ g,
                                float* __restrict__ out) {
  __shared__ float part[8][kWarp + 1];
  const int c = blockIdx.x * kWarp + threadIdx.x;
  float sum = 0.f;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += 8) sum += g[static_cast<int64_t>(r) * cols + c];
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.f;
    for (int k = 0; k < 8; ++k) total += part[k][threadIdx.x];
    out[c] = total;
  }
}

__device__ float Apply(int act, float v) {
  switch (act) {
    case kActRelu:
      return v > 0.f ? v : 0.f;
    case kActTanh:
      return tanhf(v);
    default:
      return 1.f / (1.f + expf(-v));
  }
}

// The derivative from the activation's output y.
__device__ float Derivative(int act, float y) {
  switch (act) {
    case kActRelu:
      return y > 0.f ? 1.f : 0.f;
    case kActTanh:
      return 1.f - y * y;
    default:
      return y * (1.f - y);
  }
}

__global__ void ActivationForwardKernel(int act, int64_t n, float* __restrict__ x) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] = Apply(act, x[i]);
  }
}

__global__ void ActivationBackwardKernel(int act, int64_t n, const float* __restrict__ y,
                                         float* __restrict__ g) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    g[i] *= Derivative(act, y[i]);
  }
}

__device__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ double WarpSum(double v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp a row: the row's max (and the first class that reaches it, as
// the CPU's argmax), the log of the sum of exponentials in double, then the
// gradient; lane 0 adds the row's loss and hit to the accumulators.
__global__ void SoftmaxCrossEntropyKernel(int rows, int classes, const float* __restrict__ logits,
                                          const int32_t* __restrict__ labels,
                                          float* __restrict__ grad, double* loss_acc,
                                          unsigned long long* correct_acc) {
  const int warps = blockDim.x / kWarp;
  const int row = blockIdx.x * warps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float* z = logits + static_cast<int64_t>(row) * classes;
  float mx = -INFINITY;
  int arg = classes;
  for (int c = lane; c < classes; c += kWarp) {
    if (z[c] > mx) {
      mx = z[c];
      arg = c;
    }
  }
  const float row_max = WarpMax(mx);
  // The first class at the max: the smallest index among lanes that saw it.
  int first = mx == row_max ? arg : classes;
  for (int o = kWarp / 2; o > 0; o /= 2) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
  double sum = 0;
  for (int c = lane; c < classes; c += kWarp) sum += exp(static_cast<double>(z[c] - row_max));
  const double log_sum = log(WarpSum(sum));
  const int label = labels[row];
  if (grad != nullptr) {
    float* g = grad + static_cast<int64_t>(row) * classes;
    for (int c = lane; c < classes; c += kWarp) {
      const float p = static_cast<float>(exp(static_cast<double>(z[c] - row_max) - log_sum));
      g[c] = c == label ? p - 1.f : p;
    }
  }
  if (lane == 0) {
    atomicAdd(loss_acc, log_sum - static_cast<double>(z[label] - row_max));
    if (first == label) atomicAdd(correct_acc, 1ull);
  }
}

__global__ void SigmoidCrossEntropyKernel(int rows, const float* __restrict__ logits,
                                          const float* __restrict__ labels,
                                          float* __restrict__ grad, double* loss_acc,
                                          unsigned long long* correct_acc) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  double loss = 0;
  unsigned hit = 0;
  if (i < rows) {
    const double z = logits[i];
    const double softplus = z > 0 ? z + log1p(exp(-z)) : log1p(exp(z));
    loss = softplus - labels[i] * z;
    if (grad != nullptr) grad[i] = static_cast<float>(1.0 / (1.0 + exp(-z)) - labels[i]);
    hit = (z > 0) == (labels[i] > 0.5f) ? 1u : 0u;
  }
  loss = WarpSum(loss);
  const unsigned hits = __popc(__ballot_sync(0xffffffffu, hit != 0));
  if (threadIdx.x % kWarp == 0) {
    if (loss != 0) atomicAdd(loss_acc, loss);
    if (hits != 0) atomicAdd(correct_acc, static_cast<unsigned long long>(hits));
  }
}

__global__ void SigmoidKernel(int64_t n, const float* __restrict__ z, float* __restrict__ p) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p[i] = 1.f / (1.f + expf(-z[i]));
  }
}

// One thread an element of the output: (row, field, k).
__global__ void GatherRowsKernel(int64_t n, int fields, int dim, const float* __restrict__ table,
                                 const uint32_t* __restrict__ slot, float* __restrict__ out,
                                 int out_stride) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int k = static_cast<int>(i % dim);
    const int64_t rf = i / dim;  // row * fields + field
    const int64_t r = rf / fields;
    const int f = static_cast<int>(rf % fields);
    out[r * out_stride + static_cast<int64_t>(f) * dim + k] =
        table[static_cast<int64_t>(slot[rf]) * dim + k];
  }
}

__global__ void ScatterAddRowsKernel(int64_t n, int fields, int dim, const float* __restrict__ in,
                                     int in_stride, const uint32_t* __restrict__ slot,
                                     float* table_grad) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int k = static_cast<int>(i % dim);
    const int64_t rf = i / dim;
    const int64_t r = rf / fields;
    const int f = static_cast<int>(rf % fields);
    atomicAdd(table_grad + static_cast<int64_t>(slot[rf]) * dim + k,
              in[r * in_stride + static_cast<int64_t>(f) * dim + k]);
  }
}

__global__ void ToBf16Kernel(int64_t n, int cols, const float* __restrict__ src, int ld,
                             __nv_bfloat16* __restrict__ dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols;
    const int c = static_cast<int>(i % cols);
    dst[i] = __float2bfloat16_rn(src[r * ld + c]);
  }
}

}  // namespace

cudaError_t AddBias(cudaStream_t s, int rows, int cols, const float* bias, float* x) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  if (n == 0) return cudaSuccess;
  AddBiasKernel<<<Blocks(n), kThreads, 0, s>>>(n, cols, bias, x);
  return cudaGetLastError();
}

cudaError_t ColumnSum(cudaStream_t s, int rows, int cols, const float* g, float* out) {
  if (cols == 0) return cudaSuccess;
  ColumnSumKernel<<<(cols + kWarp - 1) / kWarp, dim3(kWarp, 8), 0, s>>>(rows, cols, g, out);
  return cudaGetLastError();
}

cudaError_t ActivationForward(cudaStream_t s, int act, int64_t n, float* x) {
  if (n == 0) return cudaSuccess;
  ActivationForwardKernel<<<Blocks(n), kThreads, 0, s>>>(act, n, x);
  return cudaGetLastError();
}

cudaError_t ActivationBackward(cudaStream_t s, int act, int64_t n, const float* y, float* g) {
  if (n == 0) return cudaSuccess;
  ActivationBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(act, n, y, g);
  return cudaGetLastError();
}

cudaError_t SoftmaxCrossEntropy(cudaStream_t s, int rows, int classes, const float* logits,
                                const int32_t* labels, float* grad, double* loss_acc,
                                unsigned long long* correct_acc) {
  if (rows == 0) return cudaSuccess;
  const int warps = kThreads / kWarp;
  SoftmaxCrossEntropyKernel<<<(rows + warps - 1) / warps, kThreads, 0, s>>>(
      rows, classes, logits, labels, grad, loss_acc, correct_acc);
  return cudaGetLastError();
}

cudaError_t SigmoidCrossEntropy(cudaStream_t s, int rows, const float* logits, const float* labels,
                                float* grad, double* loss_acc, unsigned long long* correct_acc) {
  if (rows == 0) return cudaSuccess;
  SigmoidCrossEntropyKernel<<<(rows + kThreads - 1) / kThreads, kThreads, 0, s>>>(
      rows, logits, labels, grad, loss_acc, correct_acc);
  return cudaGetLastError();
}

cudaError_t Sigmoid(cudaStream_t s, int64_t n, const float* logits, float* probs) {
  if (n == 0) return cudaSuccess;
  SigmoidKernel<<<Blocks(n), kThreads, 0, s>>>(n, logits, probs);
  return cudaGetLastError();
}

cudaError_t GatherRows(cudaStream_t s, int rows, int fields, int dim, const float* table,
                       const uint32_t* slot, float* out, int out_stride) {
  const int64_t n = static_cast<int64_t>(rows) * fields * dim;
  if (n == 0) return cudaSuccess;
  GatherRowsKernel<<<Blocks(n), kThreads, 0, s>>>(n, fields, dim, table, slot, out, out_stride);
  return cudaGetLastError();
}

cudaError_t ScatterAddRows(cudaStream_t s, int rows, int fields, int dim, const float* in,
                           int in_stride, const uint32_t* slot, float* table_grad) {
  const int64_t n = static_cast<int64_t>(rows) * fields * dim;
  if (n == 0) return cudaSuccess;
  ScatterAddRowsKernel<<<Blocks(n), kThreads, 0, s>>>(n, fields, dim, in, in_stride, slot,
                                                      table_grad);
  return cudaGetLastError();
}

cudaError_t ToBf16(cudaStream_t s, int rows, int cols, const float* src, int ld, uint16_t* dst) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  if (n == 0) return cudaSuccess;
  ToBf16Kernel<<<Blocks(n), kThreads, 0, s>>>(n, cols, src, ld,
                                              reinterpret_cast<__nv_bfloat16*>(dst));
  return cudaGetLastError();
}

}  // namespace strata::worker::cuda
