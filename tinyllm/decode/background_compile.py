"""Compile the decode step on a background thread, so no reply ever waits for it.

Contract: `BackgroundCompile(model, batch, max_len, backend, greedy=...)` starts a daemon
thread that builds a scratch `GraphDecoder` (its own small cache, never the live one) and runs
its step once eagerly with the sampler variant asked for (`greedy`: argmax, else sampling;
the step is specialized on it). That traces and compiles the step; torch.compile keeps the
result on the step's code, guarded on shapes and types, not on the decoder instance, so a live
decoder switched to the same backend afterwards runs it with no compile of its own (measured:
0.01 s instead of 7 s for the tiny model). Results persist across runs through Inductor's and
AOTAutograd's on-disk caches, so a second launch is quick. One variant a compile: measured on
the 2-core CPU, the greedy variant compiles in 52 s cold and 9 s warm, sampling in 154 s and
5 s; a session compiles the one its settings use, and the other only when asked for.

`child`: a `tinyllm.decode.compile_child.Spec` of the same model and step (CPU sessions opened from a
path; CUDA ones too under TINYLLM_CUDA_SAVED_STEP=1). There the step is compiled ahead of time and
saved (tinyllm.decode.saved_step), keyed on the spec: the thread loads the saved step where there
is one (a relaunch: no trace at all here, `saved_from` "loaded"); else, with `spawn` (a CPU's), a
child process compiles and saves it, and the thread loads that; where no child ran or it failed,
the thread compiles here, and saves (`saved_from` "built"). `saved` is the step then, which the
session hands to its decoder. With a child the trace never holds this process's GIL
(`child_result` says how the child went, None where none ran). Without a spec (CUDA by default,
a model opened in memory) the thread compiles here, and torch.compile's caches keep it.

`paused()`: ChatSession holds it over a reply, from its prefill to its last token, and calls
`beat()` as the reply goes on (once a chunk of steps read). Every op of a prefill releases the
GIL and waits to get it back, so beside a running compile it queued behind the compiler:
measured, a warm in-process compile took the default model's first TTFT from about 60 ms to
500 ms on the 2-core CPU, and to 1.1-1.3 s on the H200. The tokens after it queued too: the
host's share of each token (reading a chunk, launching the next, the text) waited for the GIL,
and the default model's first reply ran at 834-970 tok/s on an H100 while compiling, against
1,609 for SmolLM2's plain step alone (the same shape; 1,573-1,576 with the pause: 2026-12-07).
A reply now comes first; the compile goes on between replies (the plain step it would replace
is within 10-20% of the compiled one). Meanwhile:
- Python 3.12+: the compile thread stops at its next Python call or return (a C call under
  way runs to its end) and waits without the GIL: a profile hook on every thread but the
  pausing one, for the pause's length only (`threading.setprofile_all_threads`; the hook is
  one check on the other threads). It waits once a pause, for as long as the pause lasts and
  beats: with no beat for PAUSE_MAX_S it goes on, since it may hold a lock that the reply waits
  for (an import's, a logging handler's), so such a wait costs the reply PAUSE_MAX_S, once.
  A hook left on the compile thread for the whole compile doubled the compile's time.
- Python 3.11: the compile thread gives the GIL back within PAUSED_SWITCH_S of being asked
  (the switch interval, lowered for every thread meanwhile). Measured on the CPU: 280 ms.

`state` is "compiling", then "compiled" or "failed" (with `error`, one line; on a CPU without a
C++ compiler for Inductor it fails before tracing anything); `ready` is an
Event set then. On CUDA the thread works on its own stream, and graph captures elsewhere use
thread-local capture mode. What runs meanwhile must be the plain step: a compiled function
run while Dynamo traces on another thread fails (FX's tracing state is global), and a
compiled step's capture then is invalidated by the compiler's own CUDA work (both seen on the
H200). Switching is the caller's job (ChatSession: at a reply boundary, no compile running).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from tinyllm.cuda_graph import prepare_compile
from tinyllm.decode import saved_step
from tinyllm.decode.compile_child import Spec, saved_path, warm_up
from tinyllm.decode.compile_step import compile_step, lower_priority
from tinyllm.model import Transformer

COMPILE_SWITCH_S = 0.0005  # the switch interval while a compile runs (the default is 5 ms)
PAUSED_SWITCH_S = 0.00001  # and while a reply runs beside it (paused())
PAUSE_MAX_S = 2.0  # the longest the compile thread stops for a pause with no beat (Python 3.12+)


class BackgroundCompile:
    def __init__(self, model: Transformer, batch: int, max_len: int, backend: str, threads: int | None = None,
                 n_valid: int | None = None, greedy: bool = True, child: Spec | None = None, spawn: bool = True):
        self.backend, self.greedy = backend, greedy
        self.child = child  # where given, the step is saved under it (and, with spawn, a child process
        self.spawn = spawn  # compiles it first: tinyllm.decode.compile_child)
        self.child_result: str | None = None  # warm_up's answer: "" compiled, "cached", or why not
        self.state = "compiling"
        self.error = ""
        self.seconds = 0.0
        self.done_at = 0.0  # time.time() when it ended (the session's timeline)
        self.threads = threads  # CPU: the decoding threads' count (the compiled step is guarded on it)
        self.n_valid = n_valid  # the live sampler's (padded embeddings): the step is guarded on it too
        self.ready = threading.Event()
        self.saved = None  # where the step is saved (CPU, tinyllm.decode.saved_step): it, loaded or built
        self.saved_from = ""  # "loaded" (no trace here), "built" (traced here and saved), or ""
        self._switch = sys.getswitchinterval()  # to restore when the compile and any pause are over
        self._switch_lock = threading.Lock()
        self._pausing = False
        self._go = threading.Event()  # cleared while paused() stops the compile thread
        self._go.set()
        self._pauses = self._waited = 0  # paused() entered; the last one the thread stopped for
        self._beats = 0  # beat() calls: the pausing thread goes on
        self._thread = threading.Thread(target=self._run, args=(model, batch, max_len), daemon=True,
                                        name="tinyllm-compile")
        self._thread.start()

    def _run(self, model: Transformer, batch: int, max_len: int) -> None:
        t0 = time.perf_counter()
        if self.threads:
            torch.set_num_threads(self.threads)
        lower_priority()
        # The compiler is Python and holds the GIL for the default 5 ms slices: the decoding
        # thread would wait that long for every op it launches. Hand it over 10x as often.
        self._set_switch()
        path = saved_path(self.child) if self.child is not None else None
        try:
            if model.device.type == "cpu" and self.backend == "inductor":
                check_cpp_compiler()  # before any tracing: without one, say so at once
            if path is not None:
                prepare_compile(self.backend, model)  # the AVX2 op registered before the load
                self.saved = saved_step.load(path)
            if self.saved is None and self.child is not None and self.spawn:
                self.child_result = warm_up(self.child)  # it saves the step where path says
                self.saved = saved_step.load(path) if path is not None else None
            if self.saved is None:
                self.saved = compile_step(model, batch, max_len, self.backend, self.n_valid, self.greedy, path)
                self.saved_from = "built" if self.saved is not None else ""
            else:
                self.saved_from = "loaded"
            self.state = "compiled"
        except Exception as e:  # any failure leaves the plain step in place; say why once
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            self.error = f"{type(e).__name__}: {first}"[:300]
            self.state = "failed"
        finally:
            self.seconds = time.perf_counter() - t0
            self.done_at = time.time()
            self.ready.set()
            self._set_switch()  # as it was before (or a pause's, while one lasts)

    def wait(self, timeout: float | None = None) -> bool:
        return self.ready.wait(timeout)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Keep the compile thread off the GIL (see the module docstring). One holder at a time
        (the session's worker), which calls beat() as it goes on."""
        stop = hasattr(threading, "setprofile_all_threads")  # Python 3.12+
        self._pausing = True
        self._set_switch()
        if stop:
            self._pauses += 1
            self._go.clear()
            threading.setprofile_all_threads(self._gate)
            sys.setprofile(None)  # this thread runs on without the hook
        try:
            yield
        finally:
            if stop:
                self._go.set()
                threading.setprofile_all_threads(None)
            self._pausing = False
            self._set_switch()

    def beat(self) -> None:
        """The pausing thread goes on (a reply's chunk read): a stopped compile keeps waiting."""
        self._beats += 1

    def _gate(self, frame, event, arg) -> None:
        """The profile hook while paused (every thread but the pausing one): the compile thread
        stops here, once a pause (`hold`); any other thread goes on."""
        if (not self._go.is_set() and self._waited != self._pauses
                and threading.get_ident() == self._thread.ident):
            self._waited = self._pauses
            self.hold()

    def hold(self) -> None:
        """Wait while the pause lasts and beats at least once every PAUSE_MAX_S."""
        while True:
            beats = self._beats
            if self._go.wait(PAUSE_MAX_S) or self._beats == beats:
                return

    def _set_switch(self) -> None:
        """The interpreter's switch interval for the state now: paused, compiling, or done."""
        with self._switch_lock:
            if self._pausing:
                sys.setswitchinterval(min(self._switch, PAUSED_SWITCH_S))
            elif not self.ready.is_set():
                sys.setswitchinterval(min(self._switch, COMPILE_SWITCH_S))
            else:
                sys.setswitchinterval(self._switch)


def check_cpp_compiler() -> None:
    """Raise RuntimeError (one line) where Inductor finds no working C++ compiler for CPU code
    (measured: the compile otherwise traced for 35 s before it failed on the missing compiler)."""
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as e:
        raise RuntimeError(f"no working C++ compiler for Inductor's CPU code ({e}); install one, "
                           "or name it in CXX") from None
