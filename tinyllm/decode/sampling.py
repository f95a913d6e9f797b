"""Turn logits into next tokens: greedy, temperature, top-k, top-p, repetition penalty, DRY.

Contract:
- `sample(logits (B, V), params, generator=None, prev=None, noise=None) -> (B,) long`, on the
  logits' device, without a host sync (sampling uses the exponential-race trick: argmax of
  p / Exp(1) noise draws from p). Greedy (temperature 0) is argmax and ignores the generator.
  The same params, seed and logits give the same tokens. `prev` (B, N) are the ids already in
  the context, for the repetition penalty (CTRL-style: positive logits divided by the
  penalty, negative ones multiplied). `history` (B, N), the context's ids in order (-1: none),
  and `breaker` (V,) bool, the ids that break a repeat, are DRY's (`apply_dry`, after the
  penalty, where params.dry_multiplier > 0). SamplingParams (tinyllm.decode.sampling_params, no torch) is
  re-exported here; it refuses out-of-range params with a ValueError.
- The pieces every Python sampler shares, here once (the decode step's StepSampler draws with
  them; the C++ step's Sampler, cpu_sampler.h, is their twin and a parity test keeps the two
  equal): `apply_repeat_penalty`; `apply_dry`; `keep_top(x, top_k, top_p)`, top-k and top-p with the
  settings as tensors and one descending sort; `draw_sorted(x, temperature, top_k, top_p,
  noise)`, a draw with all settings as tensors; `noise_at(key, counter, batch, vocab)`, the
  counter-based Exponential(1) noise (a hash of seed, counter, row and id: the same on every
  device, no generator state), `row_noise(key, counter, ids)`, the same noise with a seed and
  counter per row and no row index (a row's draws then do not depend on its batch: the
  continuous engine's, tinyllm.decode.row_sampler), and `seed_key(seed)`, a 64-bit seed as its
  two 32-bit halves.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.decode.sampling_params import DRY_MAX_MATCH, SamplingParams


def make_generator(params: SamplingParams, device) -> torch.Generator | None:
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


def apply_repeat_penalty(logits: Tensor, prev: Tensor, penalty: float | Tensor) -> Tensor:
    """logits (B, V) float, prev (B, N) ids -> penalized copy (penalty a float or a (1,) tensor)."""
    seen = logits.gather(1, prev)  # (B, N)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, prev, seen)


def apply_dry(logits: Tensor, hist: Tensor, breaker: Tensor, multiplier: float | Tensor, base: float | Tensor,
              allowed: int | Tensor, last_n: int | Tensor) -> Tensor:
    """DRY ("don't repeat yourself", llama.cpp's and koboldcpp's): logits (B, V) fp32 less, at
    each id that would extend a repeat, multiplier * base^(match - allowed), where match is the
    length of the longest latest span of `hist` (B, H) (oldest first, -1: no id) that also
    ends earlier, right before that id, and match >= allowed (the largest such penalty where
    an id follows several). Only the latest `last_n` ids count, a match is counted up to
    DRY_MAX_MATCH ids, and never across an id of `breaker` (V,) bool (a match ends at one).
    The settings are floats or tensors ((1,) or (B, 1)): fixed shapes, no host sync; the
    C++ step's Sampler (cpu_sampler.cpp) is its twin."""
    B, H = hist.shape
    if H < 2:
        return logits
    M = min(DRY_MAX_MATCH, H - 1)
    pos = torch.arange(H, device=hist.device)
    h = hist.masked_fill(pos < H - last_n, -1)  # (B, H) older than last_n: none
    brk = (h < 0) | breaker[h.clamp(min=0)]  # (B, H) ends a match
    tail, tail_brk = h.flip(1)[:, :M, None], brk.flip(1)[:, :M, None]  # (B, M, 1) the k-th latest id
    win = torch.nn.functional.pad(h, (M, 0), value=-2).unfold(1, H - 1, 1)  # (B, M + 2, H - 1)
    earlier = win[:, M - torch.arange(M, device=hist.device)]  # (B, M, H - 1): [b, k, j] = h[b, j - k]
    run = ((earlier == tail) & ~tail_brk).long().cumprod(dim=1).sum(dim=1)  # (B, H - 1) match ending at j
    over = run - allowed  # (B, H - 1)
    pen = torch.where(over >= 0, multiplier * base ** over.clamp(min=0).float(), 0.0)  # (B, H - 1)
    dry = torch.zeros_like(logits).scatter_reduce_(1, h[:, 1:].clamp(min=0), pen, "amax")  # (B, V) for id j + 1
    return logits - dry


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None,
           prev: Tensor | None = None, noise: Tensor | None = None, history: Tensor | None = None,
           breaker: Tensor | None = None) -> Tensor:
    """logits (B, V) -> next ids (B,). noise (B, V): Exponential(1) draws to use instead of
    the generator's (the in-step sampler's are tested against this function that way).
    history (B, N) and breaker (V,): DRY's (`apply_dry`; breaker None: no breakers)."""
    logits = logits.float()
    if prev is not None and prev.numel() and params.repeat_penalty != 1.0:
        logits = apply_repeat_penalty(logits, prev, params.repeat_penalty)
    if history is not None and params.dry_multiplier > 0:
        if breaker is None:
            breaker = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        logits = apply_dry(logits, history, breaker, params.dry_multiplier, params.dry_base,
                           params.dry_allowed_length, params.dry_last_n)
    if params.greedy:
        return logits.argmax(dim=-1)
    logits = logits / params.temperature
    if (params.top_k and params.top_k < logits.size(-1)) or params.top_p < 1.0:  # as tensors: no host copy
        top_k = torch.full((1,), params.top_k, dtype=torch.long, device=logits.device)
        logits = keep_top(logits, top_k, torch.full((1,), params.top_p, device=logits.device))
    probs = logits.softmax(dim=-1)  # (B, V)
    if noise is None:
        noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def keep_top(x: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """x (B, V) fp32 with the values top-k and top-p drop set to -inf, the settings (1,) tensors:
    top-k keeps values >= the k-th largest (0 or >= V: all), then top-p the largest values while
    the softmax mass before each is below top_p (1: all). One descending sort serves both."""
    V = x.shape[-1]
    srt, order = x.sort(dim=-1, descending=True)  # (B, V)
    kth = srt.gather(1, (top_k - 1).clamp(0, V - 1).expand(x.shape[0], 1))  # (B, 1)
    use_k = (top_k > 0) & (top_k < V)  # (1,)
    x = x.masked_fill(use_k & (x < kth), float("-inf"))
    srt = srt.masked_fill(use_k & (srt < kth), float("-inf"))  # = x sorted: masking keeps the order
    p = srt.softmax(dim=-1)
    drop = (p.cumsum(dim=-1) - p >= top_p) & (top_p < 1.0)  # (B, V) mass before this token
    return torch.where(top_p < 1.0, torch.empty_like(x).scatter_(1, order, srt.masked_fill(drop, float("-inf"))), x)


def draw_sorted(x: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, noise: Tensor) -> Tensor:
    """sample()'s non-greedy branch with the settings as (1,) tensors: x (B, V) fp32 penalized
    logits, noise (B, V) Exponential(1) -> (B,). Fixed shapes, no host sync: one captured step
    serves every setting (tinyllm.decode.step_sampler)."""
    probs = keep_top(x / temperature, top_k, top_p).softmax(dim=-1)  # (B, V)
    return (probs / noise).argmax(dim=-1)


_M32 = 0xFFFFFFFF


def _mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xorshift-multiply) on int64 values in [0, 2^32). The multipliers
    are below 2^31, so no product leaves the int64 range."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 16)


