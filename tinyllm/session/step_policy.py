"""StepPolicy: which decode step a session's decoder runs, and when that changes.

It owns the choice of step and the background compiles. `compile` says what is asked for:
- None: the plain step (step kind "plain").
- "native": the CPU step as one C++ call (tinyllm.decode.cpu_step) from the first reply on, with
  nothing to compile (kind "native"); a ValueError where it cannot run the model.
  `set_native(on)` switches it off for the plain step run eagerly (kind "eager") and on again,
  from the next launch (`apply`), mid-reply too: the app's Ctrl+G on a CPU, the switch that
  turns CUDA graphs on and off on a GPU. Both steps draw with the same sampler state, so a
  greedy reply reads the same either way (the products agree up to fp32 rounding; only a
  near-tie that rounding decides could differ).
- "inductor" (or any torch.compile backend): the step is compiled on a background thread
  (`BackgroundCompile`) while replies run on the plain step; the compiled step takes over at
  the start of the next reply (`prepare`) once it is ready. Kinds: "compiling", "compiled",
  "compile failed" (with `compile_error`; the plain step stays).
- "plain": the plain step with its graphs captured ahead, nothing compiled (kind "plain", as for
  None): on CUDA our Triton kernels make it the fused step, as fast as the first reply can be.
  `capture_ahead` captures the settings' variant at load; a reply whose settings need another
  variant captures its graphs in `prepare`, at its start (its time to first token says so).
- "auto" (what the app asks for): "native" on a CPU where it runs the model; "plain" where our
  Triton kernels run the step (CUDA), unless TINYLLM_CUDA_AUTO=inductor; else "inductor" (`resolve`).

The state machine, one compile per sampler variant (greedy or sampling; the step is
specialized on it): the settings' variant compiles first; a reply that needs the other
variant starts its compile (once) and runs the plain step meanwhile. The compiled step of a
variant runs only while no compile runs (background_compile's contract: a compiled step
beside Dynamo's trace fails), and its graphs are captured in `prepare`, between replies: a
compile never sits on a reply's path, and no graph is captured mid-reply or beside a compile.
With graphs, the plain step's graphs (every bucket, runs of 1 and `chunk` steps) are captured
ahead, before the first compile starts (`capture_ahead`).

It drives the decoder through its public methods only (set_compile, set_step through
cpu_step.use_native, capture, greedy, append, truncate). Every method runs on the session's
worker thread, except `set_native` and the read-only ones (`step_kind`, `compile_error`,
`compiled_at`, `wait_compiled`), which any thread may call.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext

import torch

from tinyllm.cuda_graph import GraphDecoder
from tinyllm.decode import cpu_step
from tinyllm.decode.background_compile import BackgroundCompile
from tinyllm.decode.compile_child import Spec
from tinyllm.kernels import qgemv, switches
from tinyllm.model import Transformer


def resolve(compile: str | None, native_problem: str | None, kernels: bool) -> str | None:
    """What a session's `compile` asks for, resolved: "native", "plain", None (the plain step, no graphs
    captured ahead) or a torch.compile backend. `native_problem`: why the native CPU step cannot run
    the model (None: it can); `kernels`: our Triton kernels run its step (CUDA, Triton installed)."""
    if compile not in ("auto", "native"):
        return compile
    if compile == "native" and native_problem is not None:
        raise ValueError(f"the native CPU step cannot run this model: {native_problem}")
    if native_problem is None:
        return "native"
    return "plain" if kernels and switches.SWITCHES.cuda_auto == "plain" else "inductor"


class StepPolicy:
    def __init__(self, model: Transformer, decoder: GraphDecoder, compile: str | None,
                 threads: int | None = None, source: tuple[str, str] | None = None):
        """`threads`: the decoding threads on a CPU; `source`: (path, quant) the model was opened
        with, so that on a CPU a child process compiles the step first (tinyllm.decode.compile_child)."""
        self.model, self.decoder, self.threads, self.source = model, decoder, threads, source
        if compile in ("auto", "native"):
            compile = resolve(compile, cpu_step.problem(model, 1), model.device.type == "cuda" and qgemv.available())
        self.ahead = compile == "plain"  # no compile, the plain step's graphs captured ahead and between replies
        if self.ahead:
            compile = None
        self.native = compile == "native"  # the native step runs this model (set_native switches it)
        self.native_on = self.native  # ... and is wanted: it runs from the next launch (`apply`)
        if self.native:  # nothing to compile: the step runs as it is from the first reply on
            cpu_step.use_native(decoder)
            compile = None
        self.backend = compile  # what the background compiles use; None: none runs
        self.compiles: list[BackgroundCompile] = []  # started so far; the last may be running
        self.compile_started = threading.Event()  # set at each start (the app's server watches it)

    @property
    def background(self) -> BackgroundCompile | None:
        """The latest background compile, or None."""
        return self.compiles[-1] if self.compiles else None

    def capture_ahead(self, bos_id: int, greedy: bool, chunk: int, filtered: bool = False) -> None:
        """Where a compile is asked for, before it starts, or for "plain": capture the plain step's graphs (every
        bucket, runs of 1 and of `chunk` steps, the sampler's variant the replies will run: `greedy`,
        and `filtered` where a penalty or DRY is on) and run one prefill, so its kernels are
        loaded. Captured during the compile, each graph would wait for the GIL behind the compiler
        (measured on the H200: 35-51 tok/s for the first reply instead of ~1,500), and a capture
        beside the compiler's own CUDA work can break either; a reply of a variant not captured
        ahead runs eagerly beside the compile (the app's defaults, on an H100: 24-32 tok/s)."""
        dec = self.decoder
        if not (self.backend or self.ahead) or not dec.use_graph:
            return
        n = max(1, min(48, dec.max_len // 4))
        dec.append(torch.full((1, n), bos_id, device=self.model.device))  # allocates the cache
        dec.truncate(1)
        dec.greedy, dec.filtered = greedy, filtered
        self._capture_runs(chunk)
        dec.truncate(0)

    def begin(self, greedy: bool) -> None:
        """Start compiling the `greedy` variant, where a compile is asked for."""
        if self.backend:
            self._start_compile(greedy)

    def _start_compile(self, greedy: bool) -> None:
        dec, child, cpu = self.decoder, None, self.model.device.type == "cpu"
        if self.source is not None and (cpu or switches.SWITCHES.cuda_saved_step):
            child = Spec(self.source[0], self.model.device.type, self.source[1], dec.max_len, self.threads,
                         dec.n_valid, greedy, self.backend)
        # CUDA (TINYLLM_CUDA_SAVED_STEP=1): compiled and saved here, no child (it would hold the weights twice)
        self.compiles.append(BackgroundCompile(self.model, 1, dec.max_len, self.backend, self.threads,
                                               dec.n_valid, greedy=greedy, child=child, spawn=cpu))
        self.compile_started.set()

    def _capture_runs(self, chunk: int) -> None:
        """Capture the current step's graphs for every bucket and both run lengths (1 and
        `chunk`: decode_runner.run_length) that fit from the current position."""
        dec = self.decoder
        for steps in sorted({1, chunk}):
            if dec.n + steps <= dec.max_len:
                dec.capture(steps=steps)

    def _compiled_variants(self) -> set[bool]:
        return {c.greedy for c in self.compiles if c.state == "compiled"}

    # ---- what runs --------------------------------------------------------------------

    def set_native(self, on: bool) -> None:
        """The native step on, or off for the eager plain step, from the next launch (any
        thread). ValueError where the native step does not run this session."""
        if not self.native:
            raise ValueError("the native CPU step does not run this session "
                             f"(it runs the {self.step_kind(True)} step)")
        self.native_on = on

    def apply(self) -> None:
        """Before a launch (worker thread): the step `set_native` asked for takes over."""
        if self.native and self.native_on != (self.decoder.compile == "native"):
            if self.native_on:
                cpu_step.use_native(self.decoder)
            else:
                self.decoder.set_compile(None)

    def step_kind(self, greedy: bool) -> str:
        """The step the next reply with the `greedy` variant runs: "native", "plain" (no compile
        asked: None or "plain"), "compiling" (a compile runs, or that variant is not compiled yet), "compiled", or
        "compile failed" (see compile_error; the plain step stays), "eager" (the plain step in place
        of the native one: `set_native(False)`)."""
        if self.native:
            return "native" if self.native_on else "eager"
        c = self.background
        if c is None:
            return "plain"
        if c.state == "compiling":
            return "compiling"
        if greedy in self._compiled_variants():
            return "compiled"
        return "compile failed" if c.state == "failed" else "compiling"

    def step_running(self, greedy: bool) -> str:
        """The step the current reply runs (the compiled one takes over between replies)."""
        if self.native:
            return "native" if self.decoder.compile == "native" else "eager"
        if self.decoder.compile:
            return "compiled"
        kind = self.step_kind(greedy)
        return "compiling" if kind == "compiled" else kind

    @property
    def compile_error(self) -> str:
        return self.background.error if self.background is not None else ""

    @property
    def compiled_at(self) -> float:
        """time.time() when the first background compile ended; 0.0 before (or without one)."""
        return self.compiles[0].done_at if self.compiles else 0.0

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Block until the running background compile is over (compiled or failed); False on timeout."""
        return self.background is None or self.background.wait(timeout)

    def compiling(self) -> bool:
        """A background compile runs: no compiled step runs and no graph is captured meanwhile."""
        return self.background is not None and not self.background.ready.is_set()

    def paused(self) -> AbstractContextManager:
        """Around a reply, its prefill to its last token: the running compile kept off the GIL
        (BackgroundCompile.paused), as long as `beat()` says the reply goes on."""
        return self.background.paused() if self.compiling() else nullcontext()

    def beat(self) -> None:
        """The reply goes on (a chunk read): a paused compile stays paused (BackgroundCompile.beat)."""
        if self.background is not None:
            self.background.beat()

    def prepare(self, greedy: bool, chunk: int, filtered: bool = False) -> None:
        """Between replies, on the worker thread (the app's server calls it as soon as a compile
        ends; a reply calls it at its start): run the compiled step if the `greedy` variant is
        compiled and no compile is running (see background_compile's contract), and capture its
        graphs ahead (runs of 1 and `chunk`, for the sampler's variant: `greedy`, `filtered`), so
        the next reply neither waits for them nor runs slower while they are captured one by one
        (measured on the H200: the first replies on the compiled step ran at 490-750 tok/s, the
        third at 660-970). A variant not compiled yet starts compiling now, once, and the plain
        step runs meanwhile: a compile never sits on a reply's path."""
        c, dec = self.background, self.decoder
        if c is None:
            if self.ahead and dec.use_graph:  # "plain": this variant's graphs, if a reply has not run it yet
                dec.greedy, dec.filtered = greedy, filtered
                self._capture_runs(chunk)  # those already there are kept
            return
        idle = c.ready.is_set()
        if idle and c.state == "compiled" and greedy not in self._compiled_variants():
            self._start_compile(greedy)
            idle = False
        use = idle and greedy in self._compiled_variants()
        # the variant's compiled step as loaded or saved (CPU sessions), where it was
        saved = next((c.saved for c in self.compiles if c.state == "compiled" and c.greedy == greedy),
                     None) if use else None
        if use != bool(dec.compile) or saved is not dec.saved:
            dec.set_compile(self.backend if use else None, saved)
        if use and dec.use_graph:
            dec.greedy, dec.filtered = greedy, filtered
            self._capture_runs(chunk)  # those already there are kept
