// Activation quantization: rows of x to int8 blocks of 32, as llama.cpp's Q8_1 (cpu_kernels.h).
//
// Contract: quantize_rows(xq, M, b0, b1, interleave) writes blocks [b0, b1) of each of the M
// rows: q = round(x / d) to nearest even, d = max|x block| / 127 (0 for a zero block), and
// s = d * sum(q) (the int4 products' zero term needs it). interleave stores a block's even
// elements, then its odd ones: the order in which one 16-byte int4 block unpacks.
#include <immintrin.h>

#include <cstdint>

#include "cpu_kernels.h"

namespace tinyllm_cpu {
namespace {

// One block of 32 floats -> 32 int8 q = round(x / d), d = max|x| / 127; s = d * sum(q).
inline void quantize_block(const float* x, bool interleave, int8_t* q, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16),
               v3 = _mm256_loadu_ps(x + 24);
  const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
  __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float dd = _mm_cvtss_f32(m4) / 127.f, id = dd > 0.f ? 1.f / dd : 0.f;
  const __m256 mul = _mm256_set1_ps(id);
  constexpr int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), rnd));
  __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), rnd));
  __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), rnd));
  __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), rnd));
  const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  i0 = _mm256_packs_epi32(i0, i1);  // lanes: x0-3 x8-11 | x4-7 x12-15 (int16)
  i2 = _mm256_packs_epi32(i2, i3);
  i0 = _mm256_packs_epi16(i0, i2);  // 32-bit groups: x0-3 x8-11 x16-19 x24-27 | x4-7 x12-15 ...
  i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // x0..x31
  if (interleave) {
    const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    i0 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(i0, eo), 0xD8);  // evens, then odds
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), i0);
  *d = dd;
  *s = dd * float(_mm_cvtsi128_si32(s4));
}

}  // namespace

void quantize_rows(const XQ& xq, int64_t M, int64_t b0, int64_t b1, bool interleave) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = b0; b < b1; ++b)
      quantize_block(xq.x + m * xq.ldx + b * QK, interleave, xq.q + (m * xq.nb + b) * QK, xq.d + m * xq.nb + b,
                     xq.s + m * xq.nb + b);
}

}  // namespace tinyllm_cpu
