// Quantized-weight products and decode attention for a CPU with AVX2 + FMA, and AVX512-VNNI where
// it has it (tinyllm/cpu_qgemv.py builds and loads it).
//
// Contract (ops in namespace tinyllm_cpu; x fp32 (M, K), weights in tinyllm.quant's canonical
// QTensor layout, read in place, no copy):
//   qmm_int8(x, qweight int8 (N, K), scales fp32 (N,)) -> (M, N) fp32
//       y[m, n] = scales[n] * sum_k qweight[n, k] * x[m, k]
//   qmm_int4(x, qweight uint8 (N, K/2), scales (N, K/g), zeros (N, K/g)) -> (M, N) fp32; scales
//       and zeros both fp32 or both fp16 (a GGUF's Q4_0/Q4_1 are fp16 already: 20% fewer bytes)
//       w[n, k] = q[n, k] * scales[n, k/g] + zeros[n, k/g]; q[n, 2j] is the low nibble of
//       qweight[n, j], q[n, 2j+1] the high one; g = K / scales.size(1), a multiple of 32.
//   qmm_ffn(x, w13 (qweight, scales, zeros or None), w2 (qweight, scales, zeros or None))
//       -> (M, D) fp32: the SwiGLU feed-forward w2(silu(gate) * up), gate and up the first and
//       second halves of x @ w13.T (each matrix int8 or int4 as above, by its qweight's dtype),
//       as one op: chunks of 32 hidden units compute their gate and up rows, silu(gate) * up
//       and their block of the quantized hidden row; then chunks of w2's rows.
// As llama.cpp does, x (and the FFN's hidden row) is quantized to int8 in blocks of 32 (one fp32
// scale a block, round to nearest even), and each block's dot product is integer
// (_mm256_maddubs_epi16 + _mm256_madd_epi16), scaled in fp32, so the result is the quantized x
// times the dequantized W (the int4 zero term too: the sums of the quantized x, as llama.cpp's
// Q8_1 keeps; x's exact sums would multiply the rounding by w - zero, larger than w). int8 rows
// whose K is not a multiple of 32 take the tail in fp32.
//   dequantize(qweight, scales, zeros or None) -> (N, K) fp32, w as above (for many rows of x).
//   mm_half(x, w bf16 or fp16 (N, K)) -> (M, N) fp32: x times the widened w, fp32 products and
//       sums (no rounding of x; only the order of the sums differs from x @ w.float().T).
//   decode_attention(q (B, Hkv, R, D), k, v (B, Hkv, W, D), mask bool (B or 1, 1, 1, W), scale)
//       -> (B, Hkv, R, D): model.window_attention for one decode position, fp32 or bf16, k and v
//       read through their strides, masked keys never read, a row with no key 0 (see below).
// use_exact_x(on) -> bool: int8 products of up to PREFILL_M - 1 rows take x as it is (fp32 sums of
// the widened weights, no rounding of x) from then on; returns the setting before (off unless
// TINYLLM_CPU_EXACT_X=1).
// One-row products (M = 1, decode) use AVX512-VNNI where the CPU has it (int8_row_vnni,
// int4_row_vnni: vpdpbusd, two blocks an instruction), else the AVX2 tiles; the same sums up to
// fp32 rounding. use_vnni(on) -> bool picks the path for the products that follow and returns
// the setting before (TINYLLM_CPU_VNNI=0: AVX2 from the start).
// Threads (see Pool below): a product is cut into chunks of rows that the calling thread and
// up to torch.get_num_threads() - 1 pool threads claim; a late pool thread finds the chunks
// taken, so no call waits for a thread that has not started. x is quantized once, before.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu_kernels.h"

