// The kernels of the CPU ops, on raw pointers and sizes: plain C++, no torch header, so each
// kernel file compiles in 0.2-3 s of CPU (torch's headers alone cost about 5.5 s a file). Only
// cpu_qgemv.cpp (the ops) and cpu_step.cpp include torch; they check tensors and call these.
//
// Contract (namespace tinyllm_cpu; every matrix row-major and contiguous, every x, y fp32):
//   QW: one quantized matrix in tinyllm.core.quant's canonical QTensor layout (cpu_qgemv.cpp's
//       make_qw checks the tensors and fills it): int8 q (N, K) with fp32 scales (N,), or int4
//       q uint8 (N, K/2) with scales and zeros (N, ng) fp32 or fp16 (half), groups of bpg
//       blocks of QK = 32.
//   XQ: rows of x quantized to int8 blocks of 32 (quantize_rows, cpu_quantize.cpp).
//   product_rows (cpu_products.cpp): rows [n0, n1) of W against every row of a quantized x, the
//       products' one entry: VNNI rows (cpu_vnni.cpp), AVX2 tiles (cpu_tiles.cpp) or exact x.
//   qmm_rows, ffn_rows (cpu_qmm.cpp): y = x W^T, and the fused SwiGLU FFN; gelu_tanh_mul (GeGLU's
//       gating) and soft_cap (Gemma 2's logits) beside silu_mul.
//   half_product (cpu_half.cpp): y = x W^T for fp32, bf16 or fp16 W, fp32 sums.
//   dequantize_rows (cpu_dequant.cpp): rows of the fp32 W.
//   attend_units (cpu_attention.cpp): decode attention over AttnArgs (q and the cache typed apart).
//   run_chunks (cpu_pool.cpp): body(i) for i in [0, n) on the pool's threads.
//   use_vnni, use_exact_x (cpu_vnni.cpp, cpu_products.cpp): the ops' two switches.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

namespace tinyllm_cpu {

constexpr int QK = 32;  // activation block
constexpr int RM = 2;   // weight rows a step for up to 4 activation rows (small batches)

// 16-bit floats as stored (the bits): bf16 is fp32's top half; fp16 is IEEE half (F16C).
struct bf16 {
  uint16_t x;
  bf16() = default;
  // fp32 -> bf16 rounded to nearest even, NaN -> 0x7FC0: c10::BFloat16's conversion, bit for bit.
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    x = f != f ? uint16_t(0x7FC0) : static_cast<uint16_t>((u + ((u >> 16) & 1) + 0x7FFFu) >> 16);
  }
};
struct f16 {
  uint16_t x;
};

// ---- quantized weights and activations ----------------------------------------------------

struct QW {  // one quantized matrix, canonical layout
  bool int4, half;
  const void *q, *sc, *zr;
  int64_t N, K, nb, ng, bpg;
  int64_t row_bytes;  // of qweight
};

// M rows of x (K floats a row, row stride ldx) quantized in nb blocks a row: q (M, nb * 32),
// d and s (M, nb). x keeps the raw rows for an int8 tail (K not a multiple of 32).
struct XQ {
  const float* x; int64_t ldx;
  int8_t* q; float* d; float* s;
  int64_t nb;
};


// Quantize blocks [b0, b1) of every row of x into xq (interleave: the order an int4 block unpacks).
void quantize_rows(const XQ& xq, int64_t M, int64_t b0, int64_t b1, bool interleave);

// Rows [n0, n1) of W against all M rows of x: y[m * ldy + n - yc0].
void product_rows(const QW& w, const XQ& x, int64_t M, int64_t n0, int64_t n1, float* y, int64_t ldy, int64_t yc0);
// The same through the AVX2 tiles only (product_rows' path without VNNI or exact x).
void tile_rows(const QW& w, const XQ& x, int64_t M, int64_t n0, int64_t n1, float* y, int64_t ldy, int64_t yc0);
// Rows [n0, n1) of W against one row of x with AVX512-VNNI; false (nothing done) for a layout it
// does not take (int4 groups of more than 2 blocks). `ahead`: rows prefetched ahead.
bool vnni_rows(const QW& w, const XQ& x, int64_t n0, int64_t n1, float* y, int64_t yc0, int64_t ahead);
bool cpu_has_vnni();
extern std::atomic<bool> g_vnni;  // use_vnni's setting (cpu_vnni.cpp)

// The switches (ops use_vnni, use_exact_x): each sets its path for the products that start
// after it and returns the setting before.
bool use_vnni(bool on);
bool use_exact_x(bool on);

// Rows a chunk: whole tiles, about CHUNK_BLOCKS blocks of 32 weights (1-3 us of work).
constexpr int64_t CHUNK_BLOCKS = 1536;
inline int64_t chunk_rows(int64_t nb, int64_t M) {
  const int64_t step = M == 1 ? 1 : RM;
  return std::max<int64_t>(step, CHUNK_BLOCKS / std::max<int64_t>(1, nb * M) / step * step);
}

