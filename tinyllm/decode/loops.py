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
  where no such e. One numpy pass per period over the tail that can matter: called once per
  decoded chunk (tinyllm.session.decode_runner), never once per token.
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
