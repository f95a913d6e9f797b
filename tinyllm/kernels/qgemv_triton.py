"""The Triton kernels behind `tinyllm.kernels.qgemv`: quantized matrix-vector products for decode.

Contract: importing this module imports Triton (it fails where Triton is missing: import
`tinyllm.kernels.qgemv` instead, which guards) and registers two custom ops, each y = x @ W.T for a
QTensor W in canonical form (tinyllm.core.quant), x (M, K) contiguous in bf16 / fp16 / fp32,
y (M, N) in x's dtype, fp32 accumulation:
- `torch.ops.tinyllm.int8_gemv(x, qweight, scales)`: qweight int8 (N, K), scales (N,);
- `torch.ops.tinyllm.int4_gemv(x, qweight, scales, zeros, group)`: qweight uint8 (N, K/2)
  (element 2j in the low nibble), scales and zeros (N, K/g), w = q * s + z, g = group.
- `torch.ops.tinyllm.dense_gemv(x, weight)`: weight a dense (N, K) matrix of any float dtype
  (bf16 on CUDA), contiguous: the same walk with no scales (tinyllm.core.linear.DenseLinear on CUDA);
- `torch.ops.tinyllm.add_rmsnorm(x, y, weight, eps)`: x + RMSNorm(y), one row a program, rounded as
  model.RMSNorm and the add are (Gemma's post-norms and their skip connection).
With `gated=True` W holds 2F rows, a gated FFN's gate then up, and each product op returns
act(x @ gate.T) * (x @ up.T), (M, F), act silu or gelu_tanh (`act`): one kernel instead of the
product and the gating. `bias` (the weight rows' biases, Qwen 2's QKV) is added to each row's
product before the gating and the residual.
Two more optional arguments fold a decode step's neighbours into the same kernel:
- `norm` (K,) and `eps`: the product is of RMSNorm(x) = x * rsqrt(mean(x ** 2) + eps) * norm
  (model.RMSNorm) instead of x, in fp32 throughout (the module rounds to x's dtype twice);
- `residual` (M, N) contiguous: the result is residual + the product (a block's skip
  connection), added in fp32 and rounded once.
Both read the weights in place, once per row of x: they are for M of a few rows (batch-1 or
small-batch decode), where the step is bound by the bytes of W.

One kernel per format, grid (cdiv(N, BLOCK_N), M): a program owns BLOCK_N output features of
one row of x and walks K in BLOCK_K steps. Int8 keeps a (BLOCK_N, BLOCK_K) fp32 accumulator
that it sums once at the end. Int4 walks whole groups, blocks of (BLOCK_N, groups a step, g/2
bytes): it sums q x and x over each group, then applies the group's scale and offset once.
Scales and offsets may be any float dtype (tinyllm.core.quant holds them exactly, fp16 or fp32).
- BLOCK_N is the largest that still gives the rule's programs per SM, so a narrow matrix
  is spread over the whole GPU (cuBLAS's batch-1 product was measured on 40 of 132 SMs).
- K is a compile-time constant, so the compiler sees each row's start aligned and loads 16
  bytes at a time. As a plain argument, traced with dynamic shapes, it lost that, and the
  compiled step's products ran 2.3x slower (1.43 ms a token against 0.61 ms for the same
  kernels in the plain step, 1.1B int8).
- Integers become floats through the exponent trick at TWO23, with no conversion instruction
  (the int8 loop had one I2F a weight), and x is loaded in the weights' own register layout
  (a broadcast vector was moved into it through shared memory: 34 barriers a step of the
  int8 loop). Both were read off the kernels compiled for sm_90 (tests/tinyllm/test_qgemv.py
  checks them without a GPU); on the H200 they changed nothing measurable.
- With a norm, each program sums x ** 2 itself (x is a few KB, read from L2 by every program
  anyway) and scales its results by the rsqrt at the end: the norm is no kernel of its own,
  and neither is the residual add (the 1.1B step's 44 add + RMSNorm kernels).
- Each step loads the next step's weights before it uses its own, and the first step's are
  loaded before the kernel waits on the one before it (PDL, tinyllm.kernels.pdl): weights are the
  only bytes a product reads that no kernel of the step writes. (Asking for all of a
  program's rows at once, a bulk L2 prefetch before the wait, made the 1.1B step slower on
  the H200, 861 -> 915 us: docs/BENCHMARKS-LOG.md.)

The ops are `torch.library.custom_op`s that launch the kernels themselves: a compiled step
(Inductor) calls them as opaque ops, with no graph break, and CUDA graphs capture the launches.
They used to be `triton_op`s, whose launches Inductor writes into its own code; that code
cannot launch with PDL, and under dynamic shapes it passed K as a plain argument (above).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from tinyllm.kernels import pdl
from tinyllm.kernels.switches import SWITCHES


class Rule(NamedTuple):
    """How a product's work is cut into programs (blocks(), _launch())."""
    per_sm: int  # programs per SM
    k_bytes: int  # weight bytes of a row a program reads per step
    warps: int  # warps a program
    max_steps: int  # the most steps a row (0: no limit)
    whole_row: int  # rows up to this many bytes are read whole, two a program, where one row a program would do (0: never)


