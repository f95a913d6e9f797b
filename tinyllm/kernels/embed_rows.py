"""A quantized embedding's lookup in one Triton launch: each row dequantized as tinyllm.core.quant_linear.QuantEmbedding's
torch code does it (about six kernels for an int4 row).

Contract:
- `rows(idx (N,) int64, kind, qweight, scales, zeros | None, dtype) -> (N, C) dtype`, the table held in canonical
  form (tinyllm.core.quant): int8 (V, C) with scales (V,), or int4 (V, C/2) packed low nibble first with
  scales and zeros (V, C/g). Each value is QuantEmbedding.forward's, bit for bit: the integer, times
  the scale in fp32, plus the offset in fp32 (each rounded: no fused multiply-add), rounded once to dtype
  (to nearest even, as torch: by hand for bf16, whose cast Triton's interpreter truncates; the values are finite).
- One launch, a program a row, no host sync (a CUDA graph captures it; PDL on Hopper). The ids are
  taken on trust: each in [0, V) (torch's lookup checks them; a decode step's come from its own draw).
- Importing this module imports Triton: import it only where Triton is installed
  (tinyllm.kernels.qgemv.available()), and call it on CUDA tensors, or on CPU ones under Triton's
  interpreter (TRITON_INTERPRET=1, switches.triton_interpret).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from tinyllm.kernels import pdl


@triton.jit
def _rows_kernel(idx_ptr, q_ptr, s_ptr, z_ptr, out_ptr, C: tl.constexpr, G: tl.constexpr, INT4: tl.constexpr,
                 ZEROS: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # the ids may come from a kernel before (a decode step's draw)
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    r = tl.program_id(0).to(tl.int64)
    i = tl.load(idx_ptr + r).to(tl.int64)  # the table's row
    c = tl.arange(0, BLOCK_C)  # (BLOCK_C,)
    ok = c < C
    if INT4:
        byte = tl.load(q_ptr + i * (C // 2) + c // 2, mask=ok, other=0)  # (BLOCK_C,) uint8, each twice
        q = tl.where(c % 2 == 0, byte & 15, byte >> 4).to(tl.float32)
        w = q * tl.load(s_ptr + i * (C // G) + c // G, mask=ok, other=0.0).to(tl.float32)
        if ZEROS:
            w = w + tl.load(z_ptr + i * (C // G) + c // G, mask=ok, other=0.0).to(tl.float32)
    else:
        w = tl.load(q_ptr + i * C + c, mask=ok, other=0).to(tl.float32) * tl.load(s_ptr + i).to(tl.float32)
    if out_ptr.dtype.element_ty == tl.bfloat16:  # rounded to nearest even by hand: the interpreter's cast truncates
        u = w.to(tl.uint32, bitcast=True)
        half = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).to(tl.uint16)
        tl.store(out_ptr + r * C + c, half.to(tl.bfloat16, bitcast=True), mask=ok)
    else:
        tl.store(out_ptr + r * C + c, w.to(out_ptr.dtype.element_ty), mask=ok)


def rows(idx: Tensor, kind: str, qweight: Tensor, scales: Tensor, zeros: Tensor | None, dtype: torch.dtype) -> Tensor:
    """idx (N,) -> (N, C): the table's rows at idx, dequantized (module docstring)."""
    int4 = kind == "int4"
    C = qweight.shape[1] * (2 if int4 else 1)
    G = C // scales.shape[1] if int4 else 0
    assert all(t is None or t.is_contiguous() for t in (idx, qweight, scales, zeros))
    out = torch.empty((idx.numel(), C), dtype=dtype, device=qweight.device)
    _rows_kernel[(idx.numel(),)](idx, qweight, scales, zeros if zeros is not None else scales, out, C=C, G=G, INT4=int4,
                                 ZEROS=zeros is not None, BLOCK_C=triton.next_power_of_2(C), num_warps=4,
                                 enable_fp_fusion=False, **pdl.launch_options(qweight.device))
    return out
