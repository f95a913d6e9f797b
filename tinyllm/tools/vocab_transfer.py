"""Move a teacher model onto a new sentencepiece vocabulary: `tinyllm vocab-transfer`.

    tinyllm vocab-transfer --teacher data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --tokenizer runs/tok16384 --out runs/transfer

Contract:
- `piece_bytes(tok, i)`: the UTF-8 bytes a sentencepiece piece stands for ("▁" is a space, a
  byte piece `<0xNN>` is that byte); None for a control or user-defined piece.
- `teacher_bytes(tok)`: {bytes: id} of a byte-level BPE tokenizer (GPT-2's byte-to-unicode
  alphabet, SmolLM2's), its special tokens left out.
- `transfer_embedding(teacher_emb, teacher_tok, student_tok, specials)` -> (emb, counts): row i of
  the new (V_student, D) table is
    the teacher's row of the one token whose bytes equal piece i's bytes ("exact"), else
    the mean of the teacher's rows of the tokens that piece i's text encodes to ("mean"; a byte
    piece takes the teacher's token for that byte), else
    the teacher's row that `specials` names for a control or user-defined piece ("special";
    `<|im_start|>` / `<|im_end|>` take the teacher's own, BOS/EOS/PAD/UNK its end-of-text),
    else (a byte piece for a byte the teacher has no token for) the mean of all its rows ("none").
- `transfer(teacher, tokenizer, out)` opens the teacher GGUF dequantized (fp32), keeps every
  other weight as it is, ties the head to the new table and writes a tinyllm checkpoint folder
  (fp32, ChatML) that `tinyllm train model --init OUT` fine-tunes.
Refuses (ValueError, one line, exit 2): a teacher without a byte-level BPE vocabulary, a
special piece the teacher lacks.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from tinyllm.text.tokenizer import Tokenizer

SPECIALS = {"<|im_start|>": "<|im_start|>", "<|im_end|>": "<|im_end|>",
            "<s>": "<|endoftext|>", "</s>": "<|endoftext|>", "<pad>": "<|endoftext|>", "<unk>": "<|endoftext|>"}
MAX_SEQ_LEN = 2048  # the moved model's context (the teacher's is 8,192; the app's cache is sized by it)


@cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable character that stands for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def teacher_bytes(tok) -> dict[bytes, int]:
    """{bytes: id} for every teacher token spelled in the byte-level alphabet (specials skipped)."""
    alphabet, out = _byte_of_char(), {}
    for i in range(tok.vocab_size):
        piece = tok.id_to_piece(i)
        if piece and not tok._sp.is_control(i) and all(c in alphabet for c in piece):
            out.setdefault(bytes(alphabet[c] for c in piece), i)
    if len(out) < 256:
        raise ValueError(f"the teacher's vocabulary is not byte-level BPE ({len(out)} byte-spelled tokens)")
    return out


def piece_bytes(tok: Tokenizer, i: int) -> bytes | None:
    piece = tok.id_to_piece(i)
    if i in (tok.bos_id, tok.eos_id, tok.pad_id) or piece in SPECIALS:
        return None
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode()


@torch.no_grad()
def transfer_embedding(teacher_emb: Tensor, teacher_tok, student_tok: Tokenizer,
                       specials: dict[str, str] = SPECIALS) -> tuple[Tensor, dict[str, int]]:
    """teacher_emb (V_t, D) -> (V_s, D) fp32, and how many rows each rule made."""
    whole = teacher_bytes(teacher_tok)
    emb = torch.zeros(student_tok.vocab_size, teacher_emb.shape[1])  # (V_s, D)
    counts = {"exact": 0, "mean": 0, "special": 0, "none": 0}
    for i in range(student_tok.vocab_size):
        b = piece_bytes(student_tok, i)
        if b is None:
            name = specials.get(student_tok.id_to_piece(i), "<|endoftext|>")
            j = teacher_tok.piece_to_id(name)
            if j is None:
                raise ValueError(f"the teacher has no {name!r} token for the piece {student_tok.id_to_piece(i)!r}")
            emb[i], kind = teacher_emb[j].float(), "special"
        elif b in whole:
            emb[i], kind = teacher_emb[whole[b]].float(), "exact"
        elif ids := teacher_tok.encode(b.decode(errors="ignore")):
            emb[i], kind = teacher_emb[ids].float().mean(0), "mean"
        else:  # a byte the teacher never spells (control bytes): the mean of all its rows
            emb[i], kind = teacher_emb.float().mean(0), "none"
        counts[kind] += 1
    return emb, counts


def transfer(teacher: str | Path, tokenizer: str | Path, out: str | Path, name: str | None = None) -> dict:
    """Write the moved model to OUT; returns a report (rows by rule, sizes)."""
    from tinyllm.formats.build import build_transformer
    from tinyllm.formats.checkpoint import save_checkpoint
    from tinyllm.formats.gguf import load_gguf
    from tinyllm.tools.train import resolve_tokenizer

    student = Tokenizer.load(resolve_tokenizer(str(tokenizer)))
    model, teacher_tok, _, teacher_name = load_gguf(teacher, "cpu", torch.float32, quant="none")
    emb, counts = transfer_embedding(model.tok_emb.weight, teacher_tok, student)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("lm_head.")}
    state["tok_emb.weight"] = emb
    cfg = type(model.cfg).from_dict({**model.cfg.to_dict(), "vocab_size": student.vocab_size,
                                     "max_seq_len": MAX_SEQ_LEN, "tie_embeddings": True})
    moved = build_transformer(cfg, state, torch.device("cpu"), torch.float32, "none")
    chat = {"template": "chatml", "stop": ["<|im_end|>"]}
    save_checkpoint(moved, student, out, name=name or Path(out).name, chat=chat, shard_mb=200, dtype=torch.float32)
    return {"event": "transfer", "teacher": teacher_name, "student_vocab": student.vocab_size,
            "teacher_vocab": teacher_tok.vocab_size, **counts, "params": moved.num_params(), "out": str(out)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tinyllm vocab-transfer", description=__doc__.split("\n")[0])
    ap.add_argument("--teacher", required=True, help="the teacher GGUF (byte-level BPE vocabulary)")
    ap.add_argument("--tokenizer", required=True, help="the new tokenizer.model, or a folder holding one")
    ap.add_argument("--out", required=True, help="the tinyllm checkpoint folder to write")
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    try:
        print(json.dumps(transfer(args.teacher, args.tokenizer, args.out, args.name)), flush=True)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
