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
- A windowed decode step (T=1 with a bool mask) attends through `decode_attention` when it is
  compiled (a split-K Triton kernel on CUDA, a threaded C++ op on a CPU), else through
  `window_attention`, its reference.
  Where the cache layer offers `rope_attend(qkv, cos, sin, scale)` (a static cache's decode
  view), the compiled step hands it the raw projections instead: RoPE, the cache write and
  the attention then run as one op (decode_attention.rope_decode_attention).
  Not in the plain step: its first use imports Triton and torch's kernel wrapping (measured on
  the H200: start-up to the first reply went from 7.4 to 11.8 s), and the plain step only runs
  until the compiled one is ready.
- `linear(layer, x, norm=None, residual=None)` is residual + layer(norm(x)): a quantized
  layer on CUDA may run the RMSNorm and the residual add inside its product's kernel
  (QuantLinear.fused; by default in the plain step: tinyllm.qgemv.FOLD), so each half of a block
  takes its norm and returns its skip connection
  (`Attention.forward(x, norm, ...)` = x + attention(norm(x))), and the final norm goes into
  the output product, applied after the positions are picked.
- Refuses: sequences longer than `max_seq_len` (ValueError), configs whose heads don't divide.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tinyllm import cpu_qgemv, decode_attention
from tinyllm.nn_module import Module

# Cached attention never uses cuDNN's SDPA: it builds a plan per new shape (measured on an
# H200: 50 ms to 1 s for each new prefill length), and a chat prefills a new length each turn.
CACHED_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


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


# Largest input width K for which a compiled batch-1 step computes x @ W.T as an Inductor
# reduction (see linear). Measured on an H200, compiled step in CUDA graphs: the default model
# (K <= 1408) went from 4,821 to 6,830 tok/s; the TinyLlama-1.1B shape (K >= 2048) from 778
# down to 719, where cuBLAS reads large matrices faster than the generated reduction does.
REDUCTION_MAX_K = 1536
HALF = (torch.bfloat16, torch.float16)  # matrices a CPU may hold narrower than its fp32 activations


def linear(layer: nn.Module, x: Tensor, norm: RMSNorm | None = None, residual: Tensor | None = None) -> Tensor:
    """residual + layer(norm(x)), x (..., K) -> (..., N) in x's dtype, the norm and the residual
    each optional. A quantized layer may run all three as one kernel (QuantLinear.fused: on
    CUDA, a few rows); otherwise they run in that order, as written."""
    fused = getattr(layer, "fused", None)
    if fused is not None and (y := fused(x, norm, residual)) is not None:
        return y
    y = _product(layer, x if norm is None else norm(x))
    return y if residual is None else residual + y


def _product(layer: nn.Module, x: Tensor) -> Tensor:
    """layer(x), x (..., K) -> (..., N) in x's dtype. Inside a compiled step of a single row
    (batch-1 decode), with K <= REDUCTION_MAX_K, it is written as a product and a sum over K
    instead: Inductor makes that one reduction kernel (a matrix-vector product) and fuses
    elementwise work around it into it, where a cuBLAS call is a kernel of its own with a ~3 µs
    floor. A matrix held narrower than x (see the module docstring) always takes that form
    there: its widening is then fused into the loads, never written out; on a CPU where
    tinyllm.cpu_qgemv is loaded (the compile loads it for such a model: cuda_graph.compiled),
    a few rows take its AVX2 op instead (1.4x Inductor's loop for the default model's matrices). Eager code, wider K
    and every batch above one row keep the library matrix product (of the widened matrix).
    A quantized layer (tinyllm.quant.QuantLinear) picks its own kernel in its forward."""
    if type(layer) is not nn.Linear:
        return layer(x)
    w = layer.weight  # (N, K)
    if (torch.compiler.is_dynamo_compiling() and w.dtype in HALF and x.dtype == torch.float32
            and x.device.type == "cpu" and x.shape[:-1].numel() < cpu_qgemv.PREFILL_M and cpu_qgemv.loaded()):
        lead = x.shape[:-1]
        return torch.ops.tinyllm_cpu.mm_half(x.reshape(-1, x.shape[-1]), w).view(*lead, -1)  # (..., N)
    if (torch.compiler.is_dynamo_compiling() and x.shape[:-1].numel() == 1
            and (x.shape[-1] <= REDUCTION_MAX_K or w.dtype != x.dtype)):
        return (x[..., None, :] * w.to(x.dtype)).sum(-1)  # (..., N), fp32 accumulation
    return F.linear(x, w.to(x.dtype), layer.bias)  # torch's own layer, called functionally (tinyllm.nn_module)


