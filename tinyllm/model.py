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
  the positions are picked. SwiGLU is `w13.swiglu(w2, x, norm)`. A half's output scaled before
  the add (`residual_scale`, Granite) is added apart (`add_branch`).
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

from tinyllm.core.linear import ACTIVATIONS, DenseEmbedding, DenseLinear, Embedding, Linear
from tinyllm.core.nn_module import Module
from tinyllm.core.ops import Ops, ops_for
from tinyllm.core.rope import Rope, apply_rope
from tinyllm.families import PRESETS as FAMILY_PRESETS
from tinyllm.kernels import qgemv
from tinyllm.kv_cache import Cache


@dataclass
class ModelConfig:
    vocab_size: int = 32000  # tokens in the tokenizer (embedding and output rows)
    dim: int = 512  # residual stream width
    n_layers: int = 8  # transformer blocks
    n_heads: int = 8  # query heads
    n_kv_heads: int = 8  # key/value heads (grouped-query attention when < n_heads)
    ffn_dim: int = 1408  # gated FFN hidden width
    max_seq_len: int = 2048  # longest sequence RoPE tables and caches are built for
    rope_theta: float = 10000.0  # RoPE base frequency
    norm_eps: float = 1e-5  # RMSNorm epsilon
    tie_embeddings: bool = False  # output projection shares the embedding matrix
    # -- what the model families add (the defaults are Llama's; tinyllm.families says who sets which) --
    family: str = "llama"  # the family the config came from: shown to the user, changes no math
    head_dim: int = 0  # width of one head; 0: dim // n_heads (Qwen 3 and Gemma set their own)
    qkv_bias: bool = False  # q/k/v projections carry a bias (Qwen 2)
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen 3, Gemma 3)
    act: str = "silu"  # the FFN gate's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
    post_norms: bool = False  # RMSNorm on the attention's and the FFN's outputs too (Gemma 2/3)
    embed_scale: float = 1.0  # embeddings are multiplied by this (Gemma: sqrt(dim))
    attn_scale: float = 0.0  # attention's query scale; 0: head_dim ** -0.5 (Gemma: query_pre_attn_scalar)
    attn_softcap: float = 0.0  # attention scores -> cap * tanh(scores / cap); 0: none (Gemma 2)
    final_softcap: float = 0.0  # the same on the output logits (Gemma 2)
    sliding_window: int = 0  # keys a local layer attends (itself included); 0: none
    local_layers: tuple[int, ...] = ()  # layers that attend only the sliding window (Gemma 2/3)
    rope_local_theta: float = 0.0  # the local layers' RoPE base; 0: rope_theta (Gemma 3: 10,000)
    rope_scaling: dict | None = None  # the global RoPE's scaling: {"type": "linear" | "llama3" | "longrope", ...}
    rotary_dim: int = 0  # leading dims of a head that RoPE turns; 0: all of them (Phi-4-mini: 3/4)
    residual_scale: float = 1.0  # each half's output (after its post-norm) times this before the skip connection (Granite)
    logit_divisor: float = 1.0  # the output logits are divided by this, before any final soft-cap (Granite)

    def __post_init__(self) -> None:
        # Every size is checked before anything is allocated: a config (or a GGUF header) that
        # says n_layers=1000000 or context_length=4e9 is a one-line ValueError, not gigabytes.
        for name, top in _LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"model config {name} must be an integer from 1 to {top}, got {value!r}")
        for name in ("rope_theta", "norm_eps", "logit_divisor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"model config {name} must be a positive finite number, got {value!r}")
        for name in ("embed_scale", "attn_scale", "attn_softcap", "final_softcap", "rope_local_theta",
                     "residual_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"model config {name} must be a finite number >= 0, got {value!r}")
        if self.act not in ACTIVATIONS:
            raise ValueError(f"model config act {self.act!r} is not one of {sorted(ACTIVATIONS)}")
        if self.head_dim == 0:
            if self.dim % self.n_heads:
                raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
            self.head_dim = self.dim // self.n_heads
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) or not 1 <= self.head_dim <= 1024:
            raise ValueError(f"model config head_dim must be an integer from 1 to 1024, got {self.head_dim!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.rotary_dim == 0:
            self.rotary_dim = self.head_dim
        if not 0 < self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim {self.rotary_dim} must be even and at most head_dim {self.head_dim}")
        self.local_layers = tuple(self.local_layers)
        if any(not 0 <= i < self.n_layers for i in self.local_layers):
            raise ValueError(f"local_layers {self.local_layers} name a layer past n_layers {self.n_layers}")
        if self.local_layers and not 0 < self.sliding_window:
            raise ValueError("local_layers need a sliding_window")
        check_rope_scaling(self.rope_scaling, self.rotary_dim)
        n_params = self.n_layers * (2 * self.dim * self.q_dim + 2 * self.dim * self.head_dim * self.n_kv_heads
                                    + 3 * self.dim * self.ffn_dim) + 2 * self.vocab_size * self.dim
        if n_params > MAX_PARAMS:
            raise ValueError(f"model config describes {n_params / 1e9:.0f}B parameters; "
                             f"tinyllm opens models up to {MAX_PARAMS / 1e9:.0f}B")

    @property
    def q_dim(self) -> int:
        """The width of all query heads side by side (dim, unless head_dim is set apart)."""
        return self.n_heads * (self.head_dim or self.dim // self.n_heads)

    def to_dict(self) -> dict:
        """The config as JSON writes it back (tuples as lists), so a saved config compares equal to its reload."""
        return {**asdict(self), "local_layers": list(self.local_layers)}

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


ROPE_SCALING = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings"),
                "longrope": ("short_factor", "long_factor", "original_max_position_embeddings")}


def check_rope_scaling(scaling: dict | None, rotary_dim: int) -> None:
    """ValueError unless `scaling` is None or one of ROPE_SCALING with its keys."""
    if scaling is None:
        return
    kind = scaling.get("type") if isinstance(scaling, dict) else None
    if kind not in ROPE_SCALING:
        raise ValueError(f"rope scaling {kind!r} is not supported (tinyllm runs {', '.join(ROPE_SCALING)})")
    missing = [k for k in ROPE_SCALING[kind] if k not in scaling]
    if missing:
        raise ValueError(f"{kind} rope scaling lacks {missing}")
    if kind == "longrope":
        for k in ("short_factor", "long_factor"):
            if len(scaling[k]) != rotary_dim // 2:
                raise ValueError(f"longrope {k} has {len(scaling[k])} values, not rotary_dim / 2 = {rotary_dim // 2}")


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
    # The families' shapes (tinyllm.families: their config.json as tinyllm.formats.hf maps it),
    # for benches with random weights where the real files are not at hand.
    **FAMILY_PRESETS,
}


class RMSNorm(Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight

    def done_count(self, device: torch.device) -> Tensor:
        """An int32 zero a row (qgemv.MAX_ROWS) on `device`: the count a product's kernel keeps when
        it takes this norm as its post-norm (qgemv.linear's `post`), back at zero after each launch.
        Made at the first call on a device (a capture's warm-up runs before it: not in a graph)."""
        done = getattr(self, "_done", None)
        if done is None or done.device != device:
            done = self._done = torch.zeros(qgemv.MAX_ROWS, dtype=torch.int32, device=device)
        return done

    def add_to(self, x: Tensor, y: Tensor) -> Tensor:
        """x + self(y): a post-norm and its skip connection, one kernel for a few rows on CUDA
        outside a compile (qgemv.add_norm; Inductor fuses it itself)."""
        if (qgemv.supported(y) and y.dtype == self.weight.dtype == x.dtype and not torch.compiler.is_compiling()
                and not (torch.is_grad_enabled() and (y.requires_grad or self.weight.requires_grad))):
            return qgemv.add_norm(x, y, (self.weight, self.eps))
        return x + self(y)


def fuse_linears(module: nn.Module, fused: str, parts: dict[str, int], bias: str | None = None) -> None:
    """Keep `module.<fused>` (one layer whose output rows are the parts' rows, in order) in
    memory, but save and load it as the separate `<part>.<tensor>` entries: `weight` for a
    dense layer; `qweight`, `scales` (and `zeros`) for a quantized layer, whose rows split alike.
    `bias` names the module's own Parameter holding the parts' biases side by side, saved and
    loaded as `<part>.bias`."""

    def split(mod, state, prefix, _meta) -> None:
        heads = [(f"{prefix}{fused}.", "")] + ([(f"{prefix}{bias}", "bias")] if bias else [])
        for head, leaf in heads:
            for key in [k for k in state if k.startswith(head) and (leaf or True)]:
                if leaf and key != head:
                    continue
                t = state.pop(key)
                tail = leaf or key[len(head):]
                for name, rows in zip(parts, t.split(list(parts.values())), strict=True):
                    state[f"{prefix}{name}.{tail}"] = rows.clone()  # own storage: files refuse shared tensors

    def join(mod, state, prefix, *_args) -> None:
        for leaf in ("weight", "qweight", "scales", "zeros", "bias"):
            keys = [f"{prefix}{name}.{leaf}" for name in parts]
            if all(k in state for k in keys):
                target = f"{prefix}{bias}" if leaf == "bias" and bias else f"{prefix}{fused}.{leaf}"
                state[target] = torch.cat([state.pop(k) for k in keys])

    module.register_state_dict_post_hook(split)
    module.register_load_state_dict_pre_hook(join)


def positions(T: int, device) -> Tensor:
    """(1, T): the query positions of a forward without a cache."""
    return torch.arange(T, device=device)[None]


def softcap(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap): x squashed into (-cap, cap) (Gemma 2's scores and logits)."""
    return torch.tanh(x / cap) * cap


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, cap: float) -> Tensor:
    """q (B, H, T, D) over k, v (B, H, S, D), keys outside the bool mask (broadcast to (B, H, T, S))
    ignored, scores soft-capped where cap > 0: the attention of layers SDPA cannot run
    (a sliding window is a mask; a soft-cap is not). Scores and softmax in fp32."""
    scores = (q @ k.transpose(-1, -2)).float() * scale  # (B, H, T, S)
    if cap:
        scores = softcap(scores, cap)
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1).to(v.dtype) @ v  # (B, H, T, D)


def add_branch(x: Tensor, out: Linear, y: Tensor, post: RMSNorm | None, scale: float) -> Tensor:
    """x + scale * post(out(y)): a block half's output product, its post-norm (if any), the residual
    scale (Granite's, if not 1) and the skip connection. Without a scale the residual add and the
    post-norm go into the product's kernel (Linear.fused), or the post-norm's (RMSNorm.add_to)."""
    if scale != 1.0:
        branch = out(y) if post is None else post(out(y))  # (B, T, C)
        return x + branch * scale
    return out.fused(y, residual=x, post=post)


class Attention(Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_dim, self.kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.scale = cfg.attn_scale ** -0.5 if cfg.attn_scale else cfg.head_dim ** -0.5
        self.cap = cfg.attn_softcap
        self.sdpa_scale = {"scale": self.scale} if cfg.attn_scale else {}  # SDPA's default is head_dim ** -0.5
        self.local = layer in cfg.local_layers  # attends the sliding window, with the local RoPE
        self.window = cfg.sliding_window if self.local else 0
        self.residual_scale = cfg.residual_scale
        self.wqkv: Linear = DenseLinear(cfg.dim, self.q_dim + 2 * self.kv_dim)
        self.wo: Linear = DenseLinear(self.q_dim, cfg.dim)
        self.bqkv = nn.Parameter(torch.zeros(self.q_dim + 2 * self.kv_dim)) if cfg.qkv_bias else None
        fuse_linears(self, "wqkv", {"wq": self.q_dim, "wk": self.kv_dim, "wv": self.kv_dim},
                     bias="bqkv" if cfg.qkv_bias else None)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        # The fused op (RoPE, cache write and attention in one: ops.rope_attend) runs a layer whose
        # every head's dims are rotated, its per-head q/k norms, its own RoPE table (`rope`), its
        # sliding window and soft-cap too.
        self.fusable = cfg.rotary_dim == cfg.head_dim

    def forward(self, x: Tensor, norm: RMSNorm, cos: Tensor, sin: Tensor, kv, ops: Ops,
                post: RMSNorm | None = None, rope: Rope | None = None) -> Tensor:
        """x + attention(norm(x)) (x + post(attention(norm(x))) with a post-norm): the block's first
        half, skip connection included. `rope`: the layer's own RoPE table where it is not the
        model's (Gemma 3's local layers), for the fused op."""
        B, T, _ = x.shape
        qkv = self.wqkv.fused(x, norm=norm, bias=self.bqkv)  # (B, T, q_dim + 2 kv_dim)
        norms = None if self.q_norm is None else (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        if (self.fusable and kv is not None
                and (y := ops.rope_attend(kv, qkv, cos, sin, self.scale, self.window, self.cap, norms, rope))
                is not None):
            # (B, Hkv, R, D): RoPE, the cache write and attention in one op
            return self._out(y.reshape(B, 1, -1), x, post)
        q, k, v = qkv.split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim)  # (B, T, H, D)
        k = k.view(B, T, self.n_kv_heads, self.head_dim)  # (B, T, Hkv, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # each head's dims normalized
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, D), (B, Hkv, T, D)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is None:
            kwargs = {"is_causal": True}
            if not self.plain:
                kwargs = {"attn_mask": self._mask({}, positions(T, x.device), T)}
            y = self._attend(q, k, v, kwargs, ops, cached=False)
        else:
            k, v = kv.update(k, v)  # (B, Hkv, S, D): every key this step may see
            kwargs = kv.attn_kwargs
            if not self.plain:
                kwargs = {"attn_mask": self._mask(kwargs, kv.query_pos, k.shape[2])}
            y = self._attend(q, k, v, kwargs, ops, cached=True)
        return self._out(y, x, post)

    @property
    def plain(self) -> bool:
        """Attention as SDPA runs it: no window, no soft-cap."""
        return not (self.window or self.cap)

    def _out(self, y: Tensor, x: Tensor, post: RMSNorm | None) -> Tensor:
        return add_branch(x, self.wo, y, post, self.residual_scale)  # (B, T, C)

    def _mask(self, kwargs: dict, q_pos: Tensor, S: int) -> Tensor:
        """The bool mask (B | 1, 1, T, S) of a layer with a window or a soft-cap: the cache's own
        mask (or causal, where it has none), and keys past the window from each query cut off.
        q_pos (B | 1, T): the queries' positions; keys are positions 0..S-1."""
        k_pos = torch.arange(S, device=q_pos.device)  # (S,)
        qp = q_pos[:, None, :, None]  # (B | 1, 1, T, 1)
        mask = kwargs.get("attn_mask")
        if mask is None:
            mask = k_pos <= qp  # (B | 1, 1, T, S)
        if self.window:
            mask = mask & (k_pos > qp - self.window)
        return mask

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
            if mask is not None:  # a windowed (static or slot) decode step, or a layer's own mask
                y = ops.window_attention(q, k, v, mask.view(mask.shape[0], 1, 1, -1), self.scale, self.cap)
            else:
                y = ops.sdpa(q, k, v, {**attn_kwargs, **self.sdpa_scale}, cached)  # (B, Hkv, rep, D)
            return y.reshape(B, 1, -1)
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)  # (B, H, S, D)
            v = v.repeat_interleave(rep, dim=1)
        if self.cap:
            y = masked_attention(q, k, v, attn_kwargs["attn_mask"], self.scale, self.cap)  # (B, H, T, D)
        else:
            y = ops.sdpa(q, k, v, {**attn_kwargs, **self.sdpa_scale}, cached)  # (B, H, T, D)
        return y.transpose(1, 2).reshape(B, T, -1)


