// The one-row quantized products (M = 1, decode) with AVX512-VNNI, where the CPU has it: two
// blocks of 32 an instruction (512 bits), integer dot products by vpdpbusd, two chains of sums a
// row (cpu_kernels.h).
//
// Contract: vnni_rows(w, x, n0, n1, y, yc0, ahead): rows [n0, n1) of W against the one quantized
// row of x, y[n - yc0], the same sums as the AVX2 tiles (cpu_tiles.cpp) up to fp32 rounding; a
// row at a time, `ahead` rows prefetched ahead. Returns false, doing nothing, for int4 groups of
// more than 2 blocks (the tiles take those). Call it only where cpu_has_vnni(); use_vnni(on)
// picks it for the products that start after (g_vnni; TINYLLM_CPU_VNNI=0: never).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu_kernels.h"
#include "cpu_simd.h"

namespace tinyllm_cpu {
namespace {

// [xd[b] x8 | xd[b + 1] x8] times [s[0] x8 | s[1] x8]: two blocks' scales for their 16 sums.
VNNI inline __m512 pair_scales(const float* xd, __m128 s) {
  const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m128 sd = _mm_mul_ps(s, _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xd))));
  return _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(sd));
}

// Blocks b and b + 1 of an int8 row, into acc. vpdpbusd multiplies unsigned by signed bytes,
// so the weights go in as u = w + 128 (w ^ 0x80); int8_row_vnni takes the 128s off.
VNNI __attribute__((always_inline)) inline void int8_pair_vnni(const int8_t* w, const int8_t* xq, const float* xd,
                                                               int64_t b, __m512& acc) {
  const __m512i u = _mm512_xor_si512(_mm512_loadu_si512(w + b * QK), _mm512_set1_epi8(static_cast<char>(0x80)));
  const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(xq + b * QK));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), pair_scales(xd + b, _mm_set1_ps(1.f)), acc);
}

// One int8 row (nb blocks) against one activation row: sum over blocks b of xd[b] * (w . xq)_b,
// before the row's scale and fp32 tail, given sx = sum_b xs[b] (xs[b] = xd[b] times the
// block's sum of xq, which quantize_block keeps): sum (u - 128) xq = sum u xq - 128 sum xq.
VNNI float int8_row_vnni(const int8_t* w, const int8_t* xq, const float* xd, float sx, int64_t nb) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    int8_pair_vnni(w, xq, xd, b, acc0);
    int8_pair_vnni(w, xq, xd, b + 2, acc1);
  }
  if (b + 2 <= nb) int8_pair_vnni(w, xq, xd, b, acc0), b += 2;
  float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  if (b < nb) {  // one block left
    const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * QK)),
                                       _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u,
                                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * QK)));
    s += xd[b] * hsum(_mm256_cvtepi32_ps(p));
  }
  return s - 128.f * sx;
}

// Scales of two consecutive blocks, [p[0], p[1], -, -].
VNNI inline __m128 two_scales(const float* p) { return _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p))); }
VNNI inline __m128 two_scales(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

// Blocks b and b + 1 of an int4 row (groups of one block, or of two: bpg), into acc.
template <class S>
VNNI __attribute__((always_inline)) inline void int4_pair_vnni(const uint8_t* w, const S* sc, int64_t bpg,
                                                               const int8_t* xq, const float* xd, int64_t b,
                                                               __m512& acc) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * 16));  // 2 blocks' nibbles
  const __m256i lo = _mm256_and_si256(p, low), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
  __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);  // 16-byte lanes: lo_b lo_b1 hi_b hi_b1
  q = _mm512_shuffle_i64x2(q, q, 0xD8);  // lo_b hi_b lo_b1 hi_b1: as xq interleaves a block (evens, odds)
  const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(xq + b * QK));
  const __m128 s = bpg == 1 ? two_scales(sc + b) : _mm_set1_ps(f32(sc[b / 2]));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), pair_scales(xd + b, s), acc);
}

