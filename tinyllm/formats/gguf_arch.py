"""The GGUF architectures tinyllm runs, as configuration of the one Transformer: llama.cpp's
metadata keys and tensor names mapped onto `ModelConfig` and tinyllm's state-dict names.

Contract:
- `gguf_config(g) -> ModelConfig` for `general.architecture` llama, qwen2, qwen3, gemma2,
  gemma3 or phi3, from `<arch>.*` metadata as llama.cpp's converter (convert_hf_to_gguf.py)
  writes it and llama.cpp reads it: head_dim from attention.key_length, partial rotary from
  rope.dimension_count, RoPE scaling from rope.scaling.type (linear) and the small factor
  tensors (`rope_freqs.weight`: Llama 3's per-frequency divisors; `rope_factors_short/long`:
  Phi-3's LongRoPE, with rope.scaling.attn_factor), both run as per-frequency divisors
  (rope_scaling "longrope"), so the result equals the Hugging Face model's. Those tensors are
  the only data it reads (a few floats each). Gemma: GeGLU, post-norms, sqrt(dim) embedding
  scale, soft-caps, sliding-window layers (attention.sliding_window_pattern, else llama.cpp's
  default: every 2nd layer global for Gemma 2, every 6th for Gemma 3), the local RoPE base
  (rope.freq_base_swa, else llama.cpp's default), and the query scale llama.cpp uses (head_dim,
  or dim / heads for the 27B shapes: GGUF does not store query_pre_attn_scalar). Gemma norm
  weights already hold the 1 of HF's (1 + w) (the converter adds it), so nothing is added here.
- `gguf_names(g, cfg) -> {gguf name: tinyllm name | Split | None}`: every tensor but the RoPE
  factor tensors; None for a name tinyllm has no place for; a Split for Phi-3's fused
  `attn_qkv` (q, k, v rows) and `ffn_up` (gate rows, then up rows).
- `PERMUTED`: the architectures whose q/k rows llama.cpp's converter permutes into the
  interleaved RoPE layout (llama only; the others use NEOX RoPE, rotate-half, as stored).
- `meta(g, key, kind, default, item)`: a metadata value checked for its type.
Refuses (ValueError, one line): other architectures, mixture-of-experts, RoPE scaling other
than linear / llama3 factors / LongRoPE (yarn, ...), per-layer head counts, head sizes llama.cpp's
converter would not write for the architecture.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tinyllm.formats.gguf_header import ARCHS
from tinyllm.model import ModelConfig

if TYPE_CHECKING:
    from tinyllm.formats.gguf import GGUFFile

__all__ = ["ARCHS", "PERMUTED", "Split", "gguf_config", "gguf_names", "meta"]

PERMUTED = ("llama",)
_GEMMA = dict(act="gelu_tanh", post_norms=True)
# architecture -> what it sets on ModelConfig beyond the shared keys
_OWN: dict[str, dict] = {"llama": {}, "qwen2": dict(qkv_bias=True), "qwen3": dict(qk_norm=True),
                         "gemma2": _GEMMA, "gemma3": dict(_GEMMA, qk_norm=True), "phi3": {}}
_PATTERN = {"gemma2": 2, "gemma3": 6}  # llama.cpp's default sliding-window layer pattern
_BIG_GEMMA = {"gemma2": 46, "gemma3": 62}  # layers of the 27B shapes (query scale dim / heads)
_RATIO_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
_LAYER = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "attn_q": "attn.wq", "attn_k": "attn.wk",
          "attn_v": "attn.wv", "attn_output": "attn.wo", "ffn_gate": "ffn.w1", "ffn_up": "ffn.w3",
          "ffn_down": "ffn.w2", "attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm",
          "post_attention_norm": "post_attn_norm", "post_ffw_norm": "post_ffn_norm"}
Split = tuple[tuple[str, int], ...]  # (tinyllm name, rows) of each part, in row order

_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "a boolean", list: "an array"}


def meta(g: GGUFFile, key: str, kind: type, default=None, item: type | None = None):
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


def gguf_config(g: GGUFFile) -> ModelConfig:
    """The ModelConfig an architecture's metadata describes (see the module docstring)."""
    arch = g.metadata.get("general.architecture")
    if arch not in ARCHS:
        raise ValueError(f"{g.path}: GGUF architecture {short(arch)} is not supported "
                         f"(tinyllm reads {', '.join(ARCHS)})")

    def get(key, default=None, kind: type = int):
        v = meta(g, f"{arch}.{key}", kind, default)
        if v is None:
            raise ValueError(f"{g.path}: GGUF metadata lacks {arch}.{key}")
        return v

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
    if arch in PERMUTED and (head_dim != dim // heads or rotary != head_dim):
        raise ValueError(f"{g.path}: {arch} head size {head_dim} / rotary dims {rotary} other than "
                         f"embedding_length / head_count ({dim} / {heads}) are not supported")
    n_layers, max_len = int(get("block_count")), int(get("context_length", 2048))
    emb = g.tensors.get("token_embd.weight")
    vocab = int(meta(g, f"{arch}.vocab_size", int) or (emb.shape[0] if emb and emb.shape else len(
        meta(g, "tokenizer.ggml.tokens", list, []))))
    scaling, max_len = _rope_scaling(g, arch, get, rotary, max_len)
    cfg = dict(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=heads,
               n_kv_heads=int(get("attention.head_count_kv", heads)), ffn_dim=int(get("feed_forward_length")),
               max_seq_len=max_len, rope_theta=float(get("rope.freq_base", 10000.0, float)),
               norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5, float)),
               tie_embeddings="output.weight" not in g.tensors, family=arch, head_dim=head_dim,
               rotary_dim=rotary, rope_scaling=scaling, **_OWN[arch])
    window = int(get("attention.sliding_window", 0))
    if arch in _PATTERN:
        cfg.update(embed_scale=dim ** 0.5, attn_scale=float(dim // heads if n_layers == _BIG_GEMMA[arch] else head_dim),
                   attn_softcap=float(get("attn_logit_softcapping", 0.0, float)),
                   final_softcap=float(get("final_logit_softcapping", 0.0, float)))
        if arch == "gemma2" and not window:
            window = 4096  # llama.cpp's default for Gemma 2
        if window:
            local = _local_layers(g, arch, n_layers)
            # llama.cpp's local RoPE: Gemma 2's is the global one unless set, Gemma 3's base 10,000
            base = float(get("rope.freq_base_swa", 0.0 if arch == "gemma2" else 10000.0, float))
            cfg.update(sliding_window=window, local_layers=local, rope_local_theta=base if local else 0.0)
    elif arch == "phi3" and 0 < window < max_len:
        cfg.update(sliding_window=window, local_layers=tuple(range(n_layers)))
    return ModelConfig(**cfg)


def _rope_scaling(g: GGUFFile, arch: str, get, rotary: int, max_len: int) -> tuple[dict | None, int]:
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
    if arch == "phi3" and "rope_factors_short.weight" in g.tensors:
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


def _factors(g: GGUFFile, name: str, rotary: int) -> list[float]:
    t = g.tensors.get(name)
    if t is None or t.shape != (rotary // 2,) or t.type != 0:  # F32
        raise ValueError(f"{g.path}: tensor {name} should be F32 of shape ({rotary // 2},); the file is corrupt")
    f = g.tensor(name).tolist()
    if not all(math.isfinite(x) and x > 0 for x in f):
        raise ValueError(f"{g.path}: tensor {name} holds factors that are not positive finite numbers")
    return f


def _local_layers(g: GGUFFile, arch: str, n_layers: int) -> tuple[int, ...]:
    """The sliding-window layers: llama.cpp's set_swa_pattern (layer i slides unless i % n == n - 1)."""
    key = f"{arch}.attention.sliding_window_pattern"
    v = g.metadata.get(key)
    if isinstance(v, list):
        flags = meta(g, key, list, item=bool)
        if len(flags) != n_layers:
            raise ValueError(f"{g.path}: {key} has {len(flags)} entries for {n_layers} layers")
        return tuple(i for i, f in enumerate(flags) if f)
    n = int(meta(g, key, int, _PATTERN[arch]))
    return tuple(i for i in range(n_layers) if n == 0 or i % n < n - 1)


def gguf_names(g: GGUFFile, cfg: ModelConfig) -> dict[str, str | Split | None]:
    """GGUF tensor name -> tinyllm name, the parts of a fused Phi-3 tensor, or None (unknown)."""
    fixed = {"token_embd.weight": "tok_emb.weight", "output_norm.weight": "norm.weight",
             "output.weight": "lm_head.weight"}
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    out: dict[str, str | Split | None] = {}
    for name in g.tensors:
        if name in _RATIO_TENSORS:
            continue
        parts = name.split(".")
        if name in fixed:
            out[name] = fixed[name]
        elif len(parts) == 4 and parts[0] == "blk" and parts[2] == "attn_qkv" and parts[3] == "weight":
            t = f"blocks.{parts[1]}.attn."
            out[name] = ((t + "wq.weight", q), (t + "wk.weight", kv), (t + "wv.weight", kv))
        elif (cfg.family == "phi3" and len(parts) == 4 and parts[2] == "ffn_up"
              and f"blk.{parts[1]}.ffn_gate.weight" not in g.tensors):
            t = f"blocks.{parts[1]}.ffn."
            out[name] = ((t + "w1.weight", cfg.ffn_dim), (t + "w3.weight", cfg.ffn_dim))
        elif len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER and parts[3] in ("weight", "bias"):
            out[name] = f"blocks.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
        else:
            out[name] = None
    return out
