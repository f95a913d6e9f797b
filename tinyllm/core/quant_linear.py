"""Quantized linear layers: one class per storage layout and kernel, picked once when a model is built.

Contract:
- `QuantLinear`, the base of each: y = x @ dequantize(qt).T for a tinyllm.core.quant QTensor, in
  the activations' dtype `dtype` (x (..., K) -> (..., N)); a tinyllm.core.linear.Linear (`fused`,
  `swiglu`, `native_parts`). `kind`, `group`, `in_features`, `out_features` describe the
  matrix; `qtensor()` gives back its canonical form from whatever layout the kernel holds, and
  `state_dict()` gives that form (`qweight`, `scales`, `zeros`), so a checkpoint saves and
  loads back unchanged. Scales and offsets are held as given, never rounded to `dtype`
  (quant.held_exactly: fp16 where every value is exact in fp16, a GGUF's, else fp32; on CUDA
  tinyllm.formats.build gives int4 ones in fp16 already, quant.half_scales); the kernels
  convert them as they read them.
- `quant_linear(qt, dtype, device=None) -> QuantLinear`: the layer of the kernel
  `kernel_for(qt, dtype, device)` picks, on `device` (default: qt's). In the order it asks:
    CpuQgemvLinear  CPU, fp32, where tinyllm.kernels.cpu_qgemv is available (it builds there the
                    first time): its AVX2 ops (int8 and int4; x rounded to int8 blocks of 32, as
                    llama.cpp does), reading the canonical form in place; int4 scales and zeros
                    exact in fp16 (a GGUF's Q4_0 / Q4_1) held in fp16. `swiglu` is one op
                    (cpu_qgemv.ffn) where `down` is one too; the native CPU step reads this
                    layout (`native_parts`), and no other quantized one.
    FbgemmLinear    CPU int8, fp32: fbgemm's `quantized::linear_dynamic` (PyTorch's own; x
                    quantized to 8 bits per tensor on the fly). Measured on a 2-core AVX2 CPU for
                    a (3072, 576) matrix, batch 1: fbgemm 96-137 us, fp32 sgemv 180-230 us, aten
                    `_weight_int8pack_mm` 1,000-1,700 us. A custom op (`tinyllm::fbgemm_linear`)
                    so torch.compile(fullgraph=True) keeps it in the graph.
    Int4PackLinear  CPU int4 with N a multiple of 16: aten `_weight_int4pack_mm_for_cpu` (exact;
                    slow on AVX2, see docs/BENCHMARKS-LOG.md).
    Int8PackLinear  CPU int8 otherwise (activations in bf16, or no fbgemm): aten
                    `_weight_int8pack_mm`, and the reference where that op would crash
                    (`_int8pack_takes`).
    TritonLinear    CUDA with Triton (tinyllm.kernels.qgemv.available): up to qgemv.MAX_ROWS rows (decode),
                    eager and compiled alike, tinyllm.kernels.qgemv's kernels, which read the int8 /
                    packed int4 bytes in place; `fused` folds the norm and the residual into the
                    product (where qgemv.fold()), `swiglu` the gating into gate/up's. More rows:
                    the reference.
    DequantLinear   The reference, on any device (CUDA without Triton, a CPU's other int4
                    matrices, tests): in a compiled step of one row, one Inductor reduction over
                    the int8 / int4 loads (gpt-fast's int8 approach); else dequantized to `dtype`
                    and the library product (int8: the per-row scale applied after it), a block of
                    at most DEQUANT_BLOCK weights at a time: a prompt's prefill holds no dequantized
                    copy of a whole matrix (an 8B's int4 gate and up: about 0.8 GB of temporaries).
  Every kernel is graph-safe: no host syncs, no data-dependent shapes.
- `QuantEmbedding(qt, dtype)`: row lookups dequantized to `dtype` (tied tables and tok_emb); the
  native CPU step reads it as it is.
- `quantized_bytes(model)`, `logical_params(model)`: a model's bytes (fbgemm's packed copies
  included) and the parameters it stands for.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinyllm.core import quant
from tinyllm.core.linear import NONE, Embedding, Linear, TritonProducts
from tinyllm.core.quant import QTensor, exact_in_fp16, held_exactly, pack_int4, unpack_int4
from tinyllm.kernels import cpu_qgemv, qgemv, switches

DEQUANT_BLOCK = 1 << 24  # weights the reference dequantizes at a time (32 MB in bf16)


class QuantLinear(Linear):
    """y = x @ W.T for a QTensor W, in the activations' dtype (see the module docstring)."""

    def __init__(self, qt: QTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.kind, self.group = qt.kind, qt.group
        self.out_features, self.in_features = qt.shape
        self._dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (inputs and outputs)."""
        return self._dtype

    def qtensor(self) -> QTensor:
        """The canonical form (this base: the layer holds `qweight`, `scales`, `zeros` as they are)."""
        return QTensor(self.kind, self.qweight, self.scales.float(), None if self.zeros is None else self.zeros.float())

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        qt = self.qtensor()
        destination[prefix + "qweight"] = qt.qweight
        destination[prefix + "scales"] = qt.scales
        if qt.zeros is not None:
            destination[prefix + "zeros"] = qt.zeros

    def native_parts(self) -> list[Tensor]:
        raise ValueError("quantized for another kernel")

    def _rows(self, x: Tensor) -> Tensor:
        return x.reshape(-1, self.in_features)  # (M, K)


class CpuQgemvLinear(QuantLinear):
    """The AVX2 kernel of tinyllm.kernels.cpu_qgemv, on a CPU computing in fp32."""

    def __init__(self, qt: QTensor, dtype: torch.dtype) -> None:
        super().__init__(qt, dtype)
        # the kernel reads the canonical form in place (shared with a tied embedding)
        s, z = qt.scales.contiguous(), None if qt.zeros is None else qt.zeros.contiguous()
        if z is not None and exact_in_fp16(s) and exact_in_fp16(z):  # a GGUF's Q4_0 / Q4_1
            s, z = s.half(), z.half()  # int4 + fp16 pairs: 20 bytes a block of 32, as llama.cpp reads
        self.register_buffer("qweight", qt.qweight.contiguous())
        self.register_buffer("scales", s)
        self.register_buffer("zeros", z)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N)."""
        return cpu_qgemv.linear(self._rows(x), self.qweight, self.scales, self.zeros).view(*x.shape[:-1], -1)

    def swiglu(self, down: Linear, x: Tensor, norm: nn.Module) -> Tensor:
        """One op (cpu_qgemv.ffn) where `down` runs this kernel too, else the two products."""
        if not isinstance(down, CpuQgemvLinear):
            return super().swiglu(down, x, norm)
        y = cpu_qgemv.ffn(self._rows(norm(x)), (self.qweight, self.scales, self.zeros),
                          (down.qweight, down.scales, down.zeros))  # (M, D)
        return x + y.view(*x.shape[:-1], -1)

    def native_parts(self) -> list[Tensor]:
        return [self.qweight, self.scales, NONE if self.zeros is None else self.zeros]


_FBGEMM: dict[int, object] = {}  # key -> fbgemm packed weight (a TorchScript object the compiler cannot trace)


@torch.library.custom_op("tinyllm::fbgemm_linear", mutates_args=())
def fbgemm_linear(x: Tensor, key: int, n: int) -> Tensor:
    """x (M, K) fp32 @ the int8 matrix registered under `key` -> (M, n) fp32."""
    return torch.ops.quantized.linear_dynamic(x, _FBGEMM[key], True)


@fbgemm_linear.register_fake
def _(x: Tensor, key: int, n: int) -> Tensor:
    return x.new_empty(x.shape[0], n)


class FbgemmLinear(QuantLinear):
    """fbgemm's dynamic int8 product, on a CPU computing in fp32: fbgemm holds the int8 matrix
    (packed), no copy of ours is kept."""

    def __init__(self, qt: QTensor, dtype: torch.dtype) -> None:
        super().__init__(qt, dtype)
        self.key = id(self)
        zp = torch.zeros(qt.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensor types are deprecated (the op that takes them is not)
            warnings.simplefilter("ignore", UserWarning)
            qw = torch._make_per_channel_quantized_tensor(qt.qweight.cpu(), qt.scales.double().cpu(), zp, 0)
        _FBGEMM[self.key] = torch.ops.quantized.linear_prepack(qw, None)
        self.register_buffer("scales", qt.scales.to(dtype))  # (N,): for dtype/device and state_dict

    def __del__(self) -> None:
        _FBGEMM.pop(self.key, None)

    def qtensor(self) -> QTensor:
        qw = torch.ops.quantized.linear_unpack(_FBGEMM[self.key])[0]
        return QTensor("int8", qw.int_repr(), qw.q_per_channel_scales().float())

    def forward(self, x: Tensor) -> Tensor:
        return fbgemm_linear(self._rows(x), self.key, self.out_features).view(*x.shape[:-1], -1)  # (..., N)


class Int4PackLinear(QuantLinear):
    """aten's int4 CPU product over its own packed layout (N a multiple of 16)."""

    def __init__(self, qt: QTensor, dtype: torch.dtype) -> None:
        super().__init__(qt, dtype)
        q = unpack_int4(qt.qweight).to(torch.int32)  # (N, K)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        sz = torch.stack((qt.scales, qt.zeros + 8 * qt.scales), -1)  # (N, K/g, 2): w = (q - 8) s + z'
        self.register_buffer("scales_zeros", sz.transpose(0, 1).contiguous().to(dtype))  # (K/g, N, 2)
        self.register_buffer("scales", held_exactly(qt.scales))  # the exact values, for state_dict
        self.register_buffer("zeros", held_exactly(qt.zeros))

    def qtensor(self) -> QTensor:
        """x = I, s = 1, z' = 8 reads the 4-bit values back exactly."""
        k, g = self.in_features, self.group
        ones = torch.ones(k // g, self.out_features, 1)
        q = torch.ops.aten._weight_int4pack_mm_for_cpu(torch.eye(k), self.packed, g,
                                                       torch.cat((ones, 8 * ones), -1))  # (K, N)
        return QTensor("int4", pack_int4(q.T.round()), self.scales.float(), self.zeros.float())

    def forward(self, x: Tensor) -> Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(self._rows(x).contiguous(), self.packed, self.group,
                                                      self.scales_zeros)  # (M, N)
        return y.view(*x.shape[:-1], -1)


class DequantLinear(QuantLinear):
    """The reference: the canonical form, dequantized where it is read (see the module docstring)."""

    def __init__(self, qt: QTensor, dtype: torch.dtype) -> None:
        super().__init__(qt, dtype)
        self.register_buffer("qweight", qt.qweight)
        self.register_buffer("scales", held_exactly(qt.scales))  # converted to `dtype` where used
        self.register_buffer("zeros", held_exactly(qt.zeros))
        if qt.kind == "int8":  # the many-row formulation's scales, already in `dtype`: converted in
            # the graph, Inductor's int8 weight-only pass fails on them (AssertionError: Pointwise;
            # torch 2.11 and 2.13, bf16)
            self.register_buffer("act_scales", qt.scales.to(dtype), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N)."""
        if torch.compiler.is_dynamo_compiling() and x.shape[:-1].numel() == 1:
            return self._reduce(x)
        rows = max(1, DEQUANT_BLOCK // self.in_features)  # output features a block
        if self.out_features <= rows or torch.compiler.is_compiling():
            return self._product(x, 0, self.out_features)
        return torch.cat([self._product(x, n, min(n + rows, self.out_features))
                          for n in range(0, self.out_features, rows)], dim=-1)  # (..., N)

    def _product(self, x: Tensor, n0: int, n1: int) -> Tensor:
        """x (..., K) times output features n0..n1 of W, dequantized to x's dtype -> (..., n1 - n0)."""
        if self.kind == "int8":  # gpt-fast: the scale is per output, so it applies after the product
            return F.linear(x, self.qweight[n0:n1].to(x.dtype)) * self.act_scales[n0:n1]
        return F.linear(x, self._dequantized(x.dtype, n0, n1))

    def _dequantized(self, dtype: torch.dtype, n0: int = 0, n1: int | None = None) -> Tensor:
        """Output features n0..n1 (default: all) of W in `dtype`: (n1 - n0, K)."""
        n1 = self.out_features if n1 is None else n1
        k, g = self.in_features, self.group
        q = unpack_int4(self.qweight[n0:n1]).view(n1 - n0, k // g, g).to(dtype)  # (n, K/g, g)
        s, z = self.scales[n0:n1].to(dtype)[..., None], self.zeros[n0:n1].to(dtype)[..., None]
        return (q * s + z).view(n1 - n0, k)  # (n, K)

    def _reduce(self, x: Tensor) -> Tensor:
        """One row, written as a product and a sum over K, so Inductor emits one reduction
        kernel with the int8 / int4 loads and the dequantization fused into it."""
        if self.kind == "int8":
            return (x[..., None, :] * self.qweight.to(x.dtype)).sum(-1) * self.scales.to(x.dtype)  # (..., N)
        return (x[..., None, :] * self._dequantized(x.dtype)).sum(-1)  # (..., N)


def _int8pack_takes(x: Tensor, k: int) -> bool:
    """Whether torch's `_weight_int8pack_mm` may be called: with bf16 x of more than one row and
    K not a multiple of 16 it crashes the process (torch 2.13 on an AVX512-BF16 / AMX CPU,
    measured: K = 164, 168, 170, 172, 1000 with 2 to 16 rows; fp32, one row, K = 160 or 176 ran)."""
    return x.dtype == torch.float32 or k % 16 == 0 or x.shape[:-1].numel() == 1


class Int8PackLinear(DequantLinear):
    """aten's int8 CPU product on the canonical form; the reference where it would crash."""

    def forward(self, x: Tensor) -> Tensor:
        if not _int8pack_takes(x, self.in_features):
            return super().forward(x)
        y = torch.ops.aten._weight_int8pack_mm(self._rows(x).contiguous(), self.qweight,
                                               self.act_scales.to(x.dtype))  # (M, N): see act_scales
        return y.view(*x.shape[:-1], -1)


class TritonLinear(TritonProducts, DequantLinear):
    """tinyllm.kernels.qgemv's Triton kernels for a few rows on CUDA; the reference for more."""

    def __init__(self, qt: QTensor, dtype: torch.dtype) -> None:
        super().__init__(qt.map(Tensor.contiguous), dtype)  # the kernels read rows at their strides' offsets

    def _gemv_ok(self, x: Tensor) -> bool:
        return qgemv.supported(x)

    def _gemv(self, rows: Tensor, **folds) -> Tensor:
        return qgemv.linear(rows, self.kind, self.qweight, self.scales, self.zeros, self.group, **folds)


def kernel_for(qt: QTensor, dtype: torch.dtype, device: torch.device) -> type[QuantLinear]:
    """The class that runs `qt` on `device` for activations in `dtype` (the module docstring)."""
    if device.type == "cpu":
        if dtype == torch.float32 and cpu_qgemv.available():
            return CpuQgemvLinear
        if qt.kind == "int8" and dtype == torch.float32 and quant.fbgemm_available():
            return FbgemmLinear
        if qt.kind == "int4" and qt.shape[0] % 16 == 0:  # the aten kernel's N
            return Int4PackLinear
        return Int8PackLinear if qt.kind == "int8" else DequantLinear
    if device.type == "cuda" and qgemv.available():
        return TritonLinear
    return DequantLinear


def quant_linear(qt: QTensor, dtype: torch.dtype, device: torch.device | str | None = None) -> QuantLinear:
    """`qt` as the layer of the kernel that runs it on `device` (default: where qt's tensors are)."""
    device = qt.qweight.device if device is None else torch.device(device)
    if qt.qweight.device != device:
        qt = qt.map(lambda t: t.to(device))
    return kernel_for(qt, dtype, device)(qt, dtype)


class QuantEmbedding(Embedding):
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
        """idx (B, T) -> (B, T, C) in the model's dtype, each value rounded once: dequantized in
        fp32, as the Triton and CPU kernels do. Dequantized in bf16 (the scale, the offset, the
        product and the sum each rounded), random Q4_K rows were 3.9x as far from the file's
        values as the bf16 load's (relative error 6.5e-3 against 1.7e-3; in fp32 1.8e-3, with
        fp16 scales: measured on the CPU). Where Triton runs idx outside a compile, one launch
        (tinyllm.kernels.embed_rows: the same values, ids in range taken on trust) instead of the
        about six of `torch_rows`, its slow twin. (The interpreter switch is read at each call.)"""
        if qgemv.available() and (idx.is_cuda or switches.SWITCHES.triton_interpret) \
                and not torch.compiler.is_compiling():
            from tinyllm.kernels import embed_rows

            flat = embed_rows.rows(idx.reshape(-1).contiguous(), self.kind, self.qweight, self.scales, self.zeros,
                                   self.like.dtype)  # (B * T, C)
            return flat.view(*idx.shape, self.embedding_dim)
        return self.torch_rows(idx)

    def torch_rows(self, idx: Tensor) -> Tensor:
        """forward's values in torch ops, on any device: idx (B, T) -> (B, T, C)."""
        q = self.qweight[idx]  # (B, T, C) int8 | (B, T, C/2) uint8
        if self.kind == "int8":
            return (q.float() * self.scales[idx].float()[..., None]).to(self.like.dtype)
        g = self.embedding_dim // self.scales.shape[1]
        q = unpack_int4(q).view(*idx.shape, -1, g).float()  # (B, T, C/g, g)
        w = q * self.scales[idx].float()[..., None] + self.zeros[idx].float()[..., None]
        return w.flatten(-2).to(self.like.dtype)

    def native_parts(self) -> list[Tensor]:
        return [self.qweight, self.scales, NONE if self.zeros is None else self.zeros]


def quantized_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer, plus the int8 matrices fbgemm holds for FbgemmLinear."""
    seen = {t.data_ptr(): t for t in (*model.parameters(), *model.buffers())}
    total = sum(t.numel() * t.element_size() for t in seen.values())
    return total + sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, FbgemmLinear))


def logical_params(model: nn.Module) -> int:
    """Parameters the model stands for: dense ones plus each quantized matrix's N x K."""
    n = sum(p.numel() for p in model.parameters())
    for m in model.modules():
        if isinstance(m, QuantLinear):
            n += m.in_features * m.out_features
        elif isinstance(m, QuantEmbedding):
            n += m.num_embeddings * m.embedding_dim
    return n
