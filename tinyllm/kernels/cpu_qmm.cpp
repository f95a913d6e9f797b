// Quantized products of a few rows of x: one matrix (qmm_rows), and the fused SwiGLU
// feed-forward of two (ffn_rows), each x quantized once, then chunks on the pool (cpu_kernels.h).
//
// Contract:
//   qmm_rows(w, x, M, y): y (M, N) = x (M, K) W^T, chunks of rows of W.
//   ffn_rows(w13, w2, x, M, y, h, gu): y (M, D) = w2(silu(gate) * up), gate and up the first and
//       second halves of x @ w13.T (each matrix int8 or int4); h (M, F) and gu (2, M, F)
//       scratch. Chunks of 32 hidden units compute their gate and up rows, silu(gate) * up and
//       their block of the quantized hidden row (a partial last block stays fp32: the int8
//       tail); then chunks of w2's rows. The SiLU's exp is exp256 (about 1 ulp of torch's).
//   silu_mul(g, u, h, n): h = silu(g) * u = g / (1 + exp(-g)) * u.
//   gelu_tanh_mul(g, u, h, n): h = gelu_tanh(g) * u (GeGLU); soft_cap(x, n, cap): cap * tanh(x / cap).
// The quantized rows go into this file's buffers (g_x, g_h) for one caller at a time; a
// concurrent caller allocates its own.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "cpu_kernels.h"
#include "cpu_simd.h"

namespace tinyllm_cpu {
namespace {

// A buffer for quantized activations.
struct XBuf {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  XQ take(const float* x, int64_t ldx, int64_t M, int64_t nb) {
    if (static_cast<int64_t>(q.size()) < M * nb * QK) q.resize(M * nb * QK);
    if (static_cast<int64_t>(d.size()) < M * nb) d.resize(M * nb), s.resize(M * nb);
    return XQ{x, ldx, q.data(), d.data(), s.data(), nb};
  }
};

XBuf g_x, g_h;  // the quantized x and hidden rows of the running product (one caller at a time)
std::mutex g_mu;

}  // namespace

// y (M, N) = x (M, K) times W's transpose, x and y contiguous.
void qmm_rows(const QW& w, const float* xp, int64_t M, float* yp) {
  const int64_t N = w.N;
  XBuf local;
  std::unique_lock<std::mutex> lock(g_mu, std::try_to_lock);  // another caller: buffers of its own
  XBuf& buf = lock.owns_lock() ? g_x : local;
  const XQ xq = buf.take(xp, w.K, M, w.nb);
  quantize_rows(xq, M, 0, w.nb, w.int4);
  const int64_t rows = chunk_rows(w.nb, M);
  run_chunks((N + rows - 1) / rows, M * N * std::max<int64_t>(w.nb, 1), [&](int64_t i) {
    product_rows(w, xq, M, i * rows, std::min(N, (i + 1) * rows), yp, N, 0);
  });
}

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

// h[j] = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u: F.gelu(g, approximate="tanh") * u.
void gelu_tanh_mul(const float* g, const float* u, float* h, int64_t n) {
  constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;
  int64_t j = 0;
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.f), beta = _mm256_set1_ps(kBeta),
               kappa = _mm256_set1_ps(kKappa);
  for (; j + 8 <= n; j += 8) {
    const __m256 gv = _mm256_loadu_ps(g + j);
    const __m256 inner = _mm256_mul_ps(beta, _mm256_fmadd_ps(_mm256_mul_ps(kappa, gv), _mm256_mul_ps(gv, gv), gv));
    const __m256 t = _mm256_add_ps(one, tanh256(inner));
    _mm256_storeu_ps(h + j, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, gv), t), _mm256_loadu_ps(u + j)));
  }
  for (; j < n; ++j) h[j] = 0.5f * g[j] * (1.f + std::tanh(kBeta * (g[j] + kKappa * g[j] * g[j] * g[j]))) * u[j];
}

// x[j] = cap * tanh(x[j] / cap), in place.
void soft_cap(float* x, int64_t n, float cap) {
  int64_t j = 0;
  const __m256 c = _mm256_set1_ps(cap);
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(tanh256(_mm256_div_ps(_mm256_loadu_ps(x + j), c)), c));
  for (; j < n; ++j) x[j] = cap * std::tanh(x[j] / cap);
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