class FeedForward(Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w13: Linear = DenseLinear(cfg.dim, 2 * cfg.ffn_dim)  # gate (w1) and up (w3)
        self.w2: Linear = DenseLinear(cfg.ffn_dim, cfg.dim)  # down
        self.act = cfg.act
        self.residual_scale = cfg.residual_scale
        fuse_linears(self, "w13", {"w1": cfg.ffn_dim, "w3": cfg.ffn_dim})

    def forward(self, x: Tensor, norm: RMSNorm, post: RMSNorm | None = None) -> Tensor:
        """x + w2(act(gate) * up) of norm(x) (x + post(...) with a post-norm, the output times
        residual_scale): the block's second half, skip connection included (SwiGLU without a
        post-norm or a scale may run in fewer ops: Linear.swiglu)."""
        if self.act == "silu" and post is None and self.residual_scale == 1.0:
            return self.w13.swiglu(self.w2, x, norm)  # (B, T, C)
        y = self.w13.gated(x, norm, self.act)  # (B, T, F): act(gate) * up
        return add_branch(x, self.w2, y, post, self.residual_scale)  # (B, T, C)


class Block(Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)
        self.post_attn_norm = RMSNorm(cfg.dim, cfg.norm_eps) if cfg.post_norms else None
        self.post_ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps) if cfg.post_norms else None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv, ops: Ops, rope: Rope | None = None) -> Tensor:
        x = self.attn(x, self.attn_norm, cos, sin, kv, ops, self.post_attn_norm, rope)  # x + attn(attn_norm(x))
        return self.ffn(x, self.ffn_norm, self.post_ffn_norm)  # x + ffn(ffn_norm(x))


