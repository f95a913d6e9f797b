"""CUDA-graph decode (docs/INFERENCE.md, 4.11 and 4.11b).

A decode step of a small model is launch-bound: ~10 kernels per layer, each a few µs of GPU
work, and the CPU needs about as long to launch each one. A CUDA graph records the whole
step once and replays it with a single launch.

A graph replays fixed kernels on fixed addresses, so the step has static shapes:
- `StaticKVCache` keeps the position as a device tensor. K/V are written with index_copy_
  at that position, RoPE is gathered at it, and every decode step attends over a fixed
  window of W keys, with keys past the position masked out.
- W comes from length buckets (128, 256, ..., max_len). The step uses the smallest bucket
  that holds every key it needs. All graphs share one memory pool and the same static
  buffers (cache, input token, sampler state).
- Prefill stays eager: it runs once per turn with a different shape each time. It may start
  at any position n (a new chat turn is appended after the conversation so far), and
  `truncate(n)` rewinds (regenerate, or the overshoot of a chunk).

One decode skeleton (`_Decoder`: capture, warm-up, record, replay and the eager twin) serves
both decoders, keyed by what differs: a run's shape (W; (W, rows) for slots) and the sampler's
variant. The cache supplies the rest, `decode(W)` (the view one step runs through),
`keys_needed(steps)`, `step_state()` (what a capture's warm-up puts back) and
`advance_host(steps)`: tinyllm.kv_cache holds every cache and its view (`StaticKVCache` and
`StaticLayerKV` are named here too, at the seed's path). `GraphDecoder` runs it over a
`StaticKVCache` (one request, B rows); `SlotGraphDecoder` (below) over a
`SlotKVCache` (the continuous engine), with a sampler and stop rules per row. `use_graph=None`
means graphs where the model is on CUDA. `Readback` copies a run's ids to the host behind it.

The step samples inside itself (`StepSampler`: greedy, temperature, top-k, top-p, repetition
penalty, seeded noise) and writes the next id into its own input buffer `tok`, so `step(dec.tok)`
needs no copy and no host sync. `run(steps)` chains `steps` steps in one replay (one graph per
(W, steps, greedy)); their ids land in `out`. `GraphDecoder.launch(steps)` does that without
waiting and hands back a `Chunk` whose ids the host reads later: one sync per chunk, not per
token. A run never crosses a bucket boundary unless asked to (`run` picks W for its last step).
The sampler is reached through the decoder: `greedy` (the variant the next run runs),
`draw_first(logits, params, recent)` (a reply's settings and its first, eager draw) and
`n_valid`; `plain_step(window)` is the step in Python, what a compile traces.

`use_graph=False` runs the identical steps eagerly: the reference replay must match bit for
bit, and the path on a CPU. Toggling `use_graph` between two runs changes no token. Not
bit-identical to the eager `KVCache` decode: that attends over exactly pos + 1 keys with no
mask, and SDPA picks another kernel. No autocast: weights on CUDA are bf16, and the step
computes in the weights' dtype. Refuses: graphs without CUDA, a full cache, a wrong batch.

`compile="inductor"` runs the step through `torch.compile` (dynamic window: one compiled
step per sampler variant serves every bucket): Inductor fuses RMSNorm, RoPE, sampling and the
elementwise work into a few kernels, and the graphs capture the compiled step. Graph and eager
mode then run the same compiled code, so they stay bit-identical; the compiled step is close
to, not bit-equal with, the plain one. `set_compile(backend, saved)` changes it between runs;
`set_step(step, name)` runs another step function instead (the native CPU step:
tinyllm.decode.cpu_step.use_native), and `compile` then reads its name.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from tinyllm.decode.row_limits import RowLimits
from tinyllm.decode.row_sampler import RowSampler
from tinyllm.decode.sampling_params import SamplingParams
from tinyllm.decode.saved_step import SavedStep
from tinyllm.decode.step_sampler import StepSampler
from tinyllm.kernels import cpu_qgemv, pdl, precompile, switches
from tinyllm.kv_cache import SlotKVCache, StaticKVCache
from tinyllm.kv_cache import StaticLayerKV as StaticLayerKV  # the seed's names, at the seed's path
from tinyllm.model import Transformer

MAX_RUN = 16  # the most steps one run chains (the width of `out`)


def default_buckets(max_len: int, first: int = 128) -> tuple[int, ...]:
    """first, 2*first, ... below max_len, then max_len itself."""
    out, b = [], first
    while b < max_len:
        out.append(b)
        b *= 2
    return (*out, max_len)


def default_row_buckets(n_slots: int, first: int = 8) -> tuple[int, ...]:
    """The slot decoder's row buckets: first, 2*first, ... below n_slots, then n_slots itself."""
    return default_buckets(n_slots, first)


