"""Continuous batching: many requests decode together, one token per slot per step.

Contract:
- `Engine(model, n_slots, max_len=None, use_graph=None, buckets=None, compile=None)` owns a
  `SlotKVCache` of n_slots rows and a `SlotGraphDecoder` over it (`compile="inductor"`
  compiles its step, as for GraphDecoder). With graphs (the default on CUDA) every
  bucket is captured ahead of time, in the constructor; `use_graph=False` runs the identical
  step eagerly (the only mode on a CPU).
- `add_request(prompt_ids, params, stop_ids) -> request id` queues a request (first come,
  first served). A request's whole sequence, prompt plus reply, fits in max_len tokens.
- `step() -> list[TokenEvent]` first admits waiting requests into free slots (one eager,
  right-padded prefill per group of up to PREFILL_TOKENS padded tokens, which yields each
  request's first token), then runs one decode step for every live slot (one token each). Free slots compute too, into their
  own rows, and never advance. A request finishes on a stop id (the stop token ends the
  reply, as `generate()` yields it: "stop"), after params.max_tokens tokens ("length"), or
  when prompt plus reply reach max_len ("full"); its slot is released at once and taken by
  the next waiting request at the start of the next step, before the next decode.
- Sampling is per request: rows that are plain greedy share one argmax; every other row
  goes through `sample()` with its own generator (seeded by params.seed) and its own context
  (for the repetition penalty), so a request draws as one `generate()` with the same params.
  Under greedy, replies equal one `generate()` per request (tested on a CPU in fp32).
- `is_finished(id)`, `result(id)` (the reply so far), `finish_reason(id)`, `cancel(id)`
  ("cancelled", frees the slot), `run_until_done() -> {id: reply}`.
- One host sync per step (the new tokens, to check stops) and one per admitted group.
Refuses (ValueError): an empty prompt or one that leaves no room for a reply, ids outside
the vocabulary, unknown request ids, n_slots < 1, max_len above the model's max_seq_len.
"""

from __future__ import annotations

import itertools
import operator
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from tinyllm.core.kv_cache import SlotKVCache
from tinyllm.core.model import Transformer
from tinyllm.decode.cuda_graph import SlotGraphDecoder
from tinyllm.decode.sampling import SamplingParams, make_generator, sample

GREEDY = SamplingParams()  # the default: argmax, 256 tokens at most
PREFILL_TOKENS = 16384  # padded tokens in one admission prefill (bounds its activations)


class TokenEvent(NamedTuple):
    request_id: int
    token: int
    finish_reason: str | None  # None while the request goes on; "stop", "length", "full", "cancelled"


@dataclass(eq=False)
class Request:
    id: int
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    tokens: list[int] = field(default_factory=list)  # the reply so far
    finish_reason: str | None = None
    slot: int | None = None  # the slot it runs (or ran) in; None while waiting
    generator: torch.Generator | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def plain_greedy(self) -> bool:
        """Argmax of the raw logits: shares the batched argmax, needs no context."""
        return self.params.greedy and self.params.repeat_penalty == 1.0


