"""How many positions a session opens with: the model's own context, up to a memory budget.

Contract: `choose_context(cfg, device, asked, budget, kv_bytes)` returns a `Context`:
- `asked` (the app's --max-len or config.toml's max_len) wins, up to the model's own
  `max_seq_len`; above it is a ValueError that names the model's maximum (a silent cap would
  let a user believe they had positions they do not have).
- Otherwise the model's own context, cut where its K/V would pass `budget` (a share, 0 < b <= 1,
  of the memory free now: MemAvailable on a CPU, `torch.cuda.mem_get_info` on CUDA, read after
  the weights are in place) to a multiple of 256 positions, and never below `FLOOR`.
`Context.note` says in words why the number is what it is when it is less than the model's
(F1, /show and the app's one notice print it); `capped` is True then.

Why a share of free memory and not of the total: the weights, the runtime and the rest of the
machine are already out of it. Why 0.5 by default: a CPU cache costs RSS only as positions are
written (tinyllm.kv_cache allocates untouched pages), so the budget is what a full context may
grow to while the machine keeps the other half; on CUDA it is allocated whole, for the graphs'
fixed addresses, and CUDA graphs, the compile and the prefill's activations need the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from tinyllm.model import ModelConfig

DEFAULT_BUDGET = 0.5  # share of free memory a full context's K/V may take
FLOOR = 2048  # never fewer positions than this from the budget (the model's own, if it has fewer)
GRAIN = 256  # a budget-cut context is a multiple of this


@dataclass(frozen=True)
class Context:
    max_len: int  # positions the session's cache holds
    model_max: int  # the model's own context (cfg.max_seq_len)
    kv_bytes: int  # K/V bytes of one position, every layer
    free: int  # bytes free when chosen (0: not measured, the length was asked for)
    budget: float  # the share of `free` the K/V may take

    @property
    def capped(self) -> bool:
        return self.max_len < self.model_max

    @property
    def note(self) -> str:
        """Why the context is less than the model's own, in one sentence ("" when it is not)."""
        if not self.capped:
            return ""
        if not self.free:
            return f"the context is {self.max_len:,} of the model's {self.model_max:,} positions, as asked"
        full = self.model_max * self.kv_bytes
        return (f"the context is {self.max_len:,} of the model's {self.model_max:,} positions: a full one's "
                f"K/V ({_gb(full)}) would pass the memory budget ({self.budget:.0%} of {_gb(self.free)} free); "
                f"--max-len {self.model_max} or context_budget in config.toml raise it")


def kv_bytes_per_position(cfg: ModelConfig, element_size: int) -> int:
    """K and V of one position in every layer: 2 * n_layers * n_kv_heads * head_dim * element_size."""
    head_dim = cfg.head_dim or cfg.dim // cfg.n_heads
    return 2 * cfg.n_layers * cfg.n_kv_heads * head_dim * element_size


def free_memory(device: torch.device) -> int:
    """Bytes free now: on CUDA the device's free memory, on a CPU /proc/meminfo's MemAvailable
    (else free physical pages)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_budget(budget: float) -> float:
    if not 0 < budget <= 1:
        raise ValueError(f"context_budget must be a share of free memory, 0 < budget <= 1, got {budget}")
    return budget


def choose_context(cfg: ModelConfig, device: torch.device, asked: int | None = None,
                   budget: float | None = None, kv_bytes: int | None = None) -> Context:
    """The session's context: `asked` if given (at most the model's own), else the model's own
    cut to `budget` (default DEFAULT_BUDGET) of free memory; `kv_bytes` per position (default:
    the cache's dtype on `device`, bf16)."""
    model_max = cfg.max_seq_len
    per = kv_bytes or kv_bytes_per_position(cfg, 2)
    share = check_budget(DEFAULT_BUDGET if budget is None else budget)
    if asked is not None:
        if asked > model_max:
            raise ValueError(f"--max-len {asked} is more than the model's context of {model_max} positions; "
                             f"use at most {model_max}")
        return Context(asked, model_max, per, 0, share)
    free = free_memory(device)
    fits = int(free * share) // per // GRAIN * GRAIN
    return Context(min(model_max, max(fits, FLOOR)), model_max, per, free, share)


def _gb(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"