def pick_bucket(buckets: tuple[int, ...], n_keys: int) -> int:
    """The smallest bucket that holds n_keys keys."""
    for b in buckets:
        if b >= n_keys:
            return b
    raise ValueError(f"{n_keys} keys exceed the largest bucket {buckets[-1]}")


def compiled(forward, backend: str | None, model: Transformer | None = None):
    """forward itself, or forward through torch.compile (whole graph, dynamic sizes). A CPU
    step loads tinyllm.kernels.cpu_qgemv first (building it the first time, about 20 s), so that its
    decode attention traces as the threaded C++ op (tinyllm.kernels.decode_attention) and a model's
    16-bit matrices as the AVX2 product (tinyllm.core.linear.HalfCpuLinear). On a CPU
    the step's Inductor kernels run on one thread: a decode step's tensors are a few thousand
    elements, and each OpenMP region costs a wake-up of the other threads (on a loaded 2-core
    machine often a whole scheduler slice); the quantized products (tinyllm.kernels.cpu_qgemv) and
    torch's own ops still use torch.get_num_threads(). Its wrapper, which calls the kernels
    in order, is C++ rather than Python (`cpp_wrapper`): measured on the 2-core CPU, paired in
    one process, the default model's int8 step ran 9% faster (219 -> 239 and 249 -> 272 tok/s)
    and compiled 17% slower cold (39 -> 46 s; warm 7.0 -> 7.3 s); SmolLM2 ran the same."""
    if backend is None:
        return forward
    options = prepare_compile(backend, model)
    return torch.compile(forward, backend=backend, fullgraph=True, dynamic=True, options=options)


def prepare_compile(backend: str, model: Transformer | None) -> dict | None:
    """What compiling the step (or loading it compiled: tinyllm.decode.saved_step) needs first: Dynamo's
    settings, and the AVX2 op built where the products use it. Returns Inductor's options."""
    import torch._dynamo

    # Entries add up over decoders and batch sizes: raise the recompile limit, and fail
    # loudly rather than fall back to eager if it is ever hit.
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, 256)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4096)
    cfg.fail_on_recompile_limit_hit = True
    # The step's Python floats (norm eps, sampler constants) never change: traced as symbolic
    # inputs they are specialized after the fact, and Dynamo traces the whole step twice
    # (a warm start's largest cost: docs/INFERENCE.md 4.14).
    cfg.specialize_float = True
    cpu = model is not None and model.device.type == "cpu" and backend == "inductor"
    if backend == "inductor" and model is not None and model.device.type == "cuda" and pdl.inductor_enabled():
        import torch._inductor.config

        torch._inductor.config.triton.enable_pdl = True  # its kernels chain with ours (tinyllm.kernels.pdl)
    if cpu:
        cpu_qgemv.available()
    return {"cpp.threads": 1, "cpp_wrapper": True} if cpu else None