// y (M, N) = x (M, K) times W's transpose, x and y contiguous.
void qmm_rows(const QW& w, const float* xp, int64_t M, float* yp);
// y (M, D) = w2(silu(gate) * up) of x (M, K), gate and up the halves of x @ w13.T; gp (2, M, F)
// and hp (M, F) scratch.
void ffn_rows(const QW& w13, const QW& w2, const float* xp, int64_t M, float* yp, float* hp, float* gp);
// h[j] = silu(g[j]) * u[j] for n elements.
void silu_mul(const float* g, const float* u, float* h, int64_t n);
// h[j] = gelu_tanh(g[j]) * u[j] = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u, n elements.
void gelu_tanh_mul(const float* g, const float* u, float* h, int64_t n);
// x[j] = cap * tanh(x[j] / cap) in place, n elements (cap > 0).
void soft_cap(float* x, int64_t n, float cap);

// ---- 16-bit and fp32 matrices, dequantization ---------------------------------------------

// y (M, N) = x (M, K) times w (N, K)'s transpose, widened to fp32, fp32 sums, on the pool.
void half_product(const float* w, const float* x, int64_t M, int64_t K, int64_t N, float* y);
void half_product(const bf16* w, const float* x, int64_t M, int64_t K, int64_t N, float* y);
void half_product(const f16* w, const float* x, int64_t M, int64_t K, int64_t N, float* y);

// Rows [n0, n1) of the fp32 matrix (N, K) into w: int8 q (N, K) times s (N,), or int4 q
// (N, K/2) times s plus z (N, ng), fp32.
void dequantize_rows(const void* q, bool int4, const float* s, const float* z, int64_t K, int64_t ng, int64_t n0,
                     int64_t n1, float* w);

// ---- decode attention ---------------------------------------------------------------------

constexpr int64_t ATTN_CHUNK = 256;
constexpr int64_t ATTN_MAX_R = 8, ATTN_MAX_D = 256;

// Q: the query's and the result's type; KV: the cache's (keys and values), float or bf16, or
// int8 with an fp32 scale a key (ks, vs: (B, Hkv, keys) at strides ksb, ksh and 1).
template <class Q, class KV = Q>
struct AttnArgs {
  const Q* q;
  const KV *k, *v;
  const bool* mask;
  int64_t Hkv, R, D, W, chunks;
  int64_t qb, qh, kb, kh, kw, vb, vh, vw, mb, mw;  // strides (elements)
  float scale;
  float *m, *l, *acc;  // per unit: R maxima, R sums, R x D weighted sums
  float cap = 0.f;     // scores soft-capped to cap * tanh(s / cap) where > 0 (Gemma 2)
  const float *ks = nullptr, *vs = nullptr;  // int8 k and v only: a key's k = ks * k, v = vs * v
  int64_t ksb = 0, ksh = 0, vsb = 0, vsh = 0;
};

inline int64_t attn_chunks(int64_t W) { return std::max<int64_t>(1, (W + ATTN_CHUNK - 1) / ATTN_CHUNK); }

// Runs a's units on the pool and merges each head's chunks into y (B, Hkv, R, D); a.m, a.l and
// a.acc hold units * R, units * R and units * R * D floats (units = B * Hkv * chunks).
// fp32 or bf16 throughout, or an fp32 query over a bf16 or int8 cache (the native step's compact
// ones).
void attend_units(const AttnArgs<float>& a, int64_t B, float* y);
void attend_units(const AttnArgs<bf16>& a, int64_t B, bf16* y);
void attend_units(const AttnArgs<float, bf16>& a, int64_t B, float* y);
void attend_units(const AttnArgs<float, int8_t>& a, int64_t B, float* y);

// ---- threads ------------------------------------------------------------------------------

// A product runs on more than one thread only with at least this many blocks of 32 weights a
// thread (about 1 us of work at 1-2.5 ns a block; TINYLLM_CPU_MIN_BLOCKS overrides it). It was 4096
// (8 us), set on the 2-core CPU, where waking a second thread was thought to cost more than it saves;
// but the pool's helpers spin between a step's products, and on a 16-core Xeon SmolLM2's native step
// ran 208 -> 257 tok/s at 4 threads, 333 -> 364 at 8 and 364 -> 496 at 15 with 512 (llama.cpp there:
// 218, 301, 362), 1 thread the same; on the 2-core CPU 512 measured within its noise of 4096
// (docs/BENCHMARKS.md, "Many cores").
constexpr int64_t MIN_BLOCKS_PER_THREAD = 512;

// fn(ctx, i) for i in [0, n): on the calling thread alone for small work (`blocks` blocks of 32
// weights in all), else with the pool (torch.get_num_threads() threads in all).
void run_chunks_fn(int64_t n, int64_t blocks, void (*fn)(const void*, int64_t), const void* ctx);

template <class F>
void run_chunks(int64_t n, int64_t blocks, const F& body) {
  run_chunks_fn(n, blocks, [](const void* c, int64_t i) { (*static_cast<const F*>(c))(i); }, &body);
}

}  // namespace tinyllm_cpu
