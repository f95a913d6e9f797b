"""tinyllm checkpoint folders: save, validate, load (the tinyllm format of tinyllm.formats.model_format).

A checkpoint folder holds:
  config.json        {"format": "tinyllm", "model": ModelConfig fields, "chat": {...}, "name": str}
  model.safetensors  the weights, or shards model-0000i-of-0000n.safetensors (each at most
                     `shard_mb` MiB, 15 by default) with model.safetensors.index.json
  tokenizer.model    the sentencepiece model, or tokenizer.json + tokenizer_config.json for a
                     byte-level BPE tokenizer (tinyllm.text.bpe_tokenizer; needs the `tokenizers` extra)

Contract: `inspect_checkpoint(path) -> CheckpointInfo` validates everything it can without
allocating a tensor (files present, config parses, each safetensors header parses and its file
is as long as the header says, every expected tensor present with the shape the config implies,
tokenizer fits the vocabulary) and raises FileNotFoundError/ValueError with a message that
says what is wrong and what to do. The format's `inspect(path, template=None) -> ModelSpec`
adds the tokenizer and the chat template (`template`, else config.json's chat.spec, the full
spec `tinyllm.formats.convert` writes for a template taken from Jinja, else its chat.template name);
`tensors(spec, quant, dtype, progress)` reads the weights as stored (tinyllm.formats.build decides
each one's form and dtype in memory). `load_checkpoint(path, device, dtype, quant="auto",
group=32, progress=None) -> Checkpoint` runs both and builds (tinyllm.formats.model_format.load_model;
`quant` as tinyllm.formats.quant_rule states it). With tied embeddings only `tok_emb.*` is stored. A
quantized matrix is stored in its canonical form (tinyllm.core.quant): `<name>.qweight` (I8 for
int8, U8 for packed int4), `<name>.scales` (F32, or F16 where every value is exact in fp16)
and for int4 `<name>.zeros`, and loads back bit for bit under "keep".
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tinyllm.core.quant import QTensor, held_exactly
from tinyllm.formats.load_policy import check_quant
from tinyllm.formats.model_files import INDEX, WEIGHTS, read_safetensors_header, weight_files
from tinyllm.formats.model_format import ModelSpec, Progress, Tensors, load_model, with_progress
from tinyllm.formats.quant_rule import DEFAULT
from tinyllm.formats.tensor_checks import check_vocab, expected_shapes, match_tensors
from tinyllm.model import ModelConfig, Transformer
from tinyllm.text.chat_template import ChatTemplate, get_template
from tinyllm.text.jinja_template import template_from_dict
from tinyllm.text.tokenizer import Tokenizer

__all__ = ["Checkpoint", "CheckpointInfo", "inspect", "inspect_checkpoint", "load_checkpoint", "save_checkpoint",
           "split_shards", "tensors"]

CONFIG, TOKENIZER = "config.json", "tokenizer.model"
TOKENIZER_JSON = "tokenizer.json"  # a BPETokenizer, with its tokenizer_config.json
_FORMS = {"I8": "int8", "U8": "int4"}  # a qweight's dtype -> its form (tensor_checks.match_tensors checked it)
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I8": torch.int8,
              "U8": torch.uint8}
_HINT = ("a tinyllm checkpoint folder holds config.json, model.safetensors (or shards) and tokenizer.model "
         "(or tokenizer.json)")


@dataclass
class CheckpointInfo:
    """What inspect_checkpoint found: enough to describe the model without loading it."""
    path: Path
    config: ModelConfig
    name: str
    chat: dict = field(default_factory=dict)  # chat template settings for ChatSession
    weight_files: list[Path] = field(default_factory=list)
    n_params: int = 0


@dataclass
class Checkpoint:
    info: CheckpointInfo
    model: Transformer
    tokenizer: Tokenizer  # or a BPETokenizer (tokenizer.json), which has the same interface


def inspect_checkpoint(path: str | Path) -> CheckpointInfo:
    """Validate a checkpoint folder without reading a weight (the module docstring)."""
    return _inspect(path)[0]


def _inspect(path: str | Path) -> tuple[CheckpointInfo, object, frozenset[str]]:
    """(CheckpointInfo, tokenizer, the quantized forms stored)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    if not path.is_dir():
        raise ValueError(f"{path} is not a checkpoint folder: {_HINT}")
    if not (path / CONFIG).is_file():
        raise FileNotFoundError(f"{path} has no {CONFIG}: {_HINT}")
    try:
        raw = json.loads((path / CONFIG).read_text())
        if raw.get("format") != "tinyllm":
            raise ValueError(f"{path / CONFIG} is not a tinyllm config (no \"format\": \"tinyllm\")")
        cfg = ModelConfig.from_dict(raw["model"])
    except json.JSONDecodeError as e:
        raise ValueError(f"{path / CONFIG} is not valid JSON ({e})") from None
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path / CONFIG} has no valid \"model\" section ({e})") from None
    if not (path / TOKENIZER).is_file() and not (path / TOKENIZER_JSON).is_file():
        raise FileNotFoundError(f"{path} has no {TOKENIZER} (nor {TOKENIZER_JSON}): {_HINT}")
    tok = load_tokenizer(path)  # a ValueError if it isn't one
    check_vocab(path, tok.vocab_size, cfg.vocab_size)
    files = weight_files(path, _HINT)
    found: dict[str, dict] = {}
    for f in files:
        found.update(read_safetensors_header(f))
    want = expected_shapes(cfg)
    missing, extra, wrong = match_tensors(want, {k: (tuple(t["shape"]), t["dtype"]) for k, t in found.items()})
    bad_dtype = sorted(k for k, t in found.items() if t["dtype"] not in _ST_DTYPES)
    for what, items in (("missing tensors", missing), ("unexpected tensors", extra),
                        ("shape mismatch", wrong), ("unsupported dtypes", bad_dtype)):
        if items:
            more = f" (and {len(items) - 3} more)" if len(items) > 3 else ""
            raise ValueError(f"{path}: config.json does not match the weights: {what} "
                             f"{', '.join(items[:3])}{more}")
    info = CheckpointInfo(path=path, config=cfg, name=raw.get("name") or path.name,
                          chat=raw.get("chat") or {}, weight_files=files,
                          n_params=sum(_numel(s) for s in want.values()))
    stored = frozenset(_FORMS[t["dtype"]] for k, t in found.items() if k.endswith(".qweight"))
    return info, tok, stored


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def inspect(path: str | Path, template: str | None = None) -> ModelSpec:
    """The checkpoint's ModelSpec (tinyllm.formats.model_format): inspect_checkpoint's checks, its
    tokenizer and its chat template."""
    info, tokenizer, stored = _inspect(path)
    return ModelSpec(info.path, info.config, tokenizer, chat_template(info.chat, template), info.name, stored,
                     source=info)


