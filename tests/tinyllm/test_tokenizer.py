"""Tests for tinyllm.text.tokenizer: training, round trips, special pieces, streaming."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import sentencepiece as spm

from tinyllm.text.tokenizer import StreamDecoder, Tokenizer, train_sentencepiece

SPECIALS = ["<|im_start|>", "<|im_end|>"]

CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "A small language model learns to predict the next token.",
    "Tokenizers turn text into ids, and ids back into text.",
    "Numbers like 42, 3.14159 and 2024-06-01 should split into digits.",
    "Multiple   spaces    stay   as    they   are.",
    "Line one\nLine two\n\nAfter a blank line.",
    "Café au lait, a naïve façade, and Zürich in the spring.",
    "Ærøskøbing, São Paulo, señor, élève, Ångström.",
    "日本語のテキストを少し書きます。",
    "中文文本也可以被编码。",
    "Emoji time: 🙂 🚀 👍🏽 and more 🙂🙂.",
    "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\nFine, thanks!<|im_end|>",
    "\tIndented with a tab, then trailing spaces   ",
]

UNSEEN_TEXTS = [
    "鬱蒼とした森で龍が眠る",  # CJK characters absent from the corpus
    "🦀🧬🪐 unseen emoji",  # 4-byte characters absent from the corpus
    "Ωμέγα και Привет, мир!",  # Greek and Cyrillic
    "  two leading spaces, three trailing   ",
    "\n\nstarts with newlines\r\nand has CRLF",
    "",
]


def _corpus() -> list[str]:
    return CORPUS_LINES * 8  # a few KB


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    prefix = tmp_path_factory.mktemp("spm") / "tiny"
    path = train_sentencepiece(_corpus(), prefix, vocab_size=500, special_pieces=SPECIALS)
    assert path == prefix.with_name("tiny.model") and path.is_file()
    return Tokenizer.load(path)


@pytest.fixture(scope="module")
def stripping_tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A model trained with sentencepiece defaults (dummy prefix, whitespace
    squeezing, which makes decode drop leading spaces) and no <s>/<pad>."""
    prefix = tmp_path_factory.mktemp("spm_default") / "default"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()),
        model_prefix=str(prefix),
        vocab_size=450,
        byte_fallback=True,
        hard_vocab_limit=False,
        bos_id=-1,
        minloglevel=2,
    )
    return Tokenizer.load(f"{prefix}.model")


def _is_byte_piece(tok: Tokenizer, i: int) -> bool:
    piece = tok.id_to_piece(i)
    return piece.startswith("<0x") and piece.endswith(">")


def _stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    sd = StreamDecoder(tok)
    return [sd.push(i) for i in ids] + [sd.flush()]


def _assert_clean_pieces(pieces: list[str], text: str) -> None:
    for p in pieces:
        assert "\ufffd" not in p
        p.encode("utf-8")  # strict: raises on a lone surrogate
    assert b"".join(p.encode("utf-8") for p in pieces) == text.encode("utf-8")


# --- training and the Tokenizer ---------------------------------------------


def test_fixed_ids_and_vocab(tok: Tokenizer) -> None:
    assert 260 + len(SPECIALS) < tok.vocab_size <= 500
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 3)
    assert [tok.id_to_piece(i) for i in range(6)] == ["<unk>", "<s>", "</s>", "<pad>", *SPECIALS]


