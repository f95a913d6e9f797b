"""The layer below every model format: from a config and named tensors to a Transformer.

checkpoint.py, hf.py and gguf.py each read their own files, map names to tinyllm's (the
separate `attn.wq/wk/wv`, `ffn.w1/w3` names) and hand the tensors down here; none imports
another format. This module owns what they share:
- `resolve_device(name)`, `default_dtype(device, int4)`, `holds_int4(quant, tensors)`: bf16
  on CUDA; on a CPU fp32, or bf16 for a model holding int4 matrices where the CPU computes
  bf16 natively (AVX512-BF16 or AMX, read from /proc/cpuinfo at run time) and the AVX2 kernel
  cannot be built.
- `expected_shapes(cfg)`, `match_tensors(...)`, `check_tensors(...)`: every tensor a config
  implies, present, with its shape; a quantized matrix may stand for a dense one (see quant.py).
- `build_transformer(cfg, state, device, dtype, quant)`: state values are dense tensors or
  `QTensor`s. `quant`: "none" dequantizes everything; "int8" / "int4" quantizes every matrix
  (embeddings and output included) to that form (int4 falls back to int8 for a matrix whose
  rows are not whole groups); "keep" keeps what the file holds; "auto" too, except that on
  a CPU without the AVX2 kernel (tinyllm.cpu_qgemv) but with fbgemm int4 becomes int8
  (fbgemm's int8 kernel is then the fast one), and on CUDA everything is dense in `dtype`
  (measured on the H200, SmolLM2 Q4_1 in the app: int4 kept 459 tok/s compiled and 8.5 tok/s
  on the plain step, which dequantizes whole matrices each token; docs/BENCHMARKS-LOG.md). A fused projection
  (wq/wk/wv, w1/w3) whose parts differ in form is held as int8. A dense matrix keeps the
  file's bf16 / fp16 on a CPU computing in fp32 under "auto" and "keep" (`matrix_dtype`).
- `quantize_model(model, quant, group)`: the same, from a dense model in memory.
- `pick_template(...)`: the chat template, from a name, the model's Jinja source or a guess.
- `with_progress(items, progress)`: how each loader reports its reading: `progress(done,
  total)` in tensors, (0, total) before the first tensor is read and (total, total) after the
  last, from the loading thread (a UI shows it as a determinate bar).
- `check_finite(state)`: every weight finite (the scales and zeros of a quantized matrix; its
  integers cannot be anything else), by one reduction per tensor; build_transformer runs it
  first, so every format gets it. A NaN or Inf loaded silently before: a model that then
  printed "⁇ ⁇ ⁇" or empty tokens until the context was full.
Refuses with one line (ValueError): an unknown quant or device, shapes that do not match, a
weight that is not finite (naming the tensor).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import TypeVar

import torch

from tinyllm import cpu_qgemv
from tinyllm.chat_template import ChatTemplate, get_template
from tinyllm.jinja_template import derive_template, guess_builtin
from tinyllm.model import HALF, ModelConfig, Transformer
from tinyllm.quant import GROUPS, QTensor, QuantEmbedding, QuantLinear, cat, fbgemm_available, fits, quantize

QUANTS = ("auto", "keep", "none", "int8", "int4")
Progress = Callable[[int, int], None]  # progress(tensors read, tensors in all)
T = TypeVar("T")
FUSED = {"attn.wqkv": ("attn.wq", "attn.wk", "attn.wv"), "ffn.w13": ("ffn.w1", "ffn.w3")}
LINEARS = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "ffn.w1", "ffn.w3", "ffn.w2")


def resolve_device(device: str) -> torch.device:
    """"auto" | "cpu" | "cuda" -> a device; a ValueError for CUDA where there is none."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (use --device cpu)")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


