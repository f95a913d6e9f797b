"""Turn logits into next tokens: greedy, temperature, top-k, top-p, repetition penalty.

Contract: `sample(logits (B, V), params, generator=None, prev=None) -> (B,) long`, on the
logits' device, without a host sync (sampling uses the exponential-race trick: argmax of
p / Exp(1) noise draws from p). Greedy (temperature 0) is argmax and ignores the generator.
The same params, seed and logits give the same tokens. `prev` (B, N) are the ids already in
the context, for the repetition penalty (CTRL-style: positive logits divided by the
penalty, negative ones multiplied). SamplingParams (tinyllm.sampling_params, no torch) is
re-exported here; it refuses out-of-range params with a ValueError.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinyllm.sampling_params import SamplingParams


def make_generator(params: SamplingParams, device) -> torch.Generator | None:
    if params.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


def apply_repeat_penalty(logits: Tensor, prev: Tensor, penalty: float | Tensor) -> Tensor:
    """logits (B, V) float, prev (B, N) ids -> penalized copy (penalty a float or a (1,) tensor)."""
    seen = logits.gather(1, prev)  # (B, N)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, prev, seen)


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None,
           prev: Tensor | None = None, noise: Tensor | None = None) -> Tensor:
    """logits (B, V) -> next ids (B,). noise (B, V): Exponential(1) draws to use instead of
    the generator's (the in-step sampler's are tested against this function that way)."""
    logits = logits.float()
    if prev is not None and prev.numel() and params.repeat_penalty != 1.0:
        logits = apply_repeat_penalty(logits, prev, params.repeat_penalty)
    if params.greedy:
        return logits.argmax(dim=-1)
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.size(-1):
        kth = logits.topk(params.top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_logits.softmax(dim=-1) >= params.top_p  # mass before this token
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    probs = logits.softmax(dim=-1)  # (B, V)
    if noise is None:
        noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)
