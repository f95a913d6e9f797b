"""The decode step's repetition penalty and DRY in two Triton kernels instead of about 40 torch ones.

Contract:
- `filtered_logits(logits (B, V) any float dtype, n_valid, ring (B, R) int64, penalty (1,) fp32,
  hist (B, H) int64 (-1: none), breaker (V,) bool, dry (2,) fp32, dry_n (2,) int64) -> x (B, V) fp32`
  is the tensor tinyllm.decode.step_sampler.StepSampler.draw builds from the same tensors:
      x = logits.float(); x[:, n_valid:] = -inf
      x = apply_repeat_penalty(x, ring, penalty)
      x = apply_dry(x, hist, breaker, dry[0:1], dry[1:2], dry_n[0:1], dry_n[1:2])
  (tinyllm.decode.sampling), with the same fp32 operations in the same order, no host sync and
  fixed launches (a CUDA graph captures them; with PDL on Hopper, tinyllm.kernels.pdl).
- Bit for bit, but for one operation: DRY's `base ** over` (n = over, an integer in [0, 64);
  SamplingParams' allowed length >= 1 keeps it <= 31). torch's own pow is not one function: on
  the CPU its vector loop (Sleef, 1 ulp) and its loop's tail (the C library's powf) differ from
  each other and from the correctly rounded power for a few (base, n) (1.1^32, 1.3^28, 7.3^2 of
  those tried). So `exact_pow` (the default) computes base^n correctly rounded (fp64 powers,
  rounded once), which equals torch's wherever torch's is correctly rounded (1.75, the default
  base, for every n <= 45) and may differ by 1 ulp of the penalty elsewhere. On an H100 (torch
  2.11) it equalled torch's CUDA pow bit for bit on every case of tests/tinyllm/test_sampler_filters.py,
  where libdevice's powf (Triton's, exact_pow=False) differed by 2 ulps at two ids of 2.0^31. The rest rounds
  as torch does: the penalty's division is IEEE's (div_rn: Triton's `/` is not on CUDA) and no
  product is fused into an add (enable_fp_fusion=False: torch rounds the product first).
- Importing this module imports Triton: import it only where Triton is installed
  (tinyllm.kernels.qgemv.available()), and call it on CUDA tensors, or on CPU ones under Triton's
  interpreter (TRITON_INTERPRET=1, switches.triton_interpret).

Two launches:
- `_copy_kernel`, grid (cdiv(V, COPY_BLOCK), B): x[b, v] = float(logits[b, v]), -inf from n_valid on.
- `_filters_kernel`, grid (programs, B): each program recomputes its row's DRY penalties (H - 1
  spans: the span's match length, its penalty pen[j] and the id it predicts, t_j = h[j + 1]
  clamped to 0 as apply_dry's scatter clamps it), then takes every programs-th chunk of the
  row's candidate ids [ring (R), t_j (H - 1)] and writes each candidate's final value
  f(t) = penalized(logit[t]) - max(0, max of pen[j] over t_j == t), read from `logits` (not x:
  another program may have written x[t] already). Ids named twice are written twice with the
  same value; ids named by no candidate keep the copy's value (x - 0.0 is x).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from tinyllm.kernels import pdl

DRY_MAX_MATCH = 32  # tinyllm.decode.sampling_params.DRY_MAX_MATCH (a layer above this one: a test holds them equal)
COPY_BLOCK = 1024  # ids a program of the copy converts
CHUNK = 8  # candidate ids a filters program finishes at a time (a (CHUNK, H) comparison)


@triton.jit
def _copy_kernel(logits_ptr, x_ptr, V, n_valid, stride_l, stride_x, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """x[b, v] = float(logits[b, v]) for v < n_valid, -inf from n_valid on."""
    if PDL:  # the logits are the kernel before's
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    b = tl.program_id(1).to(tl.int64)
    v = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
    val = tl.load(logits_ptr + b * stride_l + v, mask=v < n_valid, other=0.0).to(tl.float32)  # (BLOCK,)
    tl.store(x_ptr + b * stride_x + v, tl.where(v < n_valid, val, float("-inf")), mask=v < V)


@triton.jit
def _pow_exact(base, n):
    """base (fp32 scalar) ** n (int, [0, 64)) as fp32: fp64 binary powers, rounded once. Their error
    is below 2^-47 relative, so this is base^n correctly rounded but within 2^-47 of a tie."""
    b = base.to(tl.float64)
    acc = tl.full(n.shape, 1.0, tl.float64)
    for i in tl.static_range(6):
        acc = tl.where(((n >> i) & 1) != 0, acc * b, acc)
        b = b * b
    return acc.to(tl.float32)


@triton.jit
def _filters_kernel(logits_ptr, x_ptr, ring_ptr, penalty_ptr, hist_ptr, breaker_ptr, dry_ptr, dry_n_ptr,
                    V, n_valid, stride_l, stride_x, stride_r, stride_h,
                    R: tl.constexpr, H: tl.constexpr, M: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_J: tl.constexpr, CHUNK: tl.constexpr, EXACT_POW: tl.constexpr,
                    PDL: tl.constexpr = False):
    """x[b, t] = f(t) for this program's chunks of row b's candidate ids (module docstring)."""
    if PDL:  # the ring and history are this step's (push), the copy writes x first
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    p, P = tl.program_id(0), tl.num_programs(0)
    b = tl.program_id(1).to(tl.int64)
    logits_row, x_row = logits_ptr + b * stride_l, x_ptr + b * stride_x
    ring_row, hist_row = ring_ptr + b * stride_r, hist_ptr + b * stride_h
    penalty = tl.load(penalty_ptr)
    r = tl.arange(0, BLOCK_R)  # (BLOCK_R,)
    ring = tl.load(ring_row + r, mask=r < R, other=-1)  # (BLOCK_R,) -1: no slot (ids are >= 0)

    # DRY: the match length of the span ending at j (against the latest span), its penalty, its id
    J: tl.constexpr = H - 1  # spans
    j = tl.arange(0, BLOCK_J)  # (BLOCK_J,)
    first = H - tl.load(dry_n_ptr + 1)  # positions before it are older than last_n: none
    pen = tl.zeros([BLOCK_J], tl.float32)  # (BLOCK_J,)
    target = tl.full([BLOCK_J], -2, tl.int64)  # (BLOCK_J,) -2: no span
    if J > 0:
        allowed = tl.load(dry_n_ptr)
        multiplier, base = tl.load(dry_ptr), tl.load(dry_ptr + 1)
        alive = j < J  # (BLOCK_J,) matched so far
        run = tl.zeros([BLOCK_J], tl.int64)  # (BLOCK_J,)
        for k in tl.static_range(M):  # the k-th latest id against the id k before j
            tail = tl.load(hist_row + (H - 1 - k), mask=H - 1 - k >= first, other=-1)  # scalar
            stops = tl.load(breaker_ptr + tl.maximum(tail, 0), mask=(tail >= 0) & (tail < V), other=1) != 0
            earlier = tl.load(hist_row + j - k, mask=(j - k >= 0) & (j - k >= first) & (j < J), other=-1)  # (BLOCK_J,)
            alive = alive & (earlier == tail) & (tail >= 0) & ~stops
            run += alive.to(tl.int64)
        over = run - allowed  # (BLOCK_J,)
        n = tl.maximum(over, 0)
        if EXACT_POW:
            grown = _pow_exact(base, n)  # (BLOCK_J,) base ** n
        else:
            grown = tl.extra.cuda.libdevice.pow(base, n.to(tl.float32))
        pen = tl.where((over >= 0) & (j < J), multiplier * grown, 0.0)  # (BLOCK_J,)
        nxt = tl.load(hist_row + j + 1, mask=(j < J) & (j + 1 >= first), other=-1)  # (BLOCK_J,) h[j + 1]
        target = tl.where(j < J, tl.maximum(nxt, 0), -2)  # (BLOCK_J,) apply_dry scatters -1's to id 0

    # the candidates: ring slots c < R, then span c - R's id
    C: tl.constexpr = R + J
    for c0 in range(p * CHUNK, C, P * CHUNK):
        c = c0 + tl.arange(0, CHUNK)  # (CHUNK,)
        from_ring = c < R
        t_ring = tl.load(ring_row + c, mask=from_ring, other=0)  # (CHUNK,)
        s = c - R  # (CHUNK,) the span, for c >= R
        t_span = tl.load(hist_row + s + 1, mask=(c >= R) & (s < J) & (s + 1 >= first), other=-1)
        t = tl.where(from_ring, t_ring, tl.maximum(t_span, 0))  # (CHUNK,)
        ok = (c < C) & (t >= 0) & (t < V)
        in_ring = tl.max((t[:, None] == ring[None, :]).to(tl.int32), axis=1) > 0  # (CHUNK,)
        drop = tl.max(tl.where(t[:, None] == target[None, :], pen[None, :], 0.0), axis=1)  # (CHUNK,) amax with 0
        seen = tl.load(logits_row + t, mask=ok & (t < n_valid), other=0.0).to(tl.float32)  # (CHUNK,)
        seen = tl.where(t < n_valid, seen, float("-inf"))
        seen = tl.where(in_ring, tl.where(seen > 0, tl.math.div_rn(seen, penalty), seen * penalty), seen)
        tl.store(x_row + t, seen - drop, mask=ok)


def filtered_logits(logits: Tensor, n_valid: int, ring: Tensor, penalty: Tensor, hist: Tensor, breaker: Tensor,
                    dry: Tensor, dry_n: Tensor, programs: int = 16, exact_pow: bool = True) -> Tensor:
    """logits (B, V) -> x (B, V) fp32, the penalized logits (module docstring). programs: filters
    programs a row. exact_pow: DRY's pow correctly rounded (True, the default) or libdevice's powf
    (False, CUDA only: the interpreter has no libdevice)."""
    B, V = logits.shape
    R, H = ring.shape[1], hist.shape[1]
    assert ring.shape[0] == B and hist.shape[0] == B and breaker.shape == (V,), "ring (B, R), hist (B, H), breaker (V,)"
    assert penalty.numel() == 1 and dry.numel() == 2 and dry_n.numel() == 2, "penalty (1,), dry (2,), dry_n (2,)"
    logits, ring, hist = (t if t.stride(-1) == 1 else t.contiguous() for t in (logits, ring, hist))
    x = torch.empty(B, V, dtype=torch.float32, device=logits.device)  # (B, V)
    options = pdl.launch_options(logits.device)
    _copy_kernel[(triton.cdiv(V, COPY_BLOCK), B)](logits, x, V, n_valid, logits.stride(0), x.stride(0),
                                                  BLOCK=COPY_BLOCK, num_warps=4, **options)
    _filters_kernel[(programs, B)](logits, x, ring, penalty, hist, breaker, dry, dry_n, V, n_valid,
                                   logits.stride(0), x.stride(0), ring.stride(0), hist.stride(0),
                                   R=R, H=H, M=min(DRY_MAX_MATCH, H - 1), BLOCK_R=triton.next_power_of_2(R),
                                   BLOCK_J=triton.next_power_of_2(max(H - 1, 1)), CHUNK=CHUNK, EXACT_POW=exact_pow,
                                   num_warps=4, enable_fp_fusion=False, **options)
    return x
