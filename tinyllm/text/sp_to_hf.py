"""A sentencepiece BPE model as a Hugging Face tokenizer.json, built with `tokenizers` alone.

transformers' own slow->fast converter (convert_slow_tokenizer.LlamaConverter) reads the
sentencepiece proto through protobuf, which tinyllm does not depend on; this module builds the
same tokenizer from the proto's pieces (tinyllm.text.sp_proto.read_sentencepiece), so that
engines and transformers load the tokenizer without sentencepiece or protobuf.

Contract: `hf_tokenizer_json(tokenizer, add_bos) -> str` is tokenizer.json for a `Tokenizer`:
a BPE model over the same vocabulary (ids are the sentencepiece ids), merges from the pieces in
score order (transformers' `generate_merges`: every split of a piece into two pieces, ranked by
the piece), byte fallback, `<unk>` as the unknown token; control and user-defined pieces are
added tokens (control ones special, so "<s>" in text is BOS, as tinyllm's Conversation.encode
reads it; user-defined ones, "<|im_start|>", plain, as sentencepiece matches them anywhere);
spaces become "▁" (the normalizer), a leading "▁" is prepended where the model adds a dummy
prefix (as Llama's tokenizer.json does) and stripped again on decode. `add_bos`: the
post-processor puts BOS in front of an encode with special tokens (LlamaTokenizer's default).
For plain text, `encode(text, add_special_tokens=False)` gives sentencepiece's ids
(tests/tinyllm/test_export_hf.py checks mixed text: accents, emoji, code, digits, newlines).
Refuses (ValueError, one line): unigram, word and char models (BPE only), normalizers other
than identity, and models that collapse extra whitespace (neither maps onto these parts).
"""

from __future__ import annotations

from tinyllm.text.bpe_tokenizer import require_tokenizers
from tinyllm.text.sp_proto import read_sentencepiece
from tinyllm.text.tokenizer import Tokenizer

__all__ = ["hf_tokenizer_json"]

_NORMAL, _UNKNOWN, _CONTROL, _USER, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6  # sentencepiece piece types


def hf_tokenizer_json(tokenizer: Tokenizer, add_bos: bool) -> str:
    """tokenizer.json for a sentencepiece BPE tokenizer (the module docstring)."""
    tk = require_tokenizers()
    from tokenizers import AddedToken, decoders, normalizers, processors
    from tokenizers.models import BPE

    proto = read_sentencepiece(tokenizer.serialized())
    if proto.model_type != "bpe":
        raise ValueError(f"tokenizer.model is a {proto.model_type} sentencepiece model; "
                         "the Hugging Face export writes BPE ones only")
    if proto.normalizer not in ("identity", ""):
        raise ValueError(f"tokenizer.model normalizes text ({proto.normalizer}); "
                         "the Hugging Face export writes identity-normalized ones only")
    if proto.remove_extra_whitespaces:
        raise ValueError("tokenizer.model collapses extra whitespace; the Hugging Face export keeps it as is")
    pieces = proto.pieces  # [(piece, score, type)], by id
    vocab = {piece: i for i, (piece, _, _) in enumerate(pieces)}
    mergeable = {piece for piece, _, kind in pieces if kind == _NORMAL}
    unk = next((piece for piece, _, kind in pieces if kind == _UNKNOWN), None)
    model = BPE(vocab=vocab, merges=_merges(pieces, vocab, mergeable), unk_token=unk, fuse_unk=True,
                byte_fallback=True)
    tok = tk.Tokenizer(model)
    spaces = [normalizers.Replace(" ", "▁")]
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), *spaces] if proto.add_dummy_prefix else spaces)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if proto.add_dummy_prefix else steps)
    tok.add_tokens([AddedToken(piece, special=kind != _USER, normalized=False)
                    for piece, _, kind in pieces if kind in (_CONTROL, _USER, _UNKNOWN)])
    bos = tokenizer.bos_id
    if add_bos and bos is not None:
        bos_piece = pieces[bos][0]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos_piece}:0 $A:0",
                                                           pair=f"{bos_piece}:0 $A:0 {bos_piece}:1 $B:1",
                                                           special_tokens=[(bos_piece, bos)])
    return tok.to_str(pretty=True)


def _merges(pieces: list[tuple[str, float, int]], vocab: dict[str, int],
            mergeable: set[str]) -> list[tuple[str, str]]:
    """Every split of a normal piece into two normal pieces, ranked as sentencepiece merges:
    by the piece's score (its id, for a trained BPE model), then the left part's length."""
    out = []
    for piece, score, kind in pieces:
        if kind != _NORMAL:
            continue
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))]
        splits = [(a, b) for a, b in splits if a in mergeable and b in mergeable]
        out += [(-score, vocab[piece], len(a), a, b) for a, b in splits]
    out.sort()
    return [(a, b) for *_, a, b in out]
