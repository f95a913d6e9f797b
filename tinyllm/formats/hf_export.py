"""tinyllm convert SRC DST --to hf: a Hugging Face folder from any model tinyllm opens, for
transformers and the engines that read its folders (vLLM, SGLang).

Contract: `export_hf(src, dst, dtype="auto", template=None, shard_mb=2048, force=False,
say=None) -> Path` writes into DST:
- config.json: the model's family as its Hugging Face model_type and class (`hf_config_json`:
  the fields every family shares, then the family's own, `Family.to_hf` of tinyllm.families:
  tinyllm.formats.hf's mapping run backwards), with bos/eos ids and torch_dtype. It is checked by mapping it forwards again
  (tinyllm.formats.hf.hf_config): a config that does not come back as the model's own (a
  family with a part its Hugging Face class lacks) is refused, never written approximately.
- model.safetensors (or model-0000i-of-0000n shards of at most `shard_mb` MiB with
  model.safetensors.index.json): every weight dense under Hugging Face's names, in `dtype`
  ("auto": the source's dense dtype, bf16 where its matrices are quantized; fp32, fp16, bf16).
  Quantized matrices (a tinyllm folder's int8 / int4, a GGUF's blocks) are dequantized
  (`say` tells how many); norms a family stores offset go back to that form (Gemma's (1 + w));
  fused tensors (Phi-3's q/k/v and gate/up) are fused again; with tied embeddings no lm_head is stored.
- The tokenizer: a sentencepiece model as tokenizer.model plus tokenizer.json
  (tinyllm.text.sp_to_hf), a tokenizer.json tokenizer as its own tokenizer.json; and
  tokenizer_config.json: tokenizer_class PreTrainedTokenizerFast (transformers 4 and 5 both
  load tokenizer.json exactly as written; v5's LlamaTokenizer rebuilds it with a prefix space
  the model never saw), the bos/eos/unk/pad tokens, and the chat template
  (tinyllm.text.jinja_template.jinja_source: `apply_chat_template(messages,
  add_generation_prompt=True)` gives the ids tinyllm's Conversation feeds).
- generation_config.json: bos, and as eos every id that ends a reply (EOS and the template's
  stop pieces, "<|im_end|>"), so an engine stops where tinyllm's chat does.
`hf_tensors(cfg, state, dtype)`: tinyllm-named tensors (dense or QTensor) as the dense HF-named ones.
Refuses (ValueError / FileNotFoundError, one line; the CLI prints it and exits 2): a SRC that
is not a model, a non-empty DST without `force`, SRC == DST, a family or shape with no
Hugging Face form, a tokenizer sp_to_hf cannot write.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from tinyllm.core.quant import QTensor
from tinyllm.formats.checkpoint import split_shards
from tinyllm.formats.hf import family_of, hf_config, hf_names
from tinyllm.formats.model_files import INDEX, WEIGHTS, classify
from tinyllm.formats.open_model import format_of
from tinyllm.model import ModelConfig
from tinyllm.text.chat_template import ChatTemplate
from tinyllm.text.jinja_template import jinja_source
from tinyllm.text.sp_to_hf import hf_tokenizer_json
from tinyllm.text.tokenizer import Tokenizer

__all__ = ["export_hf", "hf_config_json", "hf_tensors"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_HF_DTYPE = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def export_hf(src: str | Path, dst: str | Path, dtype: str = "auto", template: str | None = None,
              shard_mb: float = 2048, force: bool = False, say: Callable[[str], None] | None = None) -> Path:
    """Write DST as a Hugging Face folder of the model at SRC (the module docstring)."""
    say = say or (lambda line: None)
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"--dtype must be auto, {', '.join(DTYPES)}; got {dtype!r}")
    if dst.resolve() == src.resolve():
        raise ValueError("SRC and DST are the same path")
    if dst.is_file() or (dst.is_dir() and any(dst.iterdir()) and not force):
        raise ValueError(f"{dst} exists and is not empty; pick another DST or pass --force")
    kind, path = classify(src)
    fmt = format_of(kind)
    with fmt.inspect(path, template) as spec:
        config = hf_config_json(spec.config, spec.tokenizer)  # refuses before a weight is read
        state = fmt.tensors(spec, "none", torch.float32)
    quantized = sorted(k for k, v in state.items() if isinstance(v, QTensor))
    out_dtype = DTYPES[dtype] if dtype != "auto" else _auto_dtype(state)
    if quantized:
        forms = ", ".join(sorted({state[k].kind for k in quantized}))
        say(f"dequantized {len(quantized)} {forms} matrices to dense {_HF_DTYPE[out_dtype]}")
    weights = hf_tensors(spec.config, state, out_dtype)
    config["torch_dtype"] = _HF_DTYPE[out_dtype]
    dst.mkdir(parents=True, exist_ok=True)
    for old in [*dst.glob("model*.safetensors"), dst / INDEX]:
        old.unlink(missing_ok=True)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _save_weights(weights, dst, shard_mb)
    _save_tokenizer(spec.tokenizer, spec.template, spec.config, dst)
    generation = {"bos_token_id": spec.tokenizer.bos_id, "eos_token_id": _stop_ids(spec.tokenizer, spec.template)}
    (dst / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return dst


def hf_config_json(cfg: ModelConfig, tokenizer) -> dict:
    """config.json for `cfg` in its family's Hugging Face form, checked by mapping it back."""
    family = family_of(cfg)
    fields = cfg.to_dict()
    raw: dict = {
        "architectures": [family.hf_class], "model_type": family.model_types[0], "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim, "intermediate_size": cfg.ffn_dim, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": "gelu_pytorch_tanh" if cfg.act == "gelu_tanh" else cfg.act,
        "attention_bias": cfg.qkv_bias, "bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
    }
    if tokenizer.pad_id is not None:
        raw["pad_token_id"] = tokenizer.pad_id
    raw["mlp_bias"] = False
    raw = family.to_hf(fields, raw)
    if cfg.rope_scaling:
        raw["rope_scaling"] = _rope_scaling(cfg)
        if cfg.rope_scaling["type"] == "longrope":
            raw["original_max_position_embeddings"] = cfg.rope_scaling["original_max_position_embeddings"]
    if cfg.rotary_dim != cfg.head_dim:
        raw["partial_rotary_factor"] = cfg.rotary_dim / cfg.head_dim
    if cfg.local_layers:
        raw["sliding_window"] = cfg.sliding_window
        raw["layer_types"] = ["sliding_attention" if i in cfg.local_layers else "full_attention"
                              for i in range(cfg.n_layers)]
        if cfg.rope_local_theta:
            raw["rope_local_base_freq"] = cfg.rope_local_theta
    _check_round_trip(cfg, raw)
    return raw


