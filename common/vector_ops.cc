#include "common/vector_ops.h"

#include <algorithm>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace strata {

// Cloned for AVX2 and picked at load time by the CPU.
#define STRATA_VECTOR_KERNEL __attribute__((target_clones("avx2", "default")))

STRATA_VECTOR_KERNEL void AddInto(float* __restrict sum, const float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) sum[i] += x[i];
}

STRATA_VECTOR_KERNEL void ReluForward(float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = std::max(x[i], 0.f);
}

STRATA_VECTOR_KERNEL void ReluBackward(const float* __restrict y, float* __restrict g, size_t n) {
  for (size_t i = 0; i < n; ++i) g[i] = y[i] > 0.f ? g[i] : 0.f;
}

STRATA_VECTOR_KERNEL void AddBiasRows(float* __restrict x, const float* __restrict bias,
                                      size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; ++r) {
    float* __restrict row = x + r * cols;
    for (size_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

STRATA_VECTOR_KERNEL void SumRows(const float* __restrict g, float* __restrict out, size_t rows,
                                  size_t cols) {
  std::fill(out, out + cols, 0.f);
  for (size_t r = 0; r < rows; ++r) {
    const float* __restrict row = g + r * cols;
    for (size_t c = 0; c < cols; ++c) out[c] += row[c];
  }
}

STRATA_VECTOR_KERNEL void Scale(float* __restrict x, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] *= s;
}

void FlushDenormalsToZero() {
#if defined(__SSE__)
  _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ (bit 15) | DAZ (bit 6)
#endif
}

}  // namespace strata
