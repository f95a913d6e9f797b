"""The record that describes one model family, and the tensor names most families share.

Contract:
- `Family`: everything tinyllm knows about a family, as data plus three small functions that
  map its configuration (Hugging Face config.json in, config.json out, GGUF metadata in). The
  readers (tinyllm.formats.hf, gguf_arch, hf_export) do everything the families share and ask
  the record for the rest; they never test a family's name.
- A config mapping works on plain dicts of `tinyllm.model.ModelConfig` fields (this package
  sits below the model and imports neither it nor torch: the UI process reads the registry).
- Tensor names are per layer: Hugging Face's after `model.layers.{i}.`, llama.cpp's between
  `blk.{i}.` and `.weight` / `.bias`, tinyllm's after `blocks.{i}.`. A tuple of tinyllm names is
  one stored tensor that holds several of tinyllm's matrices, their rows stacked in that order
  (Phi-3's fused projections); the reader takes each part's rows from the config.
- `HF_FIXED`, `GGUF_FIXED`: the tensors outside the layers, the same for every family.
- `HF_LAYER`, `GGUF_LAYER`: the per-layer names of the Llama layout most families share.
- `hf_local(raw, default)`: the sliding-window fields config.json describes (layer_types, or the
  family's default pattern).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

Fields = dict[str, Any]  # ModelConfig's fields by name (tinyllm.model.ModelConfig.to_dict())
Names = dict[str, str | tuple[str, ...]]  # a stored tensor's name -> tinyllm's (or its parts')


class GGUFMeta(Protocol):
    """What a family's `from_gguf` reads of a file (tinyllm.formats.gguf_arch gives it)."""

    def get(self, key: str, default: Any = None, kind: type = int) -> Any:
        """`<arch>.<key>` checked to be of `kind`; absent: `default`, or a ValueError where that is None."""

    def swa_layers(self, n_layers: int, pattern: int) -> tuple[int, ...]:
        """llama.cpp's sliding-window layers: attention.sliding_window_pattern (flags, or n: every
        n-th layer global), else `pattern`."""


def as_is(raw: dict) -> dict:
    """A config.json that is its text model's already (hf_text_config of most families)."""
    return raw


def nothing(source: object, fields: Fields) -> Fields:
    """No fields of the family's own (from_hf, from_gguf of a family its features describe)."""
    return {}


def unchanged(cfg: Fields, raw: dict) -> dict:
    """The shared config.json as it is (to_hf of a family that writes nothing of its own)."""
    return raw


@dataclass(frozen=True)
class Family:
    name: str  # ModelConfig.family: what the user sees; a checkpoint's family names its record
    model_types: tuple[str, ...]  # config.json model_types read as this family; the first is the one written
    hf_class: str  # the transformers class an exported config.json names ("LlamaForCausalLM")
    gguf_arch: str  # llama.cpp's general.architecture; "": llama.cpp writes the family as another's
    features: Fields  # the ModelConfig fields the family always sets (a config.json's own act wins)
    from_hf: Callable[[dict, Fields], Fields]  # (config.json, the shared fields) -> the fields the family sets
    to_hf: Callable[[Fields, dict], dict]  # (ModelConfig fields, the shared config.json) -> the family's config.json
    from_gguf: Callable[[GGUFMeta, Fields], Fields]  # (the file's <arch>.* metadata, the shared fields) -> its fields
    hf_tensors: Names  # Hugging Face per-layer tensor name -> tinyllm's
    gguf_tensors: Names  # llama.cpp per-layer tensor name -> tinyllm's; a fused one holds the parts the
    # layer does not store under their own names (Phi-3's ffn_up: gate and up rows, unless ffn_gate is there)
    presets: dict[str, Fields]  # named shapes (tinyllm.model.PRESETS); the family and its features are added
    hf_defaults: dict[str, Any] = field(default_factory=dict)  # config.json values the family's files may leave out
    hf_text_config: Callable[[dict], dict] = as_is  # config.json -> its text model's (a multimodal model's)
    gguf_permuted: bool = False  # llama.cpp's converter permuted q/k rows into interleaved RoPE (undone on load)
    gguf_longrope: bool = False  # rope_factors_short/long tensors are its LongRoPE (Phi-3); others' are ignored
    norm_offset: float = 0.0  # stored norm weights are w - offset (Gemma's scale by 1 + w): added on load


HF_FIXED = {"model.embed_tokens.weight": "tok_emb.weight", "model.norm.weight": "norm.weight",
            "lm_head.weight": "lm_head.weight"}
GGUF_FIXED = {"token_embd.weight": "tok_emb.weight", "output_norm.weight": "norm.weight",
              "output.weight": "lm_head.weight"}

HF_LAYER: Names = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn.wq.weight",
    "self_attn.k_proj.weight": "attn.wk.weight", "self_attn.v_proj.weight": "attn.wv.weight",
    "self_attn.o_proj.weight": "attn.wo.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn.w1.weight", "mlp.up_proj.weight": "ffn.w3.weight",
    "mlp.down_proj.weight": "ffn.w2.weight"}
HF_QKV_BIAS: Names = {f"self_attn.{p}_proj.bias": f"attn.w{p}.bias" for p in "qkv"}
HF_QK_NORM: Names = {"self_attn.q_norm.weight": "attn.q_norm.weight", "self_attn.k_norm.weight": "attn.k_norm.weight"}

# llama.cpp's names (its LLM_TENSOR_NAMES); `.weight` or `.bias` follows each. Every family may
# store q, k and v as one attn_qkv.
GGUF_LAYER: Names = {
    "attn_norm": "attn_norm", "attn_q": "attn.wq", "attn_k": "attn.wk", "attn_v": "attn.wv",
    "attn_qkv": ("attn.wq", "attn.wk", "attn.wv"), "attn_output": "attn.wo", "ffn_norm": "ffn_norm",
    "ffn_gate": "ffn.w1", "ffn_up": "ffn.w3", "ffn_down": "ffn.w2"}
GGUF_QK_NORM: Names = {"attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm"}


def hf_local(raw: dict, default: Callable[[], Iterable[int]]) -> Fields:
    """sliding_window and local_layers from config.json: the layers `layer_types` marks
    "sliding_attention", else the family's `default()`; none without a window."""
    window = int(raw.get("sliding_window") or 0)
    if not window:
        return dict(sliding_window=0, local_layers=())
    types = raw.get("layer_types")
    local = tuple(i for i, t in enumerate(types) if t == "sliding_attention") if types else tuple(default())
    return dict(sliding_window=window if local else 0, local_layers=local)
