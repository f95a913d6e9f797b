// The AVX2 tiles of the quantized products: R weight rows against MT activation rows at a time,
// integer dot products of int8 blocks of 32 (_mm256_maddubs_epi16 + _mm256_madd_epi16) scaled in
// fp32, for int8 and int4 weights (cpu_kernels.h).
//
// Contract: tile_rows(w, x, M, n0, n1, y, ldy, yc0): rows [n0, n1) of W against the M quantized
// rows of x, y[m * ldy + n - yc0] = (quantized x) . (dequantized W row) (int4: the zero term from
// the sums of the quantized x, as llama.cpp's Q8_1 keeps; int8: rows whose K is not a multiple of
// 32 take the tail in fp32 from x as it is). One row of x: a row of W at a time, prefetched
// PREFETCH_BYTES ahead; more rows: tiles of RM weight rows by up to 4 activation rows.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "cpu_kernels.h"
#include "cpu_simd.h"

namespace tinyllm_cpu {
namespace {

// Block b of R int8 rows against MT activation rows, summed into acc.
template <int R, int MT>
__attribute__((always_inline)) inline void int8_block(const int8_t* const* wr, const int8_t* const* xq,
                                                      const float* const* xd, int64_t b, __m256 (&acc)[R][MT]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i xv[MT];
  __m256 dv[MT];
  for (int t = 0; t < MT; ++t) {
    xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + b * QK));
    dv[t] = _mm256_set1_ps(xd[t][b]);
  }
  for (int r = 0; r < R; ++r) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[r] + b * QK));
    const __m256i aw = _mm256_sign_epi8(wv, wv);  // |w| (w is never -128)
    for (int t = 0; t < MT; ++t) {
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], wv)), ones);
      acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dv[t], acc[r][t]);
    }
  }
}

// Rows n0..n0+R-1 of an int8 W against activation rows m0..m0+MT-1; y[m * ldy + n - yc0].
template <int R, int MT>
void tile_int8(const QW& w, const XQ& x, int64_t m0, int64_t n0, float* y, int64_t ldy, int64_t yc0) {
  const int64_t K = w.K, nb = w.nb;
  const int8_t* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = static_cast<const int8_t*>(w.q) + (n0 + r) * K;
  const int8_t* xq[MT];
  const float* xd[MT];
  for (int t = 0; t < MT; ++t) xq[t] = x.q + (m0 + t) * nb * QK, xd[t] = x.d + (m0 + t) * nb;
  // Two chains of sums, even and odd blocks: one chain waits out each fmadd's latency (4
  // cycles a block of 32 weights), which bounded a row's product below the memory's speed.
  __m256 acc[R][MT], acc2[R][MT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < MT; ++t) acc[r][t] = acc2[r][t] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    int8_block<R, MT>(wr, xq, xd, b, acc);
    int8_block<R, MT>(wr, xq, xd, b + 1, acc2);
  }
  if (b < nb) int8_block<R, MT>(wr, xq, xd, b, acc);
  const float* sc = static_cast<const float*>(w.sc);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < MT; ++t) {
      float s = hsum(_mm256_add_ps(acc[r][t], acc2[r][t]));
      const float* xr = x.x + (m0 + t) * x.ldx;
      for (int64_t k = nb * QK; k < K; ++k) s += float(wr[r][k]) * xr[k];  // tail
      y[(m0 + t) * ldy + n0 + r - yc0] = s * sc[n0 + r];
    }
  }
}

// Block b (of group g) of R int4 rows against MT activation rows, summed into acc.
template <int R, int MT, class S>
__attribute__((always_inline)) inline void int4_block(const uint8_t* w, const S* sc, int64_t K, int64_t ng, int64_t g,
                                                      int64_t b, const int8_t* xq, const float* xd, int64_t nb,
                                                      int64_t m0, int64_t n0, __m256 (&acc)[R][MT]) {
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  __m256i xv[MT];
  float dx[MT];
  for (int t = 0; t < MT; ++t) {
    xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + ((m0 + t) * nb + b) * QK));
    dx[t] = xd[(m0 + t) * nb + b];
  }
  for (int r = 0; r < R; ++r) {
    const float s = f32(sc[(n0 + r) * ng + g]);
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (n0 + r) * (K / 2) + b * 16));
    const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), low);  // even | odd
    for (int t = 0; t < MT; ++t) {
      const __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv[t]), ones);
      acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(s * dx[t]), acc[r][t]);
    }
  }
}

