"""The continuous engine's decode step: one token per SlotKVCache slot, sampled and checked for
its end inside the step, chained and replayed as CUDA graphs (docs/INFERENCE.md 4.11b).

Contract:
- `SlotGraphDecoder(model, slots, buckets=None, use_graph=True, compile=None, row_buckets=None)`
  runs the step of tinyllm.decode.cuda_graph's `_Decoder` (graphs, their eager twin, the
  compiled step) over a `SlotKVCache`. Admission, release and prefill stay eager in the engine.
- A run's shape is (W, B): the smallest key bucket that holds the longest live slot plus the
  run's steps, and the smallest row bucket (`row_buckets`: 8, 16, ... n_slots) that holds the
  highest live slot. The step computes the first B slots only (free slots among them compute
  too, into their own rows, and never advance); the engine fills the lowest free slots first.
  One graph per (W, B, steps, sampler variant: greedy, sampling, sampling with a row over the
  whole vocabulary); the compiled step serves them all.
- Each step feeds `tok`, samples every row with its own settings (tinyllm.decode.row_sampler)
  and applies the row's end rules (`RowLimits`): a stop id ends it ("stop"), its token budget
  ("length"), its sequence reaching max_len ("full"). An ended row stops advancing at once (its
  active flag goes to 0 on the device), and its later draws are never reported.
- `out` (S, MAX_RUN + 2) holds a run's report, read back without waiting by `launch(steps)`
  (a `Chunk`): column 0 each row's input id before the run (an admitted row's first token),
  columns 1..steps each step's draw (-1 where the row was not live), the last column each
  row's end code (0 running; STOP, LENGTH, FULL).
- `start_rows(idx, logits, ...)`: an admission's rows, after their prefill: their sampling
  settings and end rules are loaded, their first token drawn from the prefill's last logits
  (as a step would draw it) and checked, and made the next step's input. No host sync.
Refuses: graphs without CUDA, a full cache.
"""

from __future__ import annotations

import itertools
import time

import torch
from torch import Tensor

from tinyllm.core.kv_cache import SlotKVCache
from tinyllm.core.model import Transformer
from tinyllm.decode.cuda_graph import MAX_RUN, Chunk, Readback, _Decoder, default_buckets, pick_bucket
from tinyllm.decode.row_sampler import RowSampler
from tinyllm.decode.sampling import SamplingParams

RUNNING, STOP, LENGTH, FULL = 0, 1, 2, 3  # a row's end code
MAX_STOPS = 16  # stop ids a request may have


def default_row_buckets(n_slots: int, first: int = 8) -> tuple[int, ...]:
    """first, 2*first, ... below n_slots, then n_slots itself."""
    return default_buckets(n_slots, first)


class RowLimits:
    """Each row's end rules on the device: its stop ids (S, MAX_STOPS), -1 padded, its tokens
    left (S,) and its end code (S,)."""

    def __init__(self, n_rows: int, max_len: int, device):
        self.max_len = max_len
        self.stops = torch.full((n_rows, MAX_STOPS), -1, dtype=torch.long, device=device)
        self.left = torch.zeros(n_rows, dtype=torch.long, device=device)
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


