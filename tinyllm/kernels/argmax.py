"""The greedy draw of a decode step: the argmax of each row's logits in one Triton launch.

Contract:
- `argmax(x (B, V) fp32, bf16 or fp16, n, count (B,) int32) -> (B,) int64`: for each row the index of the
  largest of x[b, :n], as `x[:, :n].argmax(dim=-1)` draws it: the first one where several tie, and the
  first NaN where there is one (torch counts NaN as the largest). `count` is the caller's (zeros),
  one int32 a row that every call leaves at zero again, so a CUDA graph may replay the launch.
- One launch, grid (cdiv(n, BLOCK), B), no host sync (a CUDA graph captures it; PDL on Hopper,
  tinyllm.kernels.pdl). Each program finds its block's (largest, first index), writes them to a
  scratch row and counts itself done (acquire-release); the row's last program reduces the scratch
  row in index order, writes the id and puts the count back to 0. The result does not depend on
  which program is last: every block's pair is exact, and (largest, first index) is associative.
- Importing this module imports Triton: import it only where Triton is installed
  (tinyllm.kernels.qgemv.available()), and call it on CUDA tensors, or on CPU ones under Triton's
  interpreter (TRITON_INTERPRET=1, switches.triton_interpret).

Why: torch's argmax reduces a row in one block. Over SmolLM2's 49,152 logits that took 12.8 us on an
H100, as long as five of its layer's products (docs/BENCHMARKS.md); Gemma 3's row is 262,144.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from tinyllm.kernels import pdl

BLOCK = 4096  # logits a program reads
WARPS = 8
_NONE = tl.constexpr(2**31 - 1)  # an index past every row


@triton.jit
def _first_largest(v, i):
    """(largest, its first index) of v (N,) fp32 at indices i (N,) int32 (_NONE: not a value), NaN the largest."""
    nan = v != v
    first_nan = tl.min(tl.where(nan, i, _NONE), axis=0)
    top = tl.max(tl.where(nan | (i == _NONE), float("-inf"), v), axis=0)
    first_top = tl.min(tl.where((v == top) & (i != _NONE), i, _NONE), axis=0)
    has_nan = first_nan != _NONE
    return tl.where(has_nan, float("nan"), top), tl.where(has_nan, first_nan, first_top)


@triton.jit
def _argmax_kernel(x_ptr, out_ptr, best_ptr, at_ptr, count_ptr, n, stride_x, P_BLOCK: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # the logits come from a kernel before (the output layer's, or the filters')
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    p, P = tl.program_id(0), tl.num_programs(0)
    b = tl.program_id(1).to(tl.int64)
    i = p * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,)
    v = tl.load(x_ptr + b * stride_x + i, mask=i < n, other=float("-inf")).to(tl.float32)  # (BLOCK,)
    top, at = _first_largest(v, tl.where(i < n, i, _NONE))
    tl.store(best_ptr + b * P + p, top)
    tl.store(at_ptr + b * P + p, at)
    done = tl.atomic_add(count_ptr + b, 1, sem="acq_rel", scope="gpu")
    if done == P - 1:  # every other program's pair is visible: reduce them in order
        q = tl.arange(0, P_BLOCK)
        tops = tl.load(best_ptr + b * P + q, mask=q < P, other=float("-inf"), cache_modifier=".cg")
        ats = tl.load(at_ptr + b * P + q, mask=q < P, other=_NONE, cache_modifier=".cg")
        _, best = _first_largest(tops, ats)
        tl.store(out_ptr + b, best.to(tl.int64))
        tl.atomic_xchg(count_ptr + b, 0, sem="relaxed", scope="gpu")


def argmax(x: Tensor, n: int, count: Tensor) -> Tensor:
    """x (B, V) -> (B,) int64, the first largest of each row's first n values (module docstring)."""
    B = x.shape[0]
    assert x.stride(-1) == 1 and 0 < n <= x.shape[-1] and count.shape == (B,) and count.dtype == torch.int32
    assert x.dtype in (torch.float32, torch.bfloat16, torch.float16), "fp32, bf16 or fp16 (compared in fp32)"
    programs = triton.cdiv(n, BLOCK)
    best = torch.empty((B, programs), dtype=torch.float32, device=x.device)
    at = torch.empty((B, programs), dtype=torch.int32, device=x.device)
    out = torch.empty(B, dtype=torch.long, device=x.device)
    _argmax_kernel[(programs, B)](x, out, best, at, count, n, x.stride(0), P_BLOCK=triton.next_power_of_2(programs),
                                  BLOCK=BLOCK, num_warps=WARPS, **pdl.launch_options(x.device))
    return out
