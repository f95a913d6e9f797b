"""Llama (2, 3.x; SmolLM2, TinyLlama) and Mistral: the layout every other family starts from.

- Llama: model_type `llama`, GGUF architecture `llama`. ModelConfig's defaults are Llama's, so it
  sets no feature. Llama 3.1/3.2's RoPE scaling ("llama3" in config.json; GGUF's rope_freqs
  tensor of per-frequency divisors) is read by the shared code. llama.cpp's converter permutes
  the q/k rows of each head into the interleaved RoPE layout for this architecture alone; the
  GGUF reader undoes it. A config.json sliding_window is ignored (Llama attends everything).
- Mistral: model_type `mistral`, written by llama.cpp as GGUF architecture `llama` (so a Mistral
  GGUF reads as Llama). Its sliding window caps max_seq_len: within the window attention is
  exact. Exported with the window off (sliding_window null), which is exact over that length.
"""

from __future__ import annotations

from dataclasses import replace

from tinyllm.families.family import GGUF_LAYER, HF_LAYER, Family, Fields, nothing, unchanged


def mistral_from_hf(raw: dict, fields: Fields) -> Fields:
    window = int(raw.get("sliding_window") or 0)
    return {"max_seq_len": min(fields["max_seq_len"], window)} if window else {}


def mistral_to_hf(cfg: Fields, raw: dict) -> dict:
    return {**raw, "sliding_window": None, "use_sliding_window": False}


LLAMA = Family(
    name="llama", model_types=("llama",), hf_class="LlamaForCausalLM", gguf_arch="llama", features={},
    from_hf=nothing, to_hf=unchanged, from_gguf=nothing, hf_tensors=HF_LAYER, gguf_tensors=GGUF_LAYER,
    gguf_permuted=True,
    presets={"llama3.2-1b": dict(  # Llama 3.2 1B's config.json, its context cut to 8,192
        vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, max_seq_len=8192,
        rope_theta=500000.0, tie_embeddings=True,
        rope_scaling={"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192})})

MISTRAL = replace(LLAMA, name="mistral", model_types=("mistral",), hf_class="MistralForCausalLM", gguf_arch="",
                  from_hf=mistral_from_hf, to_hf=mistral_to_hf, presets={})

FAMILIES = (LLAMA, MISTRAL)
