// AVX2 helpers the kernel files share (inline, plain C++ and intrinsics, no torch header).
//
// Contract (namespace tinyllm_cpu):
//   hsum(v): the sum of v's 8 floats. f32(s): a scale of fp32 or fp16 bits (uint16_t) as fp32;
//   load8(p): 8 of them. widen8(p): 8 fp32, bf16, fp16 or int8 values as fp32; widen1 one of them.
//   exp256(x): exp, about 1 ulp (Cephes' expf), for the SiLU and the softmax.
//   tanh256(x): tanh as 1 - 2 / (exp(2x) + 1), within about 1e-7 of torch's (absolute), for
//   GeGLU and the soft-caps.
//   zero_terms: the int4 zero term of a tile's rows (shared by the AVX2 tiles and the VNNI rows).
//   prefetch / prefetch_rows: cache lines of W asked for ahead of use.
//   VNNI: the target attribute of a function that runs AVX512-VNNI (only called where the CPU
//   has it: cpu_has_vnni).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu_kernels.h"

namespace tinyllm_cpu {

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float f32(float v) { return v; }
inline float f32(uint16_t h) { return _cvtsh_ss(h); }  // fp16 bits (F16C)

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Eight 16-bit floats widened to fp32: bf16 is fp32's top half; fp16 through F16C.
inline __m256 widen8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 widen8(const float* p) { return _mm256_loadu_ps(p); }  // (attention's fp32 rows)
inline __m256 widen8(const int8_t* p) {  // (the attention's int8 cache: its scales apply apart)
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 widen8(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline float widen1(float v) { return v; }
inline float widen1(bf16 v) {
  const uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float widen1(f16 v) { return _cvtsh_ss(v.x); }

// exp for the SiLU: Cody-Waite range reduction and a degree-6 polynomial (Cephes' expf), about
// 1 ulp; inputs clamped to [-88, 88].
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.f)), _mm256_set1_ps(88.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500E-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// tanh(x) = 1 - 2 / (exp(2x) + 1): exp256's clamp makes it exactly +-1 far out.
inline __m256 tanh256(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 e = exp256(_mm256_add_ps(x, x));
  return _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.f), _mm256_add_ps(e, one)));
}

// zs[r][t] = sum_g zeros[n0 + r, g] * (the sum of x row m0 + t over group g; xsum holds each
// block's sum), for a tile's R rows at once. Vectorized over groups of one block (every GGUF
// type, and tinyllm's default), the rows' chains side by side: as one scalar loop a row, its
// dependent adds cost as much as the row's products (int4 5-6 ns a block, now 2.4).
template <int R, int MT, class S>
__attribute__((always_inline)) inline void zero_terms(const S* zr, int64_t ng, const float* xsum, int64_t nb,
                                                      int64_t bpg, int64_t m0, int64_t n0, float zs[R][MT]) {
  int64_t g = 0;
  __m256 acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < MT; ++t) acc[r][t] = _mm256_setzero_ps();
  if (bpg == 1)
    for (; g + 8 <= ng; g += 8) {
      __m256 xv[MT];
      for (int t = 0; t < MT; ++t) xv[t] = _mm256_loadu_ps(xsum + (m0 + t) * nb + g);
      for (int r = 0; r < R; ++r) {
        const __m256 zv = load8(zr + (n0 + r) * ng + g);
        for (int t = 0; t < MT; ++t) acc[r][t] = _mm256_fmadd_ps(zv, xv[t], acc[r][t]);
      }
    }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < MT; ++t) zs[r][t] = hsum(acc[r][t]);
  for (; g < ng; ++g)
    for (int t = 0; t < MT; ++t) {
      float gs = 0.f;
      for (int64_t j = 0; j < bpg; ++j) gs += xsum[(m0 + t) * nb + g * bpg + j];
      for (int r = 0; r < R; ++r) zs[r][t] += f32(zr[(n0 + r) * ng + g]) * gs;
    }
}

// Software prefetch distance of a one-row product (M = 1), in weight bytes. Measured on the
// 2-core AVX512 Xeon (the product of a matrix cycled with copies over 100 MB, 2 threads):
// int8 49152 x 576 18.8 -> 36.5 GB/s (2,048 and 8,192 bytes alike), int4 3072 x 576 10.6 -> 17.3.
constexpr int64_t PREFETCH_BYTES = 4096;

// One cache line asked for into L1. Written as asm: GCC 12 deleted these loops written with
// _mm_prefetch as if they did nothing (read off the assembly; the build measured no change).
inline void prefetch(const char* p) { asm volatile("prefetcht0 (%0)" : : "r"(p)); }

// Rows [n0, n1) of W (and their scales and zeros) asked for ahead of use.
inline void prefetch_rows(const QW& w, int64_t n0, int64_t n1) {
  const char* q = static_cast<const char*>(w.q);
  for (const char *p = q + n0 * w.row_bytes, *e = q + n1 * w.row_bytes; p < e; p += 64) prefetch(p);
  if (w.int4) {
    const int64_t sb = (w.half ? 2 : 4) * w.ng;  // scale (and zero) bytes a row
    for (int64_t o = n0 * sb; o < n1 * sb; o += 64) {
      prefetch(static_cast<const char*>(w.sc) + o);
      prefetch(static_cast<const char*>(w.zr) + o);
    }
  }
}

// Rows ahead of the one in work that a one-row product prefetches.
inline int64_t prefetch_ahead(const QW& w) { return (PREFETCH_BYTES + w.row_bytes - 1) / w.row_bytes; }

}  // namespace tinyllm_cpu
