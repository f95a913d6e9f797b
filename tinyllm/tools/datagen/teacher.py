"""The teacher: many chat prompts through `Engine` at once, every slot drawing in one batched sample.

Contract:
- `BatchSampledEngine(model, n_slots, params, seed, ...)` is an `Engine` whose requests all
  use one `SamplingParams` (temperature, top-k, top-p, repeat penalty over each slot's last
  REPEAT_WINDOW ids, prompt included, as the app's sampler counts them). Requests are added
  as plain greedy ones (so the engine keeps no per-row context and calls no per-row
  `sample()`); `_sample`, the engine's one sampling hook, then draws every live row in one
  batch: penalty, top-k (one `topk`, no full sort), top-p inside the top k, and counter-based
  noise (`sampling.noise_at`) keyed by the seed. The same seed, requests and order give
  the same tokens on the same device. Why: `Engine` samples a non-greedy row with its own
  `sample()` call, about 25 kernel launches a row a step (~10 ms a step at 64 rows on a GPU,
  against ~1-2 ms for the model step). `min_admit` (Teacher: n_slots // 8) holds waiting
  requests back until that many slots are free, so admissions (one eager prefill each) come
  in groups rather than one per finished request.
- `Teacher(path, device, n_slots=64, max_len=1024, compile=None)` opens the model (`open_any`),
  `Teacher.chat(jobs, params, seed) -> list[Reply]` renders each job (a list of
  {"role", "content"} messages ending with a user turn; no system message: the template's
  default one is NOT added) with the model's chat template as ChatSession encodes it, runs
  them all, and returns each reply's text, token count and whether it ended on a stop id.
  Jobs whose prompt leaves fewer than 16 tokens for a reply come back empty, unfinished.
  `prefills` start replies (a numbered list's "1.").
- `Teacher.stats` counts generated tokens and seconds spent in the engine, and where those
  seconds went: decode steps (`steps`, each up to its host sync), the live rows they carried
  (`occupancy`: rows per step over n_slots; the tail of each `chat` call runs few), and
  admissions (`admit_s`: prefills of waiting requests, each up to its sync).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from tinyllm.decode.engine import Engine
from tinyllm.decode.sampling import SamplingParams, apply_repeat_penalty, noise_at, seed_key
from tinyllm.decode.step_sampler import REPEAT_WINDOW
from tinyllm.tools.data import render_segments


class BatchSampledEngine(Engine):
    def __init__(self, model, n_slots: int, params: SamplingParams, seed: int, min_admit: int = 1, **kw):
        super().__init__(model, n_slots, **kw)
        self.params, self.min_admit = params, min_admit
        device = model.device
        self.ring = torch.zeros(n_slots, REPEAT_WINDOW, dtype=torch.long, device=device)  # (S, R)
        self.ring_at = torch.zeros(n_slots, dtype=torch.long, device=device)  # (S,) next write
        self.key = torch.tensor(seed_key(seed), dtype=torch.long, device=device)  # (2,)
        self.counter = torch.zeros(1, dtype=torch.long, device=device)
        self.n_valid = model.cfg.vocab_size
        self.steps = self.rows = 0  # decode steps, and live rows summed over them
        self.admit_s = self.decode_s = 0.0

    def add(self, prompt_ids: list[int], max_tokens: int, stop_ids) -> int:
        return self.add_request(prompt_ids, SamplingParams(max_tokens=max_tokens), stop_ids)

    def _admit_waiting(self, events) -> None:
        """Admit only once min_admit slots are free (or all the waiting fit, or none runs):
        each admission is one eager prefill, and one per freed slot would cost more than the
        decode step it rides on."""
        free = len(self.slots.free_slots())
        if free < min(self.min_admit, len(self._waiting)) and any(self.slots.active):
            return
        t0 = time.perf_counter()
        super()._admit_waiting(events)
        self.admit_s += time.perf_counter() - t0

    def _decode(self, events) -> None:
        t0 = time.perf_counter()
        self.steps += 1
        self.rows += sum(r is not None for r in self._owner)
        super()._decode(events)
        self.decode_s += time.perf_counter() - t0

    def _sample(self, rows, logits: Tensor, nxt: Tensor) -> Tensor:
        """logits (N, V), nxt (N,): every row's draw in one batch (see the module docstring)."""
        if not rows:
            return nxt
        p = self.params
        for _, req in rows:
            if not req.tokens:  # just admitted: its window starts as the prompt's tail
                tail = req.prompt[-REPEAT_WINDOW:]
                tail = (tail * (-(-REPEAT_WINDOW // len(tail))))[:REPEAT_WINDOW]
                self.ring[req.slot] = torch.tensor(tail, device=self.ring.device)
                self.ring_at[req.slot] = len(req.prompt) % REPEAT_WINDOW
        dev = logits.device
        idx = torch.tensor([j for j, _ in rows], device=dev)  # (N,) rows of logits
        slots = torch.tensor([r.slot for _, r in rows], device=dev)  # (N,)
        x = logits[idx].float()  # (N, V)
        if p.repeat_penalty != 1.0:
            x = apply_repeat_penalty(x, self.ring[slots], p.repeat_penalty)
        if p.greedy:
            tok = x.argmax(dim=-1)  # (N,)
        else:
            k = min(p.top_k or 64, x.shape[-1])  # top-p alone: among the 64 likeliest
            vals, ids = (x / p.temperature).topk(k, dim=-1)  # (N, k), descending
            probs = vals.softmax(dim=-1)
            if p.top_p < 1.0:
                drop = probs.cumsum(dim=-1) - probs >= p.top_p  # mass before this token
                probs = probs.masked_fill(drop, 0.0)
            noise = noise_at(self.key, self.counter, len(rows), k)  # (N, k) Exponential(1)
            self.counter.add_(1)
            tok = ids.gather(1, (probs / noise).argmax(dim=-1, keepdim=True))[:, 0]  # (N,)
        nxt[idx] = tok
        at = self.ring_at[slots]  # (N,)
        self.ring[slots, at] = tok
        self.ring_at[slots] = (at + 1) % REPEAT_WINDOW
        return nxt


@dataclass
class Reply:
    text: str
    n_tokens: int
    finished: bool  # ended on a stop id (not cut by the token limit or the context)


@dataclass
class TeacherStats:
    tokens: int = 0  # generated
    seconds: float = 0.0  # in the engine
    requests: int = 0
    steps: int = 0  # decode steps
    occupancy: float = 0.0  # live rows per step / n_slots
    decode_s: float = 0.0
    admit_s: float = 0.0

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def timing(self) -> dict:
        """For a round's log line: where the engine's time went."""
        return {"steps": self.steps, "occupancy": round(self.occupancy, 3),
                "ms_per_step": round(1000 * self.decode_s / max(self.steps, 1), 2),
                "decode_s": round(self.decode_s, 1), "admit_s": round(self.admit_s, 1),
                "engine_s": round(self.seconds, 1)}


class Teacher:
    def __init__(self, path: str, device: str = "cpu", n_slots: int = 64, max_len: int = 1024,
                 compile: str | None = None, model=None, tokenizer=None, template=None):
        if model is None:
            from tinyllm.formats.open_model import open_any

            model, tokenizer, template, _ = open_any(path, device, quant="none")  # dense: the reference
        self.model, self.tok, self.template = model, tokenizer, template
        self.n_slots, self.compile = n_slots, compile
        self.max_len = min(max_len, model.cfg.max_seq_len)
        stops = {tokenizer.eos_id} | {tokenizer.piece_to_id(s) for s in template.stop}
        self.stop_ids = sorted(i for i in stops if i is not None)
        self.stats = TeacherStats()
        self._engine: BatchSampledEngine | None = None

    def encode(self, messages: list[dict]) -> list[int]:
        """Prompt ids as ChatSession builds them: BOS (if the template wants it), then each
        rendered segment encoded alone, ending with the assistant prefix."""
        assert messages and messages[-1]["role"] == "user", "a job ends with a user turn"
        ids = [self.tok.bos_id] if self.template.bos and self.tok.bos_id is not None else []
        for text, _ in render_segments(messages, self.template):
            ids += self.tok.encode(text)
        return ids

    def count(self, text: str) -> int:
        return len(self.tok.encode(text))

    def engine(self, params: SamplingParams, seed: int) -> BatchSampledEngine:
        """One engine for the teacher's life (a compiled step and its graphs are made once);
        each call resets its sampling settings and noise counter."""
        if self._engine is None:
            self._engine = BatchSampledEngine(self.model, self.n_slots, params, seed, max(1, self.n_slots // 8),
                                              max_len=self.max_len, compile=self.compile)
        e = self._engine
        e.params = params
        e.key.copy_(torch.tensor(seed_key(seed)))
        e.counter.zero_()
        e.requests.clear()
        return e

    def chat(self, jobs: list[list[dict]], params: SamplingParams, seed: int,
             prefills: list[str] | None = None) -> list[Reply]:
        """Replies to every job, in order (see the module docstring). prefills[i], when given,
        starts job i's reply (encoded after the assistant prefix; "1." makes the teacher
        write a numbered list it would otherwise not write) and begins its Reply.text."""
        if not jobs:
            return []
        t0 = time.perf_counter()
        engine = self.engine(params, seed)
        rids: list[int | None] = []
        prefills = prefills or [""] * len(jobs)
        for msgs, pre in zip(jobs, prefills, strict=True):
            ids = self.encode(msgs) + (self.tok.encode(pre) if pre else [])
            room = self.max_len - len(ids)
            rids.append(engine.add(ids, min(params.max_tokens, room), self.stop_ids) if room >= 16 else None)
        engine.run_until_done()
        out: list[Reply] = []
        for rid, pre in zip(rids, prefills, strict=True):
            if rid is None:
                out.append(Reply("", 0, False))
                continue
            toks = engine.result(rid)
            finished = engine.finish_reason(rid) == "stop"
            text = (pre + self.tok.decode(toks[:-1] if finished else toks)).strip()
            out.append(Reply(text, len(toks), finished))
            self.stats.tokens += len(toks)
        self.stats.requests += len(jobs)
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()
        self.stats.seconds += time.perf_counter() - t0
        st = self.stats
        st.steps, st.decode_s, st.admit_s = engine.steps, engine.decode_s, engine.admit_s
        st.occupancy = engine.rows / max(engine.steps, 1) / self.n_slots
        engine.requests.clear()
        return out
