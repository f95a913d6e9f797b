"""What decoding does against loops (issue 46): DRY's sequence breakers as token ids, and the
repetition stop's detector. numpy and the tokenizer only: no torch here.

Contract:
- `breaker_ids(tokenizer, breakers=BREAKERS) -> list[int]`: the ids whose text (each decoded
  alone) contains one of the breaker strings, llama.cpp's default sequence breakers `\\n : " *`
  (llama.cpp matches a breaker's own tokens and the vocabulary's tokens that overlap it; with
  breakers of one character, those are the tokens that contain it). A DRY match ends at one
  (tinyllm.decode.sampling.apply_dry).
- `repeat_end(ids, checked, repeats) -> int | None`: the shortest prefix `ids[:e]`, e past
  `checked`, whose tail says one span `repeats` times in a row: for some period p from 1 to
  MAX_PERIOD, the last L = max((repeats - 1) * p, MIN_SPAN) ids equal the L ids one period
  before, but for at most L // 8 of them where p >= 8 (a loop that counts, "13. The Bluefin
  Zombie", "14. The Bluefin Zombie", differs in a token or two a round), exactly below 8. None
  where no such e. One numpy pass per period over the tail that can matter: the reference.
- `RepeatWatch(repeats)`: repeat_end a reply's ids at a time, what decoding calls
  (tinyllm.session.decode_runner): `push(ids)` takes the reply's next ids and returns the first
  length of the reply so far at which its tail repeats (repeat_end(every id pushed, 0, repeats)),
  or None. It keeps each period's count of mismatches over its span as ids come, so an id costs
  a few numpy operations over the MAX_PERIOD periods, however long the reply: repeat_end once a
  chunk cost about 5 ms (256 periods, a few numpy calls each), a token at a time on a CPU step,
  where the tiny test model decodes in 0.2-0.5 ms.
"""

from __future__ import annotations

import numpy as np

BREAKERS = ("\n", ":", '"', "*")  # llama.cpp's dry_sequence_breakers
MAX_PERIOD = 256  # the longest span the repetition stop looks for (a paragraph said again)
MIN_SPAN = 32  # it compares at least this many ids: 32 of one id, 16 rounds of two, ...
SLACK = 8  # periods from SLACK on may differ in 1 id of SLACK


def breaker_ids(tokenizer, breakers: tuple[str, ...] = BREAKERS) -> list[int]:
    """The ids whose text, decoded alone, contains a breaker string."""
    out = []
    for i in range(tokenizer.vocab_size):
        try:
            text = tokenizer.decode([i])
        except (ValueError, KeyError):  # an id with no text of its own
            continue
        if any(b in text for b in breakers):
            out.append(i)
    return out


def repeat_end(ids: list[int] | np.ndarray, checked: int, repeats: int) -> int | None:
    """The least e in (checked, len(ids)] whose prefix ids[:e] ends in `repeats` rounds of a
    span (see the module docstring), or None."""
    n = len(ids)
    if repeats < 2 or n <= checked:
        return None
    first = None
    a = np.asarray(ids, dtype=np.int64)
    for p in range(1, MAX_PERIOD + 1):
        span = max((repeats - 1) * p, MIN_SPAN)
        lo = max(checked + 1, span + p)  # the least end with a whole span one period back
        if lo > n:
            if span + p > n:
                break  # longer periods need more ids still
            continue
        seg = a[lo - span - p:]  # what ends from lo on compare
        diff = np.concatenate(([0], np.cumsum(seg[p:] != seg[:-p])))  # mismatches up to each id
        ends = np.arange(lo, n + 1) - (lo - span - p) - p  # each end, as an index into diff
        bad = diff[ends] - diff[ends - span]  # (ends,) mismatches in the last span ids
        hit = np.flatnonzero(bad <= (span // SLACK if p >= SLACK else 0))
        if hit.size:
            e = lo + int(hit[0])
            first = e if first is None else min(first, e)
    return first


class RepeatWatch:
    """repeat_end as ids come (see the module docstring)."""

    def __init__(self, repeats: int) -> None:
        self.repeats = repeats
        self.p = np.arange(1, MAX_PERIOD + 1)  # (P,) the periods
        self.span = np.maximum((repeats - 1) * self.p, MIN_SPAN)  # (P,) ids compared at each
        self.allowed = np.where(self.p >= SLACK, self.span // SLACK, 0)  # (P,) mismatches let through
        self.wrong = np.zeros(MAX_PERIOD, dtype=np.int64)  # (P,) mismatches in the span ending at the last id
        self.ids = np.zeros(1024, dtype=np.int64)
        self.n = 0  # ids pushed

    def _differs(self, j: np.ndarray) -> np.ndarray:
        """(T, P) whether id j[t, p] differs from the id one period p before it (False where either
        is not there yet); j (T, 1) or (T, P)."""
        a = self.ids
        return (j >= self.p) & (a[np.maximum(j, 0)] != a[np.maximum(j - self.p, 0)])

    def push(self, ids) -> int | None:
        if self.repeats < 2 or not len(ids):
            return None
        new = np.asarray(ids, dtype=np.int64)  # (T,)
        while self.n + len(new) > len(self.ids):
            self.ids = np.concatenate([self.ids, np.zeros_like(self.ids)])
        self.ids[self.n:self.n + len(new)] = new
        j = np.arange(self.n, self.n + len(new))[:, None]  # (T, 1) the new ids' places
        self.n += len(new)
        # each id's span gains (j vs j - p) and drops (j - span vs j - span - p): the counts after each id
        wrong = self.wrong + np.cumsum(self._differs(j).astype(np.int64) - self._differs(j - self.span), axis=0)
        self.wrong = wrong[-1]
        hit = np.flatnonzero(np.any((j + 1 >= self.span + self.p) & (wrong <= self.allowed), axis=1))  # (hits,)
        return int(j[hit[0], 0]) + 1 if hit.size else None
