// The fused SwiGLU feed-forward of two quantized matrices, w2(silu(gate) * up) for a few rows of
// x, as one pass over the pool (cpu_kernels.h: ffn_rows, silu_mul).
//
// Contract: ffn_rows(w13, w2, x, M, y, h, gu): y (M, D) = w2(silu(gate) * up), gate and up the
// first and second halves of x @ w13.T (each matrix int8 or int4); h (M, F) and gu (2, M, F)
// scratch. x is quantized once; then chunks of 32 hidden units compute their gate and up rows,
// silu(gate) * up and their block of the quantized hidden row (a partial last block stays fp32,
// the int8 tail); then chunks of w2's rows. The SiLU's exp is exp256 (about 1 ulp of torch's).
// silu_mul(g, u, h, n): h = silu(g) * u = g / (1 + exp(-g)) * u.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "cpu_kernels.h"
#include "cpu_simd.h"

namespace tinyllm_cpu {

// h[j] = silu(g[j]) * u[j] = g / (1 + exp(-g)) * u, for n elements.
void silu_mul(const float* g, const float* u, float* h, int64_t n) {
  int64_t j = 0;
  const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    const __m256 gv = _mm256_loadu_ps(g + j);
    const __m256 den = _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv)));
    _mm256_storeu_ps(h + j, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + j)));
  }
  for (; j < n; ++j) h[j] = g[j] / (1.f + std::exp(-g[j])) * u[j];
}

// y (M, D) = w2(silu(gate) * up) of x (M, K), gate and up the halves of x @ w13.T; gp (2, M, F)
// and hp (M, F) scratch.
void ffn_rows(const QW& w13, const QW& w2, const float* xp, int64_t M, float* yp, float* hp, float* gp) {
  const int64_t F = w2.K, D = w2.N;
  XBuf local_x, local_h;
  std::unique_lock<std::mutex> lock(g_mu, std::try_to_lock);
  const XQ xq = (lock.owns_lock() ? g_x : local_x).take(xp, w13.K, M, w13.nb);
  const XQ hx = (lock.owns_lock() ? g_h : local_h).take(hp, F, M, w2.nb);
  quantize_rows(xq, M, 0, w13.nb, w13.int4);
  // Phase 1, a chunk a block of 32 hidden units: their gate and up rows, silu(gate) * up, and
  // that block of the quantized hidden rows.
  const int64_t hb = (F + QK - 1) / QK;
  run_chunks(hb, M * w13.N * w13.nb, [&](int64_t i) {
    const int64_t lo = i * QK, hi = std::min(F, lo + QK);
    product_rows(w13, xq, M, lo, hi, gp, F, 0);
    product_rows(w13, xq, M, F + lo, F + hi, gp + M * F, F, F);
    for (int64_t m = 0; m < M; ++m) silu_mul(gp + m * F + lo, gp + (M + m) * F + lo, hp + m * F + lo, hi - lo);
    if (hi - lo == QK) quantize_rows(hx, M, i, i + 1, w2.int4);  // a partial last block stays fp32 (int8 tail)
  });
  // Phase 2: rows of w2.
  const int64_t rows = chunk_rows(w2.nb, M);
  run_chunks((D + rows - 1) / rows, M * D * std::max<int64_t>(w2.nb, 1), [&](int64_t i) {
    product_rows(w2, hx, M, i * rows, std::min(D, (i + 1) * rows), yp, D, 0);
  });
}

}  // namespace tinyllm_cpu
