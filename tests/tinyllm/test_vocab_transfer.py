"""tinyllm.tools.vocab_transfer: each piece of a new sentencepiece vocabulary gets the teacher's row of
the one token that spells it, else the mean of the rows of the tokens its text encodes to; the
special pieces take the teacher's ChatML and end-of-text rows. Teacher: a small byte-level BPE
(GPT-2 style, SmolLM2's kind); student: a small sentencepiece model, both trained here."""

from __future__ import annotations

import pytest
import torch

from tests.tinyllm.formats_common import need, train_bpe
from tinyllm.text.tokenizer import Tokenizer, train_sentencepiece
from tinyllm.tools.testing import CHAT_TEXT
from tinyllm.tools.vocab_transfer import piece_bytes, teacher_bytes, transfer_embedding


@pytest.fixture(scope="module")
def teacher():
    need("tokenizers")
    from tinyllm.text.bpe_tokenizer import BPETokenizer

    return BPETokenizer(train_bpe())


@pytest.fixture(scope="module")
def student(tmp_path_factory) -> Tokenizer:
    path = train_sentencepiece(CHAT_TEXT.splitlines() * 5, tmp_path_factory.mktemp("sp") / "sp", 600,
                               ("<|im_start|>", "<|im_end|>"))
    return Tokenizer.load(path)


def test_rows_are_the_teachers_exact_row_or_the_mean_of_its_spelling(teacher, student):
    emb_t = torch.randn(teacher.vocab_size, 16)  # (V_t, D)
    emb, counts = transfer_embedding(emb_t, teacher, student)
    assert emb.shape == (student.vocab_size, 16)
    whole = teacher_bytes(teacher)
    exact = mean = 0
    for i in range(student.vocab_size):
        b = piece_bytes(student, i)
        if b is None:
            continue
        if b in whole:
            assert torch.equal(emb[i], emb_t[whole[b]]), student.id_to_piece(i)
            exact += 1
        elif ids := teacher.encode(b.decode(errors="ignore")):
            assert len(ids) > 1 and torch.allclose(emb[i], emb_t[ids].mean(0)), student.id_to_piece(i)
            mean += 1
    assert exact == counts["exact"] > 100 and mean == counts["mean"] > 10, counts
    # A byte piece is its byte: <0x41> is the teacher's "A".
    a = student.piece_to_id("<0x41>")
    assert piece_bytes(student, a) == b"A" and torch.equal(emb[a], emb_t[teacher.piece_to_id("A")])


def test_special_pieces_take_the_teachers_chatml_and_end_of_text_rows(teacher, student):
    emb_t = torch.randn(teacher.vocab_size, 8)
    emb, counts = transfer_embedding(emb_t, teacher, student)
    for piece, name in (("<|im_start|>", "<|im_start|>"), ("<|im_end|>", "<|im_end|>"), ("<s>", "<|endoftext|>"),
                        ("</s>", "<|endoftext|>")):
        assert torch.equal(emb[student.piece_to_id(piece)], emb_t[teacher.piece_to_id(name)]), piece
    assert counts["special"] == 6  # unk, bos, eos, pad and the two ChatML pieces
    # A teacher without a piece the map names is refused, not filled with zeros.
    with pytest.raises(ValueError, match="no '<nope>' token"):
        transfer_embedding(emb_t, teacher, student, {"<|im_start|>": "<nope>"})


def test_piece_bytes_spell_spaces_and_leave_controls_out(student):
    assert piece_bytes(student, student.bos_id) is None and piece_bytes(student, student.eos_id) is None
    spaced = next(i for i in range(student.vocab_size) if student.id_to_piece(i).startswith("\u2581")
                  and len(student.id_to_piece(i)) > 1)
    assert piece_bytes(student, spaced) == student.id_to_piece(spaced).replace("\u2581", " ").encode()