@cache
def cpu_has_bf16() -> bool:
    """AVX512-BF16 or AMX-BF16 in /proc/cpuinfo (False where it cannot be read)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def default_dtype(device: torch.device, int4: bool = False) -> torch.dtype:
    """bf16 on CUDA; fp32 on a CPU, except for a model holding int4 matrices on a CPU that
    computes bf16 natively but cannot build the AVX2 kernel (tinyllm.cpu_qgemv): torch's int4
    kernel, its fallback, is fast there in bf16. Measured on a 2-core AVX512-BF16 / AMX CPU
    (docs/BENCHMARKS-LOG.md, eleventh session), compiled, tok/s fp32 against bf16: SmolLM2's Q4_1 at
    W = 128 / 1,024 / 2,048 123 / 82 / 74 against 88 / 61 / 50 (the kernel's prefetch and its
    decode attention); SmolLM2 all int4 109-113 against 104-105; only the 12.6 MB default
    model's Q4_1 ran faster in bf16 at W = 128 (770 against 597), not past it. (In the tenth
    session, before those two, bf16 won for int4 models and was the rule.)"""
    if device.type == "cuda":
        return torch.bfloat16
    if int4 and cpu_has_bf16() and not cpu_qgemv.available():
        return torch.bfloat16
    return torch.float32


def holds_int4(quant: str, tensors: Iterable[torch.Tensor | QTensor]) -> bool:
    """Whether a model loaded with `quant` from these tensors holds int4 matrices (the
    question default_dtype asks)."""
    kept = quant in ("keep", "auto") and any(isinstance(t, QTensor) and t.kind == "int4" for t in tensors)
    return quant == "int4" or kept


def with_progress(items: Sequence[T], progress: Progress | None) -> Iterator[T]:
    """The items in order, telling `progress(done, total)` before the first and after each."""
    if progress is not None:
        progress(0, len(items))
    for done, item in enumerate(items, 1):
        yield item
        if progress is not None:
            progress(done, len(items))


def check_quant(quant: str, group: int = 32) -> None:
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")
    if group not in GROUPS:
        raise ValueError(f"int4 group size {group} is not supported: use {' or '.join(map(str, GROUPS))}")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every dense tensor a config implies (separate q/k/v, gate/up names); no lm_head when tied."""
    with torch.device("meta"):
        model = Transformer(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        del shapes["lm_head.weight"]
    return shapes


def quant_shapes(name: str, shape: tuple[int, ...], dtype: str) -> dict[str, tuple[int, ...]] | None:
    """The tensors a quantized `<name>.weight` of `shape` is stored as, for the dtype of its
    qweight ("I8" int8, "U8" int4), or None for another dtype. int4 group sizes: any listed."""
    base = name.removesuffix(".weight")
    n, k = shape
    if dtype == "I8":
        return {f"{base}.qweight": (n, k), f"{base}.scales": (n,)}
    if dtype == "U8":
        return {f"{base}.qweight": (n, k // 2)}  # scales/zeros: (n, k // g), checked by match_tensors
    return None


def match_tensors(want: dict[str, tuple[int, ...]], found: dict[str, tuple[tuple[int, ...], str]]
                  ) -> tuple[list[str], list[str], list[str]]:
    """(missing, unexpected, mis-shaped) names of `found` {name: (shape, safetensors dtype)}
    against the dense `want`; a matrix may be stored quantized (qweight, scales[, zeros])."""
    missing, wrong, used = [], [], set()
    for name, shape in want.items():
        base = name.removesuffix(".weight")
        if name in found:
            used.add(name)
            if found[name][0] != shape:
                wrong.append(f"{name}: file {found[name][0]} vs config {shape}")
            continue
        q = found.get(f"{base}.qweight")
        if q is None or len(shape) != 2:
            missing.append(name)
            continue
        parts = quant_shapes(name, shape, q[1]) or {}
        if q[1] == "U8":
            m = found.get(f"{base}.scales", ((0, 0),))[0][-1]  # K / g groups per row
            g = shape[1] // m if m and shape[1] % m == 0 else 0
            cols = shape[1] // g if g in GROUPS else "K/32 or K/64"
            parts.update({f"{base}.scales": (shape[0], cols), f"{base}.zeros": (shape[0], cols)})
        for k, s in parts.items():
            used.add(k)
            if k not in found:
                missing.append(k)
            elif found[k][0] != s:
                wrong.append(f"{k}: file {found[k][0]} vs config {s}")
        if not parts:
            wrong.append(f"{base}.qweight: dtype {q[1]} (int8 is I8, int4 is U8)")
    return sorted(missing), sorted(set(found) - used), wrong


def check_tensors(lead: str, missing: list[str], unexpected: list[str], wrong: list[str]) -> None:
    """One line naming the first few missing / unexpected / mis-shaped tensors, if any."""
    for what, items in (("missing tensors", missing), ("unexpected tensors", unexpected),
                        ("shape mismatch", wrong)):
        if items:
            more = f" (and {len(items) - 3} more)" if len(items) > 3 else ""
            raise ValueError(f"{lead}: {what} {', '.join(items[:3])}{more}")


def check_vocab(where: object, tokenizer_size: int, model_size: int) -> None:
    """A tokenizer larger than the model encodes ids the model has no embedding for (the
    prompt would fail): refused. A smaller one is a model whose embeddings are padded past
    the tokenizer (common in fine-tunes); it loads, and ChatSession never samples the padded
    ids (StepSampler's `n_valid`), so a reply cannot hold an id the tokenizer cannot decode."""
    if tokenizer_size > model_size:
        raise ValueError(f"{where}: the tokenizer has {tokenizer_size} tokens but the model only "
                         f"{model_size} embeddings; use the tokenizer the model was trained with")


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


def matrix_dtype(stored: torch.dtype, device: torch.device, dtype: torch.dtype, quant: str) -> torch.dtype:
    """The dtype a dense matrix is held in: as stored where a CPU computes in fp32 from a file's
    bf16 or fp16 matrix and `quant` keeps what the file holds ("auto", "keep"), else the
    activations' `dtype`. Held at 16 bits, a decode step reads half the bytes, widened exactly
    where it is read (tinyllm.model.linear): measured on the 2-core CPU, the default model's
    compiled step 1.27x faster and the app 1.42x (docs/BENCHMARKS-LOG.md). "none" is the fp32
    reference."""
    if device.type == "cpu" and dtype == torch.float32 and quant in ("auto", "keep") and stored in HALF:
        return stored
    return dtype


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


def check_finite(state: dict[str, torch.Tensor | QTensor]) -> None:
    """ValueError naming the first tensor that holds a NaN or an infinity. The reduction is
    aminmax (NaN propagates through min and max, an infinity is the min or the max): measured
    on the 2-core CPU over the default model's 56 bf16 tensors (21 M values), 9 ms, against 148
    ms for isfinite(x).all() (a bool tensor the size of each weight) and 25 ms for an fp32 sum."""
    for name, t in state.items():
        parts = {".scales": t.scales, ".zeros": t.zeros} if isinstance(t, QTensor) else {"": t}
        for suffix, x in parts.items():
            if x is None or not x.is_floating_point() or not x.numel():
                continue
            lo, hi = torch.aminmax(x)
            if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
                where = f"{name.removesuffix('.weight')}{suffix}" if suffix else name
                raise ValueError(f"the weights are damaged: {where} holds NaN or infinite values; "
                                 "download or convert the model again")


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


# ---- chat templates -------------------------------------------------------------------------

def pick_template(source: str | None, tokenizer, add_bos: bool, template: str | None,
                  name: str) -> ChatTemplate:
    """`template` by name; else the model's own Jinja template when it splits per message;
    else a built-in guessed from the template source or model name; else chatml."""
    if template:
        return get_template(template)
    bos = tokenizer.id_to_piece(tokenizer.bos_id) if tokenizer.bos_id is not None else None
    eos = tokenizer.id_to_piece(tokenizer.eos_id) if tokenizer.eos_id is not None else None
    if source:
        try:
            return derive_template(source, bos, eos, add_bos, lambda p: tokenizer.piece_to_id(p) is not None)
        except ValueError as e:
            guess = guess_builtin(source) or "chatml"
            warnings.warn(f"{name}: using the built-in {guess!r} chat template: {e}", stacklevel=2)
            return get_template(guess)
    return get_template(guess_builtin(name) or "chatml")
