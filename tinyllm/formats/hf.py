"""Hugging Face Llama-family folders (config.json model_type "llama" or "mistral"): map their
weights onto `Transformer`, and take the tokenizer, BOS/EOS and chat template from the folder.

A folder holds config.json, model.safetensors (or model-0000i-of-0000n.safetensors shards
with model.safetensors.index.json), a tokenizer (tokenizer.model for sentencepiece, or
tokenizer.json, which needs the `tokenizers` extra), and usually tokenizer_config.json
(special tokens, the Jinja chat_template) or chat_template.jinja.

Contract:
- `hf_config(raw, where) -> ModelConfig` maps config.json: hidden_size, layers, heads,
  num_key_value_heads, intermediate_size, rope_theta (or rope_parameters["rope_theta"]),
  rms_norm_eps, max_position_embeddings, tie_word_embeddings. HF Llama q/k weights already
  use the rotate-half layout, so no permutation. Mistral's sliding window caps max_seq_len
  (within the window attention is exact).
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
Refuses (ValueError/FileNotFoundError, one line): other model types, a head_dim that is not
hidden_size / heads, rope scaling, attention/MLP biases, activations other than silu,
quantized (GPTQ/AWQ/bitsandbytes) weights, .bin-only weights, a missing tokenizer.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from tinyllm.formats.load_policy import check_quant
from tinyllm.formats.model_files import read_safetensors_header, weight_files
from tinyllm.formats.model_format import LoadedModel, ModelSpec, Progress, Tensors, load_model, with_progress
from tinyllm.formats.quant_rule import DEFAULT
from tinyllm.formats.tensor_checks import check_tensors, check_vocab, expected_shapes
from tinyllm.model import ModelConfig
from tinyllm.text.jinja_template import pick_template
from tinyllm.text.sp_proto import sentencepiece_piece
from tinyllm.text.tokenizer import Tokenizer

__all__ = ["hf_config", "inspect", "load_hf", "tensors"]

SUPPORTED = ("llama", "mistral")
_HINT = "a Hugging Face folder holds config.json, model.safetensors (or shards) and a tokenizer"


def hf_config(raw: dict, where: str = "config.json") -> ModelConfig:
    mt = raw.get("model_type")
    if mt not in SUPPORTED:
        raise ValueError(f"{where}: model_type {mt!r} is not supported "
                         f"(tinyllm reads {', '.join(SUPPORTED)})")
    if raw.get("quantization_config"):
        q = raw["quantization_config"]
        method = q.get("quant_method", "?") if isinstance(q, dict) else str(q)[:40]
        raise ValueError(f"{where}: quantized weights ({method}) are not supported; "
                         "use an fp16/bf16/fp32 model")
    act = raw.get("hidden_act", raw.get("hidden_activation", "silu"))
    if act != "silu":
        raise ValueError(f"{where}: hidden_act {act!r} is not supported (only silu)")
    for bias in ("attention_bias", "mlp_bias"):
        if raw.get(bias):
            raise ValueError(f"{where}: {bias}=true is not supported (tinyllm's layers have no biases)")
    rope = raw.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"{where}: rope_parameters should be an object, not {str(rope)[:40]!r}")
    scaling = raw.get("rope_scaling") or rope
    kind = scaling.get("rope_type", scaling.get("type", "default")) if isinstance(scaling, dict) else scaling
    if kind not in (None, "default"):
        raise ValueError(f"{where}: rope scaling {kind!r} is not supported (only plain RoPE)")
    try:
        dim, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        head_dim = raw.get("head_dim")
        if head_dim is not None and int(head_dim) != dim // heads:
            raise ValueError(f"{where}: head_dim {head_dim} is not hidden_size / num_attention_heads "
                             f"({dim} / {heads}); tinyllm does not support that")
        max_len = int(raw.get("max_position_embeddings", 2048))
        if mt == "mistral" and raw.get("sliding_window"):
            max_len = min(max_len, int(raw["sliding_window"]))
        return ModelConfig(
            vocab_size=int(raw["vocab_size"]), dim=dim, n_layers=int(raw["num_hidden_layers"]), n_heads=heads,
            n_kv_heads=int(raw.get("num_key_value_heads") or heads), ffn_dim=int(raw["intermediate_size"]),
            max_seq_len=max_len, rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
            norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)))
    except KeyError as e:
        raise ValueError(f"{where} lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        if "tinyllm" in str(e):
            raise
        raise ValueError(f"{where}: {e}") from None


def _hf_names(cfg: ModelConfig) -> dict[str, str]:
    """Hugging Face tensor name -> tinyllm name."""
    names = {"model.embed_tokens.weight": "tok_emb.weight", "model.norm.weight": "norm.weight",
             "lm_head.weight": "lm_head.weight"}
    for i in range(cfg.n_layers):
        h, t = f"model.layers.{i}.", f"blocks.{i}."
        names.update({h + "input_layernorm.weight": t + "attn_norm.weight",
                      h + "post_attention_layernorm.weight": t + "ffn_norm.weight",
                      h + "self_attn.q_proj.weight": t + "attn.wq.weight",
                      h + "self_attn.k_proj.weight": t + "attn.wk.weight",
                      h + "self_attn.v_proj.weight": t + "attn.wv.weight",
                      h + "self_attn.o_proj.weight": t + "attn.wo.weight",
                      h + "mlp.gate_proj.weight": t + "ffn.w1.weight",
                      h + "mlp.up_proj.weight": t + "ffn.w3.weight",
                      h + "mlp.down_proj.weight": t + "ffn.w2.weight"})
    return names


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
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        for k, t in read_safetensors_header(f).items():
            if t["dtype"] not in ("F32", "F16", "BF16"):
                raise ValueError(f"{f}: tensor {k} has dtype {t['dtype']}; tinyllm reads F32, F16 and BF16")
            where[k], shapes[k] = f, tuple(t["shape"])
    names = _hf_names(cfg)
    if not cfg.tie_embeddings and "lm_head.weight" not in where:
        cfg.tie_embeddings = True  # no output matrix stored: the embeddings serve (as transformers ties)
    want = expected_shapes(cfg)
    unknown = sorted(k for k in where if k not in names and not k.endswith("rotary_emb.inv_freq"))
    found = {names[k]: k for k in where if k in names and names[k] in want}
    missing = sorted(set(want) - set(found))
    wrong = [f"{found[k]} {shapes[found[k]]} vs {want[k]}" for k in found if shapes[found[k]] != want[k]]
    check_tensors(f"{path}: config.json does not match the weights", missing, unknown, wrong)
    tokenizer = load_hf_tokenizer(path, raw)
    check_vocab(path, tokenizer.vocab_size, cfg.vocab_size)
    tok_cfg = _read_json(path / "tokenizer_config.json")
    name = raw.get("_name_or_path") or path.name
    source = _jinja_source(path, tok_cfg)
    chat = pick_template(source, tokenizer, _add_bos(tokenizer, tok_cfg), template, name)
    plan: dict[Path, dict[str, str]] = {}
    for tl, hf in found.items():
        plan.setdefault(where[hf], {})[hf] = tl
    return ModelSpec(path, cfg, tokenizer, chat, name, frozenset(), source=plan)


def tensors(spec: ModelSpec, quant: str, dtype: torch.dtype, progress: Progress | None = None) -> Tensors:
    """Every weight as stored, under tinyllm's names (`quant` and `dtype` change nothing here)."""
    plan: dict[Path, dict[str, str]] = spec.source
    state: Tensors = {}
    with ExitStack() as files:
        opened = {f: files.enter_context(safe_open(str(f), framework="pt")) for f in plan}
        reads = [(opened[f], hf, tl) for f, names in plan.items() for hf, tl in names.items()]
        for st, hf, tl in with_progress(reads, progress):
            state[tl] = st.get_tensor(hf)
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
