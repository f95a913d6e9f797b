"""Byte-level BPE (GPT-2 style) and any Hugging Face tokenizer.json, through the `tokenizers`
package, behind the interface of `tinyllm.text.tokenizer.Tokenizer`.

Owns `BPETokenizer`, built three ways:
  * ``BPETokenizer.load(path)`` - a folder holding tokenizer.json (and tokenizer_config.json,
    whose bos_token / eos_token / pad_token name the special ids), or the .json file itself;
  * ``BPETokenizer.from_vocab(...)`` - from GGUF metadata (``tokenizer.ggml.model == "gpt2"``:
    tokens, merges, token types and the pre-tokenizer name);
  * ``BPETokenizer(tokenizers.Tokenizer, bos_id, eos_id, ...)``.

Promises:
  * ``encode(text, bos, eos)`` never adds special tokens by itself; added tokens written in
    the text (``"<|im_start|>"``) encode to their single ids, as Tokenizer's special pieces
    do (no escaping: callers that must keep user text from forging them escape it).
  * ``decode`` drops special tokens (as Tokenizer drops control pieces) and renders invalid
    UTF-8 as U+FFFD, so ``StreamDecoder`` works on it unchanged: StreamDecoder reads
    ``_check_id`` and ``_sp.is_control / is_unknown / is_byte / is_unused``; ``_sp`` here is
    a small adapter answering those from the vocabulary (special added tokens are "control",
    ``<0xAB>`` pieces are byte pieces).
  * ``bos_id`` / ``eos_id`` / ``pad_id`` are None when absent (never -1).
  * ``save(folder)`` writes tokenizer.json + tokenizer_config.json that ``load`` reads back.

Refuses: a missing ``tokenizers`` package (ValueError naming the extra to install), GGUF
pre-tokenizers it does not know (ValueError naming it), ids outside the vocab (ValueError).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

__all__ = ["BPETokenizer", "require_tokenizers"]

_INSTALL = "pip install tokenizers (a dependency of tinyllm-chat since issue 34)"
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# GGUF token types (llama.cpp's llama_token_type)
_CONTROL, _USER_DEFINED = 3, 4
# GGUF `tokenizer.ggml.pre` names -> the split regex in front of the byte-level mapping (the
# original regexes of the models' tokenizer.json, which llama.cpp's llama-vocab.cpp adapts):
# llama-bpe (Llama 3), qwen2 (Qwen 2/2.5/3), gpt-4o (Phi-4-mini). None: GPT-2's own regex.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE = {"default": None, "gpt2": None, "gpt-2": None, "smollm": "digits", "llama-bpe": _LLAMA3_SPLIT,
        "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "gpt-4o": _GPT4O_SPLIT}


def require_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ValueError(f"this model's tokenizer needs the `tokenizers` package: {_INSTALL}") from None
    return tokenizers


class _Kinds:
    """The part of SentencePieceProcessor that StreamDecoder asks about."""

    def __init__(self, special: set[int], unk: int | None, byte_ids: set[int]) -> None:
        self._special, self._unk, self._bytes = special, unk, byte_ids

    def is_control(self, i: int) -> bool:
        return i in self._special

    def is_unknown(self, i: int) -> bool:
        return i == self._unk

    def is_byte(self, i: int) -> bool:
        return i in self._bytes

    def is_unused(self, i: int) -> bool:
        return False


class BPETokenizer:
    """A loaded `tokenizers.Tokenizer` with tinyllm's Tokenizer interface."""

    def __init__(self, tok, bos_id: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, unk_id: int | None = None) -> None:
        self._tok = tok
        self._vocab_size = tok.get_vocab_size(with_added_tokens=True)
        for name, i in (("bos", bos_id), ("eos", eos_id), ("pad", pad_id), ("unk", unk_id)):
            if i is not None and not 0 <= i < self._vocab_size:
                raise ValueError(f"{name} id {i} is outside the vocab [0, {self._vocab_size})")
        self._bos, self._eos, self._pad, self._unk = bos_id, eos_id, pad_id, unk_id
        special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        byte_ids = {i for p, i in tok.get_vocab(with_added_tokens=False).items() if _BYTE_PIECE.fullmatch(p)}
        self._sp = _Kinds(special, unk_id, byte_ids)

    # ---- construction -----------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, bos_token: str | None = None, eos_token: str | None = None,
             pad_token: str | None = None) -> BPETokenizer:
        """tokenizer.json (a folder holding it, or the file); special tokens named by the
        arguments, else by tokenizer_config.json beside it."""
        tokenizers = require_tokenizers()
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {file}")
        try:
            tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise ValueError(f"{file} is not a tokenizer.json the tokenizers package reads ({e})") from None
        cfg_file = file.parent / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        names = {"bos": bos_token or _token_text(cfg.get("bos_token")),
                 "eos": eos_token or _token_text(cfg.get("eos_token")),
                 "pad": pad_token or _token_text(cfg.get("pad_token")),
                 "unk": _token_text(cfg.get("unk_token"))}
        ids = {k: tok.token_to_id(v) if v else None for k, v in names.items()}
        return cls(tok, ids["bos"], ids["eos"], ids["pad"], ids["unk"])

    @classmethod
    def from_vocab(cls, tokens: Sequence[str], merges: Sequence[str], types: Sequence[int] | None = None,
                   pre: str | None = None, bos_id: int | None = None, eos_id: int | None = None,
                   pad_id: int | None = None, unk_id: int | None = None) -> BPETokenizer:
        """A GPT-2 style byte-level BPE from GGUF metadata (tokenizer.ggml.*)."""
        tokenizers = require_tokenizers()
        from tokenizers import AddedToken, decoders, models, pre_tokenizers

        pre = pre or "default"
        if pre not in _PRE:
            raise ValueError(f"GGUF BPE pre-tokenizer {pre!r} is not supported (known: {', '.join(_PRE)})")
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        model = models.BPE(vocab=vocab, merges=pairs, ignore_merges=_PRE[pre] is _LLAMA3_SPLIT)
        tok = tokenizers.Tokenizer(model)
        split = _PRE[pre]
        if split is None:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        elif split == "digits":
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(tokenizers.Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        types = list(types) if types is not None else [1] * len(tokens)
        tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i, t in enumerate(types) if t == _CONTROL])
        tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                        for i, t in enumerate(types) if t == _USER_DEFINED])
        return cls(tok, bos_id, eos_id, pad_id, unk_id)

    def save(self, folder: str | Path) -> None:
        """tokenizer.json + tokenizer_config.json (the special token names) in `folder`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(folder / "tokenizer.json"))
        ids = {"bos": self._bos, "eos": self._eos, "pad": self._pad, "unk": self._unk}
        cfg = {f"{k}_token": self._tok.id_to_token(i) for k, i in ids.items() if i is not None}
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    # ---- the Tokenizer interface ------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def pad_id(self) -> int | None:
        return self._pad

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if bos:
            ids.insert(0, _required(self._bos, "bos"))
        if eos:
            ids.append(_required(self._eos, "eos"))
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        for i in ids:
            self._check_id(i)
        return self._tok.decode(ids, skip_special_tokens=True)

    def piece_to_id(self, piece: str) -> int | None:
        return self._tok.token_to_id(piece)

    def id_to_piece(self, i: int) -> str:
        self._check_id(i)
        return self._tok.id_to_token(i)

    def adds_bos(self) -> bool:
        """Whether tokenizer.json's own post-processor would put BOS in front (HF's
        add_special_tokens=True)."""
        plain = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        return self._bos is not None and len(full) > len(plain) and full[0] == self._bos

    def _check_id(self, i: int) -> None:
        if not 0 <= i < self._vocab_size:
            raise ValueError(f"token id {i} is outside the vocab [0, {self._vocab_size})")


def _required(i: int | None, name: str) -> int:
    if i is None:
        raise ValueError(f"this model has no {name} token; encode with {name}=False")
    return i


def _token_text(v) -> str | None:
    """tokenizer_config.json writes a special token as a string or {"content": ...}."""
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None
