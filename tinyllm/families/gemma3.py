"""Gemma 3 (text): model_type `gemma3_text`, or `gemma3` (the multimodal model: its text model
only), GGUF architecture `gemma3`.

Gemma 2 (gemma2.py: GeGLU, post-norms, sqrt(dim) embedding scale, (1 + w) norms, tied
embeddings) with an RMSNorm over each head of q and k, no soft-caps, five local layers to each
global one (layer_types, or sliding_window_pattern, default 6; llama.cpp's default is the
same), and a RoPE of their own for the local layers (rope_parameters' sliding_attention, or
rope_local_base_freq; llama.cpp: rope.freq_base_swa, default 10,000). A multimodal folder's
vision tower is not read (tinyllm.formats.hf). The 27B's 62 layers scale queries by dim / heads
in GGUF, as llama.cpp does.
"""

from __future__ import annotations

from tinyllm.families import gemma2
from tinyllm.families.family import GGUF_QK_NORM, HF_QK_NORM, Family, Fields, GGUFMeta, hf_local


def text_config(raw: dict) -> dict:
    """The multimodal config.json's text model (its text_config); a text model's as it is."""
    if raw.get("model_type") != "gemma3":
        return raw
    return {**raw.get("text_config", {}), "model_type": "gemma3_text",
            "tie_word_embeddings": raw.get("tie_word_embeddings", True)}


def from_hf(raw: dict, fields: Fields) -> Fields:
    def every_nth_global():
        n = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6)
        return (i for i in range(fields["n_layers"]) if (i + 1) % n)

    return {**gemma2.hf_scales(raw, fields), **hf_local(raw, every_nth_global)}


def from_gguf(m: GGUFMeta, fields: Fields) -> Fields:
    return gemma2.gguf_fields(m, fields, 62, int(m.get("attention.sliding_window", 0)), 6, 10000.0)


FAMILY = Family(
    name="gemma3", model_types=("gemma3_text", "gemma3"), hf_class="Gemma3ForCausalLM", gguf_arch="gemma3",
    features=dict(gemma2.GEMMA, qk_norm=True), from_hf=from_hf, to_hf=gemma2.to_hf, from_gguf=from_gguf,
    hf_tensors={**gemma2.HF_TENSORS, **HF_QK_NORM}, gguf_tensors={**gemma2.GGUF_TENSORS, **GGUF_QK_NORM},
    hf_defaults=gemma2.HF_DEFAULTS, hf_text_config=text_config, norm_offset=1.0,
    presets={"gemma3-270m": dict(  # Gemma 3 270M's config.json, its context cut to 8,192
        vocab_size=262144, dim=640, n_layers=18, n_heads=4, n_kv_heads=1, head_dim=256, ffn_dim=2048,
        max_seq_len=8192, rope_theta=1e6, norm_eps=1e-6, tie_embeddings=True, embed_scale=640 ** 0.5,
        attn_scale=256.0, sliding_window=512, local_layers=tuple(i for i in range(18) if (i + 1) % 6),
        rope_local_theta=10000.0)})

FAMILIES = (FAMILY,)
