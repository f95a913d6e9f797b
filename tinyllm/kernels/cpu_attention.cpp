// Decode attention on the CPU: one decode position over a window of W keys (cpu_kernels.h:
// attend_units; ops.window_attention is its slow twin).
//
// Contract: attend_units(a, B, y): units of (b, h, ATTN_CHUNK keys) run on the pool; each keeps
// its keys that the mask lets through, their scores, its rows' max and sum of exp, and the
// exp-weighted sum of those keys' values; the units of a head are merged at the end into y
// (B, Hkv, R, D). Masked keys are never read; a row with no key gets 0. Where a.cap > 0 the
// scores (scaled) are soft-capped, cap * tanh(s / cap), before the softmax (Gemma 2). q, k, v fp32 or bf16
// (q of one dtype, k and v of one, the same or fp32 q over bf16 k and v: the native step's
// compact cache; bf16 widened as it is loaded, k and v through their strides), or fp32 q over
// int8 k and v with an fp32 scale a key (widened as loaded; a key's k scale multiplies its score,
// its v scale its softmax weight after the sum of exp; keys and values asked for ahead); scores, softmax
// and sums fp32, the result rounded once to q's dtype. R <= ATTN_MAX_R, D a multiple of 8 up to
// ATTN_MAX_D (the caller checks).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu_kernels.h"
#include "cpu_simd.h"

namespace tinyllm_cpu {
namespace {

// [sum(s[0]), ..., sum(s[7])]: eight vectors summed at once (three rounds of hadd).
inline __m256 hsum8(const __m256* s) {
  const __m256 ab = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));  // s0..s3 | s0..s3
  const __m256 cd = _mm256_hadd_ps(_mm256_hadd_ps(s[4], s[5]), _mm256_hadd_ps(s[6], s[7]));  // s4..s7 | s4..s7
  return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20), _mm256_permute2f128_ps(ab, cd, 0x31));
}

// acc[r0 + r, :] = sum_i p[r0 + r][i] v[idx[i], :] for RT query rows, W8 vectors of 8 dims at
// a time, the sums in registers (each value row read once a pass, from the cache after the first).
template <int RT, int W8, class T>
void weigh_values(const T* vbase, int64_t vw, const int32_t* idx, int64_t n, const float (*p)[ATTN_CHUNK],
                  int64_t r0, int64_t D, int64_t d, float* acc) {
  __m256 s[RT][W8];
  for (int r = 0; r < RT; ++r)
    for (int w = 0; w < W8; ++w) s[r][w] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const T* vj = vbase + idx[i] * vw + d;
    __m256 vv[W8];
    for (int w = 0; w < W8; ++w) vv[w] = widen8(vj + 8 * w);
    for (int r = 0; r < RT; ++r) {
      const __m256 pr = _mm256_set1_ps(p[r0 + r][i]);
      for (int w = 0; w < W8; ++w) s[r][w] = _mm256_fmadd_ps(pr, vv[w], s[r][w]);
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int w = 0; w < W8; ++w) _mm256_storeu_ps(acc + (r0 + r) * D + d + 8 * w, s[r][w]);
}

template <int RT, class T>
void weigh_rows(const T* vbase, int64_t vw, const int32_t* idx, int64_t n, const float (*p)[ATTN_CHUNK], int64_t r0,
                int64_t D, float* acc) {
  int64_t d = 0;
  for (; d + 16 <= D; d += 16) weigh_values<RT, 2>(vbase, vw, idx, n, p, r0, D, d, acc);
  if (d < D) weigh_values<RT, 1>(vbase, vw, idx, n, p, r0, D, d, acc);  // D is a multiple of 8
}

// sc[r0 + r][i..i+3] = (query row r0 + r) . (4 int8 keys kj), times ks (4), for RT rows at
// once: each key's 8 dims are widened once for all RT rows (widening is as much work as the
// products; the 8-keys-a-row loop below widens every key once a row).
template <int RT>
void score_rows(const float* q, int64_t D, const int8_t* const* kj, __m128 ks, int64_t r0,
                float (*sc)[ATTN_CHUNK], int64_t i) {
  __m256 s[RT][4];
  for (int r = 0; r < RT; ++r)
    for (int t = 0; t < 4; ++t) s[r][t] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8)
    for (int t = 0; t < 4; ++t) {
      const __m256 kv = widen8(kj[t] + d);
      for (int r = 0; r < RT; ++r) s[r][t] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (r0 + r) * D + d), kv, s[r][t]);
    }
  for (int r = 0; r < RT; ++r) {  // [sum(s[r][0]), ..., sum(s[r][3])]
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s[r][0], s[r][1]), _mm256_hadd_ps(s[r][2], s[r][3]));
    _mm_storeu_ps(sc[r0 + r] + i, _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)), ks));
  }
}