namespace {

constexpr int QK = 32;  // activation block
// A product runs on more than one thread only with at least this many blocks of 32 weights a
// thread (about 8 us of work at 1-2.5 ns a block): below it, waking a second thread costs more
// than it saves.
constexpr int64_t MIN_BLOCKS_PER_THREAD = 4096;

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float f32(float v) { return v; }
inline float f32(uint16_t h) { return _cvtsh_ss(h); }  // fp16 bits (F16C)

// ---- activations -----------------------------------------------------------------------

// One block of 32 floats -> 32 int8 q = round(x / d), d = max|x| / 127; s = d * sum(q).
// interleave: store the block's even elements, then its odd ones: the order in which one 16-byte
// int4 block unpacks (low nibbles, then high).
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

// M rows of x (K floats a row, row stride ldx) quantized in nb blocks a row: q (M, nb * 32),
// d and s (M, nb). x keeps the raw rows for an int8 tail (K not a multiple of 32).
struct XQ {
  const float* x; int64_t ldx;
  int8_t* q; float* d; float* s;
  int64_t nb;
};

// A per-thread buffer for quantized activations (each thread of the pool keeps its own).
struct XBuf {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  XQ take(const float* x, int64_t ldx, int64_t M, int64_t nb) {
    if (static_cast<int64_t>(q.size()) < M * nb * QK) q.resize(M * nb * QK);
    if (static_cast<int64_t>(d.size()) < M * nb) d.resize(M * nb), s.resize(M * nb);
    return XQ{x, ldx, q.data(), d.data(), s.data(), nb};
  }
};

// Quantize blocks [b0, b1) of every row of x into xq.
void quantize_rows(const XQ& xq, int64_t M, int64_t b0, int64_t b1, bool interleave) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = b0; b < b1; ++b)
      quantize_block(xq.x + m * xq.ldx + b * QK, interleave, xq.q + (m * xq.nb + b) * QK, xq.d + m * xq.nb + b,
                     xq.s + m * xq.nb + b);
}

// ---- weights ------------------------------------------------------------------------------

struct QW {  // one quantized matrix, canonical layout
  bool int4, half;
  const void *q, *sc, *zr;
  int64_t N, K, nb, ng, bpg;
  int64_t row_bytes;  // of qweight
};

QW make_qw(const at::Tensor& qweight, const at::Tensor& scales, const c10::optional<at::Tensor>& zeros) {
  QW w{};
  TORCH_CHECK(qweight.dim() == 2 && qweight.is_contiguous() && qweight.device().is_cpu(),
              "qweight must be a contiguous (N, K) CPU tensor");
  w.int4 = qweight.scalar_type() == at::kByte;
  w.N = qweight.size(0);
  if (!w.int4) {
    TORCH_CHECK(qweight.scalar_type() == at::kChar, "qweight must be int8 (N, K) or uint8 (N, K/2)");
    TORCH_CHECK(!zeros.has_value(), "int8 weights take no zeros");
    w.K = qweight.size(1);
    TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == w.N && scales.is_contiguous(),
                "scales must be contiguous fp32 (N,)");
    w.nb = w.K / QK;
    w.ng = 1;
    w.bpg = w.nb;
  } else {
    TORCH_CHECK(zeros.has_value(), "int4 weights need zeros");
    const at::Tensor& z = *zeros;
    w.K = 2 * qweight.size(1);
    w.half = scales.scalar_type() == at::kHalf;
    TORCH_CHECK(scales.dim() == 2 && scales.size(0) == w.N && (w.half || scales.scalar_type() == at::kFloat) &&
                scales.is_contiguous() && z.sizes() == scales.sizes() && z.scalar_type() == scales.scalar_type() &&
                z.is_contiguous(), "scales and zeros must be contiguous fp32 or fp16 (N, K/g), of one dtype");
    w.ng = scales.size(1);
    const int64_t g = w.K / w.ng;
    TORCH_CHECK(w.K % w.ng == 0 && g % QK == 0, "int4 groups must be whole multiples of 32, got K ", w.K, ", ",
                w.ng, " groups");
    w.nb = w.K / QK;
    w.bpg = g / QK;
    w.zr = z.data_ptr();
  }
  w.q = qweight.data_ptr();
  w.sc = scales.data_ptr();
  w.row_bytes = qweight.size(1);
  return w;
}

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

