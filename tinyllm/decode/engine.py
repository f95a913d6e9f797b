"""Continuous batching: many requests decode together, each slot's token drawn and its end checked
inside one graphed step, in chains of steps read back without waiting.

Contract:
- `Engine(model, n_slots, max_len=None, use_graph=None, buckets=None, compile=None, chain=None,
  overlap=None, min_admit=1, row_buckets=None, token_events=True)` owns a `SlotKVCache` of n_slots rows and a
  `SlotGraphDecoder` over it (tinyllm.cuda_graph; `compile="inductor"` compiles its
  step). With graphs (the default on CUDA) the greedy chains' graphs for every (key bucket,
  row bucket) are captured in the constructor (`capture_s`), the sampling ones when first
  needed; `use_graph=False` runs the identical steps eagerly (the only mode on a CPU).
- `add_request(prompt_ids, params, stop_ids) -> request id` queues a request (first come,
  first served). A request's whole sequence, prompt plus reply, fits in max_len tokens.
- `step() -> list[TokenEvent]`:
  1. admits waiting requests into the lowest free slots: the next n_free waiting ones, sorted
     by length and prefilled eagerly in right-padded groups of at most PREFILL_TOKENS padded
     tokens; each request's first token is drawn on the device (no host sync);
  2. launches a chain of `chain` decode steps of the live slots (one replay with graphs; the
     default is 8 on CUDA, 1 on a CPU);
  3. reads one chain's report and returns its events, request by request (slot order), each
     request's tokens in the order drawn: with `overlap` (the default on CUDA) the chain
     launched before, while the GPU runs this one; without it, this one.
  A request ends on a stop id ("stop": the stop token ends the reply, as `generate()` yields
  it), after params.max_tokens tokens ("length"), or when prompt plus reply reach max_len
  ("full"). The step finds that on the device (the row stops advancing there); the host
  releases the slot when it reads it, and the next waiting request takes it at the next step.
  A request that ends on its first token therefore holds its slot for one chain.
  `token_events=False`: step() returns only the events that end a request (its last token
  and the reason), for callers that read replies with `result` (the teacher, the bench):
  at 512 rows a chain's 4,096 token events were most of the host's time reading it.
  `min_admit` holds waiting requests back until that many slots are free (or every waiting one
  fits, or nothing runs): each admission is an eager prefill, cheaper in groups.
- Sampling is per request, inside the step (tinyllm.decode.row_sampler): a request draws as
  `sample()` with its params, noise from its seed (params.seed; None: a random one) and the
  last REPEAT_WINDOW ids of its context, so its draws do not depend on which requests share
  its batch. Greedy replies equal one `generate()` per request (tested on a CPU in fp32, with
  the repetition penalty while the context fits its window).
- `is_finished(id)`, `result(id)` (the reply so far), `finish_reason(id)`, `waiting` (requests
  not yet admitted), `cancel(id)` ("cancelled", frees the slot; tokens of chains in flight are
  dropped), `run_until_done() -> {id: reply}`, `stats` (EngineStats: steps, live rows, chains,
  admissions, host time).
- Host syncs: one per chain read (an event on its pinned copy), none in admission.
Refuses (ValueError): an empty prompt or one that leaves no room for a reply, ids outside the
vocabulary, top_k above TOP_K_MAX, more than MAX_STOPS stop ids, unknown request ids,
n_slots < 1, max_len above the model's max_seq_len, a chain outside [1, MAX_RUN].
"""

from __future__ import annotations

import itertools
import operator
import random
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from tinyllm.cuda_graph import MAX_RUN, Chunk, SlotGraphDecoder
from tinyllm.decode.row_limits import FULL, LENGTH, MAX_STOPS, STOP
from tinyllm.decode.row_sampler import TOP_K_MAX
from tinyllm.decode.sampling import SamplingParams
from tinyllm.kv_cache import SlotKVCache, device_ids
from tinyllm.model import Transformer

GREEDY = SamplingParams()  # the default: argmax, 256 tokens at most
PREFILL_TOKENS = 16384  # padded tokens in one admission prefill (bounds its activations)
REASONS = {STOP: "stop", LENGTH: "length", FULL: "full"}


class TokenEvent(NamedTuple):
    request_id: int
    token: int
    finish_reason: str | None  # None while the request goes on; "stop", "length", "full", "cancelled"


