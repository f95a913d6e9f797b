// Quantized-weight products for a CPU with AVX2 + FMA (tinyllm/cpu_qgemv.py builds and loads it).
//
// Contract (ops in namespace tinyllm_cpu; x fp32 (M, K), weights in tinyllm.quant's canonical
// QTensor layout, read in place, no copy):
//   qmm_int8(x, qweight int8 (N, K), scales fp32 (N,)) -> (M, N) fp32
//       y[m, n] = scales[n] * sum_k qweight[n, k] * x[m, k]
//   qmm_int4(x, qweight uint8 (N, K/2), scales (N, K/g), zeros (N, K/g)) -> (M, N) fp32; scales
//       and zeros both fp32 or both fp16 (a GGUF's Q4_0/Q4_1 are fp16 already: 20% fewer bytes)
//       w[n, k] = q[n, k] * scales[n, k/g] + zeros[n, k/g]; q[n, 2j] is the low nibble of
//       qweight[n, j], q[n, 2j+1] the high one; g = K / scales.size(1), a multiple of 32.
// As llama.cpp does, x is quantized once per product to int8 in blocks of 32 (one fp32 scale
// a block, round to nearest), and each block's dot product is integer
// (_mm256_maddubs_epi16 + _mm256_madd_epi16), scaled in fp32, so the result is the quantized
// x times the dequantized W (the int4 zero term too: the sums of the quantized x, as llama.cpp's
// Q8_1 keeps; x's exact sums would multiply the rounding by w - zero, larger than w). int8 rows
// whose K is not a multiple of 32 take the tail in fp32.
//   dequantize(qweight, scales, zeros or None) -> (N, K) fp32, w as above (for many rows of x).
// Rows of W are split over threads with at::parallel_for (torch.set_num_threads).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int QK = 32;  // activation block

struct QX {  // x quantized: M rows of nb blocks
  std::vector<int8_t> q;    // (M, nb * 32), 32-byte aligned blocks are not required (loadu)
  std::vector<float> d;     // (M, nb) block scales
  std::vector<float> sum;   // (M, nb) block sums of the quantized x, d * sum(q) (int4 zero term)
};

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Quantize nb full blocks of each row. interleave: store a block as its even elements then its
// odd ones, the order in which one 16-byte int4 block unpacks (low nibbles, then high).
QX quantize_x(const float* x, int64_t M, int64_t K, int64_t nb, bool interleave) {
  QX r;
  r.q.resize(M * nb * QK);
  r.d.resize(M * nb);
  r.sum.resize(M * nb);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * QK;
      float amax = 0.f;
      int s = 0;
      for (int i = 0; i < QK; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
      int8_t* qb = r.q.data() + (m * nb + b) * QK;
      for (int i = 0; i < QK; ++i) {
        const int j = interleave ? (i % 2) * 16 + i / 2 : i;
        qb[j] = static_cast<int8_t>(std::nearbyint(xb[i] * id));
        s += qb[j];
      }
      r.d[m * nb + b] = d;
      r.sum[m * nb + b] = d * float(s);
    }
  }
  return r;
}

// R weight rows against MT activation rows, int8 per-row weights.
template <int R, int MT>
void rows_int8(const int8_t* w, const float* sc, int64_t K, int64_t nb, const QX& qx, int64_t m0,
               const float* x, int64_t N, float* y, int64_t n0) {
  __m256 acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < MT; ++t) acc[r][t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    __m256i xv[MT];
    __m256 dv[MT];
    for (int t = 0; t < MT; ++t) {
      xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx.q.data() + ((m0 + t) * nb + b) * QK));
      dv[t] = _mm256_set1_ps(qx.d[(m0 + t) * nb + b]);
    }
    for (int r = 0; r < R; ++r) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (n0 + r) * K + b * QK));
      const __m256i aw = _mm256_sign_epi8(wv, wv);  // |w| (w is never -128)
      for (int t = 0; t < MT; ++t) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], wv)), ones);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), dv[t], acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < MT; ++t) {
      float s = hsum(acc[r][t]);
      for (int64_t k = nb * QK; k < K; ++k) s += float(w[(n0 + r) * K + k]) * x[(m0 + t) * K + k];  // tail
      y[(m0 + t) * N + n0 + r] = s * sc[n0 + r];
    }
  }
}

// R weight rows against MT activation rows, int4 in groups of bpg blocks.
inline float f32(float v) { return v; }
inline float f32(uint16_t h) { return _cvtsh_ss(h); }  // fp16 bits (F16C)

