"""The GGUF architectures tinyllm runs, as configuration of the one Transformer: llama.cpp's
metadata keys and tensor names mapped onto `ModelConfig` and tinyllm's state-dict names, the
fields every architecture shares here and each family's own in tinyllm.families.

Contract:
- `gguf_config(g) -> ModelConfig` for a `general.architecture` of a family
  (`tinyllm.families.by_gguf_arch`), from `<arch>.*` metadata as llama.cpp's converter
  (convert_hf_to_gguf.py) writes it and llama.cpp reads it: head_dim from attention.key_length,
  partial rotary from rope.dimension_count, RoPE scaling from rope.scaling.type (linear) and the
  small factor tensors (`rope_freqs.weight`: Llama 3's per-frequency divisors;
  `rope_factors_short/long`: LongRoPE, with rope.scaling.attn_factor, in the files of a family
  whose `gguf_longrope` says so: Phi-3), both run as per-frequency divisors (rope_scaling
  "longrope"), so the result equals the Hugging Face model's. Those tensors are the only data
  it reads (a few floats each). Then the family's features and its own fields
  (`Family.from_gguf`: Gemma's scales, soft-caps and sliding-window layers, Phi-3's window,
  ...), reading the metadata through `ArchMeta` (`swa_layers`: llama.cpp's set_swa_pattern).
  Norm weights are used as stored (llama.cpp's converter already added the 1 of Gemma's (1 + w)).
- `gguf_names(g, cfg) -> {gguf name: tinyllm name | Split | None}`: every tensor but the RoPE
  factor tensors, by the family's per-layer table; None for a name tinyllm has no place for; a
  Split for a fused tensor (any family's `attn_qkv`: q, k, v rows; Phi-3's `ffn_up`: gate rows,
  then up rows), which holds the parts its layer does not store under their own names.
- `PERMUTED`: the families whose q/k rows llama.cpp's converter permutes into the
  interleaved RoPE layout (`Family.gguf_permuted`: llama only; the others use NEOX RoPE,
  rotate-half, as stored).
- `meta(g, key, kind, default, item)`: a metadata value checked for its type.
- `GGUFSource`: what these functions read of an open file (its path, metadata, tensor table and
  `tensor(name)`), a Protocol that tinyllm.formats.gguf.GGUFFile meets: this module is below
  gguf.py and imports nothing of it.
Refuses (ValueError, one line): architectures of no family, mixture-of-experts, RoPE scaling other
than linear / llama3 factors / LongRoPE (yarn, ...), per-layer head counts, head sizes llama.cpp's
converter would not write for the architecture.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

import torch

from tinyllm.families import FAMILIES, by_gguf_arch
from tinyllm.families.family import GGUF_FIXED
from tinyllm.formats.gguf_header import ARCHS, GGUFTensor
from tinyllm.formats.tensor_checks import part_rows
from tinyllm.model import ModelConfig

__all__ = ["ARCHS", "PERMUTED", "GGUFSource", "Split", "gguf_config", "gguf_names", "meta"]

PERMUTED = tuple(f.name for f in FAMILIES.values() if f.gguf_arch and f.gguf_permuted)
_RATIO_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
Split = tuple[tuple[str, int], ...]  # (tinyllm name, rows) of each part, in row order


class GGUFSource(Protocol):
    """What this module reads of an open file (tinyllm.formats.gguf.GGUFFile is one; declared
    here, below it, so that the two modules do not import each other)."""

    path: Path
    metadata: dict
    tensors: dict[str, GGUFTensor]

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor dequantized to fp32 (only the RoPE factor tensors are read here)."""
        ...


_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "a boolean", list: "an array"}


