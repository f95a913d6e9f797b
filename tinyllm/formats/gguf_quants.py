"""GGUF tensor types: the ggml type table and dequantization of each block format to fp32.

Contract: `dequantize(raw, typ, shape)` turns one tensor's raw bytes (uint8) of ggml type `typ`
into an fp32 tensor of `shape`: F32, F16, BF16, F64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
Q4_K, Q5_K, Q6_K, each with vectorized torch ops over all blocks (in chunks, so temporaries
stay bounded). Another type is a ValueError naming it. Bit layouts follow llama.cpp's ggml.
`to_qtensor(raw, typ, shape)` keeps a matrix quantized instead (tinyllm.core.quant's forms; its
docstring states each type's error); `held_form(typ, shape)` names the form it gives, read
from the header alone.
"""

from __future__ import annotations

import torch

from tinyllm.core.quant import QTensor, pack_int4, quantize
from tinyllm.formats.gguf_header import GGML_TYPES  # the type table, torch-free (the app's precheck reads it)


def supported_types() -> list[str]:
    return [name for name, block, _ in GGML_TYPES.values() if block is not None]


# ---- dequantization ---------------------------------------------------------------------

_CHUNK_BLOCKS = 1 << 16  # blocks dequantized at a time (bounds the temporaries)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2k) uint8 -> (n, k) fp32 from little-endian fp16."""
    return b.contiguous().view(torch.float16).float()


def _u8(*v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.uint8)


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """(n, m) packed bytes -> (n, 2m): per `group` bytes, the low nibbles, then the high ones."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group) >> _u8(0, 4).reshape(1, 1, 2, 1)  # (n, m/group, 2, group)
    return (q & 0xF).reshape(n, -1)


def _bits(b: torch.Tensor) -> torch.Tensor:
    """(n, m) bytes -> (n, 8m) bits, little-endian bit order within each byte."""
    return ((b.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(b.shape[0], -1)


def _scale_min_k4(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins, each (n, 8)."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 63, (md & 0xF) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


def _q4_0(b):
    return (_nibbles(b[:, 2:], 16).float() - 8) * _f16(b[:, :2])


def _q4_1(b):
    return _nibbles(b[:, 4:], 16).float() * _f16(b[:, :2]) + _f16(b[:, 2:4])


def _q5_0(b):
    q = _nibbles(b[:, 6:], 16) | (_bits(b[:, 2:6]) << 4)
    return (q.float() - 16) * _f16(b[:, :2])


def _q5_1(b):
    q = _nibbles(b[:, 8:], 16) | (_bits(b[:, 4:8]) << 4)
    return q.float() * _f16(b[:, :2]) + _f16(b[:, 2:4])


def _q8_0(b):
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _q2_k(b):
    n = b.shape[0]
    scales, qs, d, dmin = b[:, :16], b[:, 16:80], _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0xF).float()).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).reshape(n, 16, 1)
    q = (qs.reshape(n, 2, 1, 32) >> _u8(0, 2, 4, 6).reshape(1, 1, 4, 1)) & 3  # (n, 2, 4, 32)
    return (dl * q.reshape(n, 16, 16).float() - ml).reshape(n, 256)


def _q3_k(b):
    n = b.shape[0]
    hmask, qs, s, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    lo = (s[:, :8].reshape(n, 1, 8) >> _u8(0, 4).reshape(1, 2, 1)).reshape(n, 16) & 0xF
    hi = (s[:, 8:].reshape(n, 1, 4) >> _u8(0, 2, 4, 6).reshape(1, 4, 1)).reshape(n, 16) & 3
    scales = ((lo | (hi << 4)).to(torch.int16) - 32).float()
    ql = (qs.reshape(n, 2, 1, 32) >> _u8(0, 2, 4, 6).reshape(1, 1, 4, 1)).reshape(n, 16, 16) & 3
    qh = (hmask.reshape(n, 1, 32) >> torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)).reshape(n, 16, 16)
    qh = qh & 1
    q = ql.to(torch.int16) - ((qh ^ 1).to(torch.int16) << 2)  # the high bit SET means no offset
    return ((d * scales).reshape(n, 16, 1) * q.float()).reshape(n, 256)


def _q4_k(b):
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    q = _nibbles(b[:, 16:], 32).reshape(n, 8, 32).float()
    return ((d * sc).unsqueeze(-1) * q - (dmin * mn).unsqueeze(-1)).reshape(n, 256)


def _q5_k(b):
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    qh = (b[:, 16:48].reshape(n, 1, 32) >> torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)) & 1
    q = (_nibbles(b[:, 48:], 32).reshape(n, 8, 32) | (qh << 4)).float()
    return ((d * sc).unsqueeze(-1) * q - (dmin * mn).unsqueeze(-1)).reshape(n, 256)


def _q6_k(b):
    n = b.shape[0]
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    lo = _nibbles(ql, 64).reshape(n, 8, 32)
    hi = ((qh.reshape(n, 2, 1, 32) >> _u8(0, 2, 4, 6).reshape(1, 1, 4, 1)) & 3).reshape(n, 8, 32)
    q = ((lo | (hi << 4)).to(torch.int16) - 32).float().reshape(n, 16, 16)
    scale = d * scales.contiguous().view(torch.int8).float()  # (n, 16)
    return (scale.unsqueeze(-1) * q).reshape(n, 256)


_DEQUANT = {2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0, 10: _q2_k, 11: _q3_k, 12: _q4_k,
            13: _q5_k, 14: _q6_k}
_PLAIN = {0: torch.float32, 1: torch.float16, 28: torch.float64, 30: torch.bfloat16}


def dequantize(raw: torch.Tensor, typ: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Raw GGUF bytes (uint8) of one tensor of ggml type `typ` -> fp32 tensor of `shape`."""
    if typ in _PLAIN:
        return raw.view(_PLAIN[typ]).float().reshape(shape)
    if typ not in _DEQUANT:
        name = GGML_TYPES.get(typ, (f"type {typ}",))[0]
        raise ValueError(f"quantization type {name} is not supported "
                         f"(supported: {', '.join(supported_types())})")
    _, block, size = GGML_TYPES[typ]
    blocks = raw.reshape(-1, size)
    out = torch.empty(blocks.shape[0], block, dtype=torch.float32)
    for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        out[i:i + _CHUNK_BLOCKS] = _DEQUANT[typ](blocks[i:i + _CHUNK_BLOCKS])
    return out.reshape(shape)


