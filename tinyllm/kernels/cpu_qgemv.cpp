// Quantized-weight products and decode attention for a CPU with AVX2 + FMA, and AVX512-VNNI where
// it has it (tinyllm/kernels/cpu_qgemv.py builds and loads it).
//
// Contract (ops in namespace tinyllm_cpu; x fp32 (M, K), weights in tinyllm.core.quant's canonical
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
//       -> (B, Hkv, R, D): ops.window_attention for one decode position, fp32 or bf16, k and v
//       read through their strides, masked keys never read, a row with no key 0
//       (cpu_attention.cpp).
// use_exact_x(on) -> bool: int8 products of up to PREFILL_M - 1 rows take x as it is (fp32 sums of
// the widened weights, no rounding of x) from then on; returns the setting before (off unless
// TINYLLM_CPU_EXACT_X=1).
// One-row products (M = 1, decode) use AVX512-VNNI where the CPU has it (cpu_vnni.cpp: vpdpbusd,
// two blocks an instruction), else the AVX2 tiles (cpu_tiles.cpp); the same sums up to fp32
// rounding. use_vnni(on) -> bool picks the path for the products that follow and returns the
// setting before (TINYLLM_CPU_VNNI=0: AVX2 from the start).
// Threads: a product is cut into chunks of rows that the calling thread and up to
// torch.get_num_threads() - 1 pool threads claim (cpu_pool.cpp); a late pool thread finds the
// chunks taken, so no call waits for a thread that has not started. x is quantized once, before.
//
// This file is the ops' one torch side: it checks the tensors, allocates the results and hands
// raw pointers to the kernels, which include no torch header (cpu_kernels.h: activation
// quantization cpu_quantize.cpp, the AVX2 tiles cpu_tiles.cpp, the VNNI rows cpu_vnni.cpp, the
// path a product takes cpu_products.cpp, the products of a few rows and the fused FFN
// cpu_qmm.cpp, the thread pool cpu_pool.cpp, 16-bit matrices cpu_half.cpp, dequantization
// cpu_dequant.cpp, decode attention cpu_attention.cpp); it also defines cpu_matrix.h's row
// kernels for cpu_step.cpp, and registers the ops.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu_kernels.h"
#include "cpu_matrix.h"

namespace tinyllm_cpu {
namespace {

// A tensor's data as the kernels' plain type of the same bits (float, bf16, f16).
template <class T>
T* bits(const at::Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

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

void check_x(const at::Tensor& x, int64_t K) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be (M, K) with K = ", K);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), "x must be fp32 on the CPU");
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

at::Tensor mm_half(const at::Tensor& x_, const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.device().is_cpu() &&
              (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf),
              "w must be a contiguous bf16 or fp16 (N, K) matrix on the CPU");
  const int64_t N = w.size(0), K = w.size(1);
  check_x(x_, K);
  const at::Tensor x = x_.contiguous();
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (w.scalar_type() == at::kBFloat16) half_product(bits<bf16>(w), xp, M, K, N, yp);
  else half_product(bits<f16>(w), xp, M, K, N, yp);
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
  const int64_t ng = int4 ? s.size(1) : 1;
  const float *sp = s.data_ptr<float>(), *zp = z.data_ptr<float>();
  float* wp = w.data_ptr<float>();
  const void* q = qweight.data_ptr();
  at::parallel_for(0, N, 16, [&](int64_t lo, int64_t hi) { dequantize_rows(q, int4, sp, zp, K, ng, lo, hi, wp); });
  return w;
}

// q, k, v, y of T's bits (float, or bf16 for at::BFloat16).
template <class T>
void attend_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, float scale,
               at::Tensor& y) {
  const int64_t B = q.size(0), Hkv = q.size(1), R = q.size(2), D = q.size(3), W = k.size(2);
  const int64_t chunks = attn_chunks(W), units = B * Hkv * chunks;
  at::Tensor part = at::empty({units * R * (2 + D)}, q.options().dtype(at::kFloat));
  float* pp = part.data_ptr<float>();
  const AttnArgs<T> a{bits<T>(q), bits<T>(k), bits<T>(v), mask.data_ptr<bool>(), Hkv, R, D, W, chunks,
                      q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
                      v.stride(2), mask.size(0) == 1 ? 0 : mask.stride(0), mask.stride(3), scale, pp, pp + units * R, pp + 2 * units * R};
  attend_units(a, B, bits<T>(y));
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
  if (dt == at::kFloat) attend_op<float>(q, k, v, mask, static_cast<float>(scale), y);
  else attend_op<bf16>(q, k, v, mask, static_cast<float>(scale), y);
  return y;
}

}  // namespace

// ---- the row kernels of cpu_matrix.h (the decode step of cpu_step.cpp) ----------------------

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

thread_local std::vector<float> t_ffn, t_attn;  // scratch of ffn and attend
thread_local std::vector<uint8_t> t_mask;
}  // namespace

void matvec(const Matrix& m, const float* x, float* y) {
  switch (m.w.scalar_type()) {
    case at::kFloat: return half_product(m.w.data_ptr<float>(), x, 1, m.K, m.N, y);
    case at::kBFloat16: return half_product(bits<bf16>(m.w), x, 1, m.K, m.N, y);
    case at::kHalf: return half_product(bits<f16>(m.w), x, 1, m.K, m.N, y);
    default: return qmm_rows(qw(m), x, 1, y);
  }
}

