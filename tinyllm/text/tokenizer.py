"""Tokenization: train, load and run a sentencepiece model, and stream its output.

Owns:
  * ``train_sentencepiece`` - trains a byte-fallback sentencepiece model from an
    in-memory iterator of texts and writes ``<prefix>.model``.
  * ``Tokenizer`` - a thin wrapper over ``sentencepiece.SentencePieceProcessor``.
  * ``StreamDecoder`` - turns a stream of token ids into text incrementally.

Promises:
  * Models trained here encode any text (unknown characters fall back to UTF-8
    byte pieces ``<0x..>``) and ``decode(encode(text)) == text`` exactly:
    normalization is the identity, whitespace is kept as is, and no dummy
    prefix space is added (so ``encode("<|im_start|>")`` is one id, and
    encodings of adjacent strings concatenate).
  * Fixed special ids: ``<unk>``=0, ``<s>``=1, ``</s>``=2, ``<pad>``=3; the
    ``special_pieces`` follow from id 4 on, in the order given.
  * ``decode`` renders control ids (``<s>``, ``</s>``, ``<pad>``) as nothing,
    ``<unk>`` as " ⁇ ", and invalid byte sequences as U+FFFD per byte.
  * ``bos_id``/``eos_id``/``pad_id`` are ``None`` when a loaded model lacks them
    (never -1, so they cannot slip silently into a tensor).
  * ``StreamDecoder``: the concatenation of every ``push()`` result and the final
    ``flush()`` equals ``Tokenizer.decode(all ids)`` exactly, for any
    sentencepiece model without a denormalizer (with or without leading-space
    stripping). It never emits part of a multi-byte character, and each push
    decodes only a short window of recent ids, so its cost does not grow with
    the stream length.

Refuses:
  * Ids outside ``[0, vocab_size)`` (ValueError), files that are missing
    (FileNotFoundError) or not sentencepiece models (ValueError).
  * Escaping: special pieces are user-defined symbols, so the literal text
    ``<|im_start|>`` inside user content also encodes to the special id.
    Callers that must keep user text from forging special tokens escape it
    themselves.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

__all__ = ["StreamDecoder", "Tokenizer", "train_sentencepiece"]

_BASE_PIECES = ("<unk>", "<s>", "</s>", "<pad>")
_MODEL_TYPES = ("bpe", "unigram", "char", "word")
_CHUNK_CHARS = 4096  # one training "sentence" holds at most this many characters
_REPLACEMENT = "\ufffd"


def _chunks(texts: Iterable[str], size: int) -> Iterator[str]:
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"training texts must be str, got {type(text).__name__}")
        for start in range(0, len(text), size):
            yield text[start : start + size]


def train_sentencepiece(
    texts: Iterable[str],
    model_prefix: str | Path,
    vocab_size: int,
    special_pieces: Sequence[str] = (),
    model_type: str = "bpe",
) -> Path:
    """Train a byte-fallback sentencepiece model and return the ``<prefix>.model`` path.

    Each text is one training sentence (texts longer than 4096 characters are
    cut into chunks, so nothing is silently skipped); the texts are held in
    memory while training. ``vocab_size`` is an upper bound: on a tiny corpus
    the model may come out smaller. It must leave room for the 4 base pieces,
    the 256 byte pieces and ``special_pieces``; if the corpus has more distinct
    characters than fit in the rest, the rarest ones are left to byte fallback.
    """
    special_pieces = list(special_pieces)
    if model_type not in _MODEL_TYPES:
        raise ValueError(f"model_type must be one of {_MODEL_TYPES}, got {model_type!r}")
    bad = [p for p in special_pieces if not p or p in _BASE_PIECES or p.isspace()]
    if bad or len(set(special_pieces)) != len(special_pieces):
        raise ValueError(
            f"special_pieces must be unique, non-blank and not one of {_BASE_PIECES}; got {special_pieces!r}"
        )
    reserved = len(_BASE_PIECES) + len(special_pieces) + 256  # + the byte pieces
    if vocab_size <= reserved:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte fallback needs 256 byte pieces plus "
            f"{reserved - 256} special pieces; use vocab_size > {reserved}"
        )
    sentences = list(_chunks(texts, _CHUNK_CHARS))
    if not any(sentences):
        raise ValueError("no training text: pass a non-empty iterable of non-empty strings")
    sentences = _drop_rare_chars(sentences, room=vocab_size - reserved)
    prefix = Path(model_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_prefix=str(prefix),
            model_type=model_type,
            vocab_size=vocab_size,
            hard_vocab_limit=False,
            byte_fallback=True,
            character_coverage=0.9995,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=3,
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            pad_piece="<pad>",
            user_defined_symbols=special_pieces,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            split_digits=True,
            allow_whitespace_only_pieces=True,
            max_sentence_length=4 * _CHUNK_CHARS,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ValueError(
            f"sentencepiece training failed ({e}); give it more text or a larger vocab_size"
        ) from e
    return prefix.with_name(prefix.name + ".model")


def _drop_rare_chars(sentences: list[str], room: int) -> list[str]:
    """Split ``sentences`` around characters outside the ``room`` most frequent.

    Sentencepiece gives every character it trains on (within its coverage) a
    piece of its own and fails when they do not fit in the vocab. With byte
    fallback the rarest characters can safely go without: they encode as bytes.
    """
    counts: Counter[str] = Counter()
    for sentence in sentences:
        counts.update(sentence)
    if len(counts) <= room:
        return sentences
    keep = "".join(re.escape(ch) for ch, _ in counts.most_common(room))
    rare = re.compile(f"[^{keep}]+")
    return [part for sentence in sentences for part in rare.split(sentence) if part]


class Tokenizer:
    """A loaded sentencepiece model. Build with ``load`` or ``from_serialized``."""

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        self._sp = processor

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"no tokenizer model at {path}; train one with train_sentencepiece() or fix the path"
            )
        return cls._parse(path.read_bytes(), str(path))

    @classmethod
    def from_serialized(cls, data: bytes) -> Tokenizer:
        return cls._parse(bytes(data), "the given bytes")

    @classmethod
    def _parse(cls, data: bytes, origin: str) -> Tokenizer:
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(data)
        except RuntimeError as e:
            raise ValueError(
                f"{origin} is not a sentencepiece model ({e}); pass the .model file written by training"
            ) from e
        if sp.get_piece_size() == 0:
            raise ValueError(f"{origin} is a sentencepiece model with no pieces; retrain it")
        return cls(sp)

    def serialized(self) -> bytes:
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def bos_id(self) -> int | None:
        return _present(self._sp.bos_id())

    @property
    def eos_id(self) -> int | None:
        return _present(self._sp.eos_id())

    @property
    def pad_id(self) -> int | None:
        return _present(self._sp.pad_id())

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        ids = self._sp.encode(text, out_type=int)
        if bos:
            ids.insert(0, self._required(self.bos_id, "bos"))
        if eos:
            ids.append(self._required(self.eos_id, "eos"))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        for i in ids:
            self._check_id(i)
        return self._sp.decode(ids)

    def piece_to_id(self, piece: str) -> int | None:
        """The id of ``piece``, or None if it is not in the vocab (``"<unk>"`` itself is)."""
        i = self._sp.piece_to_id(piece)
        if not 0 <= i < self.vocab_size:  # a vocab with no unknown piece answers -1
            return None
        return None if self._sp.is_unknown(i) and self._sp.id_to_piece(i) != piece else i

    def id_to_piece(self, i: int) -> str:
        self._check_id(i)
        return self._sp.id_to_piece(i)

    def _check_id(self, i: int) -> None:
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} is outside the vocab [0, {self.vocab_size})")

    @staticmethod
    def _required(i: int | None, name: str) -> int:
        if i is None:
            raise ValueError(f"this model has no {name} piece; encode with {name}=False")
        return i


def _present(i: int) -> int | None:
    return i if i >= 0 else None


class StreamDecoder:
    """Incremental detokenizer: ``push`` ids one by one, ``flush`` at the end.

    Keeps a window ``ids[prefix:]`` of recent ids. ``ids[prefix:read]`` were
    already emitted (kept as left context), ``ids[read:]`` are pending. Each push
    decodes the window with and without the pending ids and emits the
    difference, unless it ends in U+FFFD (an incomplete UTF-8 character made of
    byte pieces): then it waits. Once more than ``_MAX_PENDING`` ids are held, it
    emits up to the latest split point that more ids can no longer change, so a
    run of genuinely invalid bytes comes out as U+FFFD, exactly as ``decode``
    renders it, and the window stays short.

    Sentencepiece drops the leading space of the first visible piece of a
    decode. To decode a window that starts mid-stream the same way the full
    decode does, the window is prefixed with an "anchor" piece with visible text,
    whose text is then cut off. Until some text has been emitted the window
    stays anchored at the stream start, where the stripping rule does apply.

    After ``flush`` the stream is over; call ``reset`` to start another.
    """

    _MAX_PENDING = 4  # a UTF-8 character is at most 4 byte pieces

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._anchor = _find_anchor(tokenizer)
        self._anchor_len = len(tokenizer.decode([self._anchor]))
        self.reset()

    def reset(self) -> None:
        self._ids: list[int] = []
        self._read = 0  # ids[:read] of the window are emitted
        self._mid_stream = False  # window starts after visible text: decode with the anchor
        self._emitted_any = False

    def push(self, token_id: int) -> str:
        token_id = int(token_id)
        self._tok._check_id(token_id)
        if not self._mid_stream and not self._ids and self._tok._sp.is_control(token_id):
            return ""  # leading <s>/<pad>: invisible, and nothing before it to affect
        self._ids.append(token_id)
        prefix = self._text(self._ids[: self._read])
        full = self._text(self._ids)
        if not full.startswith(prefix):  # cannot happen for sentencepiece; wait to be safe
            return ""
        delta = full[len(prefix) :]
        if not delta.endswith(_REPLACEMENT):
            return self._emit(len(self._ids), delta)
        if len(self._ids) - self._read > self._MAX_PENDING:
            return self._emit_settled(prefix, full)
        return ""

    def flush(self) -> str:
        prefix = self._text(self._ids[: self._read])
        full = self._text(self._ids)
        return self._emit(len(self._ids), full[len(prefix) :])

    def _emit_settled(self, prefix: str, full: str) -> str:
        # A split at `cut` is final once every byte before it has its next 3
        # bytes present (cut <= n - 3) and decoding both sides separately gives
        # the same text as decoding them together.
        n = len(self._ids)
        for cut in range(n - 3, self._read, -1):
            left = self._text(self._ids[:cut])
            right = self._decode_mid(self._ids[cut:])
            if left.startswith(prefix) and left + right == full:
                return self._emit(cut, left[len(prefix) :])
        return ""

    def _emit(self, upto: int, text: str) -> str:
        """Mark window ids[:upto] as emitted (their new text is `text`) and slide the window."""
        if self._emitted_any:  # visible text precedes ids[read:], so they can start the window
            self._ids = self._ids[self._read :]
            upto -= self._read
            self._mid_stream = True
        self._read = upto
        self._emitted_any = self._emitted_any or bool(text)
        return text

    def _text(self, ids: list[int]) -> str:
        return self._decode_mid(ids) if self._mid_stream else self._tok.decode(ids)

    def _decode_mid(self, ids: list[int]) -> str:
        """Decode `ids` as they read after visible text (no leading-space stripping)."""
        return self._tok.decode([self._anchor, *ids])[self._anchor_len :]


def _find_anchor(tokenizer: Tokenizer) -> int:
    """A plain piece whose decoded text is non-empty."""
    sp = tokenizer._sp
    for i in range(tokenizer.vocab_size):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.is_unused(i):
            continue
        if tokenizer.decode([i]):
            return i
    raise ValueError("this model has no piece with visible text; StreamDecoder cannot use it")
