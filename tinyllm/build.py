"""The layer below every model format: from a config and named tensors to a Transformer.

checkpoint.py, hf.py and gguf.py each read their own files, map names to tinyllm's (the
separate `attn.wq/wk/wv`, `ffn.w1/w3` names), check them (tinyllm.tensor_checks) and hand the
tensors down here; none imports another format. The device, dtype and quant policy is
tinyllm.load_policy; the chat template choice is tinyllm.jinja_template's `pick_template`.
This module owns the assembly:
- `build_transformer(cfg, state, device, dtype, quant)`: state values are dense tensors or
  `QTensor`s. `quant`: "none" dequantizes everything; "int8" / "int4" quantizes every matrix
  (embeddings and output included) to that form (int4 falls back to int8 for a matrix whose
  rows are not whole groups); "keep" keeps what the file holds; "auto" too, except that on
  a CPU without the AVX2 kernel (tinyllm.cpu_qgemv) but with fbgemm int4 becomes int8
  (fbgemm's int8 kernel is then the fast one), and on CUDA everything is dense in `dtype`
  (measured on the H200, SmolLM2 Q4_1 in the app: int4 kept 459 tok/s compiled and 8.5 tok/s
  on the plain step, which dequantizes whole matrices each token; docs/BENCHMARKS-LOG.md). A
  fused projection (wq/wk/wv, w1/w3) whose parts differ in form is held as int8. A dense matrix
  keeps the file's bf16 / fp16 on a CPU computing in fp32 under "auto" and "keep"
  (`load_policy.matrix_dtype`). It runs `check_finite` first, so every format gets it.
- `quantize_model(model, quant, group)`: the same, from a dense model in memory.
- `with_progress(items, progress)`: how each loader reports its reading: `progress(done,
  total)` in tensors, (0, total) before the first tensor is read and (total, total) after the
  last, from the loading thread (a UI shows it as a determinate bar).
Refuses with one line (ValueError): an unknown quant, a weight that is not finite (naming the
tensor).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import torch

from tinyllm import cpu_qgemv
from tinyllm.load_policy import check_quant, matrix_dtype
from tinyllm.model import ModelConfig, Transformer
from tinyllm.quant import QTensor, QuantEmbedding, QuantLinear, cat, fbgemm_available, fits, quantize
from tinyllm.tensor_checks import check_finite

Progress = Callable[[int, int], None]  # progress(tensors read, tensors in all)
T = TypeVar("T")
FUSED = {"attn.wqkv": ("attn.wq", "attn.wk", "attn.wv"), "ffn.w13": ("ffn.w1", "ffn.w3")}
LINEARS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.w1", "ffn.w3", "ffn.w2")


def with_progress(items: Sequence[T], progress: Progress | None) -> Iterator[T]:
    """The items in order, telling `progress(done, total)` before the first and after each."""
    if progress is not None:
        progress(0, len(items))
    for done, item in enumerate(items, 1):
        yield item
        if progress is not None:
            progress(done, len(items))


# ---- building -------------------------------------------------------------------------------

def _target(t: torch.Tensor | QTensor, quant: str, group: int, half: bool = False) -> torch.Tensor | QTensor:
    """One matrix in the form `quant` asks for (dense tensors stay as the file holds them until the end)."""
    if quant == "none":
        return t.dequantize() if isinstance(t, QTensor) else t
    if quant in ("auto", "keep"):
        return t
    shape = t.shape if isinstance(t, QTensor) else tuple(t.shape)
    kind = quant if fits(shape, quant, group) else "int8"
    if isinstance(t, QTensor) and t.kind == kind and (kind == "int8" or t.group == group):
        return t
    return quantize(t.dequantize() if isinstance(t, QTensor) else t, kind, group, half)


def _fuse(parts: list[torch.Tensor | QTensor]) -> torch.Tensor | QTensor:
    """Row-concatenate a fused projection; mixed forms become int8 (dense parts too)."""
    if all(not isinstance(p, QTensor) for p in parts):
        return torch.cat(parts)
    if all(isinstance(p, QTensor) for p in parts) and len({(p.kind, p.group) for p in parts}) == 1:
        return cat(parts)
    return cat([_target(p, "int8", 32) for p in parts])


def build_transformer(cfg: ModelConfig, state: dict[str, torch.Tensor | QTensor], device: torch.device,
                      dtype: torch.dtype, quant: str = "auto", group: int = 32, forms: dict[str, str] | None = None,
                      half: bool = False) -> Transformer:
    """A Transformer holding `state` (tinyllm's separate names; lm_head from tok_emb when tied).
    `forms` {name prefix: "none" | "int8" | "int4"} gives the matrices under a prefix their own
    form instead of `quant`'s, the longest prefix winning ({"tok_emb": "int8", "blocks.29.":
    "int8"}); `half` rounds new int4 scales to fp16 (quant.quantize)."""
    check_quant(quant, group)
    forms = forms or {}
    for form in forms.values():
        check_quant(form, group)
    check_finite(state)
    device = torch.device(device)
    if quant == "auto" and device.type == "cuda":
        quant = "none"
    # Without the AVX2 kernel int4 is slow on a CPU: int8. Asked only where an int4 matrix is
    # there: the question builds the kernel (about 20 s of CPU the first time), which a dense
    # model never uses (the default model's first load took 16.6 s instead of 0.2 s).
    has_int4 = any(isinstance(v, QTensor) and v.kind == "int4" for v in state.values())
    cpu_int8 = (has_int4 and device.type == "cpu" and quant == "auto" and fbgemm_available()
                and dtype == torch.float32 and not cpu_qgemv.available())
    state = dict(state)
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    mats: dict[str, torch.Tensor | QTensor] = {}
    names = ["tok_emb.weight"] + ([] if cfg.tie_embeddings else ["lm_head.weight"])
    names += [f"blocks.{i}.{lin}.weight" for i in range(cfg.n_layers) for lin in LINEARS]
    for n in names:
        own = max(((p, f) for p, f in forms.items() if n.startswith(p)), default=("", quant))[1]
        t = _target(state.pop(n), own, group, half)
        if cpu_int8 and isinstance(t, QTensor) and t.kind == "int4":
            t = quantize(t.dequantize(), "int8")
        mats[n] = t
    for i in range(cfg.n_layers):
        for fused, parts in FUSED.items():
            mats[f"blocks.{i}.{fused}.weight"] = _fuse([mats.pop(f"blocks.{i}.{p}.weight") for p in parts])
    dense = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}  # norms
    quantized: dict[str, QTensor] = {}
    for k, v in mats.items():
        if isinstance(v, QTensor):
            quantized[k.removesuffix(".weight")] = v.map(lambda t: t.to(device))
        else:
            dense[k] = v.to(device=device, dtype=matrix_dtype(v.dtype, device, dtype, quant))
    with torch.device("meta"):
        model = Transformer(cfg)
    for name, qt in quantized.items():
        parent, _, leaf = name.rpartition(".")
        module = QuantEmbedding(qt, dtype) if leaf == "tok_emb" else QuantLinear(qt, dtype)
        setattr(model.get_submodule(parent) if parent else model, leaf, module)
    if cfg.tie_embeddings:
        if "tok_emb" in quantized:
            model.lm_head = QuantLinear(quantized["tok_emb"], dtype)
        else:
            dense["lm_head.weight"] = dense["tok_emb.weight"]
    for fused, parts in FUSED.items():  # dense fused weights go in whole (the load hook splits names)
        for i in range(cfg.n_layers):
            key = f"blocks.{i}.{fused}.weight"
            if key in dense:
                rows = dense.pop(key).split([_rows(cfg, p) for p in parts])
                dense.update({f"blocks.{i}.{p}.weight": r for p, r in zip(parts, rows, strict=True)})
    result = model.load_state_dict(dense, strict=False, assign=True)
    assert not result.unexpected_keys, f"builder passed unknown tensors {result.unexpected_keys[:3]}"
    if cfg.tie_embeddings and "tok_emb" not in quantized:
        model.lm_head.weight = model.tok_emb.weight
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.device.type == "meta"]
    assert not left, f"builder left tensors unset: {left[:3]}"
    model.rope.to(device)
    return model.eval()


def quantize_model(model: Transformer, quant: str, group: int = 32, forms: dict[str, str] | None = None,
                   half: bool = False) -> Transformer:
    """A dense model rebuilt with its matrices in `quant`'s form (`forms`' where a prefix names
    them: build_transformer), on its device, in its dtype."""
    state = model.state_dict()
    assert not any(k.endswith(".qweight") for k in state), "quantize_model takes a dense model"
    return build_transformer(model.cfg, {k: v.float() for k, v in state.items()}, model.device, model.dtype,
                             quant, group, forms, half)


def _rows(cfg: ModelConfig, part: str) -> int:
    kv = cfg.n_kv_heads * cfg.head_dim
    return {"attn.wq": cfg.n_heads * cfg.head_dim, "attn.wk": kv, "attn.wv": kv}.get(part, cfg.ffn_dim)