# TINYLLM_QGEMV_BLOCKS="P,B,W,S,R" overrides the rule of every product (tuning on another GPU:
# scripts/qgemv_sweep.py times each matrix alone, scripts/step_rules.py a rule inside the
# compiled step). On the H200 (docs/BENCHMARKS-LOG.md), the 1.1B int8 step:
# 16 programs per SM 815 -> 772 us, at most 8 steps 772 -> 725-729; SmolLM2's int4 step (rows
# of 288 and 768 bytes) with its short rows whole, two a program: 1,232 -> 1,398 tok/s. The
# 1.1B's rows of 2 KB read that way ran slower (725 -> 737 us), so only rows up to 1 KB do.
_OVERRIDE = SWITCHES.qgemv_blocks
RULE = Rule(*(int(v) for v in ((_OVERRIDE or "16,512,4,8,1024") + ",0,0").split(",")[:5]))
# Gate and up (gated) on 2 warps: in the compiled step on the H200 (scripts/step_rules.py):
# SmolLM2's int4 step 706 -> 667 us, the 1.1B's int8 step 724 -> 723; no
# other matrix of either step gained more than the noise (1-2 us) from any rule tried.
GATED = RULE if _OVERRIDE else RULE._replace(warps=2)


# Narrow dense 16-bit products (N <= 4,096, K >= 2,048: a 1B's QKV, O and down) on 4 programs an SM
# of 8 warps in 1,024-value steps. Each matrix alone, in a graph, from memory, on the H100
# (scripts/qgemv_sweep.py, SWEEP_MODELS=1b, the Llama-3.2-1B shape): QKV 3,072 x 2,048 5.76 -> 5.02 us,
# O 2,048 x 2,048 -> 3.25 (its best of every rule swept), down 2,048 x 8,192 -> 11.9; cuBLAS 6.7, 6.2, 15.0.
# Gate and up and the wide output product keep their rules (no rule swept beat them).
# On a GPU with few SMs its programs take more rows, and where a thread's accumulator would pass MAX_ACC values
# (the sweep's bound: beyond it, spills) the product keeps RULE.
DENSE_NARROW = Rule(4, 2048, 8, 0, 0)
MAX_ACC = 64


def rule_for(n: int, k: int, bytes_per_value: float, gated: bool) -> Rule:
    """The rule of an (n, k) product (n counts both halves of a gated one)."""
    if gated:
        return GATED
    if not _OVERRIDE and bytes_per_value == 2 and n <= 4096 and k >= 2048:
        return DENSE_NARROW
    return RULE


# Integers to fp32 without the converter: OR-ing an integer 0..255 into the low mantissa bits
# of 2**23 (bits 0x4B000000) gives the float 2**23 + that integer exactly, and one exact
# subtraction gives it back. That is a logic op and an add, both full rate, where a conversion
# instruction (I2F) runs at a quarter of the rate on an H100/H200 and, at one per weight,
# can bound a matrix-vector product that should be bound by memory.
TWO23 = tl.constexpr(8388608.0)