class Engine:
    """Continuous batching over SlotKVCache; see the module docstring."""

    def __init__(self, model: Transformer, n_slots: int, max_len: int | None = None,
                 use_graph: bool | None = None, buckets: tuple[int, ...] | None = None,
                 compile: str | None = None):
        cfg = model.cfg
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        max_len = max_len or cfg.max_seq_len
        if not 2 <= max_len <= cfg.max_seq_len:
            raise ValueError(f"max_len must be in [2, max_seq_len {cfg.max_seq_len}], got {max_len}")
        if use_graph is None:
            use_graph = model.device.type == "cuda"
        self.model, self.n_slots, self.max_len = model, n_slots, max_len
        self.slots = SlotKVCache(cfg.n_layers, n_slots, max_len, model.device)
        self.decoder = SlotGraphDecoder(model, self.slots, buckets, use_graph, compile)
        self.capture_s = self.decoder.capture() if use_graph else 0.0
        device = model.device
        self._ctx = torch.zeros(n_slots, max_len, dtype=torch.long, device=device)  # (S, L) ids so far
        self._owner: list[Request | None] = [None] * n_slots
        self._waiting: deque[Request] = deque()
        self._ids = itertools.count()
        self.requests: dict[int, Request] = {}

    # -- requests ------------------------------------------------------------------------

    def add_request(self, prompt_ids: Iterable[int], params: SamplingParams = GREEDY,
                    stop_ids: Iterable[int] = ()) -> int:
        """Queue a request; returns its id. Its tokens come out of step()."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompt = self._check_ids(prompt_ids, "prompt_ids")
        stops = frozenset(self._check_ids(stop_ids, "stop_ids"))
        if not prompt:
            raise ValueError("empty prompt: give at least one token id (e.g. the BOS id)")
        if len(prompt) >= self.max_len:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room for a reply in max_len "
                             f"{self.max_len}: shorten it to at most {self.max_len - 1} tokens or "
                             "raise max_len")
        req = Request(next(self._ids), prompt, params, stops,
                      generator=make_generator(params, self.model.device))
        self.requests[req.id] = req
        self._waiting.append(req)
        return req.id

    def _check_ids(self, ids: Iterable[int], what: str) -> list[int]:
        try:
            out = [operator.index(t) for t in ids]
        except TypeError:
            raise ValueError(f"{what} must be integer token ids, got {ids!r}") from None
        vocab = self.model.cfg.vocab_size
        bad = [t for t in out if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"{what} holds ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        return out

    def _request(self, request_id: int) -> Request:
        if request_id not in self.requests:
            raise ValueError(f"unknown request id {request_id!r}: use an id add_request returned")
        return self.requests[request_id]

    def is_finished(self, request_id: int) -> bool:
        return self._request(request_id).finished

    def result(self, request_id: int) -> list[int]:
        """The reply so far (all of it once finished), stop token included."""
        return list(self._request(request_id).tokens)

    def finish_reason(self, request_id: int) -> str | None:
        return self._request(request_id).finish_reason

    def cancel(self, request_id: int) -> None:
        """Finish a request now ("cancelled"); its slot is free for the next step."""
        req = self._request(request_id)
        if req.finished:
            return
        req.finish_reason = "cancelled"
        if req in self._waiting:
            self._waiting.remove(req)
        else:
            self._release(req)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting) or any(self.slots.active)

    def run_until_done(self) -> dict[int, list[int]]:
        """Step until nothing waits or runs; returns every request's reply by id."""
        while self.has_work:
            self.step()
        return {rid: list(r.tokens) for rid, r in self.requests.items()}

    # -- the step ------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> list[TokenEvent]:
        """Admit waiting requests into free slots, then decode one token for every live slot."""
        events: list[TokenEvent] = []
        self._admit_waiting(events)
        if any(self.slots.active):
            self._decode(events)
        return events

    def _admit_waiting(self, events: list[TokenEvent]) -> None:
        while self._waiting and (free := self.slots.free_slots()):
            group = self._take_group(len(free))
            logits = self._prefill(free[:len(group)], group)  # (k, V)
            toks = self._sample(list(enumerate(group)), logits, logits.argmax(dim=-1))  # (k,)
            self.decoder.tok[[r.slot for r in group]] = toks[:, None]  # the next step's input
            for req, tok in zip(group, toks.tolist(), strict=True):  # the admission's one sync
                self._emit(req, tok, events)  # may release the slot again at once

    def _take_group(self, n_free: int) -> list[Request]:
        """The next waiting requests (first come, first served) for one prefill: at most
        n_free, and at most PREFILL_TOKENS padded tokens unless a single prompt is longer."""
        group: list[Request] = []
        longest = 0
        while self._waiting and len(group) < n_free:
            n = len(self._waiting[0].prompt)
            if group and max(longest, n) * (len(group) + 1) > PREFILL_TOKENS:
                break
            longest = max(longest, n)
            group.append(self._waiting.popleft())
        return group

    def _prefill(self, slots: list[int], group: list[Request]) -> Tensor:
        """Eagerly fill slots[r] with group[r]'s prompt, all in one right-padded forward;
        returns each prompt's last-position logits (k, V)."""
        lens = [len(r.prompt) for r in group]
        rows = [r.prompt + [0] * (max(lens) - n) for r, n in zip(group, lens, strict=True)]
        idx = torch.tensor(rows, dtype=torch.long, device=self.model.device)  # (k, T)
        last = torch.tensor(lens, device=self.model.device) - 1  # (k,)
        self.slots.start_prefill(slots, lens)
        logits, _ = self.model(idx, cache=self.slots, at=last)  # (k, 1, V)
        self.slots.admit(slots)
        for r, (s, req, n) in enumerate(zip(slots, group, lens, strict=True)):
            req.slot, self._owner[s] = s, req
            if not req.plain_greedy:
                self._ctx[s, :n] = idx[r, :n]
        return logits[:, 0]

    def _sample(self, rows: list[tuple[int, Request]], logits: Tensor, nxt: Tensor) -> Tensor:
        """logits (N, V); nxt (N,) their argmax; rows: (row, request). Overwrites the rows of
        requests that are not plain greedy with their draw (as generate() draws); returns nxt."""
        for j, req in rows:
            if not req.plain_greedy:
                n = len(req.prompt) + len(req.tokens)
                prev = self._ctx[req.slot:req.slot + 1, :n]  # (1, n): prompt and reply so far
                nxt[j:j + 1] = sample(logits[j:j + 1], req.params, req.generator, prev=prev)
        return nxt

    def _decode(self, events: list[TokenEvent]) -> None:
        live = [(s, r) for s, r in enumerate(self._owner) if r is not None]
        # The step leaves every slot's argmax in decoder.tok, its next input (S, 1).
        logits = self.decoder.step(self.decoder.tok)[:, -1]  # (S, V); a static buffer with graphs
        nxt = self._sample(live, logits, self.decoder.tok[:, 0])  # (S,), a view of decoder.tok
        toks = nxt.tolist()  # the one host sync of the step
        for s, req in live:
            self._emit(req, toks[s], events)

    def _emit(self, req: Request, tok: int, events: list[TokenEvent]) -> None:
        req.tokens.append(tok)
        n = len(req.prompt) + len(req.tokens)  # sequence length with this token
        if tok in req.stop_ids:
            req.finish_reason = "stop"
        elif len(req.tokens) >= req.params.max_tokens:
            req.finish_reason = "length"
        elif n >= self.max_len:
            req.finish_reason = "full"
        if req.finished:
            self._release(req)
        elif not req.plain_greedy:
            self._ctx[req.slot, n - 1] = tok  # n - 1 < max_len: the context of the next sample
        events.append(TokenEvent(req.id, tok, req.finish_reason))

    def _release(self, req: Request) -> None:
        s = req.slot
        assert s is not None and self._owner[s] is req, f"request {req.id} holds no slot"
        self.slots.release(s)
        self._owner[s] = None