def noise_at(key: Tensor, counter: Tensor, batch: int, vocab: int) -> Tensor:
    """Exponential(1) noise (B, V) float32 for one draw: key (2,) int64 (the seed's two 32-bit
    halves), counter (1,) int64 (the draw's number)."""
    device = key.device
    salt = _mix(_mix(key[0:1] ^ (counter & _M32)) ^ key[1:2])  # (1,)
    idx = torch.arange(batch * vocab, device=device, dtype=torch.long).view(batch, vocab)  # (B, V)
    h = _mix(_mix(idx ^ salt) ^ key[1:2])  # (B, V) in [0, 2^32)
    u = ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))  # (B, V) uniform in (0, 1)
    return -torch.log(u)


def row_noise(key: Tensor, counter: Tensor, ids: Tensor) -> Tensor:
    """Exponential(1) noise (N, K) float32 for the vocabulary ids `ids` (N, K) of N rows, each
    with its own key (N, 2) int64 (a seed's two halves) and counter (N,) int64 (its draw's
    number). A hash of (key, counter, id) alone: the same row draws the same noise in any batch,
    at any slot, for the ids it is asked about in any order."""
    salt = _mix(_mix(key[:, 0:1] ^ (counter[:, None] & _M32)) ^ key[:, 1:2])  # (N, 1)
    h = _mix(_mix(ids ^ salt) ^ key[:, 1:2])  # (N, K) in [0, 2^32)
    u = ((h >> 8).float() + 0.5) * (1.0 / (1 << 24))  # (N, K) uniform in (0, 1)
    return -torch.log(u)


def seed_key(seed: int) -> list[int]:
    """A 64-bit seed as its two 32-bit halves."""
    seed &= (1 << 64) - 1
    return [seed & _M32, seed >> 32]
