"""Hugging Face folders of the families tinyllm runs (tinyllm.families: each family's
config.json model_types, its own fields and tensor names): map their weights onto the one
`Transformer`, and take the tokenizer, BOS/EOS and chat template from the folder.

A folder holds config.json, model.safetensors (or model-0000i-of-0000n.safetensors shards
with model.safetensors.index.json), a tokenizer (tokenizer.model for sentencepiece, or
tokenizer.json, which needs the `tokenizers` extra), and usually tokenizer_config.json
(special tokens, the Jinja chat_template) or chat_template.jinja.

Contract:
- `hf_config(raw, where) -> ModelConfig` maps config.json: the family its model_type names
  (`tinyllm.families.by_model_type`; a multimodal config its text model's), then the fields every
  family shares: hidden_size, layers, heads, num_key_value_heads, head_dim, intermediate_size,
  RoPE (rope_parameters, or rope_theta and rope_scaling: linear, llama3, longrope;
  partial_rotary_factor), rms_norm_eps, max_position_embeddings, tie_word_embeddings,
  hidden_act, the local layers' RoPE base (rope_parameters' sliding_attention or
  rope_local_base_freq); then the family's features and its own fields (`Family.from_hf`:
  biases, q/k norms, Gemma's scales and soft-caps, sliding-window layers, ...). Norms a family
  stores as w - offset (Gemma's (1 + w)) get the offset added on load, so the model's norm is
  the plain one (llama.cpp's GGUF converter does the same). HF q/k weights already use the
  rotate-half layout, so no permutation. Phi-3's LongRoPE runs its short factors where a run's
  context is within the original one and its long factors past it (tinyllm.core.rope), so
  max_seq_len is the model's own.
- `hf_names(cfg)`: every Hugging Face tensor name -> tinyllm's, from the family's per-layer
  table; a fused tensor (Phi-3's qkv_proj, gate_up_proj) names its parts and their rows.
- The format's two functions (tinyllm.formats.model_format): `inspect(path, template=None) ->
  ModelSpec` validates config, every tensor's name, shape and dtype (safetensors headers),
  the tokenizer and the chat template without reading a weight; `tensors(spec, quant, dtype,
  progress)` reads the weights as stored (dense: tinyllm.formats.build decides each one's form and
  dtype in memory, so "int8" / "int4" quantize there, from fp32). `load_hf(path, device, dtype,
  template=None, quant="auto", group=32, progress=None) -> LoadedModel` runs both and builds
  (tinyllm.formats.model_format.load_model). The tokenizer is tokenizer.model when present (tokens that
  tokenizer.json or tokenizer_config.json add past its vocab are appended to it), else
  tokenizer.json; BOS/EOS are the tokenizer's (tokenizer_config.json names them for
  tokenizer.json, config.json's ids are the fallback). The chat template (`pick_template`):
  the built-in named by `template`; else the folder's Jinja template when it splits per
  message (jinja_template.py); else a built-in guessed from the template or the model name
  (with a warning when a Jinja template did not split); else chatml.
Refuses (ValueError/FileNotFoundError, one line): model types of no family, rope scaling other
than linear/llama3/longrope, MLP biases (and attention biases where the family has none),
activations other than silu and tanh-GELU, what a family refuses (Qwen's use_sliding_window),
quantized (GPTQ/AWQ/bitsandbytes) weights, .bin-only weights, a missing tokenizer.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from tinyllm.families import FAMILIES, MODEL_TYPES, Family, by_model_type
from tinyllm.families.family import HF_FIXED
from tinyllm.formats.load_policy import check_quant
from tinyllm.formats.model_files import read_safetensors_header, weight_files
from tinyllm.formats.model_format import LoadedModel, ModelSpec, Progress, Tensors, load_model, with_progress
from tinyllm.formats.quant_rule import DEFAULT
from tinyllm.formats.tensor_checks import check_tensors, check_vocab, expected_shapes, part_rows
from tinyllm.model import ModelConfig
from tinyllm.text.jinja_template import pick_template
from tinyllm.text.sp_proto import sentencepiece_piece
from tinyllm.text.tokenizer import Tokenizer

__all__ = ["hf_config", "hf_names", "inspect", "load_hf", "tensors"]

_HINT = "a Hugging Face folder holds config.json, model.safetensors (or shards) and a tokenizer"
ACTS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
HF_DEFAULTS = {"hidden_act": "silu", "tie_word_embeddings": False}  # transformers' Llama; a family's own win


def hf_config(raw: dict, where: str = "config.json") -> ModelConfig:
    """config.json -> ModelConfig: the fields every family shares, then the family's own
    (tinyllm.families)."""
    family = by_model_type(raw.get("model_type"))
    if family is None:
        raise ValueError(f"{where}: model_type {raw.get('model_type')!r} is not supported "
                         f"(tinyllm reads {', '.join(MODEL_TYPES)})")
    raw = family.hf_text_config(raw)
    if raw.get("quantization_config"):
        q = raw["quantization_config"]
        method = q.get("quant_method", "?") if isinstance(q, dict) else str(q)[:40]
        raise ValueError(f"{where}: quantized weights ({method}) are not supported; "
                         "use an fp16/bf16/fp32 model")
    defaults = {**HF_DEFAULTS, **family.hf_defaults}
    act = raw.get("hidden_activation") or raw.get("hidden_act") or defaults["hidden_act"]
    if act not in ACTS:
        raise ValueError(f"{where}: hidden_act {act!r} is not supported (silu or gelu_pytorch_tanh)")
    if raw.get("mlp_bias"):
        raise ValueError(f"{where}: mlp_bias=true is not supported (tinyllm's FFN has no biases)")
    if raw.get("attention_bias") and not family.features.get("qkv_bias"):
        raise ValueError(f"{where}: attention_bias=true is not supported for {raw['model_type']}")
    try:
        dim, heads, n_layers = int(raw["hidden_size"]), int(raw["num_attention_heads"]), int(raw["num_hidden_layers"])
        head_dim = int(raw.get("head_dim") or dim // heads)
        max_len = int(raw.get("max_position_embeddings", 2048))
        global_rope, local_rope = _rope_parameters(raw, where)
        theta = float(global_rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
        scaling = _rope_scaling(global_rope, raw, max_len, where)
        rotary = int(head_dim * float(global_rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))))
        shared = dict(
            vocab_size=int(raw["vocab_size"]), dim=dim, n_layers=n_layers, n_heads=heads,
            n_kv_heads=int(raw.get("num_key_value_heads") or heads), ffn_dim=int(raw["intermediate_size"]),
            max_seq_len=max_len, rope_theta=theta, norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", defaults["tie_word_embeddings"])),
            family=family.name, head_dim=head_dim, act=ACTS[act], rope_scaling=scaling, rotary_dim=rotary)
        cfg = {**family.features, **shared, **family.from_hf(raw, shared)}
        if cfg.get("local_layers") and local_rope is not None:
            cfg["rope_local_theta"] = float(local_rope.get("rope_theta", 10000.0))
        elif cfg.get("local_layers") and raw.get("rope_local_base_freq"):
            cfg["rope_local_theta"] = float(raw["rope_local_base_freq"])
        return ModelConfig(**cfg)
    except KeyError as e:
        raise ValueError(f"{where} lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _rope_parameters(raw: dict, where: str) -> tuple[dict, dict | None]:
    """(the global layers' RoPE parameters, the local layers' or None): transformers 5 writes
    `rope_parameters` (per layer type for Gemma 3), older files `rope_theta` and `rope_scaling`."""
    rope = raw.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"rope_parameters should be an object, not {str(rope)[:40]!r}")
    if "full_attention" in rope:
        return rope["full_attention"] or {}, rope.get("sliding_attention")
    scaling = raw.get("rope_scaling")
    if not isinstance(scaling, dict):
        return rope, None
    return {**rope, **scaling, "rope_type": scaling.get("rope_type", scaling.get("type"))}, None


def _rope_scaling(rope: dict, raw: dict, max_len: int, where: str) -> dict | None:
    """tinyllm's rope_scaling (tinyllm.core.rope) from Hugging Face's parameters, or None."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(rope["factor"])}
    if kind == "llama3":
        return {"type": "llama3", "factor": float(rope["factor"]), "low_freq_factor": float(rope["low_freq_factor"]),
                "high_freq_factor": float(rope["high_freq_factor"]),
                "original_max_position_embeddings": int(rope["original_max_position_embeddings"])}
    if kind == "longrope":
        old = int(rope.get("original_max_position_embeddings") or raw["original_max_position_embeddings"])
        return {"type": "longrope", "short_factor": [float(f) for f in rope["short_factor"]],
                "long_factor": [float(f) for f in rope["long_factor"]], "original_max_position_embeddings": old,
                "factor": float(rope.get("factor") or max_len / old),
                "attention_factor": rope.get("attention_factor")}
    raise ValueError(f"rope scaling {kind!r} is not supported (tinyllm runs linear, llama3 and longrope)")


