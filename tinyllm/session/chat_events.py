"""What a ChatSession tells its user: plain dataclasses, no torch (the app, in another
process, unpickles them without importing torch).

  Prefilled(n_tokens, ms, dropped)      once per reply: the prefill is done
  Token(text, stats)                    one per generated token (text may be "")
  Finished(reason, text, stats)         reason: "eos" | "max_tokens" | "stopped" | "context_full" | "repeating"
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Message:
    role: str  # "system" | "user" | "assistant"
    content: str
    ids: list[int] = field(default_factory=list, repr=False)  # what this message adds to the context
    stopped: bool = False  # an assistant reply cut short by stop()
    prompt: int = 0  # a user turn's last ids that are the generation prompt's thinking switch (Conversation)


@dataclass
class StepStats:
    window: int  # attention bucket W of the last step
    position: int  # positions filled in the cache
    max_len: int
    tokens: int  # tokens generated in this reply
    tok_per_s: float  # decode speed over this reply
    ttft_ms: float  # time to first token of this reply
    graphs: bool | None  # None: not available (CPU)
    step: str = "plain"  # which decode step runs: "plain", "compiling", "compiled", "compile failed"


@dataclass
class Prefilled:
    n_tokens: int  # ids prefilled for this turn
    ms: float
    dropped: int = 0  # messages dropped from the context to make room


@dataclass
class Token:
    text: str
    stats: StepStats


@dataclass
class Finished:
    reason: str
    text: str
    stats: StepStats
