"""tinyllm checkpoint folders: save, validate, load.

A checkpoint folder holds:
  config.json        {"format": "tinyllm", "model": ModelConfig fields, "chat": {...}, "name": str}
  model.safetensors  the weights, or shards model-0000i-of-0000n.safetensors (each at most
                     `shard_mb` MiB, 15 by default) with model.safetensors.index.json
  tokenizer.model    the sentencepiece model, or tokenizer.json + tokenizer_config.json for a
                     byte-level BPE tokenizer (tinyllm.bpe_tokenizer; needs the `tokenizers` extra)

Contract: `inspect_checkpoint(path)` validates everything it can without allocating a tensor
(files present, config parses, each safetensors header parses and its file is as long as the
header says, every expected tensor present with the shape the config implies, tokenizer
fits the vocabulary) and raises FileNotFoundError/ValueError with a message that says what is
wrong and what to do. `load_checkpoint(path, device, dtype, quant="auto", progress=None)`
inspects first, then reads the tensors one by one (telling `progress(done, total)`, see
tinyllm.build.with_progress) and hands them to `tinyllm.build` (bf16 by default on CUDA, fp32
on the CPU). With tied
embeddings only `tok_emb.*` is stored. A quantized matrix is stored in its canonical form
(tinyllm.quant): `<name>.qweight` (I8 for int8, U8 for packed int4), `<name>.scales` (F32)
and for int4 `<name>.zeros` (F32), and loads back bit for bit.
Other formats (Hugging Face folders, GGUF) have importers beside this module.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tinyllm.build import Progress, build_transformer, with_progress
from tinyllm.load_policy import check_quant, default_dtype, holds_int4, resolve_device
from tinyllm.model import ModelConfig, Transformer
from tinyllm.model_files import INDEX, WEIGHTS, read_safetensors_header, weight_files
from tinyllm.quant import QTensor, held_exactly
from tinyllm.tensor_checks import check_vocab, expected_shapes, match_tensors
from tinyllm.tokenizer import Tokenizer

__all__ = ["Checkpoint", "CheckpointInfo", "default_dtype", "inspect_checkpoint", "load_checkpoint",
           "read_safetensors_header", "resolve_device", "save_checkpoint", "weight_files"]

CONFIG, TOKENIZER = "config.json", "tokenizer.model"
TOKENIZER_JSON = "tokenizer.json"  # a BPETokenizer, with its tokenizer_config.json
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
    return CheckpointInfo(path=path, config=cfg, name=raw.get("name") or path.name,
                          chat=raw.get("chat") or {}, weight_files=files,
                          n_params=sum(_numel(s) for s in want.values()))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                    quant: str = "keep", group: int = 32, progress: Progress | None = None) -> Checkpoint:
    """Inspect, then load; `quant` as tinyllm.build reads it ("keep": as stored)."""
    check_quant(quant, group)
    info = inspect_checkpoint(path)
    device = torch.device(device)
    tokenizer = load_tokenizer(info.path)
    state: dict[str, torch.Tensor] = {}
    with ExitStack() as files:
        opened = [files.enter_context(safe_open(str(f), framework="pt")) for f in info.weight_files]
        reads = [(st, name) for st in opened for name in st.keys()]  # noqa: SIM118 (not a dict)
        for st, name in with_progress(reads, progress):
            state[name] = st.get_tensor(name)
    tensors: dict[str, torch.Tensor | QTensor] = {}
    for k, v in state.items():
        if k.endswith(".qweight"):
            base = k.removesuffix(".qweight")
            kind = "int8" if v.dtype == torch.int8 else "int4"
            tensors[f"{base}.weight"] = QTensor(kind, v, state[f"{base}.scales"].float(),
                                                state[f"{base}.zeros"].float() if kind == "int4" else None)
        elif not k.endswith((".scales", ".zeros")):
            tensors[k] = v  # as stored: tinyllm.build decides each tensor's dtype in memory
    dtype = dtype or default_dtype(device, holds_int4(quant, tensors.values()))
    model = build_transformer(info.config, tensors, device, dtype, quant, group)
    return Checkpoint(info=info, model=model, tokenizer=tokenizer)


def load_tokenizer(path: Path):
    """tokenizer.model (sentencepiece), else tokenizer.json (a BPETokenizer)."""
    if (path / TOKENIZER).is_file():
        return Tokenizer.load(path / TOKENIZER)
    from tinyllm.bpe_tokenizer import BPETokenizer

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
    shards = _split(state, int(shard_mb * 2**20))
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


def _split(state: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
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