# tinyllm's tensors split out of one Hugging Face tensor (Phi-3's fused projections), by rows
Split = tuple[tuple[str, int], ...]


def hf_names(cfg: ModelConfig) -> dict[str, str | Split]:
    """Hugging Face tensor name -> tinyllm name (or the names and rows of its parts): the
    family's per-layer table (tinyllm.families) for every layer."""
    table, rows = family_of(cfg).hf_tensors, part_rows(cfg)
    names: dict[str, str | Split] = dict(HF_FIXED)
    for i in range(cfg.n_layers):
        h, t = f"model.layers.{i}.", f"blocks.{i}."
        for hf, tl in table.items():
            names[h + hf] = tuple((t + p, rows[p]) for p in tl) if isinstance(tl, tuple) else t + tl
    return names


def family_of(cfg: ModelConfig) -> Family:
    """The record of cfg's family (a tinyllm checkpoint may name one tinyllm has no record of)."""
    if cfg.family not in FAMILIES:
        raise ValueError(f"a {cfg.family!r} model has no Hugging Face form here "
                         f"(the export writes {', '.join(FAMILIES)})")
    return FAMILIES[cfg.family]


def _strip_prefix(name: str) -> str | None:
    """A multimodal model's text tensors under the text model's own names; None for the rest."""
    for head in ("model.language_model.", "language_model.model."):
        if name.startswith(head):
            return "model." + name[len(head):]
    if name.startswith("language_model.lm_head."):
        return name[len("language_model."):]
    if name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                        "model.multi_modal_projector.")):
        return None
    return name


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        out = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    return out if isinstance(out, dict) else {}


