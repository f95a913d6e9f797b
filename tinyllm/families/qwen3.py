"""Qwen 3: model_type `qwen3`, GGUF architecture `qwen3`.

The Llama layout with an RMSNorm over each head of q and k before RoPE (q_norm, k_norm), no
biases, and a head width of its own (head_dim 128 where dim / heads is 64 for the 0.6B).
Refuses and exports the sliding window as Qwen 2 does.
"""

from __future__ import annotations

from tinyllm.families.family import GGUF_LAYER, GGUF_QK_NORM, HF_LAYER, HF_QK_NORM, Family, nothing
from tinyllm.families.qwen2 import refuse_sliding_window, window_off

FAMILY = Family(
    name="qwen3", model_types=("qwen3",), hf_class="Qwen3ForCausalLM", gguf_arch="qwen3",
    features=dict(qk_norm=True), from_hf=refuse_sliding_window, to_hf=window_off, from_gguf=nothing,
    hf_tensors={**HF_LAYER, **HF_QK_NORM}, gguf_tensors={**GGUF_LAYER, **GGUF_QK_NORM},
    presets={"qwen3-0.6b": dict(  # Qwen3-0.6B's config.json, its context cut to 8,192
        vocab_size=151936, dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, ffn_dim=3072,
        max_seq_len=8192, rope_theta=1e6, norm_eps=1e-6, tie_embeddings=True)})

FAMILIES = (FAMILY,)
