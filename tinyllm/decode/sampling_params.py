"""SamplingParams: how a reply is sampled, checked when made; imports no torch, so a CLI can
validate its sampling options (and a UI process hold them) before torch is loaded.

Contract: `LIMITS` is every setting's range and `check(name, value)` the one test of it, used
wherever a setting is set (the CLI and config.toml through tinyllm-chat, `/set`, a stored
chat's settings): a value out of range raises ValueError with one line naming the setting and
its range. The bounds keep every value one a reply can use: the decode step holds the floats
as float32 and top_k as int64, so `temperature 1e308` or `top_k 10**30` failed every reply,
and a temperature, top_p or penalty that rounds to 0 there made every reply NaN noise.
Making a SamplingParams checks each field; `with_value(name, text)` parses one field from
text (for `/set NAME VALUE`). `regen_temperature` is not a reply's setting but the one a
regenerate of a greedy chat samples at (`regenerating`), so it is checked and stored the same
way. tinyllm.decode.sampling re-exports it beside `sample`, which uses it.

Against loops (issue 46): the DRY sampler's settings, named as llama.cpp names them
(`dry_multiplier` 0 = off, `dry_base`, `dry_allowed_length`, `dry_last_n`; tinyllm.decode.sampling
.apply_dry), and `repeat_stop`, the repeats of a span that end a reply ("repeating":
tinyllm.decode.loops; 0 = off; `/set repeat_stop on|off` says REPEAT_STOP or 0). Here both
are off by default, as the repetition penalty is (llama.cpp's defaults); the app's defaults
(chat_app.__main__, and tinyllm eval's) turn them on.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace

DRY_WINDOW = 1024  # the step samplers keep this many latest ids for DRY: dry_last_n's largest value
DRY_MAX_MATCH = 32  # a repeat is counted up to this long (1.75^30 is past any logit: no cap in effect)
REPEAT_STOP = 3  # `repeat_stop on`, the app's default: a span said 3 times in a row ends the reply (decode.loops)
DRY_MULTIPLIER = 0.8  # the app's (and tinyllm eval's) DRY multiplier: docs/BENCHMARKS.md, "Loops"

# name: (its type, whether a value is in range, the range as a refusal says it)
LIMITS: dict[str, tuple[type, Callable[[float], bool], str]] = {
    "temperature": (float, lambda v: v == 0 or 0.001 <= v <= 100, "0 (greedy) or from 0.001 to 100"),
    "top_k": (int, lambda v: 0 <= v <= 1_000_000, "from 0 (off) to 1,000,000"),
    "top_p": (float, lambda v: 0.001 <= v <= 1, "from 0.001 to 1 (1 = off)"),
    "repeat_penalty": (float, lambda v: 0.01 <= v <= 100, "from 0.01 to 100 (1 = off)"),
    "dry_multiplier": (float, lambda v: 0 <= v <= 100, "from 0 (off) to 100"),
    "dry_base": (float, lambda v: 1 <= v <= 10, "from 1 to 10"),
    "dry_allowed_length": (int, lambda v: 1 <= v <= DRY_MAX_MATCH, f"from 1 to {DRY_MAX_MATCH}"),
    "dry_last_n": (int, lambda v: 1 <= v <= DRY_WINDOW, f"from 1 to {DRY_WINDOW} (the latest ids DRY looks at)"),
    "repeat_stop": (int, lambda v: v == 0 or 2 <= v <= 16, f"0 or off, 2 to 16 repeats, or on ({REPEAT_STOP})"),
    "max_tokens": (int, lambda v: 1 <= v <= 1_000_000, "from 1 to 1,000,000"),
    "seed": (int, lambda v: -2**63 <= v < 2**64, "a 64-bit integer (-2**63 to 2**64-1), or none for random"),
    "regen_temperature": (float, lambda v: v == 0 or 0.001 <= v <= 100, "0 (greedy) or from 0.001 to 100"),
}


def check(name: str, value: object) -> None:
    """ValueError (one line: the setting, its range, the value) unless `value` is one a reply can use."""
    kind, ok, allowed = limits(name)
    if value is None and name == "seed":
        return
    if not isinstance(value, numbers.Integral if kind is int else numbers.Real) or not ok(value):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def parse_repeat_stop(text: str) -> int:
    """repeat_stop from text: on (REPEAT_STOP), off (0) or a number."""
    word = text.strip().lower()
    return REPEAT_STOP if word == "on" else 0 if word == "off" else int(text)


def limits(name: str) -> tuple[type, Callable[[float], bool], str]:
    if name not in LIMITS:
        raise ValueError(f"unknown setting {name!r}; one of {', '.join(LIMITS)}")
    return LIMITS[name]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set with this much probability; 1 = off
    repeat_penalty: float = 1.0  # > 1 discourages tokens already in the context; 1 = off
    dry_multiplier: float = 0.0  # DRY: subtract multiplier * base^(match - allowed) from a repeat's next id; 0 = off
    dry_base: float = 1.75  # DRY: how fast the penalty grows with the repeat's length (llama.cpp's 1.75)
    dry_allowed_length: int = 2  # DRY: repeats this long are free (llama.cpp's 2)
    dry_last_n: int = DRY_WINDOW  # DRY: the latest ids it looks back over
    repeat_stop: int = 0  # a reply whose tail says a span this many times ends ("repeating"); 0 = off
    max_tokens: int = 256  # reply length limit
    seed: int | None = None  # for a torch.Generator; None = nondeterministic
    regen_temperature: float = 0.8  # a greedy chat's regenerate samples at this (`regenerating`); 0 = greedy too

    def __post_init__(self) -> None:
        for name in LIMITS:
            check(name, getattr(self, name))

    def with_value(self, name: str, text: str) -> SamplingParams:
        """A copy with one field parsed from text (for `/set NAME VALUE`)."""
        kind, _, allowed = limits(name)
        try:
            value = (None if name == "seed" and text.lower() == "none" else
                     parse_repeat_stop(text) if name == "repeat_stop" else kind(text))
        except ValueError:
            raise ValueError(f"{name} must be {allowed}, got {text!r}") from None
        check(name, value)
        return replace(self, **{name: value})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filtered(self) -> bool:
        """A repetition penalty or DRY is on (the step's sampler runs them: StepSampler.variant)."""
        return self.repeat_penalty != 1.0 or self.dry_multiplier != 0.0

    def regenerating(self, seed: int) -> SamplingParams:
        """The settings a regenerated reply samples with (the app's Ctrl+R; the chat's stay as
        they are for its next reply): a new `seed`, so that a reply written again is a new one
        (with the chat's own seed it would be the same sample again), and where the chat is
        greedy, `regen_temperature` (0: greedy again, the same reply)."""
        return replace(self, seed=seed, temperature=self.regen_temperature if self.greedy else self.temperature)