def native_unsupported(cfg: ModelConfig) -> list[str]:
    """What of `cfg` the native CPU step (tinyllm.decode.cpu_step) does not run, in words. It runs
    every family feature of ModelConfig; its decode attention (cpu_attention.cpp) takes heads of
    a multiple of 8 dims up to 256, and up to 8 query heads a key/value head."""
    checks = {f"a head width of {cfg.head_dim} (a multiple of 8 up to 256 runs)": cfg.head_dim % 8 or cfg.head_dim > 256,
              f"{cfg.n_heads // cfg.n_kv_heads} query heads a key/value head (up to 8 run)":
                  cfg.n_heads // cfg.n_kv_heads > 8}
    return [what for what, on in checks.items() if on]


class Transformer(Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Built on the meta device (every load), the embedding skips its normal init: the meta
        # kernel of normal_ imports torch._refs, 1-3 s of start-up for nothing.
        meta = torch.empty(0).is_meta
        self.tok_emb: Embedding = DenseEmbedding(cfg.vocab_size, cfg.dim,
                                                 _weight=torch.empty(cfg.vocab_size, cfg.dim) if meta else None)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head: Linear = DenseLinear(cfg.dim, cfg.vocab_size)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.rope = Rope(cfg.rotary_dim, cfg.max_seq_len, cfg.rope_theta, scaling=cfg.rope_scaling)
        # The local layers' own RoPE (Gemma 3: base 10,000 beside the global layers' 1,000,000)
        self.rope_local = (Rope(cfg.rotary_dim, cfg.max_seq_len, cfg.rope_local_theta)
                           if cfg.local_layers and cfg.rope_local_theta else None)
        self.ops = ops_for(self.tok_emb.weight.device)  # the attention's ops (tinyllm.core.ops)

    def init_weights(self, seed: int = 0) -> Transformer:
        """Small-normal init (std 0.02; residual outputs scaled by 1/sqrt(2 * n_layers))."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bqkv"):
                nn.init.ones_(p) if name.endswith("norm.weight") else nn.init.zeros_(p)
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
            for rope in self.ropes:
                rope.to(device)
        self.ops = ops_for(device)

    @property
    def ropes(self) -> list[Rope]:
        """Every RoPE table the model reads (a decoder builds them whole before a capture)."""
        return [self.rope] + ([self.rope_local] if self.rope_local is not None else [])

    @property
    def device(self) -> torch.device:
        return self.tok_emb.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (matrices may be held narrower: see the module docstring)."""
        return self.norm.weight.dtype

    def forward(self, idx: Tensor, cache: Cache | None = None, targets: Tensor | None = None,
                last_only: bool = False, at: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """idx (B, T) -> logits (B, T, V); (B, 1, V) for the last position with last_only, or
        for position at[b] of each row with at (B,) (right-padded rows); loss if targets
        (B, T) given (positions with target -100 are ignored)."""
        B, T = idx.shape
        if cache is None:
            if T > self.cfg.max_seq_len:
                raise ValueError(f"sequence of {T} tokens exceeds max_seq_len {self.cfg.max_seq_len}")
            cos, sin = self.rope(T, 0, span=T)  # LongRoPE by the sequence's length (tinyllm.core.rope)
        else:
            cos, sin = cache.begin_step(T, self.rope)
        local = (cos, sin)
        if self.rope_local is not None:  # the same positions in the local table: (B | 1, T, R/2)
            q_pos = positions(T, idx.device) if cache is None else cache.layer(0).query_pos
            local = self.rope_local.cos[q_pos], self.rope_local.sin[q_pos]
        x = self.tok_emb(idx).to(self.dtype)  # (B, T, C)
        if self.cfg.embed_scale != 1.0:
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        for i, block in enumerate(self.blocks):
            c, s = local if block.attn.local else (cos, sin)
            own = self.rope_local if block.attn.local else None  # a local layer's table, where it has its own
            x = block(x, c, s, cache.layer(i) if cache is not None else None, self.ops, own)
        if cache is not None:
            cache.end_step(T)
        if last_only:
            x = x[:, -1:]
        elif at is not None:
            x = x[torch.arange(B, device=x.device), at][:, None]  # (B, 1, C)
        logits = self.lm_head.fused(x, norm=self.norm)  # (B, T, V)
        if self.cfg.logit_divisor != 1.0:
            logits = logits / self.cfg.logit_divisor  # Granite's logits_scaling
        if self.cfg.final_softcap:
            logits = softcap(logits.float(), self.cfg.final_softcap).to(logits.dtype)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                                   ignore_index=-100)
        return logits, loss

    def native_parts(self) -> tuple[list[Tensor], list[list[Tensor]]]:
        """The tensors of the native CPU step (tinyllm.decode.cpu_step), no copies: the model's
        [tok_emb w, s, z | norm | lm_head w, s, z | rope cos, sin | local rope cos, sin], the
        tables (max_seq_len, rotary_dim / 2) (the local ones `rope`'s again without a `rope_local`),
        and each block's [attn_norm | wqkv w, s, z | wo w, s, z | ffn_norm | w13 w, s, z |
        w2 w, s, z | bqkv | q_norm, k_norm | post_attn_norm, post_ffn_norm] (w, s, z:
        Linear.native_parts; an empty tensor for each of the last five the block lacks). The
        scalars and per-layer windows come from `cfg` (cpu_step.build). ValueError naming what
        of the config (native_unsupported) or the first matrix whose layout that step does not read."""
        def parts(name: str, layer: Linear | Embedding) -> list[Tensor]:
            try:
                return layer.native_parts()
            except ValueError as e:
                raise ValueError(f"{name} is {e}") from None

        def weight(norm: RMSNorm | None) -> Tensor:
            return none if norm is None else norm.weight.detach()

        missing = native_unsupported(self.cfg)
        if missing:
            raise ValueError(f"the native CPU step does not run {self.cfg.family}'s {', '.join(missing)} yet")
        none = torch.empty(0, device=self.device)
        local = self.rope_local if self.rope_local is not None else self.rope
        head = [*parts("tok_emb", self.tok_emb), self.norm.weight.detach(), *parts("lm_head", self.lm_head),
                self.rope.cos, self.rope.sin, local.cos, local.sin]  # .cos: built whole (max_seq_len)
        layers = []
        for i, b in enumerate(self.blocks):
            at, a = f"blocks.{i}.", b.attn
            layers.append([b.attn_norm.weight.detach(), *parts(at + "attn.wqkv", a.wqkv),
                           *parts(at + "attn.wo", a.wo), b.ffn_norm.weight.detach(),
                           *parts(at + "ffn.w13", b.ffn.w13), *parts(at + "ffn.w2", b.ffn.w2),
                           none if a.bqkv is None else a.bqkv.detach(), weight(a.q_norm), weight(a.k_norm),
                           weight(b.post_attn_norm), weight(b.post_ffn_norm)])
        return head, layers

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
