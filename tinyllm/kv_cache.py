"""Key/value caches for the model's one forward (the cache protocol, docs/INFERENCE.md 4.1).

A cache owns K/V storage and the positions of the tokens in it. The model calls (typed as
`Cache` and `CacheLayer`, the protocol every cache and decode view here speaks):
  cos, sin = cache.begin_step(T, rope)   # RoPE rows for the T new tokens; sets attn kwargs
  k, v = cache.layer(i).update(k, v)     # store the new K/V, return every key this step sees
  cache.layer(i).attn_kwargs             # passed to SDPA (is_causal or attn_mask)
  cache.layer(i).query_pos               # (B | 1, T) the queries' positions (sliding-window layers' masks)
  cache.layer(i).rope_attend(qkv, cos, sin, scale, sliding, cap)  # RoPE, write and attention as one op, or None
  cache.end_step(T)                      # advance the position

Here:
- `causal_kwargs(start, T)` and `padded_causal_mask(start, T, first_valid)`: the attention
  arguments for T queries at positions start.. over keys 0..start+T-1.
- `KVCache`: the eager cache. Preallocated (B, Hkv, max_len, D) per layer on first use,
  prefill from any position (a new turn appends after the old), rows may be left-padded
  (`first_valid` counts each row's pads), `truncate(n)` rewinds. Decode attends over exactly
  n + 1 keys, with no mask when unpadded: the eager reference path.
- `StaticKVCache` (the seed's, also named at its path tinyllm.cuda_graph): a KVCache of fixed
  shapes for the graphed step, its position also on the device (`pos`). `decode(W)` is the view
  one decode step runs through, over the first W keys, masked past `pos`.
- `SlotKVCache`: the continuous engine's cache, one independent row ("slot") per request,
  lengths on the host (`lens`) and on the device (`_lens_dev`), decode through `decode(W)`.
  `release(slot)` and `admit(slots)` never wait for the device: kernels on tensors it already
  holds (a view's zero_, index_fill_) and copies from pinned memory, never from pageable host
  memory (on CUDA such a copy waits for the stream).
- What a decoder asks of the static and slot caches besides the protocol: `decode(W)`, the view
  one decode step over W keys speaks the protocol through (the cache stays in prefill mode),
  `keys_needed(steps)`, `step_state()` (the device tensors a step advances) and
  `advance_host(steps)`.
- `kv_dtype` (every cache): the dtype K/V are held in; None (the default) holds the K/V of the
  first write as they come (the model's dtype). Another dtype is written cast (round to
  nearest even for bf16), and what `update` returns is read back in the new K/V's dtype, so the
  attention sees the query's dtype (the native CPU step reads a bf16 cache itself, and holds
  its decoder's cache in bf16 unless told: tinyllm.decode.cpu_step.KV_DTYPE).
  `torch.int8` (KVCache and StaticKVCache; the native CPU step's compact cache, asked for
  with `use_native(dec, torch.int8)`): K and V held int8 with an fp32 scale a (layer, row,
  kv head, position), `k_scale[i]` and `v_scale[i]` (B, Hkv, rows), written quantized
  (`quantize_int8`: symmetric, absmax / 127, round half to even) and read back dequantized
  (`dequantize_int8`), so an element is off by at most half its head's absmax / 127.
- `kv_storage(shape, dtype, device)`: zeroed storage for one layer's K or V. On a CPU it is an
  anonymous mapping, which the kernel commits a page at a time as positions are first
  written: a 128k-position cache costs memory only for the positions a chat reaches. A read
  of a position never written sees zeros, and every path masks such positions out.
Refuses: writing past max_len ("KV cache full"), a K/V dtype other than the one it holds
(where kv_dtype is None), an int8 SlotKVCache.
"""

from __future__ import annotations

import math
import mmap
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from tinyllm.core.rope import Rope
from tinyllm.kernels import decode_attention


