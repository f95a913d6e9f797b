"""IBM Granite (3.0 - 3.3, dense): model_type `granite`, GGUF architecture `granite`.

The Llama layout with four multipliers (transformers' GraniteConfig; llama.cpp's
granite.*_scale keys, written by its converter from the same four):
- embedding_multiplier -> embed_scale (llama.cpp: embedding_scale);
- attention_multiplier: the query scale itself, where Llama's is head_dim ** -0.5 (llama.cpp:
  attention.scale); ModelConfig.attn_scale holds the scalar whose ** -0.5 is the scale (Gemma's
  query_pre_attn_scalar), so it is held as multiplier ** -2 (2 ** 12 for 0.015625, exact), which
  exports back to the multiplier (an attn_scale set by hand may not: the export refuses it);
- residual_multiplier -> residual_scale: each half's output times it before the skip
  connection (llama.cpp: residual_scale);
- logits_scaling -> logit_divisor: the logits divided by it (llama.cpp: logit_scale).
llama.cpp's converter permutes q/k rows as for Llama (its GraniteModel is a LlamaModel; the
architecture runs the interleaved RoPE) and drops config.json's head_dim. Biases
(attention_bias, which is on o_proj too, and mlp_bias) are refused by the shared reader; a
GGUF with RoPE switched off (rope.scaling.finetuned false: the hybrid models' layers) too.
"""

from __future__ import annotations

from tinyllm.families.family import GGUF_LAYER, HF_LAYER, Family, Fields, GGUFMeta


def scales(fields: Fields, embedding: float, attention: float, residual: float, logits: float) -> Fields:
    """ModelConfig's fields from Granite's four multipliers (0: the neutral value). An attention
    multiplier of head_dim ** -0.5 is held as Llama's (attn_scale 0), so that it exports as itself."""
    if attention < 0:
        raise ValueError(f"attention multiplier {attention} must not be negative")
    llama = not attention or attention == fields["head_dim"] ** -0.5
    return dict(embed_scale=float(embedding or 1.0), attn_scale=0.0 if llama else float(attention) ** -2,
                residual_scale=float(residual or 1.0), logit_divisor=float(logits or 1.0))


def from_hf(raw: dict, fields: Fields) -> Fields:
    # GraniteConfig's defaults are 1.0 each (an attention multiplier of 1.0 is a scale of 1, not Llama's)
    return scales(fields, *(float(raw.get(k, 1.0)) for k in ("embedding_multiplier", "attention_multiplier",
                                                             "residual_multiplier", "logits_scaling")))


def to_hf(cfg: Fields, raw: dict) -> dict:
    attn = cfg["attn_scale"] ** -0.5 if cfg["attn_scale"] else cfg["head_dim"] ** -0.5
    return {**raw, "embedding_multiplier": cfg["embed_scale"], "attention_multiplier": attn,
            "residual_multiplier": cfg["residual_scale"], "logits_scaling": cfg["logit_divisor"]}


def from_gguf(m: GGUFMeta, fields: Fields) -> Fields:
    if not m.get("rope.scaling.finetuned", True, bool):
        raise ValueError("granite layers without RoPE (rope.scaling.finetuned false) are not supported")
    # llama.cpp reads each as 0 (off) where the file has none; its attention.scale 0 is head_dim ** -0.5
    return scales(fields, *(float(m.get(k, 0.0, float)) for k in ("embedding_scale", "attention.scale",
                                                                   "residual_scale", "logit_scale")))


FAMILY = Family(
    name="granite", model_types=("granite",), hf_class="GraniteForCausalLM", gguf_arch="granite", features={},
    from_hf=from_hf, to_hf=to_hf, from_gguf=from_gguf, hf_tensors=HF_LAYER, gguf_tensors=GGUF_LAYER,
    gguf_permuted=True,
    presets={"granite3.3-2b": dict(  # Granite 3.3 2B's config.json, its context cut to 8,192
        vocab_size=49159, dim=2048, n_layers=40, n_heads=32, n_kv_heads=8, ffn_dim=8192, max_seq_len=8192,
        rope_theta=1e7, tie_embeddings=True, embed_scale=12.0, attn_scale=4096.0, residual_scale=0.22,
        logit_divisor=8.0)})

FAMILIES = (FAMILY,)