// The same for int4 in groups of bpg blocks, scales and zeros of type S. Written with plain
// pointer and size arguments indexed from the tile's corner: the same loop reading them from
// the QW / XQ structs measured 1.5x slower per block (2.2 against 3.3 ns, one thread).
template <int R, int MT, class S>
void tile_int4(const uint8_t* w, const S* sc, const S* zr, int64_t K, int64_t nb, int64_t bpg,
               const int8_t* xq, const float* xd, const float* xsum, int64_t m0, float* y, int64_t ldy, int64_t n0) {
  const int64_t ng = nb / bpg;
  // Two chains of sums, as in tile_int8: blocks of one group (64: bpg 2) or of two (32: bpg 1).
  __m256 acc[R][MT], acc2[R][MT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < MT; ++t) acc[r][t] = acc2[r][t] = _mm256_setzero_ps();
  if (bpg == 1) {
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
      int4_block<R, MT>(w, sc, K, ng, b, b, xq, xd, nb, m0, n0, acc);
      int4_block<R, MT>(w, sc, K, ng, b + 1, b + 1, xq, xd, nb, m0, n0, acc2);
    }
    if (b < nb) int4_block<R, MT>(w, sc, K, ng, b, b, xq, xd, nb, m0, n0, acc);
  } else if (bpg == 2) {
    for (int64_t g = 0; g < ng; ++g) {
      int4_block<R, MT>(w, sc, K, ng, g, 2 * g, xq, xd, nb, m0, n0, acc);
      int4_block<R, MT>(w, sc, K, ng, g, 2 * g + 1, xq, xd, nb, m0, n0, acc2);
    }
  } else {
    for (int64_t g = 0, b = 0; g < ng; ++g)
      for (int64_t j = 0; j < bpg; ++j, ++b) int4_block<R, MT>(w, sc, K, ng, g, b, xq, xd, nb, m0, n0, acc);
  }
  float zs[R][MT];
  zero_terms<R, MT>(zr, ng, xsum, nb, bpg, m0, n0, zs);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < MT; ++t) y[(m0 + t) * ldy + n0 + r] = hsum(_mm256_add_ps(acc[r][t], acc2[r][t])) + zs[r][t];
}

template <int R, int MT>
void tile(const QW& w, const XQ& x, int64_t m0, int64_t n0, float* y, int64_t ldy, int64_t yc0) {
  const auto* wq = static_cast<const uint8_t*>(w.q);
  if (!w.int4) tile_int8<R, MT>(w, x, m0, n0, y, ldy, yc0);
  else if (w.half)
    tile_int4<R, MT>(wq, static_cast<const uint16_t*>(w.sc), static_cast<const uint16_t*>(w.zr), w.K, w.nb, w.bpg,
                     x.q, x.d, x.s, m0, y - yc0, ldy, n0);
  else
    tile_int4<R, MT>(wq, static_cast<const float*>(w.sc), static_cast<const float*>(w.zr), w.K, w.nb, w.bpg,
                     x.q, x.d, x.s, m0, y - yc0, ldy, n0);
}

template <int R>
void tile_m(int64_t mt, const QW& w, const XQ& x, int64_t m0, int64_t n0, float* y, int64_t ldy, int64_t yc0) {
  switch (mt) {
    case 4: tile<R, 4>(w, x, m0, n0, y, ldy, yc0); break;
    case 3: tile<R, 3>(w, x, m0, n0, y, ldy, yc0); break;
    case 2: tile<R, 2>(w, x, m0, n0, y, ldy, yc0); break;
    default: tile<R, 1>(w, x, m0, n0, y, ldy, yc0);
  }
}

}  // namespace

void tile_rows(const QW& w, const XQ& x, int64_t M, int64_t n0, int64_t n1, float* y, int64_t ldy, int64_t yc0) {
  if (M == 1) {  // a row at a time: one sequential stream from DRAM (see product_rows)
    const int64_t ahead = prefetch_ahead(w);
    prefetch_rows(w, n0, std::min(n1, n0 + ahead));  // the chunk's first rows
    for (int64_t n = n0; n < n1; ++n) {
      if (n + ahead < w.N) prefetch_rows(w, n + ahead, n + ahead + 1);
      tile<1, 1>(w, x, 0, n, y, ldy, yc0);
    }
    return;
  }
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t mt = std::min<int64_t>(4, M - m0);
    int64_t n = n0;
    for (; n + RM <= n1; n += RM) tile_m<RM>(mt, w, x, m0, n, y, ldy, yc0);
    for (; n < n1; ++n) tile_m<1>(mt, w, x, m0, n, y, ldy, yc0);
  }
}

}  // namespace tinyllm_cpu
