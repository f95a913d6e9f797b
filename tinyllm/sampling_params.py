"""SamplingParams: how a reply is sampled, checked when made; imports no torch, so a CLI can
validate its sampling options (and a UI process hold them) before torch is loaded.

Contract: making one with an out-of-range value raises ValueError with the field's name;
`with_value(name, text)` parses one field from text (for `/set NAME VALUE`). tinyllm.sampling
re-exports it beside `sample`, which uses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set with this much probability; 1 = off
    repeat_penalty: float = 1.0  # > 1 discourages tokens already in the context; 1 = off
    max_tokens: int = 256  # reply length limit
    seed: int | None = None  # for a torch.Generator; None = nondeterministic

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "repeat_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        if self.seed is not None and not -2**63 <= self.seed < 2**64:
            raise ValueError(f"seed must fit in 64 bits (-2**63 to 2**64-1), got {self.seed}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repeat_penalty <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    def with_value(self, name: str, text: str) -> SamplingParams:
        """A copy with one field parsed from text (for `/set NAME VALUE`)."""
        kinds = {"temperature": float, "top_k": int, "top_p": float, "repeat_penalty": float,
                 "max_tokens": int, "seed": int}
        if name not in kinds:
            raise ValueError(f"unknown setting {name!r}; one of {', '.join(kinds)}")
        try:
            value = None if name == "seed" and text.lower() == "none" else kinds[name](text)
        except ValueError:
            raise ValueError(f"{name} needs a {kinds[name].__name__}, got {text!r}") from None
        return replace(self, **{name: value})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
