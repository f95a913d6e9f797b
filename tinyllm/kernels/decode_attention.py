"""Decode attention over a window of W keys: a split-K Triton kernel on CUDA, a threaded C++ op
on a CPU.

Contract:
- `decode_attention(q, k, v, mask, scale, cap=0.0) -> Tensor` is `ops.window_attention` (the slow
  twin it is tested against): q (B, Hkv, R, D), the R query heads that share a KV head; k and
  v (B, Hkv, W, D), possibly non-contiguous slices of a larger cache along dim 2 (read in
  place through their strides); mask (B, 1, 1, W) bool, True = attend; scale a Python float.
  Returns (B, Hkv, R, D) in v's dtype. Scores and softmax are fp32; unlike window_attention
  the scores are not rounded to bf16 first, so the two agree to bf16 rounding, not bit for
  bit. A row with no key to attend gets 0, not NaN.
- `supported(q, k, v, mask)`: whether a kernel takes these inputs: on CUDA, Triton installed,
  one dtype bf16 or fp16, D in 32/64/128/256, a bool mask (a soft-cap on CUDA only); on a CPU,
  tinyllm.kernels.cpu_qgemv already loaded (never built here), one dtype fp32 or bf16, R <= 8,
  D a multiple of 8 up to 256 and contiguous, a bool mask. The ops call `decode_attention` only
  then, and `window_attention` otherwise. On a CPU the op
  (`torch.ops.tinyllm_cpu.decode_attention`) agrees with window_attention to fp32 rounding in
  fp32 (the order of the sums), to bf16 rounding in bf16 (scores and weights are not rounded to
  bf16), and also gives 0 to a row with no key.
- `rope_decode_attention(qkv, cos, sin, pos, first_valid, k_cache, v_cache, window, scale,
  sliding=0, cap=0.0, norms=None)`:
  RoPE, the cache write and the attention of a decode step in one op (decode_attention_triton
  states its contract); its slow twin is model.apply_rope, an index_copy_ into the caches (an
  index_put_ where each row has its own position) and window_attention.
  `rope_supported(qkv, k_cache, v_cache)` says when it takes its inputs (never with
  TINYLLM_ROPE_ATTN=0, which keeps RoPE and the cache write apart, to measure).
- `available()`: whether Triton is installed (and not switched off: TINYLLM_DECODE_ATTN=0).
  Importing this module never imports Triton (CPU-only installs and CI have none): the
  kernels (`decode_attention_triton`) are imported at the first call, which registers the
  custom op `tinyllm::decode_attention`.

Why: a decode step has R <= 8 query rows per KV head, so the softmax of window_attention is
a reduction over W keys with only B*Hkv*R rows, i.e. a handful of programs walking all W keys
(SmolLM2-135M on an H200: 9 programs, 8.6 µs a layer at W=1024), between two cuBLAS products.
Here the W keys are split into blocks of 64, one program each (scores, partial softmax, and
the partial product with v), and a second small kernel merges the blocks: two launches per
layer instead of three, and W spread over B*Hkv*W/64 programs (at most 256 a head: past 16,384
keys a program walks several blocks). Any window up to the cache's length runs, 131,072 keys
included, for every head size, at any TINYLLM_ATTN_TILE (test_decode_attention_long.py).
On CUDA the ops call it in the plain step and the compiled step alike (tinyllm.core.ops): graph
replay and its eager twin run the same kernel and stay bit-identical, and a launch's first
replies, served by the plain step while nothing is compiled, run it too.

On a CPU the compiled step's own attention is Inductor's loop on one thread (cuda_graph.compiled
runs Inductor's kernels single-threaded): about 200 us a layer for SmolLM2 at W = 1,024, where
the step's products take both threads. The C++ op splits each head's window into chunks of 256
keys over both threads and skips masked keys (docs/BENCHMARKS-LOG.md).
"""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor

from tinyllm.kernels import cpu_qgemv
from tinyllm.kernels.switches import SWITCHES

_HAS_TRITON = importlib.util.find_spec("triton") is not None and SWITCHES.decode_attn
_FUSED = SWITCHES.rope_attn  # off: RoPE and the cache write apart (to measure)
_CPU = SWITCHES.cpu_attn  # off: the compiled CPU step keeps Inductor's loop (to measure)
_INTERPRET = SWITCHES.triton_interpret  # the Triton kernels take CPU tensors (Triton's interpreter: tests)
HEAD_DIMS = (32, 64, 128, 256)  # = decode_attention_triton.HEAD_DIMS (that module imports Triton)


def available() -> bool:
    """Triton is installed (checked without importing it)."""
    return _HAS_TRITON


def _triton_device(t: Tensor) -> bool:
    return t.is_cuda or (_INTERPRET and t.device.type == "cpu")


def supported(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> bool:
    if q.device.type == "cpu" and not _INTERPRET:
        return _cpu_supported(q, k, v, mask)
    return (_HAS_TRITON and _triton_device(q) and q.shape[-1] in HEAD_DIMS and mask.dtype == torch.bool
            and q.dtype == k.dtype == v.dtype and v.dtype in (torch.bfloat16, torch.float16))


def _cpu_supported(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> bool:
    return (_CPU and cpu_qgemv.loaded() and q.dtype == k.dtype == v.dtype and q.dtype in (torch.float32, torch.bfloat16)
            and mask.dtype == torch.bool
            and q.shape[2] <= 8 and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256 and k.stride(-1) == 1
            and v.stride(-1) == 1 and mask.dim() == 4 and mask.shape[0] in (1, q.shape[0])
            and mask.shape[1:] == (1, 1, k.shape[2]))


def rope_supported(qkv: Tensor, k_cache: Tensor, v_cache: Tensor) -> bool:
    return (_HAS_TRITON and _FUSED and _triton_device(qkv) and k_cache.shape[-1] in HEAD_DIMS
            and qkv.dtype == k_cache.dtype == v_cache.dtype and qkv.dtype in (torch.bfloat16, torch.float16))


def rope_decode_attention(qkv: Tensor, cos: Tensor, sin: Tensor, pos: Tensor, first_valid: Tensor, k_cache: Tensor,
                          v_cache: Tensor, window: int, scale: float, sliding: int = 0, cap: float = 0.0,
                          norms: tuple[Tensor, Tensor, float] | None = None) -> Tensor:
    """`norms`: (q_norm's weights, k_norm's, eps), each head normalized before RoPE (Qwen 3, Gemma 3)."""
    from tinyllm.kernels import decode_attention_triton

    q_norm, k_norm, eps = norms or (None, None, 0.0)
    return decode_attention_triton.rope_decode_attention(qkv, cos, sin, pos, first_valid, k_cache, v_cache, window,
                                                         scale, sliding, cap, q_norm, k_norm, eps)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, cap: float = 0.0) -> Tensor:
    if q.device.type == "cpu" and not _INTERPRET:
        assert not cap, "the CPU op takes no soft-cap (supported() says so)"
        return torch.ops.tinyllm_cpu.decode_attention(q, k, v, mask, scale)  # (B, Hkv, R, D)
    from tinyllm.kernels import decode_attention_triton  # Triton, and the op registered, on first use

    return decode_attention_triton.decode_attention(q, k, v, mask, scale, cap)  # (B, Hkv, R, D)
