"""Sentencepiece model protos written by hand (protobuf wire format, no protobuf needed).

Contract: `sentencepiece_proto(tokens, scores, kinds, unk, bos, eos, pad)` -> a serialized BPE
ModelProto that `Tokenizer.from_serialized` loads; `sentencepiece_piece(piece, score, kind)`
-> one `pieces` entry, appended to a serialized model to add a piece. Used by the GGUF
importer (vocabularies in metadata) and the Hugging Face one (added tokens).
"""

from __future__ import annotations

import struct


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1  # negative int32 fields are 10-byte two's complement varints
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _field(num: int, value) -> bytes:
    if isinstance(value, bytes):
        return _varint(num << 3 | 2) + _varint(len(value)) + value
    if isinstance(value, float):
        return _varint(num << 3 | 5) + struct.pack("<f", value)
    return _varint(num << 3) + _varint(int(value))  # int and bool


def sentencepiece_piece(piece: str, score: float, kind: int) -> bytes:
    """One `ModelProto.pieces` entry (field 1): kind 1 normal, 2 unknown, 3 control,
    4 user-defined, 5 unused, 6 byte. Appending these to a serialized model adds pieces."""
    return _field(1, _field(1, piece.encode()) + _field(2, float(score)) + _field(3, kind))


def sentencepiece_proto(tokens: list[str], scores: list[float], kinds: list[int], unk_id: int | None,
                        bos_id: int | None, eos_id: int | None, pad_id: int | None,
                        add_dummy_prefix: bool = True) -> bytes:
    """A serialized sentencepiece BPE ModelProto (the field numbers of sentencepiece_model.proto)."""
    pieces = b"".join(sentencepiece_piece(t, s, k) for t, s, k in zip(tokens, scores, kinds, strict=True))
    ids = [(40, unk_id), (41, bos_id), (42, eos_id), (43, pad_id)]
    # The special pieces by name too (unk_piece .. pad_piece, fields 45-48): sentencepiece finds
    # bos_id() by looking its piece up, "<s>" unless told, so Gemma's "<bos>" went unfound.
    names = b"".join(_field(f + 5, tokens[i].encode()) for f, i in ids if i is not None)
    trainer = (_field(3, 2) + _field(4, len(tokens)) + _field(35, 6 in kinds)
               + b"".join(_field(f, -1 if i is None else i) for f, i in ids) + names)
    normalizer = (_field(1, b"identity") + _field(3, add_dummy_prefix) + _field(4, False) + _field(5, True))
    return pieces + _field(2, trainer) + _field(3, normalizer)