def _rope_scaling(cfg: ModelConfig) -> dict:
    """tinyllm's rope_scaling as Hugging Face's (tinyllm.formats.hf._rope_scaling backwards)."""
    s = dict(cfg.rope_scaling)
    kind = s.pop("type")
    if kind == "longrope":
        s.pop("original_max_position_embeddings")
        if s.get("attention_factor") is None:
            s.pop("attention_factor", None)
    return {"rope_type": kind, "type": kind, **s}


def _check_round_trip(cfg: ModelConfig, raw: dict) -> None:
    """The config must read back (tinyllm.formats.hf.hf_config) as `cfg`, or the export refuses."""
    try:
        back = hf_config(json.loads(json.dumps(raw))).to_dict()
    except ValueError as e:
        raise ValueError(f"this {cfg.family} model has no Hugging Face {raw['model_type']} form ({e})") from None
    want = cfg.to_dict()
    if want.get("rope_scaling") and back.get("rope_scaling"):
        back["rope_scaling"] = {k: v for k, v in back["rope_scaling"].items() if k in want["rope_scaling"]}
    differ = sorted(k for k in want if want[k] != back[k])
    if differ:
        raise ValueError(f"this {cfg.family} model has no Hugging Face {raw['model_type']} form: its "
                         f"{', '.join(differ)} would read back as {', '.join(repr(back[k]) for k in differ)}")