// AVX512-VNNI (where the CPU has it: g_vnni) for one-row products (decode): two blocks of 32
// an instruction (512 bits), integer dot products by vpdpbusd, two chains of sums a row.
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

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

// int8 weights against x as it is (fp32, not rounded to int8 blocks): sum_k w[k] x[k], widened
// to fp32 and summed in fp32. use_exact_x(on) -> bool picks it for int8 products of up to
// PREFILL_M rows from then on, and returns the setting before (off unless TINYLLM_CPU_EXACT_X=1).
// Measured on the 2-core CPU (docs/BENCHMARKS.md, sixteenth session): the default model's greedy
// replies identical to fp32's on 22 of 40 prompts against 21 (native step) and 18 (plain step)
// with x rounded, at 0.55-0.6x the speed of its Q8_0 step; so rounded x (llama.cpp's) stays the default.
bool exact_x_default() {
  const char* e = std::getenv("TINYLLM_CPU_EXACT_X");
  return e != nullptr && e[0] == '1';
}
std::atomic<bool> g_exact{exact_x_default()};
bool use_exact_x(bool on) { return g_exact.exchange(on); }

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

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

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

constexpr int RM = 2;  // weight rows a step for up to 4 activation rows (small batches)

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

// Rows [n0, n1) of W against all M rows of x: y[m * ldy + n - yc0].
void product_rows(const QW& w, const XQ& x, int64_t M, int64_t n0, int64_t n1, float* y, int64_t ldy,
                  int64_t yc0) {
  if (!w.int4 && g_exact.load(std::memory_order_relaxed)) return int8_rows_exact(w, x, M, n0, n1, y, ldy, yc0);
  if (M == 1) {  // a row at a time: one sequential stream from DRAM. Measured against 2 and 4 rows
    // a step over SmolLM2's 120 matrices (int4, fp16 scales, 2 threads, alternated in one
    // process): median 11.8 ms a token against 13.8 and 15.5; int8 1.6x faster than 4 rows.
    // Each row asks for the row PREFETCH_BYTES ahead (and its scales and zeros): the
    // hardware's prefetcher alone left a cold matrix's product at half the memory's speed.
    const int64_t ahead = (PREFETCH_BYTES + w.row_bytes - 1) / w.row_bytes;
    if (g_vnni.load(std::memory_order_relaxed)) {
      if (!w.int4) return int8_product_vnni(w, x, n0, n1, y, yc0, ahead);
      if (w.bpg <= 2 && w.half)
        return int4_product_vnni(w, static_cast<const uint16_t*>(w.sc), static_cast<const uint16_t*>(w.zr), x, n0, n1,
                                 y, yc0, ahead);
      if (w.bpg <= 2)
        return int4_product_vnni(w, static_cast<const float*>(w.sc), static_cast<const float*>(w.zr), x, n0, n1, y,
                                 yc0, ahead);
    }
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

// ---- threads ------------------------------------------------------------------------------
//
// A product is cut into chunks of rows that threads claim one at a time; the calling thread
// works too and returns when every chunk is done. Helper threads that are late (on a busy
// machine a woken thread may wait a whole scheduler slice for a core) find the chunks taken
// and go back to waiting: nobody waits for a thread that has not started, where an OpenMP
// region (or llama.cpp's barrier after every op) waits for all of its threads.

class Pool {
 public:
  // Runs fn(ctx, i) for i in [0, n) on the calling thread and up to `helpers` pool threads.
  void run(int helpers, int64_t n, void (*fn)(const void*, int64_t), const void* ctx) {
    grow(helpers);
    fn_.store(fn, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    n_.store(n, std::memory_order_relaxed);
    helpers_.store(helpers, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = (next_.load(std::memory_order_relaxed) >> 32) + 1;
    next_.store(gen << 32, std::memory_order_seq_cst);  // publish (the fields above first)
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
    work(gen);
    while (done_.load(std::memory_order_acquire) < n) _mm_pause();  // chunks still running elsewhere
    next_.store(gen << 32 | CLOSED, std::memory_order_seq_cst);  // no claim on this job from now on
  }

 private:
  // A helper waits for the next job spinning PAUSE_S, then yielding its core to any other thread
  // that wants it (between two products an eager step runs torch's own threaded ops) until
  // SPIN_S, then sleeping.
  static constexpr double PAUSE_S = 30e-6, SPIN_S = 300e-6;

  void grow(int helpers) {
    while (static_cast<int>(threads_) < helpers) {
      const int id = threads_++;
      std::thread([this, id] { loop(id); }).detach();
    }
  }

  // Claims and runs chunks of job `gen` until none is left. A helper that comes late may read
  // the next job's fields, but its claim (a compare-and-swap on the generation and chunk) then
  // fails: the job was closed before those fields were written.
  void work(uint64_t gen) {
    uint64_t v = next_.load(std::memory_order_acquire);
    if ((v >> 32) != gen) return;
    void (*fn)(const void*, int64_t) = fn_.load(std::memory_order_relaxed);
    const void* ctx = ctx_.load(std::memory_order_relaxed);
    const int64_t n = n_.load(std::memory_order_relaxed);
    while ((v >> 32) == gen && static_cast<int64_t>(v & CLOSED) < n) {
      if (!next_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) continue;  // v reloaded
      fn(ctx, static_cast<int64_t>(v & CLOSED));
      done_.fetch_add(1, std::memory_order_release);
      v = next_.load(std::memory_order_acquire);
    }
  }

  void loop(int id) {
    uint64_t seen = next_.load(std::memory_order_acquire) >> 32;
    for (;;) {
      uint64_t gen = next_.load(std::memory_order_acquire) >> 32;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; gen == seen; ++i) {
        _mm_pause();
        gen = next_.load(std::memory_order_acquire) >> 32;
        if ((i & 255) != 255) continue;
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (waited > PAUSE_S) sched_yield();  // let another thread that wants this core (torch's own) run
        if (waited > SPIN_S) {
          std::unique_lock<std::mutex> lock(mu_);
          sleeping_.fetch_add(1, std::memory_order_seq_cst);
          cv_.wait(lock, [&] { return (next_.load(std::memory_order_seq_cst) >> 32) != seen; });
          sleeping_.fetch_sub(1, std::memory_order_seq_cst);
          gen = next_.load(std::memory_order_acquire) >> 32;
        }
      }
      seen = gen;
      if (id < helpers_.load(std::memory_order_relaxed)) work(gen);  // a stale gen claims nothing
    }
  }

  // The job: read by helpers after they see its generation in next_ (release/acquire), and
  // used only through a successful claim.
  static constexpr uint64_t CLOSED = 0xFFFFFFFFu;  // the chunk field of a finished job
  std::atomic<void (*)(const void*, int64_t)> fn_{nullptr};
  std::atomic<const void*> ctx_{nullptr};
  std::atomic<int64_t> n_{0};
  std::atomic<int> helpers_{0};
  std::atomic<uint64_t> next_{0};  // generation << 32 | next chunk
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<int> threads_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Runs body(i) for i in [0, n): on the calling thread alone for small work (`blocks` blocks of
// 32 weights in all), else with the pool (torch.get_num_threads() threads in all). One caller at
// a time uses the pool (a second, concurrent caller runs alone); the pool is made again after
// a fork (its threads do not survive one).
std::mutex g_pool_busy;
Pool* g_pool = nullptr;  // reset in a forked child (pthread_atfork): getpid() on every call was 4.7%
                         // of a SmolLM2 step's samples on the main thread (a system call each time)

template <class F>
void run_chunks(int64_t n, int64_t blocks, const F& body) {
  const int threads = std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(1, blocks / MIN_BLOCKS_PER_THREAD));
  std::unique_lock<std::mutex> lock(g_pool_busy, std::try_to_lock);
  if (threads <= 1 || n <= 1 || !lock.owns_lock()) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  static const bool reset_at_fork = (pthread_atfork(nullptr, nullptr, [] { g_pool = nullptr; }), true);
  (void)reset_at_fork;
  if (g_pool == nullptr) g_pool = new Pool();  // never freed
  g_pool->run(threads - 1, n, [](const void* c, int64_t i) { (*static_cast<const F*>(c))(i); }, &body);
}

// Rows a chunk: whole tiles, about CHUNK_BLOCKS blocks of 32 weights (1-3 us of work).
constexpr int64_t CHUNK_BLOCKS = 1536;
inline int64_t chunk_rows(int64_t nb, int64_t M) {
  const int64_t step = M == 1 ? 1 : RM;
  return std::max<int64_t>(step, CHUNK_BLOCKS / std::max<int64_t>(1, nb * M) / step * step);
}

XBuf g_x, g_h;  // the quantized x and hidden rows of the running product (one caller at a time)
std::mutex g_mu;

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be (M, K) with K = ", K);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "x must be fp32 on the CPU");
}

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

at::Tensor qmm(const at::Tensor& x_, const QW& w) {
  check_x(x_, w.K);
  const at::Tensor x = x_.contiguous();
  at::Tensor y = at::empty({x.size(0), w.N}, x.options());
  qmm_rows(w, x.data_ptr<float>(), x.size(0), y.data_ptr<float>());
  return y;
}

at::Tensor qmm_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales) {
  TORCH_CHECK(qweight.scalar_type() == at::kChar, "qweight must be int8 (N, K)");
  return qmm(x, make_qw(qweight, scales, c10::nullopt));
}

at::Tensor qmm_int4(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                    const at::Tensor& zeros) {
  TORCH_CHECK(qweight.scalar_type() == at::kByte, "qweight must be uint8 (N, K/2)");
  return qmm(x, make_qw(qweight, scales, zeros));
}

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

void check_ffn(const QW& w13, const QW& w2) {
  TORCH_CHECK(w13.N == 2 * w2.K, "w13 must have 2 * ffn rows (gate, then up): ", w13.N, " vs w2's K ", w2.K);
}

at::Tensor qmm_ffn(const at::Tensor& x_, const at::Tensor& q13, const at::Tensor& s13,
                   const c10::optional<at::Tensor>& z13, const at::Tensor& q2, const at::Tensor& s2,
                   const c10::optional<at::Tensor>& z2) {
  const QW w13 = make_qw(q13, s13, z13), w2 = make_qw(q2, s2, z2);
  check_ffn(w13, w2);
  check_x(x_, w13.K);
  const at::Tensor x = x_.contiguous();
  const int64_t M = x.size(0), F = w2.K;
  at::Tensor y = at::empty({M, w2.N}, x.options());
  at::Tensor hbuf = at::empty({M, F}, x.options());  // the hidden rows, fp32
  at::Tensor gubuf = at::empty({2, M, F}, x.options());  // gate and up
  ffn_rows(w13, w2, x.data_ptr<float>(), M, y.data_ptr<float>(), hbuf.data_ptr<float>(), gubuf.data_ptr<float>());
  return y;
}

// Eight 16-bit floats widened to fp32: bf16 is fp32's top half; fp16 through F16C.
inline __m256 widen8(const at::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 widen8(const float* p) { return _mm256_loadu_ps(p); }  // (attention's fp32 rows)
inline __m256 widen8(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

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
      for (; k < K; ++k) acc += static_cast<float>(wr[k]) * xr[k];
      y[m * N + n] = acc;
    }
  }
}

at::Tensor mm_half(const at::Tensor& x_, const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.device().is_cpu() &&
              (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf),
              "w must be a contiguous bf16 or fp16 (N, K) matrix on the CPU");
  const int64_t N = w.size(0), K = w.size(1);
  check_x(x_, K);
  const at::Tensor x = x_.contiguous();
  const int64_t M = x.size(0), nb = (K + QK - 1) / QK;
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t rows = chunk_rows(nb, M);
  run_chunks((N + rows - 1) / rows, M * N * nb, [&](int64_t i) {
    const int64_t lo = i * rows, hi = std::min(N, lo + rows);
    if (w.scalar_type() == at::kBFloat16) half_rows(w.data_ptr<at::BFloat16>(), xp, M, K, lo, hi, yp, N);
    else half_rows(w.data_ptr<at::Half>(), xp, M, K, lo, hi, yp, N);
  });
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

// ---- decode attention ---------------------------------------------------------------------
//
// One decode position over a window of W keys (model.window_attention, its slow twin): units
// of (b, h, ATTN_CHUNK keys) run on the pool; each keeps its keys that the mask lets through,
// their scores, its rows' max and sum of exp, and the exp-weighted sum of those keys' values;
// the units of a head are merged at the end. Masked keys are never read. q, k, v fp32 or bf16
// (one dtype; bf16 widened as it is loaded); scores, softmax and sums fp32, the result rounded
// once to q's dtype.
constexpr int64_t ATTN_CHUNK = 256;
constexpr int64_t ATTN_MAX_R = 8, ATTN_MAX_D = 256;

template <class T>
struct AttnArgs {
  const T *q, *k, *v;
  const bool* mask;
  int64_t Hkv, R, D, W, chunks;
  int64_t qb, qh, kb, kh, kw, vb, vh, vw, mb, mw;  // strides (elements)
  float scale;
  float *m, *l, *acc;  // per unit: R maxima, R sums, R x D weighted sums
};

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

// Unit u = ((b * Hkv + h) * chunks + c). Measured on the 2-core AVX512 Xeon with SmolLM2's
// heads (R 3, D 64, fp32; scripts/cpu_attention_bench.py), a call with one key and one row at a
// time (a horizontal sum a score, the value sums loaded and stored each key) against as written
// now: 900 keys of 1,024 at 2 threads 65.4 -> 33-38 us, at 1 thread 81.4 -> 55-70; 200 of 256
// at 1 thread 19.2 -> 12-15.
template <class T>
void attend_chunk(const AttnArgs<T>& a, int64_t u) {
  const int64_t c = u % a.chunks, bh = u / a.chunks, b = bh / a.Hkv, h = bh % a.Hkv, R = a.R, D = a.D;
  const int64_t j0 = c * ATTN_CHUNK, j1 = std::min(a.W, j0 + ATTN_CHUNK);
  const T* kbase = a.k + b * a.kb + h * a.kh;
  const T* vbase = a.v + b * a.vb + h * a.vh;
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
  for (; i < n; ++i) {  // the last keys, one at a time
    const T* kj = kbase + idx[i] * a.kw;
    for (int64_t r = 0; r < R; ++r) {
      __m256 s0 = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * D + d), widen8(kj + d), s0);
      sc[r][i] = hsum(s0) * a.scale;
    }
  }
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
template <class T>
void attend_units(const AttnArgs<T>& a, int64_t B, T* yp) {
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
      T* yr = yp + (bh * R + r) * D;
      for (int64_t d = 0; d < D; ++d) yr[d] = static_cast<T>(L > 0.f ? out[d] / L : 0.f);
    }
}

