"""The CPU decode step as one C++ call (cpu_step.cpp), for a decoder of batch 1.

Why: a compiled CPU step spends most of a small model's token outside its kernels. Measured on
the 2-core CPU (docs/BENCHMARKS.md, fifteenth session): about 0.69 ms of the default model's
1.26 ms ran on the main thread alone (Python, Dynamo's guards, the wrapper's calls into each op),
and a compiled call reading SmolLM2's ~430 weight tensors costs about 0.8 ms before any work.
Here the step holds the model's tensors once and runs every block in C++ on the same kernels
(tinyllm.cpu_qgemv), so a token costs one call. It needs no compile either: a session has its
fast step as soon as the kernels are built (once per machine, about 20 s) or loaded.

Contract:
- `problem(model, batch) -> str | None`: why the native step cannot run this model, or None.
  It runs batch 1 of a CPU model computing in fp32 where tinyllm.cpu_qgemv is available, whose
  matrices are QuantLinear on that kernel (int8, int4) or dense fp32 / bf16 / fp16, and whose
  embedding is dense or a QuantEmbedding.
- `NativeStep(dec)`: the decoder's step `(window) -> logits (1, 1, V)`, what its
  `plain_step(window)` does: the model's step through the cache's decode
  view at `cache.pos` (K/V written there, keys first_valid..pos attended, pos advanced), then
  the sampler's push and draw into `dec.tok`, all in C++. The step equals that one up to fp32
  rounding (the products are the same kernels); the draws are StepSampler's, greedy or sampled
  (the same noise, penalty, top-k and top-p; only a near-tie that rounding decides could
  differ), on its own tensors (`StepSampler.native_args`), so its settings and state stay
  where it keeps them. The C++ object is made at the first call (a prefill has allocated the
  cache by then) and again if the cache's tensors change. Where the C++ side refuses a layout
  `problem` let through, `refused` says why (one line, also on stderr) and the decoder's plain
  step runs from then on.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from tinyllm import cpu_qgemv
from tinyllm.quant import QuantEmbedding, QuantLinear

DENSE = (torch.float32, torch.bfloat16, torch.float16)


def _matrix_problem(name: str, layer: nn.Module) -> str | None:
    if isinstance(layer, QuantLinear):
        return None if layer.avx2 else f"{name} is quantized for another kernel"
    if type(layer) is nn.Linear and layer.bias is None and layer.weight.dtype in DENSE:
        return None
    return f"{name} is a {type(layer).__name__} the native step does not run"


def problem(model, batch: int) -> str | None:
    if batch != 1:
        return f"batch {batch} (the native step runs batch 1)"
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"a {model.device.type} model computing in {model.dtype} (it runs fp32 on the CPU)"
    if not cpu_qgemv.available():
        return "the CPU kernels are not available"
    emb = model.tok_emb
    if not (isinstance(emb, QuantEmbedding) or type(emb) is nn.Embedding and emb.weight.dtype in DENSE):
        return f"tok_emb is a {type(emb).__name__}"
    layers = [("lm_head", model.lm_head)]
    for i, b in enumerate(model.blocks):
        layers += [(f"blocks.{i}.attn.wqkv", b.attn.wqkv), (f"blocks.{i}.attn.wo", b.attn.wo),
                   (f"blocks.{i}.ffn.w13", b.ffn.w13), (f"blocks.{i}.ffn.w2", b.ffn.w2)]
    return next((p for name, layer in layers if (p := _matrix_problem(name, layer)) is not None), None)


_NONE = torch.empty(0)


def _parts(layer: nn.Module) -> list[Tensor]:
    """(w, scales, zeros) of a matrix, empty tensors where it has none."""
    if isinstance(layer, (QuantLinear, QuantEmbedding)):
        return [layer.qweight, layer.scales, _NONE if layer.zeros is None else layer.zeros]
    return [layer.weight.detach().contiguous(), _NONE, _NONE]


def build(model, cache) -> object:
    """The C++ step over `model` and a StaticKVCache of batch 1 whose K/V exist."""
    reason = problem(model, cache.batch)
    if reason is not None:
        raise ValueError(f"the native CPU step cannot run this model: {reason}")
    cfg = model.cfg
    model.rope.ensure(model.rope.max_seq_len)
    tensors = [*_parts(model.tok_emb), model.norm.weight.detach(), *_parts(model.lm_head),
               model.rope.cos, model.rope.sin]
    for i, b in enumerate(model.blocks):
        tensors += [b.attn_norm.weight.detach(), *_parts(b.attn.wqkv), *_parts(b.attn.wo),
                    b.ffn_norm.weight.detach(), *_parts(b.ffn.w13), *_parts(b.ffn.w2), cache.k[i], cache.v[i]]
    config = [cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim]
    return torch.classes.tinyllm_cpu.Step(tensors, config, float(cfg.norm_eps))


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
        held = (*cache.k, *cache.v)
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