template <int R, int MT, class S>
void rows_int4(const uint8_t* w, const S* sc, const S* zr, int64_t K, int64_t nb, int64_t bpg,
               const QX& qx, int64_t m0, int64_t N, float* y, int64_t n0) {
  const int64_t ng = nb / bpg;
  __m256 acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < MT; ++t) acc[r][t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  for (int64_t g = 0, b = 0; g < ng; ++g) {
    float s[R];
    for (int r = 0; r < R; ++r) s[r] = f32(sc[(n0 + r) * ng + g]);
    for (int64_t j = 0; j < bpg; ++j, ++b) {
      __m256i xv[MT];
      float dx[MT];
      for (int t = 0; t < MT; ++t) {
        xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx.q.data() + ((m0 + t) * nb + b) * QK));
        dx[t] = qx.d[(m0 + t) * nb + b];
      }
      for (int r = 0; r < R; ++r) {
        const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + (n0 + r) * (K / 2) + b * 16));
        const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), low);  // even | odd
        for (int t = 0; t < MT; ++t) {
          const __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv[t]), ones);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(s[r] * dx[t]), acc[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    const S* z = zr + (n0 + r) * ng;
    for (int t = 0; t < MT; ++t) {
      float zs = 0.f;  // sum_g zeros[g] * sum of x over group g
      const float* xs = qx.sum.data() + (m0 + t) * nb;
      for (int64_t g = 0; g < ng; ++g) {
        float gs = 0.f;
        for (int64_t j = 0; j < bpg; ++j) gs += xs[g * bpg + j];
        zs += f32(z[g]) * gs;
      }
      y[(m0 + t) * N + n0 + r] = hsum(acc[r][t]) + zs;
    }
  }
}

struct Int8Tile {
  const int8_t* w; const float *sc, *xp; float* yp; int64_t K, nb, N; const QX& qx;
  template <int R, int MT> void run(int64_t m0, int64_t n0) const { rows_int8<R, MT>(w, sc, K, nb, qx, m0, xp, N, yp, n0); }
};

template <class S>
struct Int4Tile {
  const uint8_t* w; const S *sc, *zr; float* yp; int64_t K, nb, bpg, N; const QX& qx;
  template <int R, int MT> void run(int64_t m0, int64_t n0) const { rows_int4<R, MT>(w, sc, zr, K, nb, bpg, qx, m0, N, yp, n0); }
};

constexpr int R1 = 4;  // weight rows a step for one activation row (decode)
constexpr int RM = 2;  // weight rows a step for up to 4 activation rows (small batches, prefill)

// Runs kern.template run<R, MT>(m0, n0) over every (weight rows, activation rows) tile; threads
// split the weight rows.
template <class Kern>
void over_tiles(int64_t M, int64_t N, const Kern& kern) {
  const int64_t step = M == 1 ? R1 : RM;
  const int64_t tiles = (N + step - 1) / step;
  at::parallel_for(0, tiles, std::max<int64_t>(1, 64 / step), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t n0 = i * step, rows = std::min<int64_t>(step, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int64_t mt = std::min<int64_t>(4, M - m0);
        if (M == 1 && rows == R1) { kern.template run<R1, 1>(m0, n0); continue; }
        if (M > 1 && rows == RM) {
          switch (mt) {
            case 4: kern.template run<RM, 4>(m0, n0); break;
            case 3: kern.template run<RM, 3>(m0, n0); break;
            case 2: kern.template run<RM, 2>(m0, n0); break;
            default: kern.template run<RM, 1>(m0, n0);
          }
          continue;
        }
        for (int64_t n = n0; n < n0 + rows; ++n) {  // the last, partial tile
          switch (mt) {
            case 4: kern.template run<1, 4>(m0, n); break;
            case 3: kern.template run<1, 3>(m0, n); break;
            case 2: kern.template run<1, 2>(m0, n); break;
            default: kern.template run<1, 1>(m0, n);
          }
        }
      }
    }
  });
}

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be (M, K) with K = ", K);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "x must be fp32 on the CPU");
}

at::Tensor qmm_int8(const at::Tensor& x_, const at::Tensor& qweight, const at::Tensor& scales) {
  TORCH_CHECK(qweight.scalar_type() == at::kChar && qweight.dim() == 2 && qweight.is_contiguous(),
              "qweight must be contiguous int8 (N, K)");
  const int64_t N = qweight.size(0), K = qweight.size(1), nb = K / QK;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == N && scales.is_contiguous(),
              "scales must be contiguous fp32 (N,)");
  check_x(x_, K);
  const at::Tensor x = x_.contiguous();
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const QX qx = quantize_x(x.data_ptr<float>(), M, K, nb, false);
  const int8_t* w = qweight.data_ptr<int8_t>();
  const float *sc = scales.data_ptr<float>(), *xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  over_tiles(M, N, Int8Tile{w, sc, xp, yp, K, nb, N, qx});
  return y;
}

