// The product of fp32 rows x and a matrix held at 16 bits (bf16, fp16) or fp32, in fp32: the
// compiled CPU step's product for such matrices (op mm_half) and the native step's dense ones
// (cpu_kernels.h: half_product).
//
// Contract: half_product(w (N, K), x (M, K), M, K, N, y (M, N)): y = x w^T, w widened to fp32,
// x not rounded, fp32 products and sums (only their order differs from x @ w.float().T); chunks
// of rows of w on the pool, every row of x against a row of w while it is in L1 (M small).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu_kernels.h"
#include "cpu_simd.h"

namespace tinyllm_cpu {
namespace {

// y[m, n] = x[m] . w[n] for rows n0..n1 of w, every row of x (M small: a row of w stays in L1).
template <class H>
void half_rows(const H* w, const float* x, int64_t M, int64_t K, int64_t n0, int64_t n1, float* y, int64_t N) {
  for (int64_t n = n0; n < n1; ++n) {
    const H* wr = w + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x + m * K;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      int64_t k = 0;
      for (; k + 32 <= K; k += 32) {
        a0 = _mm256_fmadd_ps(widen8(wr + k), _mm256_loadu_ps(xr + k), a0);
        a1 = _mm256_fmadd_ps(widen8(wr + k + 8), _mm256_loadu_ps(xr + k + 8), a1);
        a2 = _mm256_fmadd_ps(widen8(wr + k + 16), _mm256_loadu_ps(xr + k + 16), a2);
        a3 = _mm256_fmadd_ps(widen8(wr + k + 24), _mm256_loadu_ps(xr + k + 24), a3);
      }
      for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(widen8(wr + k), _mm256_loadu_ps(xr + k), a0);
      float acc = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
      for (; k < K; ++k) acc += widen1(wr[k]) * xr[k];
      y[m * N + n] = acc;
    }
  }
}

template <class H>
void product(const H* w, const float* x, int64_t M, int64_t K, int64_t N, float* y) {
  const int64_t nb = (K + QK - 1) / QK, rows = chunk_rows(nb, M);
  run_chunks((N + rows - 1) / rows, M * N * nb, [&](int64_t i) {
    const int64_t lo = i * rows, hi = std::min(N, lo + rows);
    half_rows(w, x, M, K, lo, hi, y, N);
  });
}

}  // namespace

void half_product(const float* w, const float* x, int64_t M, int64_t K, int64_t N, float* y) {
  product(w, x, M, K, N, y);
}
void half_product(const bf16* w, const float* x, int64_t M, int64_t K, int64_t N, float* y) {
  product(w, x, M, K, N, y);
}
void half_product(const f16* w, const float* x, int64_t M, int64_t K, int64_t N, float* y) {
  product(w, x, M, K, N, y);
}

}  // namespace tinyllm_cpu