inline int64_t attn_chunks(int64_t W) { return std::max<int64_t>(1, (W + ATTN_CHUNK - 1) / ATTN_CHUNK); }

template <class T>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, float scale,
            at::Tensor& y) {
  const int64_t B = q.size(0), Hkv = q.size(1), R = q.size(2), D = q.size(3), W = k.size(2);
  const int64_t chunks = attn_chunks(W), units = B * Hkv * chunks;
  at::Tensor part = at::empty({units * R * (2 + D)}, q.options().dtype(at::kFloat));
  float* pp = part.data_ptr<float>();
  const AttnArgs<T> a{q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), mask.data_ptr<bool>(), Hkv, R, D, W, chunks,
                      q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
                      v.stride(2), mask.size(0) == 1 ? 0 : mask.stride(0), mask.stride(3), scale, pp, pp + units * R, pp + 2 * units * R};
  attend_units(a, B, y.data_ptr<T>());
}

at::Tensor decode_attention(const at::Tensor& q_, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale) {
  TORCH_CHECK(q_.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 4, "decode_attention: 4-d tensors");
  const auto dt = q_.scalar_type();
  TORCH_CHECK((dt == at::kFloat || dt == at::kBFloat16) && k.scalar_type() == dt && v.scalar_type() == dt,
              "decode_attention: q, k, v of one dtype, fp32 or bf16");
  TORCH_CHECK(mask.scalar_type() == at::kBool, "decode_attention: a bool mask");
  const at::Tensor q = q_.contiguous();
  const int64_t B = q.size(0), Hkv = q.size(1), R = q.size(2), D = q.size(3), W = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(1) == Hkv && k.size(3) == D && v.sizes() == k.sizes(),
              "decode_attention: k and v must be (B, Hkv, W, D) of q's B, Hkv and D");
  TORCH_CHECK((mask.size(0) == B || mask.size(0) == 1) && mask.size(1) == 1 && mask.size(2) == 1 && mask.size(3) == W,
              "decode_attention: the mask must be (B or 1, 1, 1, W)");
  TORCH_CHECK(R <= ATTN_MAX_R && D % 8 == 0 && D <= ATTN_MAX_D && k.stride(3) == 1 && v.stride(3) == 1,
              "decode_attention: R <= 8, D a multiple of 8 up to 256, D contiguous");
  at::Tensor y = at::empty({B, Hkv, R, D}, q.options());
  if (dt == at::kFloat) attend<float>(q, k, v, mask, static_cast<float>(scale), y);
  else attend<at::BFloat16>(q, k, v, mask, static_cast<float>(scale), y);
  return y;
}

}  // namespace

