"""The model's matrices as layers, one class per kernel, the kernel chosen when a model is built.

Contract:
- `Linear`: y = x @ W.T for an (N, K) matrix W: x (..., K) -> (..., N) in x's dtype. Every
  Linear answers the same four calls, so the model asks nothing of a layer's kind:
  - `forward(x)`: the product, by this class's kernel.
  - `fused(x, norm=None, residual=None, bias=None, post=None)`: residual + post(self(norm(x)) + bias),
    the norms (model.RMSNorm), the residual (..., N) and the bias (N,) each optional (a post-norm
    needs a residual). A kernel that runs them as one op does (TritonProducts: a few rows on CUDA);
    here they run in that order, the post-norm and the add by RMSNorm.add_to.
  - `gated(x, norm, act="silu") -> (..., F)`: act(gate) * up of norm(x), this layer holding a
    gated FFN's gate and up (its two halves of rows); act one of ACTIVATIONS.
  - `swiglu(down, x, norm)`: x + down(silu(gate) * up) of norm(x), x (..., K) -> (..., K), `down`
    the down projection. A kernel with a fused form runs it in fewer ops; here it is the two products.
  - `native_parts() -> [w, scales, zeros]`: the matrix as the native CPU step reads it
    (tinyllm.decode.cpu_step; empty tensors where it has no scales or zeros); ValueError, saying
    what the layer is, where this kernel's layout is not one that step reads.
- `TritonProducts`: the four calls above through tinyllm.kernels.qgemv's Triton kernels where a
  layer says they take x (`_gemv_ok`: a few rows on CUDA), each call one kernel with its norm,
  bias, gating and residual inside (where qgemv.fold()); the next class's calls otherwise. The
  quantized TritonLinear (tinyllm.core.quant_linear) and DenseLinear on CUDA run it.
- `DenseLinear(in_features, out_features)`: torch's nn.Linear without a bias (its init, its
  `weight`), computing with the library's product of W widened to x's dtype where W is held
  narrower. On CUDA, outside a compile, a few rows of x in W's own dtype take qgemv's dense
  kernel (TritonProducts): decode's products are then one kernel each, with no Inductor.
  Inside a compiled step of a single row (batch-1 decode), with K <= REDUCTION_MAX_K or W held
  narrower than x, the product is written as a product and a sum over K instead:
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
from tinyllm.kernels import cpu_qgemv, qgemv

# Largest input width K for which a compiled batch-1 step computes x @ W.T as an Inductor
# reduction (DenseLinear). Measured on an H200, compiled step in CUDA graphs: the default model
# (K <= 1408) went from 4,821 to 6,830 tok/s; the TinyLlama-1.1B shape (K >= 2048) from 778
# down to 719, where cuBLAS reads large matrices faster than the generated reduction does.
REDUCTION_MAX_K = 1536
HALF = (torch.bfloat16, torch.float16)  # matrices a CPU may hold narrower than its fp32 activations
NATIVE_DENSE = (torch.float32, *HALF)  # the dense matrices and tables the native CPU step reads
NONE = torch.empty(0)  # a part the native step's layout leaves empty
# A gated FFN's activations by name (model.ModelConfig.act): SwiGLU's silu, GeGLU's tanh-approximated gelu.
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


class Linear(Module):
    """y = x @ W.T by one kernel (see the module docstring)."""

    in_features: int
    out_features: int

    def fused(self, x: Tensor, norm: nn.Module | None = None, residual: Tensor | None = None,
              bias: Tensor | None = None, post: nn.Module | None = None) -> Tensor:
        """residual + post(self(norm(x)) + bias), x (..., K) -> (..., N)."""
        y = self.forward(x if norm is None else norm(x))  # (..., N)
        if bias is not None:
            y = y + bias
        if post is not None:
            return post.add_to(residual, y)
        return y if residual is None else residual + y

    def gated(self, x: Tensor, norm: nn.Module, act: str = "silu") -> Tensor:
        """act(gate) * up of norm(x), this layer holding gate and up: (..., K) -> (..., F)."""
        gate, up = self.fused(x, norm=norm).chunk(2, dim=-1)  # (..., F) each
        return ACTIVATIONS[act](gate) * up

    def swiglu(self, down: Linear, x: Tensor, norm: nn.Module) -> Tensor:
        """x + down(silu(gate) * up) of norm(x), this layer holding gate and up."""
        return down.fused(self.gated(x, norm), residual=x)  # (..., K)

    def native_parts(self) -> list[Tensor]:
        raise ValueError(f"a {type(self).__name__} the native step does not run")


class TritonProducts(Linear):
    """A layer's calls as tinyllm.kernels.qgemv's kernels where `_gemv_ok(x)` (the module docstring)."""

    def _gemv_ok(self, x: Tensor) -> bool:
        raise NotImplementedError

    def _gemv(self, rows: Tensor, **folds) -> Tensor:
        """The product of rows (M, K) with the folds of qgemv.linear -> (M, N)."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        if not self._gemv_ok(x):
            return super().forward(x)
        return self._gemv(x.reshape(-1, self.in_features)).view(*x.shape[:-1], -1)  # (..., N)

    def fused(self, x: Tensor, norm: nn.Module | None = None, residual: Tensor | None = None,
              bias: Tensor | None = None, post: nn.Module | None = None) -> Tensor:
        """For a few rows, the norm (a model.RMSNorm, where qgemv.fold()), the bias, the post-norm
        (in x's dtype) and the residual (..., N) folded into the product's kernel; otherwise run apart."""
        if (not self._gemv_ok(x) or not (qgemv.fold() or norm is None and residual is None and post is None)
                or post is not None and (residual is None or post.weight.dtype != x.dtype or not qgemv.post_fold())):
            return super().fused(x, norm, residual, bias, post)
        y = self._gemv(x.reshape(-1, self.in_features), norm=None if norm is None else (norm.weight, norm.eps),
                       residual=None if residual is None else residual.reshape(-1, self.out_features),
                       bias=bias, post=None if post is None else (post.weight, post.eps, post.done_count(x.device)))
        return y.view(*x.shape[:-1], -1)  # (..., N)

    def gated(self, x: Tensor, norm: nn.Module, act: str = "silu") -> Tensor:
        """For a few rows: the norm (where qgemv.fold()) and the gating in one kernel."""
        if not self._gemv_ok(x):
            return super().gated(x, norm, act)
        fold = qgemv.fold()
        h = self._gemv((x if fold else norm(x)).reshape(-1, self.in_features), gated=True,
                       norm=(norm.weight, norm.eps) if fold else None, act=act)  # (M, F)
        return h.view(*x.shape[:-1], -1)


class DenseLinear(TritonProducts, nn.Linear):
    """x @ W.T with W a dense (N, K) Parameter (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        nn.Linear.__init__(self, in_features, out_features, bias=False)

    def _gemv_ok(self, x: Tensor) -> bool:
        w = self.weight
        return (qgemv.supported(x) and w.device == x.device and w.dtype == x.dtype and self.bias is None
                and w.is_contiguous() and not torch.compiler.is_compiling()
                and not (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)))  # no autograd here

    def _gemv(self, rows: Tensor, **folds) -> Tensor:
        return qgemv.linear(rows, "dense", self.weight, **folds)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) -> (..., N)."""
        if self._gemv_ok(x):
            return super().forward(x)  # TritonProducts: one kernel
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
