"""Each continuous-engine row's end rules, checked inside the decode step (docs/INFERENCE.md 4.11b).

Contract:
- `RowLimits(n_rows, max_len, device)` holds each row's stop ids (S, MAX_STOPS), -1 padded, its
  tokens left (S,) and its end code (S,): RUNNING, or why it ended: STOP (a stop id), LENGTH (its
  token budget), FULL (its sequence reached max_len). `load` sets an admission's rows; `check`
  applies the rules to a step's draws of the first `rows` slots (an ended row's active flag goes
  to 0 on the device: it stops advancing at once); `check_at` to an admission's first tokens.
  No host sync.
"""


from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.kv_cache import SlotKVCache

RUNNING, STOP, LENGTH, FULL = 0, 1, 2, 3  # a row's end code
MAX_STOPS = 16  # stop ids a request may have


class RowLimits:
    """Each row's end rules on the device: its stop ids (S, MAX_STOPS), -1 padded, its tokens
    left (S,) and its end code (S,)."""

    def __init__(self, n_rows: int, max_len: int, device):
        self.max_len = max_len
        self.stops = torch.full((n_rows, MAX_STOPS), -1, dtype=torch.long, device=device)
        # A row admitted without `load` (the seed's thin form: admit, then step) has no budget
        # but max_len; `load` sets a request's own.
        self.left = torch.full((n_rows,), 1 << 62, dtype=torch.long, device=device)
        self.code = torch.zeros(n_rows, dtype=torch.long, device=device)

    def state(self) -> list[Tensor]:
        return [self.left, self.code]

    def load(self, idx: Tensor, stops: list[list[int]], max_tokens: list[int]) -> None:
        rows = [[*max_tokens[r], *s, *[-1] * (MAX_STOPS - len(s))] for r, s in enumerate(stops)]
        host = torch.tensor(rows, dtype=torch.long, pin_memory=idx.is_cuda)  # (k, 1 + MAX_STOPS)
        dev = host.to(idx.device, non_blocking=True)
        self.left.index_copy_(0, idx, dev[:, 0])
        self.stops.index_copy_(0, idx, dev[:, 1:])
        self.code.index_fill_(0, idx, RUNNING)

    def _rules(self, tok: Tensor, lens: Tensor, live: Tensor, left: Tensor, stops: Tensor,
               code: Tensor) -> tuple[Tensor, Tensor]:
        """tok (N,) just drawn by rows with `lens` (N,) positions filled -> their tokens left and
        end codes (N,); rows not live keep theirs."""
        left = left - live.long()
        reason = torch.where((tok[:, None] == stops).any(dim=-1), STOP,
                             torch.where(left <= 0, LENGTH, torch.where(lens + 1 >= self.max_len, FULL, RUNNING)))
        return left, torch.where(live, reason, code)

    def check(self, tok: Tensor, slots: SlotKVCache, rows: int) -> Tensor:
        """tok (rows,) drawn by the first `rows` slots, after their step -> what they drew (rows,),
        -1 where a row was not live; ended rows stop advancing."""
        active = slots._active_dev[:rows]
        live = active > 0
        left, code = self._rules(tok, slots._lens_dev[:rows], live, self.left[:rows], self.stops[:rows],
                                 self.code[:rows])
        self.left[:rows].copy_(left)
        self.code[:rows].copy_(code)
        active.mul_((code == RUNNING).long())
        return torch.where(live, tok, -1)

    def check_at(self, idx: Tensor, tok: Tensor, slots: SlotKVCache) -> None:
        """The first tokens tok (k,) of the rows idx (k,) just admitted."""
        live = torch.ones_like(idx, dtype=torch.bool)
        left, code = self._rules(tok, slots._lens_dev.index_select(0, idx), live, self.left.index_select(0, idx),
                                 self.stops.index_select(0, idx), self.code.index_select(0, idx))
        self.left.index_copy_(0, idx, left)
        self.code.index_copy_(0, idx, code)
        slots._active_dev.index_copy_(0, idx, (code == RUNNING).long())