def tensors(spec: ModelSpec, quant: str, dtype: torch.dtype, progress: Progress | None = None) -> Tensors:
    """Every weight as stored, quantized matrices as QTensors (`quant` and `dtype` change nothing
    here: tinyllm.formats.build decides each tensor's form and dtype in memory)."""
    info: CheckpointInfo = spec.source
    state: dict[str, torch.Tensor] = {}
    with ExitStack() as files:
        opened = [files.enter_context(safe_open(str(f), framework="pt")) for f in info.weight_files]
        reads = [(st, name) for st in opened for name in st.keys()]  # noqa: SIM118 (not a dict)
        for st, name in with_progress(reads, progress):
            state[name] = st.get_tensor(name)
    out: Tensors = {}
    for k, v in state.items():
        if k.endswith(".qweight"):
            base = k.removesuffix(".qweight")
            kind = "int8" if v.dtype == torch.int8 else "int4"
            out[f"{base}.weight"] = QTensor(kind, v, state[f"{base}.scales"].float(),
                                            state[f"{base}.zeros"].float() if kind == "int4" else None)
        elif not k.endswith((".scales", ".zeros")):
            out[k] = v
    return out


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    quant: str = DEFAULT, group: int = 32, progress: Progress | None = None) -> Checkpoint:
    """Inspect, then load (tinyllm.formats.model_format.load_model); `quant` as tinyllm.formats.quant_rule states it."""
    check_quant(quant, group)  # before the path: a bad option is named first
    with inspect(path) as spec:
        model = load_model(spec, tensors, device, dtype, quant, group, progress)
    return Checkpoint(info=spec.source, model=model, tokenizer=spec.tokenizer)


def chat_template(chat: dict, template: str | None) -> ChatTemplate:
    """--template, else config.json's chat.spec, else its chat.template name (ValueError if bad)."""
    if template:
        return get_template(template)
    if isinstance(chat.get("spec"), dict):
        return template_from_dict(chat["spec"])
    return get_template(chat.get("template", "chatml"))


def load_tokenizer(path: Path):
    """tokenizer.model (sentencepiece), else tokenizer.json (a BPETokenizer)."""
    if (path / TOKENIZER).is_file():
        return Tokenizer.load(path / TOKENIZER)
    from tinyllm.text.bpe_tokenizer import BPETokenizer

    return BPETokenizer.load(path)


def save_checkpoint(model: Transformer, tokenizer: Tokenizer, path: str | Path, name: str | None = None,
                    chat: dict | None = None, shard_mb: float = 15, dtype: torch.dtype | None = None) -> Path:
    """Write a checkpoint folder; shards when the weights exceed shard_mb MiB."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: _stored(k, v, dtype) for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        state = {k: v for k, v in state.items() if not k.startswith("lm_head.")}
    config = {"format": "tinyllm", "name": name or path.name, "model": model.cfg.to_dict(), "chat": chat or {}}
    (path / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    for old in [*path.glob("model*.safetensors"), path / INDEX, path / TOKENIZER, path / TOKENIZER_JSON,
                path / "tokenizer_config.json"]:
        old.unlink(missing_ok=True)
    if isinstance(tokenizer, Tokenizer):
        (path / TOKENIZER).write_bytes(tokenizer.serialized())
    else:
        tokenizer.save(path)  # BPETokenizer: tokenizer.json + tokenizer_config.json
    shards = split_shards(state, int(shard_mb * 2**20))
    if len(shards) == 1:
        save_file(shards[0], path / WEIGHTS)
        return path
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, path / fname)
        weight_map.update({k: fname for k in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (path / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return path


def _stored(name: str, t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """On the CPU, contiguous; dense weights in `dtype`; quantized parts as they are, scales and
    offsets in fp16 where every value is exact in fp16 (a GGUF's, --half-scales'), else fp32."""
    t = t.detach().to("cpu")
    if name.endswith((".scales", ".zeros")):
        return held_exactly(t).contiguous()
    if name.endswith(".qweight"):
        return t.contiguous()
    return t.to(dtype or t.dtype).contiguous()


def split_shards(state: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """Greedy shards of at most `limit` bytes (a single larger tensor gets a shard alone)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, t in state.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > limit:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += n
    return shards
