// The CUDA kernels of the GPU device (worker/cuda/cuda_device.cc), as
// launchers on a stream. Plain C++ (no abseil) so that nvcc compiles only
// kernels.cu. Each launcher returns the launch's cudaError_t; arrays are
// device memory and row-major, as in worker/device.h.
#ifndef STRATA_WORKER_CUDA_KERNELS_H_
#define STRATA_WORKER_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::worker::cuda {

// Activation codes, as worker::Activation.
enum ActivationCode { kActRelu = 0, kActTanh = 1, kActSigmoid = 2 };

cudaError_t AddBias(cudaStream_t s, int rows, int cols, const float* bias, float* x);
cudaError_t ColumnSum(cudaStream_t s, int rows, int cols, const float* g, float* out);
cudaError_t ActivationForward(cudaStream_t s, int act, int64_t n, float* x);
cudaError_t ActivationBackward(cudaStream_t s, int act, int64_t n, const float* y, float* g);

// Adds the summed loss to *loss_acc and the number of rows whose argmax is
// the label to *correct_acc (device scalars); grad may be null.
cudaError_t SoftmaxCrossEntropy(cudaStream_t s, int rows, int classes, const float* logits,
                                const int32_t* labels, float* grad, double* loss_acc,
                                unsigned long long* correct_acc);
cudaError_t SigmoidCrossEntropy(cudaStream_t s, int rows, const float* logits, const float* labels,
                                float* grad, double* loss_acc, unsigned long long* correct_acc);
cudaError_t Sigmoid(cudaStream_t s, int64_t n, const float* logits, float* probs);

cudaError_t GatherRows(cudaStream_t s, int rows, int fields, int dim, const float* table,
                       const uint32_t* slot, float* out, int out_stride);
cudaError_t ScatterAddRows(cudaStream_t s, int rows, int fields, int dim, const float* in,
                           int in_stride, const uint32_t* slot, float* table_grad);

// dst[r * cols + c] = bf16(src[r * ld + c]) for a rows x cols block: the
// bf16 products' inputs, converted on the GPU (dst holds rows * cols
// uint16_t, the bit pattern of __nv_bfloat16).
cudaError_t ToBf16(cudaStream_t s, int rows, int cols, const float* src, int ld, uint16_t* dst);

}  // namespace strata::worker::cuda

#endif  // STRATA_WORKER_CUDA_KERNELS_H_
