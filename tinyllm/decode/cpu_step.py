"""The CPU decode step as one C++ call (cpu_step.cpp), for a decoder of batch 1.

Why: a compiled CPU step spends most of a small model's token outside its kernels. Measured on
the 2-core CPU (docs/BENCHMARKS.md): about 0.69 ms of the default model's 1.26 ms ran on the
main thread alone (Python, Dynamo's guards, the wrapper's calls into each op), and a compiled
call reading SmolLM2's ~430 weight tensors costs about 0.8 ms before any work. Here the step
holds the model's tensors once and runs every block in C++ on the same kernels
(tinyllm.kernels.cpu_qgemv), so a token costs one call. It needs no compile either: a session has its
fast step as soon as the kernels are built (once per machine, about 20 s) or loaded.

Contract:
- `problem(model, batch) -> str | None`: why the native step cannot run this model, or None.
  It runs batch 1 of a CPU model computing in fp32 where tinyllm.kernels.cpu_qgemv is available, whose
  layers export the layout it reads (`Transformer.native_parts`: dense fp32 / bf16 / fp16
  matrices and tables, and the AVX2 kernel's quantized ones, int8 and int4), of any family:
  q/k/v biases, q/k norms, head_dim apart from dim / n_heads, GeGLU, post-norms, the embedding
  scale, the attention scale, attention and final soft-caps, sliding-window layers with their own
  RoPE tables, partial rotary, the residual scale and the logit divisor (what it does not run:
  tinyllm.model.native_unsupported).
- `use_native(dec, kv_dtype=KV_DTYPE) -> NativeStep`: makes the native step the decoder's step
  (`dec.set_step`, named "native"); `dec.set_compile(None)` goes back to the plain step. Where
  the decoder's cache holds no K/V yet, it holds them in `kv_dtype` from its first prefill on
  (None: the model's dtype); a cache already filled keeps its dtype. The step reads an fp32 or
  a bf16 cache (tinyllm.kv_cache's kv_dtype: written rounded, widened as read; the plain step
  reads it back in fp32, so the two still agree up to fp32 rounding), or an int8 one
  (`torch.int8`: a scale a head and position, written quantized by both steps to the same
  bits, read back dequantized by the plain step; again equal up to fp32 rounding).
- `KV_DTYPE`: bf16. Half of fp32's bytes a position (the default model's 46 KB -> 23 KB); what
  it costs in logits on the default model and SmolLM2, and what it gains late in a context, is
  measured in docs/BENCHMARKS.md ("Long context on the CPU"), beside int8's (an option, not
  the default: about a quarter of fp32's bytes).
- `NativeStep(dec)`: the step `(window) -> logits (1, 1, V)`, what the decoder's
  `plain_step(window)` does: the model's step through the cache's decode view at `cache.pos`
  (K/V written there, keys first_valid..pos attended, pos advanced), then the sampler's push
  and draw into `dec.tok`, all in C++. It reads the decoder through its public parts only
  (`model`, `cache`, `tok`, `greedy`, `sampler.native_args()`, `plain_step`). The step equals
  the plain one up to fp32 rounding (the products are the same kernels); the draws are the C++
  Sampler's (cpu_sampler.cpp: StepSampler's noise, penalty, top-k and top-p; only a near-tie
  that rounding decides could differ), on the StepSampler's own tensors, so its settings and
  state stay where it keeps them. The C++ object is made at the first call (a prefill has
  allocated the cache by then) and again if the cache's tensors change. Where the C++ side
  refuses a layout `problem` let through, `refused` says why (one line, also on stderr) and
  the decoder's plain step runs from then on.
- `native_draw(sampler, logits, tok)`: the C++ Sampler alone on a StepSampler's tensors (what
  the step does after its forward): tok (1, 1) pushed, the draw from logits (1, V) fp32
  written into tok; the parity tests hold it to StepSampler.push and draw.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from tinyllm.decode.step_sampler import StepSampler
from tinyllm.kernels import cpu_qgemv

KV_DTYPE = torch.bfloat16  # the native step's cache unless told (docs/BENCHMARKS.md, "Long context on the CPU")


def problem(model, batch: int) -> str | None:
    if batch != 1:
        return f"batch {batch} (the native step runs batch 1)"
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"a {model.device.type} model computing in {model.dtype} (it runs fp32 on the CPU)"
    if not cpu_qgemv.available():
        return "the CPU kernels are not available"
    try:
        model.native_parts()
    except ValueError as e:
        return str(e)
    return None


def build(model, cache) -> object:
    """The C++ step over `model` and a StaticKVCache of batch 1 whose K/V exist."""
    reason = problem(model, cache.batch)
    if reason is not None:
        raise ValueError(f"the native CPU step cannot run this model: {reason}")
    cfg = model.cfg
    head, layers = model.native_parts()
    tensors = list(head)
    none = torch.empty(0)
    for parts, k, v, ks, vs in zip(layers, cache.k, cache.v, cache.k_scale, cache.v_scale, strict=True):
        tensors += [*parts, k, v, none if ks is None else ks, none if vs is None else vs]  # scales: int8 K/V only
    # cpu_step.cpp's config and scalars: the family's features, a window per layer (0: global)
    config = [cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.head_dim, cfg.rotary_dim,
              int(cfg.act == "gelu_tanh"), *(b.attn.window for b in model.blocks)]
    scalars = [float(cfg.norm_eps), float(cfg.embed_scale), float(model.blocks[0].attn.scale),
               float(cfg.attn_softcap), float(cfg.final_softcap), float(cfg.residual_scale), float(cfg.logit_divisor)]
    return torch.classes.tinyllm_cpu.Step(tensors, config, scalars)


class NativeStep:
    def __init__(self, dec):
        self.dec = dec
        self._step = None
        self._held: tuple[Tensor, ...] = ()  # the cache tensors the step was made over
        self.refused = ""  # why the C++ step refused this model, where it did: the plain step runs

    def __call__(self, window: int) -> Tensor:
        dec, cache = self.dec, self.dec.cache
        if self.refused:
            return dec.plain_step(window)
        held = (*cache.k, *cache.v, *cache.k_scale, *cache.v_scale)
        if self._step is None or any(a is not b for a, b in zip(held, self._held, strict=True)):
            if cache.k[0] is None:
                raise ValueError("prefill before the first decode step")
            try:
                self._step, self._held = build(dec.model, cache), held
            except RuntimeError as e:  # a layout problem() did not foresee: never a failed reply
                self.refused = str(e).strip().splitlines()[0]
                print(f"tinyllm: the native CPU step refused this model ({self.refused}); the plain step runs",
                      file=sys.stderr)
                return dec.plain_step(window)
        forward = self._step.forward_greedy if dec.greedy else self._step.forward_sample
        # the sampler's push and draw in C++ too, on its own tensors
        return forward(dec.tok, cache.pos, cache.first_valid, window, *dec.sampler.native_args())  # (1, 1, V)


def use_native(dec, kv_dtype: torch.dtype | None = KV_DTYPE) -> NativeStep:
    """The native step runs `dec`'s decode steps from its next run on; an empty cache will hold
    K/V in `kv_dtype` (None: the model's dtype)."""
    if dec.cache.k[0] is None:
        dec.cache.kv_dtype = kv_dtype
    step = NativeStep(dec)
    dec.set_step(step, "native")
    return step


def native_draw(sampler: StepSampler, logits: Tensor, tok: Tensor) -> None:
    """The C++ Sampler's push of tok (1, 1) and draw from logits (1, V) into tok, on `sampler`'s
    tensors (its greedy or sampled variant, as `sampler.greedy` says)."""
    cpp = torch.classes.tinyllm_cpu.Sampler()
    draw = cpp.greedy if sampler.greedy else cpp.sample
    draw(logits, tok, *sampler.native_args())