@runtime_checkable
class CacheLayer(Protocol):
    """Layer i of a cache, as attention asks it (`cache.layer(i)`)."""

    @property
    def attn_kwargs(self) -> dict: ...  # passed to SDPA: is_causal, or a bool attn_mask (True: attend)

    @property
    def query_pos(self) -> Tensor: ...  # (B | 1, T): where this step's queries sit

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...  # (B, Hkv, S, D) each

    def rope_attend(self, qkv: Tensor, cos: Tensor, sin: Tensor, scale: float, sliding: int = 0,
                    cap: float = 0.0, norms=None, table: Rope | None = None) -> Tensor | None: ...


@runtime_checkable
class Cache(Protocol):
    """The cache protocol, what `Transformer.forward(idx, cache)` calls: every cache here and
    every decode view (`decode(W)`) speaks it, so the model has one forward."""

    def begin_step(self, T: int, rope: Rope) -> tuple[Tensor, Tensor]: ...

    def layer(self, i: int) -> CacheLayer: ...

    def end_step(self, T: int) -> None: ...


def causal_kwargs(start: int, T: int, device) -> dict:
    """SDPA kwargs for T queries at positions start..start+T-1 over keys 0..start+T-1."""
    if T == 1:
        return {}  # one query sees every key
    if start == 0:
        return {"is_causal": True}
    q_pos = torch.arange(start, start + T, device=device)
    k_pos = torch.arange(start + T, device=device)
    return {"attn_mask": k_pos[None, :] <= q_pos[:, None]}  # (T, S)


