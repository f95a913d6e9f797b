// Which path the rows of a quantized product take, and the exact-x path (cpu_kernels.h).
//
// Contract:
//   product_rows(w, x, M, n0, n1, y, ldy, yc0): rows [n0, n1) of W against the M rows of x: int8
//       W with use_exact_x on takes x as it is (x.x: fp32 sums of the widened weights, AVX512
//       where use_vnni is on, else AVX2); else one row of x goes through the VNNI rows where
//       use_vnni is on (cpu_vnni.cpp), and everything else through the AVX2 tiles (cpu_tiles.cpp)
//       on x quantized to int8 blocks.
//   use_exact_x(on) -> bool: the exact-x switch (off unless TINYLLM_CPU_EXACT_X=1).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "cpu_kernels.h"
#include "cpu_simd.h"

namespace tinyllm_cpu {

namespace {

// int8 weights against x as it is (fp32, not rounded to int8 blocks): sum_k w[k] x[k], widened
// to fp32 and summed in fp32. use_exact_x(on) -> bool picks it for int8 products of up to
// PREFILL_M rows from then on, and returns the setting before (off unless TINYLLM_CPU_EXACT_X=1).
// Measured on the 2-core CPU (docs/BENCHMARKS.md): the default model's greedy
// replies identical to fp32's on 22 of 40 prompts against 21 (native step) and 18 (plain step)
// with x rounded, at 0.55-0.6x the speed of its Q8_0 step; so rounded x (llama.cpp's) stays the default.
bool exact_x_default() {
  const char* e = std::getenv("TINYLLM_CPU_EXACT_X");
  return e != nullptr && e[0] == '1';
}
std::atomic<bool> g_exact{exact_x_default()};

VNNI float int8_row_exact512(const int8_t* w, const float* x, int64_t K) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k))));
    const __m512 w1 =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k + 16))));
    a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k + 16), a1);
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  for (; k < K; ++k) s += float(w[k]) * x[k];
  return s;
}

float int8_row_exact256(const int8_t* w, const float* x, int64_t K) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k));
    a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_loadu_ps(x + k), a0);
    a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), _mm256_loadu_ps(x + k + 8), a1);
  }
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; k < K; ++k) s += float(w[k]) * x[k];
  return s;
}

// Rows [n0, n1) of an int8 W against every row of x as it is (x.x, fp32): y[m * ldy + n - yc0].
void int8_rows_exact(const QW& w, const XQ& x, int64_t M, int64_t n0, int64_t n1, float* y, int64_t ldy,
                     int64_t yc0) {
  const auto* q = static_cast<const int8_t*>(w.q);
  const auto* sc = static_cast<const float*>(w.sc);
  const bool wide = g_vnni.load(std::memory_order_relaxed);
  const int64_t ahead = (PREFETCH_BYTES + w.row_bytes - 1) / w.row_bytes;
  prefetch_rows(w, n0, std::min(n1, n0 + ahead));
  for (int64_t n = n0; n < n1; ++n) {
    if (n + ahead < w.N) prefetch_rows(w, n + ahead, n + ahead + 1);
    for (int64_t m = 0; m < M; ++m) {
      const float* xr = x.x + m * x.ldx;
      const float s = wide ? int8_row_exact512(q + n * w.K, xr, w.K) : int8_row_exact256(q + n * w.K, xr, w.K);
      y[m * ldy + n - yc0] = s * sc[n];
    }
  }
}

}  // namespace

bool use_exact_x(bool on) { return g_exact.exchange(on); }

void product_rows(const QW& w, const XQ& x, int64_t M, int64_t n0, int64_t n1, float* y, int64_t ldy,
                  int64_t yc0) {
  if (!w.int4 && g_exact.load(std::memory_order_relaxed)) return int8_rows_exact(w, x, M, n0, n1, y, ldy, yc0);
  // One row of x: a row at a time, one sequential stream from DRAM. Measured against 2 and 4 rows
  // a step over SmolLM2's 120 matrices (int4, fp16 scales, 2 threads, alternated in one
  // process): median 11.8 ms a token against 13.8 and 15.5; int8 1.6x faster than 4 rows.
  // Each row asks for the row PREFETCH_BYTES ahead (and its scales and zeros): the
  // hardware's prefetcher alone left a cold matrix's product at half the memory's speed.
  if (M == 1 && g_vnni.load(std::memory_order_relaxed) && vnni_rows(w, x, n0, n1, y, yc0, prefetch_ahead(w))) return;
  tile_rows(w, x, M, n0, n1, y, ldy, yc0);
}

}  // namespace tinyllm_cpu
