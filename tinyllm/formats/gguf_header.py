"""A GGUF file's header read without torch: the magic, the version, the metadata and the tensor table.

Contract:
- `open_header(path) -> (Reader, version, n_tensors, metadata)`: the file mapped read-only, the
  reader positioned at the tensor table; refuses a missing file (FileNotFoundError), an empty
  one, no GGUF magic, a version other than 2 or 3, counts of metadata pairs or tensors more
  than the file's bytes can hold (a header claiming 2^40 tensors is refused at once, not
  after reading to the end), a header that runs past the file's end and arrays nested deeper
  than MAX_DEPTH (ValueError).
- `read_tensors(reader, n_tensors, metadata) -> {name: GGUFTensor}`: the tensor table (shapes in
  PyTorch order, absolute offsets, sizes in Python ints); refuses more than MAX_DIMS dims, an
  alignment that is not a power of two, rows that are not whole blocks and a tensor of a known
  type that runs past the file's end: a truncated file. tinyllm.formats.gguf.read_gguf reads
  the table with it, and so does the app's precheck (tinyllm.formats.model_files), before its
  UI opens: a truncated file is one line there, never a window that opens and then closes.
- `GGML_TYPES`: ggml type id -> (name, elements per block, bytes per block), None where tinyllm
  cannot read the type (tinyllm.formats.gguf_quants dequantizes the others).
- `ARCHS`: the `general.architecture` values tinyllm reads (tinyllm.formats.gguf_arch maps them).
- `Reader`: the little-endian scalars, strings and (nested) arrays of a GGUF header.
Imports numpy, never torch: the UI process runs it (tinyllm.formats.model_files.precheck).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyllm.families import GGUF_ARCHS

ARCHS = GGUF_ARCHS  # the architectures tinyllm reads (tinyllm.families; gguf_arch maps them)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
            12: "<d"}
STRING, ARRAY = 8, 9
MAX_DEPTH = 8  # arrays of arrays nest at most this deep (llama.cpp writes depth 1)
MAX_DIMS = 4  # GGMLMAX_DIMS
KV_BYTES = 8 + 4 + 1  # a metadata pair's least bytes: its key's length, its value type, a 1-byte value
TENSOR_BYTES = 8 + 4 + 4 + 8  # a tensor table entry's least bytes: name length, dims, type, offset
# ggml type id -> (name, elements per block, bytes per block); None: a type we cannot read.
GGML_TYPES: dict[int, tuple[str, int, int] | tuple[str, None, None]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", None, None), 10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
    15: ("Q8_K", None, None), 16: ("IQ2_XXS", None, None), 17: ("IQ2_XS", None, None),
    18: ("IQ3_XXS", None, None), 19: ("IQ1_S", None, None), 20: ("IQ4_NL", None, None),
    21: ("IQ3_S", None, None), 22: ("IQ2_S", None, None), 23: ("IQ4_XS", None, None), 24: ("I8", None, None),
    25: ("I16", None, None), 26: ("I32", None, None), 27: ("I64", None, None), 28: ("F64", 1, 8),
    29: ("IQ1_M", None, None), 30: ("BF16", 1, 2), 34: ("TQ1_0", None, None), 35: ("TQ2_0", None, None),
    39: ("MXFP4", None, None),
}


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # PyTorch order (GGUF's dims reversed)
    type: int  # ggml type id
    offset: int  # absolute byte offset in the file
    nbytes: int | None  # None for a type we cannot read

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type, (f"type {self.type}",))[0]


class Reader:
    def __init__(self, buf, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def count(self, n: int, least: int, what: str) -> int:
        """n, a count the header claims of things of at least `least` bytes each, where the bytes
        left can hold that many."""
        if n * least > len(self.buf) - self.pos:
            raise ValueError(f"{self.path} is truncated or corrupt: its header claims {n:,} {what}, more than "
                             f"its {len(self.buf):,} bytes can hold; copy or download it again")
        return n

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
    r.count(n_kv, KV_BYTES, "metadata pairs")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.scalar(4))
    r.count(n_tensors, TENSOR_BYTES, "tensors")
    return r, version, n_tensors, meta


def read_tensors(r: Reader, n_tensors: int, meta: dict) -> dict[str, GGUFTensor]:
    path, size = r.path, len(r.buf)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.scalar(4)
        if n_dims > MAX_DIMS:
            raise ValueError(f"{path}: tensor {_short(name)} has {n_dims} dimensions (GGUF allows {MAX_DIMS}); "
                             "the file is corrupt")
        dims = [r.scalar(10) for _ in range(n_dims)]
        infos.append((name, tuple(reversed(dims)), r.scalar(4), r.scalar(10)))
    align = meta.get("general.alignment", 32)
    if type(align) is not int or align <= 0 or align & (align - 1):
        raise ValueError(f"{path}: general.alignment {align!r} is not a positive power of two; "
                         "the file is corrupt")
    start = (r.pos + align - 1) // align * align
    tensors = {}
    for name, shape, typ, off in infos:
        _, block, nbytes_a_block = GGML_TYPES.get(typ, (None, None, None))
        nbytes = None
        if block is not None:
            numel = math.prod(shape)  # Python ints: np.prod would wrap past 2^63
            if shape and shape[-1] % block:
                raise ValueError(f"{path}: tensor {_short(name)} rows of {shape[-1]} are not whole {block}-blocks")
            nbytes = numel // block * nbytes_a_block
            if start + off + nbytes > size:
                raise ValueError(f"{path} is truncated: tensor {_short(name)} runs past the end of the file; "
                                 "copy or download it again")
        tensors[name] = GGUFTensor(name, shape, typ, start + off, nbytes)
    return tensors


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
