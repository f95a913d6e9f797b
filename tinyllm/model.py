"""A Llama-style decoder-only Transformer (RMSNorm, RoPE, grouped-query attention, SwiGLU).

Contract:
- `Transformer.forward(idx, cache=None, targets=None, last_only=False, at=None) -> (logits, loss)`.
  idx (B, T) token ids. Without a cache it runs a causal forward over positions 0..T-1.
  With a cache it speaks the cache protocol (docs/INFERENCE.md, 4.1): `cache.begin_step(T,
  rope) -> (cos, sin)`, `cache.layer(i)` with `update(k, v) -> (k, v)` and `attn_kwargs`
  (passed to SDPA), then `cache.end_step(T)`. Every cache (eager, static, slot) speaks it,
  so there is one forward.
- RoPE uses the "rotate half" layout (the first and second halves of a head form the
  pairs), as Hugging Face Llama checkpoints do; importers of the interleaved layout permute.
- The model computes in `dtype`, its norms' dtype: fp32 on the CPU, bf16 for inference on
  CUDA. RMSNorm and RoPE run in fp32 internally and cast back. A matrix may be held narrower
  than that (a CPU keeps a file's bf16 or fp16 matrices: half the bytes a decode step reads);
  it is converted exactly where it is read, so results are those of the widened matrix.
- Q, K and V are one projection (`attn.wqkv`), and so are SwiGLU's gate and up (`ffn.w13`):
  one matrix product each instead of three and two, which matters when decode is
  launch-bound. `state_dict()` and `load_state_dict()` still speak the separate names
  (`attn.wq/wk/wv`, `ffn.w1/w3`), so checkpoints and importers keep the usual layout.
- The math only: each matrix is a layer of tinyllm.core.linear / tinyllm.core.quant_linear whose class is
  its kernel, chosen when the model is built (tinyllm.formats.build), and the attention's kernels are
  the ops of the weights' device (`Transformer.ops`, tinyllm.core.ops), which the model hands down.
  A layer's `fused(x, norm, residual)` is residual + layer(norm(x)) (a quantized layer on CUDA
  may run the RMSNorm and the residual add inside its product's kernel), so each half of a
  block takes its norm and returns its skip connection (`Attention.forward(x, norm, ...)` =
  x + attention(norm(x))), and the final norm goes into the output product, applied after
  the positions are picked. SwiGLU is `w13.swiglu(w2, x, norm)`.
- A windowed decode step (T=1 with a bool mask) attends through `ops.window_attention`; where
  the ops run RoPE, the cache write and the attention as one op (`ops.rope_attend`: CUDA's
  compiled step over a static or slot cache), the step hands them the raw projections instead.
- `native_parts()`: the model's tensors in the order the native CPU step reads them
  (tinyllm.decode.cpu_step), each matrix's from its layer (`Linear.native_parts`).
- Refuses: sequences longer than `max_seq_len` (ValueError), configs whose heads don't divide.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinyllm.core.linear import DenseEmbedding, DenseLinear, Embedding, Linear
from tinyllm.core.nn_module import Module
from tinyllm.core.ops import Ops, ops_for


@dataclass
class ModelConfig:
    vocab_size: int = 32000  # tokens in the tokenizer (embedding and output rows)
    dim: int = 512  # residual stream width
    n_layers: int = 8  # transformer blocks
    n_heads: int = 8  # query heads; head_dim = dim // n_heads
    n_kv_heads: int = 8  # key/value heads (grouped-query attention when < n_heads)
    ffn_dim: int = 1408  # SwiGLU hidden width
    max_seq_len: int = 2048  # longest sequence RoPE tables and caches are built for
    rope_theta: float = 10000.0  # RoPE base frequency
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tie_embeddings: bool = False  # output projection shares the embedding matrix

    def __post_init__(self) -> None:
        # Every size is checked before anything is allocated: a config (or a GGUF header) that
        # says n_layers=1000000 or context_length=4e9 is a one-line ValueError, not gigabytes.
        for name, top in _LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"model config {name} must be an integer from 1 to {top}, got {value!r}")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"model config {name} must be a positive finite number, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head_dim {self.dim // self.n_heads} must be even for RoPE")
        n_params = self.n_layers * (2 * self.dim * self.dim + 2 * self.dim * self.head_dim * self.n_kv_heads
                                    + 3 * self.dim * self.ffn_dim) + 2 * self.vocab_size * self.dim
        if n_params > MAX_PARAMS:
            raise ValueError(f"model config describes {n_params / 1e9:.0f}B parameters; "
                             f"tinyllm opens models up to {MAX_PARAMS / 1e9:.0f}B")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; expected a subset of {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_name(cls, name: str, **overrides) -> ModelConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


# Upper bounds on every size (far above any model tinyllm runs; they only stop nonsense).
_LIMITS = {"vocab_size": 1 << 22, "dim": 1 << 16, "n_layers": 1024, "n_heads": 1024, "n_kv_heads": 1024,
           "ffn_dim": 1 << 18, "max_seq_len": 1 << 21}
MAX_PARAMS = 200e9

# Named shapes. "tiny" is for tests; "tinyllama-1.1b" is TinyLlama-1.1B's shape.
PRESETS: dict[str, dict] = {
    "tiny": dict(vocab_size=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=172,
                 max_seq_len=1024),
    "tinychat": dict(vocab_size=8192, dim=384, n_layers=6, n_heads=6, n_kv_heads=2, ffn_dim=1024,
                     max_seq_len=1024, tie_embeddings=True),
    "125m": dict(vocab_size=32000, dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048,
                 max_seq_len=2048),
    "tinyllama-1.1b": dict(vocab_size=32000, dim=2048, n_layers=22, n_heads=32, n_kv_heads=4,
                           ffn_dim=5632, max_seq_len=2048),
}


class Rope:
    """Rotary position tables: cos, sin (L, head_dim // 2), fp32, for positions 0..L-1.

    Built when first used, at the length used: `rope(T, start)` grows the tables (doubling,
    up to max_seq_len) to cover start+T; `ensure(n)` does so ahead of time. Nothing is built
    by the constructor, so a model made on the meta device (checkpoint inspection) allocates
    no table, and a huge max_seq_len costs nothing until positions that far are used. `cos`
    / `sin` are the whole tables (built at max_seq_len when first read), for caches that
    gather rows at device-side positions (`rope.cos.index_select(0, pos)`); ModelConfig
    bounds max_seq_len. Tables are computed on the CPU (never under a meta device), then moved.
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float, device=None):
        self.head_dim, self.max_seq_len, self.theta = head_dim, max_seq_len, theta
        self.device = torch.device(device or "cpu")
        self._cos: Tensor | None = None
        self._sin: Tensor | None = None
        self.built = 0  # rows in the tables

    def ensure(self, n: int) -> None:
        """Tables for positions 0..n-1 at least."""
        if n > self.max_seq_len:
            raise ValueError(f"positions up to {n} exceed max_seq_len {self.max_seq_len}")
        if n <= self.built:
            return
        n = min(self.max_seq_len, max(n, 2 * self.built, 256))
        inv_freq = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64, device="cpu")
                                        / self.head_dim)
        t = torch.arange(n, dtype=torch.float64, device="cpu")
        freqs = torch.outer(t, inv_freq)  # (L, D/2)
        self._cos, self._sin = freqs.cos().float().to(self.device), freqs.sin().float().to(self.device)
        self.built = n

    @property
    def cos(self) -> Tensor:
        self.ensure(self.max_seq_len)
        assert self._cos is not None
        return self._cos

    @property
    def sin(self) -> Tensor:
        self.ensure(self.max_seq_len)
        assert self._sin is not None
        return self._sin

    def __call__(self, T: int, start: int = 0) -> tuple[Tensor, Tensor]:
        self.ensure(start + T)
        assert self._cos is not None and self._sin is not None
        return self._cos[start:start + T], self._sin[start:start + T]

    def to(self, device) -> Rope:
        self.device = torch.device(device)
        if self._cos is not None and self._sin is not None:
            self._cos, self._sin = self._cos.to(device), self._sin.to(device)
        return self


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, H, T, D); cos/sin (T, D/2) shared by all rows, or (B, T, D/2) per row."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D/2)
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)  # (B, H, T, D/2) each
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.type_as(x)


