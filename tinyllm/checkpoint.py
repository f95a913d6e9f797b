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
wrong and what to do. `load_checkpoint(path, device, dtype)` inspects first, then loads
(bf16 by default on CUDA, fp32 on the CPU). With tied embeddings only `tok_emb.weight` is
stored. Other formats (Hugging Face folders, GGUF) have importers beside this module.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tinyllm.model import ModelConfig, Transformer
from tinyllm.tokenizer import Tokenizer

CONFIG, WEIGHTS, INDEX, TOKENIZER = "config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.model"
TOKENIZER_JSON = "tokenizer.json"  # a BPETokenizer, with its tokenizer_config.json
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
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


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = Transformer(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.tie_embeddings:
        del shapes["lm_head.weight"]
    return shapes


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """Parse a safetensors header and check the file holds all the data it promises."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path} is truncated or not a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100_000_000):
            raise ValueError(f"{path} is not a safetensors file, or is truncated (header of {n} bytes)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"{path} has a corrupt safetensors header") from None
    header.pop("__metadata__", None)
    end = max((t["data_offsets"][1] for t in header.values()), default=0)
    if size < 8 + n + end:
        raise ValueError(f"{path} is truncated: {size} bytes, the header promises {8 + n + end}; "
                         "copy or download it again")
    return header


def weight_files(path: Path, hint: str = _HINT) -> list[Path]:
    """The safetensors files of a folder: the index's shards, or model.safetensors."""
    if (path / INDEX).exists():
        try:
            index = json.loads((path / INDEX).read_text())
            files = sorted(set(index["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{path / INDEX} is not a valid safetensors index") from None
        missing = [f for f in files if not (path / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{path} is missing weight shards {missing}")
        return [path / f for f in files]
    if (path / WEIGHTS).is_file():
        return [path / WEIGHTS]
    raise FileNotFoundError(f"{path} has no {WEIGHTS} (nor {INDEX}): {hint}")


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
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(f"{path}: tokenizer has {tok.vocab_size} pieces but the model only "
                         f"{cfg.vocab_size} embeddings")
    files = weight_files(path)
    found: dict[str, dict] = {}
    for f in files:
        found.update(read_safetensors_header(f))
    want = expected_shapes(cfg)
    missing = sorted(set(want) - set(found))
    extra = sorted(set(found) - set(want))
    wrong = [f"{k}: file {tuple(found[k]['shape'])} vs config {want[k]}"
             for k in sorted(set(want) & set(found)) if tuple(found[k]["shape"]) != want[k]]
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


def resolve_device(device: str) -> torch.device:
    """"auto" | "cpu" | "cuda" -> a device; a ValueError for CUDA where there is none."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (use --device cpu)")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> Checkpoint:
    info = inspect_checkpoint(path)
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    tokenizer = load_tokenizer(info.path)
    state: dict[str, torch.Tensor] = {}
    for f in info.weight_files:
        state.update(load_file(f, device=str(device)))
    state = {k: v.to(dtype) for k, v in state.items()}
    if info.config.tie_embeddings:
        state["lm_head.weight"] = state["tok_emb.weight"]
    with torch.device("meta"):
        model = Transformer(info.config)
    model.load_state_dict(state, assign=True)
    if info.config.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    model.rope.to(device)
    return Checkpoint(info=info, model=model.eval(), tokenizer=tokenizer)


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
    state = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        del state["lm_head.weight"]
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
