"""The Triton kernels behind `tinyllm.decode_attention` (split-K "flash-decoding").

Contract: importing this module imports Triton (it fails where Triton is missing: import
`tinyllm.decode_attention` instead, which guards) and registers the custom op
`torch.ops.tinyllm.decode_attention(q, k, v, mask, scale) -> Tensor`, with the contract of
`model.window_attention`: q (B, Hkv, R, D), k and v (B, Hkv, W, D) (any strides: slices of
a larger cache are read in place), mask (B, 1, 1, W) bool, True = attend; returns
(B, Hkv, R, D) in v's dtype. q, k, v share one dtype, bf16 or fp16; D is 32, 64 or 128.

Two kernels:
- `_split_kernel`, grid (B*Hkv, cdiv(W, BLOCK_N)): one program per KV head and block of
  BLOCK_N keys. It computes the R rows' scores (fp32), masks them, and writes the block's
  partial max m (R,), sum l = sum(exp(s - m)) (R,) and o = exp(s - m) @ v (R, D), fp32.
  A block with no key to attend writes m = -inf, l = 0, o = 0.
- `_combine_kernel`, grid (B*Hkv, R): one program per query row merges the splits,
  out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s with M = max_s m_s; a row with no
  key at all gets 0 (not NaN).

The op is a `torch.library.custom_op` that launches both kernels itself, with PDL where
tinyllm.pdl allows (each kernel waits on the one before it first thing: every input may be
fresh). A compiled step calls it as an opaque op, with no graph break; the scratch buffers
are plain `torch.empty` inside the op, so CUDA graphs capture it. The grid is computed from
the window's real size at each call: one compile serves every window.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from tinyllm import pdl

BLOCK_N = 64  # keys per split program
BLOCK_S = 32  # splits the combine program reads at once (it loops over more)
HEAD_DIMS = (32, 64, 128)
DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, m_ptr, l_ptr, o_ptr,
                  W, n_split, Hkv, R, scale,
                  sq_b, sq_h, sq_r, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sm_b, sm_n,
                  D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # every input may come from the kernels just before (the new key and value too)
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // Hkv
    h = bh % Hkv
    rows = tl.arange(0, BLOCK_R)  # query rows, padded to >= 16 for tl.dot
    cols = tl.arange(0, D)
    keys = split * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < R
    key_in = keys < W

    q = tl.load(q_ptr + b * sq_b + h * sq_h + rows[:, None] * sq_r + cols[None, :] * sq_d,
                mask=row_ok[:, None], other=0.0)  # (BLOCK_R, D)
    k = tl.load(k_ptr + b * sk_b + h * sk_h + keys[:, None] * sk_n + cols[None, :] * sk_d,
                mask=key_in[:, None], other=0.0)  # (BLOCK_N, D)
    attend = tl.load(mask_ptr + b * sm_b + keys * sm_n, mask=key_in, other=0) != 0  # (BLOCK_N,)
    s = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_R, BLOCK_N) fp32
    s = tl.where(attend[None, :], s, float("-inf"))
    m = tl.max(s, axis=1)  # (BLOCK_R,)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # a block with no key: exp(-inf - 0) = 0
    p = tl.exp(s - m_safe[:, None])  # (BLOCK_R, BLOCK_N)
    lsum = tl.sum(p, axis=1)  # (BLOCK_R,)
    # Keys not attended are never read: whatever a cache holds there (even NaN) stays out.
    v = tl.load(v_ptr + b * sv_b + h * sv_h + keys[:, None] * sv_n + cols[None, :] * sv_d,
                mask=attend[:, None], other=0.0)  # (BLOCK_N, D)
    o = tl.dot(p.to(v.dtype), v)  # (BLOCK_R, D) fp32

    part = (bh * n_split + split) * R + rows  # (BLOCK_R,) index into the (B*Hkv, n_split, R) scratch
    tl.store(m_ptr + part, m, mask=row_ok)
    tl.store(l_ptr + part, lsum, mask=row_ok)
    tl.store(o_ptr + part[:, None] * D + cols[None, :], o, mask=row_ok[:, None])


@triton.jit
def _combine_kernel(m_ptr, l_ptr, o_ptr, out_ptr, n_split, R,
                    D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    bh = tl.program_id(0)
    r = tl.program_id(1)
    lanes = tl.arange(0, BLOCK_S)
    cols = tl.arange(0, D)
    # Each lane merges splits lane, lane + BLOCK_S, ... online; the lanes are merged at the end.
    m_acc = tl.full([BLOCK_S], float("-inf"), tl.float32)
    l_acc = tl.zeros([BLOCK_S], dtype=tl.float32)
    o_acc = tl.zeros([BLOCK_S, D], dtype=tl.float32)
    for start in range(0, n_split, BLOCK_S):
        splits = start + lanes
        ok = splits < n_split
        part = (bh * n_split + splits) * R + r  # (BLOCK_S,)
        m = tl.load(m_ptr + part, mask=ok, other=float("-inf"))
        lsum = tl.load(l_ptr + part, mask=ok, other=0.0)
        o = tl.load(o_ptr + part[:, None] * D + cols[None, :], mask=ok[:, None], other=0.0)  # (BLOCK_S, D)
        m_new = tl.maximum(m_acc, m)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp(m_acc - m_safe)
        c = tl.exp(m - m_safe)
        l_acc = l_acc * a + lsum * c
        o_acc = o_acc * a[:, None] + o * c[:, None]
        m_acc = m_new
    big = tl.max(m_acc, axis=0)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    w = tl.exp(m_acc - big_safe)  # (BLOCK_S,)
    total = tl.sum(l_acc * w, axis=0)
    acc = tl.sum(o_acc * w[:, None], axis=0)  # (D,)
    out = acc / tl.where(total > 0.0, total, 1.0)  # no key at all: acc = 0, out = 0
    tl.store(out_ptr + (bh * R + r) * D + cols, out.to(out_ptr.dtype.element_ty))


@torch.library.custom_op("tinyllm::decode_attention", mutates_args=())
def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    B, Hkv, R, D = q.shape
    W = k.shape[2]
    torch._check(D in HEAD_DIMS, lambda: f"head dim {D} not in {HEAD_DIMS}")
    torch._check(q.dtype == k.dtype == v.dtype and v.dtype in DTYPES, lambda: "q, k, v: one dtype, bf16 or fp16")
    torch._check(mask.dtype == torch.bool, lambda: "mask must be bool")
    mask = mask.expand(B, 1, 1, W)  # a view: a batch-broadcast mask gets stride 0
    n_split = triton.cdiv(W, BLOCK_N)
    block_r = max(16, triton.next_power_of_2(R))
    dev = q.device
    m_buf = torch.empty((B * Hkv, n_split, R), dtype=torch.float32, device=dev)  # each split's max
    l_buf = torch.empty((B * Hkv, n_split, R), dtype=torch.float32, device=dev)  # and sum of exp
    o_buf = torch.empty((B * Hkv, n_split, R, D), dtype=torch.float32, device=dev)  # and exp @ v
    out = torch.empty((B, Hkv, R, D), dtype=v.dtype, device=dev)
    launch = pdl.launch_options(dev)
    _split_kernel[(B * Hkv, n_split)](
        q, k, v, mask, m_buf, l_buf, o_buf, W, n_split, Hkv, R, scale,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        mask.stride(0), mask.stride(3),
        D=D, BLOCK_R=block_r, BLOCK_N=BLOCK_N, **launch)
    _combine_kernel[(B * Hkv, R)](m_buf, l_buf, o_buf, out, n_split, R, D=D, BLOCK_S=BLOCK_S, **launch)
    return out


@decode_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    return q.new_empty(q.shape, dtype=v.dtype)
