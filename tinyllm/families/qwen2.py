"""Qwen 2 and 2.5: model_type `qwen2`, GGUF architecture `qwen2`.

The Llama layout with biases on the q, k and v projections (config.json's attention_bias is not
needed: every Qwen 2 has them). GGUF stores q/k rows as Hugging Face does (NEOX RoPE, rotate-half).
Refuses use_sliding_window=true (transformers' Qwen 2 option of windowed upper layers).
Exported with the window off, as the released models are.
"""

from __future__ import annotations

from tinyllm.families.family import GGUF_LAYER, HF_LAYER, HF_QKV_BIAS, Family, Fields, nothing


def refuse_sliding_window(raw: dict, fields: Fields) -> Fields:
    """Qwen's windowed upper layers (use_sliding_window) are not run: refused."""
    if raw.get("use_sliding_window"):
        raise ValueError(f"use_sliding_window=true is not supported for {raw['model_type']}")
    return {}


def window_off(cfg: Fields, raw: dict) -> dict:
    return {**raw, "sliding_window": None, "use_sliding_window": False}


FAMILY = Family(
    name="qwen2", model_types=("qwen2",), hf_class="Qwen2ForCausalLM", gguf_arch="qwen2",
    features=dict(qkv_bias=True), from_hf=refuse_sliding_window, to_hf=window_off, from_gguf=nothing,
    hf_tensors={**HF_LAYER, **HF_QKV_BIAS}, gguf_tensors=GGUF_LAYER,
    presets={"qwen2.5-0.5b": dict(  # Qwen2.5-0.5B's config.json, its context cut to 8,192
        vocab_size=151936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, ffn_dim=4864, max_seq_len=8192,
        rope_theta=1e6, norm_eps=1e-6, tie_embeddings=True)})

FAMILIES = (FAMILY,)