void ffn(const Matrix& w13, const Matrix& w2, const float* x, float* y, bool gelu) {
  const int64_t F = w2.K;
  TORCH_CHECK(w13.N == 2 * F && w13.K == w2.N, "ffn: w13 must be (2F, D) and w2 (D, F)");
  if (t_ffn.size() < static_cast<size_t>(3 * F)) t_ffn.resize(3 * F);
  float *gu = t_ffn.data(), *h = gu + 2 * F;  // gate and up, then the hidden row
  if (!gelu && w13.kind != Matrix::DENSE && w2.kind != Matrix::DENSE) return ffn_rows(qw(w13), qw(w2), x, 1, y, h, gu);
  matvec(w13, x, gu);
  if (gelu) gelu_tanh_mul(gu, gu + F, h, F);
  else silu_mul(gu, gu + F, h, F);
  matvec(w2, h, y);
}

void attend(const float* q, int64_t R, const at::Tensor& k, const at::Tensor& v, int64_t first, int64_t last,
            float scale, float* y, float cap, const at::Tensor& ks, const at::Tensor& vs) {
  const auto dt = k.scalar_type();
  TORCH_CHECK(k.dim() == 4 && k.size(0) == 1 && (dt == at::kFloat || dt == at::kBFloat16 || dt == at::kChar) &&
              v.sizes() == k.sizes() && v.scalar_type() == dt && k.stride(3) == 1 && v.stride(3) == 1 && 0 <= last &&
              last < k.size(2), "attend: k and v must be fp32, bf16 or int8 (1, Hkv, rows, D) caches holding key ", last);
  auto scales = [&](const at::Tensor& s) {
    return s.defined() && s.scalar_type() == at::kFloat && s.dim() == 3 && s.size(0) == 1 &&
           s.size(1) == k.size(1) && s.size(2) == k.size(2) && s.stride(2) == 1;
  };
  TORCH_CHECK(dt != at::kChar || (scales(ks) && scales(vs)), "attend: an int8 cache needs fp32 scales (1, Hkv, rows)");
  // Keys from the chunk holding `first` on (a sliding window's chunks before it hold no key):
  // the chunks keep their places, so the sums are those of a call over keys 0..last.
  const int64_t base = std::min(std::max<int64_t>(first, 0), last) / ATTN_CHUNK * ATTN_CHUNK;
  const int64_t Hkv = k.size(1), D = k.size(3), W = last + 1 - base, chunks = attn_chunks(W), units = Hkv * chunks;
  TORCH_CHECK(R <= ATTN_MAX_R && D % 8 == 0 && D <= ATTN_MAX_D, "attend: R <= 8, D a multiple of 8 up to 256");
  if (t_mask.size() < static_cast<size_t>(W)) t_mask.resize(W);
  for (int64_t j = 0; j < W; ++j) t_mask[j] = base + j >= first;
  if (t_attn.size() < static_cast<size_t>(units * R * (2 + D))) t_attn.resize(units * R * (2 + D));
  float* pp = t_attn.data();
  auto run = [&](auto* kp, auto* vp) {  // the cache's own type, widened as it is loaded
    using KV = std::remove_const_t<std::remove_pointer_t<decltype(kp)>>;
    AttnArgs<float, KV> a{q, kp + base * k.stride(2), vp + base * v.stride(2),
                          reinterpret_cast<const bool*>(t_mask.data()), Hkv, R, D, W, chunks, 0, R * D, 0,
                          k.stride(1), k.stride(2), 0, v.stride(1), v.stride(2), 0, 1, scale, pp,
                          pp + units * R, pp + 2 * units * R, cap};
    if constexpr (std::is_same_v<KV, int8_t>) {  // the scales of keys base.. too
      a.ks = ks.data_ptr<float>() + base, a.ksh = ks.stride(1);
      a.vs = vs.data_ptr<float>() + base, a.vsh = vs.stride(1);
    }
    attend_units(a, 1, y);
  };
  if (dt == at::kFloat) run(k.data_ptr<float>(), v.data_ptr<float>());
  else if (dt == at::kChar) run(k.data_ptr<int8_t>(), v.data_ptr<int8_t>());
  else run(bits<bf16>(k), bits<bf16>(v));
}

}  // namespace tinyllm_cpu

TORCH_LIBRARY(tinyllm_cpu, m) {
  m.def("qmm_int8(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
  m.def("qmm_int4(Tensor x, Tensor qweight, Tensor scales, Tensor zeros) -> Tensor");
  m.def("qmm_ffn(Tensor x, Tensor q13, Tensor s13, Tensor? z13, Tensor q2, Tensor s2, Tensor? z2) -> Tensor");
  m.def("dequantize(Tensor qweight, Tensor scales, Tensor? zeros) -> Tensor");
  m.def("mm_half(Tensor x, Tensor w) -> Tensor");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
  m.def("use_vnni(bool on) -> bool", &tinyllm_cpu::use_vnni);
  m.def("use_exact_x(bool on) -> bool", &tinyllm_cpu::use_exact_x);
}

TORCH_LIBRARY_IMPL(tinyllm_cpu, CPU, m) {
  m.impl("qmm_int8", &tinyllm_cpu::qmm_int8);
  m.impl("qmm_int4", &tinyllm_cpu::qmm_int4);
  m.impl("qmm_ffn", &tinyllm_cpu::qmm_ffn);
  m.impl("dequantize", &tinyllm_cpu::dequantize);
  m.impl("mm_half", &tinyllm_cpu::mm_half);
  m.impl("decode_attention", &tinyllm_cpu::decode_attention);
}