class RMSNorm(Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def fuse_linears(module: nn.Module, fused: str, parts: dict[str, int]) -> None:
    """Keep `module.<fused>` (one layer whose output rows are the parts' rows, in order) in
    memory, but save and load it as the separate `<part>.<tensor>` entries: `weight` for a
    dense layer; `qweight`, `scales` (and `zeros`) for a quantized layer, whose rows split alike."""

    def split(mod, state, prefix, _meta) -> None:
        head = f"{prefix}{fused}."
        for key in [k for k in state if k.startswith(head)]:
            t = state.pop(key)
            for name, rows in zip(parts, t.split(list(parts.values())), strict=True):
                state[f"{prefix}{name}.{key[len(head):]}"] = rows.clone()  # own storage: files refuse shared tensors

    def join(mod, state, prefix, *_args) -> None:
        for leaf in ("weight", "qweight", "scales", "zeros"):
            keys = [f"{prefix}{name}.{leaf}" for name in parts]
            if all(k in state for k in keys):
                state[f"{prefix}{fused}.{leaf}"] = torch.cat([state.pop(k) for k in keys])

    module.register_state_dict_post_hook(split)
    module.register_load_state_dict_pre_hook(join)


class Attention(Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_dim, self.kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim ** -0.5
        self.wqkv: Linear = DenseLinear(cfg.dim, self.q_dim + 2 * self.kv_dim)
        self.wo: Linear = DenseLinear(self.q_dim, cfg.dim)
        fuse_linears(self, "wqkv", {"wq": self.q_dim, "wk": self.kv_dim, "wv": self.kv_dim})

    def forward(self, x: Tensor, norm: RMSNorm, cos: Tensor, sin: Tensor, kv, ops: Ops) -> Tensor:
        """x + attention(norm(x)): the block's first half, skip connection included."""
        B, T, _ = x.shape
        qkv = self.wqkv.fused(x, norm=norm)  # (B, T, q_dim + 2 kv_dim)
        if kv is not None and (y := ops.rope_attend(kv, qkv, cos, sin, self.scale)) is not None:
            # (B, Hkv, R, D): RoPE, the cache write and attention in one op
            return self.wo.fused(y.reshape(B, 1, -1), residual=x)
        q, k, v = qkv.split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is None:
            y = self._attend(q, k, v, {"is_causal": True}, ops, cached=False)
        else:
            k, v = kv.update(k, v)  # (B, Hkv, S, D): every key this step may see
            y = self._attend(q, k, v, kv.attn_kwargs, ops, cached=True)
        return self.wo.fused(y, residual=x)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, attn_kwargs: dict, ops: Ops, cached: bool) -> Tensor:
        """(B, T, H D): the heads' outputs, side by side, before the output projection."""
        B, _, T, _ = q.shape
        rep = self.n_heads // self.n_kv_heads
        if T == 1:
            # Decode: the rep query heads of one KV head become rep "positions" of one
            # query sequence, so K/V are read once, not copied rep times. The mask (if any)
            # is per key, so it broadcasts over them.
            q = q.view(B, self.n_kv_heads, rep, self.head_dim)  # (B, Hkv, rep, D)
            mask = attn_kwargs.get("attn_mask")
            if mask is not None:  # a windowed (static or slot) decode step
                y = ops.window_attention(q, k, v, mask, self.scale)  # (B, Hkv, rep, D)
            else:
                y = ops.sdpa(q, k, v, attn_kwargs, cached)  # (B, Hkv, rep, D)
            return y.reshape(B, 1, -1)
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)  # (B, H, S, D)
            v = v.repeat_interleave(rep, dim=1)
        y = ops.sdpa(q, k, v, attn_kwargs, cached)  # (B, H, T, D)
        return y.transpose(1, 2).reshape(B, T, -1)


