"""The int4 product on x rounded to int8: four weights a `dp4a` instruction (TINYLLM_INT4_DP4A=1).

Contract: importing this module imports Triton (tinyllm.kernels.qgemv imports it only where the
switch is on) and registers two custom ops.
- `torch.ops.tinyllm.quantize_x(x, norm, eps) -> (xq, xd, xs)`: x (M, K) in groups of 32 (K a
  multiple of 32), first put through RMSNorm(norm, eps) where `norm` is given (in fp32, as the
  fused products do). Each group's values v are rounded to int8 on its own scale d = max|v| / 127,
  q = floor(v / d + 1/2), and stored as 8 int32 words: words 0-3 hold, for each run of 8 values,
  its even values' bytes, words 4-7 its odd values' (the order a packed int4 word's masked
  nibbles come in); xq (M, K/4) int32, xd (M, K/32) fp32 the scales d, xs (M, K/32) fp32 each
  group's sum of its rounded values, d * sum(q).
- `torch.ops.tinyllm.int4_dp4a_gemv(...)`: `qgemv_triton.int4_gemv`'s arguments and result for
  a W of groups of 32, computed as sum over groups of s * d * (q_w . q_x) + z * xs, the integer
  dot products exact: it is the product of x rounded this way (`reference(x)`: q * d) with the
  dequantized W, to fp32 rounding order. It differs from x @ W.T by x's rounding, about 0.5% of
  a group's largest value an element: llama.cpp's MMVQ rounds x the same way (its Q8_1 blocks).

Why: `qgemv_triton._int4_kernel` turns each nibble into a float in three ops and multiplies it by
x in fp32: 22-35 thread instructions a weight byte on sm_90 (scripts/qgemv_sass.py), which caps
it at 1-1.5 TB/s on an H200 however its blocks are cut. Here a word of 8 nibbles is two masks
(the even nibbles' bytes, the odd ones') and two `dp4a`s against x's bytes, and x is rounded
once per product (one small kernel, one program a row) instead of widened again by every row.
Under Triton's interpreter (the CPU tests) `dp4a` is the same integer sum written out.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from tinyllm.kernels import pdl, qgemv_words
from tinyllm.kernels.qgemv_triton import _block_rows, _cut, _fused_args, _launch, _sms, _store, int4_fake, int4_shapes

GROUP = 32  # values a group of x and of W: Q4_0, Q4_1 and Q4_K's blocks


@triton.jit
def _quantize_x_kernel(x_ptr, g_ptr, q_ptr, d_ptr, s_ptr, eps, K: tl.constexpr, BLOCK_G: tl.constexpr,
                       NORM: tl.constexpr = False, PDL: tl.constexpr = False):
    """Row m of x -> its int8 groups, their scales and their sums (the module docstring)."""
    m = tl.program_id(0)
    groups: tl.constexpr = K // 32
    rg = tl.arange(0, BLOCK_G)  # (BG,)
    rj = tl.arange(0, 32)  # (32,)
    if PDL:  # x is the kernel before's output
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    rs = 1.0
    if NORM:
        ss = tl.zeros((BLOCK_G, 32), dtype=tl.float32)
        for g0 in range(0, groups, BLOCK_G):
            k = (g0 + rg)[:, None] * 32 + rj[None, :]  # (BG, 32)
            v = tl.load(x_ptr + m * K + k, mask=k < K, other=0.0).to(tl.float32)
            ss += v * v
        rs = tl.rsqrt(tl.sum(tl.sum(ss, axis=1), axis=0) / K + eps)
    for g0 in range(0, groups, BLOCK_G):
        g = g0 + rg
        k = g[:, None] * 32 + rj[None, :]  # (BG, 32)
        ok = k < K
        v = tl.load(x_ptr + m * K + k, mask=ok, other=0.0).to(tl.float32)
        if NORM:
            v = v * rs * tl.load(g_ptr + k, mask=ok, other=0.0).to(tl.float32)
        d = tl.max(tl.abs(v), axis=1) / 127.0  # (BG,)
        qf = tl.floor(v * (1.0 / tl.maximum(d, 1e-30))[:, None] + 0.5)  # (BG, 32) in -127..127 (a group of 0s: 0s)
        q = qf.to(tl.int32)
        # value 8c + 2i + p (run c, byte i, parity p) -> word 4p + c, byte i
        q = tl.reshape(q & 255, (BLOCK_G, 4, 4, 2))  # (g, c, i, p)
        q = tl.reshape(tl.permute(q, (0, 3, 1, 2)), (BLOCK_G, 8, 4))  # (g, 4p + c, i)
        words = tl.sum(q << (8 * tl.arange(0, 4))[None, None, :], axis=2)  # (BG, 8): disjoint bytes, a sum is an OR
        rw = tl.arange(0, 8)
        g_ok = g < groups
        tl.store(q_ptr + m * (K // 4) + g[:, None] * 8 + rw[None, :], words, mask=g_ok[:, None])
        tl.store(d_ptr + m * groups + g, d, mask=g_ok)
        tl.store(s_ptr + m * groups + g, d * tl.sum(qf, axis=1), mask=g_ok)


@triton.jit
def _dp4a(a, b, c, DP4A: tl.constexpr):
    """c + the four products of a's unsigned bytes and b's signed ones, (...) int32 each."""
    if DP4A:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:  # the interpreter: the same sum written out
        for i in tl.static_range(4):
            c += ((a >> (8 * i)) & 255) * ((b << (24 - 8 * i)) >> 24)
        return c


@triton.jit
def _dp4a_kernel(q_ptr, d_ptr, xs_ptr, w_ptr, s_ptr, z_ptr, y_ptr, r_ptr, b_ptr, N, K: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HALVES: tl.constexpr = 1, RES: tl.constexpr = False,
                 BIAS: tl.constexpr = False, ACT: tl.constexpr = 0, PDL: tl.constexpr = False,
                 DP4A: tl.constexpr = True,
                 o_ptr=None, p_ptr=None, c_ptr=None, peps=0.0, POST: tl.constexpr = False, BLOCK_C: tl.constexpr = 1):
    """qgemv_triton._int4_kernel's walk (BLOCK_N rows of each half a program, BLOCK_K values a
    step, the next step's weights loaded before this one's are used), on W's packed words and x's
    int8 words: (R, groups a step, 4) words of each."""
    NG: tl.constexpr = BLOCK_K // 32  # groups a step
    groups: tl.constexpr = K // 32
    pid_n, m = tl.program_id(0), tl.program_id(1)
    rn, row = _block_rows(pid_n, N, BLOCK_N, HALVES)  # (R,) each
    n_ok = rn < N
    rg = tl.arange(0, NG)
    rw = tl.arange(0, 4)  # a group's 4 words of W (32 nibbles): 16 bytes, one load
    word = rg[:, None] * 4 + rw[None, :]  # (NG, 4)
    rows = w_ptr + row[:, None, None] * (K // 8)  # (R, 1, 1): W as int32 words
    w = tl.load(rows + word[None, :, :], mask=n_ok[:, None, None] & (rg < groups)[None, :, None], other=0)
    if PDL:  # the weights before the wait: x's words are the kernel before's output
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros((HALVES * BLOCK_N, NG), dtype=tl.float32)
    for g0 in range(0, groups, NG):
        g = g0 + rg  # (NG,)
        ok = n_ok[:, None] & (g < groups)[None, :]  # (R, NG)
        ok3 = ok[:, :, None] & (rw >= 0)[None, None, :]  # (R, NG, 4)
        w_next = tl.load(rows + (word[None, :, :] + NG * 4),
                         mask=n_ok[:, None, None] & (g + NG < groups)[None, :, None], other=0)
        xw = g[None, :, None] * 8 + rw[None, None, :] + 0 * rn[:, None, None]  # (R, NG, 4): x in w's layout
        xe = tl.load(q_ptr + m * (K // 4) + xw, mask=ok3, other=0)  # even values' bytes
        xo = tl.load(q_ptr + m * (K // 4) + xw + 4, mask=ok3, other=0)  # odd values'
        dot = _dp4a(w & 0x0F0F0F0F, xe, tl.zeros_like(w), DP4A)  # the low nibbles: even values
        dot = _dp4a((w >> 4) & 0x0F0F0F0F, xo, dot, DP4A)
        qx = tl.sum(dot, axis=2).to(tl.float32)  # (R, NG): q_w . q_x over each group, exact
        gi = g[None, :] + 0 * rn[:, None]  # (R, NG)
        xd = tl.load(d_ptr + m * groups + gi, mask=ok, other=0.0)
        xs = tl.load(xs_ptr + m * groups + gi, mask=ok, other=0.0)
        s = tl.load(s_ptr + row[:, None] * groups + g[None, :], mask=ok, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + row[:, None] * groups + g[None, :], mask=ok, other=0.0).to(tl.float32)
        acc += s * xd * qx + z * xs
        w = w_next
    y = tl.sum(acc, axis=1)  # (R,)
    if BIAS:
        y += tl.load(b_ptr + row, mask=n_ok, other=0.0).to(tl.float32)
    _store(y_ptr, y, m, pid_n, N, BLOCK_N, HALVES, r_ptr, RES, ACT, o_ptr, p_ptr, c_ptr, peps, POST, BLOCK_C)


@torch.library.custom_op("tinyllm::quantize_x", mutates_args=())
def quantize_x(x: Tensor, norm: Tensor | None = None, eps: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    m, k = x.shape
    torch._check(k % GROUP == 0 and x.is_contiguous(), lambda: "quantize_x: x is not contiguous (M, 32 j)")
    torch._check(norm is None or norm.shape == (k,), lambda: "quantize_x: the norm's weights are not (K,)")
    xq = torch.empty((m, k // 4), dtype=torch.int32, device=x.device)
    xd = torch.empty((m, k // GROUP), dtype=torch.float32, device=x.device)
    xs = torch.empty_like(xd)
    groups = k // GROUP
    _quantize_x_kernel[(m,)](x, x if norm is None else norm, xq, xd, xs, eps, k,
                             BLOCK_G=min(triton.next_power_of_2(groups), 32), NORM=norm is not None,
                             **pdl.launch_options(x.device), num_warps=4)
    return xq, xd, xs


@quantize_x.register_fake
def _(x: Tensor, norm: Tensor | None = None, eps: float = 0.0) -> tuple[Tensor, Tensor, Tensor]:
    m, k = x.shape
    d = x.new_empty((m, k // GROUP), dtype=torch.float32)
    return x.new_empty((m, k // 4), dtype=torch.int32), d, torch.empty_like(d)


@torch.library.custom_op("tinyllm::int4_dp4a_gemv", mutates_args=())
def int4_dp4a_gemv(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor, group: int, gated: bool = False,
                   norm: Tensor | None = None, eps: float = 0.0, residual: Tensor | None = None,
                   bias: Tensor | None = None, act: str = "silu", post: Tensor | None = None, post_eps: float = 0.0,
                   done: Tensor | None = None) -> Tensor:
    torch._check(group == GROUP and x.shape[1] % GROUP == 0, lambda: "int4_dp4a_gemv: groups of 32 only")
    m, k, n, halves = int4_shapes("int4_dp4a_gemv", x, qweight, scales, zeros, group, gated)
    _, r, b, flags = _fused_args(x, n * halves, n, norm, residual, bias, act, post, post_eps, done)
    del flags["NORM"]  # the norm is quantize_x's
    xq, xd, xs = quantize_x(x, norm, eps)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_n, _, warps = _cut(n, k, 0.5, gated, x.device)
    block_n = qgemv_words.rows_for(block_n, n, halves, _sms(x.device))  # the words kernel's tile: its
    block_k = qgemv_words.step_for(k, GROUP, warps)  # reasons hold here (x's words serve every row)
    _launch(_dp4a_kernel, n, m, warps, xq, xd, xs, qweight.view(torch.int32), scales, zeros, y, r, b, n, k,
            BLOCK_N=block_n, BLOCK_K=block_k, HALVES=halves, DP4A=x.is_cuda, **flags)
    return y


int4_dp4a_gemv.register_fake(int4_fake)


def reference(x: Tensor, norm: Tensor | None = None, eps: float = 0.0) -> Tensor:
    """x (M, K) as quantize_x rounds it, back in fp32 (q * d): int4_dp4a_gemv's slow twin is
    reference(x, norm, eps) @ W.dequantize().T."""
    v = x.float()
    if norm is not None:
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * norm.float()
    groups = v.view(v.shape[0], -1, GROUP)  # (M, K/32, 32)
    d = groups.abs().amax(-1, keepdim=True) / 127.0
    q = torch.floor(groups * (1.0 / d.clamp_min(1e-30)) + 0.5)
    return (q * d).view_as(v)