def inspect(path: str | Path, template: str | None = None) -> ModelSpec:
    """Validate a folder without reading a weight: config, every tensor's name, shape and
    dtype (safetensors headers), tokenizer, chat template. The spec's source: {file: {hf name:
    tinyllm name}}."""
    path = Path(path).expanduser()
    raw = _read_json(path / "config.json")
    if not raw:
        raise FileNotFoundError(f"{path} has no config.json: {_HINT}")
    cfg = hf_config(raw, str(path / "config.json"))
    files = weight_files(path, _HINT)
    where: dict[str, Path] = {}
    stored: dict[str, str] = {}  # the name as Hugging Face's text model has it -> the name in the file
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        for k, t in read_safetensors_header(f).items():
            name = _strip_prefix(k)
            if name is None:
                continue  # a multimodal model's vision tower: not read
            if t["dtype"] not in ("F32", "F16", "BF16"):
                raise ValueError(f"{f}: tensor {k} has dtype {t['dtype']}; tinyllm reads F32, F16 and BF16")
            where[name], shapes[name], stored[name] = f, tuple(t["shape"]), k
    names = hf_names(cfg)
    if not cfg.tie_embeddings and "lm_head.weight" not in where:
        cfg.tie_embeddings = True  # no output matrix stored: the embeddings serve (as transformers ties)
    want = expected_shapes(cfg)
    unknown = sorted(k for k in where if k not in names and not k.endswith("rotary_emb.inv_freq"))
    found: dict[str, str] = {}  # tinyllm name -> Hugging Face name
    wrong = []
    for k in where:
        target = names.get(k)
        if isinstance(target, tuple):  # a fused tensor: its parts' rows, stacked
            parts = [(tl, rows) for tl, rows in target if tl in want]
            need = (sum(want[tl][0] for tl, _ in parts), *want[parts[0][0]][1:])
            if shapes[k] != need:
                wrong.append(f"{k} {shapes[k]} vs {need}")
            found.update({tl: k for tl, _ in parts})
        elif target in want:
            found[target] = k
            if shapes[k] != want[target]:
                wrong.append(f"{target} {shapes[k]} vs {want[target]}")
    missing = sorted(set(want) - set(found))
    check_tensors(f"{path}: config.json does not match the weights", missing, unknown, wrong)
    tokenizer = load_hf_tokenizer(path, raw)
    check_vocab(path, tokenizer.vocab_size, cfg.vocab_size)
    tok_cfg = _read_json(path / "tokenizer_config.json")
    name = raw.get("_name_or_path") or path.name
    source = _jinja_source(path, tok_cfg)
    chat = pick_template(source, tokenizer, _add_bos(tokenizer, tok_cfg), template, f"{name} ({cfg.family})")
    plan: dict[Path, dict[str, str | Split]] = {}
    for hf in set(found.values()):
        plan.setdefault(where[hf], {})[stored[hf]] = names[hf]
    return ModelSpec(path, cfg, tokenizer, chat, name, frozenset(), source=plan)