class _Decoder:
    """The one decode skeleton: the step body, its graphs (capture, warm-up, record, replay) and
    its eager twin, over a cache that supplies `decode(W)`, `keys_needed(steps)`, `step_state()`
    and `advance_host(steps)`. A decoder names what differs: a run's `shape` (its graph's static
    sizes: W here, (W, rows) for slots), the shapes `capture` covers, a graph's `_key`, what a
    run leaves to read (`_ran`), a run's body (`_steps`) and the state a step advances (`_state`)."""

    def __init__(self, model: Transformer, cache, batch: int, buckets: tuple[int, ...], max_len: int,
                 use_graph: bool | None, compile: str | None, n_valid: int | None = None):
        self.model, self.cache, self.compile = model, cache, compile
        for rope in model.ropes:  # the tables `rope.cos` reads: never built in a capture/compile
            rope.set_context(max_len)  # LongRoPE: the factors of this run's context (tinyllm.core.rope)
            rope.ensure(rope.max_seq_len)
        self.buckets = tuple(sorted(buckets))
        if self.buckets[-1] < max_len:
            raise ValueError(f"largest bucket {self.buckets[-1]} < max_len {max_len}")
        device = model.device
        self.sampler = StepSampler(batch, model.cfg.vocab_size, device, n_valid)
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=device)  # the next step's input
        self.out = torch.zeros(batch, MAX_RUN, dtype=torch.long, device=device)  # ids of the last run
        self._step_fn = self._make_step(compile)
        self.saved = None  # the loaded compiled step (tinyllm.decode.saved_step) that runs, if one does
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, Tensor]] = {}  # by _key(shape, steps)
        self.precompiled = 0  # Triton kernels made ready at once before captures (_precompile)
        self.pool = None
        self._use_graph = False
        self.use_graph = device.type == "cuda" if use_graph is None else use_graph
        self.window: int | None = None  # the bucket of the last run

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

    @property
    def captured_windows(self) -> list[int]:
        return sorted({key[0] for key in self.graphs})

    def bucket(self, n_keys: int) -> int:
        return pick_bucket(self.buckets, n_keys)

    @property
    def n_valid(self) -> int:
        """Ids from here on are never drawn (embeddings padded past the tokenizer)."""
        return self.sampler.n_valid

    @property
    def greedy(self) -> bool:
        """The sampler variant the next run runs (argmax, else sampling): each is a step, and
        graphs, of its own. `draw_first` sets it from the settings; set it to capture ahead."""
        return self.sampler.greedy

    @greedy.setter
    def greedy(self, on: bool) -> None:
        self.sampler.greedy = on

    def draw_first(self, logits: Tensor, params: SamplingParams, recent: Tensor) -> Tensor:
        """Start a reply's sampling: load the settings (`params`; recent (B, N) ids already in the
        context, for the repetition penalty), draw from a prefill's last logits (B, V) eagerly
        what a step would draw, and make those ids the next step's input. Returns them (B,)."""
        self.sampler.load(params, recent)
        first = self.sampler.draw(logits)  # (B,)
        self.tok.copy_(first[:, None])
        return first

    def set_compile(self, backend: str | None, saved=None) -> None:
        """Run the step through `backend` (None: the plain step) from the next run on: `saved`,
        a step compiled and saved before (tinyllm.decode.saved_step), where given, else traced on its
        first call. The graphs of the old step are dropped; the new step's are captured as
        runs need them."""
        self._use_step(self._make_step(backend, saved), backend, saved)

    def set_step(self, step: Callable[[int], Tensor], name: str) -> None:
        """Run `step` from the next run on: `(window) -> logits (B, 1, V)`, feeding `tok` and
        leaving its draw there, as `plain_step` does (the native CPU step: tinyllm.decode.cpu_step.use_native).
        `compile` then reads `name`; the graphs of the old step are dropped."""
        self._use_step(step, name, None)

    def _use_step(self, step: Callable[[int], Tensor], name: str | None, saved) -> None:
        self.compile, self.saved, self._step_fn = name, saved, step
        self.graphs.clear()
        if self.pool is not None:  # the old graphs' pool dies with them: capture into a new one
            self.pool = torch.cuda.graph_pool_handle()

    def _make_step(self, backend: str | None, saved=None):
        """The step function `(window) -> logits` for `backend`: a loaded compiled step (falling
        back to a trace), or `compiled()`'s."""

        def traced():
            return compiled(self.plain_step, backend, self.model)
        return traced() if saved is None else SavedStep(saved, self, traced)

    # -- the step -------------------------------------------------------------------------

    def plain_step(self, window: int) -> Tensor:
        """One decode step in Python over `window` keys (what a compile traces, and what the
        native step falls back to): feeds `tok`, leaves the draw there; logits (B, 1, V)."""
        logits, _ = self.model(self.tok, cache=self.cache.decode(window))  # (B, 1, V)
        self.sampler.push(self.tok)
        self.tok.copy_(self.sampler.draw(logits[:, -1])[:, None])  # the next ids (B, 1)
        return logits

    def shape(self, steps: int) -> int:
        """W of the next run of `steps` steps (refuses a full cache)."""
        return self.bucket(self.cache.keys_needed(steps))

    def _shapes(self, windows: tuple[int, ...] | None):
        return windows or self.buckets  # what capture() covers

    def _key(self, shape, steps: int) -> tuple:
        return shape, steps, *self.sampler.variant  # the sampler's variant is a step of its own

    def _ran(self, shape) -> None:
        self.window = shape  # the bucket of the last run

    def _steps(self, window: int, steps: int) -> Tensor:
        for i in range(steps):
            logits = self._step_fn(window)
            self.out[:, i:i + 1].copy_(self.tok)
        return logits

    def _state(self) -> list[Tensor]:
        return [*self.cache.step_state(), self.tok, *self.sampler.state()]

    def _restorer(self) -> Callable[[], None]:
        """A function that puts the decoder's step state (cache positions, input ids, sampler) back as it is now."""
        state = self._state()
        saved = [t.clone() for t in state]

        def restore() -> None:
            for t, v in zip(state, saved, strict=True):
                t.copy_(v)
        return restore

    def _record(self, shape, steps: int) -> tuple[torch.cuda.CUDAGraph, Tensor]:
        # Warm up on a side stream (lazy cuBLAS / SDPA setup and compilation must not happen
        # during capture). Twice: the first run may create lazily allocated buffers (a slot
        # cache's K/V), which a compiled step sees as a new input and compiles for again.
        # The warm-ups run the real step: its K/V writes land where the next real steps
        # write, and the state it advances (positions, input ids, sampler) is put back. One
        # step each, whatever the run's length: every step of a run is the same call, so one
        # warms them all (a 16-step run's warm-ups were 32 eager steps: SmolLM2's plain
        # graphs took 11-12 s of start-up, most of it warm-up).
        restore = self._restorer()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._steps(shape, 1)
                restore()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread (a background compile) may use CUDA meanwhile.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self._steps(shape, steps)
        restore()
        return graph, out

    @torch.no_grad()
    def capture(self, windows: tuple[int, ...] | None = None, steps: int = 1) -> float:
        """Capture the graphs of `steps`-step runs ahead of time (default: every bucket; a slot
        decoder's every row bucket of each) for the sampler's current variant. Safe between
        steps: the warm-up's K/V writes land at the next positions. Returns seconds."""
        if not self.use_graph:
            raise ValueError("capture needs use_graph=True")
        self.cache.keys_needed(steps)  # refuses a full cache
        torch.cuda.synchronize()  # earlier work (a prefill) is not capture time
        t0 = time.perf_counter()
        shapes = [shape for shape in dict.fromkeys(self._shapes(windows)) if self._key(shape, steps) not in self.graphs]
        self._precompile(shapes)
        for shape in shapes:
            self.graphs[self._key(shape, steps)] = self._record(shape, steps)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def _precompile(self, shapes: list) -> None:
        """The plain step's Triton kernels for these shapes compiled at once, on a thread pool, before any is
        captured (tinyllm.kernels.precompile): one step of each shape with its kernels skipped, the state put
        back after each. Inductor's step compiles its own."""
        if self.compile is not None or not shapes or self.model.device.type != "cuda" or not switches.SWITCHES.precompile:
            return  # (off: not even the state's copy)
        restore = self._restorer()

        def dry_steps() -> None:
            for shape in shapes:
                try:
                    self._steps(shape, 1)
                finally:
                    restore()
        self.precompiled += precompile.ahead(dry_steps)

    @torch.no_grad()
    def run(self, steps: int = 1, capture: bool = True) -> Tensor:
        """`steps` decode steps, each feeding `tok` and leaving its draw there and in
        `out[:, i]`; one replay with graphs. Returns the last step's logits (B, 1, V), with
        graphs a static buffer that the next run overwrites. A run whose graph is not captured
        yet is captured now, or with capture=False runs eagerly (the same steps, bit for bit)."""
        if not 1 <= steps <= MAX_RUN:
            raise ValueError(f"steps must be in [1, {MAX_RUN}], got {steps}")
        shape = self.shape(steps)
        key = self._key(shape, steps)
        if self.use_graph and (capture or key in self.graphs):
            if key not in self.graphs:
                self.graphs[key] = self._record(shape, steps)
            graph, logits = self.graphs[key]
            graph.replay()
        else:
            logits = self._steps(shape, steps)
        self.cache.advance_host(steps)
        self._ran(shape)
        return logits

    @torch.no_grad()
    def step(self, tok: Tensor) -> Tensor:
        """tok (B, 1) -> logits (B, 1, V); with graphs a static buffer that the next step
        overwrites: read it first. Afterwards `self.tok` holds the sampler's draw (greedy by
        default: the argmax of these logits), so `step(dec.tok)` is the next step."""
        if tok.shape != self.tok.shape:
            raise ValueError(f"expected tokens of shape {tuple(self.tok.shape)}, got {tuple(tok.shape)}")
        if tok.data_ptr() != self.tok.data_ptr():
            self.tok.copy_(tok)
        return self.run(1)


