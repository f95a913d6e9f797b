"""CUDA-graph decode (docs/INFERENCE.md, 4.11 and 4.11b).

A decode step of a small model is launch-bound: ~10 kernels per layer, each a few µs of GPU
work, and the CPU needs about as long to launch each one. A CUDA graph records the whole
step once and replays it with a single launch.

A graph replays fixed kernels on fixed addresses, so the step has static shapes:
- `StaticKVCache` keeps the position as a device tensor. K/V are written with index_copy_
  at that position, RoPE is gathered at it, and every decode step attends over a fixed
  window of W keys, with keys past the position masked out.
- W comes from length buckets (128, 256, ..., max_len). Each bucket has its own graph; the
  step uses the smallest bucket that holds pos + 1 keys. All graphs share one memory pool
  and the same static buffers (cache, input token, position).
- Prefill stays eager: it runs once per turn with a different shape each time. It may start
  at any position n (a new chat turn is appended after the conversation so far), and
  `truncate(n)` rewinds (regenerate). Sampling stays eager too.

`use_graph=False` runs the identical static step eagerly: the reference replay must match
bit for bit, and the path on a CPU (so the app has one decode path everywhere). Toggling
`use_graph` between two steps changes no token. Not bit-identical to the eager `KVCache`
decode: that attends over exactly pos + 1 keys with no mask, and SDPA picks another kernel.

Unlike the seed, no autocast: inference weights on CUDA are bf16 (DESIGN.md), and the step
computes in the weights' dtype. Refuses: graphs without CUDA, a full cache, a wrong batch.

The step also writes the argmax of its logits into its own input buffer (`tok`): greedy
decoding passes `dec.tok` back to `step()`, and needs no sampling kernel and no copy between
two replays.

`compile="inductor"` runs the step through `torch.compile` (dynamic window: one compiled
step serves every bucket below max_len, a second the full window): Inductor fuses RMSNorm,
RoPE and the elementwise work into a few kernels, and the graphs capture the compiled step.
Graph and eager mode then run the same compiled code, so they stay bit-identical; the
compiled step is close to, not bit-equal with, the plain one.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from tinyllm.kv_cache import KVCache, SlotKVCache, _LayerKV
from tinyllm.model import Transformer


def default_buckets(max_len: int, first: int = 128) -> tuple[int, ...]:
    """first, 2*first, ... below max_len, then max_len itself."""
    out, b = [], first
    while b < max_len:
        out.append(b)
        b *= 2
    return (*out, max_len)


def pick_bucket(buckets: tuple[int, ...], n_keys: int) -> int:
    """The smallest bucket that holds n_keys keys."""
    for b in buckets:
        if b >= n_keys:
            return b
    raise ValueError(f"{n_keys} keys exceed the largest bucket {buckets[-1]}")


class StaticKVCache(KVCache):
    """Shared-position cache with fixed shapes (B rows, max_len positions).

    Two modes:
    - prefill (`window` None, eager): as KVCache, from the current position n.
    - decode (`window` set, T=1): the position comes from the device tensor `pos`; returns
      the first `window` keys with a mask, so shapes don't depend on the position.
    `first_valid` (B,) is the left-pad count per row; zeros when unpadded.
    """

    def __init__(self, n_layers: int, batch: int, max_len: int, device=None):
        super().__init__(n_layers, batch, max_len, device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)  # graph input
        self.window: int | None = None

    def reset(self, pad_lens: Tensor | None = None) -> None:
        super().reset(pad_lens)
        self.window = None
        self.pos.zero_()

    def truncate(self, n: int) -> None:
        super().truncate(n)
        self.pos.fill_(n)

    def begin_step(self, T: int, rope) -> tuple[Tensor, Tensor]:
        if self.window is None:
            return super().begin_step(T, rope)
        if T != 1:
            raise ValueError("decode mode takes one token per row")
        k_pos = torch.arange(self.window, device=self.pos.device)  # (W,)
        valid = (k_pos <= self.pos) & (k_pos >= self.first_valid[:, None])  # (B, W)
        self.attn_kwargs = {"attn_mask": valid[:, None, None, :]}  # (B, 1, 1, W)
        return rope.cos.index_select(0, self.pos), rope.sin.index_select(0, self.pos)

    def end_step(self, T: int) -> None:
        if self.window is None:
            super().end_step(T)
            self.pos.fill_(self.n)
        else:
            self.pos.add_(1)  # captured into the graph; the host copy moves in step()

    def layer(self, i: int) -> _StaticLayerKV:
        return _StaticLayerKV(self, i)


class _StaticLayerKV(_LayerKV):
    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        c, i = self.cache, self.i
        if c.window is None or c.k[i] is None:
            assert c.window is None, "prefill before the first decode step"
            return super().update(k, v)
        c.k[i].index_copy_(2, c.pos, k)  # (B, Hkv, max_len, D) at pos
        c.v[i].index_copy_(2, c.pos, v)
        return c.k[i][:, :, :c.window], c.v[i][:, :, :c.window]  # (B, Hkv, W, D)


def compiled(forward, backend: str | None):
    """forward itself, or forward through torch.compile (whole graph, dynamic sizes)."""
    if backend is None:
        return forward
    import torch._dynamo

    # Entries add up over decoders and batch sizes: raise the recompile limit, and fail
    # loudly rather than fall back to eager if it is ever hit.
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, 256)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4096)
    cfg.fail_on_recompile_limit_hit = True
    return torch.compile(forward, backend=backend, fullgraph=True, dynamic=True)


class _Graphs:
    """Per-window CUDA graphs sharing one pool; `use_graph=False` runs the step eagerly."""

    def __init__(self, model: Transformer, buckets: tuple[int, ...], max_len: int, use_graph: bool):
        self.model = model
        self.buckets = tuple(sorted(buckets))
        if self.buckets[-1] < max_len:
            raise ValueError(f"largest bucket {self.buckets[-1]} < max_len {max_len}")
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor]] = {}
        self.pool = None
        self._use_graph = False
        self.use_graph = use_graph

    @property
    def use_graph(self) -> bool:
        return self._use_graph

    @use_graph.setter
    def use_graph(self, on: bool) -> None:
        if on and self.model.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA model: use use_graph=False on "
                             f"{self.model.device.type}")
        if on and self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        self._use_graph = on

    def bucket(self, n_keys: int) -> int:
        return pick_bucket(self.buckets, n_keys)

    def capture_time_s(self, capture_one, windows) -> float:
        if not self.use_graph:
            raise ValueError("capture needs use_graph=True")
        torch.cuda.synchronize()  # earlier work (a prefill) is not capture time
        t0 = time.perf_counter()
        for w in windows:
            if w not in self.graphs:
                self.graphs[w] = capture_one(w)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def record(self, forward, state: list[Tensor]) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        # Warm up on a side stream (lazy cuBLAS / SDPA setup and compilation must not happen
        # during capture). Twice: the first run may create lazily allocated buffers (a slot
        # cache's K/V), which a compiled step sees as a new input and compiles for again.
        # The warm-ups run the real step: their K/V writes land where the next real step
        # writes, and the state tensors they advance (position, input token) are put back.
        saved = [t.clone() for t in state]

        def restore() -> None:
            for t, v in zip(state, saved, strict=True):
                t.copy_(v)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                forward()
                restore()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = forward()
        restore()
        return graph, out


class GraphDecoder:
    """Prefill eagerly, then decode one token per row with one CUDA-graph replay per step.

    Reusable: prefill() resets the cache, and graphs captured for one request serve the
    next (same batch size). append() prefills a new turn after the current position;
    truncate() rewinds. use_graph=False runs the identical static step eagerly (the only
    mode on a CPU); it may be flipped between any two steps.
    """

    def __init__(self, model: Transformer, batch: int = 1, max_len: int | None = None,
                 buckets: tuple[int, ...] | None = None, use_graph: bool = True,
                 compile: str | None = None):
        self.model, self.compile = model, compile
        self._step_fn = compiled(self._forward, compile)
        self.max_len = max_len or model.cfg.max_seq_len
        if self.max_len > model.cfg.max_seq_len:
            raise ValueError(f"max_len {self.max_len} > max_seq_len {model.cfg.max_seq_len}")
        self._g = _Graphs(model, buckets or default_buckets(self.max_len), self.max_len, use_graph)
        self.cache = StaticKVCache(model.cfg.n_layers, batch, self.max_len, model.device)
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
        self.window: int | None = None  # the bucket of the last step

    use_graph = property(lambda self: self._g.use_graph,
                         lambda self, on: setattr(self._g, "use_graph", on))
    buckets = property(lambda self: self._g.buckets)
    graphs = property(lambda self: self._g.graphs)

    @property
    def n(self) -> int:
        """Positions filled so far."""
        return self.cache.n

    def bucket(self, n_keys: int) -> int:
        return self._g.bucket(n_keys)

    @torch.no_grad()
    def prefill(self, idx: Tensor, pad_lens: Tensor | None = None, all_logits: bool = False) -> Tensor:
        """Reset, then prefill idx (B, T), left-padded by pad_lens (B,) if given.
        Returns logits (B, 1, V) for the last position, or (B, T, V) with all_logits."""
        self._check_batch(idx)
        self.cache.reset(pad_lens)
        return self.append(idx, all_logits)

    @torch.no_grad()
    def append(self, idx: Tensor, all_logits: bool = False) -> Tensor:
        """Prefill idx (B, T) at the current position n (a new turn), eagerly."""
        self._check_batch(idx)
        self.cache.window = None
        logits, _ = self.model(idx, cache=self.cache, last_only=not all_logits)
        return logits

    def truncate(self, n: int) -> None:
        """Forget positions n.. (the next append or step writes at n)."""
        self.cache.truncate(n)

    def _check_batch(self, idx: Tensor) -> None:
        if idx.dim() != 2 or idx.shape[0] != self.cache.batch:
            raise ValueError(f"expected token ids of shape ({self.cache.batch}, T), got {tuple(idx.shape)}")

    def _forward(self) -> Tensor:
        logits, _ = self.model(self.tok, cache=self.cache)  # (B, 1, V)
        self.tok.copy_(logits[:, -1].argmax(-1, keepdim=True))  # the greedy next ids (B, 1)
        return logits

    def _capture(self, window: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        self.cache.window = window
        return self._g.record(self._step_fn, [self.cache.pos, self.tok])

    @torch.no_grad()
    def capture(self, windows: tuple[int, ...] | None = None) -> float:
        """Capture graphs ahead of time (default: every bucket). Needs a free position: the
        warm-up writes K/V at n, which the next real step overwrites. Returns seconds."""
        if self.cache.n >= self.max_len:
            raise ValueError("capture needs a free position: truncate or prefill first")
        try:
            return self._g.capture_time_s(self._capture, windows or self.buckets)
        finally:
            self.cache.window = None

    @torch.no_grad()
    def step(self, tok: Tensor) -> Tensor:
        """tok (B, 1) -> logits (B, 1, V). With graphs, the result is a static buffer that
        the next step overwrites: read it (or sample from it) first. Afterwards `self.tok`
        holds the argmax of these logits: `step(dec.tok)` is the next greedy step."""
        c = self.cache
        if c.n >= self.max_len:
            raise ValueError(f"KV cache full: position {c.n + 1} > max_len {self.max_len}")
        if tok.shape != self.tok.shape:
            raise ValueError(f"expected tokens of shape {tuple(self.tok.shape)}, got {tuple(tok.shape)}")
        window = self.bucket(c.n + 1)
        if tok.data_ptr() != self.tok.data_ptr():
            self.tok.copy_(tok)
        try:
            if self.use_graph and window not in self.graphs:
                self.graphs[window] = self._capture(window)
            c.window = window
            if self.use_graph:
                graph, out = self.graphs[window]
                graph.replay()
            else:
                out = self._step_fn()
        finally:
            c.window = None
        c.n += 1
        self.window = window
        return out


class SlotGraphDecoder:
    """The continuous engine's decode step (one token per SlotKVCache slot) as CUDA graphs
    (4.11b). Admission, release and prefill stay eager in the engine.

    The batch is always n_slots rows (free slots compute too), and slot lengths and active
    flags live in fixed device tensors that admit()/release() update in place. The one
    changing shape is the attention window: the smallest bucket that holds the longest
    slot + 1. Replay advances the device lengths; the host lengths move in advance_host().
    use_graph=False runs the identical windowed step eagerly.
    """

    def __init__(self, model: Transformer, slots: SlotKVCache,
                 buckets: tuple[int, ...] | None = None, use_graph: bool = True,
                 compile: str | None = None):
        self.model, self.slots = model, slots
        self._step_fn = compiled(self._forward, compile)
        self._g = _Graphs(model, buckets or default_buckets(slots.max_len), slots.max_len, use_graph)
        self.tok = torch.zeros(slots.n_slots, 1, dtype=torch.long, device=model.device)

    use_graph = property(lambda self: self._g.use_graph,
                         lambda self, on: setattr(self._g, "use_graph", on))
    buckets = property(lambda self: self._g.buckets)
    graphs = property(lambda self: self._g.graphs)

    def bucket(self, n_keys: int) -> int:
        return self._g.bucket(n_keys)

    def _forward(self) -> Tensor:
        logits, _ = self.model(self.tok, cache=self.slots)  # (S, 1, V)
        self.tok.copy_(logits[:, -1].argmax(-1, keepdim=True))  # the greedy next ids (S, 1)
        return logits

    def _capture(self, window: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        self.slots.window = window
        return self._g.record(self._step_fn, [self.slots._lens_dev, self.tok])

    @torch.no_grad()
    def capture(self, windows: tuple[int, ...] | None = None) -> float:
        """Capture graphs ahead of time (default: every bucket). Safe between steps: the
        warm-up's K/V writes land at each slot's next position. Returns seconds."""
        try:
            return self._g.capture_time_s(self._capture, windows or self.buckets)
        finally:
            self.slots.window = None

    @torch.no_grad()
    def step(self, tok: Tensor) -> Tensor:
        """tok (n_slots, 1) -> logits (n_slots, 1, V); with graphs a static buffer. Afterwards
        `self.tok` holds the argmax of these logits (the greedy next id of every slot)."""
        c = self.slots
        need = max(c.lens[s] for s in range(c.n_slots) if c.active[s]) + 1 if any(c.active) else 1
        if need > c.max_len:
            raise ValueError(f"a slot is full (max_len {c.max_len})")
        window = self.bucket(need)
        if tok.data_ptr() != self.tok.data_ptr():
            self.tok.copy_(tok)
        try:
            if self.use_graph and window not in self.graphs:
                self.graphs[window] = self._capture(window)
            c.window = window
            if self.use_graph:
                graph, out = self.graphs[window]
                graph.replay()
            else:
                out = self._step_fn()
        finally:
            c.window = None
        c.advance_host()
        return out
