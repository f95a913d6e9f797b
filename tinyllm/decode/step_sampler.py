"""Sampling inside the decode step: fixed shapes, settings as device tensors, counter-based noise.

Contract:
- `StepSampler(batch, vocab, device)` holds every sampling setting as a device tensor
  (temperature, top_k, top_p, repeat penalty, DRY's four), a ring of the last REPEAT_WINDOW ids
  of each row (the repetition penalty's window), the last DRY_WINDOW ids in order (`hist`, -1
  where none yet: DRY's), the ids that break a DRY match (`breaker` (V,) bool, set once from
  the tokenizer: `set_breakers`), a 64-bit seed and a step counter. One captured (and
  compiled) step therefore serves every setting: `load(params, seed, recent)` changes them
  between steps with plain device copies, never a new capture.
- Inside the step: `push(ids)` adds the ids just fed to the ring, `draw(logits)` returns the
  next ids (B,) and advances the counter. Ids from `n_valid` on (a model whose embeddings are
  padded past its tokenizer) are never drawn. Two choices are host-side, each a variant of the
  step (`variant`): `greedy` (argmax after the penalty, no sort) vs sampling, and `filtered` (a
  repetition penalty or DRY is on: `load` sets it). Unfiltered, a step outside a compile skips
  the penalty and DRY (a penalty of 1 and a DRY multiplier of 0 leave the logits as they are, so
  the draw is the same), and a greedy one takes the argmax of the logits as they come: on CUDA
  those were about 40 of the plain step's 214 kernels, 100 us of SmolLM2's 686. push runs
  always (the ring and history stay what every other step keeps). A compiled step runs them
  always too (Inductor makes them a few kernels), so their settings are values there. Where
  they run outside a compile on CUDA, they are two Triton kernels (tinyllm.kernels.sampler_filters:
  the same x, bit for bit on an H100 and under the interpreter but where torch's CPU pow is not
  correctly rounded; TINYLLM_FUSED_FILTERS=0: the torch code, about 40 kernels). There, too, push
  is one Triton launch instead of five torch ones (tinyllm.kernels.sampler_push), and a greedy
  draw is one (tinyllm.kernels.argmax, the same ids: torch's argmax reduces a row in one block,
  12.8 us of SmolLM2's step on an H100).
  `native_args()` hands a native step (tinyllm.decode.cpu_step) the same tensors, which it advances
  as push and draw do.
- `draw` equals the reference, `sample(logits, params, noise=noise_at(seed, counter), prev=ring,
  history=hist, breaker=breaker)`,
  for every setting (tested on the CPU): the same code (tinyllm.decode.sampling's noise, penalty,
  top-k and top-p) on the same values. Ties in top-k and top-p are broken as one descending
  sort orders them. The native CPU step's C++ Sampler (cpu_sampler.h) draws as `draw` does,
  on these tensors (`native_args`).
- The noise (sampling.noise_at) is a hash of (seed, counter, row, vocab id): the same on every
  device and in every mode, with no generator state to capture. A given seed gives the same
  reply in graph replay, the eager twin and any chunking. Without a seed, `load` draws one on
  the host.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from tinyllm.decode.sampling import SamplingParams, apply_dry, apply_repeat_penalty, draw_sorted, noise_at, seed_key
from tinyllm.decode.sampling_params import DRY_WINDOW
from tinyllm.kernels import qgemv, switches

REPEAT_WINDOW = 64  # the repetition penalty looks at this many latest ids (llama.cpp's default)


class StepSampler:
    def __init__(self, batch: int, vocab: int, device, n_valid: int | None = None):
        self.batch, self.vocab = batch, vocab
        self.n_valid = vocab if n_valid is None else n_valid  # ids from n_valid on are never drawn
        f32 = dict(dtype=torch.float32, device=device)
        i64 = dict(dtype=torch.long, device=device)
        self.temperature = torch.ones(1, **f32)
        self.top_p = torch.ones(1, **f32)
        self.penalty = torch.ones(1, **f32)
        self.top_k = torch.zeros(1, **i64)
        self.key = torch.zeros(2, **i64)
        self.counter = torch.zeros(1, **i64)
        self.ring = torch.zeros(batch, REPEAT_WINDOW, **i64)  # (B, R) the latest ids, in any order
        self.ring_at = torch.zeros(1, **i64)  # where the next pushed id goes
        self.hist = torch.full((batch, DRY_WINDOW), -1, **i64)  # (B, H) the latest ids, oldest first; -1: none
        self.dry = torch.tensor([0.0, 1.75], **f32)  # (2,) DRY's multiplier (0: off) and base
        self.dry_n = torch.tensor([2, DRY_WINDOW], **i64)  # (2,) DRY's allowed length and last-n
        self.breaker = torch.zeros(vocab, dtype=torch.bool, device=device)  # (V,) ids that end a DRY match
        self.argmax_count = torch.zeros(batch, dtype=torch.int32, device=device)  # the argmax kernel's (zeros)
        self.greedy = True  # host-side: which variant of the step runs
        self.filtered = False  # host-side: a repetition penalty or DRY is on (load)

    @property
    def variant(self) -> tuple[bool, bool]:
        """(greedy, filtered): the host-side choices a step's graph is captured for."""
        return self.greedy, self.filtered

    def _filters(self) -> bool:
        """Whether this step runs the penalty and DRY: always in a compile (read first, so Dynamo
        guards on nothing here), else where load() turned them on."""
        return torch.compiler.is_compiling() or self.filtered

    @staticmethod
    def _triton(logits: Tensor) -> bool:
        """Whether our Triton kernels draw from these logits: outside a compile, where Triton runs them
        (CUDA, or the interpreter; switches is read at each call, so a test can switch it)."""
        return (not torch.compiler.is_compiling() and qgemv.available()
                and (logits.is_cuda or switches.SWITCHES.triton_interpret))

    @classmethod
    def _fused_filters(cls, logits: Tensor) -> bool:
        """The penalty and DRY by tinyllm.kernels.sampler_filters (unless TINYLLM_FUSED_FILTERS=0)."""
        return switches.SWITCHES.fused_filters and cls._triton(logits)

    def _argmax(self, x: Tensor, n: int) -> Tensor:
        """x (B, V) -> (B,): the first largest of each row's first n values, by tinyllm.kernels.argmax where
        Triton runs x, else torch's."""
        if self._triton(x) and x.stride(-1) == 1 and x.dtype in (torch.float32, torch.bfloat16, torch.float16):
            from tinyllm.kernels import argmax

            return argmax.argmax(x, n, self.argmax_count)
        return x[:, :n].argmax(dim=-1)

    def state(self) -> list[Tensor]:
        """The tensors a step changes (a capture's warm-up puts them back)."""
        return [self.counter, self.ring, self.ring_at, self.hist]

    def set_breakers(self, ids: list[int]) -> None:
        """The ids that end a DRY match (tinyllm.decode.loops.breaker_ids), from now on."""
        self.breaker.zero_()
        self.breaker[torch.tensor(ids, dtype=torch.long, device=self.breaker.device)] = True

    def native_args(self) -> tuple:
        """What a step that pushes and draws outside Python (tinyllm.decode.cpu_step) reads and advances,
        in its order: ring (B, R), ring_at (1,), penalty (1,), n_valid, hist (B, H), dry (2,),
        dry_n (2,), breaker (V,); then, when sampling,
        temperature (1,), top_k (1,), top_p (1,), key (2,), counter (1,)."""
        greedy = (self.ring, self.ring_at, self.penalty, self.n_valid, self.hist, self.dry, self.dry_n, self.breaker)
        return greedy if self.greedy else (*greedy, self.temperature, self.top_k, self.top_p, self.key, self.counter)

    def load(self, params: SamplingParams, recent: Tensor | None = None, seed: int | None = None) -> None:
        """Settings for the next draws (between steps). recent (B, N) ids already in the context,
        N >= 1; the ring keeps their last REPEAT_WINDOW (fewer: padded with copies, which count
        once, as repeated ids do), and DRY's history their last DRY_WINDOW. seed None:
        params.seed, or a fresh random one."""
        self.greedy = params.greedy
        self.filtered = params.filtered
        self.temperature.fill_(params.temperature if params.temperature > 0 else 1.0)
        self.top_p.fill_(params.top_p)
        self.penalty.fill_(params.repeat_penalty)
        self.top_k.fill_(params.top_k)
        self.dry.copy_(torch.tensor([params.dry_multiplier, params.dry_base]))
        self.dry_n.copy_(torch.tensor([params.dry_allowed_length, params.dry_last_n]))
        seed = params.seed if seed is None else seed
        if seed is None:
            seed = random.getrandbits(64)
        self.key.copy_(torch.tensor(seed_key(seed)))
        self.counter.zero_()
        if recent is not None:
            assert recent.dim() == 2 and recent.shape[1] >= 1, "recent ids: (B, N), N >= 1"
            tail = recent[:, -REPEAT_WINDOW:]  # (B, <=R)
            reps = -(-REPEAT_WINDOW // tail.shape[1])
            self.ring.copy_(tail.repeat(1, reps)[:, :REPEAT_WINDOW])
            self.ring_at.fill_(tail.shape[1] % REPEAT_WINDOW)
            tail = recent[:, -DRY_WINDOW:]  # (B, <=H)
            self.hist.fill_(-1)
            self.hist[:, DRY_WINDOW - tail.shape[1]:] = tail

    def push(self, ids: Tensor) -> None:
        """ids (B, 1): fed this step; they join the penalty's window and DRY's history (one Triton launch
        where Triton runs them: tinyllm.kernels.sampler_push, the same values)."""
        if self._triton(ids) and ids.is_contiguous():
            from tinyllm.kernels import sampler_push

            sampler_push.push(ids, self.ring, self.ring_at, self.hist)
            return
        self.ring.index_copy_(1, self.ring_at, ids)
        self.ring_at.add_(1).remainder_(REPEAT_WINDOW)
        self.hist.copy_(torch.cat([self.hist[:, 1:], ids], dim=1))

    def draw(self, logits: Tensor) -> Tensor:
        """logits (B, V) -> next ids (B,), as sample() draws them with this step's noise."""
        filters = self._filters()
        if self.greedy and not filters:  # the argmax of the valid ids' logits, in their own dtype
            return self._argmax(logits, self.n_valid)
        if filters and self._fused_filters(logits):  # the same x in two Triton kernels
            from tinyllm.kernels import sampler_filters

            x = sampler_filters.filtered_logits(logits, self.n_valid, self.ring, self.penalty, self.hist, self.breaker,
                                                self.dry, self.dry_n)  # (B, V) fp32
        else:
            x = logits.float()  # (B, V)
            if self.n_valid < self.vocab:  # embeddings padded past the tokenizer: never draw those ids
                x[:, self.n_valid:] = float("-inf")
            if filters:
                x = apply_repeat_penalty(x, self.ring, self.penalty)
                x = apply_dry(x, self.hist, self.breaker, self.dry[0:1], self.dry[1:2], self.dry_n[0:1],
                              self.dry_n[1:2])
        if self.greedy:
            return self._argmax(x, self.vocab)
        noise = noise_at(self.key, self.counter, self.batch, self.vocab)  # (B, V)
        self.counter.add_(1)
        return draw_sorted(x, self.temperature, self.top_k, self.top_p, noise)