# ---- quantized forms (tinyllm.core.quant.QTensor) ----------------------------------------------

def _int4_q4_0(b):  # w = (q - 8) d: s = d, z = -8 d
    d = _f16(b[:, :2])
    return _nibbles(b[:, 2:], 16), d, -8 * d


def _int4_q4_1(b):  # w = q d + m
    return _nibbles(b[:, 4:], 16), _f16(b[:, :2]), _f16(b[:, 2:4])


def _int4_q4_k(b):  # eight sub-blocks of 32: w = q (d sc) - dmin mn
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    return _nibbles(b[:, 16:], 32), d * sc, -(dmin * mn)


_INT4 = {2: _int4_q4_0, 3: _int4_q4_1, 12: _int4_q4_k}  # 4-bit types held exactly as int4, groups of 32


def held_form(typ: int, shape: tuple[int, ...]) -> str | None:
    """The form to_qtensor gives a tensor of this type and shape: "int4", "int8", or None (dense)."""
    if typ in _PLAIN or len(shape) != 2:
        return None
    return "int4" if typ in _INT4 else "int8"


def to_qtensor(raw: torch.Tensor, typ: int, shape: tuple[int, ...]) -> QTensor | torch.Tensor:
    """Raw GGUF bytes of one 2-D tensor -> its quantized form, block by block, no bf16 copy:
    Q4_0, Q4_1, Q4_K -> int4 in groups of 32, exactly (the same 4-bit values; scales and
    offsets in fp32, where d * sc and dmin * mn are exact); every other block type -> int8 per
    row, from its fp32 values (Q8_0 too: its per-block scales become one per row), at most
    max|row| / 254 from the file's values. Plain types: an F16 / BF16 matrix as it is stored
    (tinyllm.formats.build decides its dtype in memory), F32, F64 and vectors -> fp32 tensor."""
    form = held_form(typ, shape)
    if form is None and typ in (1, 30) and len(shape) == 2:
        return raw.view(_PLAIN[typ]).reshape(shape)
    if form is None:
        return dequantize(raw, typ, shape)
    if form == "int8":
        return quantize(dequantize(raw, typ, shape), "int8")
    _, block, size = GGML_TYPES[typ]
    n, k = shape
    blocks = raw.reshape(-1, size)
    q = torch.empty(blocks.shape[0], block, dtype=torch.uint8)
    s = torch.empty(blocks.shape[0], block // 32)
    z = torch.empty_like(s)
    for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
        q[i:i + _CHUNK_BLOCKS], s[i:i + _CHUNK_BLOCKS], z[i:i + _CHUNK_BLOCKS] = _INT4[typ](blocks[i:i + _CHUNK_BLOCKS])
    return QTensor("int4", pack_int4(q.view(n, k)), s.view(n, k // 32), z.view(n, k // 32))