class FeedForward(Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w13: Linear = DenseLinear(cfg.dim, 2 * cfg.ffn_dim)  # gate (w1) and up (w3)
        self.w2: Linear = DenseLinear(cfg.ffn_dim, cfg.dim)  # down
        fuse_linears(self, "w13", {"w1": cfg.ffn_dim, "w3": cfg.ffn_dim})

    def forward(self, x: Tensor, norm: RMSNorm) -> Tensor:
        """x + w2(silu(gate) * up) of norm(x): the block's second half, skip connection included
        (w13's kernel may run it in fewer ops: Linear.swiglu)."""
        return self.w13.swiglu(self.w2, x, norm)  # (B, T, C)


class Block(Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv, ops: Ops) -> Tensor:
        x = self.attn(x, self.attn_norm, cos, sin, kv, ops)  # x + attn(attn_norm(x))
        return self.ffn(x, self.ffn_norm)  # x + ffn(ffn_norm(x))


class Transformer(Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Built on the meta device (every load), the embedding skips its normal init: the meta
        # kernel of normal_ imports torch._refs, 1-3 s of start-up for nothing.
        meta = torch.empty(0).is_meta
        self.tok_emb: Embedding = DenseEmbedding(cfg.vocab_size, cfg.dim,
                                                 _weight=torch.empty(cfg.vocab_size, cfg.dim) if meta else None)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head: Linear = DenseLinear(cfg.dim, cfg.vocab_size)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.rope = Rope(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.ops = ops_for(self.tok_emb.weight.device)  # the attention's ops (tinyllm.core.ops)

    def init_weights(self, seed: int = 0) -> Transformer:
        """Small-normal init (std 0.02; residual outputs scaled by 1/sqrt(2 * n_layers))."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
                continue
            std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)
        return self

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.follow_weights()
        return out

    def follow_weights(self) -> None:
        """The fp32 RoPE tables (not parameters) and the ops on the weights' device: after the
        weights move (`.to()`), or are assigned (tinyllm.formats.build)."""
        device = self.tok_emb.weight.device
        if device.type != "meta":
            self.rope.to(device)
        self.ops = ops_for(device)

    @property
    def device(self) -> torch.device:
        return self.tok_emb.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (matrices may be held narrower: see the module docstring)."""
        return self.norm.weight.dtype

    def forward(self, idx: Tensor, cache=None, targets: Tensor | None = None,
                last_only: bool = False, at: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """idx (B, T) -> logits (B, T, V); (B, 1, V) for the last position with last_only, or
        for position at[b] of each row with at (B,) (right-padded rows); loss if targets
        (B, T) given (positions with target -100 are ignored)."""
        B, T = idx.shape
        if cache is None:
            if T > self.cfg.max_seq_len:
                raise ValueError(f"sequence of {T} tokens exceeds max_seq_len {self.cfg.max_seq_len}")
            cos, sin = self.rope(T, 0)
        else:
            cos, sin = cache.begin_step(T, self.rope)
        x = self.tok_emb(idx).to(self.dtype)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache.layer(i) if cache is not None else None, self.ops)
        if cache is not None:
            cache.end_step(T)
        if last_only:
            x = x[:, -1:]
        elif at is not None:
            x = x[torch.arange(B, device=x.device), at][:, None]  # (B, 1, C)
        logits = self.lm_head.fused(x, norm=self.norm)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                                   ignore_index=-100)
        return logits, loss

    def native_parts(self) -> tuple[list[Tensor], list[list[Tensor]]]:
        """The tensors of the native CPU step (tinyllm.decode.cpu_step), no copies: the model's
        [tok_emb w, s, z | norm | lm_head w, s, z | rope cos, sin (max_seq_len, head_dim / 2)],
        and each block's [attn_norm | wqkv w, s, z | wo w, s, z | ffn_norm | w13 w, s, z |
        w2 w, s, z] (w, s, z: Linear.native_parts). ValueError naming the first matrix whose
        layout that step does not read."""
        def parts(name: str, layer: Linear | Embedding) -> list[Tensor]:
            try:
                return layer.native_parts()
            except ValueError as e:
                raise ValueError(f"{name} is {e}") from None

        self.rope.ensure(self.rope.max_seq_len)
        head = [*parts("tok_emb", self.tok_emb), self.norm.weight.detach(), *parts("lm_head", self.lm_head),
                self.rope.cos, self.rope.sin]
        layers = []
        for i, b in enumerate(self.blocks):
            at = f"blocks.{i}."
            layers.append([b.attn_norm.weight.detach(), *parts(at + "attn.wqkv", b.attn.wqkv),
                           *parts(at + "attn.wo", b.attn.wo), b.ffn_norm.weight.detach(),
                           *parts(at + "ffn.w13", b.ffn.w13), *parts(at + "ffn.w2", b.ffn.w2)])
        return head, layers

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
