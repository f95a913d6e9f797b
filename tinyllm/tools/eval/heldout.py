"""Held-out loss of any model tinyllm opens, measured as `tinyllm.tools.train` measures eval loss.

Contract: `heldout_loss(model, tokenizer, template, data_dir, eval_per_mille=10, rows=None,
batch=8) -> dict` takes the held-out split of data_dir (`data.read_split`: a conversation
is held out by a hash of its line), renders and masks it with the model's own tokenizer and
chat template (`data.tokenize_split`), packs it into rows of 1,025 tokens (BOS at the start
of a row when the template wants one, as training packs), and returns
  nats_per_token   mean cross-entropy over the trained tokens (assistant replies and the
                   stop piece that closes each): the number train.py logs as eval_loss
  nats_per_byte    the same total over the UTF-8 bytes of the assistant replies, so models
                   with different tokenizers (the student and its teacher) compare
  rows, conversations, tokens (trained ones)
`rows` caps the rows evaluated (the first ones; conversations and bytes count only those
rows' conversations). train.py evaluates whole batches of 32 rows (192 of the 202 rows of
tinychat-distill's split); this evaluates every row, so it reads ~0.005 lower on the shipped
model (1.832 here against the card's 1.837).
"""

from __future__ import annotations

import math

import torch

from tinyllm.tools import data


@torch.no_grad()
def heldout_loss(model, tokenizer, template, data_dir: str, eval_per_mille: int = 10,
                 rows: int | None = None, batch: int = 8) -> dict:
    _, held = data.read_split(data_dir, eval_per_mille)
    split = _tokenize(tokenizer, held, template)
    bos = tokenizer.bos_id if template.bos and tokenizer.bos_id is not None else None
    row_len = min(1025, model.cfg.max_seq_len + 1)
    packed = data.pack_rows(split, row_len, tokenizer.pad_id if tokenizer.pad_id is not None else 0, bos)
    n = len(packed) if rows is None else min(rows, len(packed))
    total, count = 0.0, 0
    for i in range(0, n, batch):
        x, y = data.rows_to_batch(packed.tokens[i:i + batch][: n - i], packed.trained[i:i + batch][: n - i])
        x, y = x.to(model.device), y.to(model.device)  # (B, T)
        k = int((y != -100).sum())
        if k:
            _, loss = model(x, targets=y)
            total += float(loss) * k
            count += k
    used = _conversations_in_rows(split, packed, row_len, n, bos)
    nbytes = sum(len(m["content"].encode()) for c in (held[j] for j in used) for m in c if m["role"] == "assistant")
    return {"nats_per_token": total / count if count else math.nan,
            "nats_per_byte": total / nbytes if nbytes else math.nan,
            "rows": n, "conversations": len(used), "tokens": count}


def _tokenize(tokenizer, held, template) -> data.TokenizedSplit:
    """data.tokenize_split for any template object (a GGUF's own too), in this process."""
    ids: list[int] = []
    trained: list[bool] = []
    lens: list[int] = []
    for msgs in held:
        i, t = data.tokenize_conversation(tokenizer, msgs, template)
        ids += i
        trained += t
        lens.append(len(i))
    offsets = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0)
    return data.TokenizedSplit(torch.tensor(ids, dtype=torch.int32), torch.tensor(trained, dtype=torch.bool), offsets)


def _conversations_in_rows(split, packed, row_len: int, n_rows: int, bos) -> list[int]:
    """Indices of the conversations that pack_rows placed in the first n_rows rows."""
    lens = (split.offsets[1:] - split.offsets[:-1]).tolist()
    if bos is not None:
        lens = [k - 1 for k in lens]
    row, _, _ = data.assign_rows(lens, row_len - (1 if bos is not None else 0))
    return [c for c, r in enumerate(row) if r < n_rows]