// ---- the row kernels of cpu_kernels.h (the decode step of cpu_step.cpp) ---------------------

namespace tinyllm_cpu {

Matrix Matrix::of(const at::Tensor& w, const at::Tensor& scales, const at::Tensor& zeros) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.device().is_cpu(), "a matrix must be a contiguous (N, K) CPU tensor");
  const auto dt = w.scalar_type();
  Matrix m{DENSE, w, scales, zeros, w.size(0), w.size(1)};
  if (dt == at::kChar || dt == at::kByte) {
    const QW q = make_qw(w, scales, zeros.defined() ? c10::optional<at::Tensor>(zeros) : c10::nullopt);
    m.kind = q.int4 ? INT4 : INT8;
    m.K = q.K;
    return m;
  }
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
              "a dense matrix must be fp32, bf16 or fp16, got ", dt);
  TORCH_CHECK(!scales.defined() && !zeros.defined(), "a dense matrix takes no scales");
  return m;
}

namespace {
QW qw(const Matrix& m) {
  return make_qw(m.w, m.scales, m.zeros.defined() ? c10::optional<at::Tensor>(m.zeros) : c10::nullopt);
}

template <class H>
void dense_rows(const H* w, const float* x, int64_t N, int64_t K, float* y) {
  const int64_t rows = chunk_rows((K + QK - 1) / QK, 1);
  run_chunks((N + rows - 1) / rows, N * ((K + QK - 1) / QK),
             [&](int64_t i) { half_rows(w, x, 1, K, i * rows, std::min(N, (i + 1) * rows), y, N); });
}

thread_local std::vector<float> t_ffn, t_attn;  // scratch of ffn and attend
thread_local std::vector<uint8_t> t_mask;
}  // namespace