@pytest.mark.parametrize("text", CORPUS_LINES + UNSEEN_TEXTS)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("text", UNSEEN_TEXTS[:3])
def test_unseen_characters_use_byte_fallback(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert any(_is_byte_piece(tok, i) for i in ids)
    assert 0 not in ids  # never <unk>
    assert tok.decode(ids) == text


def test_special_pieces_are_single_ids(tok: Tokenizer) -> None:
    start, end = tok.piece_to_id("<|im_start|>"), tok.piece_to_id("<|im_end|>")
    assert (start, end) == (4, 5)
    assert tok.encode("<|im_start|>") == [start]
    assert tok.encode("<|im_end|>") == [end]
    text = "<|im_start|>user\nBonjour, café?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids[0] == start and ids.count(start) == 2 and ids.count(end) == 1
    assert tok.decode(ids) == text


def test_bos_eos(tok: Tokenizer) -> None:
    plain = tok.encode("hello there")
    assert tok.encode("hello there", bos=True) == [1, *plain]
    assert tok.encode("hello there", eos=True) == [*plain, 2]
    assert tok.encode("hello there", bos=True, eos=True) == [1, *plain, 2]
    assert tok.decode([1, *plain, 2, 3]) == "hello there"


def test_missing_bos_is_none_and_refused(stripping_tok: Tokenizer) -> None:
    assert stripping_tok.bos_id is None and stripping_tok.pad_id is None
    assert stripping_tok.eos_id == 2
    with pytest.raises(ValueError, match="no bos piece"):
        stripping_tok.encode("hi", bos=True)


def test_piece_lookup(tok: Tokenizer) -> None:
    assert tok.piece_to_id("definitely-not-a-piece") is None
    assert tok.piece_to_id("<unk>") == 0
    assert tok.piece_to_id("<0xE4>") is not None
    for i in range(tok.vocab_size):
        assert tok.piece_to_id(tok.id_to_piece(i)) == i
    for bad in (-1, tok.vocab_size):
        with pytest.raises(ValueError, match="outside the vocab"):
            tok.id_to_piece(bad)
        with pytest.raises(ValueError, match="outside the vocab"):
            tok.decode([5, bad])


def test_serialized_round_trip(tok: Tokenizer) -> None:
    copy = Tokenizer.from_serialized(tok.serialized())
    assert copy.vocab_size == tok.vocab_size
    for text in CORPUS_LINES + UNSEEN_TEXTS:
        assert copy.encode(text) == tok.encode(text)


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train_sentencepiece"):
        Tokenizer.load(tmp_path / "missing.model")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"this is not a sentencepiece model")
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        Tokenizer.load(junk)
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="sentencepiece model"):
        Tokenizer.load(empty)
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        Tokenizer.from_serialized(b"\x00\x01garbage")


def test_small_vocab_leaves_rare_characters_to_bytes(tmp_path: Path) -> None:
    # ~100 distinct characters but room for only ~38 character pieces
    small = Tokenizer.load(train_sentencepiece(_corpus(), tmp_path / "small", 300, SPECIALS))
    assert small.vocab_size <= 300
    assert small.encode("<|im_start|>") == [4]
    for text in CORPUS_LINES + UNSEEN_TEXTS:
        assert small.decode(small.encode(text)) == text


def test_train_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        train_sentencepiece(_corpus(), tmp_path / "m", vocab_size=100)
    with pytest.raises(ValueError, match="special_pieces"):
        train_sentencepiece(_corpus(), tmp_path / "m", 500, special_pieces=["<x>", "<x>"])
    with pytest.raises(ValueError, match="model_type"):
        train_sentencepiece(_corpus(), tmp_path / "m", 500, model_type="wordpiece")
    with pytest.raises(ValueError, match="no training text"):
        train_sentencepiece(["", ""], tmp_path / "m", 500)


# --- StreamDecoder -----------------------------------------------------------


@pytest.mark.parametrize("text", CORPUS_LINES + UNSEEN_TEXTS)
def test_stream_matches_decode_and_never_splits_chars(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text, bos=True, eos=True)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == text
    _assert_clean_pieces(pieces, text)


def test_stream_holds_back_partial_character(tok: Tokenizer) -> None:
    ids = tok.encode("鬱")
    assert len(ids) == 3 and all(_is_byte_piece(tok, i) for i in ids)
    sd = StreamDecoder(tok)
    assert [sd.push(i) for i in ids] == ["", "", "鬱"]
    assert sd.flush() == ""


def test_stream_leading_spaces_and_newlines(tok: Tokenizer) -> None:
    text = "  hi\n\n  there   "
    pieces = _stream(tok, tok.encode(text))
    assert "".join(pieces) == text
    assert pieces[0].startswith(" ")


@pytest.mark.parametrize("text", ["Hello world", "  spaced  out  ", "café 鬱 🦀\n next line"])
def test_stream_with_leading_space_stripping_model(stripping_tok: Tokenizer, text: str) -> None:
    ids = stripping_tok.encode(text)
    eos = stripping_tok.eos_id
    assert stripping_tok.id_to_piece(ids[0]).startswith("▁")  # decode drops this space
    for seq in (ids, [eos, *ids], [*ids, eos, *ids], [*ids[:2], eos, *ids[2:]]):
        pieces = _stream(stripping_tok, seq)
        expected = stripping_tok.decode(seq)
        assert "".join(pieces) == expected
        _assert_clean_pieces(pieces, expected)