def hf_tensors(cfg: ModelConfig, state: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """tinyllm's tensors (dense or QTensor) under Hugging Face's names, dense, in `dtype`."""
    dense = {k: (v.dequantize(torch.float32) if isinstance(v, QTensor) else v) for k, v in state.items()}
    offset = family_of(cfg).norm_offset  # Gemma's norms scale by (1 + w); tinyllm holds the 1 inside
    if offset:
        dense = {k: v.float() - offset if k.endswith("norm.weight") else v for k, v in dense.items()}
    out: dict[str, torch.Tensor] = {}
    for hf, tl in hf_names(cfg).items():
        if isinstance(tl, tuple):  # a fused tensor (Phi-3's projections): the parts' rows stacked
            out[hf] = torch.cat([dense[name] for name, _ in tl])
        elif tl in dense and not (tl == "lm_head.weight" and cfg.tie_embeddings):
            out[hf] = dense[tl]
    missing = sorted(set(dense) - {n for tl in hf_names(cfg).values()
                                   for n in ([p for p, _ in tl] if isinstance(tl, tuple) else [tl])})
    assert not missing, f"tensors with no Hugging Face name: {missing[:3]}"
    return {k: v.detach().to("cpu", dtype).contiguous() for k, v in out.items()}


def _auto_dtype(state: dict) -> torch.dtype:
    """The source's dense dtype (its embedding's, else its first dense matrix's); bf16 where
    every matrix is quantized."""
    emb = state.get("tok_emb.weight")
    if isinstance(emb, torch.Tensor) and emb.dtype in _HF_DTYPE:
        return emb.dtype
    dense = [v.dtype for v in state.values() if isinstance(v, torch.Tensor) and v.dim() == 2 and v.dtype in _HF_DTYPE]
    return dense[0] if dense else torch.bfloat16


def _save_weights(weights: dict[str, torch.Tensor], dst: Path, shard_mb: float) -> None:
    shards = split_shards(weights, int(shard_mb * 2**20))
    if len(shards) == 1:
        save_file(weights, dst / WEIGHTS, metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, dst / name, metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    total = sum(t.numel() * t.element_size() for t in weights.values())
    (dst / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def _save_tokenizer(tokenizer, template: ChatTemplate, cfg: ModelConfig, dst: Path) -> None:
    """tokenizer.json (+ tokenizer.model for sentencepiece) and tokenizer_config.json."""
    for old in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (dst / old).unlink(missing_ok=True)
    if isinstance(tokenizer, Tokenizer):
        (dst / "tokenizer.json").write_text(hf_tokenizer_json(tokenizer, add_bos=template.bos))
        (dst / "tokenizer.model").write_bytes(tokenizer.serialized())
    else:  # a BPETokenizer: its own tokenizer.json
        tokenizer.save(dst)
    ids = {"bos": tokenizer.bos_id, "eos": tokenizer.eos_id, "unk": _unk_id(tokenizer), "pad": tokenizer.pad_id}
    tok_cfg: dict = {"tokenizer_class": "PreTrainedTokenizerFast"}
    tok_cfg.update({f"{k}_token": tokenizer.id_to_piece(i) for k, i in ids.items() if i is not None})
    tok_cfg.update(add_bos_token=template.bos and isinstance(tokenizer, Tokenizer), add_eos_token=False,
                   clean_up_tokenization_spaces=False, model_max_length=cfg.max_seq_len,
                   chat_template=jinja_source(template))
    (dst / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")


def _unk_id(tokenizer) -> int | None:
    if isinstance(tokenizer, Tokenizer):
        unk = tokenizer._sp.unk_id()
        return unk if 0 <= unk < tokenizer.vocab_size and tokenizer._sp.is_unknown(unk) else None
    return getattr(tokenizer, "_unk", None)


def _stop_ids(tokenizer, template: ChatTemplate) -> list[int]:
    """EOS, then the template's stop pieces that are single ids (as a chat session stops)."""
    ids = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
    for piece in template.stop:
        i = tokenizer.piece_to_id(piece)
        if i is not None and i not in ids:
            ids.append(i)
    return ids