void matvec(const Matrix& m, const float* x, float* y) {
  switch (m.w.scalar_type()) {
    case at::kFloat: return dense_rows(m.w.data_ptr<float>(), x, m.N, m.K, y);
    case at::kBFloat16: return dense_rows(m.w.data_ptr<at::BFloat16>(), x, m.N, m.K, y);
    case at::kHalf: return dense_rows(m.w.data_ptr<at::Half>(), x, m.N, m.K, y);
    default: return qmm_rows(qw(m), x, 1, y);
  }
}

void ffn(const Matrix& w13, const Matrix& w2, const float* x, float* y) {
  const int64_t F = w2.K;
  TORCH_CHECK(w13.N == 2 * F && w13.K == w2.N, "ffn: w13 must be (2F, D) and w2 (D, F)");
  if (t_ffn.size() < static_cast<size_t>(3 * F)) t_ffn.resize(3 * F);
  float *gu = t_ffn.data(), *h = gu + 2 * F;  // gate and up, then the hidden row
  if (w13.kind != Matrix::DENSE && w2.kind != Matrix::DENSE) return ffn_rows(qw(w13), qw(w2), x, 1, y, h, gu);
  matvec(w13, x, gu);
  silu_mul(gu, gu + F, h, F);
  matvec(w2, h, y);
}

