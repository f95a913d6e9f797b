"""Quantized matrices in their canonical form: int8 per output channel, int4 in groups of 32 or 64.

Contract:
- `QTensor` is the canonical form of one quantized (N, K) matrix, the form checkpoints store
  and importers produce: int8 `qweight` (N, K) with `scales` (N,), w = q * s; or int4
  `qweight` uint8 (N, K/2) (element 2j in the low nibble, 2j+1 in the high one) with `scales`
  and `zeros` (N, K/g), w = q * s + z, q in 0..15. Rows are independent, so row slices,
  permutations and concatenations of QTensors are exact.
- `quantize(w, kind, group)`: fp32 (N, K) -> QTensor; round to nearest, so |w - dequantize| is
  at most half a step (int8: max|row| / 254; int4: (max - min of the group) / 30).
- `held_exactly(t)`: scales or offsets as a layer holds them, never rounded (fp16 where every
  value is exact in fp16, else fp32); `cat(parts)`: a fused projection's rows; `fits(shape,
  kind, group)`: whether a matrix can be held as `kind`.
- `half_scales(qt)`: an int4 QTensor with its scales and offsets in fp16, rounded where no value
  loses more than fp16's rounding (tinyllm.formats.build holds int4 so on CUDA, where the
  bytes are what a decode step reads).
- `fbgemm_available()`: whether PyTorch's fbgemm engine is here (tinyllm.core.quant_linear's CPU int8
  kernel without the AVX2 one; the load rule asks too).
The layers that hold QTensors, one class per kernel, are tinyllm.core.quant_linear's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

KINDS = ("int8", "int4")
GROUPS = (32, 64)


@dataclass
class QTensor:
    """One quantized (N, K) matrix in canonical form (see the module docstring)."""
    kind: str  # "int8" | "int4"
    qweight: Tensor  # int8 (N, K) | uint8 (N, K/2)
    scales: Tensor  # (N,) | (N, K/g)
    zeros: Tensor | None = None  # None | (N, K/g)

    @property
    def shape(self) -> tuple[int, int]:
        n, k = self.qweight.shape
        return (n, k * 2) if self.kind == "int4" else (n, k)

    @property
    def group(self) -> int:
        return self.shape[1] // self.scales.shape[1] if self.kind == "int4" else self.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros) if t is not None)

    def map(self, fn) -> QTensor:
        """The same rows transformed by fn (a row permutation, slice, .to(device), ...)."""
        return QTensor(self.kind, fn(self.qweight), fn(self.scales), None if self.zeros is None else fn(self.zeros))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        if self.kind == "int8":
            return (self.qweight.to(dtype) * self.scales.to(dtype)[:, None])  # (N, K)
        n, k = self.shape
        q = unpack_int4(self.qweight).view(n, k // self.group, self.group).to(dtype)  # (N, K/g, g)
        return (q * self.scales.to(dtype)[..., None] + self.zeros.to(dtype)[..., None]).view(n, k)


def exact_in_fp16(t: Tensor) -> bool:
    return bool((t.half().float() == t).all())


def held_exactly(t: Tensor | None) -> Tensor | None:
    """Scales or offsets as a layer holds them, never rounded: fp16 where every value is exact in
    fp16 (a GGUF's), else fp32. Rounded to bf16 (the activations' dtype on CUDA), a checkpoint
    saved from the layer would no longer be the one loaded."""
    if t is None or t.dtype == torch.float16:  # fp16 is exact in fp16: shared, not copied
        return t
    t = t.float()
    return t.half() if exact_in_fp16(t) else t


def half_scales(qt: QTensor) -> QTensor:
    """`qt` with int4 scales and offsets in fp16: 2 bytes each instead of 4, so a group of 32
    is 20 bytes (5 bits a weight) instead of 24 (6). Rounded, where no value moves by more than
    2^-11 of itself (fp16's unit roundoff: no overflow, no subnormal loss); either tensor
    failing that leaves both as held_exactly holds them, and int8 is as it is (one scale a row).
    A weight q s + z then moves by at most 2^-11 (q |s| + |z|). A GGUF's Q4_K (s = d sc,
    z = -dmin mn: exact in fp32, about 5-15% exact in fp16) rounded so moved a weight by at
    most 1.1% of its group's step, where bf16 (every weight of a dense load on CUDA) moved it
    by up to 4.2% (random Q4_K blocks of weights with std 0.005-0.1, measured on the CPU)."""
    if qt.kind != "int4":
        return qt
    s, z = qt.scales.float(), qt.zeros.float()
    if not all(((t.half().float() - t).abs() <= t.abs() * 2**-11).all() for t in (s, z)):
        return QTensor("int4", qt.qweight, held_exactly(s), held_exactly(z))
    return QTensor("int4", qt.qweight, s.half(), z.half())


def cat(parts: list[QTensor]) -> QTensor:
    """Row-wise concatenation (a fused projection); parts must share kind and group."""
    assert len({(p.kind, p.group) for p in parts}) == 1, "fused parts must share kind and group"
    z = None if parts[0].zeros is None else torch.cat([p.zeros for p in parts])
    return QTensor(parts[0].kind, torch.cat([p.qweight for p in parts]), torch.cat([p.scales for p in parts]), z)


def unpack_int4(p: Tensor) -> Tensor:
    """uint8 (..., K/2) -> uint8 (..., K): low nibble first."""
    return torch.stack((p & 15, p >> 4), dim=-1).flatten(-2)


def pack_int4(q: Tensor) -> Tensor:
    """(..., K) values 0..15 -> uint8 (..., K/2)."""
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def quantize(w: Tensor, kind: str, group: int = 32, half: bool = False) -> QTensor:
    """fp32 (N, K) -> QTensor, round to nearest (symmetric int8 per row; asymmetric int4 per group).
    `half` rounds int4 scales and offsets to fp16 first (GGUF Q4_1's layout: 0.625 bytes a weight
    at group 32 instead of 0.75; the CPU kernel reads them as they are); the weights are then
    rounded on that grid, so the bound above grows by the fp16 rounding of the offset."""
    w = w.float()
    if kind == "int8":
        s = (w.abs().amax(1) / 127).clamp(min=1e-12)  # (N,)
        return QTensor("int8", (w / s[:, None]).round().clamp(-127, 127).to(torch.int8), s)
    if kind != "int4":
        raise ValueError(f"unknown quantization {kind!r}: use int8 or int4")
    n, k = w.shape
    if k % group:
        raise ValueError(f"int4 needs rows that are whole groups of {group}; this matrix has {k} columns")
    wg = w.view(n, k // group, group)  # (N, K/g, g)
    lo, hi = wg.amin(-1), wg.amax(-1)  # (N, K/g)
    s = ((hi - lo) / 15).clamp(min=1e-12)
    if half:
        s, lo = s.clamp(min=2**-24).half().float(), lo.half().float()
    q = ((wg - lo[..., None]) / s[..., None]).round().clamp(0, 15)
    return QTensor("int4", pack_int4(q.view(n, k)), s, lo)


def fits(shape: tuple[int, int], kind: str, group: int) -> bool:
    """Whether a matrix of `shape` can be held as `kind` (int4 needs whole groups)."""
    return kind == "int8" or shape[1] % group == 0


def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines
