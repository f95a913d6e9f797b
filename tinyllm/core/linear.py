"""The model's matrices as layers, one class per kernel, the kernel chosen when a model is built.

Contract:
- `Linear`: y = x @ W.T for an (N, K) matrix W: x (..., K) -> (..., N) in x's dtype. Every
  Linear answers the same four calls, so the model asks nothing of a layer's kind:
  - `forward(x)`: the product, by this class's kernel.
  - `fused(x, norm=None, residual=None)`: residual + self(norm(x)), the norm (a model.RMSNorm)
    and the residual (..., N) each optional. A kernel that runs the three as one op does
    (tinyllm.core.quant_linear.TritonLinear, a few rows on CUDA); here they run in that order.
  - `swiglu(down, x, norm)`: x + down(silu(gate) * up) of norm(x), x (..., K) -> (..., K), this
    layer holding SwiGLU's gate and up (its two halves of rows) and `down` the down
    projection. A kernel with a fused form runs it in fewer ops; here it is the two products.
  - `native_parts() -> [w, scales, zeros]`: the matrix as the native CPU step reads it
    (tinyllm.decode.cpu_step; empty tensors where it has no scales or zeros); ValueError, saying
    what the layer is, where this kernel's layout is not one that step reads.
- `DenseLinear(in_features, out_features)`: torch's nn.Linear without a bias (its init, its
  `weight`), computing with the library's product of W widened to x's dtype where W is held
  narrower. Inside a compiled step of a single row (batch-1 decode), with K <= REDUCTION_MAX_K
  or W held narrower than x, the product is written as a product and a sum over K instead:
  Inductor makes that one reduction kernel and fuses elementwise work around it into it
  (and a narrower W's widening into its loads), where a library call is a kernel of its own
  with a ~3 µs floor on CUDA.
- `HalfCpuLinear`: a DenseLinear holding W at 16 bits (bf16 or fp16) on a CPU that computes in
  fp32 (a file's bf16 matrices, kept: half the bytes a decode step reads). Inside a compiled
  step of fewer than cpu_qgemv.PREFILL_M rows it runs tinyllm.kernels.cpu_qgemv's AVX2 product
  (`mm_half`, 1.4x Inductor's loop for the default model's matrices) where that library is
  loaded (the compile loads it: cuda_graph.prepare_compile; a load never builds it for this).
- `dense_linear(weight, dtype) -> DenseLinear`: the class for a dense matrix that computes in
  `dtype`, holding `weight` itself (a Parameter stays the same object: a tied lm_head shares
  the embedding's). `dense_embedding(weight)`: a DenseEmbedding holding `weight` itself.
- `Embedding`: rows of a table, `forward(idx (B, T)) -> (B, T, C)`, and `native_parts()` as
  above. `DenseEmbedding(num_embeddings, embedding_dim)`: torch's nn.Embedding; rows in the
  table's dtype (the model converts them to its own).
Every class here subclasses tinyllm.core.nn_module.Module (safe beside a trace on another thread).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinyllm.core.nn_module import Module
from tinyllm.kernels import cpu_qgemv

# Largest input width K for which a compiled batch-1 step computes x @ W.T as an Inductor
# reduction (DenseLinear). Measured on an H200, compiled step in CUDA graphs: the default model
# (K <= 1408) went from 4,821 to 6,830 tok/s; the TinyLlama-1.1B shape (K >= 2048) from 778
# down to 719, where cuBLAS reads large matrices faster than the generated reduction does.
REDUCTION_MAX_K = 1536
HALF = (torch.bfloat16, torch.float16)  # matrices a CPU may hold narrower than its fp32 activations
NATIVE_DENSE = (torch.float32, *HALF)  # the dense matrices and tables the native CPU step reads
NONE = torch.empty(0)  # a part the native step's layout leaves empty


class Linear(Module):
    """y = x @ W.T by one kernel (see the module docstring)."""

    in_features: int
    out_features: int

    def fused(self, x: Tensor, norm: nn.Module | None = None, residual: Tensor | None = None) -> Tensor:
        """residual + self(norm(x)), x (..., K) -> (..., N)."""
        y = self.forward(x if norm is None else norm(x))  # (..., N)
        return y if residual is None else residual + y

    def swiglu(self, down: Linear, x: Tensor, norm: nn.Module) -> Tensor:
        """x + down(silu(gate) * up) of norm(x), this layer holding gate and up."""
        gate, up = self.fused(x, norm=norm).chunk(2, dim=-1)  # (..., F) each
        return down.fused(F.silu(gate) * up, residual=x)  # (..., K)

    def native_parts(self) -> list[Tensor]:
        raise ValueError(f"a {type(self).__name__} the native step does not run")


class DenseLinear(Linear, nn.Linear):
    """x @ W.T with W a dense (N, K) Parameter (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        nn.Linear.__init__(self, in_features, out_features, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N)."""
        w = self.weight  # (N, K)
        if (torch.compiler.is_dynamo_compiling() and x.shape[:-1].numel() == 1
                and (x.shape[-1] <= REDUCTION_MAX_K or w.dtype != x.dtype)):
            return (x[..., None, :] * w.to(x.dtype)).sum(-1)  # (..., N), fp32 accumulation
        return F.linear(x, w.to(x.dtype), self.bias)  # (..., N)

    def native_parts(self) -> list[Tensor]:
        if self.bias is not None or self.weight.dtype not in NATIVE_DENSE:
            return super().native_parts()
        return [self.weight.detach().contiguous(), NONE, NONE]


class HalfCpuLinear(DenseLinear):
    """A 16-bit W on a CPU computing in fp32 (see the module docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) fp32 -> (..., N) fp32."""
        if (torch.compiler.is_dynamo_compiling() and x.shape[:-1].numel() < cpu_qgemv.PREFILL_M
                and cpu_qgemv.loaded()):
            lead = x.shape[:-1]
            return torch.ops.tinyllm_cpu.mm_half(x.reshape(-1, x.shape[-1]), self.weight).view(*lead, -1)  # (..., N)
        return super().forward(x)


def dense_linear(weight: Tensor, dtype: torch.dtype) -> DenseLinear:
    """A layer holding the dense (N, K) `weight` for activations in `dtype` (the module docstring)."""
    half_cpu = weight.device.type == "cpu" and weight.dtype in HALF and dtype == torch.float32
    cls = HalfCpuLinear if half_cpu else DenseLinear
    with torch.device("meta"):
        layer = cls(weight.shape[1], weight.shape[0])
    layer.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight)
    return layer


class Embedding(Module):
    """Rows of a (V, C) table: idx (B, T) -> (B, T, C) (see the module docstring)."""

    def native_parts(self) -> list[Tensor]:
        raise ValueError(f"a {type(self).__name__} the native step does not run")


class DenseEmbedding(Embedding, nn.Embedding):
    """torch's nn.Embedding, its rows in the table's dtype."""

    def __init__(self, num_embeddings: int, embedding_dim: int, _weight: Tensor | None = None) -> None:
        nn.Embedding.__init__(self, num_embeddings, embedding_dim, _weight=_weight)

    def forward(self, idx: Tensor) -> Tensor:
        return F.embedding(idx, self.weight)  # (B, T, C)

    def native_parts(self) -> list[Tensor]:
        if self.weight.dtype not in NATIVE_DENSE:
            return super().native_parts()
        return [self.weight.detach().contiguous(), NONE, NONE]


def dense_embedding(weight: nn.Parameter) -> DenseEmbedding:
    """A table holding the (V, C) Parameter `weight` itself."""
    with torch.device("meta"):  # given a table, nn.Embedding skips its init (normal_ on meta imports torch._refs: 1-3 s)
        layer = DenseEmbedding(*weight.shape, _weight=torch.empty(weight.shape))
    layer.weight = weight
    return layer
