"""A checkpoint folder that travels small: scripts/speed_gguf.py's idea for safetensors shards.

A decode step's speed depends on the tensors' shapes, dtypes and layout, not on their values, so a
folder (config.json, tokenizer.model, model*.safetensors, the index) travels as its small files
verbatim and, per shard, its header plus each tensor's first bytes; written back at full size with
those bytes tiled over each tensor, it is the real folder's layout byte for byte (the values repeat).
The device cannot take the default model whole (76 MB of shards, 64 MiB a call); this is it in 2 MB.

- `pack FOLDER OUT.xz`: OUT holds every file under 1 MB whole and each shard's header and heads.
- `unpack IN.xz FOLDER`: the folder, each shard at its full size.
"""

from __future__ import annotations

import json
import lzma
import pickle
import struct
import sys
from pathlib import Path

HEAD_BYTES = 8192  # each tensor's first bytes that travel


def pack(folder: str, out: str) -> None:
    files, shards = {}, {}
    for f in sorted(Path(folder).iterdir()):
        if f.suffix == ".safetensors":
            raw = f.read_bytes()
            (n,) = struct.unpack("<Q", raw[:8])
            header = json.loads(raw[8:8 + n])
            base = 8 + n
            spans = {name: t["data_offsets"] for name, t in header.items() if name != "__metadata__"}
            heads = {name: raw[base + a:base + min(b, a + HEAD_BYTES)] for name, (a, b) in spans.items()}
            shards[f.name] = (raw[:base], heads, len(raw))
        elif f.is_file() and f.stat().st_size < 1 << 20:
            files[f.name] = f.read_bytes()
    Path(out).write_bytes(lzma.compress(pickle.dumps((files, shards))))


def unpack(src: str, folder: str) -> None:
    files, shards = pickle.loads(lzma.decompress(Path(src).read_bytes()))
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    for name, (prefix, heads, size) in shards.items():
        header = json.loads(prefix[8:])
        buf = bytearray(size)
        buf[:len(prefix)] = prefix
        for tname, head in heads.items():
            a, b = header[tname]["data_offsets"]
            n = b - a
            tiled = (head * (n // len(head) + 1))[:n] if head else b""
            buf[len(prefix) + a:len(prefix) + b] = tiled
        (out / name).write_bytes(bytes(buf))


if __name__ == "__main__":
    {"pack": pack, "unpack": unpack}[sys.argv[1]](*sys.argv[2:])