def tensors(spec: ModelSpec, quant: str, dtype: torch.dtype, progress: Progress | None = None) -> Tensors:
    """Every weight as stored, under tinyllm's names (`quant` and `dtype` change nothing here)."""
    plan: dict[Path, dict[str, str | Split]] = spec.source
    offset = FAMILIES[spec.config.family].norm_offset
    state: Tensors = {}
    with ExitStack() as files:
        opened = {f: files.enter_context(safe_open(str(f), framework="pt")) for f in plan}
        reads = [(opened[f], hf, tl) for f, names in plan.items() for hf, tl in names.items()]
        for st, hf, tl in with_progress(reads, progress):
            t = st.get_tensor(hf)
            if isinstance(tl, tuple):  # a fused tensor (Phi-3's projections), split by rows
                state.update({name: part for (name, _), part in zip(tl, t.split([r for _, r in tl]), strict=True)})
            elif offset and tl.endswith("norm.weight"):
                state[tl] = t.float() + offset  # Gemma's norms scale by (1 + w): held as the plain norm's w
            else:
                state[tl] = t
    return state


def load_hf(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
            template: str | None = None, quant: str = DEFAULT, group: int = 32,
            progress: Progress | None = None) -> LoadedModel:
    """Inspect, then load (tinyllm.formats.model_format.load_model); the name is the folder's own."""
    check_quant(quant, group)  # before the path: a bad option is named first
    with inspect(path, template) as spec:
        model = load_model(spec, tensors, device, dtype, quant, group, progress)
    return LoadedModel(model, spec.tokenizer, spec.template, spec.name)


def _jinja_source(path: Path, tok_cfg: dict) -> str | None:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    src = tok_cfg.get("chat_template") or _read_json(path / "chat_template.json").get("chat_template")
    if isinstance(src, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        src = next((t.get("template") for t in src if t.get("name") == "default"), None)
    return src if isinstance(src, str) else None


def _add_bos(tokenizer, tok_cfg: dict) -> bool:
    if "add_bos_token" in tok_cfg:
        return bool(tok_cfg["add_bos_token"])
    if isinstance(tokenizer, Tokenizer):
        return True  # LlamaTokenizer's default
    return tokenizer.adds_bos()


def load_hf_tokenizer(path: Path, raw: dict | None = None):
    """tokenizer.model (sentencepiece; added tokens appended) or tokenizer.json (BPETokenizer)."""
    tok_cfg = _read_json(path / "tokenizer_config.json")
    if (path / "tokenizer.model").is_file():
        return _sentencepiece_with_added(path, tok_cfg)
    if (path / "tokenizer.json").is_file():
        from tinyllm.text.bpe_tokenizer import BPETokenizer

        tok = BPETokenizer.load(path)
        if tok.bos_id is None and tok.eos_id is None and raw:  # no names: fall back to config.json ids
            ids = [raw.get("bos_token_id"), raw.get("eos_token_id")]
            ids = [i[0] if isinstance(i, list) and i else i for i in ids]
            tok = BPETokenizer(tok._tok, ids[0], ids[1], tok.pad_id)
        return tok
    raise FileNotFoundError(f"{path} has no tokenizer (tokenizer.model or tokenizer.json): {_HINT}")


def _sentencepiece_with_added(path: Path, tok_cfg: dict) -> Tokenizer:
    """tokenizer.model, plus the tokens tokenizer_config.json / tokenizer.json add past its
    vocab (e.g. "<|im_start|>" at 32000) as user-defined pieces, so they encode as one id."""
    tok = Tokenizer.load(path / "tokenizer.model")
    added: dict[int, str] = {}
    for i, t in (tok_cfg.get("added_tokens_decoder") or {}).items():
        added[int(i)] = t.get("content") if isinstance(t, dict) else t
    for t in _read_json(path / "tokenizer.json").get("added_tokens") or []:
        added.setdefault(int(t["id"]), t["content"])
    extra = sorted(i for i in added if i >= tok.vocab_size)
    if not extra:
        return tok
    if extra != list(range(tok.vocab_size, tok.vocab_size + len(extra))):
        raise ValueError(f"{path}: added tokens {extra[:3]}... do not follow the sentencepiece vocab "
                         f"({tok.vocab_size} pieces)")
    data = tok.serialized() + b"".join(sentencepiece_piece(added[i], 0.0, 4) for i in extra)
    return Tokenizer.from_serialized(data)