def embed(layer: nn.Embedding, idx: Tensor, dtype: torch.dtype) -> Tensor:
    """layer(idx) in `dtype`: torch's own embedding called functionally (tinyllm.nn_module); a
    quantized one (tinyllm.quant.QuantEmbedding) is called as itself."""
    if type(layer) is nn.Embedding:
        return F.embedding(idx, layer.weight).to(dtype)
    return layer(idx)


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
    memory, but save and load it as the separate `<part>.<tensor>` entries: `weight` for an
    nn.Linear; `qweight`, `scales` (and `zeros`) for a quantized layer, whose rows split alike."""

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
        self.wqkv = nn.Linear(cfg.dim, self.q_dim + 2 * self.kv_dim, bias=False)
        self.wo = nn.Linear(self.q_dim, cfg.dim, bias=False)
        fuse_linears(self, "wqkv", {"wq": self.q_dim, "wk": self.kv_dim, "wv": self.kv_dim})

    def forward(self, x: Tensor, norm: RMSNorm, cos: Tensor, sin: Tensor, kv=None) -> Tensor:
        """x + attention(norm(x)): the block's first half, skip connection included."""
        B, T, _ = x.shape
        qkv = linear(self.wqkv, x, norm=norm)  # (B, T, q_dim + 2 kv_dim)
        fused = getattr(kv, "rope_attend", None) if T == 1 and torch.compiler.is_compiling() else None
        if fused is not None and (y := fused(qkv.view(B, -1), cos, sin, self.head_dim ** -0.5)) is not None:
            # (B, Hkv, R, D): RoPE, the cache write and attention in one op
            return linear(self.wo, y.reshape(B, 1, -1), residual=x)
        q, k, v = qkv.split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is None:
            y = self._attend(q, k, v, {"is_causal": True})
        else:
            k, v = kv.update(k, v)  # (B, Hkv, S, D): every key this step may see
            if torch.compiler.is_compiling():  # the context would stop AOTAutograd's cache (warm starts)
                y = self._attend(q, k, v, kv.attn_kwargs)
            else:
                with sdpa_kernel(CACHED_SDPA):
                    y = self._attend(q, k, v, kv.attn_kwargs)
        return linear(self.wo, y, residual=x)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, attn_kwargs: dict) -> Tensor:
        """(B, T, H D): the heads' outputs, side by side, before the output projection."""
        B, _, T, _ = q.shape
        rep = self.n_heads // self.n_kv_heads
        if T == 1:
            # Decode: the rep query heads of one KV head become rep "positions" of one
            # query sequence, so K/V are read once, not copied rep times. The mask (if any)
            # is per key, so it broadcasts over them.
            q = q.view(B, self.n_kv_heads, rep, self.head_dim)  # (B, Hkv, rep, D)
            mask = attn_kwargs.get("attn_mask")
            if mask is not None and torch.compiler.is_compiling() and decode_attention.supported(q, k, v, mask):
                y = decode_attention.decode_attention(q, k, v, mask, self.head_dim ** -0.5)  # (B, Hkv, rep, D)
            elif mask is not None:  # a windowed (static or slot) decode step: the reference
                y = window_attention(q, k, v, mask, self.head_dim ** -0.5)  # (B, Hkv, rep, D)
            else:
                y = F.scaled_dot_product_attention(q, k, v, **attn_kwargs)  # (B, Hkv, rep, D)
            return y.reshape(B, 1, -1)
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)  # (B, H, S, D)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, **attn_kwargs)  # (B, H, T, D)
        return y.transpose(1, 2).reshape(B, T, -1)


