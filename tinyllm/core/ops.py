"""The model's attention and its products, by device: one ops object, chosen once for a device.

Contract:
- `ops_for(device) -> Ops`: `CpuOps` on a CPU, `CudaOps` on CUDA, the reference `Ops` elsewhere
  (the meta device a model is built on, other backends). A model holds the ops of its weights'
  device (model.Transformer.ops, chosen again when its weights move) and hands them to its
  layers; the model's own code holds only the math. A matrix's product is its layer's kernel
  (tinyllm.core.linear, tinyllm.core.quant_linear), not these ops'.
- `ops.window_attention(q, k, v, mask, scale, cap=0.0)`: one decode position over a window of W keys:
  q (B, Hkv, R, D), the R query heads that share a KV head; k, v (B, Hkv, W, D); mask
  (B, 1, 1, W) bool, True = attend -> (B, Hkv, R, D); scores soft-capped where cap > 0 (the
  CPU op takes cap = 0 only; the Triton kernel any). The device's kernel where it takes these
  inputs (tinyllm.kernels.decode_attention), else `window_attention` (the reference, below):
  - on CUDA, the split-K Triton kernel, in the plain step and the compiled step alike: graph
    replay and its eager twin run the same kernel and stay bit-identical, and the plain step,
    which serves a launch's first replies, is as fast as the kernels make it with no compile;
  - on a CPU, inside a compile only, the threaded C++ op where tinyllm.kernels.cpu_qgemv is
    loaded, else the reference written as products and sums.
- `ops.rope_attend(kv, qkv, cos, sin, scale, sliding=0, cap=0.0, norms=None, table=None) -> Tensor | None`: a
  decode step's (T = 1) RoPE, cache write and attention as one op on CUDA (plain or compiled step),
  where the cache layer `kv` runs it (`kv.rope_attend`: a static or slot cache's decode view,
  decode_attention.rope_decode_attention): qkv (B, 1, (H + 2 Hkv) D) -> (B, Hkv, H / Hkv, D); `norms`
  (q_norm's and k_norm's weights, eps) normalize each head first, `table` (a model.Rope) is the
  layer's own rotary table where it has one; None elsewhere, and the model runs them apart.
- `ops.sdpa(q, k, v, attn_kwargs, cached)`: F.scaled_dot_product_attention; attention over a
  cache (`cached`) outside a compile never takes cuDNN's kernel (CACHED_SDPA), and inside a
  compile no backend is named (the context would stop AOTAutograd's cache: warm starts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from tinyllm.kernels import decode_attention

# Cached attention never uses cuDNN's SDPA: it builds a plan per new shape (measured on an
# H200: 50 ms to 1 s for each new prefill length), and a chat prefills a new length each turn.
CACHED_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def window_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, cap: float = 0.0) -> Tensor:
    """One decode position over a fixed window of W keys, keys outside `mask` ignored: the
    reference every decode attention kernel is tested against (shapes: the module docstring).

    Written as two matrix products and a softmax rather than SDPA: the fused SDPA kernels tile
    over query rows, and with R <= 8 rows they run one or two thread blocks per head down all W
    keys (measured on an H200: 9 µs a layer at W=128, 48 µs at W=1024), while a matrix product
    spreads W over the whole GPU. Scores and softmax are fp32, as in SDPA; the scores are
    rounded to the weights' dtype once, as in Hugging Face's eager attention. `scale` is
    D ** -0.5, a constant from the config: computed from q's size it would be a symbolic float
    in a dynamic-shape compile, which restarts the trace (a warm start then traces twice).
    """
    scores = (q @ k.transpose(-1, -2)).float() * scale  # (B, Hkv, R, W)
    if cap:  # soft-capped scores (Gemma 2): cap * tanh(scores / cap)
        scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1).to(v.dtype) @ v  # (B, Hkv, R, D)


def window_attention_loops(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, cap: float = 0.0) -> Tensor:
    """window_attention with its two products written as products and sums, which Inductor makes
    loops of its own (fused with the softmax, one thread: cuda_graph.compiled): a library
    batched product is an OpenMP region of its own per call, and at R <= 8 rows the wake-up
    costs more than the product (the compiled CPU step)."""
    scores = (q[..., :, None, :] * k[..., None, :, :]).sum(-1).float() * scale  # (B, Hkv, R, W)
    if cap:
        scores = torch.tanh(scores / cap) * cap
    p = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(v.dtype)
    return (p[..., None] * v[..., None, :, :]).sum(-2)  # (B, Hkv, R, D)


class Ops:
    """The reference: no kernel of ours (see the module docstring)."""

    def window_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float,
                         cap: float = 0.0) -> Tensor:
        return window_attention(q, k, v, mask, scale, cap)  # (B, Hkv, R, D)

    def rope_attend(self, kv, qkv: Tensor, cos: Tensor, sin: Tensor, scale: float, sliding: int = 0,
                    cap: float = 0.0, norms=None, table=None) -> Tensor | None:
        return None

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, attn_kwargs: dict, cached: bool) -> Tensor:
        if cached and not torch.compiler.is_compiling():
            with sdpa_kernel(CACHED_SDPA):
                return F.scaled_dot_product_attention(q, k, v, **attn_kwargs)
        return F.scaled_dot_product_attention(q, k, v, **attn_kwargs)


class CpuOps(Ops):
    """A CPU's: the threaded C++ decode attention, or Inductor's loops, in a compiled step."""

    def window_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float,
                         cap: float = 0.0) -> Tensor:
        if torch.compiler.is_compiling() and not cap and decode_attention.supported(q, k, v, mask):
            return decode_attention.decode_attention(q, k, v, mask, scale)  # (B, Hkv, R, D)
        if torch.compiler.is_dynamo_compiling():
            return window_attention_loops(q, k, v, mask, scale, cap)
        return window_attention(q, k, v, mask, scale, cap)


class CudaOps(Ops):
    """CUDA's: the Triton decode attention, and RoPE and the cache write inside it."""

    def window_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float,
                         cap: float = 0.0) -> Tensor:
        if decode_attention.supported(q, k, v, mask):
            return decode_attention.decode_attention(q, k, v, mask, scale, cap)  # (B, Hkv, R, D)
        return window_attention(q, k, v, mask, scale, cap)

    def rope_attend(self, kv, qkv: Tensor, cos: Tensor, sin: Tensor, scale: float, sliding: int = 0,
                    cap: float = 0.0, norms=None, table=None) -> Tensor | None:
        if qkv.shape[1] != 1:
            return None
        qkv = qkv.view(qkv.shape[0], -1)  # (B, (H + 2 Hkv) D)
        return kv.rope_attend(qkv, cos, sin, scale, sliding, cap, norms, table)  # (B, Hkv, R, D) or None


_OPS = {"cpu": CpuOps(), "cuda": CudaOps()}
_REFERENCE = Ops()


def ops_for(device: torch.device | str) -> Ops:
    """The ops of a model whose weights are on `device`."""
    return _OPS.get(torch.device(device).type, _REFERENCE)