// One int4 row (nb blocks, groups of bpg = 1 or 2 blocks, scales S) against one activation row
// with AVX512-VNNI: sum over blocks of s * xd[b] * (q . xq)_b, without the zero term. The
// nibbles are unsigned, as vpdpbusd wants them.
template <class S>
VNNI float int4_row_vnni(const uint8_t* w, const S* sc, int64_t nb, int64_t bpg, const int8_t* xq, const float* xd) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    int4_pair_vnni(w, sc, bpg, xq, xd, b, acc0);
    int4_pair_vnni(w, sc, bpg, xq, xd, b + 2, acc1);
  }
  if (b + 2 <= nb) int4_pair_vnni(w, sc, bpg, xq, xd, b, acc0), b += 2;
  float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  if (b < nb) {  // one block left (bpg 1)
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + b * 16));
    const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0F));
    const __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q,
                                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * QK)));
    s += f32(sc[b / bpg]) * xd[b] * hsum(_mm256_cvtepi32_ps(d));
  }
  return s;
}

// Rows [n0, n1) of an int8 W against one row of x with int8_row_vnni, a row at a time as
// product_rows does (4 rows a step measured 1.5x faster in cache, but slower from memory);
// y[n - yc0].
VNNI void int8_product_vnni(const QW& w, const XQ& x, int64_t n0, int64_t n1, float* y, int64_t yc0,
                            int64_t ahead) {
  const int64_t K = w.K, nb = w.nb;
  const auto* q = static_cast<const int8_t*>(w.q);
  const auto* sc = static_cast<const float*>(w.sc);
  float sx = 0.f;
  for (int64_t j = 0; j < nb; ++j) sx += x.s[j];
  prefetch_rows(w, n0, std::min(n1, n0 + ahead));
  for (int64_t n = n0; n < n1; ++n) {
    if (n + ahead < w.N) prefetch_rows(w, n + ahead, n + ahead + 1);
    float s = int8_row_vnni(q + n * K, x.q, x.d, sx, nb);
    for (int64_t k = nb * QK; k < K; ++k) s += float(q[n * K + k]) * x.x[k];  // tail
    y[n - yc0] = s * sc[n];
  }
}

// Rows [n0, n1) of an int4 W (groups of 1 or 2 blocks) against one row of x with
// int4_row_vnni, a row at a time as product_rows does; y[n - yc0].
template <class S>
VNNI void int4_product_vnni(const QW& w, const S* sc, const S* zr, const XQ& x, int64_t n0, int64_t n1, float* y,
                            int64_t yc0, int64_t ahead) {
  const auto* q = static_cast<const uint8_t*>(w.q);
  prefetch_rows(w, n0, std::min(n1, n0 + ahead));
  for (int64_t n = n0; n < n1; ++n) {
    if (n + ahead < w.N) prefetch_rows(w, n + ahead, n + ahead + 1);
    float zs[1][1];
    zero_terms<1, 1>(zr, w.ng, x.s, w.nb, w.bpg, 0, n, zs);
    y[n - yc0] = int4_row_vnni(q + n * (w.K / 2), sc + n * w.ng, w.nb, w.bpg, x.q, x.d) + zs[0][0];
  }
}

}  // namespace

bool cpu_has_vnni() {
  if (const char* e = std::getenv("TINYLLM_CPU_VNNI"); e && e[0] == '0') return false;  // to measure, and test
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
std::atomic<bool> g_vnni{cpu_has_vnni()};

// The use_vnni op: one-row products through int8_row_vnni / int4_row_vnni (on, where the CPU has
// it) or the AVX2 tiles (off), for the products that start after it; returns the setting
// before. Tests compare the two paths in one process.
bool use_vnni(bool on) { return g_vnni.exchange(on && cpu_has_vnni()); }

bool vnni_rows(const QW& w, const XQ& x, int64_t n0, int64_t n1, float* y, int64_t yc0, int64_t ahead) {
  if (!w.int4) return int8_product_vnni(w, x, n0, n1, y, yc0, ahead), true;
  if (w.bpg <= 2 && w.half)
    return int4_product_vnni(w, static_cast<const uint16_t*>(w.sc), static_cast<const uint16_t*>(w.zr), x, n0, n1, y,
                             yc0, ahead), true;
  if (w.bpg <= 2)
    return int4_product_vnni(w, static_cast<const float*>(w.sc), static_cast<const float*>(w.zr), x, n0, n1, y, yc0,
                             ahead), true;
  return false;
}

}  // namespace tinyllm_cpu