void attend(const float* q, int64_t R, const at::Tensor& k, const at::Tensor& v, int64_t first, int64_t last,
            float scale, float* y) {
  TORCH_CHECK(k.dim() == 4 && k.size(0) == 1 && k.scalar_type() == at::kFloat && v.sizes() == k.sizes() &&
              v.scalar_type() == at::kFloat && k.stride(3) == 1 && v.stride(3) == 1 && 0 <= last && last < k.size(2),
              "attend: k and v must be fp32 (1, Hkv, rows, D) caches holding key ", last);
  const int64_t Hkv = k.size(1), D = k.size(3), W = last + 1, chunks = attn_chunks(W), units = Hkv * chunks;
  TORCH_CHECK(R <= ATTN_MAX_R && D % 8 == 0 && D <= ATTN_MAX_D, "attend: R <= 8, D a multiple of 8 up to 256");
  if (t_mask.size() < static_cast<size_t>(W)) t_mask.resize(W);
  for (int64_t j = 0; j < W; ++j) t_mask[j] = j >= first;
  if (t_attn.size() < static_cast<size_t>(units * R * (2 + D))) t_attn.resize(units * R * (2 + D));
  float* pp = t_attn.data();
  const AttnArgs<float> a{q, k.data_ptr<float>(), v.data_ptr<float>(), reinterpret_cast<const bool*>(t_mask.data()),
                          Hkv, R, D, W, chunks, 0, R * D, 0, k.stride(1), k.stride(2), 0, v.stride(1), v.stride(2),
                          0, 1, scale, pp, pp + units * R, pp + 2 * units * R};
  attend_units(a, 1, y);
}

}  // namespace tinyllm_cpu

TORCH_LIBRARY(tinyllm_cpu, m) {
  m.def("qmm_int8(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
  m.def("qmm_int4(Tensor x, Tensor qweight, Tensor scales, Tensor zeros) -> Tensor");
  m.def("qmm_ffn(Tensor x, Tensor q13, Tensor s13, Tensor? z13, Tensor q2, Tensor s2, Tensor? z2) -> Tensor");
  m.def("dequantize(Tensor qweight, Tensor scales, Tensor? zeros) -> Tensor");
  m.def("mm_half(Tensor x, Tensor w) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
  m.def("use_vnni(bool on) -> bool", &use_vnni);
  m.def("use_exact_x(bool on) -> bool", &use_exact_x);
}

TORCH_LIBRARY_IMPL(tinyllm_cpu, CPU, m) {
  m.impl("qmm_int8", &qmm_int8);
  m.impl("qmm_int4", &qmm_int4);
  m.impl("qmm_ffn", &qmm_ffn);
  m.impl("dequantize", &dequantize);
  m.impl("mm_half", &mm_half);
  m.impl("decode_attention", &decode_attention);
}