def window_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """One decode position over a fixed window of W keys, keys outside `mask` ignored.

    q (B, Hkv, R, D): the R query heads that share a KV head; k, v (B, Hkv, W, D); mask
    (B, 1, 1, W) bool. Returns (B, Hkv, R, D). Written as two matrix products and a softmax
    rather than SDPA: the fused SDPA kernels tile over query rows, and with R <= 8 rows they
    run one or two thread blocks per head down all W keys (measured on an H200: 9 µs a layer at
    W=128, 48 µs at W=1024), while a matrix product spreads W over the whole GPU. Scores and
    softmax are fp32, as in SDPA; the scores are rounded to the weights' dtype once, as in
    Hugging Face's eager attention. `scale` is D ** -0.5, a constant from the config: computed
    from q's size it would be a symbolic float in a dynamic-shape compile, which restarts the
    trace (a warm start then traces twice).

    Compiled on a CPU, the two products are written as products and sums instead, which
    Inductor makes loops of its own (fused with the softmax, one thread: cuda_graph.compiled):
    a library batched product is an OpenMP region of its own per call, and at R <= 8 rows the
    wake-up costs more than the product.
    """
    if q.device.type == "cpu" and torch.compiler.is_dynamo_compiling():
        scores = (q[..., :, None, :] * k[..., None, :, :]).sum(-1).float() * scale  # (B, Hkv, R, W)
        p = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(v.dtype)
        return (p[..., None] * v[..., None, :, :]).sum(-2)  # (B, Hkv, R, D)
    scores = (q @ k.transpose(-1, -2)).float() * scale  # (B, Hkv, R, W)
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1).to(v.dtype) @ v  # (B, Hkv, R, D)


class FeedForward(Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False)  # gate (w1) and up (w3)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)  # down
        fuse_linears(self, "w13", {"w1": cfg.ffn_dim, "w3": cfg.ffn_dim})

    def forward(self, x: Tensor, norm: RMSNorm) -> Tensor:
        """x + ffn(norm(x)): the block's second half, skip connection included."""
        swiglu = getattr(self.w13, "swiglu", None)  # quantized layers may run all of it in fewer kernels
        if swiglu is not None and (y := swiglu(self.w2, x, norm)) is not None:
            return y  # (B, T, C)
        gate, up = linear(self.w13, x, norm=norm).chunk(2, dim=-1)  # (B, T, ffn) each
        return linear(self.w2, F.silu(gate) * up, residual=x)


class Block(Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv=None) -> Tensor:
        x = self.attn(x, self.attn_norm, cos, sin, kv)  # x + attn(attn_norm(x))
        return self.ffn(x, self.ffn_norm)  # x + ffn(ffn_norm(x))


class Transformer(Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Built on the meta device (every load), the embedding skips its normal init: the meta
        # kernel of normal_ imports torch._refs, 1-3 s of start-up for nothing.
        meta = torch.empty(0).is_meta
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim, _weight=torch.empty(cfg.vocab_size, cfg.dim) if meta else None)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.rope = Rope(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)

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
        # Keep the fp32 RoPE tables on the weights' device (they are not parameters).
        out = super()._apply(fn, recurse)
        if self.tok_emb.weight.device.type != "meta":
            self.rope.to(self.tok_emb.weight.device)
        return out

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
        x = embed(self.tok_emb, idx, self.dtype)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache.layer(i) if cache is not None else None)
        if cache is not None:
            cache.end_step(T)
        if last_only:
            x = x[:, -1:]
        elif at is not None:
            x = x[torch.arange(B, device=x.device), at][:, None]  # (B, 1, C)
        logits = linear(self.lm_head, x, norm=self.norm)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                                   ignore_index=-100)
        return logits, loss

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
