"""Gemma 2: model_type `gemma2`, GGUF architecture `gemma2`.

The Llama layout with: GeGLU (tanh-GELU gate), RMSNorm on the attention's and the FFN's outputs
too (post-norms), embeddings scaled by sqrt(dim), queries scaled by query_pre_attn_scalar ** -0.5
(GGUF does not store it: llama.cpp uses head_dim, or dim / heads for the 27B's 46 layers),
soft-capped attention scores and logits, and sliding-window attention on the even layers (4,096
keys; llama.cpp's attention.sliding_window_pattern, else every 2nd layer global). Its norms scale
by (1 + w): Hugging Face stores w (the loader adds the 1, the export takes it off), llama.cpp's
converter stores 1 + w. Embeddings are tied unless config.json says otherwise.
"""

from __future__ import annotations

from tinyllm.families.family import GGUF_LAYER, HF_LAYER, Family, Fields, GGUFMeta, hf_local

GEMMA = dict(act="gelu_tanh", post_norms=True)
HF_DEFAULTS = {"hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": True}
HF_TENSORS = {**HF_LAYER, "post_attention_layernorm.weight": "post_attn_norm.weight",
              "pre_feedforward_layernorm.weight": "ffn_norm.weight",
              "post_feedforward_layernorm.weight": "post_ffn_norm.weight"}
GGUF_TENSORS = {**GGUF_LAYER, "post_attention_norm": "post_attn_norm", "post_ffw_norm": "post_ffn_norm"}


def hf_scales(raw: dict, fields: Fields) -> Fields:
    """Gemma's embedding scale, query scale and soft-caps from config.json."""
    return dict(embed_scale=fields["dim"] ** 0.5,
                attn_scale=float(raw.get("query_pre_attn_scalar") or fields["head_dim"]),
                attn_softcap=float(raw.get("attn_logit_softcapping") or 0.0),
                final_softcap=float(raw.get("final_logit_softcapping") or 0.0))


def to_hf(cfg: Fields, raw: dict) -> dict:
    """Gemma's config.json: hidden_activation for hidden_act, its scale and soft-caps."""
    scale = cfg["attn_scale"]
    raw = {("hidden_activation" if k == "hidden_act" else k): v for k, v in raw.items()}
    return {**raw, "query_pre_attn_scalar": int(scale) if float(scale).is_integer() else scale,  # an int in HF's
            "attn_logit_softcapping": cfg["attn_softcap"] or None, "final_logit_softcapping": cfg["final_softcap"] or None}


def gguf_fields(m: GGUFMeta, fields: Fields, big_layers: int, window: int, pattern: int, local_base: float) -> Fields:
    """Gemma's fields from GGUF metadata: the 27B shape (`big_layers` layers) scales queries by
    dim / heads, the others by head_dim; with a window, the layers llama.cpp makes local (every
    `pattern`-th global unless the file says) and their RoPE base (`local_base` unless set)."""
    dim, heads = fields["dim"], fields["n_heads"]
    out = dict(embed_scale=dim ** 0.5,
               attn_scale=float(dim // heads if fields["n_layers"] == big_layers else fields["head_dim"]),
               attn_softcap=float(m.get("attn_logit_softcapping", 0.0, float)),
               final_softcap=float(m.get("final_logit_softcapping", 0.0, float)))
    if window:
        local = m.swa_layers(fields["n_layers"], pattern)
        base = float(m.get("rope.freq_base_swa", local_base, float))
        out.update(sliding_window=window, local_layers=local, rope_local_theta=base if local else 0.0)
    return out


def from_hf(raw: dict, fields: Fields) -> Fields:
    return {**hf_scales(raw, fields), **hf_local(raw, lambda: range(0, fields["n_layers"], 2))}  # even layers slide


def from_gguf(m: GGUFMeta, fields: Fields) -> Fields:
    window = int(m.get("attention.sliding_window", 0)) or 4096  # llama.cpp's default for Gemma 2
    return gguf_fields(m, fields, 46, window, 2, 0.0)  # local RoPE: the global one unless set


FAMILY = Family(
    name="gemma2", model_types=("gemma2",), hf_class="Gemma2ForCausalLM", gguf_arch="gemma2", features=GEMMA,
    from_hf=from_hf, to_hf=to_hf, from_gguf=from_gguf, hf_tensors=HF_TENSORS, gguf_tensors=GGUF_TENSORS,
    hf_defaults=HF_DEFAULTS, norm_offset=1.0,
    presets={"gemma2-2b": dict(  # Gemma 2 2B's config.json, its context cut to 8,192
        vocab_size=256000, dim=2304, n_layers=26, n_heads=8, n_kv_heads=4, head_dim=256, ffn_dim=9216,
        max_seq_len=8192, norm_eps=1e-6, tie_embeddings=True, embed_scale=2304 ** 0.5, attn_scale=256.0,
        attn_softcap=50.0, final_softcap=30.0, sliding_window=4096, local_layers=tuple(range(0, 26, 2)))})

FAMILIES = (FAMILY,)
