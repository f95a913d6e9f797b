"""What a model's files say, read without torch: for a UI process that must not import it.

Contract:
- `classify(path) -> ("tinyllm" | "hf" | "gguf", the folder or file to open)`: a tinyllm
  checkpoint folder (config.json with "format": "tinyllm"), a Hugging Face folder (config.json
  with a "model_type") or a GGUF file (*.gguf, or a folder holding exactly one).
- `read_safetensors_header(path)`: the header of a safetensors file, every entry checked
  (dtype, shape, offsets that match the size) and the file as long as the header promises.
- `weight_files(path, hint)`: a folder's safetensors files (the index's shards, or
  model.safetensors); a folder with only PyTorch .bin weights is refused with what to do.
- `precheck(path) -> name`: the checks a CLI can make before its UI opens, in milliseconds and
  without torch, in this order: the path is one of the three kinds, config.json parses, the
  architecture is one tinyllm reads (an HF folder's `model_type` in SUPPORTED, not quantized;
  a GGUF's `general.architecture`, no experts, a llama or gpt2 tokenizer: its header, read by
  tinyllm.formats.gguf_header), every weight file is there and as long as its header says (a
  GGUF's tensor table read whole: counts the file cannot hold, such as 2^40 tensors, and
  tensors past its end, a truncated file, are refused here, not after the app's window has
  opened), a tokenizer file is there, and the weights fit the RAM free now (`check_memory`).
  The name is `model_name`'s, the one the app shows everywhere (open_any reports the same).
- `model_name(path) -> str`: a tinyllm checkpoint's config.json "name"; for any other model
  its file's or folder's name ("SmolLM2-135M-Instruct.Q4_1"), never a GGUF's general.name
  nor a config's _name_or_path (often a build tag or another machine's path), and for a
  folder in the Hugging Face Hub's cache (models--OWNER--REPO/snapshots/HASH) the repo's name.
  What needs the model code (shapes against the config, the tokenizer itself, the chat
  template) is left to the loader (tinyllm.formats.open_model), which runs every check again.
Refuses with one line: FileNotFoundError for what is missing, ValueError for the rest (a file
or folder that cannot be read too: precheck turns the OSError into one).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from tinyllm.families import MODEL_TYPES

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
TOKENIZERS = ("tokenizer.model", "tokenizer.json")
SUPPORTED = MODEL_TYPES  # the Hugging Face model_types of tinyllm.families
_KINDS = ("a tinyllm checkpoint folder, a Hugging Face folder (Llama, Mistral, Qwen 2/3, Gemma 2/3, Phi-3) "
          "or a .gguf file")


def classify(path: str | Path) -> tuple[str, Path]:
    """("tinyllm" | "hf" | "gguf", the folder or file to open), or the one-line error."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    if path.is_file():
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic == b"GGUF" or path.suffix == ".gguf":
            return "gguf", path
        raise ValueError(f"{path} is not a model: expected {_KINDS}")
    config = path / "config.json"
    if not config.is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        what = f"{len(ggufs)} .gguf files (name one)" if ggufs else "no config.json"
        raise FileNotFoundError(f"{path} has {what}: expected {_KINDS}")
    try:
        raw = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config} is not valid JSON ({e})") from None
    if isinstance(raw, dict) and raw.get("format") == "tinyllm":
        return "tinyllm", path
    if isinstance(raw, dict) and "model_type" in raw:
        return "hf", path
    raise ValueError(f"{config} is neither a tinyllm nor a Hugging Face config: expected {_KINDS}")


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
    if not isinstance(header, dict):
        raise ValueError(f"{path} has a corrupt safetensors header (a JSON {type(header).__name__}, "
                         "not an object); copy or download it again")
    header.pop("__metadata__", None)
    end = 0
    for name, t in header.items():
        end = max(end, _check_entry(path, name, t))
    if size < 8 + n + end:
        raise ValueError(f"{path} is truncated: {size} bytes, the header promises {8 + n + end}; "
                         "copy or download it again")
    return header


