"""The eager reference generation loop: the path every fast path is tested against.

Contract: `generate(model, idx, max_new_tokens, params, ...)` prefills idx (B, T) into a
`KVCache` (rows may be left-padded by pad_lens) and yields one (B,) tensor of next ids per
step, as a streaming iterator. Decode attends over exactly the positions so far, with no
mask and no graphs. It stops after max_new_tokens, or once every row has produced one of
`stop_ids` (rows that stopped keep producing tokens the caller ignores). No cleverness:
correctness over speed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from tinyllm.decode.sampling import SamplingParams, make_generator, sample
from tinyllm.kv_cache import KVCache
from tinyllm.model import Transformer


@torch.no_grad()
def generate(model: Transformer, idx: Tensor, max_new_tokens: int,
             params: SamplingParams = SamplingParams(), stop_ids: Sequence[int] = (),
             pad_lens: Tensor | None = None) -> Iterator[Tensor]:
    """idx (B, T) -> yields next ids (B,) for up to max_new_tokens steps."""
    B, T = idx.shape
    max_len = min(T + max_new_tokens, model.cfg.max_seq_len)
    if T >= max_len:
        raise ValueError(f"prompt of {T} tokens leaves no room under max_seq_len {model.cfg.max_seq_len}")
    cache = KVCache(model.cfg.n_layers, B, max_len, model.device)
    cache.reset(pad_lens)
    gen = make_generator(params, model.device)
    context = idx
    logits, _ = model(idx, cache=cache, last_only=True)  # (B, 1, V)
    done = torch.zeros(B, dtype=torch.bool, device=idx.device)
    stops = torch.tensor(list(stop_ids), dtype=torch.long, device=idx.device)
    for i in range(max_len - T):
        tok = sample(logits[:, -1], params, gen, prev=context)  # (B,)
        yield tok
        done |= torch.isin(tok, stops)
        if bool(done.all()) or i == max_len - T - 1:
            return
        context = torch.cat([context, tok[:, None]], dim=1)
        logits, _ = model(tok[:, None], cache=cache)