@triton.jit
def _block_rows(pid_n, N, BLOCK_N: tl.constexpr, HALVES: tl.constexpr):
    """The program's rows: (output feature, weight row), each (HALVES * BLOCK_N,). With two
    halves the weights hold 2N rows, gate then up, and the block takes its features' rows of
    both."""
    r = tl.arange(0, HALVES * BLOCK_N)
    rn = pid_n * BLOCK_N + r % BLOCK_N
    return rn, (r // BLOCK_N) * N + rn


@triton.jit
def _finish(y, ss, row, n_ok, b_ptr, eps, K: tl.constexpr, NORM: tl.constexpr, BIAS: tl.constexpr):
    """A block's sums y (R,) fp32 -> the product's values: scaled by the norm's rsqrt (NORM:
    RMSNorm(x) @ W.T = rsqrt(mean(x ** 2) + eps) ((x * g) @ W.T), ss the steps' x ** 2), plus
    each weight row's bias (BIAS: b_ptr[row], before any gating)."""
    if NORM:
        y *= tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
    if BIAS:
        y += tl.load(b_ptr + row, mask=n_ok, other=0.0).to(tl.float32)
    return y


@triton.jit
def _store(y_ptr, y, m, pid_n, N, BLOCK_N: tl.constexpr, HALVES: tl.constexpr, r_ptr, RES: tl.constexpr,
           ACT: tl.constexpr = 0, o_ptr=None, p_ptr=None, c_ptr=None, peps=0.0, POST: tl.constexpr = False,
           BLOCK_C: tl.constexpr = 1):
    """y (HALVES * BLOCK_N,) fp32 -> y_ptr[m, the block's features]: as it is, or, with two
    halves, act(gate) * up (ACT 0: silu, 1: gelu with the tanh approximation); with RES, plus
    the residual r_ptr[m, those features]. With POST (a post-norm: _post), the residual plus the
    RMSNorm of the whole row of products instead."""
    if HALVES == 2:
        gate, up = tl.split(tl.permute(tl.reshape(y, (2, BLOCK_N)), (1, 0)))  # (BLOCK_N,) each
        if ACT == 0:
            y = gate * tl.sigmoid(gate) * up
        else:  # gelu_tanh(x) = x (1 + tanh(u)) / 2 = x sigmoid(2u), u = sqrt(2 / pi) (x + 0.044715 x^3)
            u = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
            y = gate * tl.sigmoid(2.0 * u) * up
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if POST:
        _post(y_ptr, y, m, rn, N, r_ptr, o_ptr, p_ptr, c_ptr, peps, BLOCK_C)
    else:
        if RES:
            y += tl.load(r_ptr + m * N + rn, mask=rn < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + m * N + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def _add_norm_row(x_ptr, o_ptr, g_ptr, out_ptr, m, eps, C, BLOCK_C: tl.constexpr, CG: tl.constexpr = False):
    """out[m] = x[m] + RMSNorm(o[m]) for one row of C values, rounded as model.RMSNorm and the add
    are: the norm in fp32, rounded to o's dtype, times the weights (rounded), plus x (rounded).
    CG: o read from L2 (written by other programs of the same kernel)."""
    c = tl.arange(0, BLOCK_C)
    ok = c < C
    if CG:
        o = tl.load(o_ptr + m * C + c, mask=ok, other=0.0, cache_modifier=".cg")
    else:
        o = tl.load(o_ptr + m * C + c, mask=ok, other=0.0)
    of = o.to(tl.float32)
    r = tl.rsqrt(tl.sum(of * of, axis=0) / C + eps)
    normed = ((of * r).to(o.dtype) * tl.load(g_ptr + c, mask=ok, other=0.0)).to(o.dtype)
    x = tl.load(x_ptr + m * C + c, mask=ok, other=0.0)
    tl.store(out_ptr + m * C + c, (x + normed).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _post(y_ptr, y, m, rn, N, r_ptr, o_ptr, p_ptr, c_ptr, peps, BLOCK_C: tl.constexpr):
    """A post-norm inside the product (Gemma 2/3): y_ptr[m] = r[m] + RMSNorm(o[m]) with weights
    p_ptr, o[m] the whole row of products. Each program stores its products in o (rounded, as the
    product alone returns them) and counts itself done in c_ptr[m]; the row's last program (the
    count's old value is the row's programs less one: every other store is visible to it, the
    count being acquire-release) normalizes the whole row, adds the residual, and puts the count
    back to 0 for the next launch."""
    tl.store(o_ptr + m * N + rn, y.to(o_ptr.dtype.element_ty), mask=rn < N)
    done = tl.atomic_add(c_ptr + m, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:
        _add_norm_row(r_ptr, o_ptr, p_ptr, y_ptr, m, peps, N, BLOCK_C, True)
        tl.atomic_xchg(c_ptr + m, 0, sem="relaxed", scope="gpu")


@triton.jit
def _normed(x, g_ptr, k, ok, NORM: tl.constexpr):
    """x (R, BLOCK_K) fp32 times the norm's weights at k, in x's layout, with NORM; else x."""
    if NORM:
        x = x * tl.load(g_ptr + k, mask=ok, other=0.0).to(tl.float32)
    return x


@triton.jit
def _squares(x_ptr, m, k0, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """x[m, k0:k0 + BLOCK_K] ** 2, (BLOCK_K,) fp32: one step's share of the RMS norm (summed
    once, after the loop: a sum across warps each step would cost a barrier each step)."""
    k = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + m * K + k, mask=k < K, other=0.0).to(tl.float32)
    return x * x


@triton.jit
def _int8_kernel(x_ptr, w_ptr, s_ptr, y_ptr, g_ptr, r_ptr, b_ptr, eps, N, K: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, HALVES: tl.constexpr = 1, NORM: tl.constexpr = False, RES: tl.constexpr = False,
                 BIAS: tl.constexpr = False, ACT: tl.constexpr = 0, PDL: tl.constexpr = False,
                 o_ptr=None, p_ptr=None, c_ptr=None, peps=0.0, POST: tl.constexpr = False, BLOCK_C: tl.constexpr = 1):
    pid_n, m = tl.program_id(0), tl.program_id(1)
    rn, row = _block_rows(pid_n, N, BLOCK_N, HALVES)  # (R,) each, R = HALVES * BLOCK_N
    rk = tl.arange(0, BLOCK_K)  # (BLOCK_K,)
    n_ok = rn < N
    rows = w_ptr + row[:, None] * K  # (R, 1)
    # The first step's weights are loaded before waiting on the kernel before (PDL: tinyllm.kernels.pdl):
    # no kernel of a step writes them. Each step then loads the next step's weights first.
    w = tl.load(rows + rk[None, :], mask=n_ok[:, None] & (rk[None, :] < K), other=0)  # (R, BLOCK_K) int8
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros((HALVES * BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)  # with NORM: x ** 2, summed over the steps
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        ok = n_ok[:, None] & (k[None, :] < K)
        w_next = tl.load(rows + (k[None, :] + BLOCK_K), mask=n_ok[:, None] & (k[None, :] + BLOCK_K < K), other=0)
        u = w.to(tl.uint8, bitcast=True).to(tl.int32)  # q + 256 for q < 0: (q + 128) = u ^ 0x80
        q = (u ^ 0x4B000080).to(tl.float32, bitcast=True) - (TWO23 + 128.0)  # q, exactly
        # x loaded once per row of the block, in w's own layout: a broadcast (BLOCK_K,) vector
        # would be moved into that layout through shared memory, with barriers, every step
        kk = k[None, :] + 0 * rn[:, None]  # (R, BLOCK_K)
        x = tl.load(x_ptr + m * K + kk, mask=ok, other=0.0).to(tl.float32)
        acc += q * _normed(x, g_ptr, kk, ok, NORM)
        if NORM:
            ss += _squares(x_ptr, m, k0, K, BLOCK_K)
        w = w_next
    y = tl.sum(acc, axis=1) * tl.load(s_ptr + row, mask=n_ok, other=0.0).to(tl.float32)
    y = _finish(y, ss, row, n_ok, b_ptr, eps, K, NORM, BIAS)
    _store(y_ptr, y, m, pid_n, N, BLOCK_N, HALVES, r_ptr, RES, ACT, o_ptr, p_ptr, c_ptr, peps, POST, BLOCK_C)


@triton.jit
def _int4_kernel(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, g_ptr, r_ptr, b_ptr, eps, N, K: tl.constexpr, G: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HALVES: tl.constexpr = 1, NORM: tl.constexpr = False,
                 RES: tl.constexpr = False, BIAS: tl.constexpr = False, ACT: tl.constexpr = 0, PDL: tl.constexpr = False,
                 o_ptr=None, p_ptr=None, c_ptr=None, peps=0.0, POST: tl.constexpr = False, BLOCK_C: tl.constexpr = 1):
    NG: tl.constexpr = BLOCK_K // G  # groups a step
    pid_n, m = tl.program_id(0), tl.program_id(1)
    rn, row = _block_rows(pid_n, N, BLOCK_N, HALVES)  # (R,) each, R = HALVES * BLOCK_N
    rg = tl.arange(0, NG)  # (NG,)
    rj = tl.arange(0, G // 2)  # byte j of a group holds its elements 2j and 2j + 1
    n_ok = rn < N
    groups = K // G
    rows = w_ptr + row[:, None, None] * (K // 2)  # (R, 1, 1)
    # As in _int8_kernel: the first step's bytes before the wait, then each step loads the next's.
    byte = rg[:, None] * (G // 2) + rj[None, :]  # (NG, G/2), written so it is seen contiguous
    b = tl.load(rows + byte[None, :, :], mask=n_ok[:, None, None] & (rg < groups)[None, :, None],
                other=0).to(tl.int32)  # (R, NG, G/2)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros((HALVES * BLOCK_N, NG), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)  # with NORM: x ** 2, summed over the steps
    for g0 in range(0, groups, NG):
        g = g0 + rg  # (NG,)
        ok = n_ok[:, None] & (g < groups)[None, :]  # (R, NG)
        ok3 = ok[:, :, None] & (rj >= 0)[None, None, :]  # (R, NG, G/2)
        byte = g[:, None] * (G // 2) + rj[None, :]  # (NG, G/2)
        b_next = tl.load(rows + (byte[None, :, :] + NG * (G // 2)),
                         mask=n_ok[:, None, None] & (g + NG < groups)[None, :, None], other=0).to(tl.int32)
        lo = ((b & 15) | 0x4B000000).to(tl.float32, bitcast=True) - TWO23  # element 2j, exactly
        hi = ((b >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - TWO23  # element 2j + 1
        # x in the weights' layout (see _int8_kernel), even and odd elements
        ke = 2 * byte[None, :, :] + 0 * rn[:, None, None]  # (R, NG, G/2): even elements
        xe = _normed(tl.load(x_ptr + m * K + ke, mask=ok3, other=0.0).to(tl.float32), g_ptr, ke, ok3, NORM)
        xo = _normed(tl.load(x_ptr + m * K + ke + 1, mask=ok3, other=0.0).to(tl.float32), g_ptr, ke + 1, ok3, NORM)
        if NORM:
            ss += _squares(x_ptr, m, g0 * G, K, BLOCK_K)
        qx = tl.sum(lo * xe + hi * xo, axis=2)  # (R, NG): sum over the group of q x
        xs = tl.sum(xe + xo, axis=2)  # (R, NG): of x
        s = tl.load(s_ptr + row[:, None] * groups + g[None, :], mask=ok, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + row[:, None] * groups + g[None, :], mask=ok, other=0.0).to(tl.float32)
        acc += s * qx + z * xs
        b = b_next
    y = _finish(tl.sum(acc, axis=1), ss, row, n_ok, b_ptr, eps, K, NORM, BIAS)
    _store(y_ptr, y, m, pid_n, N, BLOCK_N, HALVES, r_ptr, RES, ACT, o_ptr, p_ptr, c_ptr, peps, POST, BLOCK_C)


@triton.jit
def _dense_kernel(x_ptr, w_ptr, y_ptr, g_ptr, r_ptr, b_ptr, eps, N, K: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, HALVES: tl.constexpr = 1, NORM: tl.constexpr = False,
                  RES: tl.constexpr = False, BIAS: tl.constexpr = False, ACT: tl.constexpr = 0,
                  PDL: tl.constexpr = False,
                  o_ptr=None, p_ptr=None, c_ptr=None, peps=0.0, POST: tl.constexpr = False, BLOCK_C: tl.constexpr = 1):
    """_int8_kernel's walk over a dense 16-bit W (bf16 / fp16): no scales, no conversion trick."""
    pid_n, m = tl.program_id(0), tl.program_id(1)
    rn, row = _block_rows(pid_n, N, BLOCK_N, HALVES)  # (R,) each, R = HALVES * BLOCK_N
    rk = tl.arange(0, BLOCK_K)  # (BLOCK_K,)
    n_ok = rn < N
    rows = w_ptr + row[:, None] * K  # (R, 1)
    w = tl.load(rows + rk[None, :], mask=n_ok[:, None] & (rk[None, :] < K), other=0.0)  # (R, BLOCK_K)
    if PDL:  # as in _int8_kernel: the first step's weights before the wait
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros((HALVES * BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        ok = n_ok[:, None] & (k[None, :] < K)
        w_next = tl.load(rows + (k[None, :] + BLOCK_K), mask=n_ok[:, None] & (k[None, :] + BLOCK_K < K), other=0.0)
        kk = k[None, :] + 0 * rn[:, None]  # (R, BLOCK_K): x in w's layout (see _int8_kernel)
        x = tl.load(x_ptr + m * K + kk, mask=ok, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * _normed(x, g_ptr, kk, ok, NORM)
        if NORM:
            ss += _squares(x_ptr, m, k0, K, BLOCK_K)
        w = w_next
    y = _finish(tl.sum(acc, axis=1), ss, row, n_ok, b_ptr, eps, K, NORM, BIAS)
    _store(y_ptr, y, m, pid_n, N, BLOCK_N, HALVES, r_ptr, RES, ACT, o_ptr, p_ptr, c_ptr, peps, POST, BLOCK_C)


@functools.cache
def _sms(device: torch.device) -> int:
    if device.type != "cuda":  # Triton's interpreter (the CPU tests), which runs each program in turn: few, wide ones
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def blocks(n: int, k: int, bytes_per_value: float, min_programs: int, k_bytes: int,
           max_steps: int = 0, whole_row: int = 0) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) for an (N, K) matrix: BLOCK_K values make k_bytes bytes of a row,
    or more where a row would take over max_steps steps (0: no limit), at most K rounded up to
    a power of two; BLOCK_N the largest of 1..64 that leaves at least min_programs programs for
    one row of x. Where that is 1 and a row is at most whole_row bytes (0: never), a program
    takes 2 whole rows in one step instead: a short row alone is too little work a program."""
    block_k = int(k_bytes / bytes_per_value)
    if max_steps:  # the 1.1B down projection (K 5632): 1,024-byte steps, 7.6 -> 5.5 us on the H200
        block_k = max(block_k, triton.next_power_of_2(triton.cdiv(k, max_steps)))
    block_k = min(block_k, triton.next_power_of_2(k))
    block_n = 64
    while block_n > 1 and triton.cdiv(n, block_n) < min_programs:
        block_n //= 2
    if block_n == 1 and k * bytes_per_value <= whole_row:
        return 2, triton.next_power_of_2(k)
    return block_n, block_k


def _cut(n: int, k: int, bytes_per_value: float, gated: bool, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps) of an op's launch: n output features, of both halves if gated."""
    halves = 1 + gated
    rule = rule_for(n * halves, k, bytes_per_value, gated)
    block_n, block_k = blocks(n * halves, k, bytes_per_value, rule.per_sm * _sms(device), rule.k_bytes,
                              rule.max_steps, rule.whole_row)
    if rule is DENSE_NARROW and block_n * block_k > MAX_ACC * 32 * rule.warps:  # few SMs: its tiles would spill
        rule = RULE
        block_n, block_k = blocks(n, k, bytes_per_value, rule.per_sm * _sms(device), rule.k_bytes, rule.max_steps,
                                  rule.whole_row)
    return max(block_n // halves, 1), block_k, rule.warps


def _launch(kernel, n: int, m: int, warps: int, *args, **meta) -> None:
    """One launch over (cdiv(N, BLOCK_N), M) programs, with PDL where tinyllm.kernels.pdl allows it."""
    kernel[(triton.cdiv(n, meta["BLOCK_N"]), m)](*args, **meta, **pdl.launch_options(args[0].device),
                                                  num_warps=warps)


def _outputs(qweight: Tensor, gated: bool) -> int:
    return qweight.shape[0] // 2 if gated else qweight.shape[0]


ACTS = {"silu": 0, "gelu_tanh": 1}  # a gated product's activation -> its kernels' ACT


def _fused_args(x: Tensor, rows: int, n: int, norm: Tensor | None, residual: Tensor | None, bias: Tensor | None,
                act: str, post: Tensor | None = None, post_eps: float = 0.0,
                done: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, dict]:
    """The norm's weights, the residual and the bias to pass (x where absent: never read), and
    their constexprs. rows: the weight rows (2n when gated), which the bias runs along. With a
    post-norm (`post` (N,), `post_eps`, `done` an int32 count a row of x, all 0), the flags carry
    _post's arguments too: its scratch row of products is made here."""
    torch._check(norm is None or norm.shape == (x.shape[1],), lambda: "qgemv: the norm's weights are not (K,)")
    torch._check(residual is None or (residual.shape == (x.shape[0], n) and residual.is_contiguous()),
                 lambda: "qgemv: the residual is not a contiguous (M, N)")
    torch._check(bias is None or (bias.shape == (rows,) and bias.is_contiguous()),
                 lambda: "qgemv: the bias is not a contiguous (N,)")
    torch._check(act in ACTS, lambda: f"qgemv: unknown activation {act}")
    flags = {"NORM": norm is not None, "RES": residual is not None, "BIAS": bias is not None, "ACT": ACTS[act]}
    if post is not None:
        torch._check(residual is not None and rows == n and post.shape == (n,) and done is not None
                     and done.dtype == torch.int32 and done.numel() >= x.shape[0],
                     lambda: "qgemv: a post-norm needs a residual, no gating, weights (N,) and an int32 count a row")
        flags.update(POST=True, BLOCK_C=triton.next_power_of_2(n), o_ptr=torch.empty((x.shape[0], n), dtype=x.dtype,
                     device=x.device), p_ptr=post, c_ptr=done, peps=post_eps)
    return (x if norm is None else norm, x if residual is None else residual, x if bias is None else bias, flags)


@torch.library.custom_op("tinyllm::int8_gemv", mutates_args=())
def int8_gemv(x: Tensor, qweight: Tensor, scales: Tensor, gated: bool = False, norm: Tensor | None = None,
              eps: float = 0.0, residual: Tensor | None = None, bias: Tensor | None = None,
              act: str = "silu", post: Tensor | None = None, post_eps: float = 0.0, done: Tensor | None = None) -> Tensor:
    m, k, n, halves = int8_shapes("int8_gemv", x, qweight, scales, gated)
    g, r, b, flags = _fused_args(x, n * halves, n, norm, residual, bias, act, post, post_eps, done)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_n, block_k, warps = _cut(n, k, 1, gated, x.device)
    _launch(_int8_kernel, n, m, warps, x, qweight, scales, y, g, r, b, eps, n, k, BLOCK_N=block_n, BLOCK_K=block_k,
            HALVES=halves, **flags)
    return y


def int8_shapes(op: str, x: Tensor, qweight: Tensor, scales: Tensor, gated: bool) -> tuple[int, int, int, int]:
    """(M, K, N, halves) of an int8 product's arguments, checked (`op` names it in the error)."""
    m, k = x.shape
    n, halves = _outputs(qweight, gated), 1 + gated
    torch._check(qweight.shape == (n * halves, k) and scales.shape[0] == n * halves, lambda: f"{op}: shapes disagree")
    torch._check(qweight.is_contiguous() and scales.is_contiguous(), lambda: f"{op}: weights not contiguous")
    return m, k, n, halves


@int8_gemv.register_fake
def int8_fake(x: Tensor, qweight: Tensor, scales: Tensor, gated: bool = False, norm: Tensor | None = None,
              eps: float = 0.0, residual: Tensor | None = None, bias: Tensor | None = None,
              act: str = "silu", post: Tensor | None = None, post_eps: float = 0.0, done: Tensor | None = None) -> Tensor:
    """What an int8 product returns, for tracing: (M, N) in x's dtype (the words op's too)."""
    return x.new_empty((x.shape[0], _outputs(qweight, gated)))


@torch.library.custom_op("tinyllm::int4_gemv", mutates_args=())
def int4_gemv(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor, group: int, gated: bool = False,
              norm: Tensor | None = None, eps: float = 0.0, residual: Tensor | None = None,
              bias: Tensor | None = None, act: str = "silu", post: Tensor | None = None, post_eps: float = 0.0,
              done: Tensor | None = None) -> Tensor:
    m, k, n, halves = int4_shapes("int4_gemv", x, qweight, scales, zeros, group, gated)
    g, r, b, flags = _fused_args(x, n * halves, n, norm, residual, bias, act, post, post_eps, done)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_n, block_k, warps = _cut(n, k, 0.5, gated, x.device)
    block_k = max(block_k, group)  # whole groups a step
    _launch(_int4_kernel, n, m, warps, x, qweight, scales, zeros, y, g, r, b, eps, n, k, G=group, BLOCK_N=block_n,
            BLOCK_K=block_k, HALVES=halves, **flags)
    return y


def int4_shapes(op: str, x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor, group: int,
                gated: bool) -> tuple[int, int, int, int]:
    """(M, K, N, halves) of an int4 product's arguments, checked (`op` names it in the error)."""
    m, k = x.shape
    n, halves = _outputs(qweight, gated), 1 + gated
    torch._check(qweight.shape == (n * halves, k // 2) and scales.shape == zeros.shape
                 and scales.shape == (n * halves, k // group), lambda: f"{op}: shapes disagree")
    torch._check(qweight.is_contiguous() and scales.is_contiguous() and zeros.is_contiguous(),
                 lambda: f"{op}: the weights, scales and zeros must be contiguous")
    return m, k, n, halves


@int4_gemv.register_fake
def int4_fake(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor, group: int, gated: bool = False,
              norm: Tensor | None = None, eps: float = 0.0, residual: Tensor | None = None, bias: Tensor | None = None,
              act: str = "silu", post: Tensor | None = None, post_eps: float = 0.0, done: Tensor | None = None) -> Tensor:
    """What an int4 product returns, for tracing: (M, N) in x's dtype (the dp4a and words ops too)."""
    return x.new_empty((x.shape[0], _outputs(qweight, gated)))


@torch.library.custom_op("tinyllm::dense_gemv", mutates_args=())
def dense_gemv(x: Tensor, weight: Tensor, gated: bool = False, norm: Tensor | None = None, eps: float = 0.0,
               residual: Tensor | None = None, bias: Tensor | None = None, act: str = "silu",
               post: Tensor | None = None, post_eps: float = 0.0, done: Tensor | None = None) -> Tensor:
    m, k = x.shape
    n, halves = _outputs(weight, gated), 1 + gated
    torch._check(weight.shape == (n * halves, k) and weight.is_contiguous(), lambda: "dense_gemv: shapes disagree")
    g, r, b, flags = _fused_args(x, n * halves, n, norm, residual, bias, act, post, post_eps, done)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_n, block_k, warps = _cut(n, k, weight.element_size(), gated, x.device)
    _launch(_dense_kernel, n, m, warps, x, weight, y, g, r, b, eps, n, k, BLOCK_N=block_n, BLOCK_K=block_k,
            HALVES=halves, **flags)
    return y


@dense_gemv.register_fake
def _(x: Tensor, weight: Tensor, gated: bool = False, norm: Tensor | None = None, eps: float = 0.0,
      residual: Tensor | None = None, bias: Tensor | None = None, act: str = "silu", post: Tensor | None = None,
      post_eps: float = 0.0, done: Tensor | None = None) -> Tensor:
    return x.new_empty((x.shape[0], _outputs(weight, gated)))


@triton.jit
def _add_rmsnorm_kernel(x_ptr, y_ptr, g_ptr, out_ptr, eps, C: tl.constexpr, BLOCK_C: tl.constexpr,
                        PDL: tl.constexpr = False):
    """out[m] = x[m] + RMSNorm(y[m]) for one row m a program (_add_norm_row)."""
    if PDL:  # nothing to load before the wait worth the wait: the weights are C values
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    _add_norm_row(x_ptr, y_ptr, g_ptr, out_ptr, tl.program_id(0), eps, C, BLOCK_C)


@torch.library.custom_op("tinyllm::add_rmsnorm", mutates_args=())
def add_rmsnorm(x: Tensor, y: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x + RMSNorm(y) (a post-norm and its skip connection: Gemma 2/3), x and y (M, C) contiguous."""
    torch._check(x.shape == y.shape and weight.shape == (x.shape[1],) and x.is_contiguous() and y.is_contiguous(),
                 lambda: "add_rmsnorm: shapes disagree")
    out = torch.empty_like(x)
    C = x.shape[1]
    _add_rmsnorm_kernel[(x.shape[0],)](x, y, weight, out, eps, C, BLOCK_C=triton.next_power_of_2(C),
                                       **pdl.launch_options(x.device), num_warps=4)
    return out


@add_rmsnorm.register_fake
def _(x: Tensor, y: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.empty_like(x)
