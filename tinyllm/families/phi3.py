"""Phi-3, Phi-3.5 and Phi-4-mini: model_type `phi3`, GGUF architecture `phi3`.

The Llama layout with q, k and v stored as one matrix (qkv_proj; llama.cpp: attn_qkv) and the
gate and up projections as one (gate_up_proj; llama.cpp: ffn_up), split by rows on load and
fused again on export; Phi-4-mini turns RoPE on 3/4 of each head (partial_rotary_factor). Its
LongRoPE (short and long per-frequency factors; llama.cpp: the rope_factors_short/long tensors,
read for this family's files alone) is run by the shared code. A sliding window shorter than the
context makes every layer local (Phi-3-mini-4k's 2,047 keys); config.json has no mlp_bias for it.
"""

from __future__ import annotations

from tinyllm.families.family import GGUF_LAYER, HF_LAYER, Family, Fields, GGUFMeta, hf_local

HF_FUSED = {"self_attn.qkv_proj.weight": ("attn.wq.weight", "attn.wk.weight", "attn.wv.weight"),
            "mlp.gate_up_proj.weight": ("ffn.w1.weight", "ffn.w3.weight")}
HF_SEPARATE = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "mlp.gate_proj.weight", "mlp.up_proj.weight")


def from_hf(raw: dict, fields: Fields) -> Fields:
    local = hf_local(raw, lambda: range(fields["n_layers"]))  # every layer
    return local if local["sliding_window"] < fields["max_seq_len"] else {}


def to_hf(cfg: Fields, raw: dict) -> dict:
    raw = {k: v for k, v in raw.items() if k != "mlp_bias"}
    return {**raw, "sliding_window": None}  # a window, where there is one, is written after this


def from_gguf(m: GGUFMeta, fields: Fields) -> Fields:
    window = int(m.get("attention.sliding_window", 0))
    if 0 < window < fields["max_seq_len"]:
        return dict(sliding_window=window, local_layers=tuple(range(fields["n_layers"])))
    return {}


FAMILY = Family(
    name="phi3", model_types=("phi3",), hf_class="Phi3ForCausalLM", gguf_arch="phi3", features={},
    from_hf=from_hf, to_hf=to_hf, from_gguf=from_gguf,
    hf_tensors={**{k: v for k, v in HF_LAYER.items() if k not in HF_SEPARATE}, **HF_FUSED},
    gguf_tensors={**GGUF_LAYER, "ffn_up": ("ffn.w1", "ffn.w3")}, gguf_longrope=True,
    presets={"phi3-mini": dict(  # Phi-3-mini-4k's config.json
        vocab_size=32064, dim=3072, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=8192, max_seq_len=4096,
        rope_theta=10000.0)})

FAMILIES = (FAMILY,)
