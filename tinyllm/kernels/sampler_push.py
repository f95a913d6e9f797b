"""The decode step's push of the ids just fed into the sampler's windows, one Triton launch instead of five torch ones.

Contract:
- `push(ids (B, 1) int64, ring (B, R) int64, ring_at (1,) int64, hist (B, H) int64)` does in place what
  tinyllm.decode.step_sampler.StepSampler.push's torch code does:
      ring[:, ring_at] = ids; ring_at = (ring_at + 1) % R
      hist = cat([hist[:, 1:], ids], dim=1)
  One program walks every row (a decode step's batch is small), reads each row of `hist` whole
  before it writes it back shifted (a barrier between: the row is read and written in place), and
  moves `ring_at` last. Fixed launch, no host sync: a CUDA graph captures it (PDL on Hopper).
- Importing this module imports Triton: import it only where Triton is installed
  (tinyllm.kernels.qgemv.available()), and call it on CUDA tensors, or on CPU ones under Triton's
  interpreter (TRITON_INTERPRET=1, switches.triton_interpret).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from tinyllm.kernels import pdl


@triton.jit
def _push_kernel(ids_ptr, ring_ptr, at_ptr, hist_ptr, B, stride_r, stride_h, R: tl.constexpr, H: tl.constexpr,
                 BLOCK_H: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # the ids are a kernel before's (the step before's draw)
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    at = tl.load(at_ptr)
    j = tl.arange(0, BLOCK_H)  # (BLOCK_H,)
    for b in range(B):
        new = tl.load(ids_ptr + b)
        tl.store(ring_ptr + b * stride_r + at, new)
        row = hist_ptr + b * stride_h
        later = tl.load(row + j + 1, mask=j + 1 < H, other=0)  # (BLOCK_H,) hist[b, j + 1]
        tl.debug_barrier()  # every thread has read the row before any writes it
        tl.store(row + j, tl.where(j == H - 1, new, later), mask=j < H)
        tl.debug_barrier()  # (rows do not overlap: kept so that a row's writes precede the next row's reads plainly)
    tl.store(at_ptr, (at + 1) % R)


def push(ids: Tensor, ring: Tensor, ring_at: Tensor, hist: Tensor) -> None:
    """ids (B, 1) into ring (B, R) at ring_at (1,) and onto hist (B, H), in place (module docstring)."""
    B, R = ring.shape
    H = hist.shape[1]
    assert ids.shape == (B, 1) and ids.is_contiguous() and ring.stride(-1) == 1 and hist.stride(-1) == 1
    _push_kernel[(1,)](ids, ring, ring_at, hist, B, ring.stride(0), hist.stride(0), R=R, H=H,
                       BLOCK_H=triton.next_power_of_2(H), num_warps=4, **pdl.launch_options(ids.device))
