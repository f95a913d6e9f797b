"""Rotary position embeddings: the tables and their application, with the scalings the model
families use.

Contract:
- `Rope(rotary_dim, max_seq_len, theta, device=None, scaling=None)`: cos, sin tables
  (L, rotary_dim / 2), fp32, for positions 0..L-1, built when first used, at the length used:
  `rope(T, start)` grows them (doubling, up to max_seq_len) to cover start + T; `ensure(n)` does
  so ahead of time. Nothing is built by the constructor, so a model made on the meta device
  (checkpoint inspection) allocates no table, and a huge max_seq_len costs nothing until
  positions that far are used. `cos` / `sin` are the whole tables (built at max_seq_len when
  first read), for caches that gather rows at device-side positions
  (`rope.cos.index_select(0, pos)`). Tables are computed on the CPU in float64, then moved.
- `scaling` (tinyllm.model.ModelConfig.rope_scaling) changes the frequencies as Hugging Face's
  `modeling_rope_utils` does: "linear" divides them by `factor` (Gemma 3's global layers);
  "llama3" divides the low ones by `factor` and blends the middle band (Llama 3.1/3.2);
  "longrope" divides each by its own factor, `long_factor` where the positions a run uses
  exceed `original_max_position_embeddings`, else `short_factor`, and scales cos and sin by
  the attention factor sqrt(1 + ln(factor) / ln(original)) (Phi-3/4). Which positions a run
  uses: a call's `span` where given (the model's forward without a cache passes its
  sequence's length: Hugging Face's rule), else `set_context(n)` (a decoder's max_len, set
  once for its run, as llama.cpp picks by its context), else the positions asked for. Each
  set of factors has its own tables, so one call never changes the tables another reads (a
  CUDA graph holds their addresses).
- `apply_rope(x, cos, sin)`: the "rotate half" layout (a head's first and second halves of its
  rotary dims form the pairs), as Hugging Face checkpoints store q and k; where the tables are
  narrower than the head (partial rotary: Phi-4-mini), the dims past them pass unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def inv_freq(rotary_dim: int, theta: float, scaling: dict | None, long: bool = False) -> tuple[Tensor, float]:
    """(rotary_dim / 2,) float64 frequencies and the factor cos and sin are scaled by; `long`:
    LongRoPE's long factors (the others ignore it)."""
    base = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    kind = scaling["type"] if scaling else None
    if kind is None:
        return base, 1.0
    if kind == "linear":
        return base / scaling["factor"], 1.0
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / base
        scaled = torch.where(wavelen > old / low, base / factor, base)
        smooth = (old / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, blended, scaled), 1.0
    assert kind == "longrope", kind
    old = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or 1.0
    ext = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float64)
    attn = scaling.get("attention_factor") or (
        1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old)))
    return base / ext, attn


class Rope:
    """Rotary position tables (see the module docstring)."""

    def __init__(self, rotary_dim: int, max_seq_len: int, theta: float, device=None, scaling: dict | None = None):
        self.rotary_dim, self.max_seq_len, self.theta, self.scaling = rotary_dim, max_seq_len, theta, scaling
        self.device = torch.device(device or "cpu")
        self._tables: dict[bool, tuple[Tensor, Tensor]] = {}  # long factors? -> (cos, sin) (L, R/2)
        self.context: int | None = None  # the positions a run uses (set_context); None: each call's

    def set_context(self, n: int | None) -> None:
        """The positions a run will use (LongRoPE's factors are picked by it); None: by each call's."""
        self.context = n

    def long(self, n: int, span: int | None = None) -> bool:
        """Whether positions 0..n-1 take LongRoPE's long factors (by `span`, else the run's
        context, else n: see the module docstring)."""
        s = self.scaling
        length = span or self.context or n
        return bool(s) and s["type"] == "longrope" and length > s["original_max_position_embeddings"]

    @property
    def built(self) -> int:
        """Rows in the tables (of the factors built most)."""
        return max((cos.shape[0] for cos, _ in self._tables.values()), default=0)

    def ensure(self, n: int, span: int | None = None) -> tuple[Tensor, Tensor]:
        """Tables for positions 0..n-1 at least, of the factors `long(n, span)` picks: (cos, sin)."""
        if n > self.max_seq_len:
            raise ValueError(f"positions up to {n} exceed max_seq_len {self.max_seq_len}")
        long = self.long(n, span)
        have = self._tables.get(long)
        built = 0 if have is None else have[0].shape[0]
        if have is not None and n <= built:
            return have
        rows = min(self.max_seq_len, max(n, 2 * built, 256))
        freq, attn = inv_freq(self.rotary_dim, self.theta, self.scaling, long)
        t = torch.arange(rows, dtype=torch.float64, device="cpu")
        freqs = torch.outer(t, freq)  # (L, R/2)
        tables = (freqs.cos() * attn).float().to(self.device), (freqs.sin() * attn).float().to(self.device)
        self._tables[long] = tables
        return tables

    @property
    def cos(self) -> Tensor:
        return self.ensure(self.max_seq_len)[0]

    @property
    def sin(self) -> Tensor:
        return self.ensure(self.max_seq_len)[1]

    def __call__(self, T: int, start: int = 0, span: int | None = None) -> tuple[Tensor, Tensor]:
        cos, sin = self.ensure(start + T, span)
        return cos[start:start + T], sin[start:start + T]

    def to(self, device) -> Rope:
        self.device = torch.device(device)
        self._tables = {k: (cos.to(device), sin.to(device)) for k, (cos, sin) in self._tables.items()}
        return self


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, H, T, D); cos/sin (T, R/2) shared by all rows, or (B, T, R/2) per row; R <= D."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, R/2)
    rot = 2 * cos.shape[-1]
    xf = x.float()
    x1, x2 = xf[..., :rot].chunk(2, dim=-1)  # (B, H, T, R/2) each
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    if rot < x.shape[-1]:
        out = torch.cat((out, xf[..., rot:]), dim=-1)  # the dims RoPE leaves alone
    return out.type_as(x)
