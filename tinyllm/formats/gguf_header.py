"""A GGUF file's header read without torch: the magic, the version and the metadata.

Contract:
- `open_header(path) -> (Reader, version, n_tensors, metadata)`: the file mapped read-only, the
  reader positioned at the tensor table (tinyllm.formats.gguf.read_gguf reads it on); refuses a
  missing file (FileNotFoundError), an empty one, no GGUF magic, a version other than 2 or 3,
  a header that runs past the file's end and arrays nested deeper than MAX_DEPTH (ValueError).
- `read_metadata(path) -> dict`: only the metadata (the app's precheck, before its UI opens).
- `ARCHS`: the `general.architecture` values tinyllm reads (tinyllm.formats.gguf_arch maps them).
- `Reader`: the little-endian scalars, strings and (nested) arrays of a GGUF header.
Imports numpy, never torch: the UI process runs it (tinyllm.formats.model_files.precheck).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np

from tinyllm.families import GGUF_ARCHS

ARCHS = GGUF_ARCHS  # the architectures tinyllm reads (tinyllm.families; gguf_arch maps them)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
            12: "<d"}
STRING, ARRAY = 8, 9
MAX_DEPTH = 8  # arrays of arrays nest at most this deep (llama.cpp writes depth 1)
MAX_DIMS = 4  # GGMLMAX_DIMS


class Reader:
    def __init__(self, buf, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path} is truncated or not a GGUF file (header runs past its end)")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, t: int):
        fmt = SCALARS[t]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar(10)).decode("utf-8", errors="replace")

    def value(self, t: int, depth: int = 0):
        if t == STRING:
            return self.string()
        if t == ARRAY:
            if depth >= MAX_DEPTH:
                raise ValueError(f"{self.path}: GGUF metadata arrays nest more than {MAX_DEPTH} deep; "
                                 "the file is corrupt or not from llama.cpp")
            et, n = self.scalar(4), self.scalar(10)
            if n > len(self.buf) - self.pos:  # every element takes at least one byte
                raise ValueError(f"{self.path} is truncated or corrupt (a metadata array of {n} elements "
                                 "runs past its end)")
            if et == STRING:
                return [self.string() for _ in range(n)]
            if et in SCALARS:
                dt = np.dtype(SCALARS[et].replace("?", "u1"))
                return np.frombuffer(self.take(n * dt.itemsize), dtype=dt).tolist()
            return [self.value(et, depth + 1) for _ in range(n)]  # arrays of arrays
        if t in SCALARS:
            return self.scalar(t)
        raise ValueError(f"{self.path}: unknown GGUF metadata value type {t}")


def open_header(path: str | Path) -> tuple[Reader, int, int, dict]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            raise ValueError(f"{path} is empty, not a GGUF file") from None
    r = Reader(mm, path)
    if r.take(4) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
    version = r.scalar(4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = r.scalar(10), r.scalar(10)
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.scalar(4))
    return r, version, n_tensors, meta


def read_metadata(path: str | Path) -> dict:
    r, _, _, meta = open_header(path)
    r.buf.close()
    return meta