// Unit u = ((b * Hkv + h) * chunks + c). Measured on the 2-core AVX512 Xeon with SmolLM2's
// heads (R 3, D 64, fp32; scripts/cpu_attention_bench.py), a call with one key and one row at a
// time (a horizontal sum a score, the value sums loaded and stored each key) against as written
// now: 900 keys of 1,024 at 2 threads 65.4 -> 33-38 us, at 1 thread 81.4 -> 55-70; 200 of 256
// at 1 thread 19.2 -> 12-15.
template <class Q, class T>
void attend_chunk(const AttnArgs<Q, T>& a, int64_t u) {
  constexpr bool I8 = std::is_same_v<T, int8_t>;  // scales a key: ksc, vsc (else unread)
  const int64_t c = u % a.chunks, bh = u / a.chunks, b = bh / a.Hkv, h = bh % a.Hkv, R = a.R, D = a.D;
  const int64_t j0 = c * ATTN_CHUNK, j1 = std::min(a.W, j0 + ATTN_CHUNK);
  const T* kbase = a.k + b * a.kb + h * a.kh;
  const T* vbase = a.v + b * a.vb + h * a.vh;
  const float* ksc = I8 ? a.ks + b * a.ksb + h * a.ksh : nullptr;
  const float* vsc = I8 ? a.vs + b * a.vsb + h * a.vsh : nullptr;
  const bool* mask = a.mask + b * a.mb;
  float q[ATTN_MAX_R * ATTN_MAX_D];  // the head's R query rows, fp32
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(q + r * D + d, widen8(a.q + b * a.qb + h * a.qh + r * D + d));
  int32_t idx[ATTN_CHUNK];
  float sc[ATTN_MAX_R][ATTN_CHUNK];
  int64_t n = 0;
  for (int64_t j = j0; j < j1; ++j)
    if (mask[j * a.mw]) idx[n++] = static_cast<int32_t>(j);
  float* m = a.m + u * R;
  float* l = a.l + u * R;
  float* acc = a.acc + u * R * D;
  std::fill(acc, acc + R * D, 0.f);
  for (int64_t r = 0; r < R; ++r) m[r] = -INFINITY, l[r] = 0.f;
  if (n == 0) return;
  const __m256 scale = _mm256_set1_ps(a.scale);
  int64_t i = 0;
  if constexpr (I8) {
    for (; i + 4 <= n; i += 4) {  // scores of 4 keys, up to 3 rows at once (score_rows)
      const int8_t* kj[4];
      float s4[4];
      for (int t = 0; t < 4; ++t) kj[t] = kbase + idx[i + t] * a.kw, s4[t] = ksc[idx[i + t]];
      // Keys PREFETCH_BYTES on, and the values the pass below reads: the default model's late /
      // early ratio 0.63 -> 0.70-0.73 (docs/BENCHMARKS.md); keys 8 KB on, each chunk's first
      // keys at once, or the scales' lines too measured no better.
      for (int t = 0; t < 4; ++t)
        for (int64_t o = 0; o < D; o += 64) {
          prefetch(reinterpret_cast<const char*>(kj[t]) + PREFETCH_BYTES + o);
          prefetch(reinterpret_cast<const char*>(vbase + idx[i + t] * a.vw) + o);
        }
      const __m128 ks = _mm_mul_ps(_mm_loadu_ps(s4), _mm256_castps256_ps128(scale));  // each key's scale, times a.scale
      for (int64_t r0 = 0; r0 < R; r0 += 3) {
        switch (std::min<int64_t>(3, R - r0)) {
          case 3: score_rows<3>(q, D, kj, ks, r0, sc, i); break;
          case 2: score_rows<2>(q, D, kj, ks, r0, sc, i); break;
          default: score_rows<1>(q, D, kj, ks, r0, sc, i);
        }
      }
    }
  } else {
    for (; i + 8 <= n; i += 8) {  // scores of 8 keys a row at once, summed together (hsum8)
      const T* kj[8];
      for (int t = 0; t < 8; ++t) kj[t] = kbase + idx[i + t] * a.kw;
      for (int64_t r = 0; r < R; ++r) {
        const float* qr = q + r * D;
        __m256 s[8];
        for (int t = 0; t < 8; ++t) s[t] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
          const __m256 qv = _mm256_loadu_ps(qr + d);
          for (int t = 0; t < 8; ++t) s[t] = _mm256_fmadd_ps(qv, widen8(kj[t] + d), s[t]);
        }
        _mm256_storeu_ps(sc[r] + i, _mm256_mul_ps(hsum8(s), scale));
      }
    }
  }
  for (; i < n; ++i) {  // the last keys, one at a time
    const T* kj = kbase + idx[i] * a.kw;
    const float kscale = I8 ? ksc[idx[i]] * a.scale : a.scale;
    for (int64_t r = 0; r < R; ++r) {
      __m256 s0 = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * D + d), widen8(kj + d), s0);
      sc[r][i] = hsum(s0) * kscale;
    }
  }
  if (a.cap > 0.f)
    for (int64_t r = 0; r < R; ++r) soft_cap(sc[r], n, a.cap);
  for (int64_t r = 0; r < R; ++r) {  // exp(s - max) and their sum
    float mr = -INFINITY;
    for (int64_t t = 0; t < n; ++t) mr = std::max(mr, sc[r][t]);
    m[r] = mr;
    const __m256 mv = _mm256_set1_ps(mr);
    __m256 lv = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sc[r] + t), mv));
      _mm256_storeu_ps(sc[r] + t, e);
      lv = _mm256_add_ps(lv, e);
    }
    float lr = hsum(lv);
    for (; t < n; ++t) lr += (sc[r][t] = std::exp(sc[r][t] - mr));
    l[r] = lr;
  }
  if constexpr (I8) {  // each weight times its value's scale: the sums below are then of scaled values
    float vs[ATTN_CHUNK];
    for (int64_t t = 0; t < n; ++t) vs[t] = vsc[idx[t]];
    for (int64_t r = 0; r < R; ++r)
      for (int64_t t = 0; t < n; ++t) sc[r][t] *= vs[t];
  }
  for (int64_t r0 = 0; r0 < R; r0 += 4) {  // the weighted sums of the values, up to 4 rows a pass
    switch (std::min<int64_t>(4, R - r0)) {
      case 4: weigh_rows<4>(vbase, a.vw, idx, n, sc, r0, D, acc); break;
      case 3: weigh_rows<3>(vbase, a.vw, idx, n, sc, r0, D, acc); break;
      case 2: weigh_rows<2>(vbase, a.vw, idx, n, sc, r0, D, acc); break;
      default: weigh_rows<1>(vbase, a.vw, idx, n, sc, r0, D, acc);
    }
  }
}