def _decode_spy(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the length of every decode call the stream makes on `tok`."""
    sizes: list[int] = []
    real = tok.decode

    def spy(ids):  # type: ignore[no-untyped-def]
        ids = list(ids)
        sizes.append(len(ids))
        return real(ids)

    monkeypatch.setattr(tok, "decode", spy)
    return sizes


def test_long_stream_is_correct_and_bounded(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "\n".join(CORPUS_LINES + UNSEEN_TEXTS[:-1]) * 12
    ids = tok.encode(text)
    assert len(ids) > 3000
    sizes = _decode_spy(tok, monkeypatch)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == text
    _assert_clean_pieces(pieces, text)
    assert max(sizes) <= 16  # a short window per push, not the whole history


def test_stream_invalid_bytes_come_out_as_replacement(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    byte = lambda b: tok.piece_to_id(f"<0x{b:02X}>")  # noqa: E731
    a = tok.encode("a")
    cases = [
        [byte(0xE4), byte(0xB8)],  # truncated 3-byte character at the end
        [byte(0xE4), byte(0xB8), *a],  # truncated, then ASCII
        [byte(0xFF), byte(0xE4), byte(0xB8), byte(0xAD)],  # junk then a valid 中
        [byte(0xED), byte(0xA0), byte(0x80), *a],  # an encoded surrogate is invalid
        # a literal U+FFFD (EF BF BD) amid junk: only the split 80|EF.. is safe
        [byte(0x80), byte(0xEF), byte(0xBF), byte(0xBD), byte(0x80), byte(0x80), byte(0x80)],
        # junk, then 中 arriving byte by byte: the run must not be split inside 中
        [byte(0x80), byte(0x80), byte(0x80), byte(0xE4), byte(0xB8), byte(0xAD)],
        [byte(0x80)] * 200,  # a long run of stray continuation bytes
    ]
    expected = [tok.decode(ids) for ids in cases]
    assert expected[0] == "\ufffd\ufffd"
    sizes = _decode_spy(tok, monkeypatch)
    for ids, want in zip(cases, expected, strict=True):
        sd = StreamDecoder(tok)
        pushed = [sd.push(i) for i in ids]
        assert "".join(pushed) + sd.flush() == want
    assert len("".join(pushed)) >= 190  # the junk run streams out, it is not held to the end
    assert max(sizes) <= 16


def test_stream_random_ids_match_decode(tok: Tokenizer, stripping_tok: Tokenizer) -> None:
    rng = random.Random(1234)
    for t in (tok, stripping_tok):
        bytes_ids = [i for i in range(t.vocab_size) if _is_byte_piece(t, i)]
        # bytes that start, continue or complete the characters 中, U+FFFD and 🙂
        tricky = [t.piece_to_id(f"<0x{b:02X}>") for b in (0x80, 0x82, 0x99, 0x9F, 0xAD, 0xB8, 0xBD, 0xBF, 0xE4, 0xEF, 0xF0)]
        sd = StreamDecoder(t)
        for _ in range(600):
            pool = [tricky, bytes_ids, range(t.vocab_size)]
            ids = [rng.choice(rng.choice(pool)) for _ in range(rng.randint(0, 24))]
            sd.reset()
            out = "".join(sd.push(i) for i in ids) + sd.flush()
            assert out == t.decode(ids), ids


def test_leading_control_ids_do_not_grow_the_window(
    tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [tok.bos_id, *[tok.pad_id] * 100, *tok.encode("hi 鬱")]
    sizes = _decode_spy(tok, monkeypatch)
    assert "".join(_stream(tok, ids)) == "hi 鬱"
    assert max(sizes) <= 16


def test_stream_reset_and_bad_id(tok: Tokenizer) -> None:
    sd = StreamDecoder(tok)
    for i in tok.encode("鬱")[:2]:
        sd.push(i)
    sd.reset()
    ids = tok.encode("fresh start")
    assert "".join(sd.push(i) for i in ids) + sd.flush() == "fresh start"
    with pytest.raises(ValueError, match="outside the vocab"):
        sd.push(tok.vocab_size)


def test_a_gguf_vocabulary_with_gemma_s_special_pieces_keeps_bos_and_eos():
    """Gemma's GGUF names its specials <bos>/<eos>/<unk>/<pad> (sentencepiece looks bos_id up by
    the piece's name, "<s>" unless the proto names it): BOS was lost, and Gemma without it rambles."""
    from tinyllm.text.sp_proto import sentencepiece_proto

    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "▁a", "▁b", "a", "b", "▁"]
    proto = sentencepiece_proto(tokens, [0.0] * 4 + [-1.0] * 5, [3, 3, 3, 2, 1, 1, 1, 1, 1], 3, 2, 1, 0, True)
    tok = Tokenizer.from_serialized(proto)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (2, 1, 0)
    assert tok.encode("a b", bos=True)[0] == 2
