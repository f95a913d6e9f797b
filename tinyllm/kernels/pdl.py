"""Programmatic dependent launch (PDL) for our Triton kernels on Hopper and later GPUs.

Contract:
- `enabled(device) -> bool`: launch our decode kernels with PDL on this device: a CUDA GPU of
  compute capability 9.0 or more, Triton with `gdc_wait` (imported here: call it only where
  Triton is already imported), and not switched off with TINYLLM_PDL=0.
- `launch_options(device) -> dict`: the keyword arguments a launch of one of our kernels takes
  (each has a `PDL` constexpr that turns its gdc_wait / gdc_launch_dependents on).
- `inductor_enabled()`: the same question for the kernels Inductor generates
  (`torch._inductor.config.triton.enable_pdl`, where this torch has that setting); the compiled
  step turns that setting on when it is true (cuda_graph.prepare_compile).

A kernel launched with PDL (`launch_pdl=True`) may start while the kernel before it in the
stream is still finishing. It must call `tl.extra.cuda.gdc_wait()` before it reads anything
that kernel wrote; what no kernel of the step writes (the weights) it may read before.
`gdc_launch_dependents()` lets the next PDL kernel start in turn. So a decode step's chain
of small kernels overlaps each kernel's launch and its first weight loads with the tail of
the one before, where a plain launch waits for the whole previous grid to drain.
"""

from __future__ import annotations

import functools

import torch

from tinyllm.kernels.switches import SWITCHES


def _switched_on() -> bool:
    """TINYLLM_PDL=0: no PDL at all; =kernels: our kernels only, not Inductor's (to measure)."""
    return SWITCHES.pdl != "0"


@functools.cache
def enabled(device: torch.device) -> bool:
    if device.type != "cuda" or not _switched_on():
        return False
    import triton.language as tl

    return torch.cuda.get_device_capability(device)[0] >= 9 and hasattr(tl.extra.cuda, "gdc_wait")


def launch_options(device: torch.device) -> dict:
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {"PDL": False}


def inductor_enabled() -> bool:
    import torch._inductor.config as inductor

    return (_switched_on() and SWITCHES.pdl != "kernels" and hasattr(inductor.triton, "enable_pdl")
            and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9)