// Runs a's units on the pool and merges each head's chunks into y (B, Hkv, R, D); a.m, a.l and
// a.acc hold units * R, units * R and units * R * D floats.
template <class Q, class T>
void attend_all(const AttnArgs<Q, T>& a, int64_t B, Q* yp) {
  const int64_t Hkv = a.Hkv, R = a.R, D = a.D, chunks = a.chunks, units = B * Hkv * chunks;
  run_chunks(units, B * Hkv * a.W * R * D / 16, [&](int64_t u) { attend_chunk(a, u); });  // (a block: 16 products)
  float out[ATTN_MAX_D];
  for (int64_t bh = 0; bh < B * Hkv; ++bh)  // merge each head's chunks
    for (int64_t r = 0; r < R; ++r) {
      float M = -INFINITY, L = 0.f;
      for (int64_t c = 0; c < chunks; ++c) M = std::max(M, a.m[(bh * chunks + c) * R + r]);
      std::fill(out, out + D, 0.f);
      for (int64_t c = 0; M != -INFINITY && c < chunks; ++c) {  // no key to attend: 0
        const int64_t u = bh * chunks + c;
        if (a.m[u * R + r] == -INFINITY) continue;
        const float w = std::exp(a.m[u * R + r] - M);
        L += w * a.l[u * R + r];
        const float* acc = a.acc + (u * R + r) * D;
        for (int64_t d = 0; d < D; ++d) out[d] += w * acc[d];
      }
      Q* yr = yp + (bh * R + r) * D;
      for (int64_t d = 0; d < D; ++d) yr[d] = static_cast<Q>(L > 0.f ? out[d] / L : 0.f);
    }
}

}  // namespace

void attend_units(const AttnArgs<float>& a, int64_t B, float* y) { attend_all(a, B, y); }
void attend_units(const AttnArgs<bf16>& a, int64_t B, bf16* y) { attend_all(a, B, y); }
void attend_units(const AttnArgs<float, bf16>& a, int64_t B, float* y) { attend_all(a, B, y); }
void attend_units(const AttnArgs<float, int8_t>& a, int64_t B, float* y) { attend_all(a, B, y); }

}  // namespace tinyllm_cpu
