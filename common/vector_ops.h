// Elementwise float kernels on hot paths (pserver aggregation, the CPU
// device), in one file compiled with -O3 and cloned for AVX2 so they
// vectorise whatever the build type; plain loops, no intrinsics.
#ifndef STRATA_COMMON_VECTOR_OPS_H_
#define STRATA_COMMON_VECTOR_OPS_H_

#include <cstddef>

namespace strata {

// sum[i] += x[i]
void AddInto(float* sum, const float* x, size_t n);
// x[i] = max(x[i], 0)
void ReluForward(float* x, size_t n);
// g[i] = y[i] > 0 ? g[i] : 0  (y: the relu's output)
void ReluBackward(const float* y, float* g, size_t n);
// x[r][c] += bias[c] for each of `rows` rows of `cols`
void AddBiasRows(float* x, const float* bias, size_t rows, size_t cols);
// out[c] = sum over rows of g[r][c]
void SumRows(const float* g, float* out, size_t rows, size_t cols);
// x[i] *= s
void Scale(float* x, float s, size_t n);

// Makes this thread, and the threads it creates from now on (they inherit
// its floating-point environment), treat denormal floats as zero, in and
// out (x86 MXCSR FTZ and DAZ; elsewhere nothing). An optimizer's state of a
// parameter whose gradient stays zero (Adam's m and v decaying geometrically,
// e.g. the weights of an image's always-black border pixels) reaches the
// denormal range after some hundred steps, where each operation costs a
// hundred times more: flushed, such values are zero. Called by InitDaemon
// before any thread starts.
void FlushDenormalsToZero();

}  // namespace strata

#endif  // STRATA_COMMON_VECTOR_OPS_H_
