"""Sampling inside the continuous engine's step: every row with its own settings, seed and draws.

Contract:
- `RowSampler(n_rows, vocab, device, n_valid=None)` holds, per row, every sampling setting as
  a device tensor (temperature, greedy or not, top_k, top_p, repeat penalty, DRY's four), a
  seed (its two 32-bit halves), a draw counter, a ring of the row's last REPEAT_WINDOW ids (the
  repetition penalty's window, prompt included, as tinyllm.decode.step_sampler counts them) and
  its last DRY_WINDOW ids in order (`hist`, -1 where none: DRY's). `breaker` (V,) bool, the ids
  that end a DRY match, is every row's (`set_breakers`, from the tokenizer). One captured
  (and compiled) step serves every mix of settings.
- `load(idx, params, seeds, tails)` (between steps, eager; idx (k,) the rows on the device):
  each row's settings, seed, a counter at 0 and its ring from `tails[r]`, the context's last
  ids. Two host-to-device copies from pinned memory, no sync.
- Inside the step: `push(ids, rows)` adds the ids just fed (rows, 1) to the first `rows` rows'
  rings; `draw(logits, rows)` draws the first `rows` rows' next ids (rows,) and advances their
  counters. `draw_at(idx, logits)` draws for the rows idx (the admission's first token).
  `pick_variant(params)` (host-side, from the live rows' settings) picks the step's variant:
  `greedy` (no live row samples: argmax after the penalty, no top-k, no noise), else sampling
  among the candidates, with `whole` also racing the whole vocabulary for the rows that ask
  it (a pass over every row's V ids: only where some row needs it).
- A row draws as `sample(logits, params, prev=its last REPEAT_WINDOW ids, noise=row_noise(key,
  counter, every id), history=its ids, breaker=breaker)` (tinyllm.decode.sampling) draws
  (tested row by row), with two limits:
  top-k and top-p choose among the TOP_K_MAX likeliest ids (a `topk`, never a sort of the whole
  vocabulary: the engine refuses top_k above it), and top-k keeps exactly k ids where ties at
  the k-th value would keep them all. A row with top_k 0 and top_p 1 draws from the whole
  vocabulary. The noise is a hash of (seed, counter, id) with no row index, so a row's draws do
  not depend on which rows share its batch or which slot it runs in. Ids from n_valid on are
  never drawn.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.decode.sampling import SamplingParams, apply_dry, apply_repeat_penalty, row_noise, seed_key
from tinyllm.decode.sampling_params import DRY_WINDOW
from tinyllm.decode.step_sampler import REPEAT_WINDOW

TOP_K_MAX = 128  # top-k and top-p choose among this many of the likeliest ids


class RowSampler:
    def __init__(self, n_rows: int, vocab: int, device, n_valid: int | None = None):
        self.n_rows, self.vocab = n_rows, vocab
        self.n_valid = vocab if n_valid is None else n_valid
        self.k_max = min(TOP_K_MAX, vocab)
        f32 = dict(dtype=torch.float32, device=device)
        i64 = dict(dtype=torch.long, device=device)
        self.floats = torch.ones(n_rows, 5, **f32)  # (S, 5): temperature (1 when greedy), top_p, penalty,
        # DRY's multiplier and base
        self.ints = torch.zeros(n_rows, 6, **i64)  # (S, 6): greedy (0/1), top_k, seed halves, DRY's allowed, last-n
        self.counter = torch.zeros(n_rows, **i64)  # (S,) draws so far
        self.ring = torch.zeros(n_rows, REPEAT_WINDOW, **i64)  # (S, R) the latest ids, in any order
        self.ring_at = torch.zeros(n_rows, **i64)  # (S,) where the next pushed id goes
        self.hist = torch.full((n_rows, DRY_WINDOW), -1, **i64)  # (S, H) the latest ids, oldest first; -1: none
        self.breaker = torch.zeros(vocab, dtype=torch.bool, device=device)  # (V,) ids that end a DRY match
        self.greedy = True  # host-side, with `whole`: which variant of the step runs
        self.whole = False  # some sampling row draws from the whole vocabulary (top_k 0, top_p 1)
        self._row_ids = torch.arange(n_rows, **i64)
        self._vocab_ids = torch.arange(vocab, **i64)

    def state(self) -> list[Tensor]:
        """The tensors a step changes (a capture's warm-up puts them back)."""
        return [self.counter, self.ring, self.ring_at, self.hist]

    def set_breakers(self, ids: list[int]) -> None:
        """The ids that end a DRY match (tinyllm.decode.loops.breaker_ids), from now on."""
        self.breaker.zero_()
        self.breaker[torch.tensor(ids, dtype=torch.long, device=self.breaker.device)] = True

    def load(self, idx: Tensor, params: list[SamplingParams], seeds: list[int], tails: list[list[int]]) -> None:
        """Rows idx (k,) take params[r], seeds[r] and a ring from tails[r] (>= 1 id each)."""
        pin = idx.is_cuda
        floats = torch.tensor([[p.temperature or 1.0, p.top_p, p.repeat_penalty, p.dry_multiplier, p.dry_base]
                               for p in params], dtype=torch.float32, pin_memory=pin)  # (k, 5)
        ints = []
        for p, seed, full in zip(params, seeds, tails, strict=True):
            tail = full[-REPEAT_WINDOW:]
            ring = (tail * -(-REPEAT_WINDOW // len(tail)))[:REPEAT_WINDOW]  # copies count once, as repeats do
            dry = ([-1] * DRY_WINDOW + full[-DRY_WINDOW:])[-DRY_WINDOW:]
            ints.append([int(p.greedy), p.top_k, *seed_key(seed), p.dry_allowed_length, p.dry_last_n,
                         len(tail) % REPEAT_WINDOW, *ring, *dry])
        ints = torch.tensor(ints, dtype=torch.long, pin_memory=pin)  # (k, 7 + R + H)
        floats, ints = floats.to(idx.device, non_blocking=True), ints.to(idx.device, non_blocking=True)
        self.floats.index_copy_(0, idx, floats)
        self.ints.index_copy_(0, idx, ints[:, :6])
        self.ring_at.index_copy_(0, idx, ints[:, 6])
        self.ring.index_copy_(0, idx, ints[:, 7:7 + REPEAT_WINDOW])
        self.hist.index_copy_(0, idx, ints[:, 7 + REPEAT_WINDOW:])
        self.counter.index_fill_(0, idx, 0)

    def push(self, ids: Tensor, rows: int) -> None:
        """ids (rows, 1): fed this step to the first `rows` rows; they join the penalty's window
        and DRY's history."""
        at = self.ring_at[:rows]  # (rows,)
        self.ring[self._row_ids[:rows], at] = ids[:, 0]  # an index_put_: in place under Inductor
        at.add_(1).remainder_(REPEAT_WINDOW)
        self.hist[:rows].copy_(torch.cat([self.hist[:rows, 1:], ids], dim=1))

    def draw(self, logits: Tensor, rows: int) -> Tensor:
        """logits (rows, V) of the first `rows` rows -> their next ids (rows,)."""
        tok = self._draw(logits, self.floats[:rows], self.ints[:rows], self.ring[:rows], self.hist[:rows],
                         self.counter[:rows])
        self.counter[:rows].add_(1)
        return tok

    def draw_at(self, idx: Tensor, logits: Tensor) -> Tensor:
        """logits (k, V) of the rows idx (k,) -> their next ids (k,), as draw would give them."""
        pick = lambda t: t.index_select(0, idx)  # noqa: E731
        tok = self._draw(logits, pick(self.floats), pick(self.ints), pick(self.ring), pick(self.hist), pick(self.counter))
        self.counter.index_add_(0, idx, torch.ones_like(idx))
        return tok

    def _draw(self, logits: Tensor, floats: Tensor, ints: Tensor, ring: Tensor, hist: Tensor,
              counter: Tensor) -> Tensor:
        """The draw of N rows from their settings: floats (N, 5), ints (N, 6), ring (N, R),
        hist (N, H), counter (N,) -> (N,)."""
        x = logits.float()  # (N, V)
        if self.n_valid < self.vocab:  # embeddings padded past the tokenizer: never draw those ids
            x[:, self.n_valid:] = float("-inf")
        temperature, top_p, penalty = floats[:, 0:1], floats[:, 1:2], floats[:, 2:3]  # (N, 1) each
        x = apply_repeat_penalty(x, ring, penalty)
        x = apply_dry(x, hist, self.breaker, floats[:, 3:4], floats[:, 4:5], ints[:, 4:5], ints[:, 5:6])
        best = x.argmax(dim=-1)  # (N,)
        if self.greedy:
            return best
        greedy, top_k, key = ints[:, 0] > 0, ints[:, 1], ints[:, 2:4]
        x = x / temperature
        K = self.k_max
        vals, ids = x.topk(K, dim=-1)  # (N, K) descending
        k = torch.where((top_k > 0) & (top_k < K), top_k, K)  # (N,) top_k 0: all K candidates
        vals = vals.masked_fill(self._vocab_ids[:K] >= k[:, None], float("-inf"))
        p = vals.softmax(dim=-1)
        drop = (p.cumsum(dim=-1) - p >= top_p) & (top_p < 1.0)  # (N, K) the mass before this id
        probs = vals.masked_fill(drop, float("-inf")).softmax(dim=-1)
        choice = (probs / row_noise(key, counter, ids)).argmax(dim=-1, keepdim=True)  # (N, 1)
        picked = ids.gather(1, choice)[:, 0]  # (N,)
        if self.whole:  # a variant of its own: the noise of every id costs a pass over (N, V)
            every = self._vocab_ids.expand(x.shape[0], -1)  # (N, V)
            raced = (x.softmax(dim=-1) / row_noise(key, counter, every)).argmax(dim=-1)  # the whole vocabulary
            picked = torch.where((top_k == 0) & (top_p[:, 0] >= 1.0), raced, picked)
        return torch.where(greedy, best, picked)

    def pick_variant(self, params: list[SamplingParams]) -> None:
        """The variant the live rows' settings need: greedy where none samples, `whole` where
        one samples with neither top-k nor top-p."""
        self.greedy = all(p.greedy for p in params)
        self.whole = any(not p.greedy and p.top_k == 0 and p.top_p >= 1.0 for p in params)