def meta(g: GGUFSource, key: str, kind: type, default=None, item: type | None = None):
    """Metadata `key` checked to be of `kind` (a list of `item`s for list; float takes an int;
    bool takes 0/1), or `default` when absent; the wrong type is a one-line ValueError."""
    v = g.metadata.get(key)
    if v is None:
        return default
    ok = {int: lambda x: type(x) is int, float: lambda x: type(x) in (int, float),
          bool: lambda x: type(x) is bool or x in (0, 1), str: lambda x: type(x) is str}
    if kind is list:
        good = type(v) is list and (item is None or all(ok[item](x) for x in v))
    else:
        good = ok[kind](v)
    if not good:
        what = f"an array of {_KINDS[item].split(' ', 1)[1]}s" if kind is list and item else _KINDS[kind]
        raise ValueError(f"{g.path}: GGUF metadata {key} should be {what}, not {type(v).__name__} "
                         f"{short(v)}; the file is corrupt or was written by a broken converter")
    return v


def short(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


class ArchMeta:
    """A file's `<arch>.*` metadata, as a family's `from_gguf` reads it (tinyllm.families.family.GGUFMeta)."""

    def __init__(self, g: GGUFSource, arch: str) -> None:
        self.g, self.arch = g, arch

    def get(self, key: str, default: Any = None, kind: type = int) -> Any:
        v = meta(self.g, f"{self.arch}.{key}", kind, default)
        if v is None:
            raise ValueError(f"{self.g.path}: GGUF metadata lacks {self.arch}.{key}")
        return v

    def swa_layers(self, n_layers: int, pattern: int) -> tuple[int, ...]:
        """The sliding-window layers: llama.cpp's set_swa_pattern (layer i slides unless i % n == n - 1)."""
        g, key = self.g, f"{self.arch}.attention.sliding_window_pattern"
        if isinstance(g.metadata.get(key), list):
            flags = meta(g, key, list, item=bool)
            if len(flags) != n_layers:
                raise ValueError(f"{g.path}: {key} has {len(flags)} entries for {n_layers} layers")
            return tuple(i for i, f in enumerate(flags) if f)
        n = int(meta(g, key, int, pattern))
        return tuple(i for i in range(n_layers) if n == 0 or i % n < n - 1)


def gguf_config(g: GGUFSource) -> ModelConfig:
    """The ModelConfig an architecture's metadata describes (see the module docstring)."""
    arch = g.metadata.get("general.architecture")
    family = by_gguf_arch(arch)
    if family is None:
        raise ValueError(f"{g.path}: GGUF architecture {short(arch)} is not supported "
                         f"(tinyllm reads {', '.join(ARCHS)})")
    m = ArchMeta(g, arch)
    get = m.get
    if get("expert_count", 0):
        raise ValueError(f"{g.path}: mixture-of-experts {arch} models are not supported")
    heads, dim = int(get("attention.head_count")), int(get("embedding_length"))
    if isinstance(g.metadata.get(f"{arch}.attention.head_count_kv"), list):
        raise ValueError(f"{g.path}: per-layer key/value head counts are not supported")
    head_dim = int(get("attention.key_length", dim // heads if heads else 0))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ValueError(f"{g.path}: {arch}.attention.value_length differs from key_length; tinyllm does not "
                         "support that")
    rotary = int(get("rope.dimension_count", head_dim))
    if family.gguf_permuted and (head_dim != dim // heads or rotary != head_dim):
        raise ValueError(f"{g.path}: {arch} head size {head_dim} / rotary dims {rotary} other than "
                         f"embedding_length / head_count ({dim} / {heads}) are not supported")
    n_layers, max_len = int(get("block_count")), int(get("context_length", 2048))
    emb = g.tensors.get("token_embd.weight")
    vocab = int(meta(g, f"{arch}.vocab_size", int) or (emb.shape[0] if emb and emb.shape else len(
        meta(g, "tokenizer.ggml.tokens", list, []))))
    scaling, max_len = _rope_scaling(g, arch, get, rotary, max_len, family.gguf_longrope)
    shared = dict(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=heads,
                  n_kv_heads=int(get("attention.head_count_kv", heads)), ffn_dim=int(get("feed_forward_length")),
                  max_seq_len=max_len, rope_theta=float(get("rope.freq_base", 10000.0, float)),
                  norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5, float)),
                  tie_embeddings="output.weight" not in g.tensors, family=family.name, head_dim=head_dim,
                  rotary_dim=rotary, rope_scaling=scaling, **family.features)
    return ModelConfig(**{**shared, **family.from_gguf(m, shared)})


def _rope_scaling(g: GGUFSource, arch: str, get, rotary: int, max_len: int, longrope: bool) -> tuple[dict | None, int]:
    """(tinyllm's rope_scaling, max_seq_len) from rope.scaling.* and the RoPE factor tensors."""
    kind = get("rope.scaling.type", "none", str)
    factor = float(get("rope.scaling.factor", 0.0, float) or get("rope.scale_linear", 0.0, float))
    if kind == "linear" or (kind == "none" and factor not in (0.0, 1.0)):
        if not factor:
            raise ValueError(f"{g.path}: rope scaling (linear) is not supported without {arch}.rope.scaling.factor")
        return {"type": "linear", "factor": factor}, max_len
    if kind not in ("none", "longrope"):
        raise ValueError(f"{g.path}: rope scaling ({short(kind)}) is not supported "
                         "(tinyllm runs linear, llama3 factors and longrope)")
    if longrope and "rope_factors_short.weight" in g.tensors:  # Phi-3's (Family.gguf_longrope)
        short_f, long_f = (_factors(g, f"rope_factors_{k}.weight", rotary) for k in ("short", "long"))
        old = int(get("rope.scaling.original_context_length"))
        attn = float(get("rope.scaling.attn_factor", 1.0, float))
        # The short factors within the original context, the long ones past it (tinyllm.core.rope).
        return ({"type": "longrope", "short_factor": short_f, "long_factor": long_f,
                 "original_max_position_embeddings": old, "factor": max_len / old, "attention_factor": attn},
                max_len)
    if "rope_freqs.weight" in g.tensors:  # Llama 3.1/3.2: each frequency divided by its factor
        f = _factors(g, "rope_freqs.weight", rotary)
        return ({"type": "longrope", "short_factor": f, "long_factor": f, "original_max_position_embeddings": max_len,
                 "attention_factor": 1.0}, max_len)
    if kind == "longrope":
        raise ValueError(f"{g.path}: longrope scaling without rope_factors tensors is not supported")
    return None, max_len


def _factors(g: GGUFSource, name: str, rotary: int) -> list[float]:
    t = g.tensors.get(name)
    if t is None or t.shape != (rotary // 2,) or t.type != 0:  # F32
        raise ValueError(f"{g.path}: tensor {name} should be F32 of shape ({rotary // 2},); the file is corrupt")
    f = g.tensor(name).tolist()
    if not all(math.isfinite(x) and x > 0 for x in f):
        raise ValueError(f"{g.path}: tensor {name} holds factors that are not positive finite numbers")
    return f


def gguf_names(g: GGUFSource, cfg: ModelConfig) -> dict[str, str | Split | None]:
    """GGUF tensor name -> tinyllm name, the parts of a fused tensor, or None (unknown)."""
    table = FAMILIES[cfg.family].gguf_tensors
    own = {tl: name for name, tl in table.items() if isinstance(tl, str)}  # a part's own tensor
    rows = part_rows(cfg)
    out: dict[str, str | Split | None] = {}
    for name in g.tensors:
        if name in _RATIO_TENSORS:
            continue
        parts = name.split(".")
        if name in GGUF_FIXED:
            out[name] = GGUF_FIXED[name]
        elif len(parts) != 4 or parts[0] != "blk" or parts[2] not in table or parts[3] not in ("weight", "bias"):
            out[name] = None
        elif isinstance(table[parts[2]], tuple):  # fused: the parts its layer does not store on their own
            i, leaf = parts[1], parts[3]
            inside = [p for p in table[parts[2]] if p not in own or f"blk.{i}.{own[p]}.weight" not in g.tensors]
            if len(inside) == 1:
                out[name] = f"blocks.{i}.{inside[0]}.{leaf}"
            elif inside and leaf == "weight":
                out[name] = tuple((f"blocks.{i}.{p}.weight", rows[f"{p}.weight"]) for p in inside)
            else:
                out[name] = None
        else:
            out[name] = f"blocks.{parts[1]}.{table[parts[2]]}.{parts[3]}"
    return out