at::Tensor qmm_int4(const at::Tensor& x_, const at::Tensor& qweight, const at::Tensor& scales,
                    const at::Tensor& zeros) {
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.dim() == 2 && qweight.is_contiguous(),
              "qweight must be contiguous uint8 (N, K/2)");
  const int64_t N = qweight.size(0), K = 2 * qweight.size(1);
  const bool half = scales.scalar_type() == at::kHalf;
  TORCH_CHECK(scales.dim() == 2 && scales.size(0) == N && (half || scales.scalar_type() == at::kFloat) &&
              scales.is_contiguous() && zeros.sizes() == scales.sizes() &&
              zeros.scalar_type() == scales.scalar_type() && zeros.is_contiguous(),
              "scales and zeros must be contiguous fp32 or fp16 (N, K/g), of one dtype");
  const int64_t ng = scales.size(1), g = K / ng;
  TORCH_CHECK(K % ng == 0 && g % QK == 0, "int4 groups must be whole multiples of 32, got K ", K, ", ", ng, " groups");
  check_x(x_, K);
  const at::Tensor x = x_.contiguous();
  const int64_t M = x.size(0), nb = K / QK, bpg = g / QK;
  at::Tensor y = at::empty({M, N}, x.options());
  const QX qx = quantize_x(x.data_ptr<float>(), M, K, nb, true);
  const uint8_t* w = qweight.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  if (half) {
    const auto *sc = static_cast<const uint16_t*>(scales.data_ptr()), *zr = static_cast<const uint16_t*>(zeros.data_ptr());
    over_tiles(M, N, Int4Tile<uint16_t>{w, sc, zr, yp, K, nb, bpg, N, qx});
  } else {
    over_tiles(M, N, Int4Tile<float>{w, scales.data_ptr<float>(), zeros.data_ptr<float>(), yp, K, nb, bpg, N, qx});
  }
  return y;
}

// The fp32 matrix (N, K) of either form, for a product with many rows (prefill), where the
// library's fp32 GEMM beats one pass of the kernel per 4 activation rows.
at::Tensor dequantize(const at::Tensor& qweight, const at::Tensor& scales, const c10::optional<at::Tensor>& zeros) {
  const bool int4 = zeros.has_value();
  const int64_t N = qweight.size(0), K = int4 ? 2 * qweight.size(1) : qweight.size(1);
  TORCH_CHECK(qweight.is_contiguous() && scales.is_contiguous() && (!int4 || zeros->is_contiguous()),
              "dequantize takes contiguous tensors");
  const at::Tensor s = scales.to(at::kFloat), z = int4 ? zeros->to(at::kFloat) : scales;
  at::Tensor w = at::empty({N, K}, scales.options().dtype(at::kFloat));
  const int64_t ng = int4 ? s.size(1) : 1, g = K / ng;
  const float *sp = s.data_ptr<float>(), *zp = z.data_ptr<float>();
  float* wp = w.data_ptr<float>();
  const void* q = qweight.data_ptr();
  at::parallel_for(0, N, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      float* row = wp + n * K;
      if (!int4) {
        const int8_t* qr = static_cast<const int8_t*>(q) + n * K;
        for (int64_t k = 0; k < K; ++k) row[k] = float(qr[k]) * sp[n];
        continue;
      }
      const uint8_t* qr = static_cast<const uint8_t*>(q) + n * (K / 2);
      for (int64_t k = 0; k < K; k += 2) {
        const float sc = sp[n * ng + k / g], zr = zp[n * ng + k / g];
        row[k] = float(qr[k / 2] & 15) * sc + zr;
        row[k + 1] = float(qr[k / 2] >> 4) * sc + zr;
      }
    }
  });
  return w;
}

}  // namespace

TORCH_LIBRARY(tinyllm_cpu, m) {
  m.def("qmm_int8(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
  m.def("qmm_int4(Tensor x, Tensor qweight, Tensor scales, Tensor zeros) -> Tensor");
  m.def("dequantize(Tensor qweight, Tensor scales, Tensor? zeros) -> Tensor");
}

TORCH_LIBRARY_IMPL(tinyllm_cpu, CPU, m) {
  m.impl("qmm_int8", &qmm_int8);
  m.impl("qmm_int4", &qmm_int4);
  m.impl("dequantize", &dequantize);
}