class SlotGraphDecoder(_Decoder):
    """The continuous engine's decode step over a SlotKVCache; see the module docstring."""

    def __init__(self, model: Transformer, slots: SlotKVCache, buckets: tuple[int, ...] | None = None,
                 use_graph: bool | None = True, compile: str | None = None,
                 row_buckets: tuple[int, ...] | None = None):
        self.slots = slots
        super().__init__(model, slots, slots.n_slots, buckets or default_buckets(slots.max_len), slots.max_len,
                         use_graph, compile)
        S, device = slots.n_slots, model.device
        self.sampler = RowSampler(S, model.cfg.vocab_size, device)
        self.limits = RowLimits(S, slots.max_len, device)
        self.row_buckets = tuple(sorted(row_buckets or default_row_buckets(S)))
        if self.row_buckets[-1] < S:
            raise ValueError(f"largest row bucket {self.row_buckets[-1]} < n_slots {S}")
        self.out = torch.zeros(S, MAX_RUN + 2, dtype=torch.long, device=device)  # a run's report
        self._readback = Readback(self.out)
        self.rows = S  # the row bucket of the last run

    @property
    def captured_windows(self) -> list[int]:
        return sorted({w for (w, _), *_ in self.graphs})

    def start_rows(self, idx: Tensor, logits: Tensor, params: list[SamplingParams], seeds: list[int],
                   tails: list[list[int]], stops: list[list[int]]) -> None:
        """Rows idx (k,), just prefilled (their last logits (k, V)): load their settings and end
        rules, draw and check their first tokens, and make them the next step's input."""
        self.sampler.load(idx, params, seeds, tails)
        self.limits.load(idx, stops, [[p.max_tokens] for p in params])
        variant = self.sampler.greedy, self.sampler.whole
        self.sampler.pick_variant(params)
        first = self.sampler.draw_at(idx, logits)  # (k,)
        self.sampler.greedy, self.sampler.whole = variant
        self.limits.check_at(idx, first, self.slots)
        self.tok.index_copy_(0, idx, first[:, None])

    # -- the step -------------------------------------------------------------------------

    def plain_step(self, window: int, rows: int) -> tuple[Tensor, Tensor]:
        """One decode step of the first `rows` slots over `window` keys, in Python (what a
        compile traces): feeds `tok`, leaves the draws there. Returns logits (rows, 1, V) and
        what each row drew (rows,), -1 where it was not live."""
        tok = self.tok[:rows]  # (B, 1)
        logits, _ = self.model(tok, cache=self.slots.decode(window, rows))  # (B, 1, V)
        self.sampler.push(tok, rows)
        nxt = self.sampler.draw(logits[:, -1], rows)  # (B,)
        drawn = self.limits.check(nxt, self.slots, rows)
        tok.copy_(nxt[:, None])
        return logits, drawn

    def _steps(self, shape: tuple[int, int], steps: int) -> Tensor:
        window, rows = shape
        self.out[:rows, 0].copy_(self.tok[:rows, 0])
        for i in range(steps):
            logits, drawn = self._step_fn(window, rows)
            self.out[:rows, i + 1].copy_(drawn)
        self.out[:rows, -1].copy_(self.limits.code[:rows])
        return logits

    def _state(self) -> list[Tensor]:
        return [*self.slots.step_state(), self.slots._active_dev, self.tok, *self.sampler.state(),
                *self.limits.state()]

    def shape(self, steps: int) -> tuple[int, int]:
        """(W, B) of the next run of `steps` steps."""
        highest = max((s for s in range(self.slots.n_slots) if self.slots.active[s]), default=0)
        return self.bucket(self.slots.keys_needed(steps)), pick_bucket(self.row_buckets, highest + 1)

    @torch.no_grad()
    def capture(self, windows: tuple[int, ...] | None = None, steps: int = 1) -> float:
        """Capture the graphs of `steps`-step runs for every (window, row bucket) ahead of time
        (default: every key bucket), for the sampler's current variant. Returns seconds."""
        if not self.use_graph:
            raise ValueError("capture needs use_graph=True")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for shape in itertools.product(windows or self.buckets, self.row_buckets):
            key = (shape, steps, self.sampler.greedy, self.sampler.whole)
            if key not in self.graphs:
                self.graphs[key] = self._record(shape, steps)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    @torch.no_grad()
    def run(self, steps: int = 1, capture: bool = True) -> Tensor:
        """`steps` decode steps of the live rows, reported in `out`; one replay with graphs.
        Returns the last step's logits (B, 1, V) (with graphs a static buffer)."""
        if not 1 <= steps <= MAX_RUN:
            raise ValueError(f"steps must be in [1, {MAX_RUN}], got {steps}")
        shape = self.shape(steps)
        key = (shape, steps, self.sampler.greedy, self.sampler.whole)
        if self.use_graph and (capture or key in self.graphs):
            if key not in self.graphs:
                self.graphs[key] = self._record(shape, steps)
            graph, logits = self.graphs[key]
            graph.replay()
        else:
            logits = self._steps(shape, steps)
        self.slots.advance_host(steps)
        self.window, self.rows = shape
        return logits

    @torch.no_grad()
    def launch(self, steps: int, capture: bool = True) -> Chunk:
        """run(steps, capture), its report copied to the host behind it: read it from the Chunk."""
        self.run(steps, capture)
        return self._readback.take(self.out.shape[1])
