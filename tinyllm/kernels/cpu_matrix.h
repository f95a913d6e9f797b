// The row kernels on a model's tensors that cpu_step.cpp builds its decode step from (defined in
// cpu_qgemv.cpp over the plain kernels of cpu_kernels.h; this header is the only torch-typed one).
//
// Contract (namespace tinyllm_cpu; every x, y a contiguous fp32 row):
//   Matrix::of(w, scales, zeros): one (N, K) matrix as a model holds it: int8 w (N, K) with fp32
//       scales (N,); int4 w uint8 (N, K/2) with scales and zeros (N, K/g), fp32 or fp16 (the
//       canonical tinyllm.core.quant QTensor, as quant_linear.CpuQgemvLinear holds it); or dense fp32, bf16 or fp16
//       w (N, K) (scales and zeros undefined). Refuses (c10::Error) anything else.
//   matvec(W, x (K), y (N)): y = W x, as qmm_int8 / qmm_int4 / mm_half compute it for one row
//       (x rounded to int8 blocks of 32 for the quantized forms; exact fp32 sums for dense).
//   ffn(w13, w2, x (K), y (D), gelu): y = w2(silu(gate) * up), gate and up the two halves of w13 x:
//       qmm_ffn's one op where both are quantized, else the two products and the gating; with
//       gelu, w2(gelu_tanh(gate) * up) (GeGLU), always the two products and the gating.
//   attend(q (Hkv, R, D), R, k, v (1, Hkv, rows, D) fp32 or bf16 (both one), first, last, scale, y (Hkv, R, D), cap,
//       ks, vs): or int8 k and v, each with its fp32 scales ks, vs (1, Hkv, rows) (k ~ k * ks[..., None]);
//       decode_attention over keys first..last of the cache (last < rows), as that op computes
//       it with a mask that lets exactly those keys through; a row with no key gets 0. cap > 0:
//       the scores soft-capped first (ops.window_attention's cap).
// Every call runs on the products' thread pool; one caller at a time gets the shared scratch.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tinyllm_cpu {

struct Matrix {
  enum Kind { INT8, INT4, DENSE } kind;
  at::Tensor w, scales, zeros;
  int64_t N, K;
  static Matrix of(const at::Tensor& w, const at::Tensor& scales, const at::Tensor& zeros);
};

void matvec(const Matrix& w, const float* x, float* y);
void ffn(const Matrix& w13, const Matrix& w2, const float* x, float* y, bool gelu = false);
void attend(const float* q, int64_t R, const at::Tensor& k, const at::Tensor& v, int64_t first, int64_t last,
            float scale, float* y, float cap = 0.f, const at::Tensor& ks = at::Tensor(),
            const at::Tensor& vs = at::Tensor());

}  // namespace tinyllm_cpu
