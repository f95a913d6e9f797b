"""Matrix-vector products on CUDA, quantized or dense: Triton kernels for decode's few rows.

Contract:
- `linear(x, kind, qt_parts...)`: y = x @ W.T for a QTensor W held in canonical form on the GPU
  (tinyllm.core.quant; kind "int8" / "int4"), or for a dense 16-bit W (kind "dense", the
  matrix as `qweight`): x (M, K) on CUDA, y (M, N) in x's dtype, fp32 accumulation. It reads the
  int8 / packed int4 / bf16 weights in place, once per row of x, with the dequantization fused into
  the product. It is the slow twin `x @ W.dequantize().T`, to fp32 rounding order.
  With `gated`, W holds a gated FFN's gate and up rows and it returns act(gate) * up in one kernel
  (`act` "silu", SwiGLU, or "gelu_tanh", GeGLU). With `norm` (an RMSNorm's weights (K,) and eps) it
  is the product of RMSNorm(x); with `bias` (N,) (2F for a gated W) each row's bias is added to
  the product; with `residual` (M, N) it returns residual + the result: all inside the same kernel.
- `add_norm(x, y, norm)`: x + RMSNorm(y), norm (weights (C,), eps), x and y (M, C): a post-norm
  and its skip connection (Gemma 2/3) in one kernel, rounded as model.RMSNorm and the add are.
- `supported(x)`: whether to call either: Triton is installed (and not switched off with
  TINYLLM_QGEMV=0), x is on CUDA, and x has at most MAX_ROWS rows. Wider inputs (a prompt's
  prefill, a large engine batch) are better served by dequantizing once and one library
  matrix product, since the kernels read W again for each row.
- Importing this module never imports Triton (CPU-only installs and CI have none): the kernels
  are imported at the first call, which registers their custom ops: `qgemv_triton`'s
  (`tinyllm::dense_gemv`; `tinyllm::int4_gemv` under TINYLLM_INT4_KERNEL=bytes; `tinyllm::int8_gemv`
  under TINYLLM_INT8_KERNEL=bytes or where K is not a multiple of 4) and `qgemv_words`'
  (`tinyllm::int4_words_gemv` and `tinyllm::int8_words_gemv`, the defaults).

Why: a batch-1 step reads every weight once, so its speed is the weights' bytes over the
bandwidth. Int8 halves bf16's bytes, int4 quarters them, but only where the product reads
the quantized bytes themselves: dequantizing to bf16 first writes and reads a bf16 copy, and
Inductor's generated reduction over int8 ran below cuBLAS's bf16 product (docs/BENCHMARKS-LOG.md).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from tinyllm.kernels.switches import SWITCHES

_HAS_TRITON = importlib.util.find_spec("triton") is not None and SWITCHES.qgemv
_INTERPRET = SWITCHES.triton_interpret
MAX_ROWS = 4
# Where a product takes its RMSNorm and residual add (quant_linear.TritonLinear.fused). Measured on the H200,
# 1.1B int8, one call (docs/BENCHMARKS-LOG.md): in the plain step the fold cut the
# replay from 2,443 to 1,868 us (1,157 kernels to 753); in the compiled step, where Inductor
# already makes add + RMSNorm one kernel, it cost 16 us (832 against 817). So by default it
# folds outside a compile only. TINYLLM_QGEMV_FOLD=0: never; =compiled: in the compiled step too.
FOLD = SWITCHES.qgemv_fold
# Under TINYLLM_INT4_DP4A=auto, an int4 product of groups of 32 runs on x rounded to int8
# (qgemv_dp4a: two kernels, about 3 instructions a weight byte) where its matrix holds at least
# this many bytes of weights, and the one-kernel product (qgemv_words, 9-12 a byte) below. Off by
# default: on an H100 the 8B's step ran 2.3% faster with it, within the drift between the calls
# (docs/INFERENCE.md, "The int4 product a word at a time").
DP4A_MIN_BYTES = 4 << 20


def uses_dp4a(qweight: Tensor, group: int) -> bool:
    """Whether an int4 product of this matrix (packed, (N, K/2) bytes) runs on x rounded to int8."""
    mode = SWITCHES.int4_dp4a
    return group == 32 and (mode == "1" or mode == "auto" and qweight.numel() >= DP4A_MIN_BYTES)


def fold() -> bool:
    """Whether a product here takes its norm and residual (see FOLD)."""
    return FOLD == "compiled" or (FOLD != "0" and not torch.compiler.is_compiling())


def post_fold() -> bool:
    """Whether a product here takes a post-norm too (TINYLLM_POST_FOLD=1; off by default: switches.py)."""
    return SWITCHES.post_fold


def available() -> bool:
    """Triton is installed (checked without importing it) and not switched off."""
    return _HAS_TRITON


def supported(x: Tensor) -> bool:
    """x on CUDA (or anywhere under Triton's interpreter: switches.triton_interpret) with at most MAX_ROWS rows."""
    return _HAS_TRITON and (x.is_cuda or _INTERPRET) and x.shape[:-1].numel() <= MAX_ROWS


def linear(x: Tensor, kind: str, qweight: Tensor, scales: Tensor | None = None, zeros: Tensor | None = None,
           group: int = 0, gated: bool = False, norm: tuple[Tensor, float] | None = None,
           residual: Tensor | None = None, bias: Tensor | None = None, act: str = "silu",
           post: tuple[Tensor, float, Tensor] | None = None) -> Tensor:
    """x (M, K) -> (M, N); kind "int8" (zeros None), "int4" or "dense" (qweight the (N, K)
    matrix in x's dtype, no scales). gated: W holds a gated FFN's gate and up (2F rows), and the
    result is act(gate) * up, (M, F). norm: (weights (K,), eps) of an RMSNorm applied to x
    first; bias: added to each row's product; residual (M, N): added to the result. post:
    (weights (N,), eps, count) of a post-norm: residual + RMSNorm(the product) (needs a residual;
    count: int32, a zero a row of x, which the kernel leaves at zero)."""
    from tinyllm.kernels import qgemv_triton  # Triton, and the ops registered, on first use

    x = x.contiguous()
    g, eps = norm if norm is not None else (None, 0.0)
    r = None if residual is None else residual.contiguous()
    p = dict(zip(("post", "post_eps", "done"), post, strict=True)) if post is not None else {}
    if kind == "dense":
        return qgemv_triton.dense_gemv(x, qweight, gated, g, eps, r, bias, act, **p)
    if kind == "int8" and SWITCHES.int8_kernel == "words" and x.shape[1] % 4 == 0:  # TINYLLM_INT8_KERNEL=bytes: not
        from tinyllm.kernels import qgemv_words

        return qgemv_words.int8_words_gemv(x, qweight, scales, gated, g, eps, r, bias, act, **p)
    if kind == "int8":
        return qgemv_triton.int8_gemv(x, qweight, scales, gated, g, eps, r, bias, act, **p)
    if uses_dp4a(qweight, group):
        from tinyllm.kernels import qgemv_dp4a

        return qgemv_dp4a.int4_dp4a_gemv(x, qweight, scales, zeros, group, gated, g, eps, r, bias, act, **p)
    if SWITCHES.int4_kernel == "bytes":  # TINYLLM_INT4_KERNEL=bytes: the kernel before qgemv_words
        return qgemv_triton.int4_gemv(x, qweight, scales, zeros, group, gated, g, eps, r, bias, act, **p)
    from tinyllm.kernels import qgemv_words

    return qgemv_words.int4_words_gemv(x, qweight, scales, zeros, group, gated, g, eps, r, bias, act, **p)


def add_norm(x: Tensor, y: Tensor, norm: tuple[Tensor, float]) -> Tensor:
    """x + RMSNorm(y), (..., C) each (see the module docstring)."""
    from tinyllm.kernels import qgemv_triton

    c = x.shape[-1]
    out = qgemv_triton.add_rmsnorm(x.reshape(-1, c).contiguous(), y.reshape(-1, c).contiguous(), norm[0], norm[1])
    return out.view(x.shape)