_ST_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
             "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def _check_entry(path: Path, name: str, t: object) -> int:
    """One header entry: dtype a string, shape non-negative ints, data_offsets [start, end]
    ints with 0 <= start <= end, and end - start the tensor's size. Returns end."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{path} has a corrupt safetensors header: tensor {str(name)[:60]!r} {what}; "
                          "copy or download it again")

    if not isinstance(t, dict):
        raise bad("is not an object")
    dtype, shape, offs = t.get("dtype"), t.get("shape"), t.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad(f"has dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad(f"has shape {str(shape)[:40]}")
    if (not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs)
            or not 0 <= offs[0] <= offs[1]):
        raise bad(f"has data_offsets {str(offs)[:40]} (want [start, end] with 0 <= start <= end)")
    if dtype in _ST_SIZES and (offs[1] - offs[0]) != math.prod(shape) * _ST_SIZES[dtype]:
        raise bad(f"holds {offs[1] - offs[0]} bytes, its {dtype} shape {shape} needs "
                  f"{math.prod(shape) * _ST_SIZES[dtype]}")
    return offs[1]


def weight_files(path: Path, hint: str) -> list[Path]:
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
    if any(path.glob("*.bin")):
        raise ValueError(f"{path} has only PyTorch .bin weights; tinyllm reads safetensors "
                         "(re-save the model with save_pretrained(safe_serialization=True))")
    raise FileNotFoundError(f"{path} has no {WEIGHTS} (nor {INDEX}): {hint}")


def precheck(path: str | Path) -> str:
    """Validate what can be read without torch, in milliseconds; the model's name."""
    try:
        return _precheck(path)
    except FileNotFoundError:
        raise
    except OSError as e:  # unreadable (permissions), a folder where a file should be, an I/O error
        raise ValueError(f"cannot read the model at {e.filename or path}: {e.strerror or e}") from None


def _precheck(path: str | Path) -> str:
    kind, path = classify(path)
    if kind == "gguf":
        _precheck_gguf(path)
        return path.stem
    if kind == "hf":  # the architecture first: it is what a user can do least about
        raw = json.loads((path / "config.json").read_text())
        mt = raw.get("model_type")
        if mt not in SUPPORTED:
            raise ValueError(f"{path}: model_type {repr(mt)[:40]} is not supported (tinyllm reads {', '.join(SUPPORTED)})")
        if raw.get("quantization_config"):
            raise ValueError(f"{path}: quantized weights are not supported; use an fp16/bf16/fp32 model")
    hint = f"{path} holds config.json, model.safetensors (or shards) and a tokenizer"
    files = weight_files(path, hint)
    for f in files:
        read_safetensors_header(f)
    if not any((path / t).is_file() for t in TOKENIZERS):
        raise FileNotFoundError(f"{path} has no tokenizer ({' nor '.join(TOKENIZERS)}): {hint}")
    check_memory(path, sum(f.stat().st_size for f in files))
    return named(kind, path)


def _precheck_gguf(path: Path) -> None:
    from tinyllm.formats.gguf_header import open_header, read_tensors  # numpy, not torch

    r, _, n_tensors, meta = open_header(path)  # a count the file cannot hold (2^40 tensors) is refused here
    try:
        _precheck_gguf_meta(path, meta)
        read_tensors(r, n_tensors, meta)  # and a truncated file: every tensor inside it, not the loader's find
    finally:
        r.buf.close()
    check_memory(path, path.stat().st_size)


def _precheck_gguf_meta(path: Path, meta: dict) -> None:
    from tinyllm.formats.gguf_header import ARCHS

    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise ValueError(f"{path}: GGUF architecture {repr(arch)[:40]} is not supported "
                         f"(tinyllm reads {', '.join(ARCHS)})")
    if meta.get(f"{arch}.expert_count"):
        raise ValueError(f"{path}: mixture-of-experts {arch} models are not supported")
    tokenizer = meta.get("tokenizer.ggml.model")
    if tokenizer not in ("llama", "gpt2"):
        raise ValueError(f"{path}: GGUF tokenizer model {repr(tokenizer)[:40]} is not supported (llama or gpt2)")


def available_memory() -> int | None:
    """Bytes of RAM free for a new process (/proc/meminfo's MemAvailable); None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(path: Path, weight_bytes: int) -> None:
    """Refuse weights that cannot fit the RAM free now: loading holds them in memory whole."""
    free = available_memory()
    if free is not None and weight_bytes > free:
        raise ValueError(f"{path}: its weights take {weight_bytes / 2**30:.1f} GB and {free / 2**30:.1f} GB of "
                         "memory is free; close something, or pick a smaller or more quantized model")


def model_name(path: str | Path) -> str:
    """The name the app shows for the model at `path` (see the module docstring)."""
    return named(*classify(path))


def named(kind: str, path: Path) -> str:
    """model_name of a path classify() has sorted."""
    if kind == "gguf":
        return path.stem
    if kind == "tinyllm":
        try:
            name = json.loads((path / "config.json").read_text()).get("name")
        except (OSError, ValueError, AttributeError):
            name = None
        if isinstance(name, str) and name:
            return name
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.split("--")[-1]  # the Hub's cache: the repo, not the commit
    return path.name