@dataclass
class Chunk:
    """The ids of one launched run, read on the host when wanted (one sync per chunk)."""
    steps: int  # the columns to read
    host: Tensor  # (B, >= steps); pinned on CUDA, filled once `done` has passed
    done: torch.cuda.Event | None

    def ids(self) -> list[list[int]]:
        if self.done is not None:
            self.done.synchronize()
        return self.host[:, :self.steps].tolist()


class Readback:
    """Copies of a device buffer (a decoder's `out`) to the host, taken behind the work that
    fills it without waiting: pinned host buffers used in turn, each copy followed by an event."""

    def __init__(self, src: Tensor, n: int = 3):
        self.src = src
        self.host = [src.new_zeros(src.shape, device="cpu", pin_memory=src.is_cuda) for _ in range(n)]
        self.next = 0

    def take(self, cols: int) -> Chunk:
        host = self.host[self.next]
        self.next = (self.next + 1) % len(self.host)
        if not self.src.is_cuda:
            host.copy_(self.src)
            return Chunk(cols, host, None)
        host.copy_(self.src, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Chunk(cols, host, done)


class GraphDecoder(_Decoder):
    """Prefill eagerly, then decode one token per row with one CUDA-graph replay per run.

    Defaults that run on either device: `use_graph=None` (graphs on CUDA, the same step eagerly
    on a CPU) and `compile=None` (the plain step); `compile="auto"`: the native step on a CPU where
    it runs the model, else the plain one; Inductor on CUDA, compiled here at the first run (a chat
    session's "auto" runs the plain step's graphs on CUDA instead, and Inductor only in the background
    when asked: tinyllm.session.step_policy); "native" insists on the native step. After
    `prefill`/`append`, choose the reply's first token (`draw_first`, or `step(tok)`), then
    `run(k)`: run() refuses to feed a stale token.

    Reusable: prefill() resets the cache, and graphs captured for one request serve the
    next (same batch size). append() prefills a new turn after the current position;
    truncate() rewinds. use_graph=False runs the identical static step eagerly (the only
    mode on a CPU); it may be flipped between any two runs. `n_valid`: ids from there on are
    never drawn (embeddings padded past the tokenizer; default: none are).
    """

    def __init__(self, model: Transformer, batch: int = 1, max_len: int | None = None,
                 buckets: tuple[int, ...] | None = None, use_graph: bool | None = None,
                 compile: str | None = None, n_valid: int | None = None):
        self.max_len = max_len or model.cfg.max_seq_len
        if self.max_len > model.cfg.max_seq_len:
            raise ValueError(f"max_len {self.max_len} > max_seq_len {model.cfg.max_seq_len}")
        cpu = model.device.type == "cpu"
        if compile == "native" and not cpu:
            raise ValueError("the native step runs on a CPU; on CUDA use compile='auto' or 'inductor'")
        native = cpu and compile in ("auto", "native")
        cache = StaticKVCache(model.cfg.n_layers, batch, self.max_len, model.device)
        super().__init__(model, cache, batch, buckets or default_buckets(self.max_len), self.max_len,
                         use_graph, None if native else "inductor" if compile == "auto" else compile, n_valid)
        if native:
            from tinyllm.decode import cpu_step

            problem = cpu_step.problem(model, batch)
            if problem is None:
                cpu_step.use_native(self)
            elif compile == "native":
                raise ValueError(f"the native step cannot run this model: {problem}")
        self._readback = Readback(self.out)  # chunks in flight are read back through it
        self._tok_at_prefill = -1  # tok's version counter right after the last prefill

    @property
    def n(self) -> int:
        """Positions filled so far (runs launched included)."""
        return self.cache.n

    @property
    def filtered(self) -> bool:
        """The sampler variant's other half (StepSampler.filtered): a repetition penalty or DRY runs
        in the step. `draw_first` sets it from the settings; set it, as `greedy`, to capture ahead."""
        return self.sampler.filtered

    @filtered.setter
    def filtered(self, on: bool) -> None:
        self.sampler.filtered = on

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
        logits, _ = self.model(idx, cache=self.cache, last_only=not all_logits)
        self._tok_at_prefill = self.tok._version  # run() refuses until the first token is chosen
        return logits

    @torch.no_grad()
    def run(self, steps: int = 1, capture: bool = True) -> Tensor:
        """As _Decoder.run; after a prefill it first needs the reply's first token in `tok`
        (draw_first, step(tok), or a write of your own): it would feed a stale one instead."""
        if self.tok._version == self._tok_at_prefill:  # nothing has written tok since the prefill
            raise ValueError("after prefill or append, choose the first token before run(): "
                             "draw_first(logits, params, recent), or step(tok) with your own")
        return super().run(steps, capture)

    def truncate(self, n: int) -> None:
        """Forget positions n.. (the next append or step writes at n)."""
        self.cache.truncate(n)

    def _check_batch(self, idx: Tensor) -> None:
        if idx.dim() != 2 or idx.shape[0] != self.cache.batch:
            raise ValueError(f"expected token ids of shape ({self.cache.batch}, T), got {tuple(idx.shape)}")

    @torch.no_grad()
    def launch(self, steps: int, capture: bool = True) -> Chunk:
        """run(steps, capture) without waiting for it: the ids are copied to the host behind
        it, and the caller reads them from the Chunk (after launching the next one, say)."""
        self.run(steps, capture)
        return self._readback.take(steps)


class SlotGraphDecoder(_Decoder):
    """The continuous engine's decode step over a SlotKVCache; see the module docstring."""

    def __init__(self, model: Transformer, slots: SlotKVCache, buckets: tuple[int, ...] | None = None,
                 use_graph: bool | None = True, compile: str | None = None,
                 row_buckets: tuple[int, ...] | None = None):
        self.slots = slots
        super().__init__(model, slots, slots.n_slots, buckets or default_buckets(slots.max_len), slots.max_len,
                         use_graph, compile)
        S, device = slots.n_slots, model.device
        self.sampler = RowSampler(S, model.cfg.vocab_size, device)
        self.limits = RowLimits(S, slots.max_len, device)
        self.row_buckets = tuple(sorted(row_buckets or default_row_buckets(S)))
        if self.row_buckets[-1] < S:
            raise ValueError(f"largest row bucket {self.row_buckets[-1]} < n_slots {S}")
        self.out = torch.zeros(S, MAX_RUN + 2, dtype=torch.long, device=device)  # a run's report
        self._readback = Readback(self.out)
        self.rows = S  # the row bucket of the last run

    @property
    def captured_windows(self) -> list[int]:
        return sorted({w for (w, _), *_ in self.graphs})

    def start_rows(self, idx: Tensor, logits: Tensor, params: list[SamplingParams], seeds: list[int],
                   tails: list[list[int]], stops: list[list[int]]) -> None:
        """Rows idx (k,), just prefilled (their last logits (k, V)): load their settings and end
        rules, draw and check their first tokens, and make them the next step's input."""
        self.sampler.load(idx, params, seeds, tails)
        self.limits.load(idx, stops, [[p.max_tokens] for p in params])
        variant = self.sampler.greedy, self.sampler.whole
        self.sampler.pick_variant(params)
        first = self.sampler.draw_at(idx, logits)  # (k,)
        self.sampler.greedy, self.sampler.whole = variant
        self.limits.check_at(idx, first, self.slots)
        self.tok.index_copy_(0, idx, first[:, None])

    # -- the step -------------------------------------------------------------------------

    def plain_step(self, window: int, rows: int) -> tuple[Tensor, Tensor]:
        """One decode step of the first `rows` slots over `window` keys, in Python (what a
        compile traces): feeds `tok`, leaves the draws there. Returns logits (rows, 1, V) and
        what each row drew (rows,), -1 where it was not live."""
        tok = self.tok[:rows]  # (B, 1)
        logits, _ = self.model(tok, cache=self.slots.decode(window, rows))  # (B, 1, V)
        self.sampler.push(tok, rows)
        nxt = self.sampler.draw(logits[:, -1], rows)  # (B,)
        drawn = self.limits.check(nxt, self.slots, rows)
        tok.copy_(nxt[:, None])
        return logits, drawn

    def _steps(self, shape: tuple[int, int], steps: int) -> Tensor:
        window, rows = shape
        self.out[:rows, 0].copy_(self.tok[:rows, 0])
        for i in range(steps):
            logits, drawn = self._step_fn(window, rows)
            self.out[:rows, i + 1].copy_(drawn)
        self.out[:rows, -1].copy_(self.limits.code[:rows])
        return logits

    def _state(self) -> list[Tensor]:
        return [*self.slots.step_state(), self.slots._active_dev, self.tok, *self.sampler.state(),
                *self.limits.state()]

    def shape(self, steps: int) -> tuple[int, int]:
        """(W, B) of the next run of `steps` steps."""
        highest = max((s for s in range(self.slots.n_slots) if self.slots.active[s]), default=0)
        return self.bucket(self.slots.keys_needed(steps)), pick_bucket(self.row_buckets, highest + 1)

    def _shapes(self, windows: tuple[int, ...] | None):
        return itertools.product(windows or self.buckets, self.row_buckets)

    def _key(self, shape: tuple[int, int], steps: int) -> tuple:
        return shape, steps, self.sampler.greedy, self.sampler.whole

    def _ran(self, shape: tuple[int, int]) -> None:
        self.window, self.rows = shape

    @torch.no_grad()
    def launch(self, steps: int, capture: bool = True) -> Chunk:
        """run(steps, capture), its report copied to the host behind it: read it from the Chunk."""
        self.run(steps, capture)
        return self._readback.take(self.out.shape[1])