def padded_causal_mask(start: int, T: int, first_valid: Tensor) -> Tensor:
    """(B, 1, T, S) bool mask, S = start + T: causal, and no key before the row's first valid
    position. A pad query still sees itself, so no row of the softmax is empty (its output
    is never read)."""
    device = first_valid.device
    q_pos = torch.arange(start, start + T, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(start + T, device=device)[None, :]  # (1, S)
    causal = k_pos <= q_pos  # (T, S)
    valid = k_pos >= first_valid[:, None, None]  # (B, 1, S)
    return ((causal & valid) | (k_pos == q_pos))[:, None]  # (B, 1, T, S)


def device_ids(ids: list[int], device: torch.device) -> Tensor:
    """ids as a long tensor on `device`, copied from pinned memory without waiting (a plain
    torch.tensor(ids, device=cuda) copies from pageable memory, which waits for the stream)."""
    host = torch.tensor(ids, dtype=torch.long, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def check_dtype(held: Tensor, new: Tensor) -> None:
    if held.dtype != new.dtype:
        raise ValueError(f"cache holds {held.dtype}, got {new.dtype}: reset the cache or cast the model")


def kv_storage(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Zeroed K or V storage of `shape`. On a CPU an anonymous mapping (zero, and committed by
    the kernel only where written: torch.zeros would write every page up front); the tensor
    keeps the mapping alive and unmaps it when it is freed."""
    n = math.prod(shape)
    if device.type != "cpu" or n == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    buf = mmap.mmap(-1, n * dtype.itemsize, flags=mmap.MAP_PRIVATE)  # private: a fork copies, never shares
    return torch.frombuffer(buf, dtype=dtype, count=n).view(shape)


def quantize_int8(x: Tensor) -> tuple[Tensor, Tensor]:
    """x (..., D) -> int8 q (..., D) and fp32 scales s (...), x ~ q * s: symmetric, s = absmax / 127
    over the last dim, q = round(x / s) half to even (cpu_step.cpp's store computes the same bits);
    an all-zero row gets s = 0, q = 0."""
    x = x.float()
    s = x.abs().amax(-1) / 127  # (...)
    q = torch.where(s[..., None] > 0, x / s[..., None], 0.0).round_().clamp_(-127, 127)  # (..., D)
    return q.to(torch.int8), s


def dequantize_int8(q: Tensor, s: Tensor, dtype: torch.dtype) -> Tensor:
    """int8 q (..., D) times its scales s (...), in `dtype`."""
    return (q.float() * s[..., None]).to(dtype)  # (..., D)


def read_as(store: Tensor, k: Tensor, scale: Tensor | None = None) -> Tensor:
    """A cache's slice `store` as the attention reads it: in the new K/V `k`'s dtype (an int8
    store dequantized with its scales (..., W))."""
    if scale is not None:
        return dequantize_int8(store, scale, k.dtype)
    return store if store.dtype == k.dtype else store.to(k.dtype)


def held_as(store: Tensor, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """New K or V `x` (..., D) as a cache of `store`'s dtype holds it: cast, or int8 and its scales."""
    if store.dtype == torch.int8:
        return quantize_int8(x)
    return x.to(store.dtype), None


class KVCache:
    """The eager cache: B rows sharing one position n (host int)."""

    def __init__(self, n_layers: int, batch: int, max_len: int, device=None, kv_dtype: torch.dtype | None = None):
        self.n_layers, self.batch, self.max_len = n_layers, batch, max_len
        self.rows = max_len  # positions allocated per layer (a static cache keeps one spare)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.kv_dtype = kv_dtype  # K/V held in this dtype; None: as the first write brings them
        self.k: list[Tensor | None] = [None] * n_layers
        self.v: list[Tensor | None] = [None] * n_layers
        self.k_scale: list[Tensor | None] = [None] * n_layers  # (B, Hkv, rows) fp32, int8 K/V only
        self.v_scale: list[Tensor | None] = [None] * n_layers
        self.first_valid = torch.zeros(batch, dtype=torch.long, device=self.device)
        self.padded = False
        self.n = 0
        self.attn_kwargs: dict = {}

    def reset(self, pad_lens: Tensor | None = None) -> None:
        """Empty the cache; pad_lens (B,) counts each row's left pads in the next prefill."""
        self.n = 0
        self.padded = pad_lens is not None and bool((pad_lens > 0).any())
        self.first_valid.zero_()
        if pad_lens is not None:
            self.first_valid.copy_(pad_lens)

    def truncate(self, n: int) -> None:
        """Forget every position from n on (regenerate, edit)."""
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot truncate to {n}: the cache holds {self.n} positions")
        self.n = n

    def begin_step(self, T: int, rope: Rope) -> tuple[Tensor, Tensor]:
        if self.n + T > self.max_len:
            raise ValueError(f"KV cache full: {self.n} + {T} tokens > max_len {self.max_len}")
        cos, sin = rope(T, self.n)
        self._queries = (self.n, T)
        if self.padded:
            self.attn_kwargs = {"attn_mask": padded_causal_mask(self.n, T, self.first_valid)}
        else:
            self.attn_kwargs = causal_kwargs(self.n, T, cos.device)
        return cos, sin

    def end_step(self, T: int) -> None:
        self.n += T

    def layer(self, i: int) -> LayerKV:
        return LayerKV(self, i)

    @property
    def query_pos(self) -> Tensor:
        """(1, T): the positions of this step's queries (layers with a window build their mask from them)."""
        start, T = self._queries
        return torch.arange(start, start + T, device=self.device)[None]

    def nbytes(self) -> int:
        held = self.k + self.v + self.k_scale + self.v_scale
        return sum(t.numel() * t.element_size() for t in held if t is not None)


class _PrefillLayer:
    """One layer of a cache in prefill mode: its attention kwargs are the cache's, and it has no
    fused RoPE, write and attention (a decode view's only). Subclasses write K/V (`update`)."""

    def __init__(self, cache, i: int):
        self.cache, self.i = cache, i

    @property
    def attn_kwargs(self) -> dict:
        return self.cache.attn_kwargs

    @property
    def query_pos(self) -> Tensor:
        return self.cache.query_pos

    def rope_attend(self, qkv: Tensor, cos: Tensor, sin: Tensor, scale: float, sliding: int = 0,
                    cap: float = 0.0, norms=None, table=None) -> None:
        return None


class LayerKV(_PrefillLayer):
    """One layer's view of a KVCache or StaticKVCache in prefill mode."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        c, i = self.cache, self.i
        B, H, T, D = k.shape  # (B, Hkv, T, D)
        if B != c.batch:
            raise ValueError(f"batch {B} != cache batch {c.batch}")
        if c.k[i] is None:
            shape, dtype = (c.batch, H, c.rows, D), c.kv_dtype or k.dtype
            c.k[i] = kv_storage(shape, dtype, k.device)
            c.v[i] = kv_storage(shape, dtype, v.device)
            if dtype == torch.int8:
                c.k_scale[i] = kv_storage(shape[:3], torch.float32, k.device)  # (B, Hkv, rows)
                c.v_scale[i] = kv_storage(shape[:3], torch.float32, v.device)
        if c.kv_dtype is None:
            check_dtype(c.k[i], k)
        end = c.n + T
        for store, scales, x in ((c.k[i], c.k_scale[i], k), (c.v[i], c.v_scale[i], v)):
            held, s = held_as(store, x)  # cast (or quantized) to the held dtype where it differs
            store[:, :, c.n:end] = held
            if s is not None:
                scales[:, :, c.n:end] = s
        ks, vs = c.k_scale[i], c.v_scale[i]
        return (read_as(c.k[i][:, :, :end], k, None if ks is None else ks[:, :, :end]),
                read_as(c.v[i][:, :, :end], v, None if vs is None else vs[:, :, :end]))  # (B, Hkv, n + T, D)


class StaticKVCache(KVCache):
    """Shared-position cache with fixed shapes (B rows, max_len positions).

    As a cache it prefills eagerly from the current position n (KVCache). `decode(W)` is the
    view one decode step runs through: the position comes from the device tensor `pos`, and
    the step sees the first W keys with a mask, so shapes don't depend on the position.
    `first_valid` (B,) is the left-pad count per row; zeros when unpadded. `kv_dtype`: the
    dtype K/V are held in (the module's contract; None: the model's; int8 with scales
    `k_scale`, `v_scale`, written quantized at pos and read back dequantized).
    """

    def __init__(self, n_layers: int, batch: int, max_len: int, device=None, kv_dtype: torch.dtype | None = None):
        super().__init__(n_layers, batch, max_len, device, kv_dtype)
        # One spare position: every window W <= max_len is then a strict slice of the cache, so
        # a compiled step needs no second variant for W = max_len.
        self.rows = max_len + 1
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)  # graph input

    def reset(self, pad_lens: Tensor | None = None) -> None:
        super().reset(pad_lens)
        self.pos.zero_()

    def truncate(self, n: int) -> None:
        super().truncate(n)
        self.pos.fill_(n)

    def end_step(self, T: int) -> None:
        super().end_step(T)
        self.pos.fill_(self.n)

    def layer(self, i: int) -> StaticLayerKV:
        return StaticLayerKV(self, i)

    # -- what the decoder asks of a cache ---------------------------------------------------

    def decode(self, window: int) -> _StaticDecode:
        assert self.k[0] is not None, "prefill before the first decode step"
        return _StaticDecode(self, window)

    def keys_needed(self, steps: int) -> int:
        if self.n + steps > self.max_len:
            raise ValueError(f"KV cache full: position {self.n + steps} > max_len {self.max_len}")
        return self.n + steps

    def step_state(self) -> list[Tensor]:
        return [self.pos]

    def advance_host(self, steps: int) -> None:
        self.n += steps


class StaticLayerKV(LayerKV):
    """Layer i of a StaticKVCache as a prefill writes it (the seed's protocol): `attn_kwargs`
    (the cache's, set by begin_step) and `update(k, v)`, which writes the T new positions at n
    and returns every key so far, (B, Hkv, n + T, D). A decode step's layers are its view's
    (`decode(W).layer(i)`), which write at the device position instead."""


class _StaticDecode:
    """The cache protocol for one decode step (T=1) of a StaticKVCache over W keys."""

    def __init__(self, cache: StaticKVCache, window: int):
        self.cache, self.window = cache, window
        self._mask: Tensor | None = None

    def begin_step(self, T: int, rope: Rope) -> tuple[Tensor, Tensor]:
        if T != 1:
            raise ValueError("decode mode takes one token per row")
        c = self.cache
        self._mask = None  # built at its first use (attn_kwargs)
        self.rope = rope  # its tables, for rope_attend
        return rope.cos.index_select(0, c.pos), rope.sin.index_select(0, c.pos)

    @property
    def attn_kwargs(self) -> dict:
        """{"attn_mask": (B, 1, 1, W)}, built at the step's first use: a step whose every layer takes
        the fused op (which masks by itself) builds none, four kernels fewer in its graph."""
        if self._mask is None:
            c = self.cache
            k_pos = torch.arange(self.window, device=c.pos.device)  # (W,)
            valid = (k_pos <= c.pos) & (k_pos >= c.first_valid[:, None])  # (B, W)
            self._mask = valid[:, None, None, :]  # (B, 1, 1, W)
        return {"attn_mask": self._mask}

    def layer(self, i: int) -> ViewLayer:
        return ViewLayer(self, i)

    @property
    def query_pos(self) -> Tensor:
        return self.cache.pos[None]  # (1, 1): the device position, as the graph reads it

    def update(self, i: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        c, W = self.cache, self.window
        for store, scales, x in ((c.k[i], c.k_scale[i], k), (c.v[i], c.v_scale[i], v)):
            held, s = held_as(store, x)  # cast, or int8 and its scales (B, Hkv, 1)
            store.index_copy_(2, c.pos, held)  # (B, Hkv, max_len + 1, D) at pos
            if s is not None:
                scales.index_copy_(2, c.pos, s)  # (B, Hkv, max_len + 1) at pos
        ks, vs = c.k_scale[i], c.v_scale[i]
        return (read_as(c.k[i][:, :, :W], k, None if ks is None else ks[:, :, :W]),
                read_as(c.v[i][:, :, :W], v, None if vs is None else vs[:, :, :W]))  # (B, Hkv, W, D)

    def rope_attend(self, i: int, qkv: Tensor, cos: Tensor, sin: Tensor, scale: float, sliding: int = 0,
                    cap: float = 0.0, norms=None, table=None) -> Tensor | None:
        """Layer i's RoPE, cache write at pos and attention over the window, one op on CUDA:
        qkv (B, (H + 2 Hkv) D) -> (B, Hkv, H / Hkv, D); None where the op can't take them.
        The op reads the rotary tables (`table`, a model.Rope, else the step's) at pos and builds
        the window's mask from pos and first_valid itself (cos and sin are the same values, left
        unused: inputs the step already holds, which Inductor hands to every layer's call as they
        are; the mask, attn_kwargs, is built only where a layer asks for it). `norms`: (q_norm,
        k_norm, eps) of a layer that normalizes each head."""
        c = self.cache
        if c.k_scale[i] is not None or not decode_attention.rope_supported(qkv, c.k[i], c.v[i]):
            return None  # (an int8 cache: the unfused step reads it dequantized)
        t = table or self.rope
        return decode_attention.rope_decode_attention(qkv, t.cos, t.sin, c.pos, c.first_valid,
                                                      c.k[i], c.v[i], self.window, scale, sliding, cap, norms)

    def end_step(self, T: int) -> None:
        self.cache.pos.add_(1)  # captured into the graph; the host copy moves in advance_host()


class SlotKVCache:
    """One row ("slot") per request, each with its own length, for continuous batching.

    Prefill (eager, several slots at once): `start_prefill(slots, lens)` then a forward of
    (len(slots), T) right-padded tokens writes each slot's positions 0..T-1. Decode runs
    through the view `decode(W)` (T=1): every slot takes one token at its own position
    `_lens_dev[s]` and attends over the first W keys, masked past its length. Free slots
    compute too (into their own row) but never advance. The host copy `lens` moves in
    `advance_host()`, the device copy inside the (captured) step.
    """

    def __init__(self, n_layers: int, n_slots: int, max_len: int, device=None, kv_dtype: torch.dtype | None = None):
        self.n_layers, self.n_slots, self.max_len = n_layers, n_slots, max_len
        self.rows = max_len + 1  # one spare position: a window W <= max_len is always a strict slice
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if kv_dtype == torch.int8:
            raise ValueError("an int8 K/V cache is the native CPU step's (KVCache, StaticKVCache): "
                             "hold the slot cache in bf16 or the model's dtype")
        self.kv_dtype = kv_dtype  # K/V held in this dtype; None: as the first write brings them
        self.k: list[Tensor | None] = [None] * n_layers
        self.v: list[Tensor | None] = [None] * n_layers
        self.lens = [0] * n_slots  # host lengths: bounds and bucket choice, no sync
        self.active = [False] * n_slots
        self._lens_dev = torch.zeros(n_slots, dtype=torch.long, device=self.device)
        self._active_dev = torch.zeros(n_slots, dtype=torch.long, device=self.device)
        self._slot_ids = torch.arange(n_slots, device=self.device)  # the decode write's row index
        self._first_valid = torch.zeros(n_slots, dtype=torch.long, device=self.device)  # no slot is left-padded
        self.prefill_slots: list[int] | None = None
        self.prefill_lens: list[int] = []
        self._prefill_list: list[int] = []
        self._prefill_rows = self._slot_ids[:0]
        self.attn_kwargs: dict = {}

    def start_prefill(self, slots: list[int], lens: list[int]) -> None:
        """The next forward, (len(slots), T) tokens right-padded to T, prefills slots[r]
        with the first lens[r] tokens of row r from position 0. Positions past a row's length
        get padding K/V, which no decode step reads: each step writes its position first."""
        busy = [s for s in slots if self.active[s]]
        if busy:
            raise ValueError(f"slots {busy} are in use: release them first")
        if len(set(slots)) != len(slots) or len(lens) != len(slots):
            raise ValueError(f"need distinct slots and one length each, got {slots} and {lens}")
        self.prefill_slots, self.prefill_lens = list(slots), list(lens)
        self._prefill_list, self._prefill_rows = list(slots), device_ids(slots, self.device)  # (k,) once, not per layer

    def admit(self, slots: list[int]) -> None:
        """Mark prefilled slots live: decode steps advance them from now on."""
        for s in slots:
            self.active[s] = True
        idx = self._prefill_rows if slots == self._prefill_list else device_ids(slots, self.device)
        self._lens_dev.index_copy_(0, idx, device_ids([self.lens[s] for s in slots], self.device))
        self._active_dev.index_fill_(0, idx, 1)

    def release(self, slot: int) -> None:
        self.active[slot] = False
        self.lens[slot] = 0
        # zero_ on a view: a kernel on the device. `t[slot] = 0` copies a host scalar from
        # pageable memory, which on CUDA waits for the stream (a hidden sync every release).
        self._lens_dev.narrow(0, slot, 1).zero_()
        self._active_dev.narrow(0, slot, 1).zero_()

    def free_slots(self) -> list[int]:
        return [s for s in range(self.n_slots) if not self.active[s]]

    # -- what the decoder asks of a cache ---------------------------------------------------

    def decode(self, window: int, rows: int | None = None) -> _SlotDecode:
        """The view one decode step runs through: the first `rows` slots (all by default) over
        the first `window` keys."""
        return _SlotDecode(self, window, self.n_slots if rows is None else rows)

    def ensure(self, i: int, like: Tensor) -> None:
        """Allocate layer i's K/V on first use, shaped like `like` (S, Hkv, T, D)'s heads."""
        if self.k[i] is None:
            _, H, _, D = like.shape
            shape, dtype = (self.n_slots, H, self.rows, D), self.kv_dtype or like.dtype
            self.k[i] = kv_storage(shape, dtype, like.device)
            self.v[i] = kv_storage(shape, dtype, like.device)
        if self.kv_dtype is None:
            check_dtype(self.k[i], like)

    def keys_needed(self, steps: int) -> int:
        """Keys the next `steps` steps attend at most. A slot stops advancing (on the device) once
        its sequence reaches max_len, so no slot ever needs more than max_len keys."""
        longest = max((self.lens[s] for s in range(self.n_slots) if self.active[s]), default=0)
        return min(longest + steps, self.max_len)

    def step_state(self) -> list[Tensor]:
        return [self._lens_dev]

    def advance_host(self, steps: int = 1) -> None:
        """The host lengths move as if every live slot ran all `steps` (an upper bound: a slot the
        device finished stops earlier), capped at max_len - 1, the most a live slot ever holds."""
        for s in range(self.n_slots):
            if self.active[s]:
                self.lens[s] = min(self.lens[s] + steps, self.max_len - 1)

    # -- prefill (the cache protocol) --------------------------------------------------------

    def begin_step(self, T: int, rope: Rope) -> tuple[Tensor, Tensor]:
        assert self.prefill_slots is not None, "call start_prefill(slots, lens) before a prefill"
        if T > self.max_len:
            raise ValueError(f"KV cache full: prompt of {T} tokens > max_len {self.max_len}")
        cos, sin = rope(T, 0)
        self.attn_kwargs = causal_kwargs(0, T, cos.device)
        self.query_pos = torch.arange(T, device=self.device)[None]  # (1, T): every slot prefills from 0
        return cos, sin

    def end_step(self, T: int) -> None:
        for s, n in zip(self.prefill_slots, self.prefill_lens, strict=True):
            self.lens[s] = n
        self.prefill_slots = None

    def layer(self, i: int) -> _SlotLayerKV:
        return _SlotLayerKV(self, i)


class _SlotDecode:
    """The cache protocol for one decode step of the first `rows` slots over W keys: each slot
    takes one token at its own position `_lens_dev[s]`, masked past its length. On CUDA, in a
    compiled step, `rope_attend` runs RoPE, the write and the attention as one op that reads
    each slot's keys up to its length only."""

    def __init__(self, cache: SlotKVCache, window: int, rows: int):
        self.cache, self.window, self.rows = cache, window, rows
        self._mask: Tensor | None = None

    def begin_step(self, T: int, rope: Rope) -> tuple[Tensor, Tensor]:
        if T != 1:
            raise ValueError("decode mode takes one token per slot")
        lens = self.cache._lens_dev[:self.rows]
        self._mask = None  # built at its first use (attn_kwargs)
        cos = rope.cos.index_select(0, lens)[:, None]  # (S, 1, D/2)
        sin = rope.sin.index_select(0, lens)[:, None]
        self.rope = rope  # its tables, for rope_attend
        return cos, sin

    @property
    def attn_kwargs(self) -> dict:
        """{"attn_mask": (S, 1, 1, W)}, built at the step's first use (see _StaticDecode.attn_kwargs)."""
        if self._mask is None:
            lens = self.cache._lens_dev[:self.rows]
            k_pos = torch.arange(self.window, device=lens.device)
            self._mask = (k_pos[None, :] <= lens[:, None])[:, None, None, :]  # (S, 1, 1, W)
        return {"attn_mask": self._mask}

    def layer(self, i: int) -> ViewLayer:
        return ViewLayer(self, i)

    @property
    def query_pos(self) -> Tensor:
        return self.cache._lens_dev[:self.rows, None]  # (B, 1): each slot's own position

    def update(self, i: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        c, W, B = self.cache, self.window, self.rows
        c.ensure(i, k)  # a capture before any admission decodes first
        # Each slot writes at its own length, as an index_put_ (k (B, Hkv, 1, D) -> (B, Hkv, D) at
        # [slot, :, len]): Inductor keeps it in place. A scatter_ there became a functional
        # scatter of the whole cache and a copy back into it, every layer, every step.
        pos = c._lens_dev[:B].clamp(max=c.max_len - 1)  # (B,)
        c.k[i][c._slot_ids[:B], :, pos] = k[:, :, 0].to(c.k[i].dtype)  # (B, Hkv, D)
        c.v[i][c._slot_ids[:B], :, pos] = v[:, :, 0].to(c.v[i].dtype)
        return read_as(c.k[i][:B, :, :W], k), read_as(c.v[i][:B, :, :W], v)  # (B, Hkv, W, D)

    def rope_attend(self, i: int, qkv: Tensor, cos: Tensor, sin: Tensor, scale: float, sliding: int = 0,
                    cap: float = 0.0, norms=None, table=None) -> Tensor | None:
        """Layer i's RoPE, cache write and attention over the window for the first B = `rows`
        slots, one op on CUDA (decode_attention.rope_decode_attention, a position per slot): qkv
        (B, (H + 2 Hkv) D) -> (B, Hkv, H / Hkv, D); None where the op can't take them, or before
        the layer's K/V exist (the unfused step allocates them). The op reads the tables at each
        slot's length and masks past it itself (cos and sin hold the same values, left unused; the
        mask, attn_kwargs, is not built), and takes the whole caches (their first B rows are the step's).
        Each slot writes at its length unclamped, where `update` clamps it to max_len - 1: the
        same position, since a slot's length never passes max_len - 1 (a slot whose sequence
        reaches max_len stops advancing) and free slots sit at 0; a write at max_len would
        still land in the cache's spare row (rows = max_len + 1)."""
        c, B = self.cache, self.rows
        if c.k[i] is None or not decode_attention.rope_supported(qkv, c.k[i], c.v[i]):
            return None
        t = table or self.rope  # a layer's own table (Gemma 3's local layers), else the step's
        return decode_attention.rope_decode_attention(qkv, t.cos, t.sin, c._lens_dev[:B], c._first_valid[:B],
                                                      c.k[i], c.v[i], self.window, scale, sliding, cap,
                                                      norms)  # (B, Hkv, R, D)

    def end_step(self, T: int) -> None:
        c = self.cache
        c._lens_dev[:self.rows].add_(c._active_dev[:self.rows])  # captured into the graph


class ViewLayer:
    """One layer of a decode view (a static or slot cache's `decode(W)`): the `update` and
    `attn_kwargs` the cache protocol asks of `cache.layer(i)`, passed on to the view."""

    def __init__(self, view, i: int):
        self.view, self.i = view, i

    @property
    def attn_kwargs(self) -> dict:
        return self.view.attn_kwargs

    @property
    def query_pos(self) -> Tensor:
        return self.view.query_pos

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return self.view.update(self.i, k, v)

    def rope_attend(self, qkv: Tensor, cos: Tensor, sin: Tensor, scale: float, sliding: int = 0,
                    cap: float = 0.0, norms=None, table=None) -> Tensor | None:
        """The view's fused RoPE, cache write and attention (tinyllm.core.ops), or None where the view
        has none or cannot take these inputs."""
        return self.view.rope_attend(self.i, qkv, cos, sin, scale, sliding, cap, norms, table)


class _SlotLayerKV(_PrefillLayer):
    """One layer of a SlotKVCache prefill."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        c, i = self.cache, self.i
        T = k.shape[2]  # (B, Hkv, T, D)
        c.ensure(i, k)
        c.k[i][c._prefill_rows, :, :T] = k.to(c.k[i].dtype)  # rows (B,) built once by start_prefill: no copy per layer
        c.v[i][c._prefill_rows, :, :T] = v.to(c.v[i].dtype)
        return k, v  # a prefill from position 0 sees exactly its own keys
