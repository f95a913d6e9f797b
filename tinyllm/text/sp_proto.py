"""Sentencepiece model protos written by hand (protobuf wire format, no protobuf needed).

Contract: `sentencepiece_proto(tokens, scores, kinds, unk, bos, eos, pad)` -> a serialized BPE
ModelProto that `Tokenizer.from_serialized` loads; `sentencepiece_piece(piece, score, kind)`
-> one `pieces` entry, appended to a serialized model to add a piece. Used by the GGUF
importer (vocabularies in metadata) and the Hugging Face one (added tokens).
`read_sentencepiece(data) -> SentencePieceModel`: the pieces (text, score, kind) and the few
trainer and normalizer fields the Hugging Face export reads (tinyllm.text.sp_to_hf), with
sentencepiece's defaults where a field is absent; a ValueError where the bytes do not parse.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


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


@dataclass
class SentencePieceModel:
    """What read_sentencepiece reads of a ModelProto (sentencepiece_model.proto's defaults)."""
    pieces: list[tuple[str, float, int]] = field(default_factory=list)  # (piece, score, kind) by id
    model_type: str = "unigram"  # TrainerSpec.model_type: unigram, bpe, word, char
    normalizer: str = ""  # NormalizerSpec.name ("identity", "nmt_nfkc", ...)
    add_dummy_prefix: bool = True  # a "▁" is put in front of the text
    remove_extra_whitespaces: bool = True  # leading, trailing and repeated spaces are dropped


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("a sentencepiece model ends inside a number")
        b = data[at]
        value, shift, at = value | (b & 0x7F) << shift, shift + 7, at + 1
        if not b & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, int | float | bytes]]:
    """A message's (field number, value): varints as int, fixed32 as float, the rest as bytes."""
    out, at = [], 0
    while at < len(data):
        key, at = _read_varint(data, at)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _read_varint(data, at)
        elif wire == 5:
            value, at = struct.unpack_from("<f", data, at)[0], at + 4
        elif wire == 1:
            value, at = data[at:at + 8], at + 8
        elif wire == 2:
            n, at = _read_varint(data, at)
            value, at = data[at:at + n], at + n
        else:
            raise ValueError(f"a sentencepiece model holds wire type {wire}, which it never writes")
        if at > len(data):
            raise ValueError("a sentencepiece model ends inside a field")
        out.append((num, value))
    return out


def read_sentencepiece(data: bytes) -> SentencePieceModel:
    """The pieces and the trainer/normalizer fields of a serialized ModelProto."""
    model = SentencePieceModel()
    for num, value in _fields(data):
        if num == 1:  # a piece: piece (1), score (2), type (3, NORMAL unless set)
            f = dict(_fields(value))
            model.pieces.append((f.get(1, b"").decode(), float(f.get(2, 0.0)), int(f.get(3, 1))))
        elif num == 2:  # TrainerSpec: model_type (3)
            kind = dict(_fields(value)).get(3, 1)
            model.model_type = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}.get(kind, str(kind))
        elif num == 3:  # NormalizerSpec: name (1), add_dummy_prefix (3), remove_extra_whitespaces (4)
            f = dict(_fields(value))
            model.normalizer = f.get(1, b"").decode()
            model.add_dummy_prefix = bool(f.get(3, True))
            model.remove_extra_whitespaces = bool(f.get(4, True))
    return model
