"""The Triton kernels behind `tinyllm.kernels.decode_attention` (split-K "flash-decoding").

Contract: importing this module imports Triton (it fails where Triton is missing: import
`tinyllm.kernels.decode_attention` instead, which guards) and registers two custom ops:
- `torch.ops.tinyllm.decode_attention(q, k, v, mask, scale) -> Tensor`, with the contract of
  `ops.window_attention`: q (B, Hkv, R, D), k and v (B, Hkv, W, D) (any strides: slices of
  a larger cache are read in place), mask (B, 1, 1, W) bool, True = attend; returns
  (B, Hkv, R, D) in v's dtype. q, k, v share one dtype, bf16 or fp16; D is 32, 64, 128 or
  256. `cap` > 0 soft-caps the scores, cap * tanh(score / cap) (Gemma 2), as window_attention does.
- `torch.ops.tinyllm.rope_decode_attention(qkv, cos, sin, pos, first_valid, k_cache, v_cache,
  window, scale, sliding=0, cap=0.0, q_norm=None, k_norm=None, eps=0.0)`: a decode step's RoPE, cache
  write and attention in one; `sliding` > 0 narrows each row's keys to its last `sliding` (a
  sliding-window layer: blocks before them are never walked), `cap` soft-caps the scores, and
  q_norm, k_norm (D,) normalize each head of q and of the new key before RoPE (RMSNorm with eps:
  Qwen 3, Gemma 3). qkv
  (B, (Hkv R + 2 Hkv) D) is the step's q, k, v projections before RoPE (model.Attention's
  wqkv); cos, sin (L, D/2) fp32 the rotary tables (model.Rope), read at row pos; pos (P,) long,
  P = 1 (every row at one position) or B; first_valid (B,) long; k_cache, v_cache
  (B', Hkv, rows, D), B' >= B, row b of qkv using row b of the caches (a slot cache's step
  over its first B slots hands over its whole caches); window W <= rows, pos[b] < rows. Row b
  attends keys first_valid[b] .. pos[b] of the first W (the mask _StaticDecode.begin_step
  builds for one position, _SlotDecode.begin_step for one per slot). It rotates q and the new
  key, writes the new key and value at pos into the caches (the only inputs it mutates), and
  returns attention over the first W keys, (B, Hkv, R, D): what `model.apply_rope`, an
  index_copy_ (index_put_ for a position per row) into the caches and `decode_attention` on
  their first W keys give, to bf16 rounding. The caches past pos[b] are never read (NaN there
  changes nothing): a row's loads grow with pos[b] + 1, not W, and a split program past it
  walks nothing, so a slot cache's free rows (pos 0) and short ones in a long window cost
  almost nothing. Every input is a tensor the step already holds (the tables, the cache's
  positions): in a compiled step Inductor computed a per-step cos, sin and mask into a copy of
  its own for each layer's call (14 small kernels a step for the 1.1B).

Two kernels:
- `_split_kernel`, grid (B*Hkv, n_split): one program per KV head and split, a split being
  `group` blocks of BLOCK_N keys (one block up to MAX_SPLITS blocks, 8,192 keys; past that
  n_split stays near MAX_SPLITS and a program walks several blocks in turn). It computes the R
  rows' scores (fp32), masks them, and writes its partial max m (R,), sum l = sum(exp(s - m))
  (R,) and o = exp(s - m) @ v (R, D), fp32, merged online over its blocks. A split with no
  key to attend writes m = -inf, l = 0, o = 0. For the fused op (NEW) each
  program also rotates q and the new key itself (a few hundred values), computes its mask from
  pos and first_valid, loads only the keys and values it attends (first_valid .. pos), takes
  position pos from the new key and value instead of the cache, and the program whose block
  holds pos (the last block, should pos lie past the window) writes them into the cache: no
  other program reads that position. A program's blocks past pos's block (and before the
  first valid key's) are never walked: a split that holds none of them writes the empty
  partial, m = -inf, l = 0, o = 0.
- `_combine_kernel`, grid (B*Hkv, R): one program per query row merges the splits,
  out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s with M = max_s m_s; a row with no
  key at all gets 0 (not NaN).
A window of up to TILE keys runs `_split_kernel` alone (ONE_PASS), grid (B*Hkv, 1): each
head's program walks the whole window, in one block up to ONE_PASS_BLOCK keys or in blocks of
that many, and writes the result, one kernel a layer instead of two (NEW: it loads the keys up
to pos only).

Sizes: every program loads at most ONE_PASS_BLOCK (one pass) or BLOCK_N (split) keys at once,
whatever TILE and W are, so its shared memory (`shared_bytes`: at most 43,520 bytes for
R <= 16, at D = 256) fits Hopper's 232,448 for every head size and window; any
TINYLLM_ATTN_TILE launches.
Offsets into the caches, the scratch and the output are int64 (a 131,072-key cache of 8 KV
heads of 128 dims passes 2**31 elements from batch 16). The grid's second axis, n_split, is at
most MAX_SPLITS (CUDA allows 65,535).

Why the fused op: RoPE and the two cache writes were four small Inductor kernels a layer
around the projections (88 of the 1.1B step's 278 kernels, about 110 us of its 860 on the
H200: docs/BENCHMARKS-LOG.md).

The ops are `torch.library.custom_op`s that launch both kernels themselves, with PDL where
tinyllm.kernels.pdl allows (each kernel waits on the one before it first thing: every input may be
fresh). A compiled step calls them as opaque ops, with no graph break; the scratch buffers
are plain `torch.empty` inside the op, so CUDA graphs capture it. The grid is computed from
the window's real size at each call: one compile serves every window.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from tinyllm.kernels import pdl
from tinyllm.kernels.switches import SWITCHES

BLOCK_N = 64  # keys a split program reads at once
BLOCK_S = 32  # splits the combine program reads at once (it loops over more)
# A head's split programs at most: past MAX_SPLITS blocks (8,192 keys) a program walks several
# blocks in turn (16 at 131,072 keys), so the scratch and the combine's loop stop growing with W:
# at 131,072 keys, 2,048 splits of one block would write 64 KB of partials a query row, a
# quarter of what the row's keys and values are (D = 64). 128 splits a head are 512 programs a
# step for the 1.1B (4 KV heads) at batch 1, four for each of the H200's 132 SMs. Measured on
# the H200 (scripts/attn_long_sweep.py: the 1.1B's 22 layers graphed, us a layer), 128 against
# 256: 17.1-17.2 against 20.9 at 32,768 keys, 43.6 against 48.8 at 131,072, 8.8-9.2 either way
# at 8,192; 32 or 64, BLOCK_N 128, 8 warps or 4 stages measured no better.
MAX_SPLITS = 128
# A window of up to TILE keys takes one program a head, one tile of keys (ONE_PASS): one kernel
# a layer, no combine. Measured in the 1.1B int8 compiled step on the H200 (scripts/step_rules.py
# --attention), W=128: one tile 698.8-702.7 us, two blocks of 64 walked in
# turn by one program 713.6, split and combined 715.3-721.2. W=256: one tile of 256 731.8, split
# 721.7 (one program a head reads its keys slower than four do); merged by the last split
# program to finish (an atomic count a head) instead of a combine kernel, 733-735 against 717-718.
# TINYLLM_ATTN_TILE overrides it (0: always split). A window longer than ONE_PASS_BLOCK keys
# in one pass is walked in blocks of ONE_PASS_BLOCK by its one program: the program never loads
# more than that at once, so every tile fits in shared memory (a tile of 4,096 keys loaded whole
# asked for 690,176 bytes on the H200, Triton 3.6: OutOfResources).
TILE = SWITCHES.attn_tile
ONE_PASS_BLOCK = 128  # the most keys a one-pass program loads at once (W = 128: one tile, measured above)
HEAD_DIMS = (32, 64, 128, 256)
ONE_PASS_MAX_D = 128  # a head of 256 dims always splits (not measured in one pass)
SMEM_LIMIT = 232_448  # bytes of shared memory a block may have on Hopper (sm_90: 227 KB)


def shared_bytes(block_n: int, block_r: int, D: int) -> int:
    """The shared memory a `_split_kernel` program asks for, in bytes, as Triton 3.6 (the
    H200's) allocates it for sm_90: the two products' 16-bit operands staged there, the block
    of keys (block_n, D), the weights (block_r, block_n) and q (block_r, D), and 8 bytes a key
    for the reductions. For one tile of 4,096 keys at D = 64 it gives the 690,176 bytes the
    H200 refused, exactly; Triton 3.9 asks for less (keys and q only: test_decode_attention
    compiles the kernels for sm_90 and checks)."""
    return 2 * (block_n * D + block_r * block_n + block_r * D) + 8 * block_n


def plan(W: int, D: int, R: int) -> tuple[int, int, int, bool]:
    """(block_n, n_split, group, one_pass) for a window of W keys, heads of D dims and R query
    rows a KV head: keys a program loads at once, split programs a head, blocks each walks, and
    whether one program a head writes the result (W <= TILE; no combine)."""
    one_pass = W <= TILE and D <= ONE_PASS_MAX_D
    block_n = min(triton.next_power_of_2(max(W, 16)), ONE_PASS_BLOCK) if one_pass else BLOCK_N
    n_blocks = triton.cdiv(W, block_n)
    group = n_blocks if one_pass else triton.cdiv(n_blocks, MAX_SPLITS)
    block_r = max(16, triton.next_power_of_2(R))
    assert shared_bytes(block_n, block_r, D) <= SMEM_LIMIT, f"decode attention: R={R}, D={D} overflow shared memory"
    return block_n, triton.cdiv(n_blocks, group), group, one_pass
DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _rope(x, partner, c, s, D: tl.constexpr):
    """RoPE ("rotate half") of x (..., D), given each element's partner d +- D/2 (..., D):
    x c - x' s in the first half, x c + x' s in the second, fp32, then rounded to x's dtype as
    model.apply_rope does. c, s (D,): cos and sin of d mod D/2."""
    sign = tl.where(tl.arange(0, D) < D // 2, -1.0, 1.0)
    return (x.to(tl.float32) * c + sign * partner.to(tl.float32) * s).to(x.dtype)


@triton.jit
def _head_norm(x, partner, w_ptr, cols, half, eps, D: tl.constexpr):
    """RMSNorm over each head's D dims (Qwen 3's and Gemma 3's q_norm and k_norm, as model.RMSNorm
    rounds: normalized in fp32, rounded to x's dtype, times the weights) of x (..., D) and of its
    partners (the same row's elements, permuted: one rsqrt serves both)."""
    xf = x.to(tl.float32)
    r = tl.rsqrt(tl.sum(xf * xf, axis=-1, keep_dims=True) / D + eps)  # (..., 1)
    w, wp = tl.load(w_ptr + cols), tl.load(w_ptr + half)  # (D,)
    return (((xf * r).to(x.dtype) * w).to(x.dtype),
            ((partner.to(tl.float32) * r).to(x.dtype) * wp).to(x.dtype))


@triton.jit
def _softcap(x, cap):
    """cap * tanh(x / cap) (Gemma 2's soft-capped scores), tanh from one exp: stable for any x."""
    t = tl.exp(-2.0 * tl.abs(x / cap))
    return tl.where(x < 0, -cap, cap) * (1.0 - t) / (1.0 + t)


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, m_ptr, l_ptr, o_ptr, out_ptr,
                  W, n_split, group, Hkv, R, scale, cap, sliding,
                  sq_b, sq_h, sq_r, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sm_b, sm_n,
                  kn_ptr, vn_ptr, cos_ptr, sin_ptr, pos_ptr, fv_ptr, sn_b, sc_p, sp_b, qw_ptr, kw_ptr, eps,
                  D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, NEW: tl.constexpr = False,
                  ONE_PASS: tl.constexpr = False, SOFTCAP: tl.constexpr = False, QK_NORM: tl.constexpr = False,
                  PDL: tl.constexpr = False):
    if PDL:  # every input may come from the kernels just before (the new key and value too)
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // Hkv
    h = bh % Hkv
    rows = tl.arange(0, BLOCK_R)  # query rows, padded to >= 16 for tl.dot
    cols = tl.arange(0, D)
    row_ok = rows < R
    n_blocks = tl.cdiv(W, BLOCK_N)
    # Row b's and head h's caches in int64: a cache of B Hkv W D elements passes 2**31 at 128k keys
    # (8 KV heads of 128 dims, b >= 16); the offsets within a head's W D stay small.
    k_at = k_ptr + b.to(tl.int64) * sk_b + h.to(tl.int64) * sk_h
    v_at = v_ptr + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h

    q_at = q_ptr + b.to(tl.int64) * sq_b + h * sq_h + rows[:, None] * sq_r  # (BLOCK_R, 1)
    if NEW:  # q, and the new key and value (RoPE'd here), at position p of row b
        p = tl.load(pos_ptr + b * sp_b)
        fv = tl.load(fv_ptr + b)  # the row attends keys fv..p
        if sliding > 0:  # a sliding-window layer: the last `sliding` keys only
            fv = tl.maximum(fv, p - sliding + 1)
        c = tl.load(cos_ptr + p * sc_p + cols % (D // 2))  # (D,) fp32: row p of the table
        s = tl.load(sin_ptr + p * sc_p + cols % (D // 2))
        half = (cols + D // 2) % D  # each element's partner
        qx = tl.load(q_at + cols[None, :] * sq_d, mask=row_ok[:, None], other=0.0)  # (BLOCK_R, D)
        qp = tl.load(q_at + half[None, :] * sq_d, mask=row_ok[:, None], other=0.0)
        kn_at = kn_ptr + b * sn_b + h * D
        kx, kp = tl.load(kn_at + cols), tl.load(kn_at + half)  # (D,)
        if QK_NORM:  # each head normalized before RoPE
            qx, qp = _head_norm(qx, qp, qw_ptr, cols, half, eps, D)
            kx, kp = _head_norm(kx, kp, kw_ptr, cols, half, eps, D)
        q = _rope(qx, qp, c, s, D)  # (BLOCK_R, D)
        k_new = _rope(kx, kp, c, s, D)  # (D,)
        v_new = tl.load(vn_ptr + b * sn_b + h * D + cols)  # (D,)
    else:
        q = tl.load(q_at + cols[None, :] * sq_d, mask=row_ok[:, None], other=0.0)  # (BLOCK_R, D)
    # `group` blocks of keys a program (its split: one, or several in a long window), or with
    # ONE_PASS every block (group = n_blocks, one split), merged online.
    first = split * group
    last = tl.minimum(first + group, n_blocks)
    if NEW:  # no block past p's: a program whose block starts past p runs no iteration and writes
        # the empty partial (m = -inf, l = 0, o = 0), which weighs nothing in the combine. The
        # block that writes the new key and value, min(p // BLOCK_N, n_blocks - 1), is always walked.
        last = tl.minimum(last, (p // BLOCK_N + 1).to(tl.int32))
        # ... nor any block before fv's (a sliding window's start): those programs write the empty partial too.
        first = tl.maximum(first, (fv // BLOCK_N).to(tl.int32))
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)  # running max, sum of exp and exp @ v
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, D], dtype=tl.float32)
    for blk in range(first, last):
        keys = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        key_in = keys < W
        if NEW:
            attend = key_in & (keys <= p) & (keys >= fv)  # (BLOCK_N,)
            # Only the keys attended are loaded (a row's cost is its length, not W), and
            # position p is read from the new key and value, not the cache.
            cached = attend & (keys != p)
        else:
            attend = tl.load(mask_ptr + b * sm_b + keys * sm_n, mask=key_in, other=0) != 0
            cached = key_in
        k = tl.load(k_at + keys[:, None] * sk_n + cols[None, :] * sk_d,
                    mask=cached[:, None], other=0.0)  # (BLOCK_N, D)
        if NEW:
            k = tl.where((keys == p)[:, None], k_new[None, :], k)
        sc = tl.dot(q, tl.trans(k)) * scale  # (BLOCK_R, BLOCK_N) fp32
        if SOFTCAP:
            sc = _softcap(sc, cap)
        sc = tl.where(attend[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))  # (BLOCK_R,)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: exp(-inf - 0) = 0
        alpha = tl.exp(m_i - m_safe)  # 0 on a program's first block: its sums start there, exactly
        pr = tl.exp(sc - m_safe[:, None])  # (BLOCK_R, BLOCK_N)
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        # Keys not attended are never read: whatever a cache holds there (even NaN) stays out.
        v = tl.load(v_at + keys[:, None] * sv_n + cols[None, :] * sv_d,
                    mask=(attend & cached)[:, None], other=0.0)  # (BLOCK_N, D)
        if NEW:
            v = tl.where((keys == p)[:, None], v_new[None, :], v)
            # The block that holds p (the last one, should p lie past the window) writes the new
            # key and value into the cache: no other program of this kernel reads position p.
            mine = cols < tl.where(blk == tl.minimum(p // BLOCK_N, n_blocks - 1), D, 0)  # (D,): all or none
            tl.store(k_at + p * sk_n + cols * sk_d, k_new, mask=mine)
            tl.store(v_at + p * sv_n + cols * sv_d, v_new, mask=mine)
        acc = acc * alpha[:, None] + tl.dot(pr.to(v.dtype), v)  # (BLOCK_R, D) fp32
        m_i = m_new

    if ONE_PASS:  # the result itself; a row with no key at all gets 0 (acc = 0), not NaN
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(out_ptr + (bh.to(tl.int64) * R + rows[:, None]) * D + cols[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:  # (BLOCK_R,) index into the (B*Hkv, n_split, R) scratch, int64: its o holds B Hkv n_split R D floats
        part = (bh.to(tl.int64) * n_split + split) * R + rows
        tl.store(m_ptr + part, m_i, mask=row_ok)
        tl.store(l_ptr + part, l_i, mask=row_ok)
        tl.store(o_ptr + part[:, None] * D + cols[None, :], acc, mask=row_ok[:, None])


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
        part = (bh.to(tl.int64) * n_split + splits) * R + r  # (BLOCK_S,), int64 as in the split kernel
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
    tl.store(out_ptr + (bh.to(tl.int64) * R + r) * D + cols, out.to(out_ptr.dtype.element_ty))


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, W: int, new=None,
            cap: float = 0.0, sliding: int = 0, norms: tuple[Tensor, Tensor, float] | None = None) -> Tensor:
    """The kernels over the first W keys of k and v; new = (k_new, v_new, cos, sin, pos,
    first_valid), the fused op's extra inputs (then no mask), or None; scores soft-capped at
    `cap` (0: not); `sliding` > 0 (the fused op): each row attends its last `sliding` keys only;
    `norms` (q_norm's and k_norm's weights (D,), eps): the fused op normalizes each head first."""
    B, Hkv, R, D = q.shape
    if mask is not None:
        mask = mask.expand(B, 1, 1, W)  # a view: a batch-broadcast mask gets stride 0
    block_n, n_split, group, one_pass = plan(W, D, R)
    block_r = max(16, triton.next_power_of_2(R))
    dev = q.device
    out = torch.empty((B, Hkv, R, D), dtype=v.dtype, device=dev)
    if one_pass:  # no scratch: the one program of each head writes `out` (the buffers go unread)
        m_buf = l_buf = o_buf = out
    else:
        m_buf = torch.empty((B * Hkv, n_split, R), dtype=torch.float32, device=dev)  # each split's max
        l_buf = torch.empty((B * Hkv, n_split, R), dtype=torch.float32, device=dev)  # and sum of exp
        o_buf = torch.empty((B * Hkv, n_split, R, D), dtype=torch.float32, device=dev)  # and exp @ v
    k_new, v_new, cos, sin, pos, first_valid = new or (q, q, q, q, q, q)  # unused without NEW
    q_w, k_w, eps = norms or (q, q, 0.0)  # unread without QK_NORM
    launch = pdl.launch_options(dev)
    _split_kernel[(B * Hkv, n_split)](
        q, k, v, q if mask is None else mask, m_buf, l_buf, o_buf, out, W, n_split, group, Hkv, R, scale,  # no mask: unread
        cap if cap else 1.0, sliding,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        0 if mask is None else mask.stride(0), 0 if mask is None else mask.stride(3),
        k_new, v_new, cos, sin, pos, first_valid, k_new.stride(0), cos.stride(0), pos.stride(0), q_w, k_w, eps,
        D=D, BLOCK_R=block_r, BLOCK_N=block_n, NEW=new is not None, ONE_PASS=one_pass, SOFTCAP=cap > 0,
        QK_NORM=norms is not None, **launch)
    if not one_pass:
        _combine_kernel[(B * Hkv, R)](m_buf, l_buf, o_buf, out, n_split, R, D=D, BLOCK_S=BLOCK_S, **launch)
    return out


def _check(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
    D = q.shape[-1]
    torch._check(D in HEAD_DIMS, lambda: f"head dim {D} not in {HEAD_DIMS}")
    torch._check(q.dtype == k.dtype == v.dtype and v.dtype in DTYPES, lambda: "q, k, v: one dtype, bf16 or fp16")
    torch._check(mask is None or mask.dtype == torch.bool, lambda: "mask must be bool")


@torch.library.custom_op("tinyllm::decode_attention", mutates_args=())
def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, cap: float = 0.0) -> Tensor:
    _check(q, k, v, mask)
    return _attend(q, k, v, mask, scale, k.shape[2], cap=cap)


@decode_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, cap: float = 0.0) -> Tensor:
    return q.new_empty(q.shape, dtype=v.dtype)


def _heads(qkv: Tensor, k_cache: Tensor) -> tuple[int, int, int, int]:
    """(B, Hkv, R, D) of a fused call: qkv (B, (Hkv R + 2 Hkv) D), k_cache (>= B, Hkv, rows, D)."""
    _, Hkv, _, D = k_cache.shape
    return qkv.shape[0], Hkv, qkv.shape[1] // (Hkv * D) - 2, D


@torch.library.custom_op("tinyllm::rope_decode_attention", mutates_args=("k_cache", "v_cache"))
def rope_decode_attention(qkv: Tensor, cos: Tensor, sin: Tensor, pos: Tensor, first_valid: Tensor, k_cache: Tensor,
                          v_cache: Tensor, window: int, scale: float, sliding: int = 0, cap: float = 0.0,
                          q_norm: Tensor | None = None, k_norm: Tensor | None = None, eps: float = 0.0) -> Tensor:
    B, Hkv, R, D = _heads(qkv, k_cache)
    torch._check(qkv.shape == (B, (R + 2) * Hkv * D) and qkv.stride(1) == 1 and k_cache.shape == v_cache.shape
                 and k_cache.shape[0] >= B and window <= k_cache.shape[2] and cos.shape[-1] == D // 2
                 and first_valid.shape == (B,),
                 lambda: "rope_decode_attention: shapes disagree")
    q_dim, kv_dim = R * Hkv * D, Hkv * D
    q = qkv[:, :q_dim].view(B, Hkv, R, D)  # a view: strides (row stride, R D, D, 1)
    _check(q, k_cache, v_cache, None)
    torch._check((q_norm is None) == (k_norm is None) and (q_norm is None or q_norm.shape == k_norm.shape == (D,)),
                 lambda: "rope_decode_attention: q_norm and k_norm are both (D,) or both absent")
    new = (qkv[:, q_dim:], qkv[:, q_dim + kv_dim:], cos, sin, pos.expand(B), first_valid)
    norms = None if q_norm is None else (q_norm, k_norm, eps)
    return _attend(q, k_cache, v_cache, None, scale, window, new, cap=cap, sliding=sliding, norms=norms)


@rope_decode_attention.register_fake
def _(qkv: Tensor, cos: Tensor, sin: Tensor, pos: Tensor, first_valid: Tensor, k_cache: Tensor, v_cache: Tensor,
      window: int, scale: float, sliding: int = 0, cap: float = 0.0, q_norm: Tensor | None = None,
      k_norm: Tensor | None = None, eps: float = 0.0) -> Tensor:
    B, Hkv, R, D = _heads(qkv, k_cache)
    return qkv.new_empty((B, Hkv, R, D))