@dataclass(eq=False)
class Request:
    id: int
    prompt: list[int]
    params: SamplingParams
    stop_ids: list[int]
    seed: int
    tokens: list[int] = field(default_factory=list)  # the reply so far
    finish_reason: str | None = None
    slot: int | None = None  # the slot it runs (or ran) in; None while waiting

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineStats:
    steps: int = 0  # decode steps launched
    rows: int = 0  # live rows over those steps (tokens drawn by decode steps)
    chains: int = 0  # runs launched (one replay each with graphs)
    admitted: int = 0  # requests prefilled
    admit_s: float = 0.0  # host time in admissions (prefills launched, first tokens drawn)
    wait_s: float = 0.0  # host time waiting for a chain's report
    step_s: float = 0.0  # host time in step(), waits included
    kv_tokens: int = 0  # cached positions the live rows' attention covered, summed over steps

    def occupancy(self, n_slots: int) -> float:
        return self.rows / max(self.steps, 1) / n_slots


@dataclass
class _Launched:
    chunk: Chunk
    owners: list[tuple[int, Request]]  # (slot, request) live when it was launched
    steps: int


class Engine:
    """Continuous batching over SlotKVCache; see the module docstring."""

    def __init__(self, model: Transformer, n_slots: int, max_len: int | None = None,
                 use_graph: bool | None = None, buckets: tuple[int, ...] | None = None,
                 compile: str | None = None, chain: int | None = None, overlap: bool | None = None,
                 min_admit: int = 1, row_buckets: tuple[int, ...] | None = None, token_events: bool = True):
        cfg = model.cfg
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        max_len = max_len or cfg.max_seq_len
        if not 2 <= max_len <= cfg.max_seq_len:
            raise ValueError(f"max_len must be in [2, max_seq_len {cfg.max_seq_len}], got {max_len}")
        cuda = model.device.type == "cuda"
        self.chain = chain or (8 if cuda else 1)
        if not 1 <= self.chain <= MAX_RUN:
            raise ValueError(f"chain must be in [1, {MAX_RUN}] steps, got {self.chain}")
        self.overlap = cuda if overlap is None else overlap
        self.model, self.n_slots, self.max_len, self.min_admit = model, n_slots, max_len, min_admit
        self.token_events = token_events
        self.slots = SlotKVCache(cfg.n_layers, n_slots, max_len, model.device)
        self.decoder = SlotGraphDecoder(model, self.slots, buckets, cuda if use_graph is None else use_graph,
                                        compile, row_buckets)
        self.capture_s = self.decoder.capture(steps=self.chain) if self.decoder.use_graph else 0.0
        self._owner: list[Request | None] = [None] * n_slots
        self._waiting: deque[Request] = deque()
        self._inflight: deque[_Launched] = deque()
        self._ids = itertools.count()
        self.requests: dict[int, Request] = {}
        self.stats = EngineStats()

    # -- requests ------------------------------------------------------------------------

    def add_request(self, prompt_ids: Iterable[int], params: SamplingParams = GREEDY,
                    stop_ids: Iterable[int] = ()) -> int:
        """Queue a request; returns its id. Its tokens come out of step()."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        prompt = self._check_ids(prompt_ids, "prompt_ids")
        stops = sorted(set(self._check_ids(stop_ids, "stop_ids")))
        if not prompt:
            raise ValueError("empty prompt: give at least one token id (e.g. the BOS id)")
        if len(prompt) >= self.max_len:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room for a reply in max_len "
                             f"{self.max_len}: shorten it to at most {self.max_len - 1} tokens or "
                             "raise max_len")
        if params.top_k > TOP_K_MAX:
            raise ValueError(f"top_k must be at most {TOP_K_MAX} in the engine (it samples among the "
                             f"{TOP_K_MAX} likeliest ids), got {params.top_k}")
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop ids a request, got {len(stops)}")
        seed = random.getrandbits(64) if params.seed is None else params.seed
        req = Request(next(self._ids), prompt, params, stops, seed)
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
    def waiting(self) -> int:
        """Requests queued and not yet admitted."""
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting) or any(self.slots.active) or bool(self._inflight)

    def run_until_done(self) -> dict[int, list[int]]:
        """Step until nothing waits or runs; returns every request's reply by id."""
        while self.has_work:
            self.step()
        return {rid: list(r.tokens) for rid, r in self.requests.items()}

    # -- the step ------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> list[TokenEvent]:
        """Admit, launch a chain, read one chain's report (see the module docstring)."""
        t0 = time.perf_counter()
        events: list[TokenEvent] = []
        self._admit_waiting()
        if any(self.slots.active):
            self._launch()
        while len(self._inflight) > (1 if self.overlap and any(self.slots.active) else 0):
            self._read(self._inflight.popleft(), events)
        self.stats.step_s += time.perf_counter() - t0
        return events

    def _admit_waiting(self) -> None:
        free = self.slots.free_slots()
        if not self._waiting or not free:
            return
        if len(free) < min(self.min_admit, len(self._waiting)) and any(self.slots.active):
            return
        t0 = time.perf_counter()
        take = [self._waiting.popleft() for _ in range(min(len(free), len(self._waiting)))]
        take.sort(key=lambda r: len(r.prompt))  # like lengths together: less padding
        at = 0
        for group in self._groups(take):
            self._prefill(free[at:at + len(group)], group)
            at += len(group)
        self.stats.admitted += len(take)
        self.stats.admit_s += time.perf_counter() - t0

    @staticmethod
    def _groups(reqs: list[Request]) -> list[list[Request]]:
        """reqs (sorted by length) in runs of at most PREFILL_TOKENS padded tokens each (a
        single longer prompt is a run of its own)."""
        groups: list[list[Request]] = []
        for req in reqs:
            n = len(req.prompt)
            if groups and n * (len(groups[-1]) + 1) <= PREFILL_TOKENS:
                groups[-1].append(req)
            else:
                groups.append([req])
        return groups

    def _prefill(self, slots: list[int], group: list[Request]) -> Tensor:
        """Eagerly fill slots[r] with group[r]'s prompt, all in one right-padded forward, and
        start their rows: first tokens drawn on the device. Returns the last logits (k, V)."""
        lens = [len(r.prompt) for r in group]
        dev = self.model.device
        idx = device_ids([t for r in group for t in r.prompt + [0] * (max(lens) - len(r.prompt))], dev)
        self.slots.start_prefill(slots, lens)
        logits, _ = self.model(idx.view(len(group), -1), cache=self.slots, at=device_ids([n - 1 for n in lens], dev))
        self.slots.admit(slots)
        for s, req in zip(slots, group, strict=True):
            req.slot, self._owner[s] = s, req
        self.decoder.start_rows(self.slots._prefill_rows, logits[:, 0], [r.params for r in group],
                                [r.seed for r in group], [r.prompt for r in group], [r.stop_ids for r in group])
        return logits[:, 0]

    def _launch(self) -> None:
        owners = [(s, r) for s, r in enumerate(self._owner) if r is not None]
        lens = sum(self.slots.lens[s] for s, _ in owners)
        steps = self.chain
        self.decoder.sampler.pick_variant([r.params for _, r in owners])
        chunk = self.decoder.launch(steps)
        self._inflight.append(_Launched(chunk, owners, steps))
        st = self.stats
        st.chains += 1
        st.steps += steps
        st.kv_tokens += lens * steps + len(owners) * steps * (steps + 1) // 2

    def _read(self, launched: _Launched, events: list[TokenEvent]) -> None:
        """Emit one chain's tokens, request by request (each in the order drawn), and end the
        requests whose rows ended in it."""
        t0 = time.perf_counter()
        report = launched.chunk.ids()  # (S, MAX_RUN + 2): the one host sync of a chain
        self.stats.wait_s += time.perf_counter() - t0
        end = launched.steps + 1
        for s, req in launched.owners:
            if req.finished:
                continue  # cancelled, or ended in a chain read before: what came after is dropped
            row = report[s]
            drawn = [t for t in row[1:end] if t >= 0]  # what the row drew while live
            self.stats.rows += len(drawn)
            new = drawn if req.tokens else [row[0], *drawn]  # column 0: an admitted row's first token
            req.tokens += new
            reason = REASONS.get(row[-1])
            if self.token_events:
                events += [TokenEvent(req.id, t, None) for t in new]
            if reason is not None:
                req.finish_reason = reason
                if self.token_events:
                    events[-1] = events[-1]._replace(finish_reason=reason)
                else:
                    events.append(TokenEvent(req.id, new[-1], reason))
                self._release(req)

    def _release(self, req: Request) -> None:
        s = req.slot
        assert s is not None and self._owner[s] is req, f"request {req.id} holds no slot"
        self.slots.release(s)
        self._owner[s] = None
