"""Chat training data: read, split, render, train the tokenizer, tokenize, cache, pack, batch.

Contract:
- Input: a folder of `*.jsonl.xz` files, one conversation a line:
  {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...], ...}.
- Split: a conversation is held out for eval when a hash of its raw line falls in the first
  `eval_per_mille` of 1000 buckets (blake2b), so the split never depends on file order.
- Render + mask: each conversation is rendered with a chat template (`chat_template.py`,
  ChatML by default) as the segments ChatSession encodes at inference, each encoded alone:
      BOS | system | user + assistant prefix | assistant content | "<|im_end|>" | "\n" | ...
  Only the assistant content ids and the stop piece that closes them ("<|im_end|>") are
  trained; BOS, system, user turns, role headers and the newline after the stop are not.
  A token is "trained" when it is a target: for row tokens r (T+1), x = r[:-1] and
  y[t] = r[t+1] where r[t+1] is trained, else -100.
- Cache: the flat tokenized splits are written once to `<cache_dir>/tokens-<key>.pt` (plain
  torch tensors), keyed by the tokenizer bytes, the data files (name, size, mtime), the
  template and the split, so a second run does not re-tokenize.
- Packing: whole conversations are packed best-fit (longest first) into rows of T+1 tokens;
  the rest of a row is padding (pad id, never trained). A conversation never spans two rows,
  so every answer sees its question; one longer than a row is truncated (counted).
  With `bos_id`, a row starts with BOS and the conversations in it follow without one, so a
  row reads as one long multi-turn chat on changing topics: the model learns to answer the
  latest turn, as the app asks it to (plain causal attention, so the flash kernel runs).
- Batches: rows live on the training device; `RowSampler` walks a fresh permutation per
  epoch (seeded by seed and epoch, so a resumed run continues the same order).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import lzma
import os
import random
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from tinyllm.text.chat_template import ChatTemplate, get_template
from tinyllm.text.tokenizer import Tokenizer, train_sentencepiece

CACHE_VERSION = 1  # bump when the rendering or the cache layout changes
SPECIAL_PIECES = ("<|im_start|>", "<|im_end|>")

Messages = list[dict]


# ---- reading and splitting ------------------------------------------------------------

def data_files(data_dir: str | Path) -> list[Path]:
    data_dir = Path(data_dir)
    files = sorted(data_dir.glob("*.jsonl.xz"))
    if not files:
        raise FileNotFoundError(f"no *.jsonl.xz files in {data_dir}; copy the tinychat-distill files "
                                "there or pass --data DIR")
    return files


def is_eval(line: bytes, eval_per_mille: int) -> bool:
    h = int.from_bytes(hashlib.blake2b(line.strip(), digest_size=8).digest(), "little")
    return h % 1000 < eval_per_mille


def read_split(data_dir: str | Path, eval_per_mille: int = 10,
               limit: int | None = None) -> tuple[list[Messages], list[Messages]]:
    """(train, eval) conversations, each a list of {"role", "content"} messages."""
    train: list[Messages] = []
    held: list[Messages] = []
    for path in data_files(data_dir):
        with lzma.open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                (held if is_eval(line, eval_per_mille) else train).append(_messages(line, path))
                if limit is not None and len(train) + len(held) >= limit:
                    return train, held
    return train, held


def _messages(line: bytes, path: Path) -> Messages:
    try:
        msgs = json.loads(line)["messages"]
        assert all(m["role"] in ("system", "user", "assistant") and isinstance(m["content"], str)
                   for m in msgs)
    except (json.JSONDecodeError, KeyError, TypeError, AssertionError):
        raise ValueError(f"{path} has a line that is not a conversation: {line[:80]!r}") from None
    return msgs


# ---- rendering and tokenizing ---------------------------------------------------------

def render_segments(messages: Messages, template: ChatTemplate) -> list[tuple[str, bool]]:
    """(text, trained) segments of one conversation, BOS excluded. The user turn and the
    assistant prefix that follows it are one segment, as ChatSession encodes them."""
    assert template.stop, f"template {template.name} has no stop piece to train"
    stop = template.stop[0]
    segs: list[tuple[str, bool]] = []
    system = None
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if role == "system":
            if template.system_in_first_user:
                system = content
            else:
                segs.append((template.render_system(content), False))
        elif role == "user":
            segs.append((template.render_user(content, system) + template.assistant_prefix, False))
            system = None
        else:
            if i == 0 or messages[i - 1]["role"] != "user":
                segs.append((template.assistant_prefix, False))
            segs.append((content, True))
            head, sep, tail = template.assistant_suffix.partition(stop)
            assert sep and not head, f"template {template.name}: suffix must start with {stop!r}"
            segs.append((stop, True))
            if tail:
                segs.append((tail, False))
    return segs


def tokenize_conversation(tok: Tokenizer, messages: Messages,
                          template: ChatTemplate) -> tuple[list[int], list[bool]]:
    """Token ids of one conversation (BOS first when the template wants it) and, per id,
    whether it is trained (predicted with loss)."""
    ids: list[int] = [tok.bos_id] if template.bos and tok.bos_id is not None else []
    trained: list[bool] = [False] * len(ids)
    for text, train in render_segments(messages, template):
        seg = tok.encode(text)
        ids += seg
        trained += [train] * len(seg)
    return ids, trained


@dataclass
class TokenizedSplit:
    ids: Tensor  # (N,) int32: every conversation's ids, concatenated
    trained: Tensor  # (N,) bool: id is a training target
    offsets: Tensor  # (C + 1,) int64: conversation c is ids[offsets[c]:offsets[c + 1]]

    def to_dict(self) -> dict[str, Tensor]:
        return {"ids": self.ids, "trained": self.trained, "offsets": self.offsets}

    @property
    def n_conversations(self) -> int:
        return len(self.offsets) - 1


def _tokenize_chunk(args: tuple[bytes, list[Messages], str]) -> tuple[list[int], list[bool], list[int]]:
    tok_bytes, convs, template_name = args
    tok, template = Tokenizer.from_serialized(tok_bytes), get_template(template_name)
    ids: list[int] = []
    trained: list[bool] = []
    lens: list[int] = []
    for msgs in convs:
        i, t = tokenize_conversation(tok, msgs, template)
        ids += i
        trained += t
        lens.append(len(i))
    return ids, trained, lens


def tokenize_split(tok: Tokenizer, convs: list[Messages], template_name: str = "chatml",
                   workers: int = 1, chunk: int = 2000) -> TokenizedSplit:
    jobs = [(tok.serialized(), convs[i:i + chunk], template_name) for i in range(0, len(convs), chunk)]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
            parts = list(pool.map(_tokenize_chunk, jobs))
    else:
        parts = [_tokenize_chunk(j) for j in jobs]
    ids = torch.tensor([i for p in parts for i in p[0]], dtype=torch.int32)
    trained = torch.tensor([t for p in parts for t in p[1]], dtype=torch.bool)
    lens = torch.tensor([n for p in parts for n in p[2]], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    return TokenizedSplit(ids, trained, offsets)


def train_tokenizer(data_dir: str | Path, out: str | Path, vocab_size: int, sample: int = 100_000,
                    template_name: str = "chatml", eval_per_mille: int = 10, seed: int = 0) -> Path:
    """Sentencepiece (BPE, byte fallback, SPECIAL_PIECES) trained on `sample` rendered training
    conversations; returns OUT/tokenizer.model."""
    train, _ = read_split(data_dir, eval_per_mille)
    template = get_template(template_name)
    convs = random.Random(seed).sample(train, min(sample, len(train)))
    texts = ["".join(text for text, _ in render_segments(m, template)) for m in convs]
    return train_sentencepiece(texts, Path(out) / "tokenizer", vocab_size, SPECIAL_PIECES)


# ---- the cache ------------------------------------------------------------------------

def cache_key(tok: Tokenizer, data_dir: str | Path, template_name: str, eval_per_mille: int) -> str:
    h = hashlib.sha256(tok.serialized())
    for f in data_files(data_dir):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(f"{template_name}:{eval_per_mille}:{CACHE_VERSION}".encode())
    return h.hexdigest()[:16]


def load_tokenized(tok: Tokenizer, data_dir: str | Path, cache_dir: str | Path,
                   template_name: str = "chatml", eval_per_mille: int = 10,
                   workers: int | None = None, log=print) -> tuple[dict[str, TokenizedSplit], bool]:
    """{"train", "eval"} splits, from the cache when present. Returns (splits, from_cache)."""
    path = Path(cache_dir) / f"tokens-{cache_key(tok, data_dir, template_name, eval_per_mille)}.pt"
    if path.is_file():
        raw = torch.load(path, weights_only=True)
        return {k: TokenizedSplit(**raw[k]) for k in ("train", "eval")}, True
    train, held = read_split(data_dir, eval_per_mille)
    workers = workers or os.cpu_count() or 1
    splits = {"train": tokenize_split(tok, train, template_name, workers),
              "eval": tokenize_split(tok, held, template_name, workers)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({k: s.to_dict() for k, s in splits.items()}, tmp)
    tmp.replace(path)
    log(json.dumps({"event": "tokenized", "cache": str(path),
                    **{f"{k}_conversations": s.n_conversations for k, s in splits.items()},
                    **{f"{k}_tokens": len(s.ids) for k, s in splits.items()},
                    **{f"{k}_trained_tokens": int(s.trained.sum()) for k, s in splits.items()}}))
    return splits, False


# ---- packing and batching -------------------------------------------------------------

@dataclass
class PackedRows:
    tokens: Tensor  # (R, T + 1) int32
    trained: Tensor  # (R, T + 1) bool; False on padding
    truncated: int  # conversations cut to fit a row

    def __len__(self) -> int:
        return self.tokens.shape[0]


def assign_rows(lens: list[int], row_len: int) -> tuple[list[int], list[int], int]:
    """Best-fit decreasing: (row, column) of each item (lengths capped at row_len), rows used."""
    order = sorted(range(len(lens)), key=lambda i: -lens[i])
    row, col = [0] * len(lens), [0] * len(lens)
    free: list[tuple[int, int]] = []  # sorted (room left, row id) of rows that still have room
    n_rows = 0
    for i in order:
        n = min(lens[i], row_len)
        j = bisect.bisect_left(free, (n, -1))
        if j < len(free):
            room, r = free.pop(j)
        else:
            room, r = row_len, n_rows
            n_rows += 1
        row[i], col[i] = r, row_len - room
        if room - n > 0:
            bisect.insort(free, (room - n, r))
    return row, col, n_rows


def pack_rows(split: TokenizedSplit, row_len: int, pad_id: int, bos_id: int | None = None) -> PackedRows:
    starts = split.offsets[:-1]  # (C,)
    lens_all = (split.offsets[1:] - starts).tolist()
    head = 0
    if bos_id is not None:  # strip each conversation's BOS; each row gets one at its start
        assert bool((split.ids[starts] == bos_id).all()), "every conversation starts with BOS"
        starts, lens_all, head = starts + 1, [n - 1 for n in lens_all], 1
    row_len -= head
    row, col, n_rows = assign_rows(lens_all, row_len)
    lens = torch.tensor(lens_all, dtype=torch.int64).clamp(max=row_len)  # (C,)
    conv = torch.repeat_interleave(torch.arange(len(lens)), lens)  # (K,) conversation of each kept id
    within = torch.arange(len(conv)) - torch.repeat_interleave(lens.cumsum(0) - lens, lens)  # (K,)
    src = starts[conv] + within  # (K,) index into split.ids
    row_t, col_t = torch.tensor(row, dtype=torch.int64), torch.tensor(col, dtype=torch.int64)  # (C,)
    dst = row_t[conv] * row_len + col_t[conv] + within  # (K,) index into the flat rows
    tokens = torch.full((n_rows * row_len,), pad_id, dtype=torch.int32)
    trained = torch.zeros(n_rows * row_len, dtype=torch.bool)
    tokens[dst] = split.ids[src]
    trained[dst] = split.trained[src]
    truncated = sum(n > row_len for n in lens_all)
    tokens, trained = tokens.view(n_rows, row_len), trained.view(n_rows, row_len)
    if head:
        tokens = torch.cat([torch.full((n_rows, 1), bos_id, dtype=torch.int32), tokens], dim=1)
        trained = torch.cat([torch.zeros(n_rows, 1, dtype=torch.bool), trained], dim=1)
    return PackedRows(tokens, trained, truncated)


def rows_to_batch(tokens: Tensor, trained: Tensor) -> tuple[Tensor, Tensor]:
    """tokens, trained (B, T + 1) -> x (B, T) int64 inputs, y (B, T) int64 targets (-100: no loss)."""
    x = tokens[:, :-1].long()  # (B, T)
    y = torch.where(trained[:, 1:], tokens[:, 1:].long(), -100)  # (B, T)
    return x, y


class RowSampler:
    """Batches of rows in a fresh seeded permutation per epoch; `consumed` rows so far is
    all the state it needs to resume."""

    def __init__(self, rows: PackedRows, device: torch.device, seed: int = 0, consumed: int = 0):
        self.tokens = rows.tokens.to(device)  # (R, T + 1)
        self.trained = rows.trained.to(device)
        self.seed, self.consumed = seed, consumed
        self._epoch, self._perm = -1, None

    def _order(self, epoch: int) -> Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(len(self.tokens), generator=g).to(self.tokens.device)
            self._epoch = epoch
        return self._perm

    @property
    def epoch(self) -> float:
        return self.consumed / len(self.tokens)

    def next(self, batch_size: int) -> tuple[Tensor, Tensor]:
        """x, y (B, T); a batch never straddles two epochs' permutations."""
        n = len(self.tokens)
        assert batch_size <= n, f"batch of {batch_size} rows from only {n} rows"
        epoch, at = divmod(self.consumed, n)
        if at + batch_size > n:  # skip the tail so each batch has distinct rows
            epoch, at = epoch + 1, 0
            self.consumed = epoch * n
        idx = self._order(epoch)[at:at + batch_size]  # (B,)
        self.consumed += batch_size
        return rows_to_batch(self.tokens[idx], self.trained[idx])


def eval_batches(rows: PackedRows, batch_size: int, device: torch.device,
                 max_rows: int | None = None) -> Iterator[tuple[Tensor, Tensor]]:
    """Sequential batches over the eval rows; whole batches only (one shape for a compiled
    model) unless there are fewer rows than one batch."""
    n = len(rows) if max_rows is None else min(len(rows), max_rows)
    if n >= batch_size:
        n -= n % batch_size
    for i in range(0, n, batch_size):
        j = min(i + batch_size, n)
        yield rows_to_batch(rows.tokens[i:j].to(device), rows.trained[i:j].to(device))
