"""Weight-only quantized linear layers: int8 per output channel, int4 in groups of 32 or 64.

Contract:
- `QTensor` is the canonical form of one quantized (N, K) matrix, the form checkpoints store
  and importers produce: int8 `qweight` (N, K) with `scales` (N,), w = q * s; or int4
  `qweight` uint8 (N, K/2) (element 2j in the low nibble, 2j+1 in the high one) with `scales`
  and `zeros` (N, K/g), w = q * s + z, q in 0..15. Rows are independent, so row slices,
  permutations and concatenations of QTensors are exact.
- `quantize(w, kind, group)`: fp32 (N, K) -> QTensor; round to nearest, so |w - dequantize| is
  at most half a step (int8: max|row| / 254; int4: (max - min of the group) / 30).
- `QuantLinear(qt, dtype)` computes x @ dequantize(qt).T in `dtype` (the model's activations).
  Its scales and offsets are held as given, never rounded to `dtype`: fp16 where every value
  is exact in fp16 (a GGUF's), else fp32; the kernels convert them as they read them.
  Kernels, picked once per device when built:
    CPU, fp32  tinyllm.cpu_qgemv's AVX2 ops (int8 and int4; x rounded to int8 blocks of 32, as
               llama.cpp does), reading the canonical form in place; int4 scales and zeros
               exact in fp16 (a GGUF's Q4_0/Q4_1) held in fp16. Where that kernel cannot be
               built (one warning), the kernels below:
    CPU int8   fbgemm's `quantized::linear_dynamic` (PyTorch's own; x is quantized to 8 bits per
               tensor on the fly, as llama.cpp quantizes activations). Measured on a 2-core AVX2
               CPU for a (3072, 576) matrix, batch 1: fbgemm 96-137 us, fp32 sgemv 180-230 us,
               aten `_weight_int8pack_mm` 1,000-1,700 us. Without fbgemm: `_weight_int8pack_mm`.
    CPU int4   aten `_weight_int4pack_mm_for_cpu` (exact; slow on AVX2, see docs/BENCHMARKS-LOG.md);
               it needs N a multiple of 16, other matrices take the CUDA formulation.
    CUDA       up to tinyllm.qgemv.MAX_ROWS rows (decode), eager and compiled alike:
               tinyllm.qgemv's Triton kernels, which read the int8 / packed int4 bytes in
               place. Without Triton, a compiled batch-1 step is one Inductor reduction over
               the int8 / int4 loads (gpt-fast's int8 approach). More rows, or eager code
               without Triton: dequantize to `dtype` and the library product.
  Every kernel is graph-safe: no host syncs, no data-dependent shapes; the fbgemm call is a
  custom op (`tinyllm::fbgemm_linear`) so torch.compile(fullgraph=True) keeps it in the graph.
- `QuantEmbedding(qt, dtype)`: row lookups dequantized to `dtype` (tied tables and tok_emb).
- `state_dict()` of either gives the canonical QTensor (`.qweight`, `.scales`, `.zeros`),
  whatever layout the kernel holds, so a checkpoint saves and loads back unchanged.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinyllm import cpu_qgemv, qgemv
from tinyllm.nn_module import Module

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


def _exact_in_fp16(t: Tensor) -> bool:
    return bool((t.half().float() == t).all())


def held_exactly(t: Tensor | None) -> Tensor | None:
    """Scales or offsets as a layer holds them, never rounded: fp16 where every value is exact in
    fp16 (a GGUF's), else fp32. Rounded to bf16 (the activations' dtype on CUDA), a checkpoint
    saved from the layer would no longer be the one loaded."""
    if t is None:
        return None
    t = t.float()
    return t.half() if _exact_in_fp16(t) else t


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


# ---- kernels -------------------------------------------------------------------------------

_FBGEMM: dict[int, object] = {}  # key -> fbgemm packed weight (a TorchScript object the compiler cannot trace)


def fbgemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


@torch.library.custom_op("tinyllm::fbgemm_linear", mutates_args=())
def fbgemm_linear(x: Tensor, key: int, n: int) -> Tensor:
    """x (M, K) fp32 @ the int8 matrix registered under `key` -> (M, n) fp32."""
    return torch.ops.quantized.linear_dynamic(x, _FBGEMM[key], True)


@fbgemm_linear.register_fake
def _(x: Tensor, key: int, n: int) -> Tensor:
    return x.new_empty(x.shape[0], n)


def _int8pack_takes(x: Tensor, k: int) -> bool:
    """Whether torch's `_weight_int8pack_mm` may be called: with bf16 x of more than one row and
    K not a multiple of 16 it crashes the process (torch 2.13 on an AVX512-BF16 / AMX CPU,
    measured: K = 164, 168, 170, 172, 1000 with 2 to 16 rows; fp32, one row, K = 160 or 176 ran)."""
    return x.dtype == torch.float32 or k % 16 == 0 or x.shape[:-1].numel() == 1


def _fbgemm_pack(qt: QTensor) -> object:
    zp = torch.zeros(qt.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensor types are deprecated (the op that takes them is not)
        warnings.simplefilter("ignore", UserWarning)
        qw = torch._make_per_channel_quantized_tensor(qt.qweight.cpu(), qt.scales.double().cpu(), zp, 0)
    return torch.ops.quantized.linear_prepack(qw, None)


class QuantLinear(Module):
    """y = x @ W.T for a QTensor W, in the activations' dtype (see the module docstring)."""

    def __init__(self, qt: QTensor, dtype: torch.dtype, generic: bool = False) -> None:
        """generic: hold the canonical form and use the CUDA formulation on any device (tests)."""
        super().__init__()
        self.kind, self.group = qt.kind, qt.group
        self.out_features, self.in_features = qt.shape
        self.key: int | None = None
        self._dtype = dtype
        device = torch.device("meta") if generic else qt.qweight.device
        self.avx2 = device.type == "cpu" and dtype == torch.float32 and cpu_qgemv.available()
        if self.avx2:  # the kernel reads the canonical form in place (shared with a tied embedding)
            s, z = qt.scales.contiguous(), None if qt.zeros is None else qt.zeros.contiguous()
            if z is not None and _exact_in_fp16(s) and _exact_in_fp16(z):  # a GGUF's Q4_0 / Q4_1
                s, z = s.half(), z.half()  # int4 + fp16 pairs: 20 bytes a block of 32, as llama.cpp reads
            self.register_buffer("qweight", qt.qweight.contiguous())
            self.register_buffer("scales", s)
            self.register_buffer("zeros", z)
        elif device.type == "cpu" and qt.kind == "int8" and dtype == torch.float32 and fbgemm_available():
            self.key = id(self)
            _FBGEMM[self.key] = _fbgemm_pack(qt)  # holds the int8 matrix: no copy of ours is kept
            self.register_buffer("scales", qt.scales.to(dtype))  # (N,): for dtype/device and state_dict
        elif device.type == "cpu" and qt.kind == "int4" and qt.shape[0] % 16 == 0:  # the kernel's N
            q = unpack_int4(qt.qweight).to(torch.int32)  # (N, K)
            self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
            sz = torch.stack((qt.scales, qt.zeros + 8 * qt.scales), -1)  # (N, K/g, 2): w = (q - 8) s + z'
            self.register_buffer("scales_zeros", sz.transpose(0, 1).contiguous().to(dtype))  # (K/g, N, 2)
            self.register_buffer("scales", held_exactly(qt.scales))  # the exact values, for state_dict
            self.register_buffer("zeros", held_exactly(qt.zeros))
        else:
            self.register_buffer("qweight", qt.qweight)
            self.register_buffer("scales", held_exactly(qt.scales))  # converted to `dtype` where used
            self.register_buffer("zeros", held_exactly(qt.zeros))
            if qt.kind == "int8":  # the many-row formulation's scales, already in `dtype`: converted
                # in the graph, Inductor's int8 weight-only pass fails on them (AssertionError:
                # Pointwise; torch 2.11 and 2.13, bf16)
                self.register_buffer("act_scales", qt.scales.to(dtype), persistent=False)
        self.generic = generic

    def __del__(self) -> None:
        if self.key is not None:
            _FBGEMM.pop(self.key, None)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (inputs and outputs)."""
        return self._dtype

    def qtensor(self) -> QTensor:
        """The canonical form, recovered from whatever layout the kernel holds."""
        if self.key is not None:
            qw = torch.ops.quantized.linear_unpack(_FBGEMM[self.key])[0]
            return QTensor("int8", qw.int_repr(), qw.q_per_channel_scales().float())
        if hasattr(self, "packed"):  # x = I, s = 1, z' = 8 reads the 4-bit values back exactly
            k, g = self.in_features, self.group
            ones = torch.ones(k // g, self.out_features, 1)
            q = torch.ops.aten._weight_int4pack_mm_for_cpu(torch.eye(k), self.packed, g,
                                                           torch.cat((ones, 8 * ones), -1))  # (K, N)
            return QTensor("int4", pack_int4(q.T.round()), self.scales.float(), self.zeros.float())
        return QTensor(self.kind, self.qweight, self.scales.float(),
                       None if self.zeros is None else self.zeros.float())

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        qt = self.qtensor()
        destination[prefix + "qweight"] = qt.qweight
        destination[prefix + "scales"] = qt.scales
        if qt.zeros is not None:
            destination[prefix + "zeros"] = qt.zeros

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N)."""
        lead = x.shape[:-1]
        if self.avx2:
            x2 = x.reshape(-1, self.in_features)  # (M, K)
            return cpu_qgemv.linear(x2, self.qweight, self.scales, self.zeros).view(*lead, -1)  # (..., N)
        if self.key is not None:
            return fbgemm_linear(x.reshape(-1, self.in_features), self.key, self.out_features).view(*lead, -1)
        if hasattr(self, "packed"):
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, self.in_features).contiguous(), self.packed,
                                                          self.group, self.scales_zeros)  # (M, N)
            return y.view(*lead, -1)
        if x.device.type == "cpu" and self.kind == "int8" and not self.generic and _int8pack_takes(x, self.in_features):
            y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).contiguous(), self.qweight,
                                                   self.act_scales.to(x.dtype))  # (M, N): see act_scales
            return y.view(*lead, -1)
        if not self.generic and qgemv.supported(x):  # CUDA, a few rows: the Triton kernels
            y = qgemv.linear(x.reshape(-1, self.in_features), self.kind, self.qweight, self.scales, self.zeros,
                             self.group)  # (M, N)
            return y.view(*lead, -1)
        if torch.compiler.is_dynamo_compiling() and lead.numel() == 1:
            return self._reduce(x)
        if self.kind == "int8":  # gpt-fast: the scale is per output, so it applies after the product
            return F.linear(x, self.qweight.to(x.dtype)) * self.act_scales  # (..., N)
        return F.linear(x, self._dequantized(x.dtype))

    def fused(self, x: Tensor, norm: nn.Module | None, residual: Tensor | None) -> Tensor | None:
        """residual + self(norm(x)) as one kernel (model.linear): on CUDA, for a few rows, the
        norm (a model.RMSNorm) and the residual (..., N) folded into the product (tinyllm.qgemv);
        None elsewhere, and the caller runs them apart."""
        if self.generic or not qgemv.supported(x) or not (qgemv.fold() or norm is None and residual is None):
            return None
        lead = x.shape[:-1]
        y = qgemv.linear(x.reshape(-1, self.in_features), self.kind, self.qweight, self.scales, self.zeros, self.group,
                         norm=None if norm is None else (norm.weight, norm.eps),
                         residual=None if residual is None else residual.reshape(-1, self.out_features))  # (M, N)
        return y.view(*lead, -1)

    def swiglu(self, down: nn.Module, x: Tensor, norm: nn.Module) -> Tensor | None:
        """x + down(silu(gate) * up) of norm(x), this layer holding gate and up (its two halves
        of rows), x (..., K) -> (..., K): on CUDA for a few rows, the norm (where qgemv.fold())
        and the gating in the gate/up product's kernel and the residual in down's; one op
        (tinyllm.cpu_qgemv.ffn) where both layers run the AVX2 kernel; None otherwise, and the
        caller runs the layers."""
        lead = x.shape[:-1]
        if not self.generic and qgemv.supported(x):
            fold = qgemv.fold()
            h = qgemv.linear((x if fold else norm(x)).reshape(-1, self.in_features), self.kind, self.qweight,
                             self.scales, self.zeros, self.group, gated=True,
                             norm=(norm.weight, norm.eps) if fold else None).view(*lead, -1)  # (..., F)
            fused = getattr(down, "fused", None)
            y = None if fused is None else fused(h, None, x)
            return x + down(h) if y is None else y
        if not (self.avx2 and isinstance(down, QuantLinear) and down.avx2):
            return None
        y = cpu_qgemv.ffn(norm(x).reshape(-1, self.in_features), (self.qweight, self.scales, self.zeros),
                          (down.qweight, down.scales, down.zeros))  # (M, D)
        return x + y.view(*lead, -1)

    def _dequantized(self, dtype: torch.dtype) -> Tensor:
        n, k, g = self.out_features, self.in_features, self.group
        q = unpack_int4(self.qweight).view(n, k // g, g).to(dtype)  # (N, K/g, g)
        return (q * self.scales.to(dtype)[..., None] + self.zeros.to(dtype)[..., None]).view(n, k)  # (N, K)

    def _reduce(self, x: Tensor) -> Tensor:
        """One row, written as a product and a sum over K, so Inductor emits one reduction
        kernel with the int8 / int4 loads and the dequantization fused into it."""
        if self.kind == "int8":
            return (x[..., None, :] * self.qweight.to(x.dtype)).sum(-1) * self.scales.to(x.dtype)  # (..., N)
        return (x[..., None, :] * self._dequantized(x.dtype)).sum(-1)  # (..., N)


class QuantEmbedding(Module):
    """Embedding rows held as a QTensor (canonical form), dequantized to `dtype` on lookup."""

    def __init__(self, qt: QTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.kind = qt.kind
        self.num_embeddings, self.embedding_dim = qt.shape
        self.register_buffer("qweight", qt.qweight)
        self.register_buffer("scales", held_exactly(qt.scales))
        self.register_buffer("zeros", held_exactly(qt.zeros))
        self.register_buffer("like", torch.empty(0, dtype=dtype, device=qt.qweight.device), persistent=False)

    @property
    def weight(self) -> Tensor:
        """Stands for the table where callers ask a weight's device and dtype (the model's)."""
        return self.like

    def qtensor(self) -> QTensor:
        return QTensor(self.kind, self.qweight, self.scales.float(), None if self.zeros is None else self.zeros.float())

    def forward(self, idx: Tensor) -> Tensor:
        """idx (B, T) -> (B, T, C) in the model's dtype."""
        dt = self.like.dtype
        q = self.qweight[idx]  # (B, T, C) int8 | (B, T, C/2) uint8
        if self.kind == "int8":
            return q.to(dt) * self.scales[idx].to(dt)[..., None]
        g = self.embedding_dim // self.scales.shape[1]
        q = unpack_int4(q).view(*idx.shape, -1, g).to(dt)  # (B, T, C/g, g)
        return (q * self.scales[idx].to(dt)[..., None] + self.zeros[idx].to(dt)[..., None]).flatten(-2)


def quantized_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer, plus the int8 matrices fbgemm holds for QuantLinear."""
    seen = {t.data_ptr(): t for t in (*model.parameters(), *model.buffers())}
    total = sum(t.numel() * t.element_size() for t in seen.values())
    return total + sum(m.in_features * m.out_features for m in model.modules()
                       if isinstance(m, QuantLinear) and m.key is not None)


def logical_params(model: nn.Module) -> int:
    """Parameters the model stands for: dense ones plus each quantized matrix's N x K."""
    n = sum(p.numel() for p in model.parameters())
    for m in model.modules():
        if isinstance(m, QuantLinear):
            n += m.in_features * m.out_features
        elif isinstance(m, QuantEmbedding):
            n += m.num_embeddings * m.embedding_dim
    return n
